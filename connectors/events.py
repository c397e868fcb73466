"""The input event schema (design §5) and its batch parser.

An event is one user's value for one slot of one stream::

    {"stream": "country", "user": "u-123", "slot": 42, "value": 3}

``slot`` is a non-negative integer (or ``ts``, an RFC 3339 time turned into a slot by a
``SlotClock``); ``value`` an integer category or a number. The parser turns a batch of raw lines
into one columnar ``EventBatch`` per stream plus a ``DeadLetter`` for every line it cannot
accept, each with a machine-readable reason. Per-event Python is limited to JSON decoding and
field checks; everything downstream works on the arrays.

Dead letters carry the original line: they belong to the trusted input side (same access as the
input topic) and are never part of the public output.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

MAX_EVENT_BYTES: Final = 64 * 1024  # larger lines are "oversized"

# Machine-readable dead-letter reasons.
MALFORMED: Final = "malformed_json"
MALFORMED_CSV: Final = "malformed_csv"
MISSING_FIELD: Final = "missing_field"
INVALID_TYPE: Final = "invalid_type"
NEGATIVE_SLOT: Final = "negative_slot"
OVERSIZED: Final = "oversized"
UNKNOWN_STREAM: Final = "unknown_stream"
OUT_OF_DOMAIN: Final = "out_of_domain"
DUPLICATE: Final = "duplicate_report"
LATE: Final = "late_event"
FAR_FUTURE: Final = "far_future_slot"
POPULATION_FULL: Final = "population_full"
USER_ID_KIND: Final = "user_id_kind_mismatch"
STREAM_HALTED: Final = "stream_halted"
REASONS: Final = (
    MALFORMED,
    MALFORMED_CSV, MISSING_FIELD, INVALID_TYPE, NEGATIVE_SLOT, OVERSIZED, UNKNOWN_STREAM, OUT_OF_DOMAIN,
    DUPLICATE, LATE, FAR_FUTURE, POPULATION_FULL, USER_ID_KIND, STREAM_HALTED,
)  # fmt: skip


@dataclass(frozen=True)
class EventBatch:
    """Events of one stream in columns.

    ``users`` holds either user-id strings (dtype object) or, for in-process sources such as the
    synthetic generator, dense user indices ``0..n−1`` (integer dtype). ``raw`` keeps each row's
    original line for dead letters (None when the source has no text form).
    ``complete_through`` is an end-of-slot marker travelling with the batch: once these rows are
    in, every slot ``<= complete_through`` of the stream is complete and can be released. Keeping
    the marker inside the batch makes it impossible for it to overtake its own events.
    """

    stream: str
    slots: NDArray[np.int64]
    users: NDArray[Any]
    values: NDArray[np.float64]
    raw: tuple[str, ...] | None = None
    complete_through: int | None = None

    def __len__(self) -> int:
        return int(self.slots.shape[0])

    def row_text(self, i: int) -> str:
        """The original line of row ``i``, or an equivalent JSON object."""
        if self.raw is not None:
            return self.raw[i]
        user = self.users[i]
        return json.dumps(
            {"stream": self.stream, "user": user.item() if hasattr(user, "item") else user,
             "slot": int(self.slots[i]), "value": float(self.values[i])}
        )  # fmt: skip


@dataclass(frozen=True)
class DeadLetter:
    """An input the flow could not use, with a machine-readable ``reason`` (see ``REASONS``)."""

    reason: str
    stream: str | None
    payload: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "stream": self.stream,
            "detail": self.detail,
            "payload": self.payload,
        }


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
            when = when.replace(tzinfo=timezone.utc)
        return (when - self.origin) // self.length


def _text(line: str | bytes) -> str:
    return line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line


class _Builder:
    """Collects accepted rows per stream and dead letters, in input order."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[list[int], list[str], list[float], list[str]]] = {}
        self.dead: list[DeadLetter] = []

    def reject(self, reason: str, line: str, detail: str, stream: str | None = None) -> None:
        self.dead.append(DeadLetter(reason, stream, line, detail))

    def accept(self, stream: str, slot: int, user: str, value: float, line: str) -> None:
        slots, users, values, raws = self.rows.setdefault(stream, ([], [], [], []))
        slots.append(slot)
        users.append(user)
        values.append(value)
        raws.append(line)

    def result(self) -> list[EventBatch | DeadLetter]:
        out: list[EventBatch | DeadLetter] = []
        for stream, (slots, users, values, raws) in self.rows.items():
            out.append(
                EventBatch(
                    stream,
                    np.asarray(slots, dtype=np.int64),
                    np.asarray(users, dtype=object),
                    np.asarray(values, dtype=np.float64),
                    tuple(raws),
                )
            )
        out.extend(self.dead)
        return out


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _check_record(
    rec: Any,
    line: str,
    out: _Builder,
    streams: frozenset[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
) -> None:
    if not isinstance(rec, dict):
        out.reject(INVALID_TYPE, line, "event must be a JSON object")
        return
    stream = rec.get("stream", default_stream)
    if stream is None:
        out.reject(MISSING_FIELD, line, "stream")
        return
    if not isinstance(stream, str) or not stream:
        out.reject(INVALID_TYPE, line, "stream must be a non-empty string")
        return
    if streams is not None and stream not in streams:
        out.reject(UNKNOWN_STREAM, line, "stream is not configured", stream)
        return
    for name in ("user", "value"):
        if name not in rec:
            out.reject(MISSING_FIELD, line, name, stream)
            return
    user = rec["user"]
    if isinstance(user, int) and not isinstance(user, bool):
        user = str(user)
    if not isinstance(user, str) or not user:
        out.reject(INVALID_TYPE, line, "user must be a non-empty string", stream)
        return
    if "slot" in rec:
        slot = rec["slot"]
        if isinstance(slot, float) and slot.is_integer():
            slot = int(slot)
        if isinstance(slot, bool) or not isinstance(slot, int):
            out.reject(INVALID_TYPE, line, "slot must be an integer", stream)
            return
    elif "ts" in rec and clock is not None:
        try:
            slot = clock.slot(str(rec["ts"]))
        except (TypeError, ValueError):
            out.reject(INVALID_TYPE, line, "ts must be an RFC 3339 time", stream)
            return
    else:
        out.reject(MISSING_FIELD, line, "slot" if clock is None else "slot or ts", stream)
        return
    if slot < 0:
        out.reject(NEGATIVE_SLOT, line, "slot must be >= 0", stream)
        return
    if slot >= 2**62:
        out.reject(INVALID_TYPE, line, "slot out of range", stream)
        return
    value = _number(rec["value"])
    if value is None or not math.isfinite(value):
        out.reject(INVALID_TYPE, line, "value must be a finite number", stream)
        return
    out.accept(stream, slot, user, value, line)


_SKIP: Final = object()  # a line that is no event (blank, a CSV header) or already rejected


def _parse(
    lines: Iterable[str | bytes],
    decode: Callable[[str, _Builder], Any],
    streams: Iterable[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
    max_bytes: int,
) -> list[EventBatch | DeadLetter]:
    """The loop both formats share: size check, decode, record checks."""
    allowed = frozenset(streams) if streams is not None else None
    out = _Builder()
    for raw in lines:
        if len(raw) > max_bytes:
            out.reject(OVERSIZED, _text(raw)[:256], f"event larger than {max_bytes} bytes")
            continue
        line = _text(raw).strip()
        if not line:
            continue
        rec = decode(line, out)
        if rec is not _SKIP:
            _check_record(rec, line, out, allowed, default_stream, clock)
    return out.result()


def parse_json_lines(
    lines: Iterable[str | bytes],
    *,
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    clock: SlotClock | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
) -> list[EventBatch | DeadLetter]:
    """Parse JSON-lines events; one ``EventBatch`` per stream, then the dead letters."""

    def decode(line: str, out: _Builder) -> Any:
        try:
            return json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            out.reject(MALFORMED, line, "not valid JSON")
            return _SKIP

    return _parse(lines, decode, streams, default_stream, clock, max_bytes)


def parse_csv_lines(
    lines: Iterable[str | bytes],
    *,
    columns: Sequence[str] = ("user", "slot", "value"),
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    clock: SlotClock | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
) -> list[EventBatch | DeadLetter]:
    """Parse CSV records with the given columns (a header line naming them is skipped)."""

    def decode(line: str, out: _Builder) -> Any:
        fields = [f.strip() for f in next(csv.reader([line]))]
        if fields == list(columns):
            return _SKIP
        if len(fields) != len(columns):
            out.reject(MALFORMED_CSV, line, f"expected {len(columns)} CSV fields")
            return _SKIP
        rec = dict(zip(columns, fields, strict=True))
        return {k: _csv_number(v) if k in ("slot", "value") else v for k, v in rec.items()}

    return _parse(lines, decode, streams, default_stream, clock, max_bytes)


def _csv_number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
