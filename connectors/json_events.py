"""JSON-lines events (design §5): the batch fast path and the line-by-line fallback.

A batch of well-formed events takes a fast path: each line decoded on its own by ``msgspec``
(which checks the field types in C) and column-wise checks. A batch with anything unusual in it
falls back to the line-by-line checks of ``connectors.parsing``, which give the same result for
the good lines and a precise dead-letter reason for each bad one. The fast path gives a result
only where it equals the line-by-line one (``tests/connectors/test_parser_fuzz.py`` checks it),
so no line's fate depends on which path, batch or poll it went through.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, Literal

import msgspec
import numpy as np
from numpy.typing import NDArray

from privstream.connectors.parsing import (
    INT_LIMIT,
    MAX_DEPTH,
    SKIP,
    Builder,
    Shapes,
    SlotClock,
    invalid_utf8,
    load_json,
    parse_lines,
    too_deep,
)
from privstream.schema.events import MALFORMED, MAX_EVENT_BYTES, DeadLetter, EventBatch


class _Row(msgspec.Struct, gc=False):
    """One line of the fast path: an event, or (``user`` None) an end-of-slot marker."""

    stream: str
    user: str | msgspec.UnsetType = msgspec.UNSET  # (an explicit null is no marker)
    slot: int | None = None
    value: float | None = None
    end_of_slot: int | None = None
    epsilon: float | None = None
    window: int | None = None
    tag: str | None = None  # a marker's authentication tag


_Marks = list[tuple[str, int | None, str | None]]  # each marker's stream, slot and tag, in order
_User = str | msgspec.UnsetType


@functools.lru_cache(maxsize=64)
def _rows(allowed: frozenset[str] | None) -> msgspec.json.Decoder[_Row]:
    """The decoder of a batch whose streams must be ``allowed`` (any stream when None).

    With allowed streams, ``stream`` is decoded as a ``Literal`` of them: a line of another
    stream fails in C (and the batch goes line by line, for its ``unknown_stream`` reason),
    and every row shares the one string of its stream instead of a fresh one per line — a
    tenth of the fast path's cost per message (bench/README.md, Kafka read throughput)."""
    if allowed is None:
        return msgspec.json.Decoder(_Row)
    names: Any = Literal.__getitem__(tuple(sorted(allowed)))
    row = msgspec.defstruct("_AllowedRow", [("stream", names)], bases=(_Row,))
    return msgspec.json.Decoder(row)


def _shallow(lines: Sequence[bytes], joined: bytes) -> bool:
    """No line nests deeper than ``MAX_DEPTH``: at most ``MAX_DEPTH − 1`` brackets beyond one
    per line in the whole batch (one vectorised count: the usual poll), else line by line."""
    codes = np.frombuffer(joined, dtype=np.uint8)
    opens = int(np.count_nonzero((codes | 32) == ord("{")))  # "[" | 32 is "{": both counted
    if opens - len(lines) < MAX_DEPTH:
        return True
    return not any(map(too_deep, lines))


def _utf8(joined: bytes) -> bool:
    """The batch is valid UTF-8 (``msgspec`` skips the keys of unknown fields unchecked; the
    line-by-line path refuses invalid UTF-8 anywhere in a line). ASCII, the usual poll, is
    one check in C."""
    if joined.isascii():
        return True
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _decode(
    lines: Sequence[bytes], allowed: frozenset[str] | None, max_bytes: int
) -> tuple[list[_Row], bytes, NDArray[np.int32]] | None:
    """Every line decoded on its own (as the line-by-line path reads it: one line can never
    complete another's JSON), with the joined batch and each line's length in bytes; None when
    a line is oversized, too deep, malformed, holds several JSON values, has a missing or
    mistyped field (or a ``ts``), or names a stream that is not ``allowed``."""
    if not lines:
        return None
    sizes = np.fromiter(map(len, lines), dtype=np.int32, count=len(lines))
    if sizes.max() > max_bytes:
        return None
    joined = b"\n".join(lines)
    if not _shallow(lines, joined) or not _utf8(joined):
        return None
    try:  # types checked in C: allowed stream, str user, int slot, number value
        recs = list(map(_rows(allowed).decode, lines))
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return None  # (invalid UTF-8 inside a string raises UnicodeDecodeError, a ValueError)
    return recs, joined, sizes


def _split_markers(
    recs: list[_Row], users: list[_User], joined: bytes
) -> tuple[list[int], _Marks, list[_Row], list[_User]]:
    """The markers' line indices, their streams and slots, and the events in order with their
    users (``users`` holds every line's)."""
    if all(users):  # the usual poll: no marker (a line without user) and no empty user
        return [], [], recs, users
    if b"end_of_slot" not in joined:
        return [], [], recs, users
    kept = [user is not msgspec.UNSET for user in users]  # events; markers have no user
    marks, i = [], -1
    with contextlib.suppress(ValueError):  # (``index`` finds the few markers in C)
        while True:
            i = kept.index(False, i + 1)
            marks.append(i)
    marked = [(recs[i].stream, recs[i].end_of_slot, recs[i].tag) for i in marks]
    events = list(itertools.compress(recs, kept))
    return marks, marked, events, list(itertools.compress(users, kept))


