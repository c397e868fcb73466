"""deploy/entrypoint.sh, the container's entrypoint, run as the container runs it, against the
embedded broker: a flow keyed by the mounted secret, with its recovery store and both metrics
endpoints, stopped by SIGTERM (the entrypoint execs privstream, so the signal reaches it) and
resumed to ``--slots T``; ``entrypoint.sh audit`` with the CronJob's flags passes its output
and serves the verdict on its metrics port. Without a usable noise key the entrypoint refuses
to start, exit 2, with a message and without printing the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from privstream.connectors.broker import EmbeddedBroker, free_port
from privstream.connectors.kafka import KafkaSettings
from tests.integration.conftest import Topics, cli_env, read_json, run_cli, write_secret
from tests.integration.prometheus import scrape_until

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "entrypoint.sh"
USERS, EPSILON, WINDOW = 300, 1.0, 5


def entrypoint_env(tmp_path: Path, key: Path, **extra: str) -> dict[str, str]:
    """The container's environment, with test paths and free loopback ports instead of the
    production defaults, and this interpreter's ``privstream`` on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return cli_env(
        PATH=path,
        PRIVSTREAM_FAMILY="ldp-ids",
        PRIVSTREAM_SECRET_FILE=str(key),
        PRIVSTREAM_RECOVERY_DIR=str(tmp_path / "recovery"),
        PRIVSTREAM_METRICS_ADDR="127.0.0.1",
        PRIVSTREAM_METRICS_PORT=str(free_port()),
        PRIVSTREAM_INTERNAL_METRICS_ADDR="127.0.0.1",
        PRIVSTREAM_INTERNAL_METRICS_PORT=str(free_port()),
        **extra,
    )


def flow_args(topics: Topics) -> list[str]:
    """What a StatefulSet's args choose: mechanism, population, ε, w, topics."""
    return [
        "--mechanism", "LBU", "--users", str(USERS), "--epsilon", str(EPSILON),
        "--window", str(WINDOW), "--input-topic", topics.events, "--output-topic",
        topics.releases, "--ledger-topic", topics.ledger, "--dead-letter-topic", topics.dlq,
    ]  # fmt: skip


def produce(kafka: KafkaSettings, topics: Topics, first: int, last: int, key: Path) -> None:
    """Events and their end-of-slot markers, tagged with the flow's clock key (the deployed
    flow runs the markers clock: untagged markers close nothing)."""
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--users", str(USERS), "--first-slot", str(first), "--slots", str(last), "--no-progress",
        "--secret-file", str(key),
    )  # fmt: skip


def scrape(port: str, process: subprocess.Popen[str], until: str = "", timeout: float = 60) -> str:
    """The text of ``http://127.0.0.1:port/metrics`` once it answers with ``until`` in it."""

    def alive() -> None:
        assert process.poll() is None, process.communicate()[1][-3000:]

    return scrape_until(int(port), lambda text: until in text, alive, timeout, repr(until))


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM to the process alone, as the kubelet sends it to the container's first process;
    its output once it exited. Whatever is left of its session is killed after 60 s."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise


