"""Per-stage batch types: how a slot's reports are held between ingest and the step.

A stage declares the type its slot is buffered in (today every family's is ``DenseValues``):

* ``DenseValues``: one value (or a row of ``d``) per user of a population of ``n``, NaN where
  the user has not reported — the ``n × d`` float buffer of the slotted operator;
* ``RecordMultiset``: any number of records per user (DPI: a multiset of records, an open
  population);
* ``SparseVectors``: a few changed coordinates per user of a ``d``-coordinate vector (SaO2:
  at most ``s`` changes of a ``d``-bit vector, never ``n × d`` dense);
* ``AnonymousCounts``: counts per category without user ids (a shuffled stage).

Each type appends reports, merges another batch of its type, and says how large it is; the
keyed types keep the first report of a user in a slot (``first wins``), as the operator does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass
class DenseValues:
    """One value (or row of ``d``) per user of ``n``; NaN: not reported. ``values`` may be the
    operator's own buffer (the array is wrapped, never copied)."""

    values: NDArray[np.float64]

    @classmethod
    def blank(cls, n: int, d: int | None = None) -> DenseValues:
        return cls(np.full((n, d) if d else (n,), np.nan))

    def reported(self, users: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Which of ``users`` already reported in this batch."""
        rows = self.values[users].reshape(users.shape[0], -1)
        seen: NDArray[np.bool_] = np.asarray(~np.isnan(rows).any(axis=1))
        return seen

    def append(self, users: NDArray[np.int64], values: NDArray[np.float64]) -> NDArray[np.bool_]:
        """Write each user's value where the user has not reported (first wins); returns the
        rows refused as duplicates (``users`` must be distinct)."""
        seen = self.reported(users)
        self.values[users[~seen]] = values[~seen]
        return seen

    def merge(self, other: DenseValues) -> None:
        """Take ``other``'s reports of users who have none here (first wins: ours)."""
        fresh = np.flatnonzero(~self.reported(np.arange(self.values.shape[0])))
        self.values[fresh] = other.values[fresh]

    def __len__(self) -> int:
        """Users who reported."""
        return int(self.reported(np.arange(self.values.shape[0])).sum())


@dataclass
class RecordMultiset:
    """Any number of records per user: a multiset (nothing is a duplicate)."""

    records: dict[Any, list[Any]] = field(default_factory=dict)

    def append(self, user: Any, record: Any) -> None:
        self.records.setdefault(user, []).append(record)

    def merge(self, other: RecordMultiset) -> None:
        for user, records in other.records.items():
            self.records.setdefault(user, []).extend(records)

    def __len__(self) -> int:
        """Records held."""
        return sum(len(r) for r in self.records.values())


@dataclass
class SparseVectors:
    """A few changed coordinates per user of a ``d``-coordinate vector; first report wins."""

    d: int
    changes: dict[Any, dict[int, float]] = field(default_factory=dict)

    def append(self, user: Any, coordinates: dict[int, float]) -> bool:
        """Keep ``user``'s changes unless the user reported already (False: a duplicate)."""
        if user in self.changes:
            return False
        if any(not 0 <= k < self.d for k in coordinates):
            raise ValueError(f"a coordinate outside 0..{self.d - 1}")
        self.changes[user] = dict(coordinates)
        return True

    def merge(self, other: SparseVectors) -> None:
        for user, coordinates in other.changes.items():
            self.append(user, coordinates)

    def __len__(self) -> int:
        """Users who reported."""
        return len(self.changes)

    def entries(self) -> int:
        """Coordinates held (the memory a dense buffer of ``n × d`` would spend on all)."""
        return sum(len(c) for c in self.changes.values())


@dataclass
class AnonymousCounts:
    """Counts per category, without user ids (a shuffled stage's input)."""

    counts: Counter[Any] = field(default_factory=Counter)

    def append(self, category: Any, count: int = 1) -> None:
        if count < 0:
            raise ValueError("a count is never negative")
        self.counts[category] += count

    def merge(self, other: AnonymousCounts) -> None:
        self.counts.update(other.counts)

    def __len__(self) -> int:
        """Reports counted."""
        return sum(self.counts.values())