def _stream_names(
    events: list[_Row], marked: _Marks, allowed: frozenset[str] | None
) -> set[str] | None:
    """The batch's streams, or None when one is empty or not allowed, or a marker's slot is
    missing or negative. (The decoder let only ``allowed`` streams through: with one allowed
    stream, it is every line's.)"""
    if any(through is None or not 0 <= through < INT_LIMIT for _, through, _ in marked):
        return None
    if allowed is not None and len(allowed) == 1:
        names = set(allowed)
    else:
        names = {r.stream for r in events} | {stream for stream, _, _ in marked}
    if "" in names or (allowed is not None and not names <= allowed):
        return None
    return names


def _columns(
    events: list[_Row],
    users: list[_User],
    lines: Sequence[bytes],
    marks: list[int],
    sizes: NDArray[np.int32],
) -> EventBatch | None:
    """All events (``users`` their users; ``marks`` the markers' line indices, ``sizes`` every
    line's length) in one unnamed batch, each row with its line index and length, or None when
    a user, slot, value or stated requirement is missing or out of range.

    Each column is read off the rows by a list comprehension and converted by ``np.fromiter``
    from that list: half the cost of a generator feeding ``np.fromiter``, which the ~0.25 µs per
    message of the whole fast path notices (bench/README.md, Kafka read throughput)."""
    if not all(users):
        return None  # an event without a user, or with an empty one
    n = len(events)
    try:  # a missing slot or value (None) raises TypeError, a huge slot OverflowError
        slot_arr = np.fromiter([r.slot for r in events], dtype=np.int64, count=n)
        value_arr = np.fromiter([r.value for r in events], dtype=np.float64, count=n)
    except (OverflowError, TypeError):
        return None
    if (slot_arr < 0).any() or (slot_arr >= INT_LIMIT).any() or not np.isfinite(value_arr).all():
        return None
    index = np.arange(len(lines), dtype=np.int64)
    index = np.delete(index, marks) if marks else index
    whole = EventBatch(
        "", slot_arr, np.fromiter(users, dtype=object, count=n), value_arr, lines, None,
        *_requirements(events), lines=index, lengths=sizes[index] if marks else sizes,
    )  # fmt: skip
    if whole.epsilons is not None and whole.epsilons.shape[0] == 0:
        return None  # a stated requirement out of range: line by line, for its reason
    return whole


_EMPTY_F: Final = np.zeros(0)
_EMPTY_I: Final = np.zeros(0, dtype=np.int64)


def _requirements(
    events: Sequence[_Row],
) -> tuple[NDArray[np.float64] | None, NDArray[np.int64] | None]:
    """The stated ``(ε_i, w_i)`` columns of the fast path (None, None when no event states one,
    as the line-by-line ``Builder`` gives; empty arrays when a stated value is out of range)."""
    if not [r for r in events if r.epsilon is not None or r.window is not None]:
        return None, None
    n, nan = len(events), math.nan
    try:
        eps = np.fromiter([nan if r.epsilon is None else r.epsilon for r in events], np.float64, n)
        win = np.fromiter([0 if r.window is None else r.window for r in events], np.int64, n)
    except OverflowError:
        return _EMPTY_F, _EMPTY_I
    said = np.fromiter([r.window is not None for r in events], bool, n)
    if (
        not (eps[~np.isnan(eps)] > 0).all()
        or not (win[said] >= 1).all()
        or (win >= INT_LIMIT).any()
    ):
        return _EMPTY_F, _EMPTY_I
    return eps, win


