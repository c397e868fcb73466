"""Fuzzing of every decoder (issue 18 §4, issue 27 items 1 and 2): hostile JSON, CSV, Kafka
polls and registration tables never raise, and every line's fate depends on the line alone.

Before: a 5,000-digit integer raised ``ValueError`` (a 320-digit one ``OverflowError``) and a
field nested 1,000 deep ``RecursionError`` out of the parser (the flow exited 1 on every
restart); a value of the wrong shape first in a batch turned the good events after it into
``invalid_type`` dead letters. Invariants checked on every case:

* nothing raises; no line hits the parser's catch-all (``UNREADABLE``);
* each non-blank line is exactly one accepted row, one marker or one dead letter;
* parsing the lines in any cut of batches (one by one, in chunks, whole) gives the same rows,
  markers and dead letters, per stream in the same order;
* the batch fast path, where it answers, equals the line-by-line path.

Hypothesis drives structured hostile lines (``max_examples`` per test); a seeded loop adds
10⁵ random and mutated byte strings. The whole module runs in about 20 s on one core.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privstream.connectors.csv_events import parse_csv_lines
from privstream.connectors.json_events import _decode_line, parse_json_batch, parse_json_lines
from privstream.connectors.kafka import RawBatch, parse_raw_batch
from privstream.connectors.parsing import MAX_DEPTH, UNREADABLE, parse_lines
from privstream.connectors.registrations import load_preferences
from privstream.schema.events import MAX_EVENT_BYTES, DeadLetter, EventBatch, line_text

STREAMS = ("a", "b", "v")
SHAPES = {"a": 0, "b": 0, "v": 2}  # "v" takes 2-vectors, the others one number

HUGE = "9" * 5000  # beyond Python's int-string conversion limit (4,300 digits)
BIG = "9" * 320  # beyond the float range
DEEP = ["[" * n + "]" * n for n in (MAX_DEPTH - 1, MAX_DEPTH + 1, 1000, 5000)] + [
    '{"a":' * 1000 + "1" + "}" * 1000,
    "[" * 1000,
    '"' + "[" * 2000 + '"',  # brackets inside a string do not nest
]
STREAM_POOL = ['"a"', '"b"', '"v"', '""', '"zz"', "1", "null", '["a"]', '"a\\ud800"', '"\\u00e9"']
USER_POOL = ['"u1"', '"u2"', '"u3"', '""', "7", "-3", HUGE, BIG, "null", "true", '"\\ud800"',
             '"\\ud83d\\ude00"', '"\\u0000"', '{"x":1}', "1.5", '"' + "u" * 3000 + '"']  # fmt: skip
SLOT_POOL = ["1", "2", "3", "0", "-1", "4.0", "4.5", str(2**62), str(2**64), HUGE, "-" + HUGE,
             BIG, "1e400", "NaN", "Infinity", '"3"', "null", "true", "[1]"]  # fmt: skip
VALUE_POOL = ["0", "1", "3", "0.5", "-2", "1e308", "1e400", "-1e400", "NaN", "Infinity",
              "-Infinity", BIG, HUGE, "-" + HUGE, "[0]", "[0.1,0.2]", "[0.1,0.2,0.3]", "[]",
              "[[1]]", '["1"]', "[NaN]", '"1"', "null", "true", "{}", "[" + ",".join("1" * 65) + "]",
              "[1," + HUGE + "]"]  # fmt: skip
EPSILON_POOL = ["1", "0.5", "0", "-1", "NaN", "1e400", HUGE, BIG, '"1"', "null", "true"]
WINDOW_POOL = ["1", "4", "0", "-1", str(2**62), "4.0", "4.5", HUGE, "null", '"4"']
MARK_POOL = ["1", "3", "0", "-1", str(2**62), str(2**64), HUGE, "2.0", "null", '"1"', "true"]
TAG_POOL = ['"00ff"', '"zz"', "1", "null", "[1]", '"' + "f" * 300 + '"']  # extra marker fields
JUNK_POOL = [*DEEP, HUGE, "NaN", '"' + "x" * 70_000 + '"', '{"b":[1,{"c":null}]}']
KEYS = {"stream": STREAM_POOL, "user": USER_POOL, "slot": SLOT_POOL, "value": VALUE_POOL,
        "epsilon": EPSILON_POOL, "window": WINDOW_POOL, "end_of_slot": MARK_POOL,
        "tag": TAG_POOL, "ts": ['"2024-01-01T00:00:00Z"', '"x"', "1"], "junk": JUNK_POOL}  # fmt: skip
GOOD = {"stream": '"a"', "user": '"u1"', "slot": "1", "value": "1"}
MUTATIONS = ("none", "none", "none", "truncate", "byte", "invalid_utf8", "two_values",
             "spliced", "spaces", "blank")  # fmt: skip


def render(fields: Sequence[tuple[str, str]]) -> str:
    """A JSON object text from (key, literal) pairs, duplicates kept."""
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields) + "}"


def mutate(line: bytes, how: str, rng: random.Random) -> bytes:
    """A line broken in one of the ways a hostile or broken producer breaks it."""
    cut = rng.randrange(len(line) + 1)
    if how == "truncate":
        return line[:cut]
    if how == "byte":
        return line[:cut] + bytes([rng.randrange(256)]) + line[cut:]
    if how == "invalid_utf8":
        return (
            line[:cut] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]) + line[cut:]
        )
    if how == "two_values":
        return line + b" " + line
    if how == "spliced":  # one line completing another's JSON only if lines were joined
        return rng.choice([b"},{", b'"},{"stream":"a",', b"]", b","]) + line
    if how == "spaces":
        return b" \t" + line + b"\r\x0c "
    if how == "blank":
        return rng.choice([b"", b"  ", b"\n"])
    return line


def hostile_line(rng: random.Random) -> bytes:
    """One structured hostile line: a random subset of fields from the hostile pools, good
    ones mixed in, a marker now and then, duplicate keys, then maybe a mutation."""
    fields = [(k, v) for k, v in GOOD.items() if rng.random() < 0.8]
    for key, pool in KEYS.items():
        if rng.random() < 0.25:
            fields.append((key, rng.choice(pool)))
    if rng.random() < 0.15:  # a marker: no user
        fields = [(k, v) for k, v in fields if k != "user"] + [
            ("end_of_slot", rng.choice(MARK_POOL))
        ]
    rng.shuffle(fields)
    line = render(fields).encode("utf-8", "surrogatepass")
    return mutate(line, rng.choice(MUTATIONS), rng)


@st.composite
def hostile_lines(draw: st.DrawFn) -> bytes:
    """Hypothesis's structured hostile line (the pools above, shrinkable choices)."""
    chosen = draw(st.lists(st.sampled_from(sorted(KEYS) + ["good"] * 4), max_size=8))
    fields = [(k, v) for k, v in GOOD.items() if "good" in chosen or draw(st.booleans())]
    fields += [(k, draw(st.sampled_from(KEYS[k]))) for k in chosen if k != "good"]
    if draw(st.booleans()) and draw(st.booleans()):
        fields = [(k, v) for k, v in fields if k != "user"]
        fields.append(("end_of_slot", draw(st.sampled_from(MARK_POOL))))
    fields = draw(st.permutations(fields))
    line = render(fields).encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(MUTATIONS))
    return mutate(line, how, random.Random(draw(st.integers(0, 2**32))))


