"""A simulated fleet of devices for ``ldp-reports`` mode (issue 23): ``privstream devices``.

One process reads the server's :class:`~privstream.schema.protocol.Request` s from a request
topic and, for each, lets every simulated device that the request's rule asks answer through
the device library (:meth:`privstream.client.Device.answer`, each device with its own ledger
and store), writing each :class:`~privstream.schema.protocol.Report` to the report topic keyed
by the device's id. A CGM request (oracle ``CGM``) goes to the device's
:class:`~privstream.client.CgmDevice` instead (its own noise chains and μ² ledger in a store of
its own, policy ``GaussianPolicy(FleetConfig.cgm_mu)``), with the raw value: the device clips it
itself. Device ``i`` is user ``i`` of a synthetic dataset (``connectors.datasets``); request slot
``s ≥ 1`` reads the dataset's slot ``(s − 1) mod slots + 1``.

Knobs: ``dropout`` (a device does not answer), ``late`` (its report is held back and written
after the next request arrives, i.e. after the server closed the round) and ``liars``: the last
``K`` devices misbehave, liar ``j`` in the way ``LIES[j mod len(LIES)]``, each a way
``check_reports`` refuses (``EXPECTED_REASONS``). A liar sends only its lie and skips its ledger.
Stats are counts only: no value, no device id.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from privstream.client import (
    CgmDevice,
    Device,
    FileStore,
    GaussianPolicy,
    Policy,
    Randomness,
    Refusal,
    SystemRandomness,
)
from privstream.client import randomize as client_randomize
from privstream.client.cgm import Chain, chain_step
from privstream.connectors.datasets import SlotStream
from privstream.mechanisms.cgm_math import agm_mu
from privstream.schema.events import DUPLICATE
from privstream.schema.protocol import (
    BUDGET_MISMATCH,
    NOT_ASKED,
    ORACLE_MISMATCH,
    RATE_LIMITED,
    REPLAYED,
    SHAPE_MISMATCH,
    UNKNOWN_REQUEST,
    CgmStep,
    ProtocolError,
    Report,
    Request,
    decode_request,
)

LIES: Final = ("no-request", "duplicate", "budget", "oracle", "shape", "not-asked", "replay",
               "flood")  # fmt: skip
EXPECTED_REASONS: Final = {
    "no-request": (UNKNOWN_REQUEST,), "duplicate": (DUPLICATE,), "budget": (BUDGET_MISMATCH,),
    "oracle": (ORACLE_MISMATCH,), "shape": (SHAPE_MISMATCH,), "not-asked": (NOT_ASKED,),
    "replay": (REPLAYED,), "flood": (DUPLICATE, RATE_LIMITED),
}  # fmt: skip
"""The dead-letter reasons of each lie (a duplicate's or a flood's first copy is a well-formed
report to a request that asks the liar, so the server accepts it; the copies are refused)."""
FLOOD_COPIES: Final = 64
Message = tuple[str, str]  # (key: device id, value: report JSON)


class MemoryStore(FileStore):
    """A ledger store in memory (the simulation's default): same interface as ``FileStore``,
    nothing on disk, so a restarted fleet starts with fresh budgets."""

    def __init__(self, name: str) -> None:
        super().__init__(Path(f"memory:{name}"), create=True)
        self._state: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        return dict(self._state)

    def save(self, state: dict[str, Any]) -> None:
        self._state = dict(state)


@dataclass(frozen=True)
class Asked:
    """A schema request seen through the device library's ``Request`` protocol (the oracle's
    name and its ``d`` as plain fields)."""

    request: Request

    @property
    def stream(self) -> str:
        return self.request.stream

    @property
    def slot(self) -> int:
        return self.request.slot

    @property
    def round(self) -> int:
        return self.request.round

    @property
    def purpose(self) -> str:
        return self.request.purpose

    @property
    def oracle(self) -> str:
        return self.request.oracle.name

    @property
    def d(self) -> int:
        return self.request.oracle.d

    @property
    def epsilon(self) -> float:
        return self.request.epsilon

    @property
    def window(self) -> int:
        return self.request.window

    @property
    def division(self) -> str:
        return self.request.division

    @property
    def cgm(self) -> CgmStep:
        """A CGM request's public step (``ValueError`` for another oracle's request)."""
        step = self.request.oracle.cgm
        if step is None:
            raise ValueError(f"a {self.oracle} request has no CGM step")
        return step

    def asks(self, user_id: str) -> bool:
        return self.request.asks(user_id)


@dataclass(frozen=True)
class FleetConfig:
    """The fleet: ``users`` devices, each with the policy ``(epsilon, window)``; the knobs'
    probabilities; ``liars`` of them lying; ``store_dir`` a folder of one ledger file per
    device (None: in memory); ``seed`` drives dropout, lateness and nothing else.

    CGM (Gaussian DP): each device admits μ² ≤ ``cgm_mu``² per stream over the stream's whole
    life (``GaussianPolicy``): ``mu`` when given, else ``μ*(epsilon, delta)``, the μ of an
    (ε, δ)-LDP stream (spec cgm §2.4) — what a server's CGM config with the same ``epsilon``,
    ``delta`` and ``budget_scope = "stream"`` spends on a user's ``window`` reports."""

    users: int
    epsilon: float = 1.0
    window: int = 10
    dropout: float = 0.0
    late: float = 0.0
    liars: int = 0
    flood: int = FLOOD_COPIES
    store_dir: Path | None = None
    seed: int = 0
    delta: float = 1e-5
    mu: float | None = None

    def __post_init__(self) -> None:
        if self.users < 1:
            raise ValueError(f"--users must be >= 1, got {self.users}")
        for name in ("dropout", "late"):
            p = getattr(self, name)
            if not (0.0 <= p <= 1.0 and math.isfinite(p)):
                raise ValueError(f"--{name} is a probability in [0, 1], got {p!r}")
        if not 0 <= self.liars <= self.users:
            raise ValueError(f"--liars must lie in [0, --users={self.users}], got {self.liars}")
        if self.flood < 2:
            raise ValueError(f"--flood must be >= 2 copies, got {self.flood}")
        if not (isinstance(self.delta, float | int) and 0 < self.delta < 1):
            raise ValueError(f"--delta (CGM's δ) must lie in (0, 1), got {self.delta!r}")
        mu = self.mu
        if mu is not None and not (isinstance(mu, float | int) and 0 < mu < math.inf):
            raise ValueError(f"--mu (each device's CGM μ per stream) must be > 0, got {mu!r}")

    @property
    def cgm_mu(self) -> float:
        """Each device's CGM budget per stream in μ: ``mu``, else ``μ*(epsilon, delta)``."""
        return float(self.mu) if self.mu is not None else agm_mu(self.epsilon, self.delta)


