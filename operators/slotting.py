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
import dataclasses
import itertools
import json
import logging
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    UNREGISTERED,
    USER_ID_KIND,
    DeadLetter,
    EventBatch,
)
from privstream.mechanisms.accountant import (
    BudgetSplit,
    PopulationAccountant,
    check_shares,
    class_spend,
)
from privstream.mechanisms.client import (
    MIN_EPSILON,
    ClientPath,
    ClientPort,
    CuratorPort,
    Requirements,
    SimulatedClientPort,
    SimulatedCurator,
    check_requirement,
)
from privstream.mechanisms.contract import Halt, LedgerEntry, Mechanism, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.seeding import NoiseKey, SlotRandomness
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD, EVENTS, MARKERS_IGNORED, STEP_SECONDS, Tally
from privstream.operators.watermark import PartitionWatermarks

log = logging.getLogger(__name__)

STREAM_STATE_VERSION: Final = 4
"""2: per-mechanism tallies; 3: users' privacy requirements; 4: binding to the noise key and
the privacy parameters, the population accountant, per-partition watermarks."""
MissingPolicy = Literal["carry_forward", "absent"]
Output = tuple[str, Any]  # ("release" | "ledger" | "dead_letter", event)
_REASON: Final = (
    "", USER_ID_KIND, OUT_OF_DOMAIN, LATE, FAR_FUTURE, POPULATION_FULL, REQUIREMENT_CHANGED,
    DUPLICATE, UNREGISTERED,
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
        partitions: input partitions feeding the streams (``≥ 1``; default 1). With several, a
            slot closes only once every partition has passed it (``operators.watermark``).
    """

    lateness: int = 1
    max_slot_gap: int = 10_000
    missing: MissingPolicy = "carry_forward"
    client_path: ClientPath = "aggregate"
    close_on_eof: bool = True
    partitions: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.lateness, int) or self.lateness < 0:
            raise ValueError(f"lateness must be an integer >= 0, got {self.lateness!r}")
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {self.partitions!r}")
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
    ``watermarks`` is the progress of each input partition (set by the first batch).
    ``binding`` names what the state belongs to — the noise key's fingerprint (never the key)
    and every privacy parameter — so a resume with another secret or configuration is refused
    (design §6). ``accountant`` composes the mechanisms' spend over the stream's population.
    ``newcomers`` holds, per open slot, the reports of named users who are not registered yet
    (``ldp-simulated``): they register when the slot closes, in user-id order.
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
    watermarks: PartitionWatermarks | None = None
    binding: dict[str, str] = field(default_factory=dict)
    accountant: PopulationAccountant = field(default_factory=PopulationAccountant)
    newcomers: dict[int, dict[str, tuple[float, str, bytes | None]]] = field(default_factory=dict)

    def registered(self) -> NDArray[np.bool_] | None:
        """Mask of registered users (None: all ``n``, as with dense user indices)."""
        if self.id_kind == "dense":
            return None
        return np.arange(self.current.shape[0]) < len(self.directory)

    def all_halted(self) -> bool:
        return len(self.halted) == len(self.mechanisms)


@dataclass(frozen=True)
class Preferences:
    """The registration of a trusted-curator stream, fixed before the data arrive (spec
    personalized-w-event §1.1, A2): users' privacy requirements by user id for named users (a
    registration table, spec §9.1: exactly these users are registered, in this order) or by
    dense index (``epsilons``/``windows`` arrays, NaN / 0 = the stream default; dense indices
    ``0..n−1`` are all registered). Who is registered is therefore public by construction;
    data of anybody else are ``unregistered_user`` dead letters."""

    by_user: dict[str, tuple[float, int]] = field(default_factory=dict)
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        """Refuse requirements outside the limits at start (never naming a user)."""
        for k, (eps, win) in enumerate(self.by_user.values(), start=1):
            check_requirement(eps, win, f"registration entry {k}")
        if self.epsilons is not None:
            for eps in np.unique(self.epsilons[~np.isnan(self.epsilons)]).tolist():
                check_requirement(eps, 1, "a registered requirement")
        if self.windows is not None:
            for win in np.unique(self.windows[self.windows != 0]).tolist():
                check_requirement(MIN_EPSILON, win, "a registered requirement")


class TrustMode:
    """What a mechanism sees of the users at a slot (design §4).

    ``fixed_population``: the registered users are given at start (``cdp``), so who sent data
    never changes who is counted; otherwise users register on their first accepted event.
    """

    tracks_requirements: ClassVar[bool] = False
    fixed_population: ClassVar[bool] = False

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
    samples and adds noise. The population is the registration (``Preferences``), fixed at
    start; the ``Requirements`` are built once per stream."""

    tracks_requirements = True
    fixed_population = True

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


