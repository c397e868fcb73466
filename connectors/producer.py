"""Writing events to Kafka: the synthetic generators of the foundation as a Kafka stream.

``produce_synthetic`` writes every user's value at every slot in the event schema of design §5
(user ids ``u0 … u{n−1}``), followed after each slot by an end-of-slot marker, keyed by the
stream name so a stream's events and markers stay in order in one partition. Batched: events
are formatted slot by slot and handed to librdkafka's queue, which batches them on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from confluent_kafka import Producer

from privstream.connectors.kafka import KafkaSettings, require_topics
from privstream.connectors.synthetic import SyntheticStream


class ProduceError(RuntimeError):
    """Kafka refused some events."""


def slot_messages(stream: SyntheticStream, name: str, slot: int) -> list[bytes]:
    """The JSON events of one slot, then its end-of-slot marker."""
    values = np.asarray(stream.values(slot))
    if stream.numeric:
        text = [repr(float(v)) for v in values.tolist()]
    else:
        text = [str(int(v)) for v in values.tolist()]
    head = f'{{"stream":"{name}","user":"u'
    tail = f'","slot":{slot},"value":'
    events = [f"{head}{user}{tail}{value}}}".encode() for user, value in enumerate(text)]
    events.append(f'{{"stream":"{name}","end_of_slot":{slot}}}'.encode())
    return events


def produce_synthetic(
    settings: KafkaSettings,
    topic: str,
    stream: SyntheticStream,
    *,
    name: str | None = None,
    first_slot: int = 1,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write slots ``first_slot … stream.slots`` of ``stream`` to ``topic``; returns the number
    of events written (markers not counted). ``progress`` is called with each slot's count."""
    require_topics(settings, [topic])
    stream_name = name or stream.name
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        settings.client_config(
            **{"linger.ms": 20, "batch.num.messages": 100_000, "on_delivery": delivered}
        )
    )
    key = stream_name.encode()
    written = 0
    for slot in range(first_slot, stream.slots + 1):
        messages = slot_messages(stream, stream_name, slot)
        for value in messages:
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:  # local queue full: let librdkafka send some
                    producer.poll(0.05)
        producer.poll(0)
        written += len(messages) - 1
        if progress is not None:
            progress(len(messages) - 1)
    remaining = producer.flush(60)
    if remaining or failures:
        raise ProduceError(
            f"{remaining} events not delivered, {len(failures)} refused"
            + (f" (first: {failures[0]})" if failures else "")
        )
    return written
