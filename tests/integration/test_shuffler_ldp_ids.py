"""Any LDP family behind the shuffler (issue 25): LDP-IDS's ``ldp-reports`` rounds through
``privstream shuffler``. The devices (``privstream devices``) answer the server's requests on
the report topic, the round clock closes the rounds there, the shuffler forwards per request
only the counts (GRR) and the markers, and the server (``privstream run ldp-ids --trust
ldp-shuffled``) reads the shuffled topic alone.

Every slot is released within 5 sd of the devices' true histogram (GRR's exact variance at the
batch's n), the releases state the central ε of the FMT closed form next to the local one, the
shuffled topic holds no device id, the liars' reports are the shuffler's dead letters, and a
population-division mechanism (LPD) works through it as well."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import numpy as np

from privstream.cli.devices import READY
from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)
from privstream.mechanisms.oracles import GRR
from privstream.mechanisms.shuffle_accountant import fmt_closed_bound
from privstream.schema.shuffle import ReportBatch
from tests.integration.conftest import PRIVSTREAM, cli_env, read_all, wait_for_line
from tests.integration.test_shuffler_kafka import clock_key

USERS, SLOTS, W, EPS = 600, 4, 4, 4.0


def topics(kafka: KafkaSettings) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    names = {k: f"{k}-{tag}" for k in ("reports", "requests", "shuffled", "releases", "dlq",
                                       "ledger", "shuffler-dlq")}  # fmt: skip
    create_topics(kafka, [TopicSpec(names["reports"], partitions=2), TopicSpec(names["requests"]),
                          TopicSpec(names["shuffled"]), TopicSpec(names["dlq"]),
                          TopicSpec(names["shuffler-dlq"]),
                          TopicSpec(names["releases"], config=RELEASE_TOPIC_CONFIG),
                          TopicSpec(names["ledger"], config=RELEASE_TOPIC_CONFIG)])  # fmt: skip
    return names


def test_ldp_ids_rounds_through_the_shuffler(kafka: KafkaSettings, tmp_path: Path,
                                            secret_file: Path) -> None:  # fmt: skip
    t = topics(kafka)
    _key, key_file = clock_key(secret_file, tmp_path)
    server = subprocess.Popen([
        *PRIVSTREAM, "run", "ldp-ids", "--trust", "ldp-shuffled", "--mechanism", "LBU,LPD",
        "--budget-split", "equal", "--dataset", "sin", "--users", str(USERS), "--window", str(W),
        "--epsilon", str(EPS), "--slots", str(SLOTS), "--bootstrap", kafka.bootstrap,
        "--shuffled-topic", t["shuffled"], "--request-topic", t["requests"], "--output-topic",
        t["releases"], "--dead-letter-topic", t["dlq"], "--ledger-topic", t["ledger"],
        "--secret-file", str(secret_file), "--snapshot-interval", "1",
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    shuffler = subprocess.Popen([
        *PRIVSTREAM, "shuffler", "--bootstrap", kafka.bootstrap, "--report-topic", t["reports"],
        "--task-topic", t["requests"], "--shuffled-topic", t["shuffled"], "--dead-letter-topic",
        t["shuffler-dlq"], "--store", str(tmp_path / "store"), "--clock-key-file", str(key_file),
        "--n-min", "20", "--idle-seconds", "15",
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    fleet = subprocess.Popen([
        *PRIVSTREAM, "devices", "--bootstrap", kafka.bootstrap, "--request-topic", t["requests"],
        "--report-topic", t["reports"], "--dataset", "sin", "--users", str(USERS), "--slots",
        str(SLOTS), "--idle-seconds", "30", "--epsilon", str(EPS), "--window", str(W),
        "--liars", "8", "--flood", "3",
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    # a round closes 3 s after its request appears: the devices must be reading by then (a
    # fleet still starting on a busy machine made a block close below n_min)
    wait_for_line(fleet, READY)
    clock = subprocess.run([
        *PRIVSTREAM, "clock", "--requests", t["requests"], "--topic", t["reports"], "--stream",
        "sin", "--now", "--through", str(SLOTS), "--round-seconds", "3", "--idle-seconds", "10",
        "--clock-key-file", str(key_file), "--bootstrap", kafka.bootstrap,
    ], env=cli_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert clock.returncode == 0, clock.stderr[-2000:]
    _, err = server.communicate(timeout=180)
    assert server.returncode == 0, err[-3000:]
    fleet.communicate(timeout=120)
    shuffler.communicate(timeout=120)

    releases = [json.loads(m.value()) for m in read_all(kafka, t["releases"])]
    lbu = sorted((r for r in releases if r["mechanism"] == "LBU"), key=lambda r: r["slot"])
    assert [r["slot"] for r in lbu] == list(range(1, SLOTS + 1))
    assert sorted(r["slot"] for r in releases if r["mechanism"] == "LPD") == list(
        range(1, SLOTS + 1)
    )
    source = synthetic_dataset("sin", USERS, SLOTS, 0)
    truth = np.array([np.bincount(source.values(s).astype(int), minlength=2) / USERS
                      for s in range(1, SLOTS + 1)])  # fmt: skip
    batches = [ReportBatch.from_obj(json.loads(m.value())) for m in read_all(kafka, t["shuffled"])
               if b'"privstream.shuffled.reports"' in m.value()]  # fmt: skip
    assert batches and all(b.policy == "forward" for b in batches)
    eps = {q["id"]: q["epsilon"] for q in map(json.loads, (m.value() for m in
                                                            read_all(kafka, t["requests"])))}  # fmt: skip
    for r in lbu:  # LBU: ε/(2w) per slot (equal split of two), GRR over d = 2
        mine = [b for b in batches if b.slot == r["slot"]]
        n = min(b.n for b in mine if eps[b.request] == EPS / 2 / W)
        sd = np.sqrt(GRR(2).variance(EPS / 2 / W, n))
        assert np.all(np.abs(np.asarray(r["estimate"]) - truth[r["slot"] - 1]) < 5 * sd + 8 / USERS)
        # the central statement: the FMT closed form at the slot's weakest batch (largest ε₀,
        # smallest n); LPD's full-ε reports to a few users make it not apply here, said so
        bound = fmt_closed_bound(max(eps[b.request] for b in mine), min(b.n for b in mine), 1e-6)
        assert r["central"]["epsilon"] == bound.epsilon and r["central"]["delta"] == 1e-6
        assert r["central"]["method"] == ("fmt_closed" if bound.applicable else "none: n too small")
    for m in read_all(kafka, t["shuffled"]):
        assert b"d-" not in m.value() and m.headers() is None
    refused = {m.key().decode() for m in read_all(kafka, t["shuffler-dlq"])}
    # the liars' lies, refused by the shuffler (a flood of identical copies counts once)
    assert {"unknown_request", "budget_mismatch", "oracle_mismatch", "shape_mismatch"} <= refused
