"""The synthetic streams of both papers' evaluations, one generator for every family.

Spec ldp-ids §5.1 defines LNS, Sin, Log and their numeric ``-Con`` variants; spec
personalized-w-event §6.2 defines TLNS, Sin and Log. A generator first fixes the probability
sequence ``p_1..p_T`` (Sin and Log are the same formulas in both papers; LNS reflects its random
walk at 0, TLNS clips it) and then, slot by slot, the population's values:

* binary streams, LDP-IDS model (the default): exactly ``round(p_t·n)`` users drawn uniformly at
  random hold value 1 and everybody else 0;
* binary streams, personalized model (``independent=True``): each user independently holds 1
  with probability ``p_t``, so the count of ones is ``Binomial(n, p_t)``;
* ``-Con`` streams: every user's value is ``N(p_t, σ²)``.

Each slot's values come from a generator seeded by ``(seed, slot)``, so any slot can be
regenerated alone (the source can resume mid-stream and the evaluator can rebuild ground truth).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from numpy.typing import NDArray

DATASETS: Final = ("lns", "tlns", "sin", "log", "lns-con", "sin-con", "log-con")
CON_SIGMA: Final = 10.0  # spec §5.1 / A26


def lns_probabilities(
    slots: int, rng: np.random.Generator, p0: float = 0.05, sqrt_q: float = 0.0025
) -> NDArray[np.float64]:
    """LNS: ``p_t = min(1, |p_{t−1} + N(0, Q)|)`` (reflected at 0 and capped at 1, erratum A25)."""
    p = np.empty(slots)
    prev = p0
    steps = rng.normal(0.0, sqrt_q, size=slots)
    for t in range(slots):
        prev = min(1.0, abs(prev + steps[t]))
        p[t] = prev
    return p


def tlns_probabilities(
    slots: int, rng: np.random.Generator, p0: float = 0.05, sqrt_q: float = 0.0025
) -> NDArray[np.float64]:
    """TLNS of spec personalized-w-event §6.2: ``p_t = clip_[0,1](p_{t−1} + N(0, Q))`` with the
    paper's ``p_0 = 0.05`` (A24) and ``√Q = 0.0025``; clipped, where LNS above reflects at 0."""
    p = np.empty(slots)
    prev = p0
    steps = rng.normal(0.0, sqrt_q, size=slots)
    for t in range(slots):
        prev = min(1.0, max(0.0, prev + steps[t]))
        p[t] = prev
    return p


def sin_probabilities(
    slots: int, a: float = 0.05, b: float = 0.01, h: float = 0.075
) -> NDArray[np.float64]:
    """Sin: ``p_t = A·sin(b·t) + h`` for ``t = 1..T``."""
    t = np.arange(1, slots + 1, dtype=np.float64)
    p: NDArray[np.float64] = a * np.sin(b * t) + h
    return p


def log_probabilities(slots: int, a: float = 0.25, b: float = 0.01) -> NDArray[np.float64]:
    """Log (logistic): ``p_t = A / (1 + e^{−b·t})`` for ``t = 1..T``."""
    t = np.arange(1, slots + 1, dtype=np.float64)
    p: NDArray[np.float64] = a / (1 + np.exp(-b * t))
    return p


def uniform_subset_mask(n: int, k: int, rng: np.random.Generator) -> NDArray[np.bool_]:
    """Mask of a uniformly random ``k``-subset of ``{0, …, n−1}``, in O(n) time.

    The set ``D`` of distinct values among iid uniform draws from ``{0, …, n−1}`` is exchangeable:
    given ``|D| = s`` it is a uniform ``s``-subset, whatever rule (depending on sizes only)
    decided how many draws to make. So: draw until ``|D| ≥ k`` (about ``−n·ln(1 − k/n)`` draws),
    then drop a uniform ``(|D| − k)``-subset of ``D``; the result is exactly a uniform
    ``k``-subset. For ``k > n/2`` the complement is drawn instead, so the draws stay ``O(k)``.
    This replaces ``rng.choice(n, k, replace=False)``, whose permutation of ``arange(n)`` costs
    an extra ``8n``-byte temporary per slot.
    """
    if not 0 <= k <= n:
        raise ValueError(f"subset size must lie in 0..{n}, got {k}")
    if 2 * k > n:
        return ~uniform_subset_mask(n, n - k, rng)
    mask = np.zeros(n, dtype=np.bool_)
    if k == 0:
        return mask
    # Expected draws for k distinct values, plus ~4 standard deviations of the distinct count.
    draws = math.ceil(-n * math.log1p(-k / n) + 4 * math.sqrt(k)) + 8
    size = 0
    while size < k:
        mask[rng.integers(0, n, size=draws)] = True
        size = int(np.count_nonzero(mask))
        draws = max(2 * (k - size), 16)  # rare top-up
    if size > k:
        members = np.flatnonzero(mask)
        mask[members[rng.choice(size, size=size - k, replace=False)]] = False
    return mask


