"""The cluster launcher's supervision, without Kafka: a member dying during start-up behind a
live one is noticed, and members die with their launcher (issue 27, items 6 and 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from privstream.cluster import _supervise, die_with_parent

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
        from privstream.cluster import die_with_parent
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
