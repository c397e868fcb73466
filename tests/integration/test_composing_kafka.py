"""docs/composing.md's Kafka example, typed, against the embedded broker: privstream's source
keeps each message's Kafka partition on its batch, so a stream spread over a 3-partition topic
is slotted with per-partition watermarks and releases every slot."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from confluent_kafka import Producer

from privstream import FrequencyTask, Release, family
from privstream.connectors.kafka import TopicSpec, create_topics
from privstream.dataflow import (
    Dataflow,
    DeadLetter,
    KafkaEventSource,
    KafkaSettings,
    NoiseKey,
    SlottingConfig,
    TestingSink,
    family_mechanisms,
    op,
    parse_raw_batch,
    require_topics,
    run_main,
    split_parsed,
)

USERS, SLOTS, PARTITIONS = 300, 8, 3


def produce_spread(settings: KafkaSettings, topic: str) -> None:
    """Every user at every slot, user ``u`` on partition ``u mod 3``."""
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    for t in range(1, SLOTS + 1):
        for u in range(USERS):
            line = {"stream": "country", "user": f"u{u}", "slot": t, "value": (u * t) % 4}
            producer.produce(topic, json.dumps(line).encode(), partition=u % PARTITIONS)
    assert producer.flush(30) == 0


def test_the_privstream_kafka_source_keeps_partitions(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"compose-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=PARTITIONS)])
    produce_spread(kafka, topic)

    flow = Dataflow("compose_kafka")
    raw = op.input("events", flow, KafkaEventSource(kafka, topic, tail=False))
    parsed = op.flat_map("parse", raw, parse_raw_batch)  # each batch keeps its partition
    batches, rejected = split_parsed("split", parsed)
    seen: list[int] = []
    op.output("partitions", op.map("partition", batches, lambda b: b.partition), TestingSink(seen))
    keyed = op.key_on("by_stream", batches, lambda b: b.stream)
    ldp_ids = family("ldp-ids")
    out = family_mechanisms(
        "lpa", keyed, family=ldp_ids, mechanism="LPA", secret=NoiseKey.generate(),
        config=ldp_ids.make_config(epsilon=1.0, window=4, population=USERS,
                                   task=FrequencyTask(4)),
        slotting=SlottingConfig(partitions=require_topics(kafka, [topic])[topic]),
    )  # fmt: skip
    releases: list[Release] = []
    letters: list[DeadLetter] = []
    op.output("releases", out.releases, TestingSink(releases))
    op.output("rejected", op.merge("dead", rejected, out.dead_letters), TestingSink(letters))
    with caplog.at_level(logging.WARNING, "privstream.operators.slotting"):
        run_main(flow)

    assert set(seen) == set(range(PARTITIONS)) and letters == []
    assert [r.slot for r in releases] == list(range(1, SLOTS + 1))
    assert not any(r.insecure_seed for r in releases)
    assert "partition 0" not in caplog.text
