"""The event schema parser (design §5): accepted rows per stream, dead letters with reasons."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from privstream.connectors.events import (
    REASONS,
    DeadLetter,
    EventBatch,
    SlotClock,
    parse_csv_lines,
    parse_json_lines,
)


def split(items: list[EventBatch | DeadLetter]) -> tuple[dict[str, EventBatch], list[DeadLetter]]:
    batches = {b.stream: b for b in items if isinstance(b, EventBatch)}
    return batches, [d for d in items if isinstance(d, DeadLetter)]


def test_valid_events_become_one_columnar_batch_per_stream() -> None:
    lines = [
        json.dumps({"stream": "a", "user": "u1", "slot": 3, "value": 1}),
        json.dumps({"stream": "b", "user": 17, "slot": 4.0, "value": 2.5}),
        json.dumps({"stream": "a", "user": "u2", "slot": 3, "value": 0}).encode(),
    ]
    batches, dead = split(parse_json_lines(lines))
    assert dead == []
    a, b = batches["a"], batches["b"]
    assert a.slots.tolist() == [3, 3] and a.users.tolist() == ["u1", "u2"]
    assert a.values.tolist() == [1.0, 0.0] and a.raw is not None and len(a.raw) == 2
    assert b.users.tolist() == ["17"] and b.slots.tolist() == [4] and b.values.tolist() == [2.5]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{oops", "malformed_json"),
        ("[1, 2]", "invalid_type"),
        (json.dumps({"user": "u", "slot": 1, "value": 1}), "missing_field"),
        (json.dumps({"stream": "a", "slot": 1, "value": 1}), "missing_field"),
        (json.dumps({"stream": "a", "user": "u", "value": 1}), "missing_field"),
        (json.dumps({"stream": "a", "user": "u", "slot": 1}), "missing_field"),
        (json.dumps({"stream": "", "user": "u", "slot": 1, "value": 1}), "invalid_type"),
        (json.dumps({"stream": "a", "user": None, "slot": 1, "value": 1}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": "1", "value": 1}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": 1.5, "value": 1}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": True, "value": 1}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": 1, "value": "x"}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": 1, "value": [1, 2]}), "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": 1, "value": False}), "invalid_type"),
        ('{"stream": "a", "user": "u", "slot": 1, "value": NaN}', "invalid_type"),
        (json.dumps({"stream": "a", "user": "u", "slot": -1, "value": 1}), "negative_slot"),
        (json.dumps({"stream": "zzz", "user": "u", "slot": 1, "value": 1}), "unknown_stream"),
        ("{" + " " * 70_000 + "}", "oversized"),
    ],
)
def test_each_bad_event_gets_its_reason(line: str, reason: str) -> None:
    batches, dead = split(parse_json_lines([line], streams=["a"]))
    assert batches == {}
    assert [d.reason for d in dead] == [reason]
    assert reason in REASONS
    assert dead[0].payload == line.strip()[:256] or reason != "oversized"


def test_timestamps_map_to_slots_with_a_clock() -> None:
    clock = SlotClock(datetime(2026, 1, 1, tzinfo=timezone.utc), timedelta(minutes=10))
    lines = [
        json.dumps({"stream": "a", "user": "u", "ts": "2026-01-01T00:25:00Z", "value": 1}),
        json.dumps({"stream": "a", "user": "v", "ts": "not a time", "value": 1}),
    ]
    batches, dead = split(parse_json_lines(lines, clock=clock))
    assert batches["a"].slots.tolist() == [2]
    assert [d.reason for d in dead] == ["invalid_type"]
    with pytest.raises(ValueError, match="positive"):
        SlotClock(datetime(2026, 1, 1, tzinfo=timezone.utc), timedelta(0))


def test_csv_with_header_and_default_stream() -> None:
    lines = ["user,slot,value", "alice,1,0", "bob,1,2", "carol,x,1", "dave,2"]
    batches, dead = split(parse_csv_lines(lines, default_stream="file"))
    assert batches["file"].users.tolist() == ["alice", "bob"]
    assert np.array_equal(batches["file"].values, [0.0, 2.0])
    assert [d.reason for d in dead] == ["invalid_type", "malformed_csv"]


def test_dead_letters_serialise_without_loss() -> None:
    (dead,) = parse_json_lines(["{oops"])
    assert isinstance(dead, DeadLetter)
    assert dead.to_dict() == {
        "reason": "malformed_json",
        "stream": None,
        "detail": "not valid JSON",
        "payload": "{oops",
    }
