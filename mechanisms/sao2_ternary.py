"""The ternary-vector interface of SaO2 (spec sao2 §4.1, §6): what ExSub and every baseline
randomise, and what their estimators return.

A batch holds ``n`` users' ternary vectors ``R ∈ {−1, 0, 1}^D``, each with at most ``s``
non-zeros, stored sparsely (``n = 10⁵`` users of ``D = 1000`` fit in ``n·s`` entries, not
``n·D``): ``index[j, k]`` is the 0-based coordinate of user ``j``'s ``k``-th non-zero (−1: none)
and ``sign[j, k]`` its sign (0 where there is none). A ``TernaryMechanism`` randomises a batch
(each user on their own device: one ε-LDP report per user and horizon) and estimates the
population mean ``(1/n) Σ_j R_j`` without bias from the reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Ternary:
    """``n`` users' sparse ternary vectors of length ``D`` (module docstring)."""

    D: int
    index: NDArray[np.int64]
    sign: NDArray[np.int8]

    def __post_init__(self) -> None:
        if self.index.shape != self.sign.shape or self.index.ndim != 2:
            raise ValueError("index and sign must be (n, s) arrays of one shape")
        present = self.index >= 0
        if np.any(self.index >= self.D) or np.any((self.sign != 0) != present):
            raise ValueError(f"coordinates must lie in [0, {self.D}) with a sign ±1 each")
        if np.any(np.abs(self.sign) > 1):
            raise ValueError("signs are −1, 0 or +1")

    @property
    def n(self) -> int:
        return int(self.index.shape[0])

    @property
    def s(self) -> int:
        """The most non-zeros a user may hold (the array's width)."""
        return int(self.index.shape[1])

    @classmethod
    def from_dense(cls, dense: NDArray[Any], s: int) -> Ternary:
        """The sparse form of dense ``(n, D)`` ternary rows with at most ``s`` non-zeros each."""
        dense = np.asarray(dense)
        n, D = dense.shape
        counts = np.count_nonzero(dense, axis=1)
        if np.any(counts > s):
            raise ValueError(f"a row holds {int(counts.max())} non-zeros, more than s = {s}")
        index = np.full((n, s), -1, dtype=np.int64)
        sign = np.zeros((n, s), dtype=np.int8)
        rows, cols = np.nonzero(dense)
        slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        index[rows, slot] = cols
        sign[rows, slot] = np.sign(dense[rows, cols])
        return cls(D, index, sign)

    def dense(self) -> NDArray[np.int8]:
        """The ``(n, D)`` dense rows (tests and small batches only)."""
        out = np.zeros((self.n, self.D), dtype=np.int8)
        rows, k = np.nonzero(self.index >= 0)
        out[rows, self.index[rows, k]] = self.sign[rows, k]
        return out

    def mean(self) -> NDArray[np.float64]:
        """The true population mean ``(1/n) Σ_j R_j`` (what an estimator targets)."""
        rows, k = np.nonzero(self.index >= 0)
        total = np.bincount(self.index[rows, k], weights=self.sign[rows, k], minlength=self.D)
        return np.asarray(total, dtype=np.float64) / max(self.n, 1)


class TernaryMechanism(Protocol):
    """An ε-LDP randomiser of one ternary vector per user, with its unbiased estimator.

    ``online``: whether a user can run it in stream order (each coordinate decided when it
    becomes known, at a data-independent time; spec sao2 §1.4)."""

    name: str
    online: bool

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> Any:
        """Every user's report (one per user, the mechanism's own format)."""
        ...

    def estimate(self, reports: Any, n: int) -> NDArray[np.float64]:
        """The unbiased estimate of ``(1/n) Σ_j R_j`` (length ``D``) from ``n`` reports."""
        ...
