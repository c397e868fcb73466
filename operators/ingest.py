"""Ingest of event batches into a stream's open slots (design §5), vectorised per batch.

Every row gets a reason code (0 = accepted): user-id kind, domain, lateness (the stream's
watermark, or with several partitions the row's own partition), far-future slots, unknown
users; accepted rows are buffered in their slot (first report of a user in a slot wins, a second
is a duplicate). Everything refused becomes a dead letter with a machine-readable reason.
"""

from __future__ import annotations

import itertools
import json
import operator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.reasons import CODE, REASON, Notes, Output
from privstream.operators.registration import Population
from privstream.operators.stream_state import StreamState
from privstream.schema.batches import DenseValues
from privstream.schema.events import (
    DUPLICATE,
    FAR_FUTURE,
    LATE,
    OUT_OF_DOMAIN,
    POPULATION_FULL,
    REQUIREMENT_CHANGED,
    UNREGISTERED,
    USER_ID_KIND,
    WITHDRAWN,
    DeadLetter,
    EventBatch,
    held_line,
)

if TYPE_CHECKING:
    from privstream.operators.clock import SlottingConfig


class Windower:
    """The open slots of a stream, one part of the slotted operator: it classifies every row
    of a batch (a dead-letter reason, or accepted), buffers the accepted rows in their slot in
    the stream's batch type (``schema.batches``; today every family's is ``DenseValues``) with
    the first report of a user in a slot winning, and hands a closing slot's values over."""

    _marks: NDArray[np.int32] | None = None  # scratch of ``_repeats``, one entry per user

    def __init__(
        self,
        cfg: SlottingConfig,
        task: EstimationTask,
        population: Population,
        carry: int,
        stream_population: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.population = population
        self.trust = population.trust
        self.n = population.n
        self.carry = carry
        self.stream_population = population.n if stream_population is None else stream_population
        """The stream's ``n`` that dead letters name (a user shard holds part of it)."""

    def _shaped(self, values: NDArray[np.float64]) -> bool:
        """Values of the task's shape: one number per row, or a row of ``d`` for vectors."""
        d = self.task.value_shape
        return values.ndim == 2 and values.shape[1] == d if d else values.ndim == 1

    def reject_all(self, batch: EventBatch, reason: str, detail: str) -> list[Output]:
        """Every row of ``batch`` as a dead letter. This also runs after a failure, so a row
        that cannot be rendered still becomes a dead letter (naming only its stream), never a
        second exception that would end the process."""
        out: list[Output] = []
        for i in range(len(batch)):
            try:
                text, source = batch.row_line(i)
            except Exception:  # a malformed in-process batch: keep the row, not its content
                text, source = json.dumps({"stream": batch.stream}), None
            out.append(("dead_letter", DeadLetter.of(reason, batch.stream, text, detail, source)))
        return out

    def _user_index(
        self, state: StreamState, batch: EventBatch, ok: NDArray[np.bool_]
    ) -> tuple[NDArray[np.int64], str]:
        """Dense user indices of the rows (−1 where unknown: not enrolled or registered yet) and the
        batch's id kind."""
        if batch.users.dtype.kind in "iu":
            idx = batch.users.astype(np.int64)
            return np.where((idx >= 0) & (idx < self.n), idx, -1), "dense"
        every = bool(ok.all())
        rows = np.flatnonzero(ok)
        users = batch.users.tolist() if every else batch.users[rows].tolist()
        known = _indices(state.directory, users)
        if every:
            return known, "named"
        idx = np.full(len(batch), -1, dtype=np.int64)
        idx[rows] = known
        return idx, "named"

    def ingest(self, state: StreamState, batch: EventBatch, notes: Notes) -> list[DeadLetter]:
        """Buffer the batch's acceptable rows in their open slots; dead letters for the rest.

        Vectorised over the batch: a reason code per row, 0 = accepted.
        """
        size = len(batch)
        if size == 0:
            return []
        code = np.zeros(size, dtype=np.int8)
        kind = "dense" if batch.users.dtype.kind in "iu" else "named"
        if state.id_kind is not None and state.id_kind != kind:
            code[:] = CODE[USER_ID_KIND]
        if not self._shaped(batch.values):  # scalars for a vector task, or the other way
            code[:] = CODE[OUT_OF_DOMAIN]
        else:
            code[(code == 0) & ~self.task.in_domain(batch.values)] = CODE[OUT_OF_DOMAIN]
        slots = batch.slots
        if state.last_closed is not None:  # already released
            code[(code == 0) & (slots <= state.last_closed)] = CODE[LATE]
        pending = code == 0
        if pending.any():
            code[self._far_future(state, slots, pending)] = CODE[FAR_FUTURE]
        code[self._late_rows(state, batch, code == 0)] = CODE[LATE]  # its partition's order
        idx, kind = self._user_index(state, batch, code == 0)
        self.population.withdrawn_rows(state, slots, idx, code)
        held = np.zeros(size, dtype=bool)
        if kind == "named" and not self.trust.fixed_population:
            held = (code == 0) & (idx < 0)  # new users enrol when their slot closes
            self.population.hold_newcomers(state, batch, np.flatnonzero(held), code)
        unknown = UNREGISTERED if kind == "named" else OUT_OF_DOMAIN
        code[(code == 0) & (idx < 0) & ~held] = CODE[unknown]
        if self.trust.tracks_requirements:
            self.population.requirements(
                state, batch, idx, code, self.population.registered_share()
            )
        ok = np.flatnonzero((code == 0) & ~held)
        self._buffer(state, batch, idx, code, ok)
        accepted = int((code == 0).sum())
        if accepted:
            hi = int(slots[code == 0].max())
            notes.events.append((state.stream, accepted))
            state.id_kind = kind
            state.max_seen = hi if state.max_seen is None else max(state.max_seen, hi)
        rejected = np.flatnonzero(code)
        if rejected.size == 0:
            return []
        details = self._details(state, batch)
        lines = [batch.row_line(i) for i in rejected.tolist()]
        return [
            DeadLetter.of(REASON[c], batch.stream, text, details[REASON[c]], source)
            for (text, source), c in zip(lines, code[rejected].tolist(), strict=True)
        ]

    def _far_future(
        self, state: StreamState, slots: NDArray[np.int64], pending: NDArray[np.bool_]
    ) -> NDArray[np.bool_]:
        """The ``pending`` rows more than ``max_slot_gap`` slots ahead of the reference
        (``_reference``). With the ``data`` clock the reference is the newest slot accepted
        before the row — in the batch's order, so a poll's first row is not judged against
        the rows after it and the same input gives the same verdicts whatever the polls."""
        gap = self.cfg.max_slot_gap
        if self.cfg.clock == "markers":
            return pending & (slots > self._reference(state, slots[pending]) + gap)
        rows = np.flatnonzero(pending)
        top = state.max_seen if state.max_seen is not None else int(slots[rows[0]])
        far = np.zeros(slots.shape[0], dtype=bool)
        if int(slots[rows].max()) <= top + gap:  # the usual batch: nothing far ahead
            return far
        for i in rows.tolist():  # rare: row by row, each against the rows accepted before it
            s = int(slots[i])
            if s > top + gap:
                far[i] = True
            else:
                top = max(top, s)
        return far

    def _reference(self, state: StreamState, pending: NDArray[np.int64]) -> int:
        """The slot ``max_slot_gap`` counts from with the ``markers`` clock: the clock (its
        last closed slot or newest marker) — before the first marker the oldest slot
        buffered — so what events alone may buffer is bounded, and they never move the
        reference themselves."""
        marks = [m for m in state.watermarks.marks if m is not None] if state.watermarks else []
        if state.last_closed is not None:
            marks.append(state.last_closed)
        if marks:
            return max(marks)
        buffered = state.open_slots.keys() | state.newcomers.keys()
        return min(buffered) if buffered else int(pending.min())

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
            if self._repeats(users):  # rare: repeats inside the batch
                _, first = np.unique(users, return_index=True)
                repeat = np.ones(rows.shape[0], dtype=bool)
                repeat[first] = False
                code[rows[repeat]] = CODE[DUPLICATE]
                rows, users = rows[~repeat], users[~repeat]
            target = state.open_slots.get(slot)
            if target is None:
                target = state.open_slots[slot] = self.population.blank()
            seen = DenseValues(target).append(users, batch.values[rows])  # first report wins
            code[rows[seen]] = CODE[DUPLICATE]

    def _repeats(self, users: NDArray[np.int64]) -> bool:
        """Whether a user index occurs twice in ``users`` (each in ``[0, n)``): every row
        writes its position at its user's place in a scratch array of the population and
        reads it back — a repeated user reads another row's position. A sixth of the cost of
        the sort that finds which report came first, which only a batch with repeats needs."""
        marks = self._marks
        if marks is None:
            marks = self._marks = np.empty(self.n, dtype=np.int32)
        order = np.arange(users.shape[0], dtype=np.int32)
        marks[users] = order
        return bool((marks[users] != order).any())

    def _details(self, state: StreamState, batch: EventBatch) -> dict[str, str]:
        """The dead-letter detail of each reason the slotting gives."""
        late = (
            f"slot already released (last released slot {state.last_closed}) or behind the "
            f"watermark of its input partition {batch.partition} (a later slot of that "
            f"partition beyond the lateness of {self.cfg.lateness}, or an end-of-slot marker)"
        )
        return {
            OUT_OF_DOMAIN: f"value or user outside the domain (d={self.task.d}, "
            f"n={self.stream_population}; "
            f"{'a list of d numbers' if self.task.kind == 'vector' else 'one number'} per event)",
            LATE: late,
            FAR_FUTURE: f"slot more than {self.cfg.max_slot_gap} slots ahead of the stream"
            + (" clock" if self.cfg.clock == "markers" else ""),
            DUPLICATE: "user already reported in this slot (first report wins)",
            POPULATION_FULL: f"the stream's population of {self.stream_population} users is full",
            REQUIREMENT_CHANGED: "the user registered with another privacy requirement "
            "(epsilon, window); it cannot change within a stream",
            USER_ID_KIND: "user ids must be all strings or all dense indices within a stream",
            UNREGISTERED: "the user is not in the stream's registration table",
            WITHDRAWN: "the user was withdrawn from the stream's registration table: their "
            "events are not counted from the first slot after the resume that withdrew them",
        }

    def _late_rows(
        self, state: StreamState, batch: EventBatch, usable: NDArray[np.bool_]
    ) -> NDArray[np.bool_]:
        """Record the ``usable`` rows' progress in their partition's watermark and return the
        rows that partition had already passed.

        Row by row in the partition's own order — a row is late once an earlier row of its
        partition (in this batch or before) or a marker has passed its slot, even while another
        partition holds the slot open — so lateness depends neither on how the partitions
        interleave nor on where the polls cut them (one partition included: a stale row after
        the stream's first rows in the same poll is as late as in a poll of its own)."""
        marks = state.watermarks
        assert marks is not None
        slots = batch.slots
        late = np.zeros(slots.shape[0], dtype=bool)
        if usable.any():
            prior = marks.max_slots[batch.partition]
            rows = np.where(usable, slots, -1)[:-1]
            seen = np.maximum.accumulate(np.concatenate(([-1 if prior is None else prior], rows)))
            passed = seen - self.cfg.lateness - 1  # the data watermark before each row
            if self.cfg.clock == "markers":  # only markers pass slots
                passed = np.full_like(seen, -1)
            mark = marks.marks[batch.partition]
            if mark is not None:
                passed = np.maximum(passed, mark)
            late = usable & (slots <= passed)
            usable = usable & ~late
        if usable.any():
            kept = slots[usable]
            marks.observe(batch.partition, int(kept.max()), int(kept.min()))
        return late

    def drop_before(self, state: StreamState, start: int) -> list[DeadLetter]:
        """The reports buffered for slots before ``start`` (the stream's first slot), removed
        and turned into ``late_event`` dead letters (one per report, as its event would have
        been had it come after the start was known)."""
        detail = (
            f"slot before the stream's first slot {start} (set by its first close: the first "
            "authenticated marker, or the partitions' first slots with the data clock)"
        )
        names: dict[int, str] | None = None
        letters: list[DeadLetter] = []
        for slot in sorted(s for s in state.open_slots if s < start):
            values = state.open_slots.pop(slot)
            users = np.flatnonzero(~np.isnan(values.reshape(self.n, -1)).any(axis=1))
            if names is None and state.id_kind != "dense":
                names = {i: u for u, i in state.directory.items()}
            for j in users.tolist():
                user: Any = j if names is None else names.get(j, j)
                value = values[j]
                text = json.dumps(
                    {"stream": state.stream, "user": user, "slot": slot,
                     "value": value.tolist() if value.ndim else float(value)}
                )  # fmt: skip
                letters.append(DeadLetter(LATE, state.stream, text, detail))
        for slot in sorted(s for s in state.newcomers if s < start):
            for user, held in state.newcomers.pop(slot).items():
                text, source = held_line(held, user, slot)
                letters.append(DeadLetter.of(LATE, state.stream, text, detail, source))
        return letters

    def slot_values(self, state: StreamState, slot: int) -> NDArray[np.float64]:
        """Users' values at ``slot``: its reports, over the carried-forward ones by default.

        A value is carried at most ``carry`` slots after the slot it was reported in (default
        ``w − 1``: it feeds at most ``w`` consecutive slots, one window); after that its user is
        absent until they report again. A withdrawn user is absent from their withdrawal on."""
        reported = state.open_slots.pop(slot, None)
        if self.cfg.missing == "absent":
            return self.population.unwithdrawn(state, slot, reported if reported is not None else
                                     self.population.blank())  # fmt: skip
        values = state.current
        if state.reported_at is None:
            state.reported_at = np.full(self.n, np.iinfo(np.int64).min // 2, dtype=np.int64)
        if reported is not None:
            fresh = ~np.isnan(reported.reshape(self.n, -1)).any(axis=1)
            values[fresh] = reported[fresh]
            state.reported_at[fresh] = slot
        values[state.reported_at < slot - self._carry(state)] = np.nan
        return self.population.unwithdrawn(state, slot, values)

    def _carry(self, state: StreamState) -> int | NDArray[np.int64]:
        """Slots each user's value is carried: the plan's ``carry``, or with registered
        personal windows ``w_i − 1`` where lower (the default, ``carry_slots`` None)."""
        carry = self.carry
        windows = state.windows
        if self.cfg.carry_slots is not None or windows is None:
            return carry
        return np.where(windows > 0, np.minimum(windows - 1, carry), carry)


def _indices(directory: dict[str, int], users: list[Any]) -> NDArray[np.int64]:
    """Each user's dense index in ``directory``, −1 for a user not in it.

    The usual batch (every user enrolled) takes one C-level ``itemgetter`` call over the whole
    batch, which costs a third less per row than a ``dict.get`` per user; a batch holding an
    unknown user (a ``KeyError``) is looked up again user by user with the default."""
    count = len(users)
    if count > 1:  # (``itemgetter`` of one key gives the value itself, not a tuple)
        try:
            found = operator.itemgetter(*users)(directory)
        except KeyError:
            pass
        else:
            return np.fromiter(found, dtype=np.int64, count=count)
    return np.fromiter(map(directory.get, users, itertools.repeat(-1)), dtype=np.int64, count=count)
