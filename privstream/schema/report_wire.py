"""Report-topic messages (``ldp-reports`` mode, issue 23): the batch fast path and the
per-message fallback.

The usual message of a report topic is a well-formed ``Report``. ``decode_poll`` reads each
one with ``msgspec`` (its JSON and field types checked in C, a tenth of the cost of
``json.loads`` plus the dictionary walk) and keeps runs of them as columns
(``ReportColumns``): the fields reports of one request share pass ``Report``'s constructor
checks once per distinct value, each device id its length check, so every report of a run
would build a valid ``Report`` (``ReportColumns.reports`` builds them). Anything else (a round
marker, a message the fast decoder refuses or that the protocol refuses) goes through
``decode_message`` itself, which names the reason. So every message decodes to exactly what
``decode_message`` gives it, whichever path it took (``decode_messages``, the poll one message
at a time: ``tests/connectors/test_report_wire.py`` checks it on hostile and random
messages).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from privstream.schema.events import MAX_EVENT_BYTES
from privstream.schema.protocol import (
    MAX_ID_CHARS,
    REPORT_TYPE,
    VERSION,
    Close,
    ProtocolError,
    Report,
    decode_message,
)

# What reports of one request share: its coordinates and the oracle and budget they name.
_KEY = operator.attrgetter("type", "version", "request", "stream", "slot", "round", "purpose",
                           "oracle", "epsilon")  # fmt: skip
_FIELDS = [operator.attrgetter(name) for name in ("request", "slot", "round", "purpose",
                                                  "stream", "oracle", "epsilon", "type",
                                                  "version")]  # fmt: skip
_DEVICE = operator.attrgetter("device")
_VALUE = operator.attrgetter("value")


class _ReportRow(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A report as the fast path reads it: every field required, none other allowed, the
    JSON types ``decode_message`` needs (the protocol's range and pattern checks come after,
    in ``Report``'s constructor). ``epsilon`` keeps an integer an integer, as ``json`` does."""

    type: str
    version: int
    request: str
    stream: str
    slot: int
    round: int
    purpose: str
    device: str
    oracle: str
    epsilon: int | float
    value: Any


_ROW = msgspec.json.Decoder(_ReportRow)

Decoded = Report | Close | ProtocolError
"""A message's decoding: the report or round marker, or why the protocol refuses it."""


def decode_messages(lines: Sequence[bytes | str]) -> list[Decoded]:
    """Each of ``lines`` decoded as ``schema.protocol.decode_message`` decodes it, with the
    ``ProtocolError`` it raises in place of a refused message (module docstring): what
    ``decode_poll`` reads, one message at a time."""
    out: list[Decoded] = []
    for _, item in decode_poll(lines):
        out.extend(item.reports() if isinstance(item, ReportColumns) else [item])
    return out


def _one(line: bytes | str) -> Decoded:
    try:
        return decode_message(line)
    except ProtocolError as exc:
        return exc


Key = tuple[str, str, int, int, str, str, int | float]
"""What a run's reports share: request, stream, slot, round, purpose, oracle, epsilon."""


@dataclass(frozen=True)
class ReportColumns:
    """Consecutive well-formed reports of one stream, decoded in a batch and kept as columns:
    each would build a valid ``Report`` (``reports()`` builds them). ``keys`` are the distinct
    shared fields and ``group`` each report's index into them (None: all share ``keys[0]``)."""

    stream: str
    rows: list[_ReportRow]
    keys: list[Key]
    group: NDArray[np.intp] | None

    def __len__(self) -> int:
        return len(self.rows)

    def devices(self) -> list[str]:
        return list(map(_DEVICE, self.rows))

    def values(self) -> list[Any]:
        return list(map(_VALUE, self.rows))

    def report(self, i: int) -> Report:
        return _report(self.rows[i])

    def reports(self) -> list[Report]:
        return [_report(row) for row in self.rows]

    def groups(self) -> list[tuple[Key, NDArray[np.intp]]]:
        """Each key with the indices of its reports, in order."""
        if self.group is None:
            return [(self.keys[0], np.arange(len(self.rows)))]
        return [(key, np.flatnonzero(self.group == g)) for g, key in enumerate(self.keys)]


