"""The JSON-lines event parser (design §5): accepted rows per stream, dead letters with
reasons, and the batch fast path agreeing with the line-by-line checks."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.connectors.json_events import _fast_json, parse_json_lines
from privstream.connectors.parsing import SlotClock
from privstream.schema.events import REASONS, DeadLetter, EventBatch


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
        (json.dumps({"stream": "a", "user": "u", "slot": 1, "value": [1, "x"]}), "invalid_type"),
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
    clock = SlotClock(datetime(2026, 1, 1, tzinfo=UTC), timedelta(minutes=10))
    lines = [
        json.dumps({"stream": "a", "user": "u", "ts": "2026-01-01T00:25:00Z", "value": 1}),
        json.dumps({"stream": "a", "user": "v", "ts": "not a time", "value": 1}),
    ]
    batches, dead = split(parse_json_lines(lines, clock=clock))
    assert batches["a"].slots.tolist() == [2]
    assert [d.reason for d in dead] == ["invalid_type"]
    with pytest.raises(ValueError, match="positive"):
        SlotClock(datetime(2026, 1, 1, tzinfo=UTC), timedelta(0))


def test_dead_letters_serialise_without_loss() -> None:
    (dead,) = parse_json_lines(["{oops"])
    assert isinstance(dead, DeadLetter)
    assert dead.to_dict() == {
        "reason": "malformed_json",
        "stream": None,
        "detail": "not valid JSON",
        "payload": "{oops",
    }


def _normal(items: list[EventBatch | DeadLetter]) -> list[tuple[object, ...]]:
    """Everything a parse result says, with raw lines as text (str and bytes input agree)."""
    out: list[tuple[object, ...]] = []
    for item in items:
        if isinstance(item, DeadLetter):
            out.append(("dead", item.reason, item.stream, item.payload, item.detail))
        else:
            raw = (
                None
                if item.raw is None
                else [r if isinstance(r, str) else r.decode() for r in item.raw]
            )
            out.append(
                ("batch", item.stream, item.slots.dtype.str, item.slots.tolist(), item.users.dtype.str,
                 item.users.tolist(), item.values.dtype.str, item.values.tolist(), raw, item.complete_through)
            )  # fmt: skip
    return out


def _event(stream: str, user: str, slot: int) -> str:
    return json.dumps({"stream": stream, "user": user, "slot": slot, "value": slot % 3})


def _marker(stream: str, slot: object) -> str:
    return json.dumps({"stream": stream, "end_of_slot": slot})


MARKER_BATCHES = [
    [_event("a", "u1", 1), _event("a", "u2", 1), _marker("a", 1), _event("a", "u1", 2)],
    [_marker("a", 1), _marker("a", 2), _event("a", "u1", 3), _marker("a", 3)],
    [_marker("a", 5)],
    [_marker("a", 1), _marker("a", 1)],
    [_event("a", "u1", 1), _marker("a", 1)],
    [_event("a", "u1", 1), _marker("b", 1), _event("b", "u1", 1), _event("a", "u2", 1)],
    [_event("a", "u1", 1), _marker("a", -1)],
    [_event("a", "u1", 1), _marker("a", True)],
    [_event("a", "u1", 1), _marker("a", 1.0)],
    [_event("a", "u1", 1), _marker("", 1)],
    [_event("a", "u1", 1), _marker("zzz", 1)],
    [_event("a", "u1", 1), json.dumps({"end_of_slot": 1})],
    [_event("a", "u1", 1), json.dumps({"stream": "a"})],
    [json.dumps({"stream": "a", "user": "u1", "slot": 1, "value": 1, "end_of_slot": 9})],
    ['{"stream": "a", "end\\u005fof_slot": 1}', _event("a", "u1", 1)],
    [_event("a", "u1", 1), '"end_of_slot"'],
    [_event("a", "end_of_slot", 1), _marker("a", 1)],
]


@pytest.mark.parametrize("lines", MARKER_BATCHES)
@pytest.mark.parametrize("streams", [None, ["a", "b"], ["a"]])
def test_the_batch_fast_path_parses_markers_like_the_line_by_line_path(
    lines: list[str], streams: list[str] | None
) -> None:
    # str lines always take the line-by-line path; bytes lines try the batch fast path first.
    by_line = parse_json_lines(lines, streams=streams)
    batched = parse_json_lines([line.encode() for line in lines], streams=streams)
    assert _normal(batched) == _normal(by_line)


def test_markers_of_a_single_stream_batch_stay_on_the_fast_path() -> None:
    lines = [line.encode() for line in MARKER_BATCHES[1]]
    fast = _fast_json(lines, frozenset({"a"}), 1000)
    assert fast is not None
    assert [(len(b), b.complete_through) for b in fast if isinstance(b, EventBatch)] == [
        (0, 1), (0, 2), (1, 3)
    ]  # fmt: skip


def test_invalid_utf8_inside_a_string_leaves_the_fast_path_without_failing() -> None:
    """msgspec raises ``UnicodeDecodeError`` (not a ``DecodeError``) for invalid UTF-8 inside a
    JSON string: the poll goes line by line instead of failing the flow, and that line is a
    ``malformed_json`` dead letter (replacing the bytes would merge different user ids)."""
    bad = b'{"stream":"a","user":"\xff","slot":1,"value":1}'
    lines = [bad, _event("a", "u1", 1).encode()]
    assert _fast_json(lines, frozenset({"a"}), 1000) is None
    out = parse_json_lines(lines, streams=["a"])
    batches = [b for b in out if isinstance(b, EventBatch)]
    assert [user for b in batches for user in b.users.tolist()] == ["u1"]
    (letter,) = [d for d in out if isinstance(d, DeadLetter)]
    assert (letter.reason, letter.detail, letter.payload_bytes()) == (
        "malformed_json",
        "not valid UTF-8",
        bad,
    )


LINE_POOL = sorted({line for batch in MARKER_BATCHES for line in batch} | {"{oops", "[1]"})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LINE_POOL), min_size=1, max_size=12))
def test_any_mix_of_events_and_markers_parses_the_same_on_both_paths(lines: list[str]) -> None:
    batched = parse_json_lines([line.encode() for line in lines], streams=["a", "b"])
    assert _normal(batched) == _normal(parse_json_lines(lines, streams=["a", "b"]))


def test_list_values_are_judged_against_the_streams_shape_one_by_one() -> None:
    """Each value against its stream's shape (the task's): not against the batch's first."""
    lines = [
        '{"stream": "v", "user": "c", "slot": 1, "value": [1.0]}',
        '{"stream": "v", "user": "a", "slot": 1, "value": [0.5, -1]}',
        '{"stream": "v", "user": "b", "slot": 1, "value": [0.25, 2.0]}',
        '{"stream": "v", "user": "d", "slot": 1, "value": []}',
        '{"stream": "v", "user": "e", "slot": 1, "value": [1, NaN]}',
    ]
    out = parse_json_lines(lines, shapes={"v": 2})
    batches = [x for x in out if isinstance(x, EventBatch)]
    letters = [x for x in out if isinstance(x, DeadLetter)]
    assert len(batches) == 1 and batches[0].values.tolist() == [[0.5, -1.0], [0.25, 2.0]]
    assert [d.reason for d in letters] == ["invalid_type"] * 3
    assert "list of 2 numbers" in letters[0].detail
    # without a known shape, one batch per shape: the operator refuses those its task cannot take
    unshaped = [x for x in parse_json_lines(lines) if isinstance(x, EventBatch)]
    assert [b.values.tolist() for b in unshaped] == [[[1.0]], [[0.5, -1.0], [0.25, 2.0]]]


