"""Load a user's own CSV/JSON-lines file of ``(user, slot, value)`` records into memory, and
preferences tables of users' privacy requirements.

The flow reads such files incrementally (``sources.file_source``); benchmarks need the whole
stream at once, with ground truth. ``RecordedStream`` offers the same interface as
``SyntheticStream``: every user's value at each slot ``t = 1..T`` (``T`` counts from the file's
first slot) and the true statistic. Records are validated by the same parser as the flow, and a
user's first report in a slot wins. Users keep their last value between slots
(``carry_forward``); users who have not reported yet hold NaN.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from privstream.connectors.events import DeadLetter, EventBatch, parse_csv_lines, parse_json_lines
from privstream.connectors.sources import detect_format


@dataclass(frozen=True)
class RecordedStream:
    """A recorded stream of ``users`` users (dense indices in order of first appearance)."""

    name: str
    first_slot: int
    columns: tuple[NDArray[np.float64], ...]
    d: int
    numeric: bool
    rejected: tuple[DeadLetter, ...] = field(default=(), repr=False)

    @property
    def users(self) -> int:
        return int(self.columns[0].shape[0])

    @property
    def slots(self) -> int:
        return len(self.columns)

    @property
    def bounds(self) -> tuple[float, float]:
        """Range of the recorded values (the clipping range of a numeric task)."""
        every = np.concatenate(self.columns)
        every = every[~np.isnan(every)]
        return float(every.min()), float(every.max())

    def values(self, slot: int) -> NDArray[np.float64]:
        """Every user's value at slot ``t`` (1-based from the first slot), NaN if none yet."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        return self.columns[slot - 1]

    def truth(self, slot: int) -> NDArray[np.float64]:
        """Histogram (or mean) over the users holding a value at ``slot``."""
        v = self.values(slot)
        v = v[~np.isnan(v)]
        if self.numeric:
            return np.array([float(v.mean()) if v.size else 0.0])
        counts = np.bincount(v.astype(np.int64), minlength=self.d).astype(np.float64)
        return counts / max(1, v.size)


def load_records(
    path: str | Path,
    users: int,
    domain: int | None = None,
    numeric: bool = False,
    stream: str | None = None,
) -> RecordedStream:
    """Read ``path`` (``.csv`` with columns ``user,slot,value``, else JSON lines).

    ``users`` caps the population; ``domain`` is the number of categories (default: largest
    value + 1); ``numeric`` treats values as numbers for a mean. Records of other streams than
    ``stream`` (when given) and invalid records are kept in ``rejected``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"event file {p} does not exist")
    parse = parse_csv_lines if detect_format(p) == "csv" else parse_json_lines
    with p.open("rb") as f:
        items = parse(
            f.read().splitlines(),
            default_stream=stream or p.stem,
            streams=[stream] if stream else None,
        )
    batches = [b for b in items if isinstance(b, EventBatch)]
    rejected = [d for d in items if isinstance(d, DeadLetter)]
    if len(batches) != 1:
        names = sorted(b.stream for b in batches)
        raise ValueError(
            f"{p} must hold exactly one stream (choose one with stream=...), found {names}"
        )
    batch = batches[0]
    values = batch.values
    if not numeric:
        if np.any(values != np.floor(values)) or np.any(values < 0):
            raise ValueError(
                f"{p}: categorical values must be integers >= 0 (use numeric=True for means)"
            )
        domain = domain or int(values.max()) + 1
        if np.any(values >= domain):
            raise ValueError(f"{p}: values must lie in 0..{domain - 1}")
    index: dict[str, int] = {}
    idx = np.array([index.setdefault(u, len(index)) for u in batch.users.tolist()], dtype=np.int64)
    if len(index) > users:
        raise ValueError(f"{p} has {len(index)} users, more than the population of {users}")
    first, last = int(batch.slots.min()), int(batch.slots.max())
    columns: list[NDArray[np.float64]] = []
    current = np.full(users, np.nan)
    for slot in range(first, last + 1):
        rows = np.flatnonzero(batch.slots == slot)
        _, first_rows = np.unique(idx[rows], return_index=True)  # first report wins
        rows = rows[np.sort(first_rows)]
        current = current.copy()
        current[idx[rows]] = values[rows]
        columns.append(current)
    return RecordedStream(
        batch.stream,
        first,
        tuple(columns),
        1 if numeric else int(domain or 2),
        numeric,
        tuple(rejected),
    )


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
