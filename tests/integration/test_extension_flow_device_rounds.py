"""A flow file with two streams of the worked example's external families (``tests/extension/
site``): ``memo`` (``example-device-state``: memoized randomized response, a per-user memo on
the devices) and ``probe`` (``example-rounds``: two rounds per slot), against the embedded
Kafka broker, stopped after slot 6 and resumed from its recovery store through slot 11.

Every slot of both streams is released once (a repeated key repeats its payload), each
estimate within 4 standard deviations of the truth (``memo``: ``a(1−a)/(n(2a−1)²)``; ``probe``:
``V(ε, k₂)`` of its refine sample), and the devices' memo survives the resume: every permanent
bit in the store after the first run is the same after the second (none redrawn), read from
the recovery store's snapshots of the stream's state.
"""

from __future__ import annotations

import importlib
import json
import math
import pickle
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import KafkaSettings
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension.conftest import external_site  # noqa: F401  (the fixture)

from .conftest import read_all
from .extension_flows import produce, released_once, run_flow, tagged_flow

USERS, SLOTS, FIRST, LAST, EPS, WINDOW = 2000, 12, 6, 11, 10.0, 5
STREAM_EPS = EPS / 2  # each stream's share 0.5


def _flow(directory: Path, kafka: KafkaSettings, events: str, tag: str) -> Path:
    memo = {"name": "memo", "family": "example-device-state", "mechanisms": ["MRR"],
            "domain": 2, "permanent_epsilon": 2.0, "share": 0.5}  # fmt: skip
    probe = {"name": "probe", "family": "example-rounds", "mechanisms": ["PRB"], "domain": 2,
             "share": 0.5}  # fmt: skip
    population = {"users": USERS, "epsilon": EPS, "window": WINDOW}
    return tagged_flow(directory, kafka, events, tag, population=population,
                       streams=[memo, probe])  # fmt: skip


def _memo(store: Path) -> tuple[int, Any]:
    """The devices' memo of stream ``memo`` in the store's latest snapshot, with its epoch."""
    found: list[tuple[int, Any]] = []
    for part in sorted(store.glob("*.sqlite3")):
        with sqlite3.connect(part) as db:
            rows = db.execute("SELECT snap_epoch, ser_change FROM snaps").fetchall()
        for epoch, blob in rows:
            state = pickle.loads(blob) if blob is not None else None
            if state is not None and getattr(state, "stream", None) == "memo":
                found.append((epoch, state.clients["MRR"]))
    assert found, "no snapshot of stream memo in the recovery store"
    return max(found, key=lambda f: f[0])


def _sd_memo() -> float:
    site = importlib.import_module("example_device_state")
    return math.sqrt(site.variance(2.0, STREAM_EPS / WINDOW, USERS))


def test_two_external_families_run_and_resume_with_device_state_and_rounds(
    kafka: KafkaSettings,
    tmp_path: Path,
    external_site: dict[str, str],  # noqa: F811
) -> None:
    events, tag = produce(kafka, "sin", ("memo", "probe"), USERS, SLOTS), uuid.uuid4().hex[:8]
    flow, noise = _flow(tmp_path, kafka, events, tag), ("--insecure-seed", "19")
    store = tmp_path / "store"
    run_flow(flow, "--slots", str(FIRST), *noise, "--recovery-dir", str(store))
    epoch1, memo1 = _memo(store)
    run_flow(flow, "--slots", str(LAST), *noise, "--recovery-dir", str(store))
    epoch2, memo2 = _memo(store)
    drawn = memo1.permanent != -1
    assert epoch2 > epoch1 and int(drawn.sum()) >= USERS  # every user's bit of slot 1 at least
    assert np.array_equal(memo2.permanent[drawn], memo1.permanent[drawn])  # none redrawn
    by_key = {(r["stream"], r["slot"]): r for r in released_once(kafka, f"releases-{tag}")}
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    sd_probe = math.sqrt(FrequencyTask(2).variance(STREAM_EPS, USERS // WINDOW // 2))
    for t in range(1, LAST + 1):
        memo, probe = by_key[("memo", t)], by_key[("probe", t)]
        assert abs(memo["estimate"][1] - float(data.truth(t)[1])) <= 4 * _sd_memo(), t
        source = probe["source_slot"]
        assert probe["details"]["rounds"] == (2 if source == t else 1)
        drift = abs(float(data.truth(t)[1]) - float(data.truth(source)[1]))
        assert abs(probe["estimate"][1] - float(data.truth(t)[1])) <= 4 * sd_probe + drift, t
    assert by_key[("probe", 1)]["details"]["rounds"] == 2  # nothing released yet: refine
    ledger = [json.loads(m.value()) for m in read_all(kafka, f"ledger-{tag}")]
    probe_entries = {e["slot"]: e for e in ledger if e["stream"] == "probe"}
    assert probe_entries[1]["details"]["epsilon_refine"] == STREAM_EPS
    assert probe_entries[1]["details"]["refine_users"] == USERS // WINDOW // 2