def test_a_ts_event_without_a_clock_is_a_dead_letter_that_says_why() -> None:
    """Issue 27 item 13: the README promised ``ts`` "with a slot clock" that no command can
    configure; such an event was a bare ``missing_field: slot``. It now says the flow has no
    slot clock (send ``slot``)."""
    line = json.dumps({"stream": "a", "user": "u", "ts": "2024-01-01T00:00:00Z", "value": 1})
    _batches, letters = split(parse_json_lines([line], streams=["a"]))
    (letter,) = letters
    assert letter.reason == "missing_field"
    assert "slot clock" in letter.detail


def test_markers_of_a_many_stream_poll_stay_on_the_fast_path_and_cut_like_the_builder() -> None:
    """Markers in a poll of several streams (every poll of a spread topic holding a slot's end)
    are cut on the fast path exactly as the line-by-line ``Builder`` cuts them: batch by batch
    in its order, each with its rows, raw lines, line numbers and marker tag (issue 26)."""
    rng = random.Random(7)
    for _ in range(300):
        lines = []
        for _ in range(rng.randrange(1, 25)):
            stream = rng.choice("abc")
            if rng.random() < 0.25:
                tag = rng.choice([None, "ab12"])
                marker = {"stream": stream, "end_of_slot": rng.randrange(9)}
                lines.append(json.dumps(marker if tag is None else {**marker, "tag": tag}))
            else:
                lines.append(_event(stream, f"u{rng.randrange(5)}", rng.randrange(9)))
        encoded = [line.encode() for line in lines]
        fast = _fast_json(encoded, frozenset("abc"), 1000)
        assert fast is not None, lines
        slow = parse_json_lines(lines, streams=list("abc"))
        assert _normal(fast) == _normal(slow), lines
        tags = [(b.marker_tag, b.lines.tolist()) for b in fast if isinstance(b, EventBatch)]
        assert tags == [(b.marker_tag, b.lines.tolist()) for b in slow if isinstance(b, EventBatch)]
