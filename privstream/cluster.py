"""Running one flow as a Bytewax cluster of P processes on this host (``privstream run --config
F --processes P``).

Bytewax's cluster mode is the distributed engine: every process runs the same dataflow with
``process_id`` i of the ``addresses`` of all; input partitions are spread over all workers, and
each stream's state lives on the worker its key hashes to. ``launch`` starts the P processes on
free loopback ports (each with ``--process-id i --addresses a0;…``, what an operator runs by
hand on several hosts), forwards SIGTERM/SIGINT to all of them, and stops the others when one
fails (a cluster cannot go on without a member): the restarted cluster resumes from the recovery
store. Each process serves its metrics on the given port plus its process id.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from privstream.connectors.broker import free_port

log = logging.getLogger("privstream")

CLUSTER_FLAGS = ("--processes", "--process-id", "--addresses", "--stop-file")


def child_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the cluster flags (and their values) the launcher sets itself."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in CLUSTER_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _port_plus(argv: list[str], flag: str, offset: int) -> list[str]:
    """``argv`` with ``flag PORT`` moved to ``PORT + offset`` (one metrics port per process)."""
    if flag not in argv:
        return argv
    i = argv.index(flag)
    return [*argv[: i + 1], str(int(argv[i + 1]) + offset), *argv[i + 2 :]]


def launch(argv: Sequence[str], processes: int) -> int:
    """Run ``privstream <argv>`` as ``processes`` cluster members; the worst exit status."""
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
    base = child_argv(argv)
    with tempfile.TemporaryDirectory(prefix="privstream-cluster-") as work:
        stop_file = str(Path(work) / "stop")
        children = []
        for i in range(processes):
            args = base
            for flag in ("--metrics-port", "--internal-metrics-port"):
                args = _port_plus(args, flag, i)
            command = [sys.executable, "-m", "privstream.cli", *args, "--process-id", str(i),
                       "--addresses", addresses, "--stop-file", stop_file]  # fmt: skip
            children.append(
                subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            )
        return _supervise(children)


def die_with_parent() -> None:
    """In a child before ``exec``: ask the kernel to SIGKILL it when its parent (the launcher)
    dies, however the launcher died (SIGKILL included), so no member outlives its launcher and a
    restarted launcher never runs a second cluster beside the first (Linux ``PR_SET_PDEATHSIG``;
    elsewhere a no-op). If the launcher died before this ran, the child exits at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != _LAUNCHER_PID:  # the launcher is already gone: re-parented to init
        os._exit(1)


_PR_SET_PDEATHSIG = 1
_LAUNCHER_PID = os.getpid()


def _supervise(children: list[subprocess.Popen[bytes]]) -> int:
    """Wait for every child; forward SIGTERM/SIGINT; once one fails, terminate the rest. The
    exit status is the first failed member's own (the others were stopped because of it)."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    first: tuple[int, int] | None = None
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while _running(children):
            failed = [(i, c.returncode) for i, c in enumerate(children)
                      if c.returncode not in (None, 0)]  # fmt: skip
            if failed:
                first = failed[0]
                log.error("cluster process %d exited with %s: stopping the others", *first)
                _stop_all(children)
                break
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    codes = [c.wait() for c in children]
    exits = {i: code for i, code in enumerate(codes) if code != 0}
    if first is None and exits:
        first = next(iter(exits.items()))
    if first is not None:
        log.error("cluster process %d failed first (exit %s; see its own error above); the "
                  "others were stopped. Restart the cluster: it resumes from its recovery store",
                  *first)  # fmt: skip
    return 0 if first is None else first[1]


def _running(children: list[subprocess.Popen[bytes]]) -> bool:
    """Poll *every* child (so each one's exit status is known) and say whether any still runs.
    ``any(c.poll() is None …)`` stopped at the first live child, so a member that died during
    start-up behind a live one was never noticed and the launcher waited for ever."""
    alive = [c.poll() is None for c in children]
    return any(alive)


def _stop_all(children: list[subprocess.Popen[bytes]], grace: float = 30.0) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
