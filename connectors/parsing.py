"""The line-by-line event checks both input formats share (design §5).

``parse_lines`` runs each raw line through a size check, a format's ``decode`` (JSON in
``connectors.json_events``, CSV in ``connectors.csv_events``) and ``check_record``, which accepts
the record into columnar ``EventBatch``es per stream or turns it into a ``DeadLetter`` with a
machine-readable reason. An event names its stream, user, slot and value; ``slot`` is a
non-negative integer (or ``ts``, an RFC 3339 time a ``SlotClock`` turns into a slot). An
end-of-slot marker ``{"stream": "country", "end_of_slot": 42}`` says every event of slots
``<= 42`` of that stream has been written before it (``privstream produce`` writes one after
each slot). A record may also state its user's privacy requirement ``(ε_i, w_i)`` as
``epsilon``/``window`` (personalized mechanisms).

No input raises out of the parsers: every non-blank line becomes exactly one accepted row, one
marker or one ``DeadLetter``, and which one depends on the line alone (and the configured
streams and their value shapes), never on the other lines of its batch or poll
(``tests/connectors/test_parser_fuzz.py``).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeGuard

import numpy as np

from privstream.schema.events import (
    INVALID_TYPE,
    MALFORMED,
    MISSING_FIELD,
    NEGATIVE_SLOT,
    OVERSIZED,
    UNKNOWN_STREAM,
    DeadLetter,
    EventBatch,
    line_text,
)

log = logging.getLogger(__name__)

INT_LIMIT: Final = 2**62  # slots and windows from here on are out of range
SKIP: Final = object()  # what ``decode`` gives for a line that is no event or already rejected
MAX_DEPTH: Final = 32
"""Lines nested deeper (objects and lists) are ``malformed_json``: a fixed bound, so the outcome
never depends on how much stack the decoder happens to have left (a 1,000-deep field crashed it)."""
MAX_INT_DIGITS: Final = 400
"""A JSON integer literal longer than this reads as ±infinity: exact integers up to it (every
finite float's integer is shorter), no quadratic or refused int conversion beyond (Python refuses
integer strings of more than 4,300 digits with ``ValueError``)."""
Shapes = Mapping[str, int] | int | None
"""Streams' value shapes (0: one number per event, d: a list of d numbers; a task's
``value_shape``): per stream name, one shape for every stream (a file flow's single task), or
None where unknown."""
UNREADABLE: Final = "unreadable event"
"""The detail of a line the parser failed on unexpectedly (a bug): still a dead letter."""

_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STEP: Final = np.zeros(256, dtype=np.int64)  # +1 for each byte that opens, −1 that closes
_STEP[np.frombuffer(b"[{", dtype=np.uint8)] = 1
_STEP[np.frombuffer(b"]}", dtype=np.uint8)] = -1


def nesting_depth(data: bytes) -> int:
    """How deep the objects and lists of a JSON text nest (brackets inside strings do not
    count; an unterminated string's brackets do, which only a malformed line has)."""
    codes = np.frombuffer(_STRING.sub(b"", data), dtype=np.uint8)
    return int(np.cumsum(_STEP[codes]).max(initial=0))


def too_deep(line: str | bytes) -> bool:
    """Whether ``line`` nests deeper than ``MAX_DEPTH`` (a count of its brackets first: only a
    line with more than ``MAX_DEPTH`` of them can)."""
    if isinstance(line, str):
        if line.count("[") + line.count("{") <= MAX_DEPTH:
            return False
        line = line.encode("utf-8", "surrogatepass")
    elif line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False
    return nesting_depth(line) > MAX_DEPTH


def bounded_int(text: str) -> int | float:
    """A JSON or CSV integer literal: exact up to ``MAX_INT_DIGITS`` characters, else ±inf."""
    if len(text) <= MAX_INT_DIGITS:
        return int(text)
    return -math.inf if text.lstrip().startswith("-") else math.inf


def load_json(line: str) -> Any:
    """One JSON value, or ``ValueError`` naming why not (never another exception): too deep,
    invalid JSON (huge integers read as ±inf, ``NaN``/``Infinity`` as floats)."""
    if too_deep(line):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(line, parse_int=bounded_int)
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
        raise ValueError("not valid JSON") from None


def invalid_utf8(line: str, raw: str | bytes) -> bool:
    """Whether the raw bytes of ``line`` are not UTF-8: such a line is malformed, as replacing
    the bad bytes would merge different user ids into one."""
    if not isinstance(raw, bytes) or "\ufffd" not in line:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def valid_text(x: Any) -> TypeGuard[str]:
    """A non-empty string that is valid Unicode (JSON escapes can spell lone surrogates, which
    no UTF-8 encoder, header or log accepts downstream)."""
    if not isinstance(x, str) or not x:
        return False
    try:
        x.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class SlotClock:
    """Maps an event time to a slot: ``⌊(ts − origin)/length⌋`` (spec §6.1)."""

    origin: datetime
    length: timedelta

    def __post_init__(self) -> None:
        if self.length <= timedelta(0):
            raise ValueError(f"slot length must be positive, got {self.length}")
        if self.origin.tzinfo is None:
            raise ValueError("slot clock origin must be timezone-aware")

    def slot(self, ts: str) -> int:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return (when - self.origin) // self.length


@dataclass
class _Columns:
    slots: list[int] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)
    raws: list[str | bytes] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)


