"""Deterministic slots over keyed event batches, and the operator that steps a mechanism.

Design §5: a slot closes when the stream's watermark (max event slot minus the allowed
lateness) passes it, when a batch marks it complete, or at end of input — never on wall-clock
time — so a replay after a crash closes the same slots with the same contents. Every slot from
the stream's first one on is stepped, including empty ones (the ledger must age). One report
per user per slot (first wins); everything unusable goes to the dead-letter stream with a reason.

Users keep their last value between slots (``carry_forward``, spec §6.2) unless the policy is
``absent``, in which case only users that reported at a slot are eligible at it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

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
    STREAM_HALTED,
    USER_ID_KIND,
    DeadLetter,
    EventBatch,
)
from privstream.mechanisms.client import ClientPath, SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Mechanism, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import EstimationTask

log = logging.getLogger(__name__)

STREAM_STATE_VERSION: Final = 1
MissingPolicy = Literal["carry_forward", "absent"]
Output = tuple[str, Any]  # ("release" | "ledger" | "dead_letter", event)


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
    """Snapshot of one stream: the mechanism's state plus the slotting bookkeeping."""

    stream: str
    mechanism: str
    mechanism_state: Any
    current: NDArray[np.float64]
    version: int = STREAM_STATE_VERSION
    open_slots: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    directory: dict[str, int] = field(default_factory=dict)
    id_kind: str | None = None
    max_seen: int | None = None
    last_closed: int | None = None
    halted: str | None = None


