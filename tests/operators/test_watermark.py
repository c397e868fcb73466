"""Per-partition watermarks: a stream's slot closes once every input partition has passed it."""

from __future__ import annotations

import copy
import pickle

import pytest

from privstream.operators.watermark import PartitionWatermarks


def test_one_partition_passes_by_data_or_marker() -> None:
    marks = PartitionWatermarks(1)
    assert marks.closable(lateness=1) is None
    marks.observe(0, 5)
    assert marks.passed(0, lateness=1) == 3  # max slot − lateness − 1
    assert marks.closable(lateness=1) == 3
    assert marks.closable(lateness=0) == 4
    marks.mark(0, 7)
    assert marks.closable(lateness=1) == 7  # the marker is ahead of the data


def test_the_stream_waits_for_every_partition() -> None:
    marks = PartitionWatermarks(3)
    marks.observe(0, 10)
    marks.observe(1, 4)
    assert marks.closable(lateness=1) is None  # partition 2 has delivered nothing
    marks.mark(2, 6)
    assert marks.closable(lateness=1) == 2  # partition 1: 4 − 1 − 1
    marks.observe(1, 20)
    assert marks.closable(lateness=1) == 6  # now partition 2's marker is the least
    marks.mark(2, 30)
    assert marks.closable(lateness=1) == 8  # partition 0: 10 − 1 − 1


def test_progress_never_goes_back() -> None:
    marks = PartitionWatermarks(2)
    marks.observe(0, 9)
    marks.observe(0, 3)  # a late-ish event after a later one
    marks.mark(1, 8)
    marks.mark(1, 2)  # an old marker repeated
    assert marks.max_slots == [9, None] and marks.marks == [None, 8]
    assert marks.closable(lateness=0) == 8


def test_the_result_does_not_depend_on_the_interleaving() -> None:
    updates = [(0, "observe", 4), (1, "observe", 6), (2, "mark", 3), (0, "mark", 5),
               (1, "mark", 2), (2, "observe", 9), (0, "observe", 7)]  # fmt: skip
    results = set()
    for shift in range(len(updates)):
        marks = PartitionWatermarks(3)
        for partition, kind, slot in updates[shift:] + updates[:shift]:
            getattr(marks, kind)(partition, slot)
        results.add((marks.closable(lateness=1), tuple(marks.max_slots), tuple(marks.marks)))
    assert results == {(4, (7, 6, 9), (5, 2, 3))}


def test_partitions_out_of_range_and_bad_counts_are_refused() -> None:
    marks = PartitionWatermarks(2)
    with pytest.raises(ValueError, match=r"input partition 2.*configured for 2"):
        marks.observe(2, 1)
    with pytest.raises(ValueError, match="input partition -1"):
        marks.mark(-1, 1)
    with pytest.raises(ValueError, match="partitions must be an integer >= 1"):
        PartitionWatermarks(0)
    with pytest.raises(ValueError, match="progress of 2 partitions"):
        PartitionWatermarks(2, [None], [None])


def test_it_survives_a_snapshot() -> None:
    marks = PartitionWatermarks(2)
    marks.observe(0, 4)
    marks.mark(1, 3)
    for copied in (copy.deepcopy(marks), pickle.loads(pickle.dumps(marks))):
        assert copied == marks and copied.closable(lateness=0) == 3
        copied.observe(1, 10)
        assert marks.max_slots == [4, None]  # the copy is independent