def _shape(value: Value) -> int:
    return len(value) if isinstance(value, tuple) else 0


class Builder:
    """Collects accepted rows per stream and dead letters, in input order.

    A marker cuts its stream's rows so far into a batch that carries it, so rows after the
    marker can never be counted into a slot it declared complete.

    Each value is judged on its own against its stream's value shape in ``shapes`` (0: one
    number, d: a list of d numbers; the stream's task): another shape is an ``invalid_type``
    dead letter. A stream without a known shape keeps one column group per shape (each its own
    batch; the operator refuses the groups its task cannot take), so no line's fate depends on
    the lines that came before it in the batch.
    """

    def __init__(self, shapes: Shapes = None) -> None:
        self.shapes = shapes
        self.line = 0  # the index of the line being read (each accepted row's ``lines``)
        self.rows: dict[tuple[str, int], _Columns] = {}
        self.batches: list[EventBatch] = []
        self.dead: list[DeadLetter] = []

    def reject(
        self, reason: str, line: str, detail: str, stream: str | None = None, raw: Any = None
    ) -> None:
        original = raw if isinstance(raw, bytes) and raw != line.encode("utf-8") else None
        self.dead.append(DeadLetter(reason, stream, line, detail, original))

    def accept(
        self,
        stream: str,
        slot: int,
        user: str,
        value: Value,
        raw: str | bytes,
        requirement: tuple[float, int] = (math.nan, 0),
    ) -> None:
        shape, want = _shape(value), shape_of(self.shapes, stream)
        if want is not None and shape != want:
            line = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else raw.strip()
            self.reject(INVALID_TYPE, line, shape_detail(want), stream, raw)
            return
        cols = self.rows.get((stream, shape))
        if cols is None:
            cols = self.rows[(stream, shape)] = _Columns()
        cols.slots.append(slot)
        cols.users.append(user)
        cols.values.append(value)
        cols.raws.append(raw)
        cols.lines.append(self.line)
        cols.epsilons.append(requirement[0])
        cols.windows.append(requirement[1])

    def mark(self, stream: str, through: int, tag: str | None = None) -> None:
        *rows, marked = self._cut(stream, through)  # the last batch carries the marker
        self.batches.extend([*rows, replace(marked, marker_tag=tag)])

    def _cut(self, stream: str, through: int | None = None) -> list[EventBatch]:
        """The stream's rows so far, one batch per value shape in first-seen order (one empty
        batch when there are none); the last carries the marker ``through``."""
        groups = [self.rows.pop(key) for key in [k for k in self.rows if k[0] == stream]]
        groups = groups or [_Columns()]
        last = len(groups) - 1
        return [_batch(stream, c, through if i == last else None) for i, c in enumerate(groups)]

    def result(self) -> list[EventBatch | DeadLetter]:
        out: list[EventBatch | DeadLetter] = list(self.batches)
        for stream in dict.fromkeys(stream for stream, _ in self.rows):
            out.extend(self._cut(stream))
        out.extend(self.dead)
        return out


