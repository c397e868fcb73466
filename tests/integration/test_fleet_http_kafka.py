"""``ldp-reports`` with the devices over HTTP, as four processes on the embedded broker: the
server stage (``privstream run --trust ldp-reports``), the round clock, the gateway
(``privstream gateway``) and the simulated fleet polling it (``privstream devices
--gateway``). Every slot is released within the oracle's tolerance, the gateway refuses every
lie for its reason so that only accepted reports reach the report topic, and the processes'
output holds counts only."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.request
import uuid
from pathlib import Path

import numpy as np

from privstream.connectors.broker import free_port, wait_until_ready
from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)
from privstream.mechanisms.oracles import GRR
from tests.integration.conftest import PRIVSTREAM, cli_env, read_all

USERS, SLOTS, W, EPS, LIARS = 400, 4, 4, 2.0, 8


def _topics(kafka: KafkaSettings) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    names = {k: f"{k}-{tag}" for k in ("reports", "requests", "releases", "dlq")}
    create_topics(kafka, [TopicSpec(names["reports"]), TopicSpec(names["requests"]),
                          TopicSpec(names["releases"], config=RELEASE_TOPIC_CONFIG),
                          TopicSpec(names["dlq"])])  # fmt: skip
    return names


def _gateway(kafka: KafkaSettings, t: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """The gateway process (rate limit 8 reports per device in 4 slots: an honest device sends
    at most 4, the flooding liar's copies reach it at slot 3) and its URL once it answers."""
    port = free_port()
    gateway = subprocess.Popen([
        *PRIVSTREAM, "gateway", "--bootstrap", kafka.bootstrap, "--request-topic",
        t["requests"], "--report-topic", t["reports"], "--port", str(port),
        "--rate-window", str(W), "--rate-limit", "8",
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)

    assert wait_until_ready(gateway, healthy, 60), "the gateway never answered"
    return gateway, url


def test_server_clock_gateway_and_http_fleet_release_every_slot(
    kafka: KafkaSettings, secret_file: Path
) -> None:
    t = _topics(kafka)
    gateway, url = _gateway(kafka, t)
    fleet = subprocess.Popen([
        *PRIVSTREAM, "devices", "--gateway", url, "--dataset", "sin", "--users", str(USERS),
        "--slots", str(SLOTS), "--epsilon", str(EPS), "--window", str(W), "--liars", str(LIARS),
        "--flood", "4", "--idle-seconds", "120", "--poll-seconds", "0.05",
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    server = subprocess.Popen([
        *PRIVSTREAM, "run", "ldp-ids", "--trust", "ldp-reports", "--mechanism", "LBU",
        "--dataset", "sin", "--users", str(USERS), "--window", str(W), "--epsilon", str(EPS),
        "--slots", str(SLOTS), "--bootstrap", kafka.bootstrap, "--report-topic", t["reports"],
        "--request-topic", t["requests"], "--output-topic", t["releases"],
        "--dead-letter-topic", t["dlq"], "--secret-file", str(secret_file),
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        clock = subprocess.run([
            *PRIVSTREAM, "clock", "--requests", t["requests"], "--topic", t["reports"],
            "--stream", "sin", "--now", "--through", str(SLOTS), "--round-seconds", "2",
            "--idle-seconds", "6", "--bootstrap", kafka.bootstrap,
            "--secret-file", str(secret_file),
        ], env=cli_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
        assert clock.returncode == 0, clock.stderr[-2000:]
        _, err = server.communicate(timeout=120)
        assert server.returncode == 0, err[-3000:]
    finally:
        for process in (fleet, gateway, server):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # the fleet and the gateway print counts
        _, fleet_err = fleet.communicate(timeout=60)
        _, gateway_err = gateway.communicate(timeout=60)
        server.communicate(timeout=60)

    releases = [json.loads(m.value()) for m in read_all(kafka, t["releases"])]
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    source = synthetic_dataset("sin", USERS, SLOTS, 0)
    truth = np.array([np.bincount(source.values(s).astype(int), minlength=2) / USERS
                      for s in range(1, SLOTS + 1)])  # fmt: skip
    # each slot's reports: every honest device's, the duplicating liar's first copy, and the
    # flooding liar's first copy while it is under the rate limit (4 copies a slot, 8 in 4
    # slots: slots 1 and 2; from slot 3 on every copy of it is rate limited)
    honest = USERS - LIARS
    used = [honest + 2, honest + 2] + [honest + 1] * (SLOTS - 2)
    assert [r["details"]["users_m2"] for r in releases] == used, fleet_err
    # LBU: ε/w per slot per device, GRR over d = 2, whose variance q(1−q)/(m(p−q)²) is exact
    # for d = 2 (p + q = 1); 5 sd: a false alarm about once in 10⁶ checks
    sd = np.sqrt(GRR(2).variance(EPS / W, honest + 1))
    estimates = np.array([r["estimate"] for r in releases])
    assert np.all(np.abs(estimates - truth) < 5 * sd), (estimates, truth, sd)

    # only what the gateway accepted is on the report topic: the server refused nothing
    on_topic = [json.loads(m.value()) for m in read_all(kafka, t["reports"])]
    reports = [m for m in on_topic if m.get("type") == "privstream.report"]
    assert read_all(kafka, t["dlq"]) == []
    accepted = re.search(r"gateway accepted (\d+) reports; refused \d+ \((.*)\)", fleet_err)
    assert accepted is not None, fleet_err
    assert int(accepted[1]) == len(reports) == sum(used)
    reasons = set(re.findall(r"(\w+): \d+", accepted[2]))
    assert reasons == {"unknown_request", "duplicate_report", "budget_mismatch",
                       "oracle_mismatch", "shape_mismatch", "replayed_report",
                       "rate_limited"}, reasons  # fmt: skip
    assert f"requests seen: {SLOTS} " in fleet_err
    assert "sim-" not in fleet_err + gateway_err  # counts only: no device id
