"""Load a user's own CSV/JSON-lines file of ``(user, slot, value)`` records into memory.

The flow reads such files incrementally (``sources.file_source``); benchmarks need the whole
stream at once, with ground truth. ``RecordedStream`` offers the same interface as
``SyntheticStream``: every user's value at each slot ``t = 1..T`` (``T`` counts from the file's
first slot) and the true statistic. Records are validated by the same parser as the flow, and a
user's first report in a slot wins. Users keep their last value between slots
(``carry_forward``); users who have not reported yet hold NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from privstream.connectors.csv_events import parse_csv_lines
from privstream.connectors.json_events import parse_json_lines
from privstream.connectors.sources import detect_format
from privstream.schema.events import DeadLetter, EventBatch


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
            shapes=0,  # one number per event, in every stream
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
    return RecordedStream(
        batch.stream,
        int(batch.slots.min()),
        _carry_forward(batch.slots, idx, values, users),
        1 if numeric else int(domain or 2),
        numeric,
        tuple(rejected),
    )


def _carry_forward(
    slots: NDArray[np.int64], idx: NDArray[np.int64], values: NDArray[np.float64], users: int
) -> tuple[NDArray[np.float64], ...]:
    """Every user's value at each slot from the first to the last: a user's first report in a
    slot wins, a user keeps the last value between reports, NaN before the first."""
    columns: list[NDArray[np.float64]] = []
    current = np.full(users, np.nan)
    for slot in range(int(slots.min()), int(slots.max()) + 1):
        rows = np.flatnonzero(slots == slot)
        _, first_rows = np.unique(idx[rows], return_index=True)  # first report wins
        rows = rows[np.sort(first_rows)]
        current = current.copy()
        current[idx[rows]] = values[rows]
        columns.append(current)
    return tuple(columns)
