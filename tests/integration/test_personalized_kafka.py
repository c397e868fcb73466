"""The personalized flow over Kafka: requirements stated in events, per-class ledger entries on
the ledger topic, per-class gauges on the metrics endpoint."""

from __future__ import annotations

import json
from typing import Any

from privstream.connectors.kafka import KafkaSettings, wait_for_messages

from .conftest import Topics, run_cli
from .test_kafka_flow import marker, produce_lines

USERS, SLOTS = 300, 30


def events() -> list[bytes]:
    lines: list[bytes] = []
    for t in range(1, SLOTS + 1):
        for u in range(USERS):
            rec: dict[str, Any] = {
                "stream": "sin",
                "user": f"u{u}",
                "slot": t,
                "value": (u * t) % 2,
            }
            if u % 3 == 0:
                rec |= {"epsilon": 2.0, "window": 5}
            lines.append(json.dumps(rec).encode())
        lines.append(marker(t))
    return lines


def test_personalized_flow_over_kafka(kafka: KafkaSettings, topics: Topics) -> None:
    produce_lines(kafka, topics.events, events())
    run_cli(
        "run", "personalized", "--mechanism", "PBD,PBA", "--users", str(USERS),
        "--epsilon", "1.0", "--window", "10", "--slots", str(SLOTS), "--no-progress",
        *topics.run_flags(kafka),
    )  # fmt: skip
    expected = {f"sin/{m}/{t}" for m in ("PBD", "PBA") for t in range(1, SLOTS + 1)}
    releases = wait_for_messages(
        kafka, topics.releases, lambda got: {m.key().decode() for m in got} >= expected
    )
    assert {m.key().decode() for m in releases} == expected
    ledger = [
        json.loads(m.value())
        for m in wait_for_messages(kafka, topics.ledger, lambda got: len(got) >= len(expected))
    ]
    for mechanism in ("PBD", "PBA"):
        rows = sorted((e for e in ledger if e["mechanism"] == mechanism), key=lambda e: e["slot"])
        assert {(c["window"], c["epsilon"], c["users"]) for c in rows[-1]["classes"]} == {
            (5, 2.0, 100),
            (10, 1.0, 200),
        }
        for c_index in range(2):  # each class's spend over its own window
            w = rows[-1]["classes"][c_index]["window"]
            eps = rows[-1]["classes"][c_index]["epsilon"]
            charge = [
                next(c["epsilon_dc"] + c["epsilon_pub"] for c in r["classes"] if c["window"] == w)
                for r in rows
            ]
            assert max(sum(charge[i : i + w]) for i in range(len(charge))) <= eps * (1 + 1e-9)