@dataclass
class FleetStats:
    """What the fleet did, as counts only."""

    requests: int = 0
    invalid_requests: Counter[str] = field(default_factory=Counter)
    reports: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    not_asked: int = 0
    dropped: int = 0
    late: int = 0
    lies: Counter[str] = field(default_factory=Counter)
    messages: int = 0  # written to the report topic (reports, copies and lies)

    def lines(self) -> list[str]:
        def tally(c: Counter[str]) -> str:
            return ", ".join(f"{k}: {n}" for k, n in sorted(c.items())) or "none"

        return [
            f"requests seen: {self.requests} (invalid: {tally(self.invalid_requests)})",
            f"reports sent: {self.reports} (late: {self.late})",
            f"refused by the device ledger: {sum(self.refused.values())} ({tally(self.refused)})",
            f"not asked: {self.not_asked}; dropped: {self.dropped}",
            f"lies sent: {sum(self.lies.values())} ({tally(self.lies)})",
            f"messages written: {self.messages}",
        ]


def device_id(user: int) -> str:
    """The simulated device's pseudonymous id (no user index of a real population)."""
    return f"sim-{user}"


def device_value(source: SlotStream, values: Any, user: int, oracle: str, d: int) -> object:
    """User ``user``'s value in the form ``oracle`` takes: a category in ``[0, d)`` (a numeric
    value bucketed over the source's bounds) or, for HM, a number in ``[−1, 1]``."""
    lower, upper = source.bounds if source.numeric else (0.0, 1.0)
    x = float(values[user])
    unit = min(1.0, max(0.0, (x - lower) / (upper - lower)))
    if oracle == "HM":
        return 2.0 * unit - 1.0
    if not source.numeric:
        return min(int(x), d - 1)
    return min(int(unit * d), d - 1)


