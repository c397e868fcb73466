"""Running one flow as a Bytewax cluster of P processes on this host (``privstream run --config
F --processes P``).

Bytewax's cluster mode is the distributed engine: every process runs the same dataflow with
``process_id`` i of the ``addresses`` of all; input partitions are spread over all workers, and
each stream's state lives on the worker its key hashes to. ``launch`` starts the P processes on
free loopback ports (each with ``--process-id i --addresses a0;…``, what an operator runs by
hand on several hosts), forwards SIGTERM/SIGINT to all of them, and stops the others when one
fails (a cluster cannot go on without a member): the restarted cluster resumes from the recovery
store. Each process serves its metrics on the given port plus its process id, so the public and
the internal ranges ``[PORT, PORT + P)`` must not overlap (refused at start).

The launcher watches its members (``privstream.runtime.heartbeat``): a member whose dataflow loop has
not run for ``STALL_WARNING`` seconds is logged ("member i made no progress for N s"), and after
``--stall-limit`` seconds the cluster is stopped and fails (exit ``EXIT_STALLED``), so the
orchestrator restarts it. When a member fails, the launcher names the member that failed first
with that member's own reason (not the "lost the cluster" of the others), and whether
restarting can help.
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
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from privstream.connectors.broker import free_port
from privstream.runtime import heartbeat

log = logging.getLogger("privstream")

CLUSTER_FLAGS = (
    "--processes", "--process-id", "--addresses", "--stop-file", "--cluster-dir", "--stall-limit"
)  # fmt: skip
PORT_FLAGS = ("--metrics-port", "--internal-metrics-port")
EXIT_REFUSED = 2  # a refused configuration or command line: restarting does not help
EXIT_LOST = 3  # a member that stopped because another one did
EXIT_STALLED = 4  # the launcher stopped a cluster whose member made no progress
STALL_WARNING = 30.0  # seconds without progress before a member is logged as stalled
DEFAULT_STALL_LIMIT = 300.0


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


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag V`` or ``flag=V`` in ``argv`` (the last one wins, as argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _port_plus(argv: list[str], flag: str, offset: int) -> list[str]:
    """``argv`` with ``flag PORT`` (or ``flag=PORT``) moved to ``PORT + offset`` in place (one
    metrics port per process)."""
    out = list(argv)
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            out[i + 1] = str(int(argv[i + 1]) + offset)
        elif arg.startswith(flag + "="):
            out[i] = f"{flag}={int(arg.split('=', 1)[1]) + offset}"
    return out


def check_ports(argv: Sequence[str], processes: int) -> None:
    """Refuse public and internal metrics port ranges ``[PORT, PORT + processes)`` that
    overlap: member i's public port would be member j's internal one, and one of them fails to
    listen (with 9100/9101, member 1's public port was member 0's internal one)."""
    public, internal = (_flag_value(argv, flag) for flag in PORT_FLAGS)
    if public is None or internal is None:
        return
    p, q = int(public), int(internal)
    if p < q + processes and q < p + processes:
        raise ValueError(
            f"a cluster of {processes} processes serves public metrics on ports {p}-"
            f"{p + processes - 1} and internal metrics on {q}-{q + processes - 1} (member i: "
            f"PORT + i): the ranges overlap. Move --internal-metrics-port (or "
            f"PRIVSTREAM_INTERNAL_METRICS_PORT) to at least {p + processes}, e.g. 9200"
        )


def launch(argv: Sequence[str], processes: int, stall_limit: float = DEFAULT_STALL_LIMIT) -> int:
    """Run ``privstream <argv>`` as ``processes`` cluster members; the first failed member's
    exit status (``EXIT_STALLED`` when a member made no progress for ``stall_limit`` s)."""
    check_ports(argv, processes)
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
    base = child_argv(argv)
    with tempfile.TemporaryDirectory(prefix="privstream-cluster-") as work:
        stop_file = str(Path(work) / "stop")
        children = []
        for i in range(processes):
            args = base
            for flag in PORT_FLAGS:
                args = _port_plus(args, flag, i)
            command = [sys.executable, "-m", "privstream.cli.commands", *args, "--process-id", str(i),
                       "--addresses", addresses, "--stop-file", stop_file,
                       "--cluster-dir", work]  # fmt: skip
            children.append(
                subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            )
        return _supervise(children, Watch(Path(work), stall_limit))


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


@dataclass
class Watch:
    """What the launcher watches its members with: its directory (heartbeats, reasons) and the
    seconds without progress after which it stops the cluster."""

    directory: Path
    stall_limit: float = DEFAULT_STALL_LIMIT
    started: float = field(default_factory=time.time)
    warned: dict[int, float] = field(default_factory=dict)

    def stalled(self, children: list[subprocess.Popen[bytes]]) -> int | None:
        """Log every running member without progress for ``STALL_WARNING`` s (again every
        ``STALL_WARNING`` s); the first one past ``stall_limit``, if any."""
        now = time.time()
        for i, child in enumerate(children):
            idle = heartbeat.age(heartbeat.alive_file(self.directory, i), self.started, now)
            if child.poll() is not None or idle < min(STALL_WARNING, self.stall_limit):
                self.warned.pop(i, None)
                continue
            if idle >= self.stall_limit:
                return i
            if now - self.warned.get(i, 0.0) >= STALL_WARNING:
                self.warned[i] = now
                log.warning("cluster member %d made no progress for %.0f s: the whole cluster "
                            "waits for it (stopped at %.0f s)", i, idle, self.stall_limit)  # fmt: skip
        return None


def _supervise(children: list[subprocess.Popen[bytes]], watch: Watch | None = None) -> int:
    """Wait for every child; forward SIGTERM/SIGINT; once one fails, or makes no progress for
    ``watch.stall_limit`` s, terminate the rest. The exit status is the first failed member's
    own (the others were stopped because of it), ``EXIT_STALLED`` for a stall."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    stall: int | None = None
    early: set[int] = set()  # the members that failed before the launcher stopped any
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while _running(children):
            early = {i for i, c in enumerate(children) if c.returncode not in (None, 0)}
            if early:
                break
            stall = None if watch is None else watch.stalled(children)
            if stall is not None:
                children[stall].kill()  # SIGTERM cannot reach a stopped member; its peers panic
                break
            time.sleep(0.1)
        _stop_all(children)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    codes = [c.wait() for c in children]
    if stall is not None:
        assert watch is not None
        log.error("cluster member %d made no progress for %.0f s (frozen or hung): stopped the "
                  "cluster; restart the cluster (it resumes from its recovery store); if it stalls again, "
                  "look at member %d's host", stall, watch.stall_limit, stall)  # fmt: skip
        return EXIT_STALLED
    first = first_failure(codes, None if watch is None else watch.directory, early)
    if first is None:
        return 0
    member, code, reason = first
    log.error("cluster member %d failed first (exit %s): %s. %s", member, code, reason,
              _advice(code))  # fmt: skip
    return code


