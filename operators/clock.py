"""The slot clock of the slotted operator (design §5): what closes a stream's slots.

Two clocks (``SlottingConfig.clock``): ``data`` (bounded trusted inputs) closes when the
watermark (max event slot minus the allowed lateness) passes a slot, when a batch marks it
complete, or at end of input; ``markers`` (Kafka runs, where anyone writing to the input topic
is an adversary) closes only on end-of-slot markers authenticated with the clock key, at most
``max_clock_jump`` slots per marker. Each input partition keeps its own watermark
(``operators.watermark``); a slot closes once every partition has passed it. The clock decides
*which* slots close; the windower buffers them and the runner steps them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from privstream.mechanisms.client import ClientPath
from privstream.operators.reasons import Notes, Output
from privstream.operators.stream_state import StreamState
from privstream.operators.watermark import PartitionWatermarks
from privstream.schema.events import (
    FAR_FUTURE,
    UNAUTHENTICATED_MARKER,
    DeadLetter,
    EventBatch,
    marker_authentic,
)

MissingPolicy = Literal["carry_forward", "absent"]
ClockMode = Literal["data", "markers"]
DATA_SLOT_GAP = 10_000
MARKERS_SLOT_GAP = 64
"""Slots an event may run ahead of the authenticated clock: an honest producer writes a slot's
events shortly before its marker, and every open slot buffers ``n × d`` floats."""


@dataclass(frozen=True)
class SlottingConfig:
    """How events become slots.

    Attributes:
        lateness: slots a slot stays open after a later slot is seen (``≥ 0``; default 1).
        max_slot_gap: the largest jump ahead of the newest slot (``data`` clock) or of the last
            closed slot (``markers`` clock) an event may make; further events are
            ``far_future_slot`` dead letters (guards against a corrupt slot forcing millions of
            empty steps, and bounds the buffered open slots). 0 (default) takes the clock's
            default: 10,000 for ``data``, ``MARKERS_SLOT_GAP`` (64) for ``markers``.
        missing: ``carry_forward`` (default) or ``absent`` (spec §6.2).
        client_path: ``aggregate`` (fast path, default) or ``per-user`` (design §4).
        close_on_eof: release the still-open slots when a bounded input ends (default True;
            never with the ``markers`` clock, which only markers advance).
        partitions: input partitions feeding the streams (``≥ 1``; default 1). With several, a
            slot closes only once every partition has passed it (``operators.watermark``).
        clock: what closes slots. ``data`` (default; bounded trusted inputs: files, synthetic,
            in-process): the events' own slots (newest − lateness) and any end-of-slot marker.
            ``markers`` (Kafka runs): only end-of-slot markers authenticated with the clock key
            (``NoiseKey.clock_key``); events never advance the clock, an unauthenticated marker
            is an ``unauthenticated_marker`` dead letter.
        max_clock_jump: with the ``markers`` clock, the most slots one marker may advance a
            partition's clock (``≥ 1``; default 1: ``privstream clock`` and ``produce`` write
            one marker per slot); a marker jumping further is a ``far_future_slot`` dead letter
            and closes nothing.
        carry_slots: with ``carry_forward``, how many slots after the slot it was reported in a
            value is still read (``≥ 0``); after that the user is absent until they report
            again. None (default): ``w − 1`` of the user's window (the smallest window of the
            stream's mechanisms, or the user's own ``w_i``), so one report feeds at most ``w``
            consecutive slots — at most ε over its lifetime.
        released: each stream's last slot already on the release topic when this run started
            (read only when a resume withdraws users): a withdrawal starts after it, so the
            replay of published slots after a crash recomputes them as they were published
            (not part of the binding).
        grow_partitions: accept a resume whose input topic has more partitions than the
            recovery store was written for (``--grow-partitions``, ``kafka.grow_partitions``):
            the new partitions start at each stream's clock (its last released slot), so
            nothing released reopens and every budget is kept. Without it such a resume is
            refused, naming this option; fewer partitions are always refused. Not part of the
            binding: the grown count is recorded in the store at the resume.
    """

    lateness: int = 1
    max_slot_gap: int = 0
    missing: MissingPolicy = "carry_forward"
    client_path: ClientPath = "aggregate"
    close_on_eof: bool = True
    partitions: int = 1
    clock: ClockMode = "data"
    max_clock_jump: int = 1
    carry_slots: int | None = None
    grow_partitions: bool = False
    released: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.clock not in ("data", "markers"):
            raise ValueError(f"clock must be 'data' or 'markers', got {self.clock!r}")
        if self.max_slot_gap == 0:
            default = DATA_SLOT_GAP if self.clock == "data" else MARKERS_SLOT_GAP
            object.__setattr__(self, "max_slot_gap", default)
        if not isinstance(self.lateness, int) or self.lateness < 0:
            raise ValueError(f"lateness must be an integer >= 0, got {self.lateness!r}")
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if not isinstance(self.max_slot_gap, int) or self.max_slot_gap < 1:
            raise ValueError(f"max_slot_gap must be an integer >= 1, got {self.max_slot_gap!r}")
        if not isinstance(self.max_clock_jump, int) or self.max_clock_jump < 1:
            raise ValueError(f"max_clock_jump must be an integer >= 1, got {self.max_clock_jump!r}")
        if self.carry_slots is not None and (
            not isinstance(self.carry_slots, int) or self.carry_slots < 0
        ):
            raise ValueError(f"carry_slots must be an integer >= 0, got {self.carry_slots!r}")
        if self.missing not in ("carry_forward", "absent"):
            raise ValueError(f"missing must be 'carry_forward' or 'absent', got {self.missing!r}")
        if self.client_path not in ("aggregate", "per-user"):
            raise ValueError(
                f"client_path must be 'aggregate' or 'per-user', got {self.client_path!r}"
            )


class SlotClock:
    """The clock of one operator's streams: authenticated markers and per-partition
    watermarks decide the slots that may close (``targets``) and a stream's first slot."""

    def __init__(self, cfg: SlottingConfig, clock_key: bytes) -> None:
        self.cfg = cfg
        self.clock_key = clock_key

    def targets(
        self,
        state: StreamState,
        batch: EventBatch,
        marks: PartitionWatermarks,
        out: list[Output],
        notes: Notes,
    ) -> list[int]:
        """The slots the stream may close through after ``batch`` (in order): with several
        partitions or the ``markers`` clock, the last slot every partition passed; with one
        partition of the ``data`` clock, the newest slot minus the lateness, then the batch's
        marker."""
        marker = self.marker(state, batch, marks, out, notes)
        if marker is not None:
            marks.mark(batch.partition, marker)
        markers = self.cfg.clock == "markers"
        if self.cfg.partitions > 1 or markers:  # a slot closes once every partition passed it
            target = marks.closable(self.cfg.lateness, data=not markers)
            return [] if target is None else [target]
        found = []
        if state.max_seen is not None:  # one partition: its order is the stream's order
            found.append(state.max_seen - self.cfg.lateness - 1)
        if marker is not None:
            found.append(marker)
        return found

    def marker(
        self,
        state: StreamState,
        batch: EventBatch,
        marks: PartitionWatermarks,
        out: list[Output],
        notes: Notes,
    ) -> int | None:
        """The batch's end-of-slot marker if it may close slots: markers obey the events' gap
        limit (a far-future one is a ``far_future_slot`` dead letter: it would step millions of
        empty slots), and one for an already released slot or before any event is counted.
        With the ``markers`` clock, ``_clock_marker`` decides instead. Ignored markers are
        counted on ``notes``."""
        t = batch.complete_through
        if t is None:
            return None
        if self.cfg.clock == "markers":
            return self._clock_marker(state, batch, t, marks.marks[batch.partition], out, notes)
        if state.max_seen is None:
            notes.ignored(state.stream, "before_any_event")
            return None
        if t > state.max_seen + self.cfg.max_slot_gap:
            notes.ignored(state.stream, "far_future")
            detail = (
                f"end-of-slot marker more than {self.cfg.max_slot_gap} slots ahead of the stream"
            )
            out.append(("dead_letter", _marker_letter(FAR_FUTURE, state.stream, t, detail)))
            return None
        if state.last_closed is not None and t <= state.last_closed:
            notes.ignored(state.stream, "already_released")
        return t

    def _clock_marker(
        self,
        state: StreamState,
        batch: EventBatch,
        t: int,
        previous: int | None,
        out: list[Output],
        notes: Notes,
    ) -> int | None:
        """A marker of the ``markers`` clock, if it may advance its partition's clock.

        Guarantee: only a marker whose tag the clock key verifies counts (else an
        ``unauthenticated_marker`` dead letter), and it advances the partition's clock by at
        most ``max_clock_jump`` slots (else a ``far_future_slot`` dead letter); either closes
        nothing. So the slots closed are bounded by the authenticated markers written, whatever
        anyone else writes to the input topic."""
        stream = state.stream
        if not marker_authentic(self.clock_key, stream, t, batch.marker_tag):
            notes.ignored(stream, "unauthenticated")
            detail = "end-of-slot marker without a valid tag of the clock key: it closes nothing"
            out.append(("dead_letter", _marker_letter(UNAUTHENTICATED_MARKER, stream, t, detail)))
            return None
        if previous is None:
            previous = state.last_closed
        if previous is not None and t <= previous:
            notes.ignored(stream, "already_released")
            return None
        if previous is not None and t - previous > self.cfg.max_clock_jump:
            notes.ignored(stream, "far_future")
            detail = (
                f"end-of-slot marker advances the clock by {t - previous} slots (from {previous}),"
                f" more than max_clock_jump={self.cfg.max_clock_jump}: it closes nothing"
            )
            out.append(("dead_letter", _marker_letter(FAR_FUTURE, stream, t, detail)))
            return None
        return t

    def watermarks(self, state: StreamState, partition: int) -> PartitionWatermarks:
        """The stream's progress per input partition (made by its first batch; a snapshot of
        another partition count is refused at start by the binding)."""
        marks = state.watermarks
        if marks is None:
            marks = state.watermarks = PartitionWatermarks(self.cfg.partitions)
        marks.check(partition)
        return marks

    def first_slot(self, state: StreamState, target: int) -> int | None:
        """The stream's first slot, decided by its first close through ``target`` (None while
        nothing is buffered): the oldest slot buffered, but with the ``markers`` clock at most
        ``max_clock_jump`` slots before the first authenticated marker's ``target``, and with
        the ``data`` clock not before the largest of the partitions' first slots
        (``PartitionWatermarks.start``: a function of each partition's own order)."""
        buffered = state.open_slots.keys() | state.newcomers.keys()
        if not buffered:
            return None
        start = min(buffered)
        if self.cfg.clock == "markers":
            return max(start, target - self.cfg.max_clock_jump + 1)
        first = state.watermarks.start() if state.watermarks is not None else None
        return start if first is None else max(start, first)


def _marker_letter(reason: str, stream: str, t: int, detail: str) -> DeadLetter:
    """The dead letter of a refused end-of-slot marker (its tag, if any, is not kept)."""
    text = json.dumps({"stream": stream, "end_of_slot": t}, separators=(",", ":"))
    return DeadLetter(reason, stream, text, detail)


def _partitions_in(slotting: str) -> int | None:
    """The partition count in a stored binding's ``slotting`` line (None: not recorded)."""
    for part in slotting.split():
        if part.startswith("partitions="):
            return int(part.removeprefix("partitions="))
    return None
