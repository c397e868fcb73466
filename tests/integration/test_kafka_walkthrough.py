"""The Kafka walkthrough of docs/kafka.md as a new user types it (issue 20): the embedded broker
on a fixed port in the background, a flow file's topics, ``produce`` with its slot range, a run
that says when it has caught up, and ``consume`` reading the releases back."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

from privstream.connectors.broker import free_port
from privstream.connectors.kafka import KafkaSettings, existing_topics

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli

USERS, SLOTS = 200, 3


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``privstream`` as its own process, whatever its exit status."""
    return subprocess.run(
        [*PRIVSTREAM, *args], capture_output=True, text=True, timeout=120, env=cli_env(**env)
    )


def test_the_broker_runs_detached_on_its_port_and_stops(tmp_path: Path) -> None:
    port, state = free_port(), str(tmp_path / "state")
    started = _cli("broker", "--detach", "--port", str(port), "--state-dir", state)
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout == f"PRIVSTREAM_BOOTSTRAP=127.0.0.1:{port}\n"
        assert "in-memory storage" in started.stderr
        assert existing_topics(KafkaSettings((f"127.0.0.1:{port}",))) == {}
        status = _cli("broker", "status", "--state-dir", state)
        assert status.returncode == 0 and status.stdout == started.stdout
        busy = _cli("broker", "--port", str(port))  # a second broker on the port: one line
        assert busy.returncode == 2
        assert busy.stderr.splitlines() == [
            f"privstream: error: port {port} on 127.0.0.1 is in use (another broker?): stop it "
            "or choose another with --port"
        ]
        again = _cli("broker", "--detach", "--port", str(free_port()), "--state-dir", state)
        assert again.returncode == 2 and "broker stop" in again.stderr
    finally:
        stopped = _cli("broker", "stop", "--state-dir", state)
    assert stopped.returncode == 0 and f"127.0.0.1:{port}" in stopped.stderr
    assert _cli("broker", "status", "--state-dir", state).returncode == 1
    assert not (tmp_path / "state" / "broker.json").exists()


def test_topics_create_makes_a_flow_files_topics(tmp_path: Path, kafka: KafkaSettings) -> None:
    tag = str(free_port())
    names = {k: f"{k}-{tag}" for k in ("events", "releases", "ledger", "dlq")}
    flow = tmp_path / "flow.toml"
    flow.write_text(
        f'[kafka]\nbootstrap = "{kafka.bootstrap}"\ninput_topic = "{names["events"]}"\n'
        f'output_topic = "{names["releases"]}"\nledger_topic = "{names["ledger"]}"\n'
        f'dead_letter_topic = "{names["dlq"]}"\n\n[population]\nusers = 100\nepsilon = 1.0\n'
        'window = 5\n\n[[streams]]\nname = "sin"\nfamily = "ldp-ids"\nmechanisms = ["LPA"]\n'
        "domain = 2\nshare = 1.0\n"
    )
    done = run_cli("topics", "create", "--config", str(flow), "--partitions", "2")
    assert sorted(done.stdout.splitlines()) == sorted(f"{n}: created" for n in names.values())
    topics = existing_topics(kafka)
    assert {n: topics.get(n) for n in names.values()} == dict.fromkeys(names.values(), 2)
    again = run_cli("topics", "create", "--config", str(flow))
    assert "created" not in again.stdout  # idempotent: existing topics are left alone


def _watch(
    proc: subprocess.Popen[str], needle: str
) -> tuple[threading.Event, list[str], threading.Thread]:
    """Collect ``proc``'s stderr lines on a thread (it closes the pipe at its end); the event
    is set once ``needle`` appears."""
    seen, lines = threading.Event(), []

    def read() -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:
                lines.append(line)
                if needle in line:
                    seen.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return seen, lines, thread


def test_a_run_says_it_caught_up_and_consume_reads_the_releases(
    kafka: KafkaSettings, topics: Topics
) -> None:
    """``$PRIVSTREAM_BOOTSTRAP`` supplies the bootstrap of a run that names its input topic."""
    env = {"PRIVSTREAM_BOOTSTRAP": kafka.bootstrap}
    run_cli("produce", "--topic", topics.events, "--users", str(USERS), "--last-slot", str(SLOTS),
            "--insecure-seed", "7", "--no-progress", **env)  # fmt: skip
    run = [*PRIVSTREAM, "run", "ldp-ids", "--mechanism", "LBU,LPA", "--compare", "--users",
           str(USERS), "--window", "2", "--insecure-seed", "7", "--input-topic", topics.events,
           "--output-topic", topics.releases, "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(run, stderr=subprocess.PIPE, text=True, env=cli_env(**env))
    caught_up, lines, reader = _watch(proc, "caught up")
    try:
        assert caught_up.wait(90), "".join(lines)[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    said = [line for line in lines if "caught up" in line]
    assert said == [
        f"INFO privstream.status: caught up: read every message of input topic "
        f"{topics.events!r} (1 partition(s)); waiting for input (Ctrl-C or SIGTERM stops the "
        "run)\n"
    ]
    started = time.monotonic()
    every = run_cli("consume", topics.releases, "--idle-seconds", "1", **env)
    assert time.monotonic() - started < 20  # no consumer group: no ~23 s rebalance wait
    releases = [json.loads(line) for line in every.stdout.splitlines()]
    assert sorted((r["mechanism"], r["slot"]) for r in releases) == [
        (m, t) for m in ("LBU", "LPA") for t in range(1, SLOTS + 1)
    ]
    assert every.stderr.endswith(f"read {2 * SLOTS} messages from {topics.releases}\n")
    lpa = run_cli("consume", topics.releases, "--mechanism", "LPA", "--stream", "sin",
                  "--max-messages", "2", **env)  # fmt: skip
    assert [json.loads(line)["mechanism"] for line in lpa.stdout.splitlines()] == ["LPA", "LPA"]
    none = run_cli("consume", topics.releases, "--stream", "other", "--idle-seconds", "1", **env)
    assert none.stdout == ""


def test_a_bounded_kafka_runs_progress_bar_has_its_total(
    kafka: KafkaSettings, topics: Topics
) -> None:
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--users",
            str(USERS), "--last-slot", str(SLOTS), "--insecure-seed", "7", "--no-progress")  # fmt: skip
    done = run_cli("run", "ldp-ids", "--mechanism", "LPA", "--users", str(USERS), "--window", "2",
                   "--insecure-seed", "7", "--slots", str(SLOTS), "--bootstrap", kafka.bootstrap,
                   "--input-topic", topics.events, "--output-topic", topics.releases)  # fmt: skip
    assert f"{SLOTS}/{SLOTS} [" in done.stderr, done.stderr[-2000:]
