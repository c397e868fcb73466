"""The input event schema (design §5) and its batch parser.

An event is one user's value for one slot of one stream::

    {"stream": "country", "user": "u-123", "slot": 42, "value": 3}

``slot`` is a non-negative integer (or ``ts``, an RFC 3339 time turned into a slot by a
``SlotClock``); ``value`` an integer category or a number. An end-of-slot marker
``{"stream": "country", "end_of_slot": 42}`` says every event of slots ``<= 42`` of that stream
has been written before it (``privstream produce`` writes one after each slot).

The parser turns a batch of raw lines into columnar ``EventBatch``es per stream plus a
``DeadLetter`` for every line it cannot accept, each with a machine-readable reason. A batch of
well-formed events takes a fast path (one ``msgspec`` call for the whole batch and column-wise
checks); a batch with anything unusual in it falls back to the line-by-line checks, which give
the same result for the good lines and a precise reason for each bad one.

Dead letters carry the original line: they belong to the trusted input side (same access as the
input topic) and are never part of the public output.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Final

import msgspec
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
REQUIREMENT_CHANGED: Final = "requirement_changed"
STREAM_HALTED: Final = "stream_halted"
UNREGISTERED: Final = "unregistered_user"
REASONS: Final = (
    MALFORMED,
    MALFORMED_CSV, MISSING_FIELD, INVALID_TYPE, NEGATIVE_SLOT, OVERSIZED, UNKNOWN_STREAM, OUT_OF_DOMAIN,
    DUPLICATE, LATE, FAR_FUTURE, POPULATION_FULL, USER_ID_KIND, REQUIREMENT_CHANGED, STREAM_HALTED,
    UNREGISTERED,
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
    ``epsilons``/``windows`` are the privacy requirements ``(ε_i, w_i)`` rows state (personalized
    mechanisms; NaN / 0 where a row states none), or None when no row states one.
    ``partition`` is the input partition the rows came from (a Kafka partition; 0 for files and
    in-process sources): the slotting tracks each partition's progress (``operators.watermark``).
    """

    stream: str
    slots: NDArray[np.int64]
    users: NDArray[Any]
    values: NDArray[np.float64]
    raw: Sequence[str | bytes] | None = None
    complete_through: int | None = None
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None
    partition: int = 0

    def __len__(self) -> int:
        return int(self.slots.shape[0])

    def select(
        self,
        rows: slice | NDArray[np.int64],
        raw: Sequence[str | bytes] | None,
        complete_through: int | None = None,
    ) -> EventBatch:
        """The batch of ``rows`` (all columns), with its lines and marker."""
        return EventBatch(
            self.stream,
            self.slots[rows],
            self.users[rows],
            self.values[rows],
            raw,
            complete_through,
            None if self.epsilons is None else self.epsilons[rows],
            None if self.windows is None else self.windows[rows],
            self.partition,
        )

    def row_original(self, i: int) -> bytes | None:
        """The exact bytes of row ``i`` when ``row_text`` does not reproduce them."""
        raw = self.raw[i] if self.raw is not None else None
        if isinstance(raw, bytes) and raw != self.row_text(i).encode("utf-8"):
            return raw
        return None

    def row_text(self, i: int) -> str:
        """The original line of row ``i``, or an equivalent JSON object."""
        if self.raw is not None:
            return _text(self.raw[i]).strip()
        user = self.users[i]
        return json.dumps(
            {"stream": self.stream, "user": user.item() if hasattr(user, "item") else user,
             "slot": int(self.slots[i]), "value": float(self.values[i])}
        )  # fmt: skip