@dataclass(frozen=True)
class _Plan:
    """What every stream of one operator runs: the mechanisms with their budget shares, the
    noise key, the trust mode and the binding a snapshot must match."""

    mechanisms: dict[str, Mechanism[Any, Any]]
    shares: dict[str, float]
    task: EstimationTask
    population: int
    key: NoiseKey
    config: SlottingConfig
    trust: TrustMode
    split: BudgetSplit
    epsilon: float
    """The population's budget per window (before the split)."""

    def binding(self) -> dict[str, str]:
        """The noise key's fingerprint and every parameter a replay depends on."""
        cfg = self.config
        out = {
            "noise key": self.key.fingerprint(),
            "population": str(self.population),
            "task": repr(self.task),
            "slotting": f"lateness={cfg.lateness} missing={cfg.missing} "
            f"client_path={cfg.client_path} max_slot_gap={cfg.max_slot_gap} "
            f"partitions={cfg.partitions}",
            "budget split": repr(self.split),
            "population epsilon": repr(self.epsilon),
        }
        for name, mechanism in self.mechanisms.items():
            out[f"mechanism {name}"] = repr(mechanism.config)
        return out


def _failure(exc: BaseException) -> str:
    """An unexpected error as its type and where it was raised, never its message: a message
    may quote the data (a user id, a value), and halt reasons reach the log and the ledger."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {Path(last.filename).name}:{last.lineno} in {last.name}"


def _check_binding(step_id: str, resume: StreamState, expected: dict[str, str]) -> None:
    """Refuse a snapshot written under another secret or other privacy parameters (design §6):
    resuming it would release the replayed slots with other noise, or reset budgets."""
    found = resume.binding
    differ = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
    if not differ:
        return
    lines = [
        "another secret (its fingerprint differs)"
        if key == "noise key"
        else f"{key}: stored {found.get(key, '(none)')}, now {expected.get(key, '(none)')}"
        for key in differ
    ]
    raise IncompatibleState(
        f"step {step_id!r}: the recovery store of stream {resume.stream!r} was written with "
        + "; ".join(lines)
        + ". Resume with the same secret and configuration, or start a new recovery directory "
        "(a new store starts every budget afresh: only do that for a new stream)."
    )


class _SlottedLogic(StatefulBatchLogic[EventBatch, Output, StreamState]):
    def __init__(self, step_id: str, plan: _Plan, resume: StreamState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        self.trust = plan.trust
        self.mechanisms = plan.mechanisms
        self.task = plan.task
        self.n = plan.population
        self.cfg = plan.config
        self.binding = plan.binding()
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
            _check_binding(step_id, resume, self.binding)
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
            marks = self._watermarks(state, batch.partition)
            if state.all_halted():
                out.extend(self._reject_all(batch, STREAM_HALTED, "; ".join(state.halted.values())))
                continue
            try:
                self._take(state, batch, marks, out)
            except Exception as exc:  # a broken stream halts; the process serves the others
                reason = f"slotting failed: {_failure(exc)}"
                slot = -1 if state.last_closed is None else state.last_closed + 1
                for name in self.mechanisms:
                    if name not in state.halted:
                        self._halt(state, name, slot, reason, False, out)
                out.extend(self._reject_all(batch, STREAM_HALTED, reason))
        return out, StatefulBatchLogic.RETAIN

    def _take(
        self, state: StreamState, batch: EventBatch, marks: PartitionWatermarks, out: list[Output]
    ) -> None:
        """Ingest one batch and release every slot it lets close."""
        out.extend(("dead_letter", d) for d in self._ingest(state, batch))
        marker = self._marker(state, batch, out)
        if marker is not None:
            marks.mark(batch.partition, marker)
        if self.cfg.partitions > 1:  # a slot closes once every partition has passed it
            target = marks.closable(self.cfg.lateness)
            if target is not None:
                self._close_through(state, target, out)
            return
        if state.max_seen is not None:  # one partition: its order is the stream's order
            self._close_through(state, state.max_seen - self.cfg.lateness - 1, out)
        if marker is not None:
            self._close_through(state, marker, out)

    def _marker(self, state: StreamState, batch: EventBatch, out: list[Output]) -> int | None:
        """The batch's end-of-slot marker if it may close slots: markers obey the events' gap
        limit (a far-future one is a ``far_future_slot`` dead letter: it would step millions of
        empty slots), and one for an already released slot or before any event is counted."""
        t = batch.complete_through
        if t is None:
            return None
        if state.max_seen is None:
            MARKERS_IGNORED.labels(state.stream, "before_any_event").inc()
            return None
        if t > state.max_seen + self.cfg.max_slot_gap:
            MARKERS_IGNORED.labels(state.stream, "far_future").inc()
            text = json.dumps({"stream": state.stream, "end_of_slot": t}, separators=(",", ":"))
            detail = (
                f"end-of-slot marker more than {self.cfg.max_slot_gap} slots ahead of the stream"
            )
            out.append(("dead_letter", DeadLetter(FAR_FUTURE, state.stream, text, detail)))
            return None
        if state.last_closed is not None and t <= state.last_closed:
            MARKERS_IGNORED.labels(state.stream, "already_released").inc()
        return t

    def _late_rows(
        self, state: StreamState, batch: EventBatch, usable: NDArray[np.bool_]
    ) -> NDArray[np.bool_] | None:
        """Record the ``usable`` rows' progress in their partition's watermark and, with several
        partitions, return the rows that partition had already passed (None with one).

        Row by row in the partition's own order — a row is late once an earlier row of its
        partition (in this batch or before) or a marker has passed its slot, even while another
        partition holds the slot open — so lateness depends neither on how the partitions
        interleave nor on where the polls cut them."""
        marks = state.watermarks
        assert marks is not None
        slots, late = batch.slots, None
        if self.cfg.partitions > 1 and usable.any():
            prior = marks.max_slots[batch.partition]
            rows = np.where(usable, slots, -1)[:-1]
            seen = np.maximum.accumulate(np.concatenate(([-1 if prior is None else prior], rows)))
            passed = seen - self.cfg.lateness - 1  # the data watermark before each row
            mark = marks.marks[batch.partition]
            if mark is not None:
                passed = np.maximum(passed, mark)
            late = usable & (slots <= passed)
            usable = usable & ~late
        if usable.any():
            marks.observe(batch.partition, int(slots[usable].max()))
        return late

    def _watermarks(self, state: StreamState, partition: int) -> PartitionWatermarks:
        """The stream's progress per input partition (made by its first batch; a snapshot of
        another partition count is refused at start by the binding)."""
        marks = state.watermarks
        if marks is None:
            marks = state.watermarks = PartitionWatermarks(self.cfg.partitions)
        marks.check(partition)
        return marks

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
                binding=dict(self.binding),
                accountant=PopulationAccountant(evaluation=self.plan.split.evaluation),
            )
            if isinstance(self.trust, TrustedCurator):
                self._register(self.state, self.trust.preferences)
            for name in self.mechanisms:
                self._publish(self.state, name)
        return self.state

    def _register(self, state: StreamState, prefs: Preferences) -> None:
        """Load the registration before any data: named users of the table in its order, or
        the requirements of the dense indices."""
        if prefs.by_user:
            if len(prefs.by_user) > self.n:
                raise ValueError(
                    f"the registration table holds {len(prefs.by_user)} users but the stream's "
                    f"population is n={self.n}"
                )
            self._requirement_arrays(state)
            assert state.epsilons is not None and state.windows is not None
            for i, (user, (eps, win)) in enumerate(prefs.by_user.items()):
                state.directory[user] = i
                state.epsilons[i], state.windows[i] = eps, win
            state.id_kind = "named"
        elif prefs.epsilons is not None or prefs.windows is not None:
            self._requirement_arrays(state)
            assert state.epsilons is not None and state.windows is not None
            if prefs.epsilons is not None:
                state.epsilons[:] = prefs.epsilons
            if prefs.windows is not None:
                state.windows[:] = prefs.windows

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
        """Dense user indices of the rows (−1 where unknown: not registered yet) and the
        batch's id kind."""
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
        passed = self._passed_slot(state)
        if passed is not None:
            code[(code == 0) & (slots <= passed)] = _CODE[LATE]
        pending = code == 0
        if pending.any():
            reference = state.max_seen if state.max_seen is not None else int(slots[pending].min())
            code[pending & (slots > reference + self.cfg.max_slot_gap)] = _CODE[FAR_FUTURE]
        late = self._late_rows(state, batch, code == 0)  # in its own partition's order
        if late is not None:
            code[late] = _CODE[LATE]
        idx, kind = self._user_index(state, batch, code == 0)
        held = np.zeros(size, dtype=bool)
        if kind == "named" and not self.trust.fixed_population:
            held = (code == 0) & (idx < 0)  # new users register when their slot closes
            self._hold_newcomers(state, batch, np.flatnonzero(held), code)
        unknown = UNREGISTERED if kind == "named" else OUT_OF_DOMAIN
        code[(code == 0) & (idx < 0) & ~held] = _CODE[unknown]
        if self.trust.tracks_requirements:
            self._requirements(state, batch, idx, code)
        ok = np.flatnonzero((code == 0) & ~held)
        self._buffer(state, batch, idx, code, ok)
        accepted = int((code == 0).sum())
        if accepted:
            hi = int(slots[code == 0].max())
            EVENTS.labels(state.stream).inc(accepted)
            state.id_kind = kind
            state.max_seen = hi if state.max_seen is None else max(state.max_seen, hi)
        rejected = np.flatnonzero(code)
        if rejected.size == 0:
            return []
        details = self._details(state, batch, late is not None)
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

    def _passed_slot(self, state: StreamState) -> int | None:
        """The last slot an event may no longer enter: the last released one, and with one
        partition also the watermark (newest slot − lateness − 1) — so events far behind the
        stream cannot move its start back before its first release."""
        passed = state.last_closed
        if self.cfg.partitions == 1 and state.max_seen is not None:
            watermark = state.max_seen - self.cfg.lateness - 1
            passed = watermark if passed is None else max(passed, watermark)
        return passed

    def _buffer(
        self,
        state: StreamState,
        batch: EventBatch,
        idx: NDArray[np.int64],
        code: NDArray[np.int8],
        ok: NDArray[np.intp],
    ) -> None:
        """Write the accepted rows ``ok`` into their open slots; a user's second report of a
        slot (in the batch or since the slot opened) becomes a duplicate."""
        ok_slots = batch.slots[ok]
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

    def _details(self, state: StreamState, batch: EventBatch, by_partition: bool) -> dict[str, str]:
        """The dead-letter detail of each reason the slotting gives."""
        late = (
            f"slot already released or behind the stream's watermark (last released slot "
            f"{state.last_closed}, newest slot {state.max_seen}, lateness {self.cfg.lateness})"
            if not by_partition
            else f"slot already passed by its input partition {batch.partition} (by a later "
            f"slot beyond the lateness of {self.cfg.lateness} or an end-of-slot marker)"
        )
        return {
            OUT_OF_DOMAIN: f"value or user outside the domain (d={self.task.d}, n={self.n})",
            LATE: late,
            FAR_FUTURE: f"slot more than {self.cfg.max_slot_gap} slots ahead of the stream",
            DUPLICATE: "user already reported in this slot (first report wins)",
            POPULATION_FULL: f"registered population of {self.n} users is full",
            REQUIREMENT_CHANGED: "the user registered with another privacy requirement "
            "(epsilon, window); it cannot change within a stream",
            USER_ID_KIND: "user ids must be all strings or all dense indices within a stream",
            UNREGISTERED: "the user is not in the stream's registration table",
        }

    def _hold_newcomers(
        self, state: StreamState, batch: EventBatch, rows: NDArray[np.intp], code: NDArray[np.int8]
    ) -> None:
        """Keep the rows of users not registered yet until their slot closes (first report of a
        user in a slot wins). Registering them then, in user-id order, makes every user's dense
        index — and so which users a mechanism samples — independent of how the input
        partitions interleave."""
        for i in rows.tolist():
            held = state.newcomers.setdefault(int(batch.slots[i]), {})
            user = batch.users[i]
            if user in held:
                code[i] = _CODE[DUPLICATE]
            else:
                held[user] = (float(batch.values[i]), batch.row_text(i), batch.row_original(i))

    def _admit_newcomers(self, state: StreamState, slot: int, out: list[Output]) -> None:
        """Register the users first seen in ``slot``, in user-id order, and put their reports
        in the slot; past the population ``n`` they are ``population_full`` dead letters."""
        held = state.newcomers.pop(slot, None)
        if not held:
            return
        directory = state.directory
        target = state.open_slots.get(slot)
        if target is None:
            target = state.open_slots[slot] = np.full(self.n, np.nan)
        for user in sorted(held):
            value, text, original = held[user]
            j = directory.get(user, -1)
            if j < 0 and len(directory) >= self.n:
                detail = f"registered population of {self.n} users is full"
                letter = DeadLetter(POPULATION_FULL, state.stream, text, detail, original)
                out.append(("dead_letter", letter))
                continue
            if j < 0:
                j = directory[user] = len(directory)
            target[j] = value  # held first: it wins over a later report of the same slot

    def _requirement_arrays(self, state: StreamState) -> None:
        if state.epsilons is None or state.windows is None:
            state.epsilons = np.full(self.n, np.nan)
            state.windows = np.zeros(self.n, dtype=np.int64)

    def _requirements(
        self, state: StreamState, batch: EventBatch, idx: NDArray[np.int64], code: NDArray[np.int8]
    ) -> None:
        """Refuse rows stating another requirement than the user's registered one (the
        registration fixes it before the data arrive; a row stating none is fine)."""
        if batch.epsilons is None or batch.windows is None:
            return
        stating = (code == 0) & (~np.isnan(batch.epsilons) | (batch.windows > 0))
        if not stating.any():
            return
        self._requirement_arrays(state)
        assert state.epsilons is not None and state.windows is not None
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
            if not state.open_slots and not state.newcomers:
                return
            start = min(state.open_slots.keys() | state.newcomers.keys())
        else:
            start = state.last_closed + 1
        for slot in range(start, target + 1):
            if state.all_halted():
                return
            self._step(state, slot, out)

    def _step(self, state: StreamState, slot: int, out: list[Output]) -> None:
        """Step every live mechanism through ``slot``, compose their spend, then release.

        Nothing of the slot is emitted before the population accountant accepted it; a
        mechanism that fails (a ledger refusal or any other error) halts alone, with its reason
        in the log and the ``halted`` metric, and the others go on.
        """
        self._admit_newcomers(state, slot, out)
        values = self._slot_values(state, slot)
        state.last_closed = slot
        stepped: dict[str, tuple[Any, list[Release | LedgerEntry]]] = {}
        for name, mechanism in self.mechanisms.items():
            if name in state.halted:
                continue
            randomness = SlotRandomness(self.plan.key, state.stream, slot, scope=name)
            port = self.trust.port(state, values, randomness)
            started = time.perf_counter()
            try:
                stepped[name] = mechanism.step(
                    state.mechanisms[name], Slot(state.stream, slot, port, randomness)
                )
            except PrivacyBudgetExceeded as exc:
                reason = f"privacy invariant violated at slot {slot}: {exc}"
                self._halt(state, name, slot, reason, True, out)
                continue
            except Exception as exc:  # one mechanism's failure never takes the process down
                self._halt(state, name, slot, f"failed at slot {slot}: {_failure(exc)}", False, out)
                continue
            STEP_SECONDS.labels(state.stream, name).observe(time.perf_counter() - started)
        if not self._compose(state, slot, stepped, out):
            return
        worst = state.accountant.worst()
        for name, (new_state, events) in stepped.items():
            stamped = [self._stamp(event, worst) for event in events]
            state.mechanisms[name] = new_state
            state.tallies[name].record(stamped)
            self._publish(state, name)
            for event in stamped:
                out.append(("release", event) if isinstance(event, Release) else ("ledger", event))
        if worst is not None:
            window, epsilon, spent = worst
            BOARD.update_population(state.stream, epsilon, window, spent, len(self.mechanisms))

    def _slot_values(self, state: StreamState, slot: int) -> NDArray[np.float64]:
        """Users' values at ``slot``: its reports, over the carried-forward ones by default."""
        reported = state.open_slots.pop(slot, None)
        if self.cfg.missing == "absent":
            return reported if reported is not None else np.full(self.n, np.nan)
        values = state.current
        if reported is not None:
            fresh = ~np.isnan(reported)
            values[fresh] = reported[fresh]
        return values

    def _halt(
        self,
        state: StreamState,
        name: str,
        slot: int,
        reason: str,
        violation: bool,
        out: list[Output],
    ) -> None:
        """Stop ``name`` on the stream from ``slot`` on: log, metric and a ``Halt`` record on
        the ledger output (nothing of ``slot`` is released by it)."""
        state.halted[name] = f"{name}: {reason}"
        if violation:
            state.tallies[name].violations += 1
        self._publish(state, name)
        out.append(("ledger", Halt(state.stream, name, slot, state.halted[name])))
        log.error("step %s: stream %r halted: %s", self.step_id, state.stream, state.halted[name])

    def _compose(
        self,
        state: StreamState,
        slot: int,
        stepped: dict[str, tuple[Any, list[Release | LedgerEntry]]],
        out: list[Output],
    ) -> bool:
        """Charge the population accountant with every mechanism's window spend (a halted
        mechanism's last one still counts); on an overspend halt them all before release."""
        spends = []
        for name, mechanism in self.mechanisms.items():
            events = stepped[name][1] if name in stepped else ()
            entry = next((e for e in events if isinstance(e, LedgerEntry)), None)
            entry = entry or state.tallies[name].last_ledger
            if entry is not None:
                cost, share = mechanism.privacy_cost, self.plan.shares[name]
                spends.append(class_spend(entry, cost, share, self.plan.epsilon))
        try:
            state.accountant.charge(slot, spends)
        except PrivacyBudgetExceeded as exc:
            for name in stepped:
                reason = f"population budget refused slot {slot}: {exc}"
                self._halt(state, name, slot, reason, True, out)
            return False
        return True

    def _stamp(
        self, event: Release | LedgerEntry, worst: tuple[int, float, float] | None
    ) -> Release | LedgerEntry:
        """Mark the run's provenance on every output; ledger entries get the composed spend
        ``worst`` of the slot (``PopulationAccountant.worst``)."""
        flags: dict[str, Any] = {}
        if self.plan.key.insecure:
            flags["insecure_seed"] = True
        if self.plan.split.evaluation:
            flags["evaluation"] = True
        if isinstance(event, LedgerEntry) and worst is not None:
            flags["population_epsilon"], flags["population_window_spent"] = worst[1], worst[2]
        return dataclasses.replace(event, **flags) if flags else event


