"""JSON-lines events (design §5): the batch fast path and the line-by-line fallback.

A batch of well-formed events takes a fast path: one ``msgspec`` call for the whole batch (which
checks the field types in C) and column-wise checks. A batch with anything unusual in it falls
back to the line-by-line checks of ``connectors.parsing``, which give the same result for the
good lines and a precise dead-letter reason for each bad one.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Final

import msgspec
import numpy as np
from numpy.typing import NDArray

from privstream.connectors.parsing import INT_LIMIT, SKIP, Builder, SlotClock, parse_lines
from privstream.events import MALFORMED, MAX_EVENT_BYTES, DeadLetter, EventBatch


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
_Marks = list[tuple[str, int | None]]  # each marker's stream and slot, in line order


def _decode(lines: Sequence[bytes], max_bytes: int) -> tuple[list[_Row], bytes] | None:
    """Every line decoded in one call, with the joined batch; None when a line is oversized,
    malformed, holds several JSON values, or has a missing or mistyped field (or a ``ts``)."""
    if not lines or max(map(len, lines)) > max_bytes:
        return None
    joined = b"[" + b",".join(lines) + b"]"
    try:
        recs = _ROWS.decode(joined)  # types checked in C: str stream/user, int slot, number value
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return (recs, joined) if len(recs) == len(lines) else None


def _split_markers(recs: list[_Row], joined: bytes) -> tuple[list[int], _Marks, list[_Row]]:
    """The markers' line indices, their streams and slots, and the events in order."""
    if b"end_of_slot" not in joined:
        return [], [], recs
    marks = [i for i, r in enumerate(recs) if r.user is None]
    bounds = [-1, *marks, len(recs)]
    events = itertools.chain.from_iterable(recs[a + 1 : b] for a, b in itertools.pairwise(bounds))
    return marks, [(recs[i].stream, recs[i].end_of_slot) for i in marks], list(events)


def _stream_names(
    events: list[_Row], marked: _Marks, allowed: frozenset[str] | None
) -> set[str] | None:
    """The batch's streams, or None when one is empty or not allowed, a marker's slot is
    missing or negative, or markers come in a batch of several streams."""
    if any(through is None or through < 0 for _, through in marked):
        return None
    names = {r.stream for r in events} | {stream for stream, _ in marked}
    if "" in names or (allowed is not None and not names <= allowed):
        return None
    if marked and len(names) > 1:
        return None
    return names


def _columns(events: list[_Row], lines: Sequence[bytes], joined: bytes) -> EventBatch | None:
    """All events in one unnamed batch, or None when a user, slot, value or stated
    requirement is missing or out of range."""
    users = [r.user for r in events]
    if not all(users):
        return None  # an event without a user, or with an empty one
    try:  # a missing slot or value (None) raises TypeError, a huge slot OverflowError
        slot_arr = np.fromiter((r.slot for r in events), dtype=np.int64, count=len(events))
        value_arr = np.fromiter((r.value for r in events), dtype=np.float64, count=len(events))
    except (OverflowError, TypeError):
        return None
    if (slot_arr < 0).any() or (slot_arr >= INT_LIMIT).any() or not np.isfinite(value_arr).all():
        return None
    whole = EventBatch(
        "", slot_arr, np.asarray(users, dtype=object), value_arr, lines, None,
        *_requirements(events, joined),
    )  # fmt: skip
    if whole.epsilons is not None and whole.epsilons.shape[0] == 0:
        return None  # a stated requirement out of range: line by line, for its reason
    return whole


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
        or (win >= INT_LIMIT).any()
    ):
        return _EMPTY_F, _EMPTY_I
    return eps, win


def _cut_at_markers(
    whole: EventBatch, name: str, lines: Sequence[bytes], marks: list[int], marked: _Marks
) -> list[EventBatch | DeadLetter]:
    """A single-stream batch cut exactly as the line-by-line ``Builder`` cuts it: every marker
    carries the rows since the previous one (even none); rows after the last marker form a
    batch of their own."""
    batches: list[EventBatch | DeadLetter] = []
    row, prev = 0, -1  # first event row and line after the previous marker
    for k, (i, (_, through)) in enumerate(zip(marks, marked, strict=True)):
        seg = slice(row, i - k)  # the events between the previous marker and this one
        batches.append(replace(whole.select(seg, tuple(lines[prev + 1 : i]), through), stream=name))
        row, prev = i - k, i
    if row < len(whole):
        batches.append(
            replace(whole.select(slice(row, None), tuple(lines[prev + 1 :])), stream=name)
        )
    return batches


def _by_stream(
    whole: EventBatch, events: list[_Row], lines: Sequence[bytes]
) -> list[EventBatch | DeadLetter]:
    """One batch per stream, in first-seen order."""
    streams = [r.stream for r in events]
    stream_arr = np.asarray(streams, dtype=object)
    out: list[EventBatch | DeadLetter] = []
    for name in dict.fromkeys(streams):
        rows = np.flatnonzero(stream_arr == name)
        raws = tuple(lines[i] for i in rows.tolist())
        out.append(replace(whole.select(rows, raws), stream=name))
    return out


def _fast_json(
    lines: Sequence[bytes], allowed: frozenset[str] | None, max_bytes: int
) -> list[EventBatch | DeadLetter] | None:
    """The whole batch in one ``msgspec`` call and column-wise checks, or None when any line
    needs the line-by-line path (a bad or unusual line, a ``ts``, user indices, markers of a
    batch holding several streams).

    End-of-slot markers of a single-stream batch stay on this path: they cut the rows into
    batches exactly as the line-by-line ``Builder`` does.
    """
    decoded = _decode(lines, max_bytes)
    if decoded is None:
        return None
    recs, joined = decoded
    marks, marked, events = _split_markers(recs, joined)
    names = _stream_names(events, marked, allowed)
    whole = None if names is None else _columns(events, lines, joined)
    if names is None or whole is None:
        return None
    if marked:
        (name,) = names
        return _cut_at_markers(whole, name, lines, marks, marked)
    if len(names) == 1:
        (name,) = names
        return [replace(whole, stream=name)]
    return _by_stream(whole, events, lines)


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


def _decode_line(line: str, out: Builder, raw: str | bytes) -> Any:
    """One line by the standard parser: it reads NaN and huge integers, so they get a precise
    reason from the record checks."""
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        out.reject(MALFORMED, line, "not valid JSON", raw=raw)
        return SKIP


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
    return parse_lines(batch, _decode_line, streams, default_stream, clock, max_bytes)
