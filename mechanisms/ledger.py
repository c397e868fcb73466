"""Privacy ledgers that check their invariant on every charge (design §3, spec ldp-ids §1.6).

* ``BudgetLedger`` — w-event budget division (Thm 4.1): every user of the stream is charged the
  same ``ε_{τ,1} + ε_{τ,2}`` at slot ``τ``, so one sliding sum per stream covers every user.
  Invariant: ``Σ_{τ=t−w+1}^{t} (ε_{τ,1} + ε_{τ,2}) ≤ ε``.
* ``PopulationLedger`` — population division (Thm 5.2): per-user last report slot in a dense
  array keyed by the stable user index. Invariant: a user reports at most once in any ``w``
  consecutive slots, i.e. two report slots ``s < s'`` satisfy ``s' − s ≥ w``.

Both raise ``PrivacyBudgetExceeded`` before the charge takes effect, so nothing derived from an
over-budget report can be released. Slots here are the mechanism's step counter ``t ≥ 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.errors import PrivacyBudgetExceeded

TOLERANCE = 1e-12  # float slack on budget sums (spec §1.6 invariant 1)
NEVER = np.iinfo(np.int64).min // 2  # "last report slot" of a user who never reported


def _check_t(t: int) -> None:
    if t < 1:
        raise ValueError(f"ledger slots are 1-based, got t={t}")


@dataclass
class BudgetLedger:
    """Sliding per-user budget of one stream under budget division.

    ``m1`` and ``m2`` hold the budget spent at slot ``t`` in ring position ``t mod w`` together
    with the slot that wrote it, so stale positions read as zero.
    """

    epsilon: float
    window: int
    slots: NDArray[np.int64] = field(init=False)
    m1: NDArray[np.float64] = field(init=False)
    m2: NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        self.slots = np.full(self.window, NEVER, dtype=np.int64)
        self.m1 = np.zeros(self.window)
        self.m2 = np.zeros(self.window)

    def _live(self, lo: int, hi: int) -> NDArray[np.bool_]:
        return (self.slots >= lo) & (self.slots <= hi)

    def spent(self, lo: int, hi: int, part: str = "both") -> float:
        """Per-user budget spent at slots ``lo..hi`` (inclusive) by M1, M2 or both."""
        live = self._live(lo, hi)
        m1 = float(self.m1[live].sum()) if part in ("m1", "both") else 0.0
        m2 = float(self.m2[live].sum()) if part in ("m2", "both") else 0.0
        return m1 + m2

    def window_spent(self, t: int) -> float:
        """``Σ_{τ=t−w+1}^{t} (ε_{τ,1} + ε_{τ,2})``: what every user has spent in the window ending at t."""
        return self.spent(t - self.window + 1, t)

    def remaining(self, t: int) -> float:
        return max(0.0, self.epsilon - self.window_spent(t))

    def charge(self, t: int, eps: float, part: str) -> None:
        """Charge every user ``eps`` at slot ``t`` for sub-mechanism ``part`` ("m1" or "m2")."""
        _check_t(t)
        if eps < 0 or part not in ("m1", "m2"):
            raise ValueError(f"invalid charge eps={eps!r} part={part!r}")
        pos = t % self.window
        if self.slots[pos] > t:
            raise ValueError(f"budget ledger charged at t={t} after t={int(self.slots[pos])}")
        # The position's old slot lies outside the window ending at t, so it is not counted here;
        # the ledger changes only once the charge is known to fit.
        total = self.window_spent(t) + eps
        if total > self.epsilon + TOLERANCE:
            raise PrivacyBudgetExceeded(
                f"charging ε={eps:.6g} at slot {t} would spend {total:.6g} > ε={self.epsilon:g} "
                f"in the window of w={self.window}"
            )
        if self.slots[pos] != t:
            self.slots[pos], self.m1[pos], self.m2[pos] = t, 0.0, 0.0
        (self.m1 if part == "m1" else self.m2)[pos] += eps


@dataclass
class PopulationLedger:
    """Per-user last report slot of one stream under population division.

    ``counts_m1/m2`` keep ``|U_{t,1}|`` and ``|U_{t,2}|`` per ring position (with the slot that
    wrote them) for the window sums the mechanisms need, without storing id sets.
    """

    population: int
    window: int
    last_report: NDArray[np.int64] = field(init=False)
    slots: NDArray[np.int64] = field(init=False)
    counts_m1: NDArray[np.int64] = field(init=False)
    counts_m2: NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.last_report = np.full(self.population, NEVER, dtype=np.int64)
        self.slots = np.full(self.window, NEVER, dtype=np.int64)
        self.counts_m1 = np.zeros(self.window, dtype=np.int64)
        self.counts_m2 = np.zeros(self.window, dtype=np.int64)

    def available(self, t: int) -> NDArray[np.bool_]:
        """Mask of ``U_A`` at slot ``t``: users whose last report is at least ``w`` slots back."""
        return (t - self.last_report) >= self.window

    def used(self, lo: int, hi: int, part: str = "both") -> int:
        """Users that reported at slots ``lo..hi`` in M1, M2 or both."""
        live = (self.slots >= lo) & (self.slots <= hi)
        m1 = int(self.counts_m1[live].sum()) if part in ("m1", "both") else 0
        m2 = int(self.counts_m2[live].sum()) if part in ("m2", "both") else 0
        return m1 + m2

    def sample(
        self, t: int, k: int, eligible: NDArray[np.bool_], rng: np.random.Generator
    ) -> NDArray[np.int64]:
        """Uniform sample without replacement of up to ``k`` users of ``U_A`` who can report.

        Asking for more users than ``U_A`` holds is a capacity violation (invariant 3); users
        without a current value are skipped, so fewer than ``k`` may come back.
        """
        pool = self.available(t)
        if k > int(pool.sum()):
            raise PrivacyBudgetExceeded(
                f"slot {t} asks for {k} users but only {int(pool.sum())} are available in U_A"
            )
        candidates = np.flatnonzero(pool & eligible)
        if k >= candidates.shape[0]:
            return candidates.astype(np.int64)
        return np.sort(rng.choice(candidates, size=k, replace=False))

    def charge(self, t: int, users: NDArray[np.int64], part: str) -> None:
        """Record that ``users`` report at slot ``t``; refuse if any reported within ``w`` slots."""
        _check_t(t)
        if part not in ("m1", "m2"):
            raise ValueError(f"invalid part {part!r}")
        users = np.asarray(users, dtype=np.int64)
        if users.size and (users.min() < 0 or users.max() >= self.population):
            raise ValueError("population ledger charged for a user outside the population")
        increasing = users.size < 2 or bool(np.all(users[1:] > users[:-1]))  # sample() sorts
        ordered = users if increasing else np.sort(users)
        if ordered.size > 1 and bool(np.any(ordered[1:] == ordered[:-1])):
            raise PrivacyBudgetExceeded(f"slot {t} charges a user twice")
        too_soon = (t - self.last_report[users]) < self.window
        if np.any(too_soon):
            raise PrivacyBudgetExceeded(
                f"slot {t} would make {int(too_soon.sum())} users report twice within w={self.window}"
            )
        pos = t % self.window
        if self.slots[pos] != t:
            self.slots[pos], self.counts_m1[pos], self.counts_m2[pos] = t, 0, 0
        self.last_report[users] = t
        (self.counts_m1 if part == "m1" else self.counts_m2)[pos] += users.shape[0]

    def available_count(self, t: int) -> int:
        """``|U_A|`` at slot ``t`` without scanning the population: everyone but the users who
        reported at slots ``t−w+1..t−1``."""
        return self.population - self.used(t - self.window + 1, t - 1)

    def window_users(self, t: int) -> int:
        """``Σ_{i=t−w+1}^{t} (|U_{i,1}| + |U_{i,2}|)``."""
        return self.used(t - self.window + 1, t)
