"""Report-topic messages (``ldp-reports`` mode, issue 23): the batch fast path and the
per-message fallback.

The usual message of a report topic is a well-formed ``Report``. ``decode_messages`` reads each
one with ``msgspec`` (its JSON and field types checked in C, a tenth of the cost of
``json.loads`` plus the dictionary walk), then builds the ``Report`` with the same constructor
and so the same validation as ``schema.protocol.decode_message``. Anything else (a round
marker, a message the fast decoder refuses or that the protocol refuses) goes through
``decode_message`` itself, which names the reason. So every message decodes to exactly what
``decode_message`` gives it, whichever path it took (``tests/connectors/test_json_reports.py``
checks it on hostile and random messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from privstream.schema.events import MAX_EVENT_BYTES
from privstream.schema.protocol import (
    REPORT_TYPE,
    VERSION,
    Close,
    ProtocolError,
    Report,
    decode_message,
)


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
    ``ProtocolError`` it raises in place of a refused message (module docstring)."""
    out: list[Decoded] = []
    decode = _ROW.decode
    for line in lines:
        if len(line) <= MAX_EVENT_BYTES:
            try:
                row = decode(line)
                if row.type == REPORT_TYPE and row.version == VERSION:
                    out.append(Report(row.request, row.stream, row.slot, row.round, row.purpose,
                                      row.device, row.oracle, row.epsilon, row.value))  # fmt: skip
                    continue
            except (msgspec.MsgspecError, ValueError, RecursionError):
                pass  # (ProtocolError is a ValueError; invalid UTF-8 raises UnicodeDecodeError)
        out.append(_one(line))
    return out


def _one(line: bytes | str) -> Decoded:
    try:
        return decode_message(line)
    except ProtocolError as exc:
        return exc
