"""One user shard of a stream (``operators.user_shards``): the slotted operator's per-user work.

A shard is the slotted operator (``operators.slotting``) without its mechanisms: the same slot
clock (``SlotClock``), windower (``Windower``: reason codes, de-duplication, the registration
lookup, carrying values forward) and population (``Population``: the shard's part of the
registration table), over a ``StreamState`` of its own users. When the markers close slots, it
counts each closed slot's current values per requirement group and bin and hands the counts
to the stream's decision (``ShardSlots``) instead of stepping mechanisms.

A shard holds the rows of its pieces until the next marker (or ``HOLD_ROWS`` rows) and then
ingests them as one batch per partition and run of like pieces: a shard gets a ``k``-th of
each poll, and the ingest's fixed cost per call would otherwise be paid ``k`` times per poll.
On the markers clock rows never move the clock, and each partition's rows keep their order, so
the verdicts after the first marker are the ones of ingesting piece by piece; held rows are
part of the snapshot.

Every shard sees every end-of-slot marker of every partition in that partition's order
(``ShardCut``), so all of them close the same slots; shard 0 alone reports what the clock
refused (a forged or far-future marker is one dead letter, not ``k``). A shard starts at its
first close whether or not it holds a report then, and drops what it holds before
``target − max_clock_jump + 1`` as the one-shard operator does; the decision, which sees the
oldest slot every shard held, picks the stream's first slot as ``SlotClock.first_slot`` does.

Guarantee: what leaves a shard is dead letters of its own rows (as the one-shard operator
writes them) and integer counts — never a user id or a value. An exception halts the shard
(``ShardHalt``: the decision halts the stream's mechanisms) and its later rows become
``stream_halted`` dead letters; the process serves the other shards and streams.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from bytewax.operators import StatefulBatchLogic
from numpy.typing import NDArray

from privstream.mechanisms.client import absent_mask
from privstream.mechanisms.driver import failure
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import EnrolmentOrder
from privstream.operators.clock import SlotClock
from privstream.operators.ingest import Windower
from privstream.operators.reasons import Notes, Output
from privstream.operators.registration import Population, Preferences
from privstream.operators.slotting import SlottedPlan, show_notes
from privstream.operators.stream_state import StreamState, check_binding
from privstream.operators.user_shards import (
    ShardHalt,
    ShardPiece,
    ShardSlots,
    requirement_pairs,
    shard_tables,
)
from privstream.schema.events import STREAM_HALTED, EventBatch, concat, mergeable

log = logging.getLogger(__name__)

HALTED: str = "shard"
"""The key of a shard's halt reason in its state's ``halted``."""
HOLD_ROWS: Final = 8192
"""Rows a shard holds before it ingests them without waiting for the next marker."""


@dataclass
class ShardPlan:
    """What every shard and the decision of one sharded operator run: the stream's plan (its
    registration is the whole table) and the number of shards."""

    plan: SlottedPlan
    shards: int
    _tables: list[Preferences] = field(default_factory=list, repr=False)

    def binding(self, shard: int | None = None) -> dict[str, str]:
        """The plan's binding with the shard count (and the shard): a store written with
        another count is refused, since each user's shard would change."""
        out = {**self.plan.binding(), "user shards": str(self.shards)}
        if shard is not None:
            out["shard"] = str(shard)
        return out

    @property
    def registration(self) -> Preferences:
        table = self.plan.ports.table
        assert table is not None, "check_shardable refuses a stream without a table"
        return table

    def table(self, shard: int) -> Preferences:
        """Shard ``shard``'s part of the registration table (cut once per process)."""
        if not self._tables:
            self._tables = shard_tables(self.registration, self.shards)
        return self._tables[shard]