def shape_of(shapes: Shapes, stream: str) -> int | None:
    """The value shape ``shapes`` gives ``stream`` (None: not known)."""
    if shapes is None or isinstance(shapes, int):
        return shapes
    return shapes.get(stream)


def _batch(stream: str, cols: _Columns, through: int | None) -> EventBatch:
    """One column group as an ``EventBatch`` (requirement columns only when a row states one)."""
    stated = any(w > 0 for w in cols.windows) or not all(map(math.isnan, cols.epsilons))
    return EventBatch(
        stream,
        np.asarray(cols.slots, dtype=np.int64),
        np.asarray(cols.users, dtype=object),
        np.asarray(cols.values, dtype=np.float64),
        tuple(cols.raws),
        through,
        np.asarray(cols.epsilons, dtype=np.float64) if stated else None,
        np.asarray(cols.windows, dtype=np.int64) if stated else None,
        lines=np.asarray(cols.lines, dtype=np.int64),
    )


def shape_detail(want: int) -> str:
    """The dead-letter detail of a value of another shape than its stream's task takes."""
    if want == 0:
        return "value must be one number: the stream's task takes one number per event"
    return f"value must be a list of {want} numbers: the stream's task takes {want}-vectors"


@dataclass(frozen=True)
class _Bad:
    """Why a record is refused: a dead-letter reason and its detail."""

    reason: str
    detail: str


Value = float | tuple[float, ...]
"""A number, or a vector: a JSON list of 1..``MAX_DIMENSIONS`` finite numbers."""
_Event = tuple[int, str, Value, tuple[float, int]]  # slot, user, value, (ε_i, w_i)
MAX_DIMENSIONS: Final = 64


def _value(x: Any) -> Value | None:
    """A finite number, or a list of finite numbers as a tuple; None otherwise."""
    if isinstance(x, list):
        items = [_number(v) for v in x]
        if not 1 <= len(items) <= MAX_DIMENSIONS or any(
            v is None or not math.isfinite(v) for v in items
        ):
            return None
        return tuple(float(v) for v in items if v is not None)
    number = _number(x)
    return number if number is not None and math.isfinite(number) else None


def _number(x: Any) -> float | None:
    """A JSON number as a float (±inf beyond the float range); None for anything else."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:  # an integer beyond 1.8e308
        return math.inf if x > 0 else -math.inf


def _whole(x: Any) -> Any:
    """An integral float as an int (JSON writers may print ``4.0``); anything else unchanged."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _stream(rec: Any, default_stream: str | None) -> str | _Bad:
    """The record's stream (``default_stream`` when it names none)."""
    if not isinstance(rec, dict):
        return _Bad(INVALID_TYPE, "event must be a JSON object")
    stream = rec.get("stream", default_stream)
    if stream is None:
        return _Bad(MISSING_FIELD, "stream")
    if not valid_text(stream):
        return _Bad(INVALID_TYPE, "stream must be a non-empty string")
    return stream


def _slot(rec: dict[str, Any], clock: SlotClock | None) -> int | _Bad:
    """The record's slot, from ``slot`` or (with a clock) ``ts``, in ``[0, 2⁶²)``."""
    if "slot" in rec:
        slot = _whole(rec["slot"])
        if isinstance(slot, bool) or not isinstance(slot, int):
            return _Bad(INVALID_TYPE, "slot must be an integer")
    elif "ts" in rec and clock is not None:
        try:
            slot = clock.slot(str(rec["ts"]))
        except (TypeError, ValueError, OverflowError):
            return _Bad(INVALID_TYPE, "ts must be an RFC 3339 time")
    elif "ts" in rec:  # no clock: privstream run configures none, so say so
        return _Bad(MISSING_FIELD, "slot (a ts needs a slot clock, which this flow has none of)")
    else:
        return _Bad(MISSING_FIELD, "slot" if clock is None else "slot or ts")
    if slot < 0:
        return _Bad(NEGATIVE_SLOT, "slot must be >= 0")
    if slot >= INT_LIMIT:
        return _Bad(INVALID_TYPE, "slot out of range")
    return slot


