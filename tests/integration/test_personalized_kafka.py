"""The personalized flow over Kafka: the registration table fixes the population and its
requirements before the data, per-class ledger entries on the ledger topic, unregistered users
and changed requirements on the dead-letter topic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from privstream.connectors.kafka import DEAD_LETTER_REASON_HEADER, KafkaSettings, wait_for_messages

from .conftest import Topics, read_all, run_cli
from .test_kafka_flow import marker, produce_lines

USERS, SLOTS = 300, 30


def requirement(u: int) -> tuple[float, int]:
    """Every third user asks for (2.0, 5); the others take the stream's default (1.0, 10)."""
    return (2.0, 5) if u % 3 == 0 else (1.0, 10)


def registrations(path: Path) -> Path:
    path.write_text(
        "user,epsilon,window\n"
        + "".join(f"u{u},{eps},{win}\n" for u in range(USERS) for eps, win in [requirement(u)])
    )
    return path


def events() -> tuple[list[bytes], list[tuple[str, str]]]:
    """The stream (registered users stating their requirement or none) and the rejected
    events it holds as (reason, user)."""
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
                eps, win = requirement(u)
                rec |= {"epsilon": eps, "window": win}
            lines.append(json.dumps(rec).encode())
        if t == 4:  # somebody outside the registration, and a registered user asking for more
            for rec in (
                {"stream": "sin", "user": "u999", "slot": 5, "value": 1},
                {"stream": "sin", "user": "u1", "slot": 5, "value": 1, "epsilon": 3.0},
            ):
                lines.append(json.dumps(rec).encode())
        lines.append(marker(t))
    return lines, [("unregistered_user", "u999"), ("requirement_changed", "u1")]


def test_personalized_flow_over_kafka(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    lines, rejected = events()
    produce_lines(kafka, topics.events, lines)
    run_cli(
        "run", "personalized", "--mechanism", "PBD,PBA", "--users", str(USERS),
        "--epsilon", "1.0", "--window", "10", "--slots", str(SLOTS), "--no-progress",
        "--registrations", str(registrations(tmp_path / "registrations.csv")),
        "--secret-file", str(secret_file), "--budget-split", "equal", *topics.run_flags(kafka),
    )  # fmt: skip
    expected = {f"sin/{m}/{t}" for m in ("PBD", "PBA") for t in range(1, SLOTS + 1)}
    releases = wait_for_messages(
        kafka, topics.releases, lambda got: {m.key().decode() for m in got} >= expected
    )
    assert {m.key().decode() for m in releases} == expected
    for m in releases:  # central DP: exact discrete Laplace counts, half of ε for each
        release = json.loads(m.value())
        assert all(float(x).is_integer() for x in release["estimate"])
        assert release["guarantee"]["epsilon"] == 0.5 and not release["insecure_seed"]
    ledger = [
        json.loads(m.value())
        for m in wait_for_messages(kafka, topics.ledger, lambda got: len(got) >= len(expected))
    ]
    for mechanism in ("PBD", "PBA"):
        rows = sorted((e for e in ledger if e["mechanism"] == mechanism), key=lambda e: e["slot"])
        # each mechanism charges a class its share (1/2) of the class's ε
        assert {(c["scope"], c["budget"], c["users"]) for c in rows[-1]["classes"]} == {
            (5, 1.0, 100),
            (10, 0.5, 200),
        }
        for c_index in range(2):  # each class's spend over its own window
            w = rows[-1]["classes"][c_index]["scope"]
            eps = rows[-1]["classes"][c_index]["budget"]
            charge = [next(c["charged"] for c in r["classes"] if c["scope"] == w) for r in rows]
            assert max(sum(charge[i : i + w]) for i in range(len(charge))) <= eps * (1 + 1e-9)
        # both mechanisms together: the class closest to its full requirement stays within it
        for e in rows:
            assert e["population_spent"] <= e["population_budget"] * (1 + 1e-9)
    dead = [
        (dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode(), json.loads(m.value())["user"])
        for m in read_all(kafka, topics.dlq)
    ]
    assert sorted(dead) == sorted(rejected)