# ----------------------------------------------------------------------------- invariants

Outcome = tuple[Any, ...]


def _num(x: float) -> Any:
    return None if math.isnan(x) else x


def outcomes(
    parsed: list[EventBatch | DeadLetter],
) -> tuple[dict[str, list[Outcome]], Counter[Any]]:
    """Per stream, its rows and markers in order; and the dead letters as a multiset."""
    seq: dict[str, list[Outcome]] = {}
    dead: Counter[Any] = Counter()
    for item in parsed:
        if isinstance(item, DeadLetter):
            assert item.detail != UNREADABLE, item
            dead[(item.reason, item.stream, item.detail, item.payload_bytes(), item.offset)] += 1
            continue
        rows = seq.setdefault(item.stream, [])
        for i in range(len(item)):
            value = item.values[i]
            eps = None if item.epsilons is None else _num(float(item.epsilons[i]))
            win = None if item.windows is None else int(item.windows[i]) or None
            raw: Any = item.raw[i] if item.raw is not None else None
            if item.offsets is not None and item.lengths is not None:  # a Kafka poll's row
                raw = (item.topic, item.partition, int(item.offsets[i]), int(item.lengths[i]))
            rows.append(("row", int(item.slots[i]), str(item.users[i]),
                         tuple(value.tolist()) if value.ndim else float(value), eps, win, raw))  # fmt: skip
        if item.complete_through is not None:
            rows.append(("mark", item.complete_through))
    return seq, dead