def test_a_flow_runs_stops_on_sigterm_resumes_and_passes_the_audit(
    broker: EmbeddedBroker, kafka: KafkaSettings, tmp_path: Path
) -> None:
    topics = Topics(kafka)
    key = write_secret(tmp_path / "noise.key")
    env = entrypoint_env(tmp_path, key, PRIVSTREAM_BOOTSTRAP=broker.bootstrap)
    flow = subprocess.Popen(
        [str(ENTRYPOINT), *flow_args(topics)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        public = scrape(env["PRIVSTREAM_METRICS_PORT"], flow)
        internal = scrape(env["PRIVSTREAM_INTERNAL_METRICS_PORT"], flow)
        command = Path(f"/proc/{flow.pid}/cmdline").read_bytes().split(b"\0")
        produce(kafka, topics, 1, 3, key)
        read_json(kafka, topics.releases, 3)
    finally:
        out, err = stop(flow)
    assert flow.returncode == 0, err[-3000:]
    assert "received SIGTERM" in err
    assert "privstream_budget" in public and "privstream_internal_" not in public
    assert "privstream_internal_" in internal
    assert b"run" in command and not any(b"entrypoint" in arg for arg in command)  # exec'd
    assert list((tmp_path / "recovery").glob("*.sqlite3"))

    produce(kafka, topics, 4, 5, key)
    resumed = subprocess.run(
        [str(ENTRYPOINT), *flow_args(topics), "--slots", "5"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    secret = key.read_text().strip()
    assert secret not in out + err + resumed.stdout + resumed.stderr

    check_audit(env, topics)


def check_audit(env: dict[str, str], topics: Topics) -> None:
    """``entrypoint.sh audit`` with the CronJob's metrics flags: the verdict is served while
    the audit lingers, SIGTERM ends the lingering and the audit's status is the exit code."""
    port = str(free_port())
    audit = subprocess.Popen(
        [str(ENTRYPOINT), "audit", "--release-topic", topics.releases, "--ledger-topic",
         topics.ledger, "--population", str(USERS), "--expect-slots", "5", "--no-progress",
         "--max-epsilon", str(EPSILON),
         "--metrics-port", port, "--metrics-addr", "127.0.0.1", "--linger", "120", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        verdict = scrape(port, audit, until="privstream_audit_passed ")
    finally:
        out, err = stop(audit)
    assert audit.returncode == 0, out[-3000:] + err[-3000:]
    assert "privstream_audit_passed 1.0" in verdict
    report = json.loads(out)
    assert report["ok"] and report["counts"]["releases"] == 5


@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_no_key_file_no_start(tmp_path: Path, content: str | None) -> None:
    key = tmp_path / "noise.key"
    if content is not None:
        key.write_text(content)
    done = subprocess.run(
        [str(ENTRYPOINT), "--mechanism", "LBU"],
        env=entrypoint_env(tmp_path, key), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"the noise key file {key} is missing or empty" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "recovery").exists()


def test_a_weak_key_is_refused_without_being_printed(tmp_path: Path) -> None:
    """The Secret template's placeholder: privstream itself refuses it, exit 2."""
    key = tmp_path / "noise.key"
    key.write_text("REPLACE-ME\n")
    done = subprocess.run(
        [str(ENTRYPOINT), "--mechanism", "LBU", "--users", "100", "--slots", "2"],
        env=entrypoint_env(tmp_path, key), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "privstream: error:" in done.stderr and "is a placeholder" in done.stderr
    assert "Traceback" not in done.stderr
    assert "REPLACE-ME" not in done.stdout + done.stderr


def test_without_a_family_the_entrypoint_says_what_to_set(tmp_path: Path) -> None:
    env = entrypoint_env(tmp_path, write_secret(tmp_path / "noise.key"))
    del env["PRIVSTREAM_FAMILY"]
    done = subprocess.run([str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "set PRIVSTREAM_CONFIG to a flow file, or PRIVSTREAM_FAMILY" in done.stderr
    helped = subprocess.run(
        [str(ENTRYPOINT), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0
    assert "PRIVSTREAM_SECRET_FILE" in helped.stdout and "{run," in helped.stdout


def test_a_flow_file_runs_every_stream(
    broker: EmbeddedBroker, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """``PRIVSTREAM_CONFIG``: the StatefulSet's form, every stream of the file in one flow."""
    topics = Topics(kafka)
    key = write_secret(tmp_path / "noise.key")
    for stream in ("country", "device"):
        run_cli(
            "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset",
            "sin", "--stream", stream, "--users", str(USERS), "--slots", "4", "--no-progress",
            "--secret-file", str(key),
        )  # fmt: skip
    config = tmp_path / "flow.toml"
    config.write_text(
        f'[kafka]\nbootstrap = "{kafka.bootstrap}"\ninput_topic = "{topics.events}"\n'
        f'output_topic = "{topics.releases}"\nledger_topic = "{topics.ledger}"\n'
        f"[population]\nusers = {USERS}\nepsilon = 1.0\nwindow = {WINDOW}\n"
        + "".join(
            f'[[streams]]\nname = "{name}"\nfamily = "ldp-ids"\nmechanisms = ["LBU"]\n'
            f"domain = 2\nshare = 0.5\n"
            for name in ("country", "device")
        )
    )
    env = entrypoint_env(tmp_path, key, PRIVSTREAM_CONFIG=str(config))
    del env["PRIVSTREAM_FAMILY"]
    done = subprocess.run(
        [str(ENTRYPOINT), "--slots", "3"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    releases = read_json(kafka, topics.releases, 6)
    assert {(r["stream"], r["slot"]) for r in releases} >= {
        (s, t) for s in ("country", "device") for t in (1, 2, 3)
    }
    assert {r["guarantee"]["epsilon"] for r in releases} == {0.5}  # each stream's share of ε
    assert list((tmp_path / "recovery").glob("*.sqlite3"))


def test_the_clock_deployment_closes_the_flows_slots(
    broker: EmbeddedBroker, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """The deployed pair: producers write events whose markers nobody trusts (a sender's
    markers are dead letters), and the clock Deployment (``entrypoint.sh clock``, holding only
    the clock key printed by ``privstream clock-key``) closes the slots."""
    topics = Topics(kafka)
    key = write_secret(tmp_path / "noise.key")
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--stream", "country", "--users", str(USERS), "--slots", "3", "--no-progress",
        "--insecure-seed", "5",  # markers tagged with another key: closing nothing
    )  # fmt: skip
    config = tmp_path / "flow.toml"
    config.write_text(
        f'[kafka]\nbootstrap = "{kafka.bootstrap}"\ninput_topic = "{topics.events}"\n'
        f'output_topic = "{topics.releases}"\nledger_topic = "{topics.ledger}"\n'
        f'dead_letter_topic = "{topics.dlq}"\n'
        f"[population]\nusers = {USERS}\nepsilon = 1.0\nwindow = {WINDOW}\n"
        '[[streams]]\nname = "country"\nfamily = "ldp-ids"\nmechanisms = ["LBU"]\n'
        "domain = 2\nshare = 1.0\n"
    )
    clock_key = tmp_path / "clock.key"
    printed = subprocess.run(
        [sys.executable, "-m", "privstream.cli", "clock-key", "--secret-file", str(key)],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    clock_key.write_text(printed.stdout)
    assert key.read_text().strip() not in printed.stdout  # the clock never holds the secret
    env = entrypoint_env(tmp_path, key, PRIVSTREAM_CONFIG=str(config))
    del env["PRIVSTREAM_FAMILY"]
    clock_env = {**env, "PRIVSTREAM_CLOCK_KEY_FILE": str(clock_key)}
    del clock_env["PRIVSTREAM_SECRET_FILE"]
    marked = subprocess.run(
        [str(ENTRYPOINT), "clock", "--now", "--first-slot", "1", "--through", "3"],
        env=clock_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert marked.returncode == 0, marked.stderr[-3000:]
    done = subprocess.run(
        [str(ENTRYPOINT), "--slots", "3"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    releases = read_json(kafka, topics.releases, 3)
    assert sorted(r["slot"] for r in releases) == [1, 2, 3]
    assert "unauthenticated_marker" in _reasons(kafka, topics)  # the producer's closed nothing


def _reasons(kafka: KafkaSettings, topics: Topics) -> set[str]:
    from privstream.connectors.kafka import DEAD_LETTER_REASON_HEADER
    from tests.integration.conftest import read_all

    return {
        dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode() for m in read_all(kafka, topics.dlq)
    }


def test_the_shuffler_mode_runs_the_statefulsets_shuffler(
    broker: EmbeddedBroker, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """``entrypoint.sh shuffler`` with the StatefulSet's arguments (this test's topics): the
    exec'd ``privstream shuffler`` holds the clock key and no noise key, serves every batch
    policy at 0 on its port, refuses a forged end-of-slot marker (counted by reason, and a
    dead letter keyed so on its own topic), saves its store, and SIGTERM stops it cleanly
    with the store intact."""
    import secrets
    import uuid

    from confluent_kafka import Producer

    from privstream.connectors.kafka import TopicSpec, create_topics
    from privstream.runtime.shuffler import ShufflerStore
    from tests.integration.conftest import read_all

    from .test_shuffler_manifests import POD, container

    tag = uuid.uuid4().hex[:8]
    args = container()["args"]
    names = {
        args[i + 1]: f"{args[i + 1]}-{tag}" for i, a in enumerate(args) if a.endswith("-topic")
    }
    create_topics(kafka, [TopicSpec(t) for t in names.values()])
    key = tmp_path / "clock.key"
    key.write_text(secrets.token_hex(32) + "\n")
    port = str(free_port())
    env = cli_env(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PRIVSTREAM_BOOTSTRAP=broker.bootstrap, PRIVSTREAM_CLOCK_KEY_FILE=str(key),
        PRIVSTREAM_SECRET_FILE=str(tmp_path / "no-noise.key"), PRIVSTREAM_SHUFFLER_ID=POD,
        PRIVSTREAM_SHUFFLER_STORE=str(tmp_path / "store"), PRIVSTREAM_METRICS_ADDR="127.0.0.1",
        PRIVSTREAM_SHUFFLER_METRICS_PORT=port,
    )  # fmt: skip
    shuffler = subprocess.Popen(
        [str(ENTRYPOINT), *(names.get(a, a) for a in args)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    reports, dead = names["reports"], names["shuffler-dead-letters"]
    forged = json.dumps({"stream": "cells", "end_of_slot": 1, "tag": "00" * 16}).encode()
    try:
        started = scrape(
            port, shuffler, until='privstream_shuffler_batches_total{policy="drop"} 0.0'
        )
        command = Path(f"/proc/{shuffler.pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{shuffler.pid}/environ").read_bytes().split(b"\0")
        producer = Producer(kafka.client_config())
        producer.produce(reports, forged)
        assert producer.flush(30) == 0
        refused = 'privstream_shuffler_refused_total{reason="unauthenticated_marker"} 1.0'
        scrape(port, shuffler, until=refused)
        (letter,) = read_all(kafka, dead, settle=0.5)
    finally:
        _out, err = stop(shuffler)
    assert b"shuffler" in command and not any(b"entrypoint" in arg for arg in command)
    assert command[command.index(b"--shuffler-id") + 1] == POD.encode()
    assert b"--secret-file" not in command
    assert not any(v.startswith(b"PRIVSTREAM_SECRET=") for v in environ)
    assert 'privstream_shuffler_batches_total{policy="below_min"} 0.0' in started
    assert (letter.key(), letter.value()) == (b"unauthenticated_marker", forged)
    assert shuffler.returncode == 0, err[-3000:]  # SIGTERM: stopped after the poll in hand
    loaded = ShufflerStore(tmp_path / "store").load()
    assert loaded is not None and loaded[1] == {(reports, 0): 1}  # the marker was consumed