def raw_value(values: Any, user: int) -> object:
    """User ``user``'s raw value as its device holds it for CGM: a number, or a list of
    coordinates (the device clips it to the request's public domain itself)."""
    x = values[user]
    return x.tolist() if hasattr(x, "tolist") else x


def cgm_wire(x: Sequence[float], v: float) -> dict[str, Any]:
    """A CGM report's value in the report schema's form: ``{"x": [...], "v": v}``."""
    return {"x": [float(c) for c in x], "v": float(v)}


def wire_value(oracle: str, payload: Any) -> Any:
    """The device library's payload in the report schema's form: OUE's bits as a string,
    OLH's ``(a, b, y)`` as a list, GRR's category and HM's number as they are."""
    if oracle == "OUE":
        return "".join(str(b) for b in payload)
    return list(payload) if oracle == "OLH" else payload


class Fleet:
    """The simulated devices and their answering logic (no Kafka: :func:`run_fleet` wires it)."""

    def __init__(
        self,
        config: FleetConfig,
        source: SlotStream,
        randomness: Callable[[], Randomness] = SystemRandomness,
    ) -> None:
        if source.users < config.users:
            raise ValueError(f"the dataset has {source.users} users, --users asks {config.users}")
        self.config, self.source = config, source
        self.stats = FleetStats()
        self.rng = random.Random(config.seed)
        self.noise = randomness()
        self.randomness = randomness
        policy = Policy(config.epsilon, config.window)
        honest = config.users - config.liars
        self.devices = [Device(device_id(u), self._store(u), policy, randomness())
                        for u in range(honest)]  # fmt: skip
        self._cgm: list[CgmDevice] | None = None
        self.liar_chains: dict[tuple[str, str, int], Chain] = {}  # (liar, stream, lag phase)
        self.liars = {device_id(u): LIES[j % len(LIES)]
                      for j, u in enumerate(range(honest, config.users))}  # fmt: skip
        self.held: list[Message] = []
        self.sent: dict[str, list[Report]] = {}  # a replay liar's earlier reports
        self.slots: dict[str, list[int]] = {}  # each stream's request slots, in order
        self._cache: tuple[int, Any] | None = None
        self.consumed = 0  # request-topic messages received (where a later run goes on)

    @property
    def cgm_devices(self) -> list[CgmDevice]:
        """The honest devices' CGM side (chains and μ² ledger in a store of their own, under
        ``store_dir/cgm``), made at the first CGM request, in device order."""
        if self._cgm is None:
            policy = GaussianPolicy(self.config.cgm_mu)
            self._cgm = [CgmDevice(d.user_id, self._store(u, "cgm"), policy, self.randomness())
                         for u, d in enumerate(self.devices)]  # fmt: skip
        return self._cgm

    def _store(self, user: int, folder: str = "") -> FileStore:
        if self.config.store_dir is None:
            return MemoryStore(f"{folder}/{device_id(user)}" if folder else device_id(user))
        where = self.config.store_dir / folder
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{device_id(user)}.json"
        return FileStore(path, create=not path.exists())

    def _values(self, slot: int) -> Any:
        index = (slot - 1) % self.source.slots + 1  # request slot t reads dataset slot t
        if self._cache is None or self._cache[0] != index:
            self._cache = (index, self.source.values(index))
        return self._cache[1]

    def receive(self, line: str | bytes) -> list[Message]:
        """The messages to write now for one request-topic message: the reports held back
        from earlier requests (late), then this request's. A malformed request is counted
        (by reason) and answered by nobody."""
        late, self.held = self.held, []
        self.consumed += 1
        try:
            request = decode_request(line)
        except ProtocolError as exc:
            self.stats.invalid_requests[exc.reason] += 1
            return late
        return late + self.answer(request)

    def flush(self) -> list[Message]:
        """The reports still held back (written when the fleet stops)."""
        late, self.held = self.held, []
        return late

    def answer(self, request: Request) -> list[Message]:
        """Every device's reaction to ``request``: honest devices answer through their
        ledger (or refuse, drop out, or are held back as late), liars send their lies."""
        self.stats.requests += 1
        values = self._values(request.slot)
        now: list[Message] = []
        for user, device in enumerate(self.devices):
            now += self._honest(user, device, request, values)
        for user, (name, lie) in enumerate(self.liars.items(), self.config.users - len(self.liars)):
            now += self._lie(name, lie, user, request, values)
        self.slots.setdefault(request.stream, []).append(request.slot)
        return now

    def _honest(self, user: int, device: Device, request: Request, values: Any) -> list[Message]:
        """An honest device's report (now or held back as late), or nothing: not asked,
        dropped out, or refused by its own ledger (counted by reason)."""
        if not request.asks(device.user_id):
            self.stats.not_asked += 1
            return []
        if self.rng.random() < self.config.dropout:
            self.stats.dropped += 1
            return []
        out = self._device_answer(user, device, request, values)
        if isinstance(out, Refusal):
            self.stats.refused[out.reason] += 1
            return []
        report = Report.answering(request, device.user_id, out)
        self.stats.reports += 1
        message = (device.user_id, report.to_json())
        if self.rng.random() < self.config.late:
            self.stats.late += 1
            self.held.append(message)
            return []
        return [message]

    def _device_answer(self, user: int, device: Device, request: Request, values: Any) -> Any:
        """The wire value of an honest device's answer (through its ledger), or its Refusal:
        a CGM request goes to its ``CgmDevice`` with the raw value, any other to ``Device``
        with the value in the oracle's form."""
        oracle = request.oracle
        if oracle.name == "CGM":
            cgm = self.cgm_devices[user].answer(Asked(request), raw_value(values, user))
            return cgm if isinstance(cgm, Refusal) else cgm_wire(cgm.x, cgm.v)
        value = device_value(self.source, values, user, oracle.name, oracle.d)
        out = device.answer(Asked(request), value)
        return out if isinstance(out, Refusal) else wire_value(oracle.name, out.payload)

    def _lie(self, name: str, lie: str, user: int, request: Request, values: Any) -> list[Message]:
        """The reports a liar sends: each one a report ``check_reports`` refuses for the
        reason ``EXPECTED_REASONS[lie]`` (none when the lie does not fit this request)."""
        asked = request.asks(name)
        if (lie == "not-asked") == asked:
            return []
        try:
            value = self._lie_value(name, user, request, values)
        except (ValueError, TypeError):
            return []  # a value the device library refuses (e.g. none): nothing to lie with
        base = Report.answering(request, name, value)
        reports = _lies(lie, base, request, self._replayable(name, request), self.config.flood)
        self.sent.setdefault(name, []).append(base)
        if reports:
            self.stats.lies[lie] += 1
        return [(name, r.to_json()) for r in reports]

    def _lie_value(self, name: str, user: int, request: Request, values: Any) -> Any:
        """A well-formed wire value for a liar to twist, made without a ledger: the oracle's
        randomiser, or for CGM the next step of the liar's own noise chain."""
        oracle = request.oracle
        if oracle.cgm is not None:
            key = (name, request.stream, request.slot % oracle.cgm.lag)
            report, chain = chain_step(self.liar_chains.get(key, Chain()), oracle.cgm,
                                       request.slot, raw_value(values, user), self.noise)  # fmt: skip
            self.liar_chains[key] = chain
            return cgm_wire(report.x, report.v)
        value = device_value(self.source, values, user, oracle.name, oracle.d)
        payload = client_randomize(oracle.name, value, request.epsilon, oracle.d, self.noise)
        return wire_value(oracle.name, payload)

    def _replayable(self, name: str, request: Request) -> Report | None:
        """A liar's earlier report on this stream from a slot before the stream's previous
        request slot (that round is closed by now, so the server must call it a replay)."""
        previous = self.slots.get(request.stream, [])
        if not previous:
            return None
        old = [r for r in self.sent.get(name, []) if r.stream == request.stream]
        old = [r for r in old if r.slot < previous[-1]]
        return old[0] if old else None