def _cut_by_stream(
    whole: EventBatch,
    streams: list[str],
    lines: Sequence[bytes],
    marks: list[int],
    marked: _Marks,
) -> list[EventBatch | DeadLetter]:
    """A batch cut as the line-by-line ``Builder`` cuts it: each marker carries its stream's
    rows since that stream's previous marker (even none), in the markers' order; then each
    stream's rows after its last marker, streams in the order of their first such row.
    (``streams`` holds every event's stream; ``whole.lines`` every event's line.)"""
    stream_arr = np.asarray(streams, dtype=object)
    rows_of = {name: np.flatnonzero(stream_arr == name) for name in dict.fromkeys(streams)}
    line_of = whole.lines
    assert line_of is not None  # (``_columns`` numbers every event's line)
    done: dict[str, int] = {}  # per stream, its first row not yet in a batch
    out: list[EventBatch | DeadLetter] = []

    def cut(name: str, end: int, through: int | None, tag: str | None) -> EventBatch:
        rows = rows_of.get(name, _EMPTY_I)
        start = done.get(name, 0)
        stop = int(np.searchsorted(rows, end)) if through is not None else len(rows)
        done[name] = stop
        mine = rows[start:stop]
        raws = tuple(lines[i] for i in line_of[mine].tolist())
        return replace(whole.select(mine, raws, through, tag), stream=name)

    for k, (i, (name, through, tag)) in enumerate(zip(marks, marked, strict=True)):
        out.append(cut(name, i - k, through, tag))  # (i - k events come before line i)
    rest = [(int(rows[done.get(name, 0)]), name) for name, rows in rows_of.items()
            if done.get(name, 0) < len(rows)]  # fmt: skip
    out.extend(cut(name, len(whole), None, None) for _, name in sorted(rest))
    return out


def _fast_json(
    lines: Sequence[bytes],
    allowed: frozenset[str] | None,
    max_bytes: int,
    vectors: frozenset[str] = frozenset(),
) -> list[EventBatch | DeadLetter] | None:
    """The whole batch by ``msgspec`` and column-wise checks, or None when any line needs the
    line-by-line path (a bad or unusual line, a ``ts``, user indices, a stream of ``vectors``:
    the fast path reads one number per event).

    End-of-slot markers stay on this path: they cut their stream's rows into batches exactly as
    the line-by-line ``Builder`` does (a quarter of the polls of a many-stream topic hold some:
    line by line, they were 27–40 % of its parse time).
    """
    decoded = _decode(lines, allowed, max_bytes)
    if decoded is None:
        return None
    recs, joined, sizes = decoded
    marks, marked, events, users = _split_markers(recs, [r.user for r in recs], joined)
    names = _stream_names(events, marked, allowed)
    if names is not None and not names.isdisjoint(vectors):
        return None
    whole = None if names is None else _columns(events, users, lines, marks, sizes)
    if names is None or whole is None:
        return None
    if len(names) == 1 and not marked:  # the usual poll: one stream, no marker
        (name,) = names
        return [replace(whole, stream=name)]
    return _cut_by_stream(whole, [r.stream for r in events], lines, marks, marked)


def parse_json_batch(
    lines: Sequence[bytes],
    *,
    streams: Iterable[str] | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
    shapes: Shapes = None,
) -> list[EventBatch | DeadLetter] | None:
    """The batch fast path of ``parse_json_lines`` alone: its result when every line is an
    acceptable event or marker (so there are no dead letters), None otherwise. An empty or
    blank line always gives None (it is no JSON value). It never raises: a failure of the fast
    path leaves the batch to the line-by-line path, whose result it would equal."""
    allowed = frozenset(streams) if streams is not None else None
    if isinstance(shapes, int) and shapes:
        return None  # every stream takes vectors: the fast path reads one number per event
    named = shapes if shapes is not None and not isinstance(shapes, int) else {}
    vectors = frozenset(name for name, shape in named.items() if shape)
    try:
        return _fast_json(lines, allowed, max_bytes, vectors)
    except Exception:  # (a bug, not an input: the line-by-line path decides every line)
        return None


def _decode_line(line: str, out: Builder, raw: str | bytes) -> Any:
    """One line by the standard parser: it reads NaN and huge integers, so they get a precise
    reason from the record checks. Invalid UTF-8 is malformed: replacing it would merge
    different user ids into one. A line nested deeper than ``MAX_DEPTH`` is malformed."""
    if invalid_utf8(line, raw):
        out.reject(MALFORMED, line, "not valid UTF-8", raw=raw)
        return SKIP
    try:
        return load_json(line)
    except ValueError as exc:
        out.reject(MALFORMED, line, str(exc), raw=raw)
        return SKIP


def parse_json_lines(
    lines: Iterable[str | bytes],
    *,
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    clock: SlotClock | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
    shapes: Shapes = None,
) -> list[EventBatch | DeadLetter]:
    """Parse JSON-lines events: the ``EventBatch``es per stream (cut at markers), then the
    dead letters. Lines may be ``bytes`` (Kafka message values) or ``str`` (file lines).
    ``shapes`` gives streams' value shapes (``parsing.Shapes``; the task's ``value_shape``): a
    value of another shape is an ``invalid_type`` dead letter."""
    batch = lines if isinstance(lines, Sequence) else list(lines)
    if batch and set(map(type, batch)) == {bytes}:
        fast = parse_json_batch(batch, streams=streams, max_bytes=max_bytes, shapes=shapes)  # type: ignore[arg-type]
        if fast is not None:
            return fast
    return parse_lines(batch, _decode_line, streams, default_stream, clock, max_bytes, shapes)
