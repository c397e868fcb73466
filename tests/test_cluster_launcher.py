"""The cluster launcher's supervision, without Kafka: a member dying during start-up behind a
live one is noticed, and members die with their launcher (issue 27, items 6 and 10)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from privstream.runtime.cluster import _supervise, die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


def _sleeper(seconds: float = 60) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_member_dying_behind_a_live_one_stops_the_cluster() -> None:
    """Before the fix ``any(c.poll() is None …)`` stopped at the live first member, so the dead
    second one was never polled and the launcher waited for ever."""
    live = _sleeper()
    dying = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(7)"]
    )
    started = time.monotonic()
    try:
        code = _supervise([live, dying])
    finally:
        live.kill()
    assert code == 7
    assert time.monotonic() - started < 35  # the live member was stopped, not waited for
    assert live.poll() is not None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_members_die_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    """A SIGKILLed launcher used to leave its members running; a restarted one then ran a second
    cluster on the same store. The kernel now kills them with it."""
    pid_file = tmp_path / "member.pid"
    launcher = textwrap.dedent(f"""
        import subprocess, sys, time
        from privstream.runtime.cluster import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=die_with_parent)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], env={**os.environ})
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the launcher never started its member"
        time.sleep(0.05)
    member = int(pid_file.read_text())
    assert _alive(member)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(member) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(member)


def test_die_with_parent_is_callable_in_this_process() -> None:
    """In a child of the process that imported the module, the hook lets the child run."""
    code = subprocess.call(
        [sys.executable, "-c", "print('ok')"], preexec_fn=die_with_parent, stdout=subprocess.DEVNULL
    )
    assert code == 0


# --- issue 27 items 7, 8 and 9: ports, the first failure's own reason, a frozen member ---

BEATING = """
import sys, time
from pathlib import Path
alive = Path(sys.argv[1])
while True:
    alive.touch()
    time.sleep(0.2)
"""


def _beating(directory: Path, member: int) -> subprocess.Popen[bytes]:
    """A stand-in member that beats like ``HeartbeatSource`` (every 0.2 s)."""
    return subprocess.Popen(
        [sys.executable, "-c", BEATING, str(directory / f"member-{member}.alive")]
    )


def test_a_frozen_member_is_reported_and_fails_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a member frozen for 60 s (SIGSTOP) stalled the cluster with no log line and the
    launcher waited for ever. Now it logs the member after STALL_WARNING s, and at the limit
    kills it, stops the others and exits EXIT_STALLED."""
    from privstream.runtime import cluster

    monkeypatch.setattr(cluster, "STALL_WARNING", 1.0)
    members = [_beating(tmp_path, 0), _beating(tmp_path, 1)]
    started = time.monotonic()
    try:
        time.sleep(1.0)
        members[1].send_signal(signal.SIGSTOP)
        code = cluster._supervise(members, cluster.Watch(tmp_path, stall_limit=4.0))
    finally:
        for member in members:
            member.kill()
            member.wait()
    took = time.monotonic() - started
    assert code == cluster.EXIT_STALLED
    assert 5.0 <= took < 15.0  # the limit (4 s after the freeze), not for ever
    messages = [r.getMessage() for r in caplog.records]
    assert any("cluster member 1 made no progress for" in m for m in messages)
    assert not any("cluster member 0 made no progress" in m for m in messages)
    assert any("cluster member 1 made no progress for 4 s (frozen or hung)" in m for m in messages)


def test_the_launcher_names_the_member_that_failed_first_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every failure read "lost the cluster ... restart every process", a refused
    configuration included. Now the summary names the member whose own failure stopped the
    cluster, with its recorded reason, and says that restarting will not help (exit 2)."""
    from privstream.runtime import cluster, heartbeat

    lost = textwrap.dedent(f"""
        import sys, time
        from privstream.runtime.heartbeat import write_reason
        time.sleep(0.3)
        write_reason({str(tmp_path)!r}, 0, 3, "lost the cluster: another member stopped")
        sys.exit(3)
    """)
    refused = textwrap.dedent(f"""
        import sys
        from privstream.runtime.heartbeat import write_reason
        write_reason({str(tmp_path)!r}, 1, 2, "refused: the stream set changed (visits added)")
        sys.exit(2)
    """)
    members = [subprocess.Popen([sys.executable, "-c", lost]),
               subprocess.Popen([sys.executable, "-c", refused])]  # fmt: skip
    code = cluster._supervise(members, cluster.Watch(tmp_path))
    assert code == 2
    assert heartbeat.read_reason(tmp_path, 1) == (
        2,
        "refused: the stream set changed (visits added)",
    )
    (summary,) = [r.getMessage() for r in caplog.records if "failed first" in r.getMessage()]
    assert summary.startswith("cluster member 1 failed first (exit 2): refused: the stream set")
    assert "Restarting will not help" in summary


