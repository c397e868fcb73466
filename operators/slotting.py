"""Deterministic slots over keyed event batches, and the operator that steps a mechanism.

Design §5: a slot closes when the stream's watermark (max event slot minus the allowed
lateness) passes it, when a batch marks it complete, or at end of input — never on wall-clock
time — so a replay after a crash closes the same slots with the same contents. Every slot from
the stream's first one on is stepped, including empty ones (the ledger must age). One report
per user per slot (first wins); everything unusable goes to the dead-letter stream with a reason.

Users keep their last value between slots (``carry_forward``, spec §6.2) unless the policy is
``absent``, in which case only users that reported at a slot are eligible at it.

The trust mode (design §4) decides what a mechanism sees of the users at a slot: ``LdpClients``
(``ldp-simulated``: a ``SimulatedClientPort`` answering report requests) or ``TrustedCurator``
(``cdp``: a ``SimulatedCurator`` over the registered users and their privacy requirements). A
user's requirement ``(ε_i, w_i)`` is fixed when the user registers (first accepted event, or the
preferences table); a later event stating another one is a ``requirement_changed`` dead letter.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

import numpy as np
from bytewax import operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import KeyedStream, StatefulBatchLogic
from numpy.typing import NDArray

from privstream.connectors.events import (
    DUPLICATE,
    FAR_FUTURE,
    LATE,
    OUT_OF_DOMAIN,
    POPULATION_FULL,
    REQUIREMENT_CHANGED,
    STREAM_HALTED,
    USER_ID_KIND,
    DeadLetter,
    EventBatch,
)
from privstream.mechanisms.client import (
    ClientPath,
    ClientPort,
    CuratorPort,
    Requirements,
    SimulatedClientPort,
    SimulatedCurator,
)
from privstream.mechanisms.contract import LedgerEntry, Mechanism, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD, EVENTS, STEP_SECONDS, Tally

log = logging.getLogger(__name__)

STREAM_STATE_VERSION: Final = 3  # 2: per-mechanism tallies; 3: users' privacy requirements
MissingPolicy = Literal["carry_forward", "absent"]
Output = tuple[str, Any]  # ("release" | "ledger" | "dead_letter", event)
_REASON: Final = (
    "", USER_ID_KIND, OUT_OF_DOMAIN, LATE, FAR_FUTURE, POPULATION_FULL, REQUIREMENT_CHANGED,
    DUPLICATE,
)  # fmt: skip
_CODE: Final = {reason: code for code, reason in enumerate(_REASON)}


@dataclass(frozen=True)
class SlottingConfig:
    """How events become slots.

    Attributes:
        lateness: slots a slot stays open after a later slot is seen (``≥ 0``; default 1).
        max_slot_gap: the largest jump ahead of the newest slot an event may make; further
            events are ``far_future_slot`` dead letters (guards against a corrupt slot forcing
            millions of empty steps). Default 10,000.
        missing: ``carry_forward`` (default) or ``absent`` (spec §6.2).
        client_path: ``aggregate`` (fast path, default) or ``per-user`` (design §4).
        close_on_eof: release the still-open slots when a bounded input ends (default True).
    """

    lateness: int = 1
    max_slot_gap: int = 10_000
    missing: MissingPolicy = "carry_forward"
    client_path: ClientPath = "aggregate"
    close_on_eof: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.lateness, int) or self.lateness < 0:
            raise ValueError(f"lateness must be an integer >= 0, got {self.lateness!r}")
        if not isinstance(self.max_slot_gap, int) or self.max_slot_gap < 1:
            raise ValueError(f"max_slot_gap must be an integer >= 1, got {self.max_slot_gap!r}")
        if self.missing not in ("carry_forward", "absent"):
            raise ValueError(f"missing must be 'carry_forward' or 'absent', got {self.missing!r}")
        if self.client_path not in ("aggregate", "per-user"):
            raise ValueError(
                f"client_path must be 'aggregate' or 'per-user', got {self.client_path!r}"
            )


@dataclass
class StreamState:
    """Snapshot of one stream: each mechanism's state plus the shared slotting bookkeeping.

    ``halted`` maps a mechanism whose ledger refused a charge to the reason; it releases nothing
    more. When every mechanism of the stream is halted, its events become dead letters.
    ``tallies`` are each mechanism's release counts and last ledger entry, the source of the
    exported gauges (``operators.metrics``). ``epsilons``/``windows`` are the registered users'
    requirements (NaN / 0: the stream default), kept only by a trusted-curator stream.
    """

    stream: str
    mechanisms: dict[str, Any]
    current: NDArray[np.float64]
    version: int = STREAM_STATE_VERSION
    open_slots: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    directory: dict[str, int] = field(default_factory=dict)
    id_kind: str | None = None
    max_seen: int | None = None
    last_closed: int | None = None
    halted: dict[str, str] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None

    def registered(self) -> NDArray[np.bool_] | None:
        """Mask of registered users (None: all ``n``, as with dense user indices)."""
        if self.id_kind == "dense":
            return None
        return np.arange(self.current.shape[0]) < len(self.directory)

    def all_halted(self) -> bool:
        return len(self.halted) == len(self.mechanisms)


@dataclass(frozen=True)
class Preferences:
    """Users' privacy requirements given at start (a preferences table, spec §9.1), by user id
    for named users or by dense index (``epsilons``/``windows`` arrays, NaN / 0 = default)."""

    by_user: dict[str, tuple[float, int]] = field(default_factory=dict)
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None


class TrustMode:
    """What a mechanism sees of the users at a slot (design §4)."""

    tracks_requirements: ClassVar[bool] = False

    def port(
        self, state: StreamState, values: NDArray[np.float64], randomness: SlotRandomness
    ) -> ClientPort | CuratorPort:
        raise NotImplementedError


@dataclass(frozen=True)
class LdpClients(TrustMode):
    """``ldp-simulated``: privstream's client code answers on behalf of each asked user."""

    task: EstimationTask
    path: ClientPath = "aggregate"

    def port(
        self, state: StreamState, values: NDArray[np.float64], randomness: SlotRandomness
    ) -> ClientPort:
        return SimulatedClientPort(values, self.task, randomness, self.path)


