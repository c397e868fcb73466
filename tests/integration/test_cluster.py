"""Several streams, several processes: ``privstream run --config`` over one input topic of four
partitions carrying three streams (two LDP-IDS with different mechanisms and tasks, one
personalized), as one process and as a Bytewax cluster of two (``--processes 2``).

The cluster must release byte for byte what one process releases — also after one of its
processes is SIGKILLed mid-stream and the cluster is restarted from the recovery store — and a
store written by two processes resumes under one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
    wait_for_messages,
)

from .conftest import (
    PRIVSTREAM,
    THREE_STREAMS,
    cli_env,
    read_all,
    run_cli,
    same_incarnation,
    write_secret,
)

USERS, SLOTS, LAST = 1500, 12, 11  # slot 12 has no later event to close it before --slots 11
STREAMS = (("country", "sin"), ("device", "log"), ("visits", "sin"))


def _config(directory: Path, kafka: KafkaSettings, events: str, tag: str) -> Path:
    """A flow file over ``events`` writing to topics named after ``tag`` (created here)."""
    outputs = {"output_topic": f"releases-{tag}", "ledger_topic": f"ledger-{tag}",
               "dead_letter_topic": f"dlq-{tag}"}  # fmt: skip
    create_topics(kafka, [TopicSpec(t, config=RELEASE_TOPIC_CONFIG) for t in outputs.values()])
    table = directory / "registrations.csv"
    table.write_text("user,epsilon,window\n" + "".join(
        f"u{u},{2.0 if u % 3 else 1.0},5\n" for u in range(USERS)))  # fmt: skip
    topics = "".join(f'{key} = "{name}"\n' for key, name in outputs.items())
    path = directory / f"flow-{tag}.toml"
    path.write_text(
        f"""
[kafka]
bootstrap = "{kafka.bootstrap}"
input_topic = "{events}"
clock = "data"  # the test writes the topic itself
trust_input_clock = true
{topics}
[population]
users = {USERS}
epsilon = 2.0
window = 5
registrations = "registrations.csv"

"""
        + THREE_STREAMS
    )
    return path


@pytest.fixture
def events(kafka: KafkaSettings) -> str:
    """The input topic: four partitions, three streams spread over all of them."""
    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=4)])
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 1, SLOTS)
    return topic


def _produce(kafka: KafkaSettings, topic: str, stream: str, dataset: str, first: int,
             last: int) -> None:  # fmt: skip
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topic, "--dataset", dataset,
            "--stream", stream, "--users", str(USERS), "--first-slot", str(first), "--slots",
            str(last), "--spread", "--no-progress")  # fmt: skip


def _run(config: Path, *flags: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PRIVSTREAM, "run", "--config", str(config), *flags], capture_output=True, text=True,
        timeout=timeout, env=cli_env(), cwd=config.parent,
    )  # fmt: skip


def _outputs(kafka: KafkaSettings, tag: str) -> dict[str, dict[bytes, bytes]]:
    """Releases and ledger entries by key; a repeated key must repeat its payload."""
    found: dict[str, dict[bytes, bytes]] = {}
    for kind in ("releases", "ledger"):
        seen: dict[bytes, bytes] = {}
        for message in read_all(kafka, f"{kind}-{tag}"):
            assert seen.setdefault(message.key(), message.value()) == message.value()
        found[kind] = seen
    return found


def _expected_keys() -> set[bytes]:
    mechanisms = {"country": ("LBU", "LPA"), "device": ("LBA",), "visits": ("PBD",)}
    return {f"{s}/{m}/{t}".encode() for s, ms in mechanisms.items() for m in ms
            for t in range(1, LAST + 1)}  # fmt: skip


def test_two_processes_release_what_one_releases(
    kafka: KafkaSettings, events: str, tmp_path: Path
) -> None:
    key = str(write_secret(tmp_path / "noise.key"))
    one = _run(_config(tmp_path, kafka, events, "one"), "--slots", str(LAST), "--secret-file", key,
               "--recovery-dir", str(tmp_path / "store-one"))  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    same_incarnation(tmp_path / "store-one", tmp_path / "store")  # the same noise
    two = _run(_config(tmp_path, kafka, events, "two"), "--slots", str(LAST), "--secret-file", key,
               "--processes", "2", "--recovery-dir", str(tmp_path / "store"))  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    alone, cluster = _outputs(kafka, "one"), _outputs(kafka, "two")
    assert _expected_keys() <= alone["releases"].keys()
    assert cluster == alone
    # a store two processes wrote resumes under one (and releases nothing new)
    again = _run(_config(tmp_path, kafka, events, "two"), "--slots", str(LAST), "--secret-file",
                 key, "--recovery-dir", str(tmp_path / "store"))  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert _outputs(kafka, "two") == alone


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def kill_a_member(
    kafka: KafkaSettings, config: Path, key: str, store: str, releases: str, seen: bytes
) -> tuple[int, str]:
    """Start ``config`` as a cluster of two, SIGKILL one process once release ``seen`` is on
    ``releases`` (and a snapshot or two later); the launcher's exit code and stderr."""
    log = config.parent / "launcher.stderr"
    with open(log, "wb") as err:
        launcher = subprocess.Popen(
            [*PRIVSTREAM, "run", "--config", str(config), "--secret-file", key, "--processes",
             "2", "--recovery-dir", store, "--snapshot-interval", "0.5"],
            stdout=subprocess.DEVNULL, stderr=err, env=cli_env(),
        )  # fmt: skip
    try:
        wait_for_messages(kafka, releases, lambda got: {m.key() for m in got} >= {seen}, 120)
        time.sleep(1.0)  # a snapshot or two
        children = _children(launcher.pid)
        assert len(children) == 2, children
        os.kill(children[1], signal.SIGKILL)
        code = launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return code, log.read_text()