def _counted(parsed: list[EventBatch | DeadLetter]) -> int:
    return sum(len(x) + (x.complete_through is not None) if isinstance(x, EventBatch) else 1
               for x in parsed)  # fmt: skip


Parse = Callable[[list[bytes], int], list[EventBatch | DeadLetter]]
"""A parser of a batch of lines and the index of its first line in the input."""


def check_cuts(
    lines: list[bytes], parse: Parse, cuts: Sequence[int], ordered: bool, blanks: bool = False
) -> None:
    """``parse`` never raises, gives one outcome per non-blank line (per line with ``blanks``),
    and the same outcomes whatever the batches: whole, one line at a time, and chunks of each
    size in ``cuts``."""
    whole = parse(lines, 0)
    assert _counted(whole) == sum(1 for line in lines if blanks or line_text(line).strip()), lines
    expected = outcomes(whole)
    for size in (1, *cuts):
        pieces = [parse(lines[i : i + size], i) for i in range(0, len(lines), size)]
        got = outcomes([item for piece in pieces for item in piece])
        assert got[1] == expected[1], (size, lines)
        if ordered:
            assert got[0] == expected[0], (size, lines)
        else:  # (one batch per value shape of a stream without a known shape)
            assert {k: Counter(v) for k, v in got[0].items()} == {
                k: Counter(v) for k, v in expected[0].items()
            }, (size, lines)


def check_fast_path(lines: list[bytes], shapes: dict[str, int] | None) -> None:
    """Where the fast path answers, it equals the line-by-line path."""
    streams = list(STREAMS) if shapes else None
    fast = parse_json_batch(lines, streams=streams, shapes=shapes)
    if fast is not None:
        slow = parse_lines(lines, _decode_line, streams, None, None, MAX_EVENT_BYTES, shapes)
        assert outcomes(fast) == outcomes(slow), lines


def json_shaped(lines: list[bytes], _start: int = 0) -> list[EventBatch | DeadLetter]:
    return parse_json_lines(lines, streams=STREAMS, shapes=SHAPES)


def json_unshaped(lines: list[bytes], _start: int = 0) -> list[EventBatch | DeadLetter]:
    return parse_json_lines(lines, default_stream="a")


def json_every(lines: list[bytes], _start: int = 0) -> list[EventBatch | DeadLetter]:
    """A file flow's parse: one task (here one number per event) for every stream."""
    return parse_json_lines(lines, default_stream="a", shapes=0)


def json_text(lines: list[bytes], _start: int = 0) -> list[EventBatch | DeadLetter]:
    """File lines: text (a text-mode file has no invalid UTF-8 left)."""
    text = [line.decode("utf-8", "replace") for line in lines]
    return parse_json_lines(text, streams=STREAMS, shapes=SHAPES)


def kafka_poll(lines: list[bytes], start: int) -> list[EventBatch | DeadLetter]:
    """A poll of partition 3 whose first message has offset ``100 + start``."""
    poll = RawBatch("in", 3, 100 + start, list(lines))
    return parse_raw_batch(poll, streams=STREAMS, shapes=SHAPES)


def csv_shaped(lines: list[bytes], _start: int = 0) -> list[EventBatch | DeadLetter]:
    return parse_csv_lines(lines, default_stream="a", streams=STREAMS, shapes=SHAPES)


# ----------------------------------------------------------------------------- the attacks


