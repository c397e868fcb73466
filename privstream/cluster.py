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
            children.append(subprocess.Popen(command, stdin=subprocess.DEVNULL))
        return _supervise(children)


def _supervise(children: list[subprocess.Popen[bytes]]) -> int:
    """Wait for every child; forward SIGTERM/SIGINT; once one fails, terminate the rest."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while any(c.poll() is None for c in children):
            failed = [c for c in children if c.returncode not in (None, 0)]
            if failed:
                log.error("a cluster process exited with %s: stopping the others",
                          failed[0].returncode)  # fmt: skip
                _stop_all(children)
                break
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    codes = [c.wait() for c in children]
    exits = {i: code for i, code in enumerate(codes) if code != 0}
    if exits:
        log.error("cluster processes exited with %s; restart the cluster: it resumes from its "
                  "recovery store", ", ".join(f"{i}: {c}" for i, c in exits.items()))  # fmt: skip
    return next(iter(exits.values()), 0)


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
