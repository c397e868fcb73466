"""Issue 18 §1 through the real CLI and the embedded broker: a Kafka run closes slots only on
markers tagged with the clock key (``privstream clock``); a forged marker from an input writer
is an ``unauthenticated_marker`` dead letter and forces nothing; ``--clock data`` is refused
unless every writer is trusted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from privstream.connectors.kafka import KafkaSettings

from .conftest import PRIVSTREAM, Topics, cli_env, read_all, run_cli
from .test_kafka_flow import event, produce_lines

USERS, SLOTS = 100, 3


def flags(topics: Topics, kafka: KafkaSettings, secret: Path) -> list[str]:
    return [
        "run", "ldp-ids", "--mechanism", "LBU", "--users", str(USERS), "--epsilon", "4",
        "--window", "4", "--slots", str(SLOTS), "--no-progress", "--secret-file", str(secret),
        *topics.run_flags(kafka, trusted_clock=False),
    ]  # fmt: skip


def test_a_forged_marker_forces_nothing_on_the_markers_clock(
    kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    # 99 sybils and a victim report once, at slot 1; an input writer forges markers
    lines = [event(u, 1, int(u == 0)) for u in range(USERS)]
    forged = [{"stream": "sin", "end_of_slot": 10_000}, {"stream": "sin", "end_of_slot": 2,
              "tag": "00" * 16}]  # fmt: skip
    produce_lines(kafka, topics.events, lines + [json.dumps(m).encode() for m in forged])
    run_cli("clock", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--stream", "sin",
            "--first-slot", "1", "--through", str(SLOTS), "--now",
            "--secret-file", str(secret_file))  # fmt: skip
    run_cli(*flags(topics, kafka, secret_file))
    releases = [json.loads(m.value()) for m in read_all(kafka, topics.releases)]
    assert sorted(r["slot"] for r in releases) == [1, 2, 3]
    dead = [dict(m.headers())["privstream-reason"] for m in read_all(kafka, topics.dlq)]
    assert dead == [b"unauthenticated_marker", b"unauthenticated_marker"]


def test_the_data_clock_on_kafka_needs_trust_and_the_clock_key_is_not_the_secret(
    kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    refused = subprocess.run(
        [*PRIVSTREAM, *flags(topics, kafka, secret_file), "--clock", "data"],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert refused.returncode == 2 and "--trust-input-clock" in refused.stderr
    key = run_cli("clock-key", "--secret-file", str(secret_file)).stdout.strip()
    assert len(key) == 64 and key not in secret_file.read_text()
