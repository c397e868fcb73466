"""The event schema every layer shares (design §5): columnar event batches and dead letters.

An event is one user's value for one slot of one stream::

    {"stream": "country", "user": "u-123", "slot": 42, "value": 3}

The connectors parse raw lines into ``EventBatch``es (``connectors.json_events``,
``connectors.csv_events``); the operators slot them and turn what they cannot use into
``DeadLetter``s. Both sides meet here, so neither has to import the other. This module holds no
privacy logic; it imports nothing of privstream.

Dead letters carry the original line: they belong to the trusted input side (same access as the
input topic) and are never part of the public output.
"""

from __future__ import annotations

import hashlib
import hmac
import json
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
    ``marker_tag`` is the marker's authentication tag (hex; None when it carries none): with the
    ``markers`` clock only a marker whose tag the clock key verifies closes slots.
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

    def __len__(self) -> int:
        return int(self.slots.shape[0])

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
        )

    def row_original(self, i: int) -> bytes | None:
        """The exact bytes of row ``i`` when ``row_text`` does not reproduce them."""
        return self.row_line(i)[1]

    def row_line(self, i: int) -> tuple[str, bytes | None]:
        """``(row_text(i), row_original(i))``, the line decoded once."""
        text = self.row_text(i)
        raw = self.raw[i] if self.raw is not None else None
        if isinstance(raw, bytes) and raw != text.encode("utf-8"):
            return text, raw
        return text, None

    def row_text(self, i: int) -> str:
        """The original line of row ``i``, or an equivalent JSON object."""
        if self.raw is not None:
            return line_text(self.raw[i]).strip()
        user, value = self.users[i], self.values[i]
        return json.dumps(
            {"stream": self.stream, "user": user.item() if hasattr(user, "item") else user,
             "slot": int(self.slots[i]),
             "value": value.tolist() if value.ndim else float(value)}
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
