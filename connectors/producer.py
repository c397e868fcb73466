"""Writing events to Kafka: the synthetic generators of the foundation as a Kafka stream.

``produce_synthetic`` writes every user's value at every slot in the event schema of design §5
(user ids ``u0 … u{n−1}``), followed after each slot by an end-of-slot marker, keyed by the
stream name so a stream's events and markers stay in order in one partition. With ``spread``
the events of a slot go round-robin over every partition of the topic instead and the marker is
written to every partition, after that partition's events of the slot (the slotting closes a
slot once every partition has passed it, ``operators.watermark``). Batched: events are
formatted slot by slot and handed to librdkafka's queue, which batches them on the wire.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from confluent_kafka import Producer

from privstream.connectors.datasets import SlotStream
from privstream.connectors.kafka import KafkaSettings, require_topics
from privstream.schema.events import marker_tag


class ProduceError(RuntimeError):
    """Kafka refused some events."""


def marker_message(name: str, slot: int, clock_key: bytes | None = None) -> bytes:
    """The end-of-slot marker of ``slot`` of stream ``name``, tagged with ``clock_key``
    (``mechanisms.seeding.marker_tag``) when given: only a tagged marker closes slots of a run
    on the ``markers`` clock."""
    if clock_key is None:
        return f'{{"stream":"{name}","end_of_slot":{slot}}}'.encode()
    tag = marker_tag(clock_key, name, slot)
    return f'{{"stream":"{name}","end_of_slot":{slot},"tag":"{tag}"}}'.encode()


def slot_messages(
    stream: SlotStream, name: str, slot: int, clock_key: bytes | None = None
) -> list[bytes]:
    """The JSON events of one slot, then its end-of-slot marker (tagged with ``clock_key``)."""
    values = np.asarray(stream.values(slot))
    if stream.numeric:
        text = [repr(float(v)) for v in values.tolist()]
    else:
        text = [str(int(v)) for v in values.tolist()]
    head = f'{{"stream":"{name}","user":"u'
    tail = f'","slot":{slot},"value":'
    events = [f"{head}{user}{tail}{value}}}".encode() for user, value in enumerate(text)]
    events.append(marker_message(name, slot, clock_key))
    return events


def produce_synthetic(
    settings: KafkaSettings,
    topic: str,
    stream: SlotStream,
    *,
    name: str | None = None,
    first_slot: int = 1,
    progress: Callable[[int], None] | None = None,
    spread: bool = False,
    clock_key: bytes | None = None,
) -> int:
    """Write slots ``first_slot … stream.slots`` of ``stream`` to ``topic``; returns the number
    of events written (markers not counted). ``progress`` is called with each slot's count.
    ``spread``: events round-robin over all partitions, each slot's marker to every one.
    ``clock_key``: tag the markers (a run on the ``markers`` clock needs it)."""
    count = require_topics(settings, [topic])[topic]  # never create the topic by producing
    partitions = count if spread else 0
    stream_name = name or stream.name
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = _producer(settings, delivered)
    key = stream_name.encode()
    written = 0
    for slot in range(first_slot, stream.slots + 1):
        messages = slot_messages(stream, stream_name, slot, clock_key)
        if partitions:
            *events, marker = messages
            for i, value in enumerate(events):
                _send(producer, topic, value, key, i % partitions)
            for partition in range(partitions):
                _send(producer, topic, marker, key, partition)
        else:
            for value in messages:
                _send(producer, topic, value, key)
        producer.poll(0)
        written += len(messages) - 1
        if progress is not None:
            progress(len(messages) - 1)
    _flush(producer, failures, "events")
    return written


def _producer(settings: KafkaSettings, delivered: Callable[[Any, Any], None]) -> Producer:
    return Producer(
        settings.client_config(
            **{
                "linger.ms": 20,
                "batch.num.messages": 100_000,
                "on_delivery": delivered,
                "allow.auto.create.topics": False,
            }
        )
    )


def _flush(producer: Producer, failures: list[str], what: str) -> None:
    """Wait for every queued message; a ``ProduceError`` if any was not delivered."""
    remaining = producer.flush(60)
    if remaining or failures:
        raise ProduceError(
            f"{remaining} {what} not delivered, {len(failures)} refused"
            + (f" (first: {failures[0]})" if failures else "")
        )


def write_clock(
    settings: KafkaSettings,
    topic: str,
    streams: Sequence[str],
    clock_key: bytes,
    *,
    first_slot: int,
    through: int | None,
    slot_seconds: float,
    origin: float = 0.0,
    wait: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
) -> int:
    """The slot clock of a ``markers`` run: one authenticated end-of-slot marker per stream,
    slot and partition of ``topic``, slot ``t`` once real time reaches ``origin + t ·
    slot_seconds`` (Unix seconds; without ``wait`` at once, for tests and demos), from
    ``first_slot`` through ``through`` (forever when None). One marker per slot: the clock
    never jumps, so it passes the slotting's ``max_clock_jump`` of 1. Returns the last slot."""
    partitions = require_topics(settings, [topic])[topic]
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = _producer(settings, delivered)
    slot = first_slot
    while through is None or slot <= through:
        delay = origin + slot * slot_seconds - now()
        if wait and delay > 0:
            sleep(delay)
        for name in streams:
            marker = marker_message(name, slot, clock_key)
            for partition in range(partitions):
                _send(producer, topic, marker, name.encode(), partition)
        _flush(producer, failures, "markers")
        slot += 1
    return slot - 1


def _send(
    producer: Producer, topic: str, value: bytes, key: bytes, partition: int | None = None
) -> None:
    """Queue one message (to ``partition``, or by key), waiting while the local queue is full."""
    while True:
        try:
            if partition is None:
                producer.produce(topic, value, key)
            else:
                producer.produce(topic, value, key, partition=partition)
            return
        except BufferError:  # local queue full: let librdkafka send some
            producer.poll(0.05)
