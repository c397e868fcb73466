"""JSON-lines serialisation of releases, ledger entries and dead letters, and a file sink.

Serialisation is canonical (fixed key order, no spaces, shortest float repr, NaN refused), so a
replayed slot produces byte-identical lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from bytewax import operators as op
from bytewax.connectors.files import FileSink
from bytewax.dataflow import Stream, operator


class _Serialisable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def to_json(event: _Serialisable) -> str:
    """One canonical JSON line for a release, ledger entry or dead letter."""
    return json.dumps(event.to_dict(), separators=(",", ":"), allow_nan=False)


@operator
def jsonl_output(step_id: str, up: Stream[Any], path: str | Path) -> None:
    """Write every item of ``up`` (anything with ``to_dict``) as one JSON line to ``path``.

    Bytewax's ``FileSink`` truncates to the last snapshot on resume, so a recovered run does not
    duplicate lines.
    """
    lines = op.map("to_json", up, to_json)
    keyed = op.key_on("single_file", lines, lambda _line: "file")
    op.output("file", keyed, FileSink(Path(path)))
