"""The decision stage of a sharded stream (``operators.user_shards``): one per stream.

It collects each close's counts from every shard (``ShardSlots``), adds them per requirement
group, and steps the stream's mechanisms through each closed slot with the shared runner
(``Runner.step_with``) over the port its trust mode builds from them (``Ports.grouped``): a
``GroupedCurator`` — the class histograms the one-shard operator's ``SimulatedCurator`` counts
user by user, as the same integers — or ``CountedClients``, the simulated devices answering
from the bins' totals with the one-shard randomness. Ledgers, the population accountant,
halts, releases and metrics are the one-shard operator's.

A close is stepped once every shard has sent it, in the order of the closes (every shard sends
the same closes in order, so a complete close has every earlier one complete too). The stream's
first slot is ``SlotClock.first_slot``'s: the oldest slot any shard held at the first close
with reports, but no earlier than ``target − max_clock_jump + 1``.

Guarantee: the decision sees counts per (slot, requirement, bin) only, never a user or a value;
its releases are byte-identical to the one-shard operator's for any shard count
(``tests/operators/test_user_shards.py``). State (``DecisionState``) is the stream's
``StreamState`` plus the closes still waiting for a shard, snapshotted at the same epoch as
the shards', so a restart replays both consistently.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bytewax.operators import StatefulBatchLogic
from numpy.typing import NDArray

from privstream.mechanisms.driver import failure
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import EnrolmentOrder, SlotRandomness
from privstream.operators.ingest import Windower
from privstream.operators.reasons import Notes, Output
from privstream.operators.registration import Population
from privstream.operators.runner import Runner
from privstream.operators.shard_slots import ShardPlan
from privstream.operators.slotting import show_accounts, show_notes
from privstream.operators.stream_state import (
    StreamState,
    Tally,
    check_binding,
    check_version,
    fresh_state,
)
from privstream.operators.user_shards import ShardHalt, ShardSlots

Requirement = tuple[float, float]
"""A registered requirement ``(ε_i, w_i)`` as ``requirement_pairs`` writes it."""


@dataclass
class Close:
    """One close (``start..target``) as the shards sent it so far: which shards, the oldest
    slot any of them held, and the counts per requirement, ``counts[r][t − start, j]``."""

    start: int
    lowest: int | None
    shards: set[int] = field(default_factory=set)
    counts: dict[Requirement, NDArray[np.int64]] = field(default_factory=dict)

    def add(self, part: ShardSlots) -> None:
        if part.start != self.start:
            raise IncompatibleState(
                f"shard {part.shard} of stream {part.stream!r} closed {part.start}..{part.target}"
                f", the others {self.start}..{part.target}: the shards' clocks disagree"
            )
        if part.shard in self.shards:
            return
        self.shards.add(part.shard)
        if part.lowest is not None:
            self.lowest = part.lowest if self.lowest is None else min(self.lowest, part.lowest)
        for g, row in enumerate(part.groups.tolist()):
            key = (float(row[0]), float(row[1]))
            found = self.counts.get(key)
            mine = part.counts[:, g, :]
            self.counts[key] = mine.copy() if found is None else found + mine


@dataclass
class DecisionState:
    """A sharded stream's decision state: the stream's ledgers and accounts, and the closes
    still waiting for a shard (by target)."""

    stream: StreamState
    waiting: dict[int, Close] = field(default_factory=dict)
    enrolled: dict[int, int] = field(default_factory=dict)
    """Each shard's seated users at its last close (the population gauge)."""