class _SlottedLogic(StatefulBatchLogic[EventBatch, Output, StreamState]):
    def __init__(
        self,
        step_id: str,
        mechanism: Mechanism[Any, Any],
        task: EstimationTask,
        population: int,
        secret: int | bytes,
        config: SlottingConfig,
        resume: StreamState | None,
    ) -> None:
        self.step_id = step_id
        self.mechanism = mechanism
        self.task = task
        self.n = population
        self._secret = secret
        self.cfg = config
        if resume is not None:
            if resume.version != STREAM_STATE_VERSION or resume.mechanism != mechanism.name:
                raise IncompatibleState(
                    f"step {step_id!r}: snapshot of stream {resume.stream!r} has slotting version "
                    f"{resume.version} for mechanism {resume.mechanism!r}; this code runs version "
                    f"{STREAM_STATE_VERSION} of {mechanism.name!r}"
                )
            mechanism.check_state(resume.mechanism_state)
        self.state: StreamState | None = resume

    # -- Bytewax callbacks ---------------------------------------------------------------------

    def on_batch(self, values: list[EventBatch]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        for batch in values:
            state = self._state_for(batch.stream)
            if state.halted is not None:
                out.extend(self._reject_all(batch, STREAM_HALTED, state.halted))
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
            and state.halted is None
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
                mechanism=self.mechanism.name,
                mechanism_state=self.mechanism.initial_state(),
                current=np.full(self.n, np.nan),
            )
        return self.state

    def _reject_all(self, batch: EventBatch, reason: str, detail: str) -> list[Output]:
        return [
            ("dead_letter", DeadLetter(reason, batch.stream, batch.row_text(i), detail))
            for i in range(len(batch))
        ]

    def _user_index(
        self, state: StreamState, batch: EventBatch, ok: NDArray[np.bool_]
    ) -> tuple[NDArray[np.int64], str]:
        """Dense user indices of the rows (−1 where unknown) and the batch's id kind."""
        if batch.users.dtype.kind in "iu":
            idx = batch.users.astype(np.int64)
            return np.where((idx >= 0) & (idx < self.n), idx, -1), "dense"
        idx = np.full(len(batch), -1, dtype=np.int64)
        directory = state.directory
        for i in np.flatnonzero(ok):
            user = batch.users[i]
            j = directory.get(user)
            if j is None and len(directory) < self.n:
                j = directory[user] = len(directory)
            if j is not None:
                idx[i] = j
        return idx, "named"

    def _ingest(self, state: StreamState, batch: EventBatch) -> list[DeadLetter]:
        size = len(batch)
        if size == 0:
            return []
        reason = np.full(size, "", dtype=object)
        kind = "dense" if batch.users.dtype.kind in "iu" else "named"
        if state.id_kind is not None and state.id_kind != kind:
            reason[:] = USER_ID_KIND
        reason[(reason == "") & ~self.task.in_domain(batch.values)] = OUT_OF_DOMAIN
        slots = batch.slots
        if state.last_closed is not None:
            reason[(reason == "") & (slots <= state.last_closed)] = LATE
        pending = reason == ""
        if pending.any():
            reference = state.max_seen if state.max_seen is not None else int(slots[pending].min())
            reason[pending & (slots > reference + self.cfg.max_slot_gap)] = FAR_FUTURE
        idx, kind = self._user_index(state, batch, reason == "")
        reason[(reason == "") & (idx < 0)] = POPULATION_FULL if kind == "named" else OUT_OF_DOMAIN
        ok = np.flatnonzero(reason == "")
        if ok.size:
            _, first = np.unique(np.stack([slots[ok], idx[ok]], axis=1), axis=0, return_index=True)
            in_batch_dup = np.ones(ok.size, dtype=bool)
            in_batch_dup[first] = False
            reason[ok[in_batch_dup]] = DUPLICATE
            ok = ok[~in_batch_dup]
        for slot in np.unique(slots[ok]):
            rows = ok[slots[ok] == slot]
            target = state.open_slots.get(int(slot))
            if target is None:
                target = state.open_slots[int(slot)] = np.full(self.n, np.nan)
            seen = ~np.isnan(target[idx[rows]])
            reason[rows[seen]] = DUPLICATE
            fresh = rows[~seen]
            target[idx[fresh]] = batch.values[fresh]
        accepted = reason == ""
        if accepted.any():
            state.id_kind = kind
            top = int(slots[accepted].max())
            state.max_seen = top if state.max_seen is None else max(state.max_seen, top)
        details = {
            OUT_OF_DOMAIN: f"value or user outside the domain (d={self.task.d}, n={self.n})",
            LATE: f"slot already released (last released slot {state.last_closed})",
            FAR_FUTURE: f"slot more than {self.cfg.max_slot_gap} slots ahead of the stream",
            DUPLICATE: "user already reported in this slot (first report wins)",
            POPULATION_FULL: f"registered population of {self.n} users is full",
            USER_ID_KIND: "user ids must be all strings or all dense indices within a stream",
        }
        return [
            DeadLetter(str(reason[i]), batch.stream, batch.row_text(int(i)), details[str(reason[i])])
            for i in np.flatnonzero(~accepted)
        ]

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
            if state.halted is not None:
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
        randomness = SlotRandomness(self._secret, state.stream, slot)
        client = SimulatedClientPort(values, self.task, randomness, self.cfg.client_path)
        try:
            new_state, events = self.mechanism.step(
                state.mechanism_state, Slot(state.stream, slot, client, randomness)
            )
        except PrivacyBudgetExceeded as exc:
            state.halted = f"privacy invariant violated at slot {slot}: {exc}"
            log.error("step %s: stream %r halted: %s", self.step_id, state.stream, state.halted)
            return
        state.mechanism_state = new_state
        state.last_closed = slot
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
    mechanism: Mechanism[Any, Any],
    task: EstimationTask,
    population: int,
    secret: int | bytes,
    slotting: SlottingConfig | None = None,
) -> MechanismOut:
    """Run ``mechanism`` over every stream of ``up`` (keyed by stream name), one slot at a time.

    Each stream's ledger and slot bookkeeping live in one Bytewax state (recovered from
    snapshots); randomness derives from ``secret``, the stream and the slot (design §6), so a
    replayed slot releases byte-identical output. A ``PrivacyBudgetExceeded`` halts that stream
    before anything of the offending slot is released; its later events become
    ``stream_halted`` dead letters.
    """
    cfg = slotting or SlottingConfig()

    def builder(resume: StreamState | None) -> _SlottedLogic:
        return _SlottedLogic(step_id, mechanism, task, population, secret, cfg, resume)

    tagged = op.key_rm("untag", op.stateful_batch("slots", up, builder))
    return MechanismOut(
        releases=op.filter_map("releases", tagged, _pick("release")),
        ledger=op.filter_map("ledger", tagged, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
    )
