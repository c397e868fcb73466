"""Load a registration table: users' privacy requirements ``(ε_i, w_i)`` (spec
personalized-w-event §9.1: the dataflow resolves each user's class from such a registry).

The table is the trusted curator's configuration, read once at start; a user it does not list
is unregistered (the personalized operators turn that user's events into dead letters).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


def load_preferences(path: str | Path) -> dict[str, tuple[float, int]]:
    """Users' privacy requirements from a preferences table (spec personalized-w-event §9.1):
    CSV ``user,epsilon,window`` (a header line naming them is skipped) or JSON lines
    ``{"user": ..., "epsilon": ..., "window": ...}``. ``ValueError`` names the bad line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"preferences file {p} does not exist")
    table: dict[str, tuple[float, int]] = {}
    csv_file = p.suffix.lower() == ".csv"
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                if csv_file:
                    fields = [x.strip() for x in next(csv.reader([text]))]
                    if fields == ["user", "epsilon", "window"]:
                        continue
                    user, eps_text, win_text = fields
                    epsilon, window = float(eps_text), int(win_text)
                else:
                    rec = json.loads(text)
                    user, epsilon, window = str(rec["user"]), float(rec["epsilon"]), rec["window"]
                    if isinstance(window, bool) or not isinstance(window, int):
                        raise ValueError("window must be an integer")
            except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{p}:{number}: expected user, epsilon, window ({exc})") from None
            if not user or not (math.isfinite(epsilon) and epsilon > 0) or window < 1:
                raise ValueError(f"{p}:{number}: need a user, epsilon > 0 and window >= 1")
            if table.setdefault(user, (epsilon, window)) != (epsilon, window):
                raise ValueError(f"{p}:{number}: user listed twice with different requirements")
    return table