@pytest.mark.parametrize("parse", [json_shaped, json_unshaped, json_text])
@pytest.mark.parametrize(
    "hostile",
    [
        b'{"stream":"a","user":"u9","slot":' + HUGE.encode() + b',"value":1}',
        b'{"stream":"a","user":"u9","slot":1,"value":' + BIG.encode() + b"}",
        b'{"stream":"a","user":"u9","slot":1,"value":1,"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"stream":"a","end_of_slot":' + HUGE.encode() + b"}",
        b'{"stream":"a","user":"u9","slot":1,"value":[0]}',
    ],
    ids=["5000-digit slot", "320-digit value", "1000-deep field", "5000-digit marker", "[0]"],
)
def test_a_hostile_line_first_in_its_batch_is_one_dead_letter(hostile: bytes, parse: Parse) -> None:
    """Each raised out of the parser, or (``[0]`` first) made all good events dead letters."""
    good = [b'{"stream":"a","user":"u%d","slot":1,"value":1}' % i for i in range(500)]
    parsed = parse([hostile, *good], 0)
    rows = sum(len(x) for x in parsed if isinstance(x, EventBatch) and x.values.ndim == 1)
    dead = [x for x in parsed if isinstance(x, DeadLetter)]
    if parse is json_unshaped and hostile.endswith(b"[0]}"):  # its own batch, for the operator
        assert rows == 500 and not dead
        return
    assert rows == 500
    assert [(d.reason, d.payload_bytes()) for d in dead] == [(dead[0].reason, hostile)]
    assert dead[0].reason in ("invalid_type", "malformed_json")


def test_a_two_vector_in_a_three_vector_stream_drops_only_itself() -> None:
    good = [b'{"stream":"p","user":"u%d","slot":1,"value":[0.1,0.2,0.3]}' % i for i in range(500)]
    bad = b'{"stream":"p","user":"x","slot":1,"value":[0.1,0.2]}'
    parsed = parse_json_lines([bad, *good], streams=["p"], shapes={"p": 3})
    assert [len(x) for x in parsed if isinstance(x, EventBatch)] == [500]
    assert [(d.reason, d.detail) for d in parsed if isinstance(d, DeadLetter)] == [
        ("invalid_type", "value must be a list of 3 numbers: the stream's task takes 3-vectors")
    ]


def test_lines_that_complete_each_other_only_when_joined_are_each_malformed() -> None:
    """Two messages that are one JSON text only when a batch joins them (and a third holding
    two events) were accepted as events by the batch path, and malformed one by one."""
    a = b'{"stream":"a","user":"u1","slot":1,"value":1},{"stream":"a","user":"u2","slot":1,"value":1,"x":"'
    b = b'"}'
    parsed = parse_json_lines([a, b], streams=["a"])
    assert [d.reason for d in parsed if isinstance(d, DeadLetter)] == ["malformed_json"] * 2


def test_a_null_user_with_end_of_slot_is_no_marker_on_either_path() -> None:
    line = b'{"stream":"a","user":null,"end_of_slot":3}'
    good = b'{"stream":"a","user":"u1","slot":1,"value":1}'
    for lines in ([line], [good, line]):
        parsed = parse_json_lines(lines, streams=["a"])
        assert not [x for x in parsed if isinstance(x, EventBatch) and x.complete_through]
        assert [d.reason for d in parsed if isinstance(d, DeadLetter)] == ["missing_field"]


def test_user_and_stream_ids_must_be_valid_unicode() -> None:
    parsed = parse_json_lines([b'{"stream":"a","user":"\\ud800","slot":1,"value":1}'])
    assert [(d.reason, d.detail) for d in parsed if isinstance(d, DeadLetter)] == [
        ("invalid_type", "user must be a non-empty string")
    ]


# ----------------------------------------------------------------------------- fuzzing


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_lines(), min_size=1, max_size=12), st.integers(2, 5))
def test_hostile_json_lines_never_raise_and_judge_each_line_alone(
    lines: list[bytes], cut: int
) -> None:
    parsers = ((json_shaped, True), (json_unshaped, False), (json_text, True), (json_every, True))
    for parse, ordered in parsers:
        check_cuts(lines, parse, [cut], ordered)
    check_fast_path(lines, SHAPES)
    check_fast_path(lines, None)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_lines(), min_size=1, max_size=12), st.integers(2, 5))
def test_hostile_kafka_polls_never_raise_and_locate_each_dead_letter(
    lines: list[bytes], cut: int
) -> None:
    """Offsets included: every dead letter names its own message, whatever the poll, and so
    does every accepted row (its offset and length, not its bytes, which stay behind)."""
    check_cuts(lines, kafka_poll, [cut], ordered=True, blanks=True)
    for item in kafka_poll(lines, 0):
        if isinstance(item, DeadLetter):
            assert lines[item.offset - 100] == item.payload_bytes()  # type: ignore[operator]
            continue
        assert item.raw is None and item.topic == "in" and item.partition == 3
        assert item.offsets is not None and item.lengths is not None
        for i, offset in enumerate(item.offsets.tolist()):
            message = lines[offset - 100]
            assert len(message) == item.lengths[i]
            (alone,) = [
                b
                for b in kafka_poll([message], offset - 100)
                if not isinstance(b, DeadLetter) and len(b)
            ]
            assert isinstance(alone, EventBatch) and alone.users[0] == item.users[i]
            assert alone.offsets is not None and alone.offsets[0] == offset


