"""CSV events (design §5): records with named columns, checked line by line.

Each line is split into the given columns (``user,slot,value`` by default; a header line naming
them is skipped); ``slot`` and ``value`` are read as numbers and the record then goes through the
same checks as a JSON event (``connectors.parsing``), so both formats accept and refuse alike.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from typing import Any

from privstream.connectors.parsing import (
    MAX_INT_DIGITS,
    SKIP,
    Builder,
    Shapes,
    SlotClock,
    invalid_utf8,
    parse_lines,
)
from privstream.schema.events import MALFORMED_CSV, MAX_EVENT_BYTES, DeadLetter, EventBatch


def parse_csv_lines(
    lines: Iterable[str | bytes],
    *,
    columns: Sequence[str] = ("user", "slot", "value"),
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    clock: SlotClock | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
    shapes: Shapes = None,
) -> list[EventBatch | DeadLetter]:
    """Parse CSV records with the given columns (a header line naming them is skipped): the
    ``EventBatch``es per stream, then the dead letters (``shapes`` as for JSON lines)."""

    def decode(line: str, out: Builder, raw: str | bytes) -> Any:
        if invalid_utf8(line, raw):
            out.reject(MALFORMED_CSV, line, "not valid UTF-8", raw=raw)
            return SKIP
        try:
            fields = [f.strip() for f in next(csv.reader([line]), [])]
        except csv.Error as exc:  # e.g. a field beyond csv.field_size_limit()
            out.reject(MALFORMED_CSV, line, f"not valid CSV ({exc})", raw=raw)
            return SKIP
        if fields == list(columns):
            return SKIP
        if len(fields) != len(columns):
            out.reject(MALFORMED_CSV, line, f"expected {len(columns)} CSV fields", raw=raw)
            return SKIP
        rec = dict(zip(columns, fields, strict=True))
        return {k: _csv_number(v) if k in ("slot", "value") else v for k, v in rec.items()}

    return parse_lines(lines, decode, streams, default_stream, clock, max_bytes, shapes)


def _csv_number(text: str) -> Any:
    """An integer (a float beyond ``MAX_INT_DIGITS``: ±inf where huge, as in JSON), else a
    float, else the text."""
    try:
        return int(text) if len(text) <= MAX_INT_DIGITS else float(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
