"""The event schema every layer shares (design §5): columnar event batches and dead letters.

An event is one user's value for one slot of one stream::

    {"stream": "country", "user": "u-123", "slot": 42, "value": 3}

The connectors parse raw lines into ``EventBatch``es (``connectors.json_events``,
``connectors.csv_events``); the operators slot them and turn what they cannot use into
``DeadLetter``s. Both sides meet here, so neither has to import the other. This module holds no
privacy logic; it imports nothing of privstream.

Dead letters belong to the trusted input side (same access as the input topic) and are never
part of the public output. One decided where the input's bytes are (the parse) carries them; one
decided by a stream's owner after a Kafka batch crossed to it (late, duplicate, population full,
unregistered, ...) carries where the input is (``Located``: topic, partition, offset, length)
and its parsed fields instead: nothing raw crosses a process (issue 26).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
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
REQUIREMENT_CHANGED: Final = "requirement_changed"
STREAM_HALTED: Final = "stream_halted"
UNREGISTERED: Final = "unregistered_user"
UNAUTHENTICATED_MARKER: Final = "unauthenticated_marker"
ALREADY_PUBLISHED: Final = "already_published"  # a slot an earlier incarnation published
INCARNATION_COOLDOWN: Final = "incarnation_cooldown"  # a new incarnation's deliberate gap
WITHDRAWN: Final = "withdrawn_user"  # a user withdrawn from the registration table on resume
REASONS: Final = (
    MALFORMED,
    MALFORMED_CSV, MISSING_FIELD, INVALID_TYPE, NEGATIVE_SLOT, OVERSIZED, UNKNOWN_STREAM, OUT_OF_DOMAIN,
    DUPLICATE, LATE, FAR_FUTURE, POPULATION_FULL, USER_ID_KIND, REQUIREMENT_CHANGED, STREAM_HALTED,
    UNREGISTERED, UNAUTHENTICATED_MARKER, ALREADY_PUBLISHED, INCARNATION_COOLDOWN, WITHDRAWN,
)  # fmt: skip


_MARKER_PERSON = b"privstream-mrk"


def marker_tag(clock_key: bytes, stream: str, end_of_slot: int) -> str:
    """The authentication tag of the end-of-slot marker ``(stream, end_of_slot)``: hex of
    BLAKE2b (16 bytes) keyed with the clock key over the length-prefixed pair. Without the
    clock key a valid tag for a marker not yet written cannot be made (BLAKE2b is a PRF)."""
    h = hashlib.blake2b(key=clock_key, digest_size=16, person=_MARKER_PERSON)
    for part in (stream.encode(), int(end_of_slot).to_bytes(16, "little", signed=True)):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def marker_authentic(clock_key: bytes, stream: str, end_of_slot: int, tag: str | None) -> bool:
    """Whether ``tag`` authenticates the marker (compared in constant time)."""
    if not isinstance(tag, str):
        return False
    return hmac.compare_digest(tag.lower(), marker_tag(clock_key, stream, end_of_slot))


def line_text(line: str | bytes) -> str:
    """A raw input line as text (invalid UTF-8 replaced)."""
    return line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line


@dataclass(frozen=True)
class Located:
    """Where an input message is on its Kafka topic, and its length in bytes: what a dead
    letter decided away from the message's bytes carries instead of them (the bytes stay on
    the input topic)."""

    topic: str
    partition: int
    offset: int
    length: int


USER_SEPARATOR: Final = "\x00"
"""Named user ids cross a process as one string joined by this (``pack_users``)."""


def pack_users(users: NDArray[Any]) -> str | None:
    """Named user ids as one string joined by ``USER_SEPARATOR`` — one buffer to pickle instead
    of a Python object per id (a third of the cost per event; ``bench/README.md`` §3) — or None
    when they are not all strings, none are there, or one holds the separator."""
    if users.dtype != object or users.shape[0] == 0:
        return None
    names = users.tolist()
    try:
        joined = USER_SEPARATOR.join(names)
    except TypeError:  # not all strings
        return None
    return joined if joined.count(USER_SEPARATOR) == len(names) - 1 else None


def unpack_users(joined: str) -> NDArray[Any]:
    """The user ids ``pack_users`` joined, as the object array they were."""
    names = joined.split(USER_SEPARATOR)
    return np.fromiter(names, dtype=object, count=len(names))


@dataclass(frozen=True)
class EventBatch:
    """Events of one stream in columns.

    ``users`` holds either user-id strings (dtype object) or, for in-process sources such as the
    synthetic generator, dense user indices ``0..n−1`` (integer dtype). ``raw`` keeps each row's
    original line where it was parsed (files; a Kafka poll only when asked, as the new
    incarnation's skip does): None when the source has no text form or the bytes stayed behind.
    ``complete_through`` is an end-of-slot marker travelling with the batch: once these rows are
    in, every slot ``<= complete_through`` of the stream is complete and can be released. Keeping
    the marker inside the batch makes it impossible for it to overtake its own events.
    ``epsilons``/``windows`` are the privacy requirements ``(ε_i, w_i)`` rows state (personalized
    mechanisms; NaN / 0 where a row states none), or None when no row states one.
    ``partition`` is the input partition the rows came from (a Kafka partition; 0 for files and
    in-process sources): the slotting tracks each partition's progress (``operators.watermark``).
    ``marker_tag`` is the marker's authentication tag (hex; None when it carries none): with the
    ``markers`` clock only a marker whose tag the clock key verifies closes slots.
    ``lines`` is each row's index among the lines its parser read (set by the parsers).
    ``topic``, ``offsets`` and ``lengths`` say where each row's message is on the input topic
    (``partition``) and its length in bytes (set by ``parse_raw_batch``): a dead letter of a
    row without ``raw`` carries them (``Located``) and the row's parsed fields instead of the
    bytes. Pickled — when a batch crosses to the process owning its stream — named users travel
    as one string (``pack_users``).
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
    marker_tag: str | None = None
    lines: NDArray[np.int64] | None = None
    topic: str | None = None
    offsets: NDArray[np.int64] | None = None
    lengths: NDArray[np.int32] | None = None

    def __len__(self) -> int:
        return int(self.slots.shape[0])

    def __reduce__(self) -> tuple[Any, ...]:
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        packed = pack_users(self.users)
        if packed is not None:
            fields[2] = None
        return _unpickle, (tuple(fields), packed)

    def select(
        self,
        rows: slice | NDArray[np.int64],
        raw: Sequence[str | bytes] | None,
        complete_through: int | None = None,
        marker_tag: str | None = None,
    ) -> EventBatch:
        """The batch of ``rows`` (all columns), with its lines and marker (and its tag)."""
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
            marker_tag,
            None if self.lines is None else self.lines[rows],
            self.topic,
            None if self.offsets is None else self.offsets[rows],
            None if self.lengths is None else self.lengths[rows],
        )

    def row_line(self, i: int) -> tuple[str, bytes | Located | None]:
        """Row ``i`` for a dead letter: ``(text, source)`` (``RowSources.line``)."""
        return self.row_sources.line(i, self.users[i], int(self.slots[i]), self.values[i])

    @functools.cached_property
    def row_sources(self) -> RowSources:
        """What this batch's dead letters need besides a row's user, slot and value, built
        once per batch: the rows a stream holds keep ``select`` of it
        (``operators.registration``'s newcomers), so that a dead letter's text is made only
        when one is."""
        return RowSources(self.stream, self.raw, self.topic, self.partition, self.offsets,
                          self.lengths, self.epsilons, self.windows)  # fmt: skip


