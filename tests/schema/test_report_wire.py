"""``schema.report_wire.decode_messages``: every report-topic message decodes to exactly
what ``schema.protocol.decode_message`` gives it (the report or marker, or the same refusal),
whichever path it took: well-formed reports of every oracle, markers, hostile lines and 20,000
seeded random mutations of good ones."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from privstream.schema import report_wire
from privstream.schema.events import MAX_EVENT_BYTES
from privstream.schema.protocol import (
    CgmStep,
    Close,
    OracleSpec,
    ProtocolError,
    Report,
    Request,
    decode_message,
)
from privstream.schema.report_wire import decode_messages

GRR = Request("country", 3, 1, "LBU.m1", OracleSpec("GRR", 4), 0.25, 10)
OUE = Request("country", 3, 1, "LBU.m1", OracleSpec("OUE", 5), 0.25, 10)
OLH = Request("country", 3, 1, "LBU.m1", OracleSpec("OLH", 8), 1, 10)  # an integer epsilon
HM = Request("temp", 3, 2, "m2", OracleSpec("HM"), 0.5, 10)
CGM = Request("taxi", 3, 1, "m1", OracleSpec("CGM", 1, CgmStep(0.8, 14, 1, 0.05)), 1.0, 48)
GOOD = [
    Report.answering(GRR, "dev-1", 3), Report.answering(OUE, "dév-2", "01101"),
    Report.answering(OLH, "dev-3", [5, 7, 2]), Report.answering(HM, "dev-4", -1.25),
    Report.answering(CGM, "dev-5", {"x": [0.5], "v": 0.25}),
]  # fmt: skip
MARKER = Close("country", 3, 1).signed(b"k" * 32)


def _slow(line: bytes | str) -> Any:
    try:
        return decode_message(line)
    except ProtocolError as exc:
        return exc


def _outcome(x: Any) -> tuple[Any, ...]:
    if isinstance(x, ProtocolError):
        return ("refused", x.reason, x.detail)
    return (type(x).__name__, x, repr(x), x.to_json())


def _same(lines: list[bytes | str]) -> None:
    fast = decode_messages(lines)
    assert len(fast) == len(lines)
    for line, got in zip(lines, fast, strict=True):
        assert _outcome(got) == _outcome(_slow(line)), line


def _good_lines() -> list[bytes]:
    return [r.to_json().encode() for r in GOOD] + [MARKER.to_json().encode()]


def test_good_reports_and_markers_decode_as_the_protocol_decodes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = _good_lines()
    fallbacks: list[bytes | str] = []

    def counted(line: bytes | str) -> Any:
        fallbacks.append(line)
        return decode_message(line)

    monkeypatch.setattr(report_wire, "decode_message", counted)
    decoded = decode_messages(lines)
    assert fallbacks == [lines[-1]]  # every report took the fast path; the marker did not
    monkeypatch.undo()
    assert decoded == [*GOOD, MARKER]
    assert [type(r.epsilon) for r in decoded[:3]] == [float, float, int]  # kept as sent
    assert [r.to_json() for r in decoded[:-1]] == [r.to_json() for r in GOOD]
    _same([*lines, *(line.decode() for line in lines)])  # bytes or text alike


def _with(report: Report, **changes: str) -> str:
    """The report's JSON with some fields' literal JSON text replaced (or added)."""
    obj = {k: json.dumps(v) for k, v in json.loads(report.to_json()).items()}
    obj.update(changes)
    return "{" + ",".join(f'"{k}":{v}' for k, v in obj.items()) + "}"


HUGE = "9" * 5000  # beyond Python's integer-string limit
BIG = "9" * 400  # an integer beyond the float range
HOSTILE = [
    _with(GOOD[0], version="2"), _with(GOOD[0], version="true"), _with(GOOD[0], version="1.0"),
    _with(GOOD[0], type='"privstream.request"'), _with(GOOD[0], slot="true"),
    _with(GOOD[0], slot="-1"), _with(GOOD[0], round="0"), _with(GOOD[0], slot="3.0"),
    _with(GOOD[0], slot=HUGE), _with(GOOD[0], epsilon=BIG), _with(GOOD[0], epsilon="1e400"),
    _with(GOOD[0], epsilon="NaN"), _with(GOOD[0], value="Infinity"), _with(GOOD[0], value="1e400"),
    _with(GOOD[0], value=BIG), _with(GOOD[0], value=HUGE), _with(GOOD[3], value=BIG),
    _with(GOOD[0], value="[" * 3000 + "]" * 3000), _with(GOOD[0], request='"ABC"'),
    _with(GOOD[0], request=json.dumps(GRR.id + "\n")), _with(GOOD[0], purpose='"a b"'),
    _with(GOOD[0], device='""'), _with(GOOD[0], device=json.dumps("d" * 257)),
    _with(GOOD[0], device='"\\ud800"'), _with(GOOD[0], device='"\\u0000"'),
    _with(GOOD[0], raw="3"), _with(GOOD[0], stream="7"), _with(GOOD[0], oracle="null"),
    _with(GOOD[0], value='"\\u00e9"'), _with(GOOD[4], value='{"v":0.5,"x":[1],"x":[2]}'),
    _with(GOOD[0]).replace('"slot":3', '"slot":3,"slot":4'),
    _with(GOOD[0]).replace('"slot":3', '"slot":"x","slot":4'),
    _with(GOOD[0]).replace(',"value":3', ""), "{}", "[]", "null", "3", '"x"', "", " ", "{",
    _with(GOOD[0]) + "{}", _with(GOOD[0]) + " x", " \t" + _with(GOOD[0]) + "\r\n",
    "\ufeff" + _with(GOOD[0]), '{"type":"privstream.close","version":1}',
    _with(GOOD[0]) + " " * MAX_EVENT_BYTES,
]  # fmt: skip
RAW = [b"\xff\xfe", _with(GOOD[1]).encode().replace(b"dev-2", b"d\xffv"),
       _with(GOOD[0]).encode().replace(b'"dev-1"', b'"d\xc3"')]  # fmt: skip


def test_hostile_messages_get_the_protocols_own_reason() -> None:
    _same([*HOSTILE, *(line.encode() for line in HOSTILE), *RAW])
    decoded = decode_messages([line.encode() for line in HOSTILE])
    refused = [d for d in decoded if isinstance(d, ProtocolError)]
    assert len(refused) >= 35  # nearly all are refused, and each for the protocol's reason


def _mutate(line: bytes, rng: random.Random) -> bytes:
    how, cut = rng.randrange(6), rng.randrange(len(line) + 1)
    if how == 0:
        return line[:cut]
    if how == 1:
        return line[:cut] + bytes([rng.randrange(256)]) + line[cut + 1 :]
    if how == 2:
        return (
            line[:cut] + rng.choice([b",", b":", b'"', b"}", b"]", b"-", b"e", b"0"]) + line[cut:]
        )
    if how == 3:
        return line[:cut] + line[cut + 1 :]
    if how == 4:
        return (
            line[:cut] + b'"slot":' + rng.choice([b"1,", b"1e400,", b"-0,", b"null,"]) + line[cut:]
        )
    return line.replace(b"3", rng.choice([b"3.5", b"30", b"-3", b"3e0", BIG.encode()]), 1)


def test_random_mutations_of_good_messages_decode_as_the_protocol_decodes_them() -> None:
    rng = random.Random(23)
    good = _good_lines()
    lines = [_mutate(rng.choice(good), rng) for _ in range(20_000)]
    _same(lines)
    kinds = [type(d).__name__ for d in decode_messages(lines)]
    assert min(kinds.count("Report"), kinds.count("ProtocolError")) > 1000  # both outcomes, often


@pytest.mark.parametrize("size", [1, 5000])
def test_a_poll_decodes_each_message_on_its_own(size: int) -> None:
    """A refused message in a poll changes nothing for the others."""
    lines = [*(_good_lines() * size)[:size], b"{", *_good_lines()]
    decoded = decode_messages(lines)
    assert _outcome(decoded[size]) == _outcome(_slow(b"{"))
    assert decoded[size + 1 :] == [*GOOD, MARKER]
    assert decode_messages([]) == []