def _six_slots(kafka: KafkaSettings, tmp_path: Path, tag: str) -> tuple[str, str, Path, str]:
    """A 4-partition input topic holding slots 1..6 of every stream, a noise key, a flow file
    writing to topics named after ``tag`` and a store path: (topic, key, config, store)."""
    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=4)])
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 1, 6)
    key = str(write_secret(tmp_path / "noise.key"))
    return topic, key, _config(tmp_path, kafka, topic, tag), str(tmp_path / "store")


def test_a_killed_process_and_a_restarted_cluster_release_what_one_process_releases(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    topic, key, config, store = _six_slots(kafka, tmp_path, "killed")
    code, stderr = kill_a_member(kafka, config, key, store, "releases-killed", b"visits/PBD/4")
    assert code != 0, "a cluster that lost a process must not report success"
    assert "restart the cluster" in stderr and "Traceback" not in stderr, stderr[-3000:]
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 7, SLOTS)
    restarted = _run(config, "--slots", str(LAST), "--secret-file", key, "--processes", "2",
                     "--recovery-dir", store)  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    alone_store = same_incarnation(Path(store), tmp_path / "alone-store")  # the same noise
    alone = _run(_config(tmp_path, kafka, topic, "alone"), "--slots", str(LAST), "--secret-file",
                 key, "--recovery-dir", str(alone_store))  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert _outputs(kafka, "killed") == _outputs(kafka, "alone")