def _requirement(rec: dict[str, Any]) -> tuple[float, int] | _Bad:
    """The stated ``(ε_i, w_i)``: NaN / 0 for a part the record does not state."""
    epsilon, window = rec.get("epsilon"), rec.get("window")
    if epsilon is not None:
        epsilon = _number(epsilon)
        if epsilon is None or not (math.isfinite(epsilon) and epsilon > 0):
            return _Bad(INVALID_TYPE, "epsilon must be a positive number")
    if window is not None:
        window = _whole(window)
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window < INT_LIMIT:
            return _Bad(INVALID_TYPE, "window must be an integer >= 1")
    return (math.nan if epsilon is None else epsilon, 0 if window is None else window)


def _event(rec: dict[str, Any], clock: SlotClock | None) -> _Event | _Bad:
    """An event record's checked fields, or the first reason to refuse it."""
    for name in ("user", "value"):
        if name not in rec:
            return _Bad(MISSING_FIELD, name)
    user = rec["user"]
    if isinstance(user, int) and not isinstance(user, bool):
        user = str(user)
    if not valid_text(user):
        return _Bad(INVALID_TYPE, "user must be a non-empty string")
    slot = _slot(rec, clock)
    if isinstance(slot, _Bad):
        return slot
    value = _value(rec["value"])
    if value is None:
        return _Bad(
            INVALID_TYPE, f"value must be a finite number or a list of 1..{MAX_DIMENSIONS} of them"
        )
    requirement = _requirement(rec)
    if isinstance(requirement, _Bad):
        return requirement
    return slot, user, value, requirement


def check_record(
    rec: Any,
    line: str,
    raw: str | bytes,
    out: Builder,
    streams: frozenset[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
) -> None:
    """Accept a decoded record into ``out`` (an event, or a marker cutting its stream), or
    reject it with the first reason found."""
    stream = _stream(rec, default_stream)
    if isinstance(stream, _Bad):
        out.reject(stream.reason, line, stream.detail, raw=raw)
        return
    if streams is not None and stream not in streams:
        out.reject(UNKNOWN_STREAM, line, "stream is not configured", stream, raw)
        return
    if "end_of_slot" in rec and "user" not in rec:
        through = rec["end_of_slot"]
        if (
            isinstance(through, bool)
            or not isinstance(through, int)
            or not 0 <= through < INT_LIMIT
        ):
            out.reject(INVALID_TYPE, line, "end_of_slot must be an integer >= 0", stream, raw)
        else:
            tag = rec.get("tag")
            out.mark(stream, through, tag if isinstance(tag, str) else None)
        return
    event = _event(rec, clock)
    if isinstance(event, _Bad):
        out.reject(event.reason, line, event.detail, stream, raw)
        return
    slot, user, value, requirement = event
    out.accept(stream, slot, user, value, raw, requirement)


def parse_lines(
    lines: Iterable[str | bytes],
    decode: Callable[[str, Builder, str | bytes], Any],
    streams: Iterable[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
    max_bytes: int,
    shapes: Shapes = None,
) -> list[EventBatch | DeadLetter]:
    """The line-by-line loop both formats share: size check, decode, record checks, each line
    on its own (its streams' value ``shapes`` known or not). The ``EventBatch``es per stream
    (cut at markers) come first, then the dead letters."""
    allowed = frozenset(streams) if streams is not None else None
    out = Builder(shapes)
    for out.line, raw in enumerate(lines):
        if len(raw) > max_bytes:
            text = line_text(raw)[:256]
            original = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
            out.dead.append(
                DeadLetter(OVERSIZED, None, text, f"event larger than {max_bytes} bytes", original)
            )
            continue
        line = line_text(raw).strip()
        if not line:
            continue
        try:
            rec = decode(line, out, raw)
            if rec is not SKIP:
                check_record(rec, line, raw, out, allowed, default_stream, clock)
        except Exception as exc:  # a parser bug: the line still ends as a dead letter
            log.error("parsing an event failed (%s); it is a dead letter", type(exc).__name__)
            out.reject(MALFORMED, line, UNREADABLE, raw=raw)
    return out.result()
