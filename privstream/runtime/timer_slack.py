"""Coarse timers for the thread that only waits while a cluster's workers run.

Bytewax 0.21's ``cluster_main`` (every run of more than one worker: a cluster member, or one
process with ``--workers`` > 1) leaves the dataflow to Timely's worker threads and keeps the
calling thread in a loop that sleeps 1 ms and takes the GIL to check for signals: a thousand
wake-ups a second, each a timer interrupt, two context switches and a GIL hand-over with the
worker. Idle, that loop is 13–14 ms of CPU per second per process on the project's VM
(``bench/README.md`` §3), and under load it costs the worker too: its GIL is taken from it a
thousand times a second.

Linux lets a thread say how late its timers may fire (``PR_SET_TIMERSLACK``): with 20 ms of
slack the loop wakes about 50 times a second, and a signal (Ctrl-C, SIGTERM) is still seen within
21 ms. Threads inherit the slack of the thread that creates them, and the workers are created in
``cluster_main`` by the waiting thread, so ``worker_timers`` gives each worker the slack the
process had back (``FineTimers``: the dataflow's first step, built on every worker before any
other). Without ``prctl`` (not Linux) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from datetime import datetime
from typing import Any, Final

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition

log = logging.getLogger(__name__)

PR_SET_TIMERSLACK: Final = 29
PR_GET_TIMERSLACK: Final = 30
WAITER_SLACK_NS: Final = 20_000_000
"""How late the waiting thread's 1 ms sleeps may end: 20 ms (about 50 wake-ups a second)."""

STEP_ID: Final = "worker_timers"


@functools.cache
def _prctl() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def timer_slack() -> int | None:
    """This thread's timer slack in ns (None where it cannot be read)."""
    prctl = _prctl()
    if prctl is None:
        return None
    slack = int(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0))
    return slack if slack >= 0 else None


def set_timer_slack(ns: int) -> bool:
    """Let this thread's timers fire up to ``ns`` late; True when the kernel took it."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0


class _Ended(StatelessSourcePartition[None]):
    def next_batch(self) -> list[None]:
        raise StopIteration

    def next_awake(self) -> datetime | None:
        return None


class FineTimers(DynamicSource[None]):
    """A step that emits nothing: building it gives the worker thread ``slack`` back."""

    def __init__(self, slack: int) -> None:
        self.slack = slack

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Ended:
        set_timer_slack(self.slack)
        return _Ended()


def coarse_waiter(flow: Dataflow) -> int | None:
    """Give the calling thread (the one that will wait in ``cluster_main``) coarse timers, and
    ``flow`` a first step that gives each worker this thread's slack back. Returns that slack,
    for ``set_timer_slack`` once the run is over; None (and nothing changed) where timer slack
    cannot be read or set."""
    slack = timer_slack()
    if slack is None or not set_timer_slack(WAITER_SLACK_NS):
        return None
    if not any(step.step_id == f"{flow.flow_id}.{STEP_ID}" for step in flow.substeps):
        op.input(STEP_ID, flow, FineTimers(slack))  # (once: a flow may be run again)
        flow.substeps.insert(0, flow.substeps.pop())  # built first on every worker
    log.debug("waiting thread's timer slack %d ns, the workers' %d ns", WAITER_SLACK_NS, slack)
    return slack