class DecisionLogic(StatefulBatchLogic[Any, Output, DecisionState]):
    """The decision of one sharded stream (module docstring)."""

    def __init__(self, step_id: str, plan: ShardPlan, resume: DecisionState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        base = plan.plan
        self.mechanisms = base.mechanisms
        self.population = Population(
            base.population, base.task, base.ports, EnrolmentOrder.of(base.key), base.config
        )
        self.runner = Runner(
            step_id, base, self.population,
            Windower(base.config, base.task, self.population, base.carry),
        )  # fmt: skip
        self.state = resume
        if resume is not None:
            self._check(resume.stream)

    def _check(self, resume: StreamState) -> None:
        check_version(self.step_id, resume, self.mechanisms)
        check_binding(self.step_id, resume, self.plan.binding())
        for name, mechanism in self.mechanisms.items():
            mechanism.check_state(resume.mechanisms[name])
            resume.tallies.setdefault(name, Tally())

    def on_batch(self, values: list[Any]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        notes = Notes()
        for message in values:
            state = self._state_for(message.stream)
            stream = state.stream
            if isinstance(message, ShardHalt):
                self._halt_all(stream, message.reason, out)
                continue
            if stream.all_halted():
                continue
            close = state.waiting.get(message.target)
            if close is None:
                close = state.waiting[message.target] = Close(message.start, message.lowest)
            state.enrolled[message.shard] = message.enrolled
            try:
                close.add(message)
                self._step_complete(state, out, notes)
            except Exception as exc:  # a broken stream halts; the process serves the others
                self._halt_all(stream, f"deciding failed: {failure(exc)}", out)
        show_notes(notes, self.mechanisms)
        if self.state is not None:
            enrolled = sum(self.state.enrolled.values())
            show_accounts(self.state.stream, (enrolled, self.plan.plan.population),
                          self.mechanisms, self.plan.plan.population)  # fmt: skip
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> DecisionState:
        assert self.state is not None, "snapshot before the first close"
        return copy.deepcopy(self.state)

    def _state_for(self, stream: str) -> DecisionState:
        if self.state is None:
            state = fresh_state(stream, self.mechanisms, self.population.blank(),
                                self.plan.binding(), self.plan.plan.split.evaluation)  # fmt: skip
            if self.plan.plan.ports.fixed_population:
                self.population.register(state, self.plan.registration)
            self.state = DecisionState(state)
        return self.state

    def _step_complete(self, state: DecisionState, out: list[Output], notes: Notes) -> None:
        """Step every close all shards have sent, oldest first."""
        while state.waiting:
            target = min(state.waiting)
            close = state.waiting[target]
            if len(close.shards) < self.plan.shards:
                return
            del state.waiting[target]
            self._close(state.stream, target, close, out, notes)

    def _close(
        self, stream: StreamState, target: int, close: Close, out: list[Output], notes: Notes
    ) -> None:
        """Release the slots of ``close`` from the stream's next slot through ``target``."""
        if stream.last_closed is None:
            if close.lowest is None:  # nothing held anywhere: the stream has not started
                return
            start = max(close.lowest, target - self.plan.plan.config.max_clock_jump + 1)
        else:
            start = stream.last_closed + 1
        if start > target:
            return
        if start < close.start:
            raise IncompatibleState(f"slot {start} was closed before its counts were taken")
        for slot in range(start, target + 1):
            if stream.all_halted():
                break
            self.runner.step_with(stream, slot, self._port(stream, close, slot), out, notes)
        notes.clocks.append((stream.stream, stream.last_closed, target - start + 1))

    def _port(
        self, stream: StreamState, close: Close, slot: int
    ) -> Callable[[SlotRandomness, Any], Any]:
        """The slot's port (``Ports.grouped``) over the counts every shard sent."""
        keys = sorted(close.counts)
        at = slot - close.start
        counts = np.zeros((len(keys), self.plan.plan.task.d), dtype=np.int64)
        for row, key in enumerate(keys):
            counts[row] = close.counts[key][at]
        trust = self.plan.plan.ports
        return lambda randomness, clients: trust.grouped(stream, keys, counts, randomness)

    def _halt_all(self, stream: StreamState, reason: str, out: list[Output]) -> None:
        """Halt every live mechanism of the stream at its next slot."""
        slot = -1 if stream.last_closed is None else stream.last_closed + 1
        for name in self.mechanisms:
            if name not in stream.halted:
                self.runner.halt(stream, name, slot, reason, False, out)
        if self.state is not None:
            self.state.waiting.clear()