_OPTIONAL: Final = ("raw", "epsilons", "windows", "lines", "offsets", "lengths")
"""An event batch's optional per-row columns."""


def mergeable(first: EventBatch, then: EventBatch) -> bool:
    """Whether ``then``'s rows may follow ``first``'s in one batch (``concat``): one stream,
    partition and topic, the same optional columns, the same kind of user ids, and no marker
    on ``first`` (a marker ends its rows)."""
    return (
        first.complete_through is None
        and (first.stream, first.partition, first.topic)
        == (then.stream, then.partition, then.topic)
        and first.users.dtype.kind == then.users.dtype.kind
        and all((getattr(first, c) is None) == (getattr(then, c) is None) for c in _OPTIONAL)
    )


def concat(batches: Sequence[EventBatch]) -> EventBatch:
    """One batch of ``batches``' rows in their order (each ``mergeable`` with the next), with
    the last one's marker."""
    if len(batches) == 1:
        return batches[0]
    first, last = batches[0], batches[-1]

    def joined(column: str) -> Any:
        if getattr(first, column) is None:
            return None
        return np.concatenate([getattr(b, column) for b in batches])

    raw = None if first.raw is None else [line for b in batches for line in b.raw or ()]
    return dataclasses.replace(
        first, slots=joined("slots"), users=joined("users"), values=joined("values"), raw=raw,
        complete_through=last.complete_through, epsilons=joined("epsilons"),
        windows=joined("windows"), marker_tag=last.marker_tag, lines=joined("lines"),
        offsets=joined("offsets"), lengths=joined("lengths"),
    )  # fmt: skip