class TrustedCurator(TrustMode):
    """``cdp``: the curator sees the registered users' values and requirements; the mechanism
    samples and adds noise. The ``Requirements`` are rebuilt only when somebody registered."""

    tracks_requirements = True

    def __init__(self, task: EstimationTask, preferences: Preferences | None = None) -> None:
        self.task = task
        self.preferences = preferences or Preferences()
        self._cache: dict[str, tuple[tuple[int, str | None], Requirements]] = {}

    def port(
        self, state: StreamState, values: NDArray[np.float64], randomness: SlotRandomness
    ) -> CuratorPort:
        key = (len(state.directory), state.id_kind)
        cached = self._cache.get(state.stream)
        if cached is None or cached[0] != key:
            requirements = Requirements(
                state.epsilons,
                state.windows,
                population=state.current.shape[0],
                registered=state.registered(),
            )
            cached = self._cache[state.stream] = (key, requirements)
        return SimulatedCurator(values, self.task, cached[1])


class _SlottedLogic(StatefulBatchLogic[EventBatch, Output, StreamState]):
    def __init__(
        self,
        step_id: str,
        mechanisms: Sequence[Mechanism[Any, Any]],
        task: EstimationTask,
        population: int,
        secret: int | bytes,
        config: SlottingConfig,
        resume: StreamState | None,
        trust: TrustMode | None = None,
    ) -> None:
        self.step_id = step_id
        self.trust = trust or LdpClients(task, config.client_path)
        self.mechanisms = {m.name: m for m in mechanisms}
        self.task = task
        self.n = population
        self._secret = secret
        self.cfg = config
        if resume is not None:
            if (
                resume.version != STREAM_STATE_VERSION
                or resume.mechanisms.keys() != self.mechanisms.keys()
            ):
                raise IncompatibleState(
                    f"step {step_id!r}: snapshot of stream {resume.stream!r} has slotting version "
                    f"{resume.version} for mechanisms {sorted(resume.mechanisms)}; this code runs "
                    f"version {STREAM_STATE_VERSION} of {sorted(self.mechanisms)}"
                )
            for name, mechanism in self.mechanisms.items():
                mechanism.check_state(resume.mechanisms[name])
        self.state: StreamState | None = resume
        if resume is not None:
            for name in self.mechanisms:
                resume.tallies.setdefault(name, Tally())
                self._publish(resume, name)

    # -- Bytewax callbacks ---------------------------------------------------------------------

    def on_batch(self, values: list[EventBatch]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        for batch in values:
            state = self._state_for(batch.stream)
            if state.all_halted():
                out.extend(self._reject_all(batch, STREAM_HALTED, "; ".join(state.halted.values())))
                continue
            out.extend(("dead_letter", d) for d in self._ingest(state, batch))
            if state.max_seen is not None:
                self._close_through(state, state.max_seen - self.cfg.lateness - 1, out)
            if batch.complete_through is not None:
                self._close_through(state, batch.complete_through, out)
        return out, StatefulBatchLogic.RETAIN

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        state = self.state
        if (
            self.cfg.close_on_eof
            and state is not None
            and not state.all_halted()
            and state.max_seen is not None
        ):
            self._close_through(state, state.max_seen, out)
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> StreamState:
        assert self.state is not None, "snapshot before the first event"
        return copy.deepcopy(self.state)

    # -- ingest --------------------------------------------------------------------------------

    def _state_for(self, stream: str) -> StreamState:
        if self.state is None:
            self.state = StreamState(
                stream=stream,
                mechanisms={name: m.initial_state() for name, m in self.mechanisms.items()},
                current=np.full(self.n, np.nan),
                tallies={name: Tally() for name in self.mechanisms},
            )
            if isinstance(self.trust, TrustedCurator):
                prefs = self.trust.preferences
                if prefs.epsilons is not None or prefs.windows is not None:
                    self._requirement_arrays(self.state)
                    if prefs.epsilons is not None:
                        self.state.epsilons[:] = prefs.epsilons  # type: ignore[index]
                    if prefs.windows is not None:
                        self.state.windows[:] = prefs.windows  # type: ignore[index]
            for name in self.mechanisms:
                self._publish(self.state, name)
        return self.state

    def _publish(self, state: StreamState, name: str) -> None:
        """Show the ledger of ``name`` on the metrics endpoint."""
        BOARD.update(
            state.stream,
            name,
            self.mechanisms[name].privacy_cost,
            self.n,
            state.tallies[name],
            name in state.halted,
        )

    def _reject_all(self, batch: EventBatch, reason: str, detail: str) -> list[Output]:
        return [
            (
                "dead_letter",
                DeadLetter(reason, batch.stream, batch.row_text(i), detail, batch.row_original(i)),
            )
            for i in range(len(batch))
        ]

    def _user_index(
        self, state: StreamState, batch: EventBatch, ok: NDArray[np.bool_]
    ) -> tuple[NDArray[np.int64], str]:
        """Dense user indices of the rows (−1 where unknown) and the batch's id kind."""
        if batch.users.dtype.kind in "iu":
            idx = batch.users.astype(np.int64)
            return np.where((idx >= 0) & (idx < self.n), idx, -1), "dense"
        directory = state.directory
        every = bool(ok.all())
        rows = np.flatnonzero(ok)
        users = batch.users.tolist() if every else batch.users[rows].tolist()
        known = np.fromiter(
            map(directory.get, users, itertools.repeat(-1)), dtype=np.int64, count=len(users)
        )
        for k in np.flatnonzero(known < 0).tolist():  # new users, first come first served
            j = directory.get(users[k], -1)
            if j < 0 and len(directory) < self.n:
                j = directory[users[k]] = len(directory)
            known[k] = j
        if every:
            return known, "named"
        idx = np.full(len(batch), -1, dtype=np.int64)
        idx[rows] = known
        return idx, "named"

    def _ingest(self, state: StreamState, batch: EventBatch) -> list[DeadLetter]:
        """Buffer the batch's acceptable rows in their open slots; dead letters for the rest.

        Vectorised over the batch: a reason code per row, 0 = accepted.
        """
        size = len(batch)
        if size == 0:
            return []
        code = np.zeros(size, dtype=np.int8)
        kind = "dense" if batch.users.dtype.kind in "iu" else "named"
        if state.id_kind is not None and state.id_kind != kind:
            code[:] = _CODE[USER_ID_KIND]
        code[(code == 0) & ~self.task.in_domain(batch.values)] = _CODE[OUT_OF_DOMAIN]
        slots = batch.slots
        if state.last_closed is not None:
            code[(code == 0) & (slots <= state.last_closed)] = _CODE[LATE]
        pending = code == 0
        if pending.any():
            reference = state.max_seen if state.max_seen is not None else int(slots[pending].min())
            code[pending & (slots > reference + self.cfg.max_slot_gap)] = _CODE[FAR_FUTURE]
        before = len(state.directory)
        idx, kind = self._user_index(state, batch, code == 0)
        code[(code == 0) & (idx < 0)] = _CODE[POPULATION_FULL if kind == "named" else OUT_OF_DOMAIN]
        if self.trust.tracks_requirements:
            self._requirements(state, batch, idx, code, before)
        ok = np.flatnonzero(code == 0)
        ok_slots = slots[ok]
        lo, hi = (int(ok_slots.min()), int(ok_slots.max())) if ok.size else (0, -1)
        for slot in [lo] if lo == hi else np.unique(ok_slots).tolist():
            rows = ok if lo == hi else ok[ok_slots == slot]
            users = idx[rows]
            _, first = np.unique(users, return_index=True)
            if first.shape[0] < users.shape[0]:  # rare: repeats inside the batch
                repeat = np.ones(rows.shape[0], dtype=bool)
                repeat[first] = False
                code[rows[repeat]] = _CODE[DUPLICATE]
                rows, users = rows[~repeat], users[~repeat]
            target = state.open_slots.get(slot)
            if target is None:
                target = state.open_slots[slot] = np.full(self.n, np.nan)
            seen = ~np.isnan(target[users])
            if seen.any():
                code[rows[seen]] = _CODE[DUPLICATE]
                rows, users = rows[~seen], users[~seen]
            target[users] = batch.values[rows]
        accepted = int((code == 0).sum())
        if accepted:
            EVENTS.labels(state.stream).inc(accepted)
            state.id_kind = kind
            state.max_seen = hi if state.max_seen is None else max(state.max_seen, hi)
        rejected = np.flatnonzero(code)
        if rejected.size == 0:
            return []
        details = {
            OUT_OF_DOMAIN: f"value or user outside the domain (d={self.task.d}, n={self.n})",
            LATE: f"slot already released (last released slot {state.last_closed})",
            FAR_FUTURE: f"slot more than {self.cfg.max_slot_gap} slots ahead of the stream",
            DUPLICATE: "user already reported in this slot (first report wins)",
            POPULATION_FULL: f"registered population of {self.n} users is full",
            REQUIREMENT_CHANGED: "the user registered with another privacy requirement "
            "(epsilon, window); it cannot change within a stream",
            USER_ID_KIND: "user ids must be all strings or all dense indices within a stream",
        }
        return [
            DeadLetter(
                _REASON[c],
                batch.stream,
                batch.row_text(i),
                details[_REASON[c]],
                batch.row_original(i),
            )
            for i, c in zip(rejected.tolist(), code[rejected].tolist(), strict=True)
        ]

    def _requirement_arrays(self, state: StreamState) -> None:
        if state.epsilons is None or state.windows is None:
            state.epsilons = np.full(self.n, np.nan)
            state.windows = np.zeros(self.n, dtype=np.int64)

    def _requirements(
        self,
        state: StreamState,
        batch: EventBatch,
        idx: NDArray[np.int64],
        code: NDArray[np.int8],
        before: int,
    ) -> None:
        """Register the requirements of users new in this batch (preferences table first, then
        their first stating row) and refuse rows stating another one than registered."""
        assert isinstance(self.trust, TrustedCurator)
        table = self.trust.preferences.by_user
        fresh = (code == 0) & (idx >= before) if table else None
        if fresh is not None and fresh.any():
            rows = np.flatnonzero(fresh)
            for i in rows.tolist():
                wanted = table.get(batch.users[i])
                if wanted is not None:
                    self._requirement_arrays(state)
                    assert state.epsilons is not None and state.windows is not None
                    state.epsilons[idx[i]], state.windows[idx[i]] = wanted
        if batch.epsilons is None or batch.windows is None:
            return
        stating = (code == 0) & (~np.isnan(batch.epsilons) | (batch.windows > 0))
        if not stating.any():
            return
        self._requirement_arrays(state)
        assert state.epsilons is not None and state.windows is not None
        newcomers = np.flatnonzero((code == 0) & (idx >= before))
        if newcomers.size:  # a new user's first row registers its requirement (none: default)
            _, first = np.unique(idx[newcomers], return_index=True)
            reg = newcomers[first]
            unset = np.isnan(state.epsilons[idx[reg]]) & (state.windows[idx[reg]] == 0)
            reg = reg[unset]  # ... unless the preferences table did
            state.epsilons[idx[reg]] = batch.epsilons[reg]
            state.windows[idx[reg]] = batch.windows[reg]
        rows = np.flatnonzero(stating)
        users = idx[rows]
        eps, win = batch.epsilons[rows], batch.windows[rows]
        changed = (~np.isnan(eps) & (eps != state.epsilons[users])) | (
            (win > 0) & (win != state.windows[users])
        )
        code[rows[changed]] = _CODE[REQUIREMENT_CHANGED]

    # -- closing slots -------------------------------------------------------------------------

    def _close_through(self, state: StreamState, target: int, out: list[Output]) -> None:
        """Release every slot up to ``target`` that is not released yet, in order."""
        if state.last_closed is None:
            if not state.open_slots:
                return
            start = min(state.open_slots)
        else:
            start = state.last_closed + 1
        for slot in range(start, target + 1):
            if state.all_halted():
                return
            self._step(state, slot, out)

    def _step(self, state: StreamState, slot: int, out: list[Output]) -> None:
        reported = state.open_slots.pop(slot, None)
        if self.cfg.missing == "absent":
            values = reported if reported is not None else np.full(self.n, np.nan)
        else:
            values = state.current
            if reported is not None:
                fresh = ~np.isnan(reported)
                values[fresh] = reported[fresh]
        state.last_closed = slot
        for name, mechanism in self.mechanisms.items():
            if name in state.halted:
                continue
            randomness = SlotRandomness(self._secret, state.stream, slot, scope=name)
            port = self.trust.port(state, values, randomness)
            started = time.perf_counter()
            try:
                new_state, events = mechanism.step(
                    state.mechanisms[name], Slot(state.stream, slot, port, randomness)
                )
            except PrivacyBudgetExceeded as exc:
                state.halted[name] = f"{name}: privacy invariant violated at slot {slot}: {exc}"
                state.tallies[name].violations += 1
                self._publish(state, name)
                log.error(
                    "step %s: stream %r halted: %s", self.step_id, state.stream, state.halted[name]
                )
                continue
            STEP_SECONDS.labels(state.stream, name).observe(time.perf_counter() - started)
            state.mechanisms[name] = new_state
            state.tallies[name].record(events)
            self._publish(state, name)
            for event in events:
                out.append(("release", event) if isinstance(event, Release) else ("ledger", event))


@dataclass(frozen=True)
class MechanismOut:
    """The three outputs of a mechanism operator."""

    releases: Stream[Release]
    """Public releases, one per stream per slot."""

    ledger: Stream[LedgerEntry]
    """Ledger entries (privacy spend), one per stream per slot."""

    dead_letters: Stream[DeadLetter]
    """Inputs the operator could not use, each with its reason."""


def _pick(kind: str) -> Any:
    def pick(item: Output) -> Any:
        return item[1] if item[0] == kind else None

    return pick


@operator
def slotted_mechanism(
    step_id: str,
    up: KeyedStream[EventBatch],
    *,
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    population: int,
    secret: int | bytes,
    slotting: SlottingConfig | None = None,
    trust: TrustMode | None = None,
) -> MechanismOut:
    """Run ``mechanisms`` over every stream of ``up`` (keyed by stream name), slot by slot.

    The mechanisms share one slotting of the input (events are parsed, deduplicated and
    buffered once) and each keeps its own ledger. A stream's state lives in one Bytewax state
    (recovered from snapshots); randomness derives from ``secret``, the stream and the slot
    (design §6), so a replayed slot releases byte-identical output. A
    ``PrivacyBudgetExceeded`` halts that mechanism on that stream before anything of the
    offending slot is released; once all are halted, the stream's events become
    ``stream_halted`` dead letters. ``trust`` is the trust mode (default ``LdpClients``).
    """
    cfg = slotting or SlottingConfig()
    names = [m.name for m in mechanisms]
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"step {step_id!r}: mechanisms must be non-empty and distinct, got {names}"
        )

    def builder(resume: StreamState | None) -> _SlottedLogic:
        return _SlottedLogic(step_id, mechanisms, task, population, secret, cfg, resume, trust)

    tagged = op.key_rm("untag", op.stateful_batch("slots", up, builder))
    return MechanismOut(
        releases=op.filter_map("releases", tagged, _pick("release")),
        ledger=op.filter_map("ledger", tagged, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
    )
