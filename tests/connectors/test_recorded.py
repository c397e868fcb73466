"""Loading a user's own file of records for benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from privstream.connectors.recorded import load_records


def test_csv_records_with_carry_forward_and_first_report_wins(tmp_path: Path) -> None:
    src = tmp_path / "clicks.csv"
    src.write_text("user,slot,value\nann,5,1\nbob,5,0\nann,5,2\nbob,6,2\ncid,7,1\nbad,x,1\n")
    stream = load_records(src, users=4)
    assert (stream.name, stream.first_slot, stream.slots, stream.users, stream.d) == (
        "clicks",
        5,
        3,
        4,
        3,
    )
    assert np.array_equal(stream.values(1), [1, 0, np.nan, np.nan], equal_nan=True)
    assert np.array_equal(stream.values(2), [1, 2, np.nan, np.nan], equal_nan=True)
    assert np.array_equal(stream.values(3), [1, 2, 1, np.nan], equal_nan=True)
    assert np.allclose(stream.truth(3), [0, 2 / 3, 1 / 3])
    assert [d.reason for d in stream.rejected] == ["invalid_type"]


def test_jsonl_numeric_records(tmp_path: Path) -> None:
    src = tmp_path / "prices.jsonl"
    src.write_text(
        "".join(
            json.dumps({"user": f"u{i}", "slot": 1 + i % 2, "value": 10.0 * i}) + "\n"
            for i in range(6)
        )
    )
    stream = load_records(src, users=6, numeric=True)
    assert stream.d == 1 and stream.slots == 2 and stream.bounds == (0.0, 50.0)
    assert stream.truth(2)[0] == pytest.approx(np.mean([0, 10, 20, 30, 40, 50]))


def test_bad_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_records(tmp_path / "missing.csv", users=3)
    src = tmp_path / "x.csv"
    src.write_text("a,1,0\nb,1,1\nc,1,0\n")
    with pytest.raises(ValueError, match="more than the population"):
        load_records(src, users=2)
    src.write_text("a,1,0.5\n")
    with pytest.raises(ValueError, match="integers"):
        load_records(src, users=2)