def _lies(
    lie: str, base: Report, request: Request, replay: Report | None, flood: int
) -> list[Report]:
    """The reports of one lie, built from a well-formed report ``base``."""
    if lie == "no-request":
        forged = hashlib.blake2b(base.request.encode(), digest_size=16).hexdigest()
        return [replace(base, request=forged)]
    if lie == "duplicate":
        return [base, base]
    if lie == "budget":
        return [replace(base, epsilon=base.epsilon * 2)]
    if lie == "oracle":
        return [replace(base, oracle="OUE" if base.oracle != "OUE" else "GRR")]
    if lie == "shape":
        return [replace(base, value=_bad_value(request))]
    if lie == "replay":
        return [] if replay is None else [replay]
    if lie == "flood":
        return [base] * flood
    return [base]  # not-asked: a well-formed report to a request that does not ask it


def _bad_value(request: Request) -> Any:
    """A value the request's oracle can never send: one past its domain or bound."""
    name, d = request.oracle.name, request.oracle.d
    if name == "GRR":
        return d
    if name == "OUE":
        return "1" * (d + 1)
    if name == "OLH":
        return [0, 0, 0]
    if name == "CGM":
        return cgm_wire([0.0] * d, 2.0)  # v beyond (0, 1]
    return 1e9


def run_fleet(
    fleet: Fleet,
    settings: Any,
    request_topic: str,
    report_topic: str,
    *,
    idle_seconds: float = 10.0,
    max_requests: int | None = None,
    flush_late: bool = True,
    on_ready: Callable[[], None] | None = None,
) -> FleetStats:
    """Answer the requests of ``request_topic`` into ``report_topic`` until ``max_requests``
    were read or none came for ``idle_seconds``; held-back (late) reports are written before
    stopping unless ``flush_late`` is False (a later call goes on after the requests this
    fleet already received). ``on_ready`` is called once, when the request topic's partitions
    are assigned and polled for the first time. Returns the fleet's stats."""
    from confluent_kafka import Producer

    producer = Producer(settings.client_config())
    try:
        lines = _requests(settings, request_topic, idle_seconds, fleet.consumed, max_requests,
                          on_ready)  # fmt: skip
        for line in lines:
            fleet.stats.messages += _write(producer, report_topic, fleet.receive(line))
        if flush_late:
            fleet.stats.messages += _write(producer, report_topic, fleet.flush())
    finally:
        producer.flush(30)
    return fleet.stats


