"""``ldp-reports`` end to end over the embedded broker, as three processes: the server stage
(``privstream run ldp-ids --trust ldp-reports``), the round clock (``privstream clock
--requests``) and a simulated fleet with liars (``privstream devices``). A second server over
the same report topic (a replay, as after a crash without a store) releases byte-identical
output and re-publishes the same requests."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import numpy as np

from privstream.cli.devices import READY
from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import (
    DEAD_LETTER_REASON_HEADER,
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
)
from privstream.mechanisms.oracles import GRR
from tests.integration.conftest import PRIVSTREAM, cli_env, read_all, run_cli, wait_for_line

USERS, SLOTS, W, EPS, LIARS = 400, 5, 5, 2.0, 8


def _topics(kafka: KafkaSettings) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    names = {k: f"{k}-{tag}" for k in ("reports", "requests", "releases", "dlq", "ledger")}
    specs = [TopicSpec(names["reports"], partitions=2), TopicSpec(names["requests"]),
             TopicSpec(names["releases"], config=RELEASE_TOPIC_CONFIG), TopicSpec(names["dlq"]),
             TopicSpec(names["ledger"], config=RELEASE_TOPIC_CONFIG)]  # fmt: skip
    create_topics(kafka, specs)
    return names


def _fleet(
    kafka: KafkaSettings, t: dict[str, str], dataset: str, users: int, slots: int, *flags: str
) -> subprocess.Popen[str]:
    """``privstream devices`` over the test's topics (``flags``: its budget and knobs), once it
    reads the requests: the clock's rounds close 3 s after a request appears."""
    fleet = subprocess.Popen([
        *PRIVSTREAM, "devices", "--bootstrap", kafka.bootstrap, "--request-topic",
        t["requests"], "--report-topic", t["reports"], "--dataset", dataset, "--users",
        str(users), "--slots", str(slots), "--idle-seconds", "40", *flags,
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for_line(fleet, READY)
    return fleet


def _clock(secret: Path, slots: int, *target: str) -> None:
    """The round clock over ``target`` (``--config FLOW`` or the topics), all slots at once."""
    clock = subprocess.run([
        *PRIVSTREAM, "clock", *target, "--now", "--through", str(slots), "--round-seconds", "3",
        "--idle-seconds", "8", "--secret-file", str(secret),
    ], env=cli_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert clock.returncode == 0, clock.stderr[-2000:]


def _server(kafka: KafkaSettings, t: dict[str, str], secret: Path, releases: str) -> list[str]:
    return [
        *PRIVSTREAM, "run", "ldp-ids", "--trust", "ldp-reports", "--mechanism", "LBU",
        "--dataset", "sin", "--users", str(USERS), "--window", str(W), "--epsilon", str(EPS),
        "--slots", str(SLOTS), "--bootstrap", kafka.bootstrap, "--report-topic", t["reports"],
        "--request-topic", t["requests"], "--output-topic", releases,
        "--dead-letter-topic", t["dlq"], "--ledger-topic", t["ledger"],
        "--secret-file", str(secret), "--snapshot-interval", "1",
    ]  # fmt: skip


def test_server_clock_and_fleet_release_every_slot_and_refuse_every_lie(
    kafka: KafkaSettings, secret_file: Path
) -> None:
    t = _topics(kafka)
    server = subprocess.Popen(_server(kafka, t, secret_file, t["releases"]), env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    fleet = _fleet(kafka, t, "sin", USERS, SLOTS, "--epsilon", str(EPS), "--window", str(W),
                   "--liars", str(LIARS), "--flood", "4")  # fmt: skip
    topics = ("--requests", t["requests"], "--topic", t["reports"], "--stream", "sin")
    _clock(secret_file, SLOTS, *topics, "--bootstrap", kafka.bootstrap)
    _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err[-3000:]
    fleet.communicate(timeout=120)

    releases = [json.loads(m.value()) for m in read_all(kafka, t["releases"])]
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    source = synthetic_dataset("sin", USERS, SLOTS, 0)
    truth = np.array([np.bincount(source.values(s).astype(int), minlength=2) / USERS
                      for s in range(1, SLOTS + 1)])  # fmt: skip
    estimates = np.array([r["estimate"] for r in releases])
    # LBU: every slot ε/w per device, GRR over d = 2; ~USERS − LIARS honest reports per slot
    sd = np.sqrt(GRR(2).variance(EPS / W, USERS - LIARS))
    assert np.all(np.abs(estimates - truth) < 5 * sd), (estimates, truth, sd)

    reasons = Counter(dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode()
                      for m in read_all(kafka, t["dlq"]))  # fmt: skip
    for reason in ("unknown_request", "duplicate_report", "budget_mismatch", "oracle_mismatch",
                   "shape_mismatch", "replayed_report"):  # fmt: skip
        assert reasons[reason] > 0, reasons
    requests = [json.loads(m.value()) for m in read_all(kafka, t["requests"])]
    assert {(r["slot"], r["round"]) for r in requests} == {(s, 1) for s in range(1, SLOTS + 1)}
    assert all(set(r) >= {"id", "oracle", "epsilon", "select"} for r in requests)

    # the same report topic read again by a fresh server: byte-identical releases
    again = f"releases-again-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(again, config=RELEASE_TOPIC_CONFIG)])
    replay = subprocess.run(_server(kafka, t, secret_file, again), env=cli_env(),
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-3000:]
    first = sorted(m.value() for m in read_all(kafka, t["releases"]))
    second = sorted(m.value() for m in read_all(kafka, again))
    assert first == second
    ids = [json.loads(m.value())["id"] for m in read_all(kafka, t["requests"])]
    assert len(ids) == 2 * SLOTS and len(set(ids)) == SLOTS  # the replay re-published the same


FLOW = """
[kafka]
bootstrap = "{bootstrap}"
trust = "ldp-reports"
report_topic = "{reports}"
request_topic = "{requests}"
output_topic = "{releases}"
dead_letter_topic = "{dlq}"
ledger_topic = "{ledger}"

[population]
users = {users}
epsilon = {epsilon}
window = {window}

[[streams]]
name = "country"
family = "ldp-ids"
mechanisms = ["LBU", "LPA"]
budget_split = "equal"
domain = 2
share = 0.5

[[streams]]
name = "device"
family = "ldp-ids"
mechanisms = ["LBA"]
domain = 2
share = 0.5
"""


def test_a_flow_file_serves_two_streams_and_the_clock_follows_its_request_topic(
    kafka: KafkaSettings, secret_file: Path, tmp_path: Path
) -> None:
    """``privstream run --config`` and ``privstream clock --config`` of an ``ldp-reports``
    file: every stream and mechanism releases every slot; each device's own ledger (ε per w
    over all streams) refuses none of the server's requests for budget (their shares sum to
    ε), only population-division asks of devices that already reported in the window."""
    tag = uuid.uuid4().hex[:8]
    t = {k: f"{k}-{tag}" for k in ("reports", "requests", "releases", "dlq", "ledger")}
    flow = tmp_path / "flow.toml"
    flow.write_text(FLOW.format(bootstrap=kafka.bootstrap, users=USERS, epsilon=EPS, window=W,
                                **t))  # fmt: skip
    created = run_cli("topics", "create", "--config", str(flow), "--partitions", "2")
    assert all(f"{name}: created" in created.stdout for name in t.values()), created.stdout
    slots = 3
    server = subprocess.Popen([*PRIVSTREAM, "run", "--config", str(flow), "--slots", str(slots),
                               "--secret-file", str(secret_file)], env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    fleet = _fleet(kafka, t, "sin", USERS, slots, "--epsilon", str(EPS), "--window", str(W))
    _clock(secret_file, slots, "--config", str(flow))
    _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err[-3000:]
    _, fleet_err = fleet.communicate(timeout=120)
    releases = {json.loads(m.value())["release_id"] for m in read_all(kafka, t["releases"])}
    assert releases == {f"{s}/{m}/{slot}" for s, ms in (("country", ("LBU", "LPA")),
                                                         ("device", ("LBA",)))
                        for m in ms for slot in range(1, slots + 1)}  # fmt: skip
    # a hash selection also asks devices that already reported to the same population-division
    # mechanism in the window: their own ledgers refuse ("window"); nothing else is refused
    refused = re.search(r"refused by the device ledger: \d+ \((.*)\)", fleet_err)
    assert refused is not None and set(re.findall(r"(\w+): \d+", refused[1])) <= {"window"}


def test_cgm_runs_on_devices_from_the_command_line(kafka: KafkaSettings, secret_file: Path) -> None:
    """``privstream run cgm --trust ldp-reports`` with a fleet of CGM devices (each its own
    noise chain and μ² ledger): every slot is released with the mean of the reports and its
    standard error, within a few standard errors of the devices' true mean."""
    t = _topics(kafka)
    users, slots = 300, 4
    server = subprocess.Popen([
        *PRIVSTREAM, "run", "cgm", "--trust", "ldp-reports", "--mechanism", "CGM",
        "--dataset", "sine", "--users", str(users), "--window", str(slots), "--epsilon", "4",
        "--slots", str(slots), "--bootstrap", kafka.bootstrap, "--report-topic", t["reports"],
        "--request-topic", t["requests"], "--output-topic", t["releases"],
        "--dead-letter-topic", t["dlq"], "--secret-file", str(secret_file),
    ], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    fleet = _fleet(kafka, t, "sine", users, slots, "--epsilon", "4", "--window", str(slots))
    topics = ("--requests", t["requests"], "--topic", t["reports"], "--stream", "sine")
    _clock(secret_file, slots, *topics, "--bootstrap", kafka.bootstrap)
    _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err[-3000:]
    _, fleet_err = fleet.communicate(timeout=120)
    assert "refused by the device ledger: 0 " in fleet_err, fleet_err
    releases = [json.loads(m.value()) for m in read_all(kafka, t["releases"])]
    assert [r["slot"] for r in releases] == list(range(1, slots + 1))
    source = synthetic_dataset("sine", users, slots, 0)
    for release in releases:
        truth = float(np.mean(source.values(release["slot"])))
        se = release["details"]["stderr"][0]
        assert release["details"]["reports"] == users and se > 0
        # the clipped mean moves from the raw one by at most the bound C per slot: 6 SE + C
        assert abs(release["estimate"][0] - truth) < 6 * se + 0.05 * release["slot"], release