def probabilities(name: str, slots: int, seed: int) -> NDArray[np.float64]:
    """The sequence ``p_1..p_T`` of dataset ``name`` (its ``-con`` suffix ignored); the LNS and
    TLNS walks are drawn from ``seed``, Sin and Log are deterministic."""
    base = name.removesuffix("-con")
    if base == "lns":
        return lns_probabilities(slots, np.random.default_rng([seed, 0x4C4E53]))
    if base == "tlns":
        return tlns_probabilities(slots, np.random.default_rng([seed, 0x544C4E53]))
    if base == "sin":
        return sin_probabilities(slots)
    return log_probabilities(slots)


@dataclass(frozen=True)
class SyntheticStream:
    """A synthetic population stream of ``users`` users over ``slots`` slots (1-based).

    ``independent`` picks the personalized-w-event population of a binary stream (each user
    holds 1 with probability ``p_t``, spec §6.2) over the LDP-IDS one (exactly ``round(p_t·n)``
    ones, spec §5.1)."""

    name: str
    users: int
    slots: int
    seed: int = 0
    sigma: float = CON_SIGMA
    independent: bool = False
    probabilities: NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.name not in DATASETS:
            raise ValueError(
                f"unknown synthetic dataset {self.name!r}; choose from {', '.join(DATASETS)}"
            )
        if self.users < 1 or self.slots < 1:
            raise ValueError(
                f"users and slots must be >= 1, got users={self.users}, slots={self.slots}"
            )
        if self.independent and self.numeric:
            raise ValueError(f"independent ones apply to binary streams, not {self.name!r}")
        object.__setattr__(self, "probabilities", probabilities(self.name, self.slots, self.seed))

    @property
    def numeric(self) -> bool:
        return self.name.endswith("-con")

    @property
    def d(self) -> int:
        """Domain size: 2 for the binary streams, 1 (a mean) for ``-Con``."""
        return 1 if self.numeric else 2

    @property
    def bounds(self) -> tuple[float, float]:
        """Clipping range of ``-Con`` values: ``[min p − 3σ, max p + 3σ]`` (A26)."""
        lower = float(self.probabilities.min()) - 3 * self.sigma
        upper = float(self.probabilities.max()) + 3 * self.sigma
        return lower, upper

    def ones(self, slot: int) -> int:
        """``K_t``: users holding value 1 at ``slot`` (binary streams): ``round(p_t·n)``, or the
        drawn count of the ``independent`` population."""
        if self.independent:
            return int(self.values(slot).sum())
        return round(float(self.probabilities[slot - 1]) * self.users)

    def values(self, slot: int) -> NDArray[np.int64] | NDArray[np.float64]:
        """Every user's value at ``slot`` (1-based), indexed by the user's dense index."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        p = self.probabilities[slot - 1]
        if self.independent:
            rng = np.random.default_rng([self.seed, slot, 0x5057])
            ones: NDArray[np.int64] = (rng.random(self.users) < p).astype(np.int64)
            return ones
        rng = np.random.default_rng([self.seed, slot])
        if self.numeric:
            return rng.normal(p, self.sigma, size=self.users)
        return uniform_subset_mask(self.users, self.ones(slot), rng).astype(np.int64)

    def truth(self, slot: int) -> NDArray[np.float64]:
        """The true statistic ``c_t``: histogram ``(1 − K_t/n, K_t/n)`` or the mean value."""
        if self.numeric:
            return np.array([float(np.mean(self.values(slot)))])
        k = self.ones(slot) / self.users
        return np.array([1 - k, k])

    def __iter__(self) -> Iterator[NDArray[np.int64] | NDArray[np.float64]]:
        for slot in range(1, self.slots + 1):
            yield self.values(slot)
