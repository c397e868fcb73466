"""One user shard of a stream (``operators.user_shards``): the slotted operator's per-user work.

A shard is the slotted operator (``operators.slotting``) without its mechanisms: the same slot
clock (``SlotClock``), windower (``Windower``: reason codes, de-duplication, the registration
lookup, carrying values forward) and population (``Population``: the shard's part of the
registration table), over a ``StreamState`` of its own users. When the markers close slots, it
counts each closed slot's current values per requirement group and bin and hands the counts
to the stream's decision (``ShardSlots``) instead of stepping mechanisms.

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
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from bytewax.operators import StatefulBatchLogic
from numpy.typing import NDArray

from privstream.mechanisms.client import absent_mask
from privstream.mechanisms.driver import failure
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import EnrolmentOrder
from privstream.operators.clock import SlotClock
from privstream.operators.ingest import Windower
from privstream.operators.ports import TrustedCurator
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
from privstream.schema.events import STREAM_HALTED, EventBatch

log = logging.getLogger(__name__)

HALTED: str = "shard"
"""The key of a shard's halt reason in its state's ``halted``."""


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
        trust = self.plan.ports
        assert isinstance(trust, TrustedCurator)
        return trust.preferences

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
        self.trust = TrustedCurator(base.task, plan.table(shard))
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


class ShardLogic(StatefulBatchLogic[ShardPiece, Output, StreamState]):
    """The logic of one user shard (module docstring)."""

    def __init__(self, step_id: str, plan: ShardPlan, resume: StreamState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        base = plan.plan
        self.cfg = base.config
        self.clock = SlotClock(base.config, base.key.clock_key())
        self.state = resume
        self.parts: _Parts | None = None
        if resume is not None:
            shard = int(resume.binding.get("shard", "-1"))
            check_binding(step_id, resume, plan.binding(shard))
            self.parts = _Parts(plan, shard, resume.current.shape[0])
            self.parts.population.withdraw(resume, step_id)

    def on_batch(self, values: list[ShardPiece]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        notes = Notes()
        for piece in values:
            state, parts = self._state_for(piece)
            batch = piece.batch
            if state.halted:
                detail = "; ".join(state.halted.values())
                out.extend(parts.windower.reject_all(batch, STREAM_HALTED, detail))
                continue
            try:
                self._take(state, parts, batch, out, notes)
            except Exception as exc:  # a broken shard halts its stream; the process goes on
                reason = f"user shard {parts.shard} failed: {failure(exc)}"
                state.halted[HALTED] = reason
                log.error("step %s: stream %r: %s", self.step_id, state.stream, reason)
                out.append(("share", ShardHalt(state.stream, parts.shard, reason)))
                out.extend(parts.windower.reject_all(batch, STREAM_HALTED, reason))
        show_notes(notes, self.plan.plan.mechanisms)
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> StreamState:
        assert self.state is not None, "snapshot before the first piece"
        return copy.deepcopy(self.state)

    def _state_for(self, piece: ShardPiece) -> tuple[StreamState, _Parts]:
        if piece.shards != self.plan.shards:
            raise IncompatibleState(
                f"step {self.step_id!r}: a piece cut for {piece.shards} shards reached an "
                f"operator of {self.plan.shards}"
            )
        if self.state is None:
            table = self.plan.table(piece.shard)
            self.parts = _Parts(self.plan, piece.shard, len(table.by_user))
            self.state = StreamState(
                stream=piece.batch.stream, mechanisms={},
                current=self.parts.population.blank(), binding=self.plan.binding(piece.shard),
            )  # fmt: skip
            self.parts.population.register(self.state, table)
        assert self.parts is not None
        return self.state, self.parts

    def _take(
        self,
        state: StreamState,
        parts: _Parts,
        batch: EventBatch,
        out: list[Output],
        notes: Notes,
    ) -> None:
        """Ingest one piece and hand on the counts of every slot its marker closes; only
        shard 0 reports the clock's refusals (every shard sees the same markers)."""
        marks = self.clock.watermarks(state, batch.partition)
        out.extend(("dead_letter", d) for d in parts.windower.ingest(state, batch, notes))
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
        counts = np.stack(
            [self._counts(state, parts, slot, of_user, groups.shape[0])
             for slot in range(start, target + 1)]
        )  # fmt: skip
        state.last_closed = target
        out.append(("share", ShardSlots(state.stream, parts.shard, self.plan.shards, start,
                                        target, lowest, groups, counts)))  # fmt: skip

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