def test_slots_stops_a_cluster_with_fewer_partitions_than_processes_and_a_finished_store(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Issue 27 item 11: ``--slots T`` ran for ever on a cluster of 3 over a 1-partition topic,
    and when every slot was already released by an earlier run. Both now stop by themselves."""
    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=1)])
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 1, SLOTS)
    key = str(write_secret(tmp_path / "noise.key"))
    config = _config(tmp_path, kafka, topic, "few")
    flags = ("--slots", str(LAST), "--secret-file", key, "--processes", "3", "--recovery-dir",
             str(tmp_path / "store"))  # fmt: skip
    first = _run(config, *flags, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _expected_keys() <= _outputs(kafka, "few")["releases"].keys()
    started = time.monotonic()
    again = _run(config, *flags, timeout=240)  # every slot already released
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.monotonic() - started < 120


def test_a_frozen_member_is_named_and_fails_the_cluster(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Issue 27 item 9: a member frozen by SIGSTOP stalled the cluster silently (no log line in
    60 s, the launcher waiting for ever). The launcher now names it and fails (exit 4) after
    ``--stall-limit``; the other member reports its progress age as a public metric."""
    from privstream.connectors.broker import free_port
    from privstream.runtime.heartbeat import BEAT

    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=2)])
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 1, 4)
    key = str(write_secret(tmp_path / "noise.key"))
    config = _config(tmp_path, kafka, topic, "frozen")
    port = free_port()
    with open(tmp_path / "launcher.stderr", "wb") as err:
        launcher = subprocess.Popen(
            [*PRIVSTREAM, "run", "--config", str(config), "--secret-file", key, "--processes",
             "2", "--recovery-dir", str(tmp_path / "store"), "--stall-limit", "8",
             "--metrics-port", str(port), "--internal-metrics-port", str(port + 100)],
            stdout=subprocess.DEVNULL, stderr=err, env=cli_env(),
        )  # fmt: skip
    try:
        wait_for_messages(kafka, "releases-frozen",
                          lambda got: {m.key() for m in got} >= {b"visits/PBD/2"}, 120)  # fmt: skip
        (frozen,) = [pid for pid in _children(launcher.pid)
                     if b"--process-id\x001\x00" in Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip
        os.kill(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(5)
        age = _member_age(port, "1")  # member 0 still serves; it sees member 1 age
        code = launcher.wait(timeout=90)
        took = time.monotonic() - stopped
    finally:
        if launcher.poll() is None:
            launcher.kill()
    stderr = (tmp_path / "launcher.stderr").read_text()
    assert code == 4, stderr[-3000:]
    # the stall counts from the member's last beat, up to one beat (1 s) before the SIGSTOP
    assert 8 - BEAT <= took < 60
    assert 3 <= age < 9
    assert "cluster member 1 made no progress for 8 s (frozen or hung)" in stderr, stderr[-3000:]


def _member_age(port: int, member: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    (line,) = [line for line in text.splitlines() if line.startswith(
        f'privstream_cluster_member_progress_age_seconds{{member="{member}"}}')]  # fmt: skip
    return float(line.split()[-1])


def test_sigterm_to_the_launcher_drains_every_member_and_the_cluster_resumes(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """SIGTERM reaches every member, each sees it on the thread that waits for its workers
    (which sleeps with 20 ms of timer slack: ``runtime.timer_slack``), drains, snapshots and
    exits 0; a restart from the store releases every slot."""
    topic, key, config, store = _six_slots(kafka, tmp_path, "term")
    with open(tmp_path / "launcher.stderr", "wb") as err:
        launcher = subprocess.Popen(
            [*PRIVSTREAM, "run", "--config", str(config), "--secret-file", key, "--processes",
             "2", "--recovery-dir", store],
            stdout=subprocess.DEVNULL, stderr=err, env=cli_env(), cwd=tmp_path,
        )  # fmt: skip
    try:
        wait_for_messages(kafka, "releases-term",
                          lambda got: {m.key() for m in got} >= {b"visits/PBD/4"}, 120)  # fmt: skip
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
        stopped = time.monotonic() - started
    finally:
        if launcher.poll() is None:
            launcher.kill()
    log = (tmp_path / "launcher.stderr").read_text()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert log.count("(received SIGTERM)") == 2, log[-3000:]  # each member's own summary line
    assert stopped < 30, f"{stopped:.1f} s from SIGTERM to the launcher's exit"
    for stream, dataset in STREAMS:
        _produce(kafka, topic, stream, dataset, 7, SLOTS)
    again = _run(config, "--slots", str(LAST), "--secret-file", key, "--processes", "2",
                 "--recovery-dir", store)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert _expected_keys() <= _outputs(kafka, "term")["releases"].keys()
