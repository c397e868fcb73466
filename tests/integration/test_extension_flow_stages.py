"""A flow file running the worked example's two-stage family (``example-stages``: a device
stage keyed by user shard before LBU's server stage, from ``tests/extension/site``) against the
embedded Kafka broker, stopped after slot 6 and resumed from its recovery store through slot
11. Every slot is released once (a repeated key repeats its payload), each estimate within 4
standard deviations ``√(p(1−p)/(n(2p−1)²))`` of the truth, and the resumed run continues the
store (device states, sequence counts and the reassembly come back).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import uuid
from pathlib import Path

from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)

from .conftest import PRIVSTREAM, cli_env, read_all, run_cli, write_secret

SITE = Path(__file__).resolve().parents[1] / "extension" / "site"
USERS, SLOTS, FIRST, LAST, EPS, WINDOW = 1500, 12, 6, 11, 5.0, 5
P = math.exp(EPS / WINDOW) / (1 + math.exp(EPS / WINDOW))
SD = math.sqrt(P * (1 - P) / (USERS * (2 * P - 1) ** 2))


def _flow(directory: Path, kafka: KafkaSettings, events: str, tag: str) -> Path:
    create_topics(kafka, [TopicSpec(f"{k}-{tag}", config=RELEASE_TOPIC_CONFIG)
                          for k in ("releases", "ledger")])  # fmt: skip
    path = directory / "flow.toml"
    path.write_text(f"""
[kafka]
bootstrap = "{kafka.bootstrap}"
input_topic = "{events}"
output_topic = "releases-{tag}"
ledger_topic = "ledger-{tag}"
clock = "data"  # the test writes the topic itself
trust_input_clock = true

[population]
users = {USERS}
epsilon = {EPS}
window = {WINDOW}

[[streams]]
name = "rr"
family = "example-stages"
mechanisms = ["RR"]
domain = 2
share = 1.0
""")
    return path


def _run(flow: Path, *flags: str) -> None:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    done = subprocess.run([*PRIVSTREAM, "run", "--config", str(flow), *flags],
                          capture_output=True, text=True, timeout=240, env=env,
                          cwd=flow.parent, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_flow_file_runs_and_resumes_a_family_with_a_device_stage(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    events, tag = f"events-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    create_topics(kafka, [TopicSpec(events, partitions=2)])
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", events, "--dataset", "sin",
            "--stream", "rr", "--users", str(USERS), "--slots", str(SLOTS), "--spread",
            "--no-progress")  # fmt: skip
    flow, key = _flow(tmp_path, kafka, events, tag), str(write_secret(tmp_path / "noise.key"))
    store = str(tmp_path / "store")
    _run(flow, "--slots", str(FIRST), "--secret-file", key, "--recovery-dir", store)
    _run(flow, "--slots", str(LAST), "--secret-file", key, "--recovery-dir", store)
    releases: dict[bytes, bytes] = {}
    for message in read_all(kafka, f"releases-{tag}"):
        assert releases.setdefault(message.key(), message.value()) == message.value()
    by_slot = {r["slot"]: r for r in (json.loads(v) for v in releases.values())}
    assert set(range(1, LAST + 1)) <= set(by_slot)
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    for t in range(1, LAST + 1):
        assert by_slot[t]["mechanism"] == "RR"
        assert abs(by_slot[t]["estimate"][1] - float(data.truth(t)[1])) <= 4 * SD, t
