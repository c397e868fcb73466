"""``privstream audit`` over the topics of a real Kafka run: clean, then with a conflicting
duplicate release produced into the release topic; a missing topic is an input error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from privstream.connectors.kafka import KafkaSettings, existing_topics

from .conftest import PRIVSTREAM, Topics, cli_env, read_json, run_cli

USERS, SLOTS = 200, 10


def produce(settings: KafkaSettings, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    for key, value in messages:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def events() -> list[tuple[bytes, bytes]]:
    """Every user at every slot, an end-of-slot marker after each slot."""
    out = []
    for t in range(1, SLOTS + 1):
        out += [
            (
                b"sin",
                json.dumps(
                    {"stream": "sin", "user": f"u{u}", "slot": t, "value": (u * t) % 2}
                ).encode(),
            )
            for u in range(USERS)
        ]
        out.append((b"sin", json.dumps({"stream": "sin", "end_of_slot": t}).encode()))
    return out


def audit(kafka: KafkaSettings, topics: Topics, report: Path) -> tuple[int, dict[str, Any], str]:
    """``privstream audit`` of the run's topics as its own process: status, report, stdout."""
    done = subprocess.run(
        [*PRIVSTREAM, "audit", "--bootstrap", kafka.bootstrap, "--release-topic", topics.releases,
         "--ledger-topic", topics.ledger, "--idle-seconds", "1", "--population", str(USERS),
         "--max-epsilon", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(report.read_text()), done.stdout


def test_audit_of_kafka_topics_passes_then_catches_a_conflicting_duplicate(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    produce(kafka, topics.events, events())
    run_cli(
        "run", "ldp-ids", "--mechanism", "LBU,LPA", "--budget-split", "equal", "--users",
        str(USERS), "--epsilon", "1", "--window", "5", "--slots", str(SLOTS), "--no-progress",
        "--secret-file", str(secret_file), *topics.run_flags(kafka),
    )  # fmt: skip

    status, report, stdout = audit(kafka, topics, tmp_path / "clean.json")
    assert status == 0, report["problems"]
    assert stdout.startswith("privstream audit: ok (") and "budget found:    ε = " in stdout
    assert report["counts"] == {
        "releases": 2 * SLOTS, "ledger_entries": 2 * SLOTS, "streams": 1, "mechanisms": 2,
        "slots_expected": 2 * SLOTS, "missing_slots": 0, "halted": 0, "duplicates": 0,
        "conflicting_duplicates": 0, "windows_over_budget": 0, "windows_over_users": 0,
        "population_over_budget": 0, "declared_mismatches": 0, "insecure_outputs": 0,
        "evaluation_outputs": 0, "unfaithful_repeats": 0, "stated_mismatches": 0,
        "over_expected_budget": 0,
    }  # fmt: skip

    release = read_json(kafka, topics.releases, 1)[0]
    release["estimate"] = [0.5, 0.5]
    key = release["release_id"].encode()
    produce(kafka, topics.releases, [(key, json.dumps(release, separators=(",", ":")).encode())])
    status, report, _ = audit(kafka, topics, tmp_path / "conflict.json")
    assert status == 1 and not report["ok"]
    assert report["counts"]["conflicting_duplicates"] == 1
    assert report["counts"]["duplicates"] == 1
    assert report["counts"]["releases"] == 2 * SLOTS
    assert [c for c, check in report["checks"].items() if not check["ok"]] == ["unique_payloads"]
    assert report["problems"][0]["id"] == release["release_id"]


def test_audit_of_a_missing_topic_exits_2_and_creates_nothing(
    kafka: KafkaSettings, topics: Topics
) -> None:
    done = subprocess.run(
        [*PRIVSTREAM, "audit", "--bootstrap", kafka.bootstrap, "--release-topic",
         "no-such-releases", "--ledger-topic", topics.ledger, "--idle-seconds", "1"],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert "no-such-releases" in done.stderr
    assert "no-such-releases" not in existing_topics(kafka)