class _Parts:
    """A shard's population and windower over its part of the registration."""

    def __init__(self, plan: ShardPlan, shard: int, n: int) -> None:
        self.shard = shard
        base = plan.plan
        self.trust = base.ports.part(plan.table(shard))
        self.population = Population(
            n, base.task, self.trust, EnrolmentOrder.of(base.key), base.config
        )
        self.windower = Windower(
            base.config, base.task, self.population, base.carry, base.population
        )
        self._groups: tuple[int, NDArray[np.float64], NDArray[np.intp]] | None = None

    def groups(self, state: StreamState) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
        """The distinct requirements of the shard's users and each user's (the registration
        is fixed at start, so once per process)."""
        n = state.current.shape[0]
        if self._groups is None or self._groups[0] != n:
            pairs = requirement_pairs(state.epsilons, state.windows, n)
            groups, of_user = np.unique(pairs, axis=0, return_inverse=True)
            self._groups = (n, groups, np.asarray(of_user, dtype=np.intp).reshape(-1))
        return self._groups[1], self._groups[2]


@dataclass
class ShardState:
    """A shard's snapshot: its slotting state, and the rows it holds until the next marker
    (or ``HOLD_ROWS`` of them), in their order of arrival."""

    stream: StreamState
    held: list[EventBatch] = field(default_factory=list)
    rows: int = 0


