"""The ready dataflow of ``ldp-shuffled`` mode (issue 25): SaO2's server stage behind a
shuffler. Its only input is the shuffled topic; it never reads the devices' report topic.

::

    request topic ◀── the server's tasks (published before the flow starts, one per horizon)
         │
    devices ──▶ report topic ──▶ privstream shuffler ──▶ shuffled topic ──▶ this flow
                                 (its own trust domain)   (counts + manifests)   │
                                                                                 └─▶ releases,
                                                                                     ledger, dead letters

Guarantee: the devices' (ε per horizon, ε_life) user-level LDP, enforced by their own ledgers;
the central ε_c each release states comes from the manifests' batch sizes (Lemma 3.4). Batches
are read one record per key, so a shuffler's re-forwarded copy is never counted twice
(``operators.sao2_shuffled``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from bytewax import operators as op
from bytewax.dataflow import Dataflow, Stream
from confluent_kafka import Producer

from privstream.connectors import control
from privstream.connectors.kafka import KafkaEventSource, KafkaSettings, RawBatch
from privstream.families.registry import family
from privstream.flows.io import KafkaIO, outputs, poll_max
from privstream.mechanisms.contract import LedgerEntry, Release
from privstream.mechanisms.sao2 import Sao2Mechanism
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD
from privstream.operators.sao2_shuffled import (
    ShuffledAggregator,
    ShuffledState,
    horizons_needed,
    tasks_for,
)
from privstream.operators.slotting import MechanismOut
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import ProtocolError
from privstream.schema.shuffle import Batch, Sao2Task

SHUFFLED = "ldp-shuffled"


def server_tasks(
    family_name: str, *, task: EstimationTask, users: int, epsilon: float, window: int,
    stream: str, secret: NoiseKey, slots: int, **options: Any,
) -> tuple[Sao2Mechanism, list[Sao2Task]]:  # fmt: skip
    """The mechanism the server stage runs and the public tasks of the horizons ``slots``
    needs (never more than the lifetime budget holds)."""
    entry = family(family_name)
    config = entry.make_config(epsilon=epsilon, window=window, population=users, task=task,
                               **options)  # fmt: skip
    mech = entry.build(entry.default, config)
    if not isinstance(mech, Sao2Mechanism):
        raise ValueError(f"the {family_name} family has no {SHUFFLED} server stage")
    return mech, tasks_for(mech, stream, secret, horizons_needed(slots, window))


def publish_tasks(settings: KafkaSettings, topic: str, tasks: Sequence[Sao2Task]) -> None:
    """Write the tasks to the request topic, keyed by stream, delivery confirmed (idempotent:
    a restart writes the same bytes again)."""
    producer = Producer(settings.client_config(**{"enable.idempotence": True, "acks": "all"}))
    for t in tasks:
        producer.produce(topic, key=t.stream.encode(), value=t.to_json().encode())
    if producer.flush(30) > 0:
        raise ConnectionError(f"the request topic {topic} did not confirm the tasks within 30 s")


def build_shuffled(
    mech: Sao2Mechanism, tasks: Sequence[Sao2Task], kafka: KafkaIO, stream: str
) -> Dataflow:
    """The server stage: shuffled topic (``kafka.input_topic``) in, releases, ledger and dead
    letters out."""
    stop = control.fresh()
    BOARD.clear()
    flow = Dataflow("privstream_sao2_shuffled")
    raw: Stream[RawBatch] = op.input(
        "shuffled_in", flow,
        KafkaEventSource(kafka.settings, kafka.input_topic, batch_size=poll_max(kafka),
                         stop=stop, stall_seconds=kafka.stall_warning_seconds,
                         recreated=kafka.input_topic_recreated),
    )  # fmt: skip
    parsed = op.flat_map("parse", raw, parse_poll)
    split = op.branch("split_parsed", parsed, lambda item: isinstance(item, Batch))
    batches = cast("Stream[Batch]", split.trues)
    keyed = op.key_on("by_stream", batches, lambda b: b.stream)
    aggregator = ShuffledAggregator(mech, stream, list(tasks))

    def step(state: ShuffledState | None, batch: Batch) -> tuple[ShuffledState, list[Any]]:
        state = aggregator.initial() if state is None else state
        taken = aggregator.take(state, batch)
        if taken.why is not None:
            return state, [DeadLetter(taken.why, batch.stream, batch.to_json(), batch.key)]
        return state, taken.events

    out = op.stateful_flat_map("aggregate", keyed, step)
    events = op.map("unkey", out, lambda kv: kv[1])
    merged = MechanismOut(
        cast("Stream[Release]", op.filter("releases", events, lambda e: isinstance(e, Release))),
        cast("Stream[LedgerEntry]", op.filter("ledger", events, lambda e: isinstance(e, LedgerEntry))),
        cast("Stream[DeadLetter]", op.filter("refused", events, lambda e: isinstance(e, DeadLetter))),
    )  # fmt: skip
    errors = cast("Stream[DeadLetter]", split.falses)
    outputs(merged, errors, pairs=[(stream, mech.name)], kafka=kafka, stop=stop)
    return flow


def parse_poll(batch: RawBatch) -> list[Batch | DeadLetter]:
    """Every message of a poll as a ``Batch`` or a dead letter naming why not."""
    out: list[Batch | DeadLetter] = []
    for value in batch.values:
        try:
            out.append(Batch.from_obj(json.loads(value)))
        except ProtocolError as exc:  # a ValueError too: caught first
            out.append(DeadLetter(exc.reason, None, value.decode("utf-8", "replace"), exc.detail))
        except (ValueError, RecursionError):
            out.append(DeadLetter("malformed_json", None, value.decode("utf-8", "replace"), ""))
    return out
