"""Never publish a release id twice: a new incarnation on Kafka starts after the release topic,
and no window holds the spend of two incarnations.

**Guarantee.** A release id ``stream/mechanism/slot`` is computed by one incarnation only. When a
Kafka run starts a new incarnation (a new recovery store, or none), ``last_published`` reads the
release topic (compacted, keyed by release id) from the beginning to idle — the embedded broker
misreports high watermarks, so no end offset is trusted — and finds each stream's last published
slot; ``skip_published`` then turns every event of a slot at or before it into an
``already_published`` dead letter, so the stream starts after it. A resumed store replays its
own incarnation (the same noise, the same bytes) and needs no floor.

**Cooldown** (issue 18 §2). A new store's ledgers start empty, and public ledger entries carry
no per-user state to seed them from, so a w-event window covering slots ``F−w+2 … F+1`` would
hold the old incarnation's spend and the new one's (up to 2ε; a population-division mechanism
would ask the same users twice). The new incarnation therefore releases nothing for the slots
``F+1 … F+w−1`` (``plan_gaps``: ``w`` the largest window of the stream's mechanisms and
registered classes; a period scope waits for its next period): their events are
``incarnation_cooldown`` dead letters, and each mechanism's deliberate gap is a ``Gap`` record
on the ledger output, which the audit accepts (an unrecorded gap stays a missing slot). Every
window then holds one incarnation's spend: at most ε. A guarantee over the whole stream or a
user's lifetime (CGM ``budget_scope = "stream"``) can never restart with a fresh budget over the
same population: such a new incarnation over a release topic that holds the stream's releases is
refused, unless the operator states that the population is a new one (``--new-population``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from privstream.connectors.kafka import KafkaSettings, existing_topics
from privstream.mechanisms.contract import Gap
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.guarantees import (
    ClassScope,
    Guarantee,
    LifetimeScope,
    PeriodScope,
    StreamScope,
    WindowScope,
)
from privstream.schema.events import ALREADY_PUBLISHED, INCARNATION_COOLDOWN, DeadLetter, EventBatch
from privstream.schema.keys import split_release_id

log = logging.getLogger(__name__)

IDLE_SECONDS = 3.0
"""Reading stops once no message came for this long (after the first poll)."""


def last_published(
    settings: KafkaSettings, topic: str, *, idle: float = IDLE_SECONDS, timeout: float = 600.0
) -> dict[str, int]:
    """The last slot of each stream on the release topic ``topic`` (empty when it has none);
    keys that are not release ids are skipped."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    partitions = existing_topics(settings).get(topic, 0)
    if not partitions:
        return {}
    consumer = Consumer(
        settings.client_config(
            **{"group.id": "privstream-republish", "enable.auto.commit": "false"}
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    last: dict[str, int] = {}
    start = quiet_since = time.monotonic()
    try:
        while time.monotonic() - quiet_since < idle:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"reading the release topic {topic!r} took over {timeout} s")
            for message in consumer.consume(10_000, 0.2):
                if message.error() is not None:
                    continue
                quiet_since = time.monotonic()
                _note(last, message.key())
    finally:
        consumer.close()
    return last


def _note(last: dict[str, int], key: bytes | None) -> None:
    """Count the release id ``key`` (``stream/mechanism/slot``, with any release-key parts
    after the slot: ``schema.keys.split_release_id``) in ``last``."""
    if key is None:
        return
    parsed = split_release_id(key.decode("utf-8", "replace"))
    if parsed is None:
        return
    stream, _mechanism, slot, _parts = parsed
    if slot > last.get(stream, -1):
        last[stream] = slot


def announce(floors: Mapping[str, int], streams: list[str]) -> None:
    """Log once, per stream, what a new incarnation skips and why."""
    for stream in streams:
        if stream in floors:
            log.warning(
                "stream %s: slots <= %d were published by an earlier incarnation; starting at %d "
                "(their events are already_published dead letters)",
                stream, floors[stream], floors[stream] + 1,
            )  # fmt: skip


def skip_published(
    batches: Stream[EventBatch], floors: Mapping[str, int], gaps: Sequence[Gap] = ()
) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    """``batches`` without the events of already published slots and of the cooldown ``gaps``
    (``plan_gaps``), and those events as ``already_published`` / ``incarnation_cooldown`` dead
    letters (a stream without a floor passes whole)."""
    ends = cooldown_ends(gaps)
    split = op.flat_map("skip_published", batches, lambda b: _split(b, floors, ends))
    branch = op.branch("published_or_not", split, lambda item: isinstance(item, EventBatch))
    return branch.trues, branch.falses  # type: ignore[return-value]


def cooldown_ends(gaps: Iterable[Gap]) -> dict[str, int]:
    """Each stream's last cooldown slot (the largest of its mechanisms' gaps)."""
    ends: dict[str, int] = {}
    for gap in gaps:
        ends[gap.stream] = max(gap.last, ends.get(gap.stream, gap.last))
    return ends


def _split(
    batch: EventBatch, floors: Mapping[str, int], cooldown: Mapping[str, int] | None = None
) -> list[EventBatch | DeadLetter]:
    """Split ``batch`` at its stream's floor and its cooldown's last slot (``cooldown``); a
    marker passes only past both."""
    floor = floors.get(batch.stream)
    if floor is None:
        return [batch]
    skip_to = max(floor, (cooldown or {}).get(batch.stream, floor))
    old = batch.slots <= skip_to
    if not old.any() and (batch.complete_through is None or batch.complete_through > skip_to):
        return [batch]
    published = f"slot <= {floor}, published by an earlier incarnation of this stream"
    cooling = (
        f"slot in {floor + 1}..{skip_to}, the new incarnation's cooldown: a window holds one "
        "incarnation's spend"
    )
    letters: list[EventBatch | DeadLetter] = []
    for i in np.flatnonzero(old).tolist():
        text, source = batch.row_line(i)
        reason, detail = (
            (ALREADY_PUBLISHED, published)
            if batch.slots[i] <= floor
            else (INCARNATION_COOLDOWN, cooling)
        )
        letters.append(DeadLetter.of(reason, batch.stream, text, detail, source))
    keep = np.flatnonzero(~old)
    raw = None if batch.raw is None else [batch.raw[i] for i in keep.tolist()]
    marker = batch.complete_through
    if marker is not None and marker <= skip_to:
        marker = None
    if keep.size or marker is not None:
        letters.append(batch.select(keep, raw, marker))
    return letters


# -- the cooldown of a new incarnation ---------------------------------------------------------


@dataclass(frozen=True)
class StreamPlan:
    """What a stream's mechanisms promise, as the cooldown needs it: each mechanism's name and
    declared guarantee, and the windows of the registered classes (personalized families)."""

    mechanisms: tuple[str, ...]
    guarantees: tuple[Guarantee, ...]
    class_windows: tuple[int, ...] = ()


def resume_slot(floor: int, guarantee: Guarantee, class_windows: Iterable[int] = ()) -> int | None:
    """The first slot a new incarnation may release after the published slot ``floor`` so
    that no scope of ``guarantee`` holds both incarnations' spend: ``floor + w`` for a w-event
    window (``w`` the largest class window for per-class scopes), the next period's first
    slot for a period scope (periods counted from slot 0), None for a whole-stream or lifetime
    scope (no later slot is outside it)."""
    scope = guarantee.scope
    if isinstance(scope, (StreamScope, LifetimeScope)):
        return None
    if isinstance(scope, PeriodScope):
        return (floor // scope.length + 1) * scope.length
    assert isinstance(scope, (WindowScope, ClassScope))
    window = max([scope.window, *class_windows]) if isinstance(scope, ClassScope) else scope.window
    return floor + window


def plan_gaps(
    floors: Mapping[str, int], plans: Mapping[str, StreamPlan], *, new_population: bool = False
) -> tuple[Gap, ...]:
    """Each mechanism's cooldown after its stream's floor (one ``Gap`` per mechanism of a stream
    with a floor; none when the cooldown is empty), logged once. Raises ``IncompatibleState``
    for a stream whose guarantee covers the whole stream or lifetime, unless
    ``new_population`` (the operator states that nobody of the old population takes part)."""
    gaps: list[Gap] = []
    for stream, plan in plans.items():
        floor = floors.get(stream)
        if floor is None:
            continue
        starts = [resume_slot(floor, g, plan.class_windows) for g in plan.guarantees]
        if None in starts and not new_population:
            raise IncompatibleState(_lifetime_refusal(stream, floor))
        start = max((s for s in starts if s is not None), default=floor + 1)
        if start <= floor + 1:
            continue
        gaps += [
            Gap(stream, m, floor + 1, start - 1, INCARNATION_COOLDOWN) for m in plan.mechanisms
        ]
        log.warning(
            "stream %s: a new incarnation releases nothing for slots %d..%d (cooldown: no window "
            "holds the spend of two incarnations); gap records go to the ledger output",
            stream, floor + 1, start - 1,
        )  # fmt: skip
    return tuple(gaps)


def _lifetime_refusal(stream: str, floor: int) -> str:
    return (
        f"stream {stream!r}: its releases up to slot {floor} are on the release topic and a "
        "mechanism's guarantee covers the whole stream (e.g. CGM budget_scope 'stream'): a new "
        "incarnation would spend that budget again over the same users. Resume the stream's "
        "recovery store, or pass --new-population if none of the old population takes part"
    )


def gap_records(flow: Dataflow, gaps: Sequence[Gap]) -> Stream[Gap]:
    """The ``Gap`` records as an input of ``flow``, emitted once per incarnation (its state
    is snapshotted, so a resumed run does not emit them again)."""
    return op.input("incarnation_gaps", flow, _GapSource(tuple(gaps)))


class _GapSource(FixedPartitionedSource[Gap, bool]):
    def __init__(self, gaps: tuple[Gap, ...]) -> None:
        self._gaps = gaps

    def list_parts(self) -> list[str]:
        return ["gaps"]

    def build_part(self, step_id: str, for_part: str, resume_state: bool | None) -> Any:
        return _GapPartition(self._gaps, bool(resume_state))


class _GapPartition(StatefulSourcePartition[Gap, bool]):
    def __init__(self, gaps: tuple[Gap, ...], done: bool) -> None:
        self._gaps, self._done = gaps, done

    def next_batch(self) -> list[Gap]:
        if self._done:
            raise StopIteration
        self._done = True
        return list(self._gaps)

    def snapshot(self) -> bool:
        return self._done
