"""SaO2's synthetic sparse binary streams (spec ``sao2.md`` §8.1 stand-ins), generated in the
repository from a public seed.

* ``trajectory``: one-hot locations. Every user starts in a uniform cell of ``d`` and, at each
  later slot, moves with probability ``move`` to a uniform other cell (a move is two changes of
  ``x_t``). The value is the cell index.
* ``sets``: bitmasks of ``d ≤ 52`` bits. Every user starts with each bit set with probability
  ``density`` and, at each later slot, flips one uniform bit with probability ``move``. The value
  is the bitmask as an integer.

Every user holds a value at every slot (the harness's rule); a Kafka producer may send only the
changes, since SaO2's devices carry a value forward (``mechanisms.sao2_client``). The truth of a
slot is the population mean vector ``x̄_t ∈ [0, 1]^d``. Nothing here is private.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

KINDS: Final = ("onehot", "bits")


@dataclass(frozen=True)
class Sao2Synthetic:
    """``users`` sparse binary streams over ``slots`` slots of ``d`` bits (module docstring)."""

    users: int
    slots: int
    seed: int = 0
    d: int = 12
    kind: str = "onehot"
    move: float = 0.05
    density: float = 0.2
    name: str = "trajectory"
    task: Any = field(default=None, compare=False)
    """The run's estimation task, where the family states it (``families.sao2``)."""
    table: NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.users < 1 or self.slots < 1 or self.d < 2 or self.kind not in KINDS:
            raise ValueError(
                f"users and slots must be >= 1, d >= 2 and kind one of {KINDS}, got users="
                f"{self.users}, slots={self.slots}, d={self.d}, kind={self.kind!r}"
            )
        if self.kind == "bits" and self.d > 52:
            raise ValueError(f"a bitmask stream holds at most 52 bits, got d = {self.d}")
        rng = np.random.default_rng([self.seed, 0x5A02])
        n, T, d = self.users, self.slots, self.d
        moves = rng.random((T, n)) < self.move
        moves[0] = False
        table = np.empty((T, n), dtype=np.int64)
        if self.kind == "onehot":
            table[0] = rng.integers(0, d, n)
            step = np.where(moves, rng.integers(1, d, (T, n)), 0)
            table[:] = (table[0] + np.cumsum(step, axis=0)) % d
        else:
            weights = np.left_shift(1, np.arange(d, dtype=np.int64))
            start = (rng.random((n, d)) < self.density).astype(np.int64) @ weights
            flips = np.where(moves, np.left_shift(1, rng.integers(0, d, (T, n))), 0)
            table[:] = np.bitwise_xor.accumulate(np.vstack([start[None], flips[1:]]), axis=0)
        object.__setattr__(self, "table", table)

    @property
    def numeric(self) -> bool:
        return False

    @property
    def bounds(self) -> tuple[float, float]:
        return 0.0, float(self.d - 1 if self.kind == "onehot" else 2**self.d - 1)

    def values(self, slot: int) -> NDArray[np.int64]:
        """Every user's value at ``slot`` (1-based): a cell index or a bitmask."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        row: NDArray[np.int64] = self.table[slot - 1]
        return row

    def truth(self, slot: int) -> NDArray[np.float64]:
        """``x̄_t``: the mean binary vector of the slot."""
        v = self.values(slot)
        if self.kind == "onehot":
            return np.bincount(v, minlength=self.d) / self.users
        bits = (v[:, None] >> np.arange(self.d, dtype=np.int64)[None, :]) & 1
        return np.asarray(bits.mean(axis=0), dtype=np.float64)


def _kind(task: object | None, kind: str, name: str) -> None:
    """Refuse a run's task of the other kind (a bitmask task on one-hot data, or back)."""
    asked = getattr(task, "kind", kind)
    if asked != kind:
        other = "sets" if name == "trajectory" else "trajectory"
        raise ValueError(f"the {name} dataset is {kind}; a {asked} task takes --dataset {other}")


def trajectory(users: int, slots: int, seed: int, task: object | None = None) -> Sao2Synthetic:
    """One-hot locations over the run's ``d`` cells (default 12, the Trajectory setting)."""
    d = int(getattr(task, "d", 12) or 12)
    _kind(task, "onehot", "trajectory")
    return Sao2Synthetic(users, slots, seed, d=d, kind="onehot", name="trajectory")


def sets(users: int, slots: int, seed: int, task: object | None = None) -> Sao2Synthetic:
    """Bitmask sets over the run's ``d`` bits (default 8)."""
    d = int(getattr(task, "d", 8) or 8)
    _kind(task, "bits", "sets")
    return Sao2Synthetic(users, slots, seed, d=d, kind="bits", name="sets")
