"""Load a registration table: users' privacy requirements ``(ε_i, w_i)`` (spec
personalized-w-event §9.1: the dataflow resolves each user's class from such a registry).

The table is the trusted curator's configuration, read once at start; a user it does not list
is unregistered (the personalized operators turn that user's events into dead letters).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from privstream.connectors.parsing import load_json


def load_preferences(path: str | Path) -> dict[str, tuple[float, int]]:
    """Users' privacy requirements from a preferences table (spec personalized-w-event §9.1):
    CSV ``user,epsilon,window`` (a header line naming them is skipped) or JSON lines
    ``{"user": ..., "epsilon": ..., "window": ...}``. ``ValueError`` names the bad line (and is
    the only exception any content of the file raises)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"preferences file {p} does not exist")
    table: dict[str, tuple[float, int]] = {}
    csv_file = p.suffix.lower() == ".csv"
    for number, line in enumerate(_lines(p), start=1):
        text = line.strip()
        if not text:
            continue
        try:
            if csv_file:
                cells = text.split(",") if '"' not in text else next(csv.reader([text]))
                fields = [x.strip() for x in cells]  # unquoted: csv would split the same
                if fields == ["user", "epsilon", "window"]:
                    continue
                user, eps_text, win_text = fields
                epsilon, window = float(eps_text), int(win_text)
            else:
                rec = load_json(text)
                user, epsilon, window = str(rec["user"]), float(rec["epsilon"]), rec["window"]
                if isinstance(window, bool) or not isinstance(window, int):
                    raise ValueError("window must be an integer")
        except (ValueError, KeyError, TypeError, OverflowError, csv.Error) as exc:
            raise ValueError(f"{p}:{number}: expected user, epsilon, window ({exc})") from None
        if not user or not (math.isfinite(epsilon) and epsilon > 0) or window < 1:
            raise ValueError(f"{p}:{number}: need a user, epsilon > 0 and window >= 1")
        if table.setdefault(user, (epsilon, window)) != (epsilon, window):
            raise ValueError(f"{p}:{number}: user listed twice with different requirements")
    return table


def _lines(p: Path) -> list[str]:
    """The table's lines; ``ValueError`` naming the file when it is not UTF-8."""
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not valid UTF-8 (byte {exc.start})") from None
    return io.StringIO(text, newline=None).readlines()  # as a text-mode file splits them
