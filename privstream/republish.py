"""Never publish a release id twice: a new incarnation on Kafka starts after the release topic.

**Guarantee.** A release id ``stream/mechanism/slot`` is computed by one incarnation only. When a
Kafka run starts a new incarnation (a new recovery store, or none), ``last_published`` reads the
release topic (compacted, keyed by release id) from the beginning to idle — the embedded broker
misreports high watermarks, so no end offset is trusted — and finds each stream's last published
slot; ``skip_published`` then turns every event of a slot at or before it into an
``already_published`` dead letter, so the stream starts after it. A resumed store replays its
own incarnation (the same noise, the same bytes) and needs no floor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Stream

from privstream.connectors.kafka import KafkaSettings, existing_topics
from privstream.events import ALREADY_PUBLISHED, DeadLetter, EventBatch

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
    """Count the release id ``key`` (``stream/mechanism/slot``) in ``last``."""
    if key is None:
        return
    parts = key.decode("utf-8", "replace").rsplit("/", 2)
    if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
        return
    stream, slot = parts[0], int(parts[2])
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
    batches: Stream[EventBatch], floors: Mapping[str, int]
) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    """``batches`` without the events of already published slots, and those events as
    ``already_published`` dead letters (a stream without a floor passes whole)."""
    split = op.flat_map("skip_published", batches, lambda b: _split(b, floors))
    branch = op.branch("published_or_not", split, lambda item: isinstance(item, EventBatch))
    return branch.trues, branch.falses  # type: ignore[return-value]


def _split(batch: EventBatch, floors: Mapping[str, int]) -> list[EventBatch | DeadLetter]:
    floor = floors.get(batch.stream)
    if floor is None:
        return [batch]
    old = batch.slots <= floor
    if not old.any():
        return [batch]
    detail = f"slot <= {floor}, published by an earlier incarnation of this stream"
    letters: list[EventBatch | DeadLetter] = []
    for i in np.flatnonzero(old).tolist():
        text, original = batch.row_line(i)
        letters.append(DeadLetter(ALREADY_PUBLISHED, batch.stream, text, detail, original))
    keep = np.flatnonzero(~old)
    raw = None if batch.raw is None else [batch.raw[i] for i in keep.tolist()]
    marker = batch.complete_through
    if keep.size or (marker is not None and marker > floor):
        letters.append(
            batch.select(keep, raw, marker if marker is not None and marker > floor else None)
        )
    return letters
