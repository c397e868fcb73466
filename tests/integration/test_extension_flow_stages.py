"""A flow file running the worked example's two-stage family (``example-stages``: a device
stage keyed by user shard before LBU's server stage, from ``tests/extension/site``) against the
embedded Kafka broker, stopped after slot 6 and resumed from its recovery store through slot
11. Every slot is released once (a repeated key repeats its payload), each estimate within 4
standard deviations ``√(p(1−p)/(n(2p−1)²))`` of the truth, and the resumed run continues the
store (device states, sequence counts and the reassembly come back).
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import KafkaSettings

from .extension_flows import produce, released_once, run_flow, tagged_flow

USERS, SLOTS, FIRST, LAST, EPS, WINDOW = 1500, 12, 6, 11, 5.0, 5
P = math.exp(EPS / WINDOW) / (1 + math.exp(EPS / WINDOW))
SD = math.sqrt(P * (1 - P) / (USERS * (2 * P - 1) ** 2))


def _flow(directory: Path, kafka: KafkaSettings, events: str, tag: str) -> Path:
    stream = {"name": "rr", "family": "example-stages", "mechanisms": ["RR"], "domain": 2,
              "share": 1.0}  # fmt: skip
    population = {"users": USERS, "epsilon": EPS, "window": WINDOW}
    return tagged_flow(directory, kafka, events, tag, population=population, streams=[stream])


def test_a_flow_file_runs_and_resumes_a_family_with_a_device_stage(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    events, tag = produce(kafka, "sin", ("rr",), USERS, SLOTS), uuid.uuid4().hex[:8]
    flow, noise = _flow(tmp_path, kafka, events, tag), ("--insecure-seed", "19")
    store = str(tmp_path / "store")
    run_flow(flow, "--slots", str(FIRST), *noise, "--recovery-dir", store)
    run_flow(flow, "--slots", str(LAST), *noise, "--recovery-dir", store)
    by_slot = {r["slot"]: r for r in released_once(kafka, f"releases-{tag}")}
    assert set(range(1, LAST + 1)) <= set(by_slot)
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    for t in range(1, LAST + 1):
        assert by_slot[t]["mechanism"] == "RR"
        assert abs(by_slot[t]["estimate"][1] - float(data.truth(t)[1])) <= 4 * SD, t
