"""The waiting thread of a multi-worker run gets coarse timers; its workers keep the process's.

``privstream.runtime.timer_slack``: Bytewax's ``cluster_main`` keeps the calling thread in a
1 ms sleep-and-take-the-GIL loop while the workers run; ``run_dataflow`` lets that thread's
timers fire up to 20 ms late, and the flow's first step gives every worker thread the slack
back, so the workers' own waits (Kafka polls, Timely's parks) are as before.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource

from privstream.runtime import timer_slack
from privstream.runtime.runner import run_dataflow
from privstream.runtime.timer_slack import WAITER_SLACK_NS, coarse_waiter, set_timer_slack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def _leader_slack() -> int:
    """The slack of this process's first thread (the one running the test)."""
    return int(Path("/proc/self/timerslack_ns").read_text())


def _observed_flow(seen: list[tuple[str, int | None, int]]) -> Dataflow:
    flow = Dataflow("slack_probe")
    numbers = op.input("in", flow, TestingSource(range(40)))
    spread = op.redistribute("spread", numbers)  # every worker sees some

    def observe(x: int) -> int:
        seen.append((threading.current_thread().name, timer_slack.timer_slack(), _leader_slack()))
        return x

    op.output("out", op.map("observe", spread, observe), TestingSink([]))
    return flow


def test_the_workers_keep_their_slack_while_the_waiting_thread_sleeps_coarsely() -> None:
    assert threading.current_thread() is threading.main_thread()
    before = timer_slack.timer_slack()
    assert before is not None and before < WAITER_SLACK_NS
    seen: list[tuple[str, int | None, int]] = []
    run_dataflow(_observed_flow(seen), workers=2, recovery_dir=None)
    workers = {name for name, _, _ in seen}
    assert len(workers) == 2 and threading.current_thread().name not in workers
    assert {slack for _, slack, _ in seen} == {before}  # the workers' own timers
    assert {leader for _, _, leader in seen} == {WAITER_SLACK_NS}  # the waiter, meanwhile
    assert timer_slack.timer_slack() == before == _leader_slack()  # given back after the run


def test_a_single_worker_runs_on_the_calling_thread_unchanged() -> None:
    before = timer_slack.timer_slack()
    seen: list[tuple[str, int | None, int]] = []
    flow = _observed_flow(seen)
    steps = list(flow.substeps)
    run_dataflow(flow, workers=1, recovery_dir=None)
    assert {(slack, leader) for _, slack, leader in seen} == {(before, before)}
    assert flow.substeps == steps  # no step added: Bytewax runs it on this thread


def test_the_workers_step_is_built_first_and_added_once() -> None:
    flow = _observed_flow([])
    before = timer_slack.timer_slack()
    assert before is not None
    try:
        assert coarse_waiter(flow) == before
        assert timer_slack.timer_slack() == WAITER_SLACK_NS
        assert [s.step_id for s in flow.substeps][:2] == ["slack_probe.worker_timers",
                                                          "slack_probe.in"]  # fmt: skip
        steps = list(flow.substeps)
        coarse_waiter(flow)  # the same flow run again
        assert flow.substeps == steps
    finally:
        set_timer_slack(before)


def test_a_flow_runs_again_on_two_workers() -> None:
    seen: list[tuple[str, int | None, int]] = []
    flow = _observed_flow(seen)
    run_dataflow(flow, workers=2, recovery_dir=None)
    run_dataflow(flow, workers=2, recovery_dir=None)
    assert len(seen) == 80


def test_without_prctl_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timer_slack, "_prctl", lambda: None)  # (the cached one is bypassed)
    flow = _observed_flow([])
    steps = list(flow.substeps)
    assert coarse_waiter(flow) is None
    assert flow.substeps == steps