@dataclass(frozen=True)
class MechanismOut:
    """The three outputs of a mechanism operator."""

    releases: Stream[Release]
    """Public releases, one per stream per slot."""

    ledger: Stream[LedgerEntry | Halt]
    """Ledger entries (privacy spend), one per stream, mechanism and slot, and a ``Halt``
    record where a mechanism stopped."""

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
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    trust: TrustMode | None = None,
    split: BudgetSplit | None = None,
    epsilon: float | None = None,
) -> MechanismOut:
    """Run ``mechanisms`` over every stream of ``up`` (keyed by stream name), slot by slot.

    The mechanisms share one slotting of the input (events are parsed, deduplicated and
    buffered once) and each keeps its own ledger; the population accountant composes their
    spend per stream and refuses an overspend before release (``mechanisms.accountant``).
    ``split`` gives each mechanism's share of the population budget ``epsilon`` (default: the
    first mechanism's ε over its share), in order; every mechanism must have been built with
    its share (refused otherwise). One mechanism needs no split, several must say how they
    split — or that they are an evaluation. A stream's state lives in one Bytewax state
    (recovered from snapshots, bound to the noise key's fingerprint and every privacy
    parameter); randomness derives from ``secret`` (a ``NoiseKey``; an int is an insecure seed
    and marks every output), the stream and the slot (design §6), so a replayed slot releases
    byte-identical output. A failing mechanism halts on that stream before anything of the
    offending slot is released; once all are halted, the stream's events become
    ``stream_halted`` dead letters. ``trust`` is the trust mode (default ``LdpClients``).
    """
    cfg = slotting or SlottingConfig()
    names = [m.name for m in mechanisms]
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"step {step_id!r}: mechanisms must be non-empty and distinct, got {names}"
        )
    split = split or BudgetSplit.parse(None, len(names))
    if len(split.shares) != len(names):
        raise ValueError(f"step {step_id!r}: {len(split.shares)} budget shares for {names}")
    key = NoiseKey.coerce(secret)
    costs = [(m.name, m.privacy_cost) for m in mechanisms]
    if epsilon is None:
        epsilon = costs[0][1].epsilon / split.shares[0]
    check_shares(costs, split, epsilon)
    plan = _Plan(
        mechanisms={m.name: m for m in mechanisms},
        shares=dict(zip(names, split.shares, strict=True)),
        task=task,
        population=population,
        key=key,
        config=cfg,
        trust=trust or LdpClients(task, cfg.client_path),
        split=split,
        epsilon=epsilon,
    )
    BOARD.set_run(insecure_seed=key.insecure, evaluation=split.evaluation)

    def builder(resume: StreamState | None) -> _SlottedLogic:
        return _SlottedLogic(step_id, plan, resume)

    tagged = op.key_rm("untag", op.stateful_batch("slots", up, builder))
    return MechanismOut(
        releases=op.filter_map("releases", tagged, _pick("release")),
        ledger=op.filter_map("ledger", tagged, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
    )
