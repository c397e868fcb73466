"""The shuffler's state (issue 25), engine- and Kafka-free: which SaO2 tasks it serves, the
reports of every open block, and how far each report partition's clock has gone.

**What it forwards.** A block of level ``h`` of a task closes when every partition of the report
topic has delivered the authenticated end-of-slot marker of the block's last slot (never on wall
time). Its batch is a function of the reports' multiset only: the count vectors ``c₊, c₋`` of the
symbols (spec sao2 §10.4: the server needs nothing else), the batch size ``n`` (distinct devices),
the minimum ``n_min`` and the policy applied. Device ids, Kafka keys, headers, partitions, offsets
and arrival times never leave the shuffler.

**Deterministic.** A batch does not depend on how polls interleave the partitions: a report
counts only if it precedes its block's marker on its own partition, and a device that sent two
different reports for one block is left out of it (identical copies count once), so a shuffler
restarted from an older snapshot re-forms byte-identical batches.

**Smaller than n_min.** ``drop`` forwards the manifest with no counts (the server learns only
that the block had ``n < n_min`` reports); ``below_min`` forwards the counts with the policy
named, for an operator who accepts weaker amplification. Either is counted and alerted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from privstream.mechanisms.sao2 import min_batch
from privstream.schema.shuffle import Batch, Sao2Report, Sao2Task, counts_of

SHUFFLER_POLICIES: Final = ("drop", "below_min")
BlockKey = tuple[str, int, int, int]
"""(stream, horizon, level, block)."""


@dataclass
class Kept:
    """The reports of one block (or one ``ldp-reports`` request) so far: each device's first
    copy, and the devices that sent two different ones — left out, so a batch never depends on
    which copy a poll brought first (identical copies count once)."""

    values: dict[str, Any] = field(default_factory=dict)
    conflicted: set[str] = field(default_factory=set)

    def keep(self, device: str, value: Any) -> str | None:
        """Keep ``device``'s ``value``; ``duplicate_report`` when it differs from its first."""
        if self.values.setdefault(device, value) != value:
            self.conflicted.add(device)
            return "duplicate_report"
        return None

    def accepted(self) -> list[tuple[str, Any]]:
        """Every device's value but the conflicted devices'."""
        return [(d, v) for d, v in self.values.items() if d not in self.conflicted]


def applied(n: int, n_min: int, policy: str) -> str:
    """The manifest's policy of a batch of ``n`` reports: ``forward``, else the configured one."""
    return "forward" if n >= n_min else policy


@dataclass
class ShuffleBook:
    """Everything a restart needs (pickled into the shuffler's own store)."""

    shuffler: str
    partitions: int
    policy: str = "drop"
    delta: float = 1e-5
    n_min: int | None = None
    tasks: dict[str, Sao2Task] = field(default_factory=dict)
    open: dict[BlockKey, Kept] = field(default_factory=dict)
    clock: dict[tuple[str, int], int] = field(default_factory=dict)
    """(stream, partition) → the last slot whose authenticated marker that partition delivered."""
    closed: dict[str, int] = field(default_factory=dict)
    """stream → the last slot whose blocks were forwarded (the minimum over the partitions)."""

    def __post_init__(self) -> None:
        if self.policy not in SHUFFLER_POLICIES:
            raise ValueError(f"policy must be one of {SHUFFLER_POLICIES}, got {self.policy!r}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")

    def add_task(self, task: Sao2Task) -> None:
        self.tasks[task.id] = task

    def minimum(self, task: Sao2Task) -> int:
        """``n_min`` of ``task``: the configured one, else ``⌈16 e^ε log(4/δ)⌉`` (spec §10.4)."""
        return self.n_min if self.n_min is not None else min_batch(task.epsilon, self.delta)

    def take_report(self, partition: int, report: Sao2Report) -> str | None:
        """Keep ``report`` for its block, or say why not (a dead-letter reason)."""
        task = self.tasks.get(report.task)
        if task is None:
            return "unknown_task"
        why = report.fits(task)
        if why is not None:
            return why
        end = task.block_end(report.level, report.block)
        if end <= self.clock.get((report.stream, partition), 0) or end <= self.closed.get(
            report.stream, 0
        ):
            return "late_report"
        key = (report.stream, report.horizon, report.level, report.block)
        return self.open.setdefault(key, Kept()).keep(report.device, report.symbols)

    def take_marker(self, partition: int, stream: str, slot: int) -> list[Batch]:
        """An authenticated end-of-slot marker of ``stream`` on ``partition``: the batches of
        every block that now ended on all partitions, in (slot, level) order."""
        key = (stream, partition)
        self.clock[key] = max(self.clock.get(key, 0), slot)
        through = min(self.clock.get((stream, p), 0) for p in range(self.partitions))
        done = self.closed.get(stream, 0)
        if through <= done:
            return []
        self.closed[stream] = through
        return [
            self._close(task, level, block)
            for task in sorted(self.tasks.values(), key=lambda t: t.first_slot)
            if task.stream == stream
            for slot_ in range(done + 1, through + 1)
            for level, block in task.ending(slot_)
        ]

    def _close(self, task: Sao2Task, level: int, block: int) -> Batch:
        found = self.open.pop((task.stream, task.horizon, level, block), Kept())
        reports = [Sao2Report(task.id, task.stream, task.horizon, level, block, device, symbols)
                   for device, symbols in found.accepted()]  # fmt: skip
        n, n_min = len(reports), self.minimum(task)
        policy = applied(n, n_min, self.policy)
        plus, minus = counts_of(reports, task.d) if policy != "drop" else (None, None)
        return Batch(task.id, task.stream, task.horizon, level, block,
                     task.block_end(level, block), n, n_min, policy, plus, minus,
                     self.shuffler)  # fmt: skip