@dataclass(frozen=True)
class DeadLetter:
    """An input the flow could not use, with a machine-readable ``reason`` (see ``REASONS``).

    ``payload`` is the input as text (cut to its first 256 characters when oversized);
    ``original`` keeps the exact input bytes when they are not simply ``payload`` in UTF-8
    (invalid UTF-8, surrounding whitespace, oversized), so a dead-letter topic can carry them.
    ``topic``/``partition``/``offset`` say where the input was read when the parser of a Kafka
    poll knows it (None otherwise), so a dead letter whose payload had to be cut points at the
    original.
    """

    reason: str
    stream: str | None
    payload: str
    detail: str = ""
    original: bytes | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def payload_bytes(self) -> bytes:
        """The input exactly as it arrived."""
        return self.original if self.original is not None else self.payload.encode("utf-8")

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


@dataclass
class _Columns:
    slots: list[int] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    raws: list[str | bytes] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)


class _Builder:
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
        value: float,
        raw: str | bytes,
        requirement: tuple[float, int] = (math.nan, 0),
    ) -> None:
        cols = self.rows.get(stream)
        if cols is None:
            cols = self.rows[stream] = _Columns()
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


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _check_record(
    rec: Any,
    line: str,
    raw: str | bytes,
    out: _Builder,
    streams: frozenset[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
) -> None:
    if not isinstance(rec, dict):
        out.reject(INVALID_TYPE, line, "event must be a JSON object", raw=raw)
        return
    stream = rec.get("stream", default_stream)
    if stream is None:
        out.reject(MISSING_FIELD, line, "stream", raw=raw)
        return
    if not isinstance(stream, str) or not stream:
        out.reject(INVALID_TYPE, line, "stream must be a non-empty string", raw=raw)
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
    for name in ("user", "value"):
        if name not in rec:
            out.reject(MISSING_FIELD, line, name, stream, raw)
            return
    user = rec["user"]
    if isinstance(user, int) and not isinstance(user, bool):
        user = str(user)
    if not isinstance(user, str) or not user:
        out.reject(INVALID_TYPE, line, "user must be a non-empty string", stream, raw)
        return
    if "slot" in rec:
        slot = rec["slot"]
        if isinstance(slot, float) and slot.is_integer():
            slot = int(slot)
        if isinstance(slot, bool) or not isinstance(slot, int):
            out.reject(INVALID_TYPE, line, "slot must be an integer", stream, raw)
            return
    elif "ts" in rec and clock is not None:
        try:
            slot = clock.slot(str(rec["ts"]))
        except (TypeError, ValueError):
            out.reject(INVALID_TYPE, line, "ts must be an RFC 3339 time", stream, raw)
            return
    else:
        out.reject(MISSING_FIELD, line, "slot" if clock is None else "slot or ts", stream, raw)
        return
    if slot < 0:
        out.reject(NEGATIVE_SLOT, line, "slot must be >= 0", stream, raw)
        return
    if slot >= 2**62:
        out.reject(INVALID_TYPE, line, "slot out of range", stream, raw)
        return
    value = _number(rec["value"])
    if value is None or not math.isfinite(value):
        out.reject(INVALID_TYPE, line, "value must be a finite number", stream, raw)
        return
    epsilon, window = rec.get("epsilon"), rec.get("window")
    if epsilon is not None:
        epsilon = _number(epsilon)
        if epsilon is None or not (math.isfinite(epsilon) and epsilon > 0):
            out.reject(INVALID_TYPE, line, "epsilon must be a positive number", stream, raw)
            return
    if window is not None:
        if isinstance(window, float) and window.is_integer():
            window = int(window)
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window < _INT_LIMIT:
            out.reject(INVALID_TYPE, line, "window must be an integer >= 1", stream, raw)
            return
    requirement = (math.nan if epsilon is None else epsilon, 0 if window is None else window)
    out.accept(stream, slot, user, value, raw, requirement)


_SKIP: Final = object()  # a line that is no event (blank, a CSV header) or already rejected


def _parse(
    lines: Iterable[str | bytes],
    decode: Callable[[str, _Builder, str | bytes], Any],
    streams: Iterable[str] | None,
    default_stream: str | None,
    clock: SlotClock | None,
    max_bytes: int,
) -> list[EventBatch | DeadLetter]:
    """The line-by-line loop both formats share: size check, decode, record checks."""
    allowed = frozenset(streams) if streams is not None else None
    out = _Builder()
    for raw in lines:
        if len(raw) > max_bytes:
            text = _text(raw)[:256]
            original = raw if isinstance(raw, bytes) else raw.encode("utf-8")
            out.dead.append(
                DeadLetter(OVERSIZED, None, text, f"event larger than {max_bytes} bytes", original)
            )
            continue
        line = _text(raw).strip()
        if not line:
            continue
        rec = decode(line, out, raw)
        if rec is not _SKIP:
            _check_record(rec, line, raw, out, allowed, default_stream, clock)
    return out.result()


_INT_LIMIT: Final = 2**62


class _Row(msgspec.Struct, gc=False):
    """One line of the fast path: an event, or (``user`` None) an end-of-slot marker."""

    stream: str
    user: str | None = None
    slot: int | None = None
    value: float | None = None
    end_of_slot: int | None = None
    epsilon: float | None = None
    window: int | None = None


_ROWS: Final = msgspec.json.Decoder(list[_Row])


def _fast_json(
    lines: Sequence[bytes], allowed: frozenset[str] | None, max_bytes: int
) -> list[EventBatch | DeadLetter] | None:
    """The whole batch in one ``msgspec`` call (which checks the field types in C) and
    column-wise checks, or None when any line
    needs the line-by-line path (a bad or unusual line, a ``ts``, user indices, markers of a
    batch holding several streams).

    End-of-slot markers of a single-stream batch stay on this path: they cut the rows into
    batches exactly as the line-by-line ``_Builder`` does (every marker carries the rows since
    the previous one, even none; rows after the last marker form a batch of their own).
    """
    if not lines or max(map(len, lines)) > max_bytes:
        return None
    joined = b"[" + b",".join(lines) + b"]"
    try:
        recs = _ROWS.decode(joined)  # types checked in C: str stream/user, int slot, number value
    except msgspec.ValidationError:
        return None  # a missing or mistyped field somewhere (or a ts): line by line
    except msgspec.DecodeError:
        return None  # a malformed line, or a line holding several JSON values
    if len(recs) != len(lines):
        return None
    if b"end_of_slot" in joined:
        marks = [i for i, r in enumerate(recs) if r.user is None]
        marked = [(recs[i].stream, recs[i].end_of_slot) for i in marks]
        bounds = [-1, *marks, len(recs)]
        events = list(
            itertools.chain.from_iterable(recs[a + 1 : b] for a, b in itertools.pairwise(bounds))
        )
    else:
        marks, marked, events = [], [], recs
    users = [r.user for r in events]
    if not all(users):
        return None  # an event without a user, or with an empty one
    names = {r.stream for r in events}
    for _stream, through in marked:
        if through is None or through < 0:
            return None
    names.update(stream for stream, _ in marked)
    if "" in names or (allowed is not None and not names <= allowed):
        return None
    if marked and len(names) > 1:
        return None
    try:  # a missing slot or value (None) raises TypeError, a huge slot OverflowError
        slot_arr = np.fromiter((r.slot for r in events), dtype=np.int64, count=len(events))
        value_arr = np.fromiter((r.value for r in events), dtype=np.float64, count=len(events))
    except (OverflowError, TypeError):
        return None
    if (slot_arr < 0).any() or (slot_arr >= _INT_LIMIT).any() or not np.isfinite(value_arr).all():
        return None
    whole = EventBatch(
        "", slot_arr, np.asarray(users, dtype=object), value_arr, lines, None,
        *_requirements(events, joined),
    )  # fmt: skip
    if whole.epsilons is not None and whole.epsilons.shape[0] == 0:
        return None  # a stated requirement out of range: line by line, for its reason
    if marked:
        (name,) = names
        batches: list[EventBatch | DeadLetter] = []
        row, prev = 0, -1  # first event row and line after the previous marker
        for k, (i, (_, through)) in enumerate(zip(marks, marked, strict=True)):
            seg = slice(row, i - k)  # the events between the previous marker and this one
            batches.append(
                replace(whole.select(seg, tuple(lines[prev + 1 : i]), through), stream=name)
            )
            row, prev = i - k, i
        if row < len(events):
            batches.append(
                replace(whole.select(slice(row, None), tuple(lines[prev + 1 :])), stream=name)
            )
        return batches
    if len(names) == 1:
        (name,) = names
        return [replace(whole, stream=name)]
    streams = [r.stream for r in events]
    stream_arr = np.asarray(streams, dtype=object)
    out: list[EventBatch | DeadLetter] = []
    for name in dict.fromkeys(streams):  # first-seen order
        rows = np.flatnonzero(stream_arr == name)
        raws = tuple(lines[i] for i in rows.tolist())
        out.append(replace(whole.select(rows, raws), stream=name))
    return out


_EMPTY_F: Final = np.zeros(0)
_EMPTY_I: Final = np.zeros(0, dtype=np.int64)


def _requirements(
    events: Sequence[_Row], joined: bytes
) -> tuple[NDArray[np.float64] | None, NDArray[np.int64] | None]:
    """The stated ``(ε_i, w_i)`` columns of the fast path (None, None when no line states one;
    empty arrays when a stated value is out of range)."""
    if b'"epsilon"' not in joined and b'"window"' not in joined:
        return None, None
    nan = math.nan
    try:
        eps = np.fromiter(
            (nan if r.epsilon is None else r.epsilon for r in events), np.float64, len(events)
        )
        win = np.fromiter(
            (0 if r.window is None else r.window for r in events), np.int64, len(events)
        )
    except OverflowError:
        return _EMPTY_F, _EMPTY_I
    said = np.fromiter((r.window is not None for r in events), bool, len(events))
    if (
        not (eps[~np.isnan(eps)] > 0).all()
        or not (win[said] >= 1).all()
        or (win >= _INT_LIMIT).any()
    ):
        return _EMPTY_F, _EMPTY_I
    return eps, win


def parse_json_batch(
    lines: Sequence[bytes],
    *,
    streams: Iterable[str] | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
) -> list[EventBatch | DeadLetter] | None:
    """The batch fast path of ``parse_json_lines`` alone: its result when every line is an
    acceptable event or marker (so there are no dead letters), None otherwise. An empty or
    blank line always gives None (it makes the joined batch invalid JSON)."""
    allowed = frozenset(streams) if streams is not None else None
    return _fast_json(lines, allowed, max_bytes)


def parse_json_lines(
    lines: Iterable[str | bytes],
    *,
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    clock: SlotClock | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
) -> list[EventBatch | DeadLetter]:
    """Parse JSON-lines events: the ``EventBatch``es per stream (cut at markers), then the
    dead letters. Lines may be ``bytes`` (Kafka message values) or ``str`` (file lines)."""
    batch = lines if isinstance(lines, Sequence) else list(lines)
    if batch and set(map(type, batch)) == {bytes}:
        fast = parse_json_batch(batch, streams=streams, max_bytes=max_bytes)  # type: ignore[arg-type]
        if fast is not None:
            return fast

    def decode(line: str, out: _Builder, raw: str | bytes) -> Any:
        try:  # the standard parser: it reads NaN and huge integers, so they get a precise reason
            return json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            out.reject(MALFORMED, line, "not valid JSON", raw=raw)
            return _SKIP

    return _parse(batch, decode, streams, default_stream, clock, max_bytes)


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

    def decode(line: str, out: _Builder, raw: str | bytes) -> Any:
        fields = [f.strip() for f in next(csv.reader([line]))]
        if fields == list(columns):
            return _SKIP
        if len(fields) != len(columns):
            out.reject(MALFORMED_CSV, line, f"expected {len(columns)} CSV fields", raw=raw)
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