class ShardLogic(StatefulBatchLogic[ShardPiece, Output, ShardState]):
    """The logic of one user shard (module docstring)."""

    def __init__(self, step_id: str, plan: ShardPlan, resume: ShardState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        base = plan.plan
        self.cfg = base.config
        self.clock = SlotClock(base.config, base.key.clock_key())
        self.state = resume
        self.parts: _Parts | None = None
        if resume is not None:
            stream = resume.stream
            shard = int(stream.binding.get("shard", "-1"))
            check_binding(step_id, stream, plan.binding(shard))
            self.parts = _Parts(plan, shard, stream.current.shape[0])
            self.parts.population.withdraw(stream, step_id)

    def on_batch(self, values: list[ShardPiece]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        notes = Notes()
        for piece in values:
            shard, parts = self._state_for(piece)
            batch = piece.batch
            if shard.stream.halted:
                detail = "; ".join(shard.stream.halted.values())
                out.extend(parts.windower.reject_all(batch, STREAM_HALTED, detail))
                continue
            marker = batch.complete_through is not None
            if len(batch):
                shard.held.append(
                    dataclasses.replace(batch, complete_through=None, marker_tag=None)
                    if marker
                    else batch
                )
                shard.rows += len(batch)
            try:
                if marker or shard.rows >= HOLD_ROWS:
                    self._ingest_held(shard, parts, out, notes)
                if marker:
                    self._mark(shard.stream, parts, batch, out, notes)
            except Exception as exc:  # a broken shard halts its stream; the process goes on
                self._halt(shard, parts, failure(exc), out)
        show_notes(notes, self.plan.plan.mechanisms)
        return out, StatefulBatchLogic.RETAIN

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        """A bounded input ended: ingest what is held (its dead letters go out now)."""
        out: list[Output] = []
        if self.state is not None and self.parts is not None and not self.state.stream.halted:
            notes = Notes()
            try:
                self._ingest_held(self.state, self.parts, out, notes)
            except Exception as exc:
                self._halt(self.state, self.parts, failure(exc), out)
            show_notes(notes, self.plan.plan.mechanisms)
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> ShardState:
        assert self.state is not None, "snapshot before the first piece"
        return copy.deepcopy(self.state)

    def _state_for(self, piece: ShardPiece) -> tuple[ShardState, _Parts]:
        if piece.shards != self.plan.shards:
            raise IncompatibleState(
                f"step {self.step_id!r}: a piece cut for {piece.shards} shards reached an "
                f"operator of {self.plan.shards}"
            )
        if self.state is None:
            table = self.plan.table(piece.shard)
            self.parts = _Parts(self.plan, piece.shard, len(table.by_user))
            stream = StreamState(
                stream=piece.batch.stream, mechanisms={},
                current=self.parts.population.blank(), binding=self.plan.binding(piece.shard),
            )  # fmt: skip
            if self.parts.trust.fixed_population:
                self.parts.population.register(stream, table)
            self.state = ShardState(stream)
        assert self.parts is not None
        return self.state, self.parts

    def _halt(self, shard: ShardState, parts: _Parts, why: str, out: list[Output]) -> None:
        """Halt the shard (and through the decision its stream): what it holds becomes
        ``stream_halted`` dead letters, its later rows too."""
        state = shard.stream
        reason = f"user shard {parts.shard} failed: {why}"
        state.halted[HALTED] = reason
        log.error("step %s: stream %r: %s", self.step_id, state.stream, reason)
        out.append(("share", ShardHalt(state.stream, parts.shard, reason)))
        for batch in shard.held:
            out.extend(parts.windower.reject_all(batch, STREAM_HALTED, reason))
        shard.held, shard.rows = [], 0

    def _ingest_held(
        self, shard: ShardState, parts: _Parts, out: list[Output], notes: Notes
    ) -> None:
        """Ingest the held rows, one batch per partition and run of like pieces (each
        partition's rows in their order; on the markers clock rows never move the clock, so
        holding them until the next marker changes no verdict after the first marker)."""
        shard.held, shard.rows = _runs(shard.held), 0
        state = shard.stream
        while shard.held:
            batch = shard.held[0]
            self.clock.watermarks(state, batch.partition)
            out.extend(("dead_letter", d) for d in parts.windower.ingest(state, batch, notes))
            shard.held.pop(0)

    def _mark(
        self,
        state: StreamState,
        parts: _Parts,
        batch: EventBatch,
        out: list[Output],
        notes: Notes,
    ) -> None:
        """Take a piece's end-of-slot marker and hand on the counts of every slot it closes;
        only shard 0 reports the clock's refusals (every shard sees the same markers)."""
        marks = self.clock.watermarks(state, batch.partition)
        clock_out: list[Output] = []
        clock_notes = notes if parts.shard == 0 else Notes()
        targets = self.clock.targets(state, batch, marks, clock_out, clock_notes)
        if parts.shard == 0:
            out.extend(clock_out)
        for target in targets:
            self._close_through(state, parts, target, out)

    def _close_through(
        self, state: StreamState, parts: _Parts, target: int, out: list[Output]
    ) -> None:
        """Count every slot up to ``target`` not counted yet and hand the counts on."""
        buffered = state.open_slots.keys() | state.newcomers.keys()
        lowest = min(buffered) if buffered else None
        if state.last_closed is None:
            start = target - self.cfg.max_clock_jump + 1
            out.extend(("dead_letter", d) for d in parts.windower.drop_before(state, start))
        else:
            start = state.last_closed + 1
        if start > target:
            return
        groups, of_user = parts.groups(state)
        per_slot = []
        for slot in range(start, target + 1):
            parts.population.admit_newcomers(state, slot, out)  # an LDP closed population's
            per_slot.append(self._counts(state, parts, slot, of_user, groups.shape[0]))
        counts = np.stack(per_slot)
        state.last_closed = target
        out.append(("share", ShardSlots(state.stream, parts.shard, self.plan.shards, start,
                                        target, lowest, groups, counts,
                                        len(state.directory))))  # fmt: skip

    def _counts(
        self, state: StreamState, parts: _Parts, slot: int, of_user: NDArray[np.intp], g: int
    ) -> NDArray[np.int64]:
        """The shard's users' current values at ``slot`` counted per (group, bin)."""
        values = parts.windower.slot_values(state, slot)
        task = self.plan.plan.task
        keep = ~absent_mask(values)
        bins = np.asarray(task.encode(values[keep]), dtype=np.int64)
        flat = np.bincount(of_user[keep] * task.d + bins, minlength=g * task.d)
        return flat.reshape(g, task.d)


def _runs(held: list[EventBatch]) -> list[EventBatch]:
    """``held`` as few batches as keep every partition's order: by partition (in order of
    first arrival), consecutive ``mergeable`` pieces joined."""
    by_partition: dict[int, list[EventBatch]] = {}
    for batch in held:
        by_partition.setdefault(batch.partition, []).append(batch)
    runs: list[EventBatch] = []
    for batches in by_partition.values():
        current = [batches[0]]
        for batch in batches[1:]:
            if mergeable(current[-1], batch):
                current.append(batch)
            else:
                runs.append(concat(current))
                current = [batch]
        runs.append(concat(current))
    return runs
