"""The CSV event parser (design §5): named columns, a skipped header, the JSON record checks."""

from __future__ import annotations

import numpy as np

from privstream.connectors.csv_events import parse_csv_lines
from privstream.schema.events import DeadLetter, EventBatch


def test_csv_with_header_and_default_stream() -> None:
    lines = ["user,slot,value", "alice,1,0", "bob,1,2", "carol,x,1", "dave,2"]
    items = parse_csv_lines(lines, default_stream="file")
    (batch,) = [b for b in items if isinstance(b, EventBatch)]
    assert batch.stream == "file" and batch.users.tolist() == ["alice", "bob"]
    assert np.array_equal(batch.values, [0.0, 2.0])
    assert [d.reason for d in items if isinstance(d, DeadLetter)] == [
        "invalid_type",
        "malformed_csv",
    ]


def test_csv_columns_may_name_the_stream() -> None:
    lines = ["stream,user,slot,value", "a,u1,3,1", "b,u2,3,0", "a,u3,-1,1", "a,u4,3,1.5e999"]
    items = parse_csv_lines(lines, columns=("stream", "user", "slot", "value"), streams=["a"])
    (batch,) = [b for b in items if isinstance(b, EventBatch)]
    assert batch.users.tolist() == ["u1"] and batch.slots.tolist() == [3]
    assert [d.reason for d in items if isinstance(d, DeadLetter)] == [
        "unknown_stream", "negative_slot", "invalid_type"
    ]  # fmt: skip
