"""The worked example's output axis against Kafka: a flow file whose stream belongs to the
external family ``example_outputs`` (``tests/extension/site``) routes its internal ``audit``
output to a topic of its own (``[kafka] audit_topic``) and releases one record per query per
slot, keyed ``stream/mechanism/slot/query``; it runs as ``privstream run --config`` over the
embedded broker, in a process of its own that discovers the family through ``PYTHONPATH``."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)
from tests.extension.conftest import external_site  # noqa: F401  (the fixture)

from .conftest import Topics, last_released, read_all, run_cli
from .extension_flows import run_flow, topic_names, write_flow

USERS, SLOTS, LAST, EPS, W, D = 2000, 8, 7, 1.0, 4, 3
QUERIES = [f"cat-{i}" for i in range(D)]


def _flow(path: Path, kafka: KafkaSettings, topics: Topics, audit: str) -> Path:
    names = topic_names(topics, audit_topic=audit)
    stream = {"name": "load", "family": "example-outputs", "mechanisms": ["LBUQ"], "domain": D,
              "share": 1.0}  # fmt: skip
    population = {"users": USERS, "epsilon": EPS, "window": W}
    return write_flow(path, kafka, names, population=population, streams=[stream])


def test_a_flow_file_routes_the_extra_output_to_its_topic(
    kafka: KafkaSettings,
    topics: Topics,
    tmp_path: Path,
    secret_file: Path,
    external_site: dict[str, str],  # noqa: F811
) -> None:
    audit = f"audit-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(audit, config=RELEASE_TOPIC_CONFIG)])
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset",
            "lns", "--stream", "load", "--users", str(USERS), "--slots", str(SLOTS),
            "--no-progress")  # fmt: skip
    config = _flow(tmp_path / "flow.toml", kafka, topics, audit)
    run_flow(config, "--slots", str(LAST), "--secret-file", str(secret_file))
    releases = {m.key().decode(): json.loads(m.value()) for m in read_all(kafka, topics.releases)}
    done = last_released(releases, LAST, SLOTS)  # every slot through it is released whole
    expected = {f"load/LBUQ/{t}/{q}" for t in range(1, done + 1) for q in QUERIES}
    assert set(releases) == expected
    for key, release in releases.items():
        assert release["release_id"] == key and key.endswith(release["key"]["query"])
        assert "output" not in release  # the internal output never reaches the releases
    for t in range(1, LAST + 1):  # the queries are one histogram's categories
        total = sum(releases[f"load/LBUQ/{t}/{q}"]["estimate"][0] for q in QUERIES)
        assert math.isclose(total, 1.0)
    records = {m.key().decode(): json.loads(m.value()) for m in read_all(kafka, audit)}
    assert set(records) == {f"load/LBUQ/{t}" for t in range(1, done + 1)}
    assert {r["output"] for r in records.values()} == {"audit"}
    assert all(r["payload"] == {"strategy": "publish", "queries": D} for r in records.values())
    assert len({m.key() for m in read_all(kafka, topics.ledger)}) == done
    assert read_all(kafka, topics.dlq) == []
