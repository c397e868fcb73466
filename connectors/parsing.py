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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np

from privstream.events import (
    INVALID_TYPE,
    MISSING_FIELD,
    NEGATIVE_SLOT,
    OVERSIZED,
    UNKNOWN_STREAM,
    DeadLetter,
    EventBatch,
    line_text,
)

INT_LIMIT: Final = 2**62  # slots and windows from here on are out of range
SKIP: Final = object()  # what ``decode`` gives for a line that is no event or already rejected


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
    epsilons: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)


def _shape(value: Value) -> int:
    return len(value) if isinstance(value, tuple) else 0


class Builder:
    """Collects accepted rows per stream and dead letters, in input order.

    A marker cuts its stream's rows so far into a batch that carries it, so rows after the
    marker can never be counted into a slot it declared complete.
    """

    def __init__(self) -> None:
        self.rows: dict[str, _Columns] = {}
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
        cols = self.rows.get(stream)
        if cols is None:
            cols = self.rows[stream] = _Columns()
        if cols.values and _shape(cols.values[0]) != _shape(value):
            line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            detail = "value must have the shape of the batch's first value of the stream"
            self.reject(INVALID_TYPE, line, detail, stream, raw)
            return
        cols.slots.append(slot)
        cols.users.append(user)
        cols.values.append(value)
        cols.raws.append(raw)
        cols.epsilons.append(requirement[0])
        cols.windows.append(requirement[1])

    def mark(self, stream: str, through: int) -> None:
        self.batches.append(self._cut(stream, through))

    def _cut(self, stream: str, through: int | None = None) -> EventBatch:
        cols = self.rows.pop(stream, None) or _Columns()
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
        )

    def result(self) -> list[EventBatch | DeadLetter]:
        out: list[EventBatch | DeadLetter] = list(self.batches)
        out.extend(self._cut(stream) for stream in list(self.rows))
        out.extend(self.dead)
        return out


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
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


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
    if not isinstance(stream, str) or not stream:
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
        except (TypeError, ValueError):
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
    if not isinstance(user, str) or not user:
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
        if isinstance(through, bool) or not isinstance(through, int) or through < 0:
            out.reject(INVALID_TYPE, line, "end_of_slot must be an integer >= 0", stream, raw)
        else:
            out.mark(stream, through)
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
) -> list[EventBatch | DeadLetter]:
    """The line-by-line loop both formats share: size check, decode, record checks. The
    ``EventBatch``es per stream (cut at markers) come first, then the dead letters."""
    allowed = frozenset(streams) if streams is not None else None
    out = Builder()
    for raw in lines:
        if len(raw) > max_bytes:
            text = line_text(raw)[:256]
            original = raw if isinstance(raw, bytes) else raw.encode("utf-8")
            out.dead.append(
                DeadLetter(OVERSIZED, None, text, f"event larger than {max_bytes} bytes", original)
            )
            continue
        line = line_text(raw).strip()
        if not line:
            continue
        rec = decode(line, out, raw)
        if rec is not SKIP:
            check_record(rec, line, raw, out, allowed, default_stream, clock)
    return out.result()