def _write(producer: Any, topic: str, messages: list[Message]) -> int:
    """Write ``messages`` keyed by device id and wait for the broker; how many were written."""
    for key, value in messages:
        producer.produce(topic, key=key.encode(), value=value.encode())
        producer.poll(0)
    if producer.flush(30):
        raise ConnectionError(f"reports not delivered to {topic!r} within 30 s")
    return len(messages)


def _requests(
    settings: Any,
    topic: str,
    idle_seconds: float,
    skip: int,
    max_requests: int | None,
    on_ready: Callable[[], None] | None = None,
) -> Iterator[bytes]:
    """The request topic's non-empty message values after the first ``skip``, at most
    ``max_requests`` of them, read with the tools' one reader (from the topic's beginning);
    ``on_ready`` after its first poll."""
    from privstream.connectors.kafka import read_until_idle

    seen = 0
    reader = read_until_idle(settings, [topic], idle_seconds)
    try:
        for messages in reader:
            if on_ready is not None:
                on_ready()
                on_ready = None
            for value in (m.value() for m in messages if m.value()):
                if max_requests is not None and seen - skip >= max_requests:
                    return
                seen += 1
                if seen > skip:
                    yield value
            if max_requests is not None and seen - skip >= max_requests:
                return
    finally:
        getattr(reader, "close", lambda: None)()  # closes the reader's consumer now
