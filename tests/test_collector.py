"""A flow runs with the garbage collector's young collections 50,000 allocations apart.

``privstream.runtime.collector``: at CPython's default (700) the collector walked every report
a stream holds until its slot closes again and again, about 460 ns per held report
(``bench/README.md`` §3). ``run_dataflow`` raises the thresholds for the run and gives the
process its own back afterwards; it never lowers one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource

from privstream.runtime.collector import STREAMING_THRESHOLDS, streaming_collector
from privstream.runtime.runner import run_dataflow


@pytest.fixture
def default_thresholds() -> Iterator[tuple[int, int, int]]:
    previous = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*previous)


def test_a_flow_runs_under_the_streaming_thresholds_and_gives_them_back(
    default_thresholds: tuple[int, int, int],
) -> None:
    seen: list[tuple[int, int, int]] = []
    flow = Dataflow("collector_probe")
    numbers = op.input("in", flow, TestingSource(range(3)))
    op.output("out", op.map("observe", numbers, lambda x: seen.append(gc.get_threshold()) or x),
              TestingSink([]))  # fmt: skip
    run_dataflow(flow, workers=1, recovery_dir=None)
    assert seen == [STREAMING_THRESHOLDS] * 3
    assert gc.get_threshold() == default_thresholds


def test_higher_thresholds_stay_and_an_exception_gives_them_back(
    default_thresholds: tuple[int, int, int],
) -> None:
    gc.set_threshold(100_000, 5, 50)
    with streaming_collector() as used:
        assert used == (100_000, 20, 50)  # each the higher of the two
    assert gc.get_threshold() == (100_000, 5, 50)
    gc.set_threshold(*default_thresholds)
    with pytest.raises(RuntimeError), streaming_collector():
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == default_thresholds