def _report(row: _ReportRow) -> Report:
    return Report(row.request, row.stream, row.slot, row.round, row.purpose, row.device,
                  row.oracle, row.epsilon, row.value)  # fmt: skip


Polled = Decoded | ReportColumns
"""A poll's item: a message on its own (a marker, a refused message, an unusual report) or
a run of well-formed reports as columns."""


def decode_poll(
    lines: Sequence[bytes | str], streams: Collection[str] | None = None
) -> list[tuple[int, Polled]]:
    """``lines`` as ``(index of the first line, item)``: runs of consecutive well-formed
    reports of one of ``streams`` (None: any) as ``ReportColumns``, every other message as
    ``decode_messages`` decodes it (``_one``). Each report reads as ``decode_message`` reads it:
    a run holds only reports whose shared fields and device id pass ``Report``'s checks."""
    rows = _rows(lines)
    if None not in rows:  # the usual poll: one run of one request's reports
        whole = _whole(rows, streams)  # type: ignore[arg-type]
        if whole is not None:
            return [(0, whole)]
    keys = {key: _plain(key, streams) for key in set(map(_KEY, filter(None, rows)))}
    out: list[tuple[int, Polled]] = []
    run: list[_ReportRow] = []
    for i, (line, row) in enumerate(zip(lines, rows, strict=True)):
        plain = row is not None and keys[_KEY(row)] and 0 < len(row.device) <= MAX_ID_CHARS
        if run and (not plain or row.stream != run[0].stream):  # type: ignore[union-attr]
            out.append((i - len(run), _columns(run)))
            run = []
        if plain:
            run.append(row)  # type: ignore[arg-type]
        else:
            out.append((i, _one(line)))
    if run:
        out.append((len(lines) - len(run), _columns(run)))
    return out


def _rows(lines: Sequence[bytes | str]) -> list[_ReportRow | None]:
    """Each line as a ``_ReportRow`` (None: oversized, or refused by ``msgspec``)."""
    decode = _ROW.decode
    if lines and max(map(len, lines)) <= MAX_EVENT_BYTES:
        try:
            return list(map(decode, lines))  # the usual poll: one call
        except (msgspec.MsgspecError, ValueError, RecursionError):
            pass
    out: list[_ReportRow | None] = []
    for line in lines:
        try:
            out.append(decode(line) if len(line) <= MAX_EVENT_BYTES else None)
        except (msgspec.MsgspecError, ValueError, RecursionError):
            out.append(None)
    return out


def _whole(rows: list[_ReportRow], streams: Collection[str] | None) -> ReportColumns | None:
    """``rows`` as one run, if they share their fields and every one is plain."""
    if not rows or any(len(set(map(field, rows))) != 1 for field in _FIELDS):
        return None  # (a set per field allocates nothing per report: no collector's work)
    key = _KEY(rows[0])
    if not _plain(key, streams):
        return None
    devices = list(map(_DEVICE, rows))
    if min(map(len, devices)) == 0 or max(map(len, devices)) > MAX_ID_CHARS:
        return None
    return ReportColumns(rows[0].stream, rows, [key[2:]], None)


def _plain(key: tuple[Any, ...], streams: Collection[str] | None) -> bool:
    """Whether reports with these shared fields build (with a valid device id), of a served
    stream."""
    kind, version, *shared = key
    if kind != REPORT_TYPE or version != VERSION or (streams is not None and key[3] not in streams):
        return False
    request, stream, slot, round_, purpose, oracle, epsilon = shared
    try:
        Report(request, stream, slot, round_, purpose, "-", oracle, epsilon, None)
    except ValueError:  # (ProtocolError)
        return False
    return True


def _columns(rows: list[_ReportRow]) -> ReportColumns:
    keys = list(map(_KEY, rows))
    distinct = list(dict.fromkeys(keys))
    shared = [k[2:] for k in distinct]
    if len(distinct) == 1:
        return ReportColumns(rows[0].stream, rows, shared, None)
    index = {k: g for g, k in enumerate(distinct)}
    group = np.fromiter(map(index.__getitem__, keys), dtype=np.intp, count=len(keys))
    return ReportColumns(rows[0].stream, rows, shared, group)