def test_a_killed_member_is_named_with_its_signal() -> None:
    from privstream.runtime.cluster import first_failure

    assert first_failure([3, -9], None) == (1, -9, "killed by SIGKILL")
    assert first_failure([0, 0], None) is None


def test_a_member_records_its_own_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The member side: Bytewax wraps an operator's exception in BytewaxRuntimeErrors; the
    member reports the innermost one, and exit 2 for a refused configuration change."""
    import argparse

    from bytewax.errors import BytewaxRuntimeError

    from privstream.cli.run_config import _member_failed
    from privstream.mechanisms.errors import IncompatibleState
    from privstream.runtime.heartbeat import read_reason

    args = argparse.Namespace(cluster_dir=str(tmp_path))
    try:
        try:
            raise IncompatibleState("stream 'visits' is new to this store")
        except IncompatibleState as inner:
            raise BytewaxRuntimeError("error calling `mapper`") from inner
    except BytewaxRuntimeError as exc:
        code = _member_failed(args, 1, exc)
    assert code == 2
    assert read_reason(tmp_path, 1) == (2, "refused: stream 'visits' is new to this store")
    err = capsys.readouterr().err
    assert "cluster member 1 refused: stream 'visits'" in err
    assert "restarting will not help" in err and "lost the cluster" not in err
    code = _member_failed(args, 0, RuntimeError("delivery failed: broker timed out"))
    assert code == 1 and read_reason(tmp_path, 0) == (
        1,
        "RuntimeError: delivery failed: broker timed out",
    )


@pytest.mark.parametrize(
    ("public", "internal", "processes", "refused"),
    [(9100, 9101, 2, True), (9100, 9101, 1, False), (9100, 9200, 3, False),
     (9200, 9100, 101, True), (9100, 9200, 100, False)],
)  # fmt: skip
def test_overlapping_metrics_port_ranges_are_refused(
    public: int, internal: int, processes: int, refused: bool
) -> None:
    """Before: with the entrypoint's 9100/9101, member 1's public port was member 0's internal
    one, and 3 of 3 cluster starts failed. Now the launcher refuses before starting anyone."""
    from privstream.runtime.cluster import check_ports

    argv = ["run", "--config", "f.toml", f"--metrics-port={public}",
            "--internal-metrics-port", str(internal)]  # fmt: skip
    if refused:
        with pytest.raises(ValueError, match="the ranges overlap"):
            check_ports(argv, processes)
    else:
        check_ports(argv, processes)


def test_each_member_gets_its_own_ports() -> None:
    from privstream.runtime.cluster import _port_plus

    argv = ["run", "--metrics-port", "9100", "--internal-metrics-port=9200", "--no-progress"]
    argv = _port_plus(_port_plus(argv, "--metrics-port", 2), "--internal-metrics-port", 2)
    assert argv == [
        "run",
        "--metrics-port",
        "9102",
        "--internal-metrics-port=9202",
        "--no-progress",
    ]


def test_a_failed_epoch_is_reported_as_every_other_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An epoch whose releases cannot be delivered ends the process from inside Bytewax's
    snapshot; a cluster member still records why for its launcher, a lone run says it as
    ``privstream run`` does (exit 2 when the topic is gone, 1 otherwise)."""
    from privstream.cli.run_config import _reporter
    from privstream.connectors.kafka import TopicMissing
    from privstream.connectors.kafka_sink import DeliveryFailed
    from privstream.runtime.heartbeat import read_reason
    from privstream.runtime.runner import say_failure

    assert _reporter(argparse.Namespace()) == {}
    member = _reporter(argparse.Namespace(process_id=1, cluster_dir=str(tmp_path)))["report"]
    assert member(DeliveryFailed("could not deliver 3 message(s)")) == 1
    code, reason = read_reason(tmp_path, 1) or (None, "")
    assert code == 1 and "could not deliver 3 message(s)" in reason
    assert say_failure(TopicMissing("Kafka topic 'r' does not exist any more")) == 2
    assert say_failure(DeliveryFailed("could not deliver")) == 1
    assert "privstream: error: could not deliver" in capsys.readouterr().err