def first_failure(
    codes: list[int], directory: Path | None, early: set[int] | None = None
) -> tuple[int, int, str] | None:
    """``(member, exit status, reason)`` of the member that failed first: one that failed
    before the launcher stopped any (``early``), then a member's own failure (with the reason
    it recorded) before one that only lost the cluster because of another, then the earliest
    recorded reason."""
    early = set(range(len(codes))) if early is None else early
    failed = []
    for member, code in enumerate(codes):
        if code == 0:
            continue
        recorded = None if directory is None else _recorded(directory, member)
        when = float("inf")
        if recorded is not None:
            when, reason = recorded
        elif code < 0:
            reason = f"killed by {signal.Signals(-code).name}"
        else:
            reason = "no reason recorded (see its own error above)"
        failed.append((member not in early, code == EXIT_LOST, when, member, code, reason))
    if not failed:
        return None
    *_order, member, code, reason = min(failed)
    return member, code, reason


def _recorded(directory: Path, member: int) -> tuple[float, str] | None:
    """When ``member`` recorded its reason, and the reason."""
    recorded = heartbeat.read_reason(directory, member)
    if recorded is None:
        return None
    return heartbeat.reason_file(directory, member).stat().st_mtime, recorded[1]


def _advice(code: int) -> str:
    if code == EXIT_REFUSED:
        return ("Restarting will not help: fix what it names (the configuration, command line "
                "or store), then start the cluster again")  # fmt: skip
    return "The others were stopped; restart the cluster: it resumes from its recovery store"


def _running(children: list[subprocess.Popen[bytes]]) -> bool:
    """Poll *every* child (so each one's exit status is known) and say whether any still runs.
    ``any(c.poll() is None …)`` stopped at the first live child, so a member that died during
    start-up behind a live one was never noticed and the launcher waited for ever."""
    alive = [c.poll() is None for c in children]
    return any(alive)


def _stop_all(children: list[subprocess.Popen[bytes]], grace: float = 30.0) -> None:
    """SIGTERM every running child, SIGKILL what is left after ``grace`` s (a SIGSTOPped member
    cannot act on SIGTERM)."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
