"""Per-input-partition progress of one stream: when may the stream's slots close?

A stream whose events come from several input partitions (Kafka partitions) sees them in an
order that depends on how the partitions' polls interleave. Closing a slot on the stream-wide
maximum would let that interleaving decide which events make it into the slot, so a replay
after a crash could release different contents. As in Flink and Beam, each partition keeps its
own watermark, and the stream's watermark is the minimum over all partitions:

* a partition has *passed* slot ``t`` when its data watermark (the largest slot of its usable
  events — right id kind, in the domain, neither late nor far in the future — minus the lateness
  minus 1) or its latest end-of-slot marker is ``>= t``;
* a slot closes once every partition ``0..P−1`` has passed it (``closable``);
* an event from a partition is late once *that partition* has passed its slot (``passed``),
  whatever the others did — a function of the partition's own order only.

Both are functions of each partition's own order, which a replay reproduces, so the contents of
every slot no longer depend on the interleaving. A partition that has delivered nothing for the
stream holds the stream back: producers either spread a stream over all partitions or write its
end-of-slot markers to every partition (``privstream produce --spread`` does both). A bounded
input closes the rest at its end, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionWatermarks:
    """Progress of one stream per input partition (kept in the stream's snapshot).

    Attributes:
        partitions: how many input partitions feed the stream (``P >= 1``).
        max_slots: per partition, the largest slot of its usable events (None: none yet).
        marks: per partition, its largest end-of-slot marker (None: none yet).
        firsts: per partition, the smallest slot of its usable events (None: none yet). With
            the ``data`` clock a stream starts at the largest of them (``start``), so stale
            events first on one partition cannot move the start back.
    """

    partitions: int
    max_slots: list[int | None] = field(default_factory=list)
    marks: list[int | None] = field(default_factory=list)
    firsts: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if not self.max_slots:
            self.max_slots = [None] * self.partitions
        if not self.marks:
            self.marks = [None] * self.partitions
        if not self.firsts:
            self.firsts = [None] * self.partitions
        if len(self.max_slots) != self.partitions or len(self.marks) != self.partitions:
            raise ValueError(f"progress of {self.partitions} partitions expected")

    def check(self, partition: int) -> None:
        """Refuse a partition outside ``0..P−1`` (the flow was told fewer partitions)."""
        if not 0 <= partition < self.partitions:
            raise ValueError(
                f"an event batch came from input partition {partition}, but the slotting was "
                f"configured for {self.partitions} partition(s) (SlottingConfig.partitions must "
                "be the input topic's partition count)"
            )

    def observe(self, partition: int, max_slot: int, min_slot: int | None = None) -> None:
        """``partition`` delivered accepted events up to slot ``max_slot`` (from ``min_slot``)."""
        self.check(partition)
        seen = self.max_slots[partition]
        self.max_slots[partition] = max_slot if seen is None else max(seen, max_slot)
        low = max_slot if min_slot is None else min_slot
        first = self._firsts()[partition]
        self.firsts[partition] = low if first is None else min(first, low)

    def _firsts(self) -> list[int | None]:
        """``firsts``, made for a snapshot written before it existed."""
        if not getattr(self, "firsts", None):
            self.firsts = [None] * self.partitions
        return self.firsts

    def start(self) -> int | None:
        """The ``data`` clock's first slot: the largest of the partitions' first slots (None
        before any event). Each partition's first slot is a function of its own order, so the
        start does not depend on how partitions interleave; a stale event first on one
        partition is behind the others' first slots and cannot move the start back."""
        firsts = [f for f in self._firsts() if f is not None]
        return max(firsts) if firsts else None

    def grow(self, partitions: int, clock: int | None) -> None:
        """Take ``partitions`` (more than now) input partitions: the new ones start at the
        stream's clock ``clock`` (its last released slot), so nothing already released reopens
        and an event of a new partition for such a slot is late."""
        if partitions < self.partitions:
            raise ValueError(f"partitions cannot shrink ({self.partitions} → {partitions})")
        added = partitions - self.partitions
        self.max_slots = [*self.max_slots, *([None] * added)]
        self.marks = [*self.marks, *([clock] * added)]
        self.firsts = [*self._firsts(), *([None] * added)]
        self.partitions = partitions

    def only_first_delivered(self) -> bool:
        """Whether, of several partitions, partition 0 alone has delivered anything (an event
        or a marker) for the stream: the others hold it back (``closable`` stays None)."""
        if self.partitions < 2 or (self.max_slots[0] is None and self.marks[0] is None):
            return False
        return all(
            self.max_slots[p] is None and self.marks[p] is None for p in range(1, self.partitions)
        )

    def mark(self, partition: int, complete_through: int) -> None:
        """``partition`` declared every slot ``<= complete_through`` complete."""
        self.check(partition)
        seen = self.marks[partition]
        self.marks[partition] = complete_through if seen is None else max(seen, complete_through)

    def passed(self, partition: int, lateness: int, data_clock: bool = True) -> int | None:
        """The last slot ``partition`` has passed (None: it has passed none yet); without
        ``data_clock`` (the ``markers`` clock) only its markers count."""
        top, mark = self.max_slots[partition], self.marks[partition]
        data = None if top is None or not data_clock else top - lateness - 1
        if data is None or mark is None:
            return mark if data is None else data
        return max(data, mark)

    def closable(self, lateness: int, data: bool = True) -> int | None:
        """The last slot every partition has passed: the stream may close through it (None
        while some partition has passed nothing, e.g. delivered nothing for the stream).
        ``data`` False: the ``markers`` clock, where only end-of-slot markers count."""
        least: int | None = None
        for partition in range(self.partitions):
            passed = self.passed(partition, lateness, data)
            if passed is None:
                return None
            least = passed if least is None else min(least, passed)
        return least