CSV_FIELDS = ["u1", "1", "0", "-1", "4.5", "NaN", "inf", "-inf", HUGE, "-" + HUGE, BIG, "1e400",
              "1_0", '"a,b"', '"', '""', "\x00", "", "é", "\udcff", "x" * 200_000]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.lists(st.sampled_from(CSV_FIELDS), min_size=1, max_size=4), min_size=1, max_size=8),
    st.integers(2, 4),
)
def test_hostile_csv_never_raises_and_judges_each_line_alone(
    rows: list[list[str]], cut: int
) -> None:
    lines = [",".join(r).encode("utf-8", "surrogateescape") for r in rows]
    check_cuts(lines, csv_shaped, [cut], ordered=True)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_lines(), min_size=1, max_size=4), st.booleans())
def test_a_hostile_registration_table_raises_only_a_value_error(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], as_csv: bool
) -> None:
    """The trusted table, read once at start: anything in it is a ``ValueError`` naming the
    line (an operator's message), never a traceback of another kind."""
    path = tmp_path_factory.mktemp("prefs") / ("t.csv" if as_csv else "t.jsonl")
    path.write_bytes(b"\n".join(lines))
    try:
        load_preferences(path)
    except ValueError as exc:
        assert str(path) in str(exc)


RANDOM_CASES = 100_000


def random_line(rng: random.Random) -> bytes:
    """Random bytes, random JSON token soup, or a structured hostile line."""
    kind = rng.random()
    if kind < 0.3:
        return rng.randbytes(rng.randrange(40))
    if kind < 0.6:
        tokens = ["{", "}", "[", "]", ",", ":", '"stream"', '"user"', '"slot"', '"value"', '"a"',
                  '"end_of_slot"', "1", "-1", "0.5", "NaN", "null", "true", '"', "\\", " ", HUGE]  # fmt: skip
        return "".join(rng.choice(tokens) for _ in range(rng.randrange(16))).encode()
    return hostile_line(rng)


def test_a_hundred_thousand_random_lines_never_raise_and_judge_each_line_alone() -> None:
    """10⁵ seeded random lines, 20 per batch, through the JSON (bytes), Kafka and CSV paths;
    each batch also one line at a time and in chunks of 7."""
    rng = random.Random(20240518)
    parsers: list[tuple[Parse, bool, bool]] = [
        (json_shaped, True, False), (kafka_poll, True, True), (csv_shaped, True, False),
        (json_unshaped, False, False),
    ]  # fmt: skip
    done = 0
    while done < RANDOM_CASES:
        lines = [random_line(rng) for _ in range(20)]
        parse, ordered, blanks = parsers[(done // 20) % len(parsers)]
        check_cuts(lines, parse, [7], ordered, blanks)
        done += len(lines)


def test_the_fuzzing_covers_every_hostile_kind(tmp_path: Path) -> None:
    """The pools reach each failure the audits found, and each gives its dead letter."""
    parsed = json_shaped(
        [
            render([*GOOD.items(), ("junk", "[" * 1000 + "]" * 1000)]).encode(),
            render([("stream", '"a"'), ("user", '"u"'), ("slot", HUGE), ("value", "1")]).encode(),
            render(
                [("stream", '"v"'), ("user", '"u"'), ("slot", "1"), ("value", "[0.1,0.2,0.3]")]
            ).encode(),
            render([("stream", '"a"'), ("end_of_slot", "1"), ("tag", '"zz"')]).encode(),
        ]
    )
    reasons = [(d.reason, d.detail) for d in parsed if isinstance(d, DeadLetter)]
    assert reasons == [
        ("malformed_json", f"nested deeper than {MAX_DEPTH} levels"),
        ("invalid_type", "slot must be an integer"),
        ("invalid_type", "value must be a list of 2 numbers: the stream's task takes 2-vectors"),
    ]
    assert [b.complete_through for b in parsed if isinstance(b, EventBatch)] == [1]
