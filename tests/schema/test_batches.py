"""The per-stage batch types (``privstream.schema.batches``): append, merge, first wins, size."""

from __future__ import annotations

import numpy as np

from privstream.schema.batches import AnonymousCounts, DenseValues, RecordMultiset, SparseVectors


def test_dense_values_keep_the_first_report_and_merge_only_blanks() -> None:
    batch = DenseValues.blank(5)
    refused = batch.append(np.array([0, 3]), np.array([1.0, 0.0]))
    assert refused.tolist() == [False, False] and len(batch) == 2
    refused = batch.append(np.array([3, 4]), np.array([1.0, 1.0]))
    assert refused.tolist() == [True, False]
    assert batch.values[3] == 0.0 and len(batch) == 3
    other = DenseValues(np.array([9.0, 9.0, 9.0, 9.0, np.nan]))
    batch.merge(other)
    assert batch.values.tolist() == [1.0, 9.0, 9.0, 0.0, 1.0]


def test_dense_vectors_are_rows_of_d_and_the_buffer_is_wrapped_not_copied() -> None:
    buffer = np.full((3, 2), np.nan)
    batch = DenseValues(buffer)
    batch.append(np.array([1]), np.array([[0.5, 0.25]]))
    assert buffer[1].tolist() == [0.5, 0.25] and len(batch) == 1
    assert batch.append(np.array([1]), np.array([[1.0, 1.0]])).tolist() == [True]
    assert DenseValues.blank(4, 3).values.shape == (4, 3)


def test_a_record_multiset_keeps_every_record() -> None:
    batch = RecordMultiset()
    batch.append("u", 1)
    batch.append("u", 1)
    other = RecordMultiset()
    other.append("v", 2)
    other.append("u", 3)
    batch.merge(other)
    assert batch.records == {"u": [1, 1, 3], "v": [2]} and len(batch) == 4


def test_sparse_vectors_hold_only_the_changed_coordinates() -> None:
    batch = SparseVectors(d=1000)
    assert batch.append("u", {3: 1.0, 999: 1.0})
    assert not batch.append("u", {4: 1.0})  # first report wins
    other = SparseVectors(d=1000)
    other.append("u", {5: 1.0})
    other.append("v", {0: 1.0})
    batch.merge(other)
    assert batch.changes == {"u": {3: 1.0, 999: 1.0}, "v": {0: 1.0}}
    assert len(batch) == 2 and batch.entries() == 3
    try:
        batch.append("w", {1000: 1.0})
    except ValueError as exc:
        assert "0..999" in str(exc)
    else:
        raise AssertionError("a coordinate outside d was accepted")


def test_anonymous_counts_add_up_without_users() -> None:
    batch = AnonymousCounts()
    batch.append("a")
    batch.append("b", 2)
    other = AnonymousCounts()
    other.append("a", 3)
    batch.merge(other)
    assert batch.counts == {"a": 4, "b": 2} and len(batch) == 6
