"""DPI's synthetic streams (spec ``dpi.md`` §8.1), generated in the repository.

* ``dynamic`` (§6.4 of the paper): ``k`` items; at every slot each item's count is
  ``N(mean, σ²)`` with one ``σ²`` drawn per slot from ``{1, 4, 9, …, 100}``, negative counts
  clipped to 0 (as the public code does).
* ``dynamic-j`` (App. E.2, ``j = 1..10``): the same with mean 1,000 and variance ``j²``.

A slot's records are spread over the population: each counted record is one user's event (one
value per user per slot, the ingest's rule), the other users hold nothing (``−1``). So the
population must hold at least the largest slot's records; ``mean`` defaults to the paper's
value capped at ``users/(1.25·k)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
from numpy.typing import NDArray

ABSENT: Final = -1
"""A user without an event at a slot (the integer marker of ``mechanisms.client``)."""
VARIANCES: Final = tuple(float(s * s) for s in range(1, 11))
"""§6.4: σ² drawn per slot from {1, 4, …, 100}."""


@dataclass(frozen=True)
class DpiSynthetic:
    """A dynamic synthetic stream over ``k`` items for ``users`` users and ``slots`` slots.

    ``variance`` None draws σ² per slot from ``VARIANCES`` (§6.4); a number fixes it (App. E.2).
    """

    users: int
    slots: int
    seed: int = 0
    k: int = 100
    mean: float = 100.0
    variance: float | None = None
    name: str = "dynamic"
    counts: NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.users < 1 or self.slots < 1 or self.k < 2:
            raise ValueError(
                f"users and slots must be >= 1 and k >= 2, got users={self.users}, "
                f"slots={self.slots}, k={self.k}"
            )
        mean = min(self.mean, self.users / (1.25 * self.k))
        rng = np.random.default_rng([self.seed, 0xD1])
        if self.variance is None:
            sigma2 = rng.choice(np.array(VARIANCES), size=self.slots)
        else:
            sigma2 = np.full(self.slots, float(self.variance))
        raw = rng.normal(mean, np.sqrt(sigma2)[:, None], size=(self.slots, self.k))
        counts = np.maximum(np.rint(raw), 0).astype(np.int64)
        over = counts.sum(axis=1) > self.users
        if np.any(over):  # a rare draw above the population: thin it to fit
            counts[over] = np.floor(counts[over] * (self.users / counts[over].sum(axis=1))[:, None])
        object.__setattr__(self, "counts", counts)

    @property
    def numeric(self) -> bool:
        return False

    @property
    def d(self) -> int:
        return self.k

    @property
    def bounds(self) -> tuple[float, float]:
        return 0.0, float(self.k - 1)

    def values(self, slot: int) -> NDArray[np.int64]:
        """Every user's item at ``slot`` (1-based); ``−1`` for users without an event."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        counts = self.counts[slot - 1]
        items = np.repeat(np.arange(self.k, dtype=np.int64), counts)
        out = np.full(self.users, ABSENT, dtype=np.int64)
        order = np.random.default_rng([self.seed, slot, 0xD2]).permutation(self.users)
        out[order[: items.shape[0]]] = items
        return out

    def truth(self, slot: int) -> NDArray[np.float64]:
        """The slot's true PDF (``q_inst``; uniform for an empty slot)."""
        counts = self.counts[slot - 1].astype(np.float64)
        total = counts.sum()
        return counts / total if total > 0 else np.full(self.k, 1.0 / self.k)


def dynamic(users: int, slots: int, seed: int, task: object | None = None) -> DpiSynthetic:
    """The §6.4 stream: ``k`` from the run's task (default 100), mean 100, σ² per slot."""
    k = int(getattr(task, "d", 100) or 100)
    return DpiSynthetic(users, slots, seed, k=k)


def dynamic_set(j: int) -> object:
    """App. E.2's dataset ``j`` (variance ``j²``, mean 1,000) as a dataset factory."""

    def factory(users: int, slots: int, seed: int, task: object | None = None) -> DpiSynthetic:
        k = int(getattr(task, "d", 1000) or 1000)
        return DpiSynthetic(users, slots, seed, k=k, mean=1000.0, variance=float(j * j),
                            name=f"dynamic-{j}")  # fmt: skip

    return factory