@dataclass(frozen=True)
class RowSources:
    """Where a batch's rows came from, for their dead letters (``EventBatch.row_sources``):
    the lines (``raw``), or the topic, partition, offsets and lengths with each row's stated
    requirement."""

    stream: str
    raw: Sequence[str | bytes] | None
    topic: str | None
    partition: int
    offsets: NDArray[np.int64] | None
    lengths: NDArray[np.int32] | None
    epsilons: NDArray[np.float64] | None
    windows: NDArray[np.int64] | None

    def select(self, rows: NDArray[np.intp]) -> RowSources:
        """The sources of ``rows`` alone (their row ``k`` is ``rows[k]`` here): what a held
        report keeps, so that it pins none of the rest of its batch."""

        def pick(column: NDArray[Any] | None) -> Any:
            return None if column is None else column[rows]

        raw = None if self.raw is None else tuple(self.raw[i] for i in rows.tolist())
        return RowSources(self.stream, raw, self.topic, self.partition, pick(self.offsets),
                          pick(self.lengths), pick(self.epsilons), pick(self.windows))  # fmt: skip

    def line(self, i: int, user: Any, slot: int, value: Any) -> tuple[str, bytes | Located | None]:
        """Row ``i`` (of ``user`` at ``slot`` with ``value``) for a dead letter: ``(text,
        source)``. With ``raw``, its line and its exact bytes when the text does not reproduce
        them (else None); located on its topic, its parsed fields and where it is
        (``Located``); else an equivalent JSON object, None."""
        if self.raw is not None:
            raw = self.raw[i]
            text = line_text(raw).strip()
            return text, raw if isinstance(raw, bytes) and raw != text.encode("utf-8") else None
        if self.topic is not None and self.offsets is not None and self.lengths is not None:
            where = Located(self.topic, self.partition, int(self.offsets[i]), int(self.lengths[i]))
            return self._fields(i, user, slot, value, stated=True), where
        return self._fields(i, user, slot, value, stated=False), None

    def _fields(self, i: int, user: Any, slot: int, value: Any, stated: bool) -> str:
        """Row ``i``'s parsed fields as a JSON object (``stated``: with the requirement it
        states, ``epsilon``/``window``, where it states one)."""
        fields: dict[str, Any] = {"stream": self.stream, "user": user.item() if hasattr(user, "item") else user,
                  "slot": slot,
                  "value": np.asarray(value, dtype=np.float64).tolist()}  # fmt: skip
        if stated and self.epsilons is not None and not math.isnan(self.epsilons[i]):
            fields["epsilon"] = float(self.epsilons[i])
        if stated and self.windows is not None and self.windows[i] > 0:
            fields["window"] = int(self.windows[i])
        return json.dumps(fields)


Held = tuple[Any, "RowSources | str", "int | bytes | Located | None"]
"""A report a stream holds until its slot closes: ``(value, sources, row)``, its value a float
or a list of floats (a state of an earlier version: a NumPy value, or ``(value, text,
source)``). Never changed in place, nor its value or sources:
a snapshot shares them with the live state (``StreamState.__deepcopy__``)."""


def held_line(held: Held, user: str, slot: int) -> tuple[str, bytes | Located | None]:
    """The dead-letter ``(text, source)`` of a held report of ``user`` at ``slot``."""
    value, sources, row = held
    if isinstance(sources, RowSources):
        assert isinstance(row, int)
        return sources.line(row, user, slot, value)
    assert not isinstance(row, int)
    return sources, row


def _unpickle(fields: tuple[Any, ...], users: str | None) -> EventBatch:
    """An ``EventBatch`` from what ``EventBatch.__reduce__`` pickled."""
    columns = list(fields)
    if users is not None:
        columns[2] = unpack_users(users)
    return EventBatch(*columns)


@dataclass(frozen=True)
class DeadLetter:
    """An input the flow could not use, with a machine-readable ``reason`` (see ``REASONS``).

    ``payload`` is the input as text (cut to its first 256 characters when oversized);
    ``original`` keeps the exact input bytes when they are not simply ``payload`` in UTF-8
    (invalid UTF-8, surrounding whitespace, oversized), so a dead-letter topic can carry them.
    ``topic``/``partition``/``offset`` say where the input was read when the parser of a Kafka
    poll knows it (None otherwise), so a dead letter whose payload had to be cut points at the
    original. ``original_length`` is set when the letter was decided away from the input's
    bytes (a stream's owner, after the batch crossed to it): ``payload`` then holds the input's
    parsed fields, not the input, and ``original_length`` the input's length in bytes; the
    input itself stays on its topic at ``topic``/``partition``/``offset``.
    """

    reason: str
    stream: str | None
    payload: str
    detail: str = ""
    original: bytes | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    original_length: int | None = None

    @classmethod
    def of(
        cls, reason: str, stream: str | None, text: str, detail: str, source: bytes | Located | None
    ) -> DeadLetter:
        """The dead letter of an input whose text and source ``EventBatch.row_line`` gave: its
        bytes (``original``), or where it is (``Located``: the text is its parsed fields)."""
        if isinstance(source, Located):
            return cls(reason, stream, text, detail, None, source.topic, source.partition,
                       source.offset, source.length)  # fmt: skip
        return cls(reason, stream, text, detail, source)

    @property
    def located(self) -> bool:
        """Whether the payload holds the input's parsed fields (the input is on its topic)."""
        return self.original_length is not None

    def payload_bytes(self) -> bytes:
        """The input exactly as it arrived (its parsed fields when ``located``)."""
        return self.original if self.original is not None else self.payload.encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reason": self.reason,
            "stream": self.stream,
            "detail": self.detail,
            "payload": self.payload,
        }
        if self.located:
            out["source"] = {"topic": self.topic, "partition": self.partition,
                             "offset": self.offset, "length": self.original_length}  # fmt: skip
        return out
