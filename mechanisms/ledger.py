"""Privacy ledgers that check their invariant on every charge (design §3, spec ldp-ids §1.6).

* ``BudgetLedger`` — w-event budget division (Thm 4.1): every user of the stream is charged the
  same ``ε_{τ,1} + ε_{τ,2}`` at slot ``τ``, so one sliding sum per stream covers every user.
  Invariant: ``Σ_{τ=t−w+1}^{t} (ε_{τ,1} + ε_{τ,2}) ≤ ε``.
* ``PopulationLedger`` — population division (Thm 5.2): per-user last report slot in a dense
  array keyed by the stable user index. Invariant: a user reports at most once in any ``w``
  consecutive slots, i.e. two report slots ``s < s'`` satisfy ``s' − s ≥ w``.
* ``PersonalizedLedger`` — personalized w-event privacy (spec personalized-w-event §1.4, §9.3):
  one sliding sum per privacy class ``(w_c, ε_c)``, never per user; classes may join at any
  slot ``t_c`` with zero history (§9.5). Invariant (C1): for every class and slot ``t ≥ t_c``,
  ``Σ_{k=max(t_c,t−w_c+1)}^{t} ε_{c,k} ≤ ε_c``.

All three raise ``PrivacyBudgetExceeded`` before the charge takes effect, so nothing derived from
an over-budget report can be released. Slots here are the mechanism's step counter ``t ≥ 1``.

The sliding sums are generic over the guarantee's measure (``mechanisms.guarantees``): what they
add up is the measure's additive budget (``budget_of``: ε for pure and (ε, δ) DP, μ² for
Gaussian DP, ρ for zCDP), so one ledger serves every measure whose composition adds.

Each ledger declares the accounting events it can hold (``supports``, the ``dp_accounting``
model; ``mechanisms.accounting``) and ``accept`` refuses the rest, naming the event's measure
and scope and what the ledger supports: a sliding window of w slots cannot hold a whole-stream
charge, nor one over another window length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privstream.mechanisms.accounting import (
    AllUsers,
    Charge,
    GaussianCharge,
    PrivacyClass,
    PureCharge,
    ZcdpCharge,
    refuse,
    window_of,
)
from privstream.mechanisms.errors import PrivacyBudgetExceeded

ADDITIVE: tuple[type[Charge], ...] = (PureCharge, GaussianCharge, ZcdpCharge)
"""The charges a sliding sum adds up (each in its additive unit: ε, μ², ρ)."""


def _accept(ledger: Any, event: Charge) -> None:
    """Refuse ``event`` unless ``ledger.supports`` it (the one refusal of every ledger)."""
    if not ledger.supports(event):
        raise refuse(type(ledger).__name__, event, ledger.supported())


RELATIVE_TOLERANCE = 1e-9  # float slack of a window sum, relative to its budget (spec §9.3 M9)


def budget_limit(epsilon: float) -> float:
    """The largest window sum accepted for budget ``ε``: ``ε·(1 + 1e−9)``. The slack is
    relative, so sums of ``ε/w`` shares that round up are accepted at every scale of ε (an
    absolute slack refuses correct streams at ε ≈ 10³ and is loose at tiny ε)."""
    return epsilon * (1.0 + RELATIVE_TOLERANCE)


def clamp_spend(spent: float, limit: float) -> float:
    """A spend as readers are shown it: within the ledger's own slack (``budget_limit``) a sum
    of shares that rounded a hair above ``limit`` is exactly ``limit``; a spend beyond the
    slack is shown as it is (the ledger refused it: a violation, never hidden)."""
    return min(spent, limit) if spent <= budget_limit(limit) else spent


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
    SUPPORTS: ClassVar[str] = "charges to all users alike in ε, μ² or ρ over its window"

    def supports(self, event: Charge) -> bool:
        """An additive charge to all users over a window of exactly this ledger's ``w``."""
        return (
            isinstance(event, ADDITIVE)
            and isinstance(event.payer, AllUsers)
            and window_of(event.scope) == self.window
        )

    def supported(self) -> str:
        return f"{self.SUPPORTS} (w={self.window})"

    def accept(self, event: Charge) -> None:
        """Refuse an accounting event this ledger cannot hold (``supports``)."""
        _accept(self, event)

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
        if total > budget_limit(self.epsilon):
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
    SUPPORTS: ClassVar[str] = "pure ε charges to a class reporting at most once per window"

    def supports(self, event: Charge) -> bool:
        """A pure ε charge (each report uses the full ε) to a class over this ledger's ``w``."""
        return (
            isinstance(event, PureCharge)
            and isinstance(event.payer, PrivacyClass)
            and window_of(event.scope) == self.window
        )

    def supported(self) -> str:
        return f"{self.SUPPORTS} (w={self.window})"

    def accept(self, event: Charge) -> None:
        """Refuse an accounting event this ledger cannot hold (``supports``)."""
        _accept(self, event)

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


LedgerPart = Literal["dc", "pub"]


@dataclass
class PersonalizedLedger:
    """Per-class sliding budget of one stream under personalized w-event privacy.

    A class ``c`` is the set of users sharing one requirement ``(w_c, ε_c)``; every budget of
    PBD/PBA and the baselines is the same for all its members (spec §9.3), so the ledger keeps
    ``m`` sliding sums however many users there are. ``dc`` and ``pub`` hold, per class, what
    the dissimilarity part (PartDC) and the publication part (PartNOP) charged at the slot in
    ring position ``t mod R`` (``R = max(horizon, max_c w_c)``); ``slots`` says which slot wrote
    a position, so stale positions read as zero. Charges must come in slot order.

    Classes join over time (spec §9.5): ``add_classes`` appends classes with zero history at
    their join slot (``joined[c]``), growing the ring when a new window exceeds it; a user who
    joins an existing class simply shares its history (conservative). A ledger may start with
    no class at all (nobody registered yet). ``horizon`` keeps at least that many slots
    readable, for a mechanism that looks back over a window of its own (BD's uniform ``w``).
    """

    windows: NDArray[np.int64]
    epsilons: NDArray[np.float64]
    last: int = 0
    horizon: int = 1
    SUPPORTS: ClassVar[str] = "charges to a privacy class in ε, μ² or ρ over its own window w_c"

    def supports(self, event: Charge) -> bool:
        """An additive charge to a class ``(w_c, budget)`` this ledger holds, over ``w_c``."""
        payer = event.payer
        if not (isinstance(event, ADDITIVE) and isinstance(payer, PrivacyClass)):
            return False
        same = (self.windows == payer.scope) & (self.epsilons == payer.budget)
        return bool(same.any()) and window_of(event.scope) == payer.scope

    def supported(self) -> str:
        return f"{self.SUPPORTS} (its {self.classes} classes)"

    def accept(self, event: Charge) -> None:
        """Refuse an accounting event this ledger cannot hold (``supports``)."""
        _accept(self, event)

    slots: NDArray[np.int64] = field(init=False)
    dc: NDArray[np.float64] = field(init=False)
    pub: NDArray[np.float64] = field(init=False)
    joined: NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.windows, self.epsilons = self._classes(self.windows, self.epsilons)
        if not isinstance(self.horizon, int) or self.horizon < 1:
            raise ValueError(f"ledger horizon must be an integer >= 1, got {self.horizon!r}")
        ring = max(self.horizon, int(self.windows.max(initial=1)))
        self.slots = np.full(ring, NEVER, dtype=np.int64)
        self.dc = np.zeros((self.classes, ring))
        self.pub = np.zeros((self.classes, ring))
        self.joined = np.full(self.classes, self.last + 1, dtype=np.int64)

    @staticmethod
    def _classes(
        windows: ArrayLike, epsilons: ArrayLike
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        w = np.array(windows, dtype=np.int64).reshape(-1)
        e = np.array(epsilons, dtype=np.float64).reshape(-1)
        if w.shape != e.shape:
            raise ValueError("a personalized ledger needs one (w, ε) per class")
        if np.any(w < 1):
            raise ValueError(f"class windows must be >= 1, got {w.tolist()}")
        if not np.all(np.isfinite(e) & (e > 0)):
            raise ValueError(f"class budgets must be positive and finite, got {e.tolist()}")
        return w, e

    def add_classes(self, t: int, windows: ArrayLike, epsilons: ArrayLike) -> None:
        """Append classes ``(windows[k], epsilons[k])`` joining at slot ``t`` with zero history.

        Their members were charged nothing before ``t`` (they were not registered), so every
        window of theirs reads only what is charged from ``t`` on. When a new window exceeds
        the ring, the ring grows; the slots the old classes can still read (the last ``R``)
        keep their charges. Memory stays ``O(m·R)``, nothing per user.
        """
        _check_t(t)
        if t < self.last:
            raise ValueError(f"personalized ledger got classes at t={t} after t={self.last}")
        w, e = self._classes(windows, epsilons)
        ring = self.slots.shape[0]
        grown = max(ring, int(w.max(initial=1)))
        if grown > ring:
            # Windows ending at t ≥ last read slots > last − R only; those R consecutive slots
            # land on distinct positions of the larger ring.
            live = np.flatnonzero(self.slots > self.last - ring)
            pos = self.slots[live] % grown
            slots = np.full(grown, NEVER, dtype=np.int64)
            slots[pos] = self.slots[live]
            dc, pub = np.zeros((self.classes, grown)), np.zeros((self.classes, grown))
            dc[:, pos], pub[:, pos] = self.dc[:, live], self.pub[:, live]
            self.slots, self.dc, self.pub = slots, dc, pub
        fresh = np.zeros((w.shape[0], grown))
        self.dc = np.concatenate([self.dc, fresh])
        self.pub = np.concatenate([self.pub, fresh])
        self.windows = np.concatenate([self.windows, w])
        self.epsilons = np.concatenate([self.epsilons, e])
        self.joined = np.concatenate([self.joined, np.full(w.shape[0], t, dtype=np.int64)])
        self.last = t

    @property
    def classes(self) -> int:
        return int(self.windows.shape[0])

    def __deepcopy__(self, memo: dict[int, Any]) -> PersonalizedLedger:
        # Mechanism.step copies the state every slot; the ledger is arrays and ints only.
        new = object.__new__(type(self))
        new.__dict__.update(
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self.__dict__.items()}
        )
        return new

    def spent(
        self, lo: NDArray[np.int64] | int, hi: int, part: str = "both"
    ) -> NDArray[np.float64]:
        """Per class, the budget charged at slots ``lo_c..hi`` (inclusive) by PartDC, PartNOP or
        both; ``lo`` is one slot or one slot per class."""
        lo_c = np.asarray(lo, dtype=np.int64).reshape(-1, 1)
        live = (self.slots >= lo_c) & (self.slots <= hi)
        if part == "dc":
            charged = self.dc
        elif part == "pub":
            charged = self.pub
        else:
            charged = self.dc + self.pub
        out: NDArray[np.float64] = np.where(live, charged, 0.0).sum(axis=1)
        return out

    def window_spent(self, t: int) -> NDArray[np.float64]:
        """``Σ_{k=t−w_c+1}^{t} ε_{c,k}`` for every class: the left side of (C1) at slot ``t``."""
        return self.spent(t - self.windows + 1, t)

    def lookback(self, t: int, part: str) -> NDArray[np.float64]:
        """What ``part`` charged each class at the ``w_c − 1`` slots before ``t`` (spec §4.2 B6)."""
        return self.spent(t - self.windows + 1, t - 1, part)

    def limits(self) -> NDArray[np.float64]:
        """Each class's ``ε_c`` plus the float slack the invariant allows."""
        return self.epsilons * (1.0 + RELATIVE_TOLERANCE)

    def charge(self, t: int, amounts: NDArray[np.float64], part: LedgerPart) -> None:
        """Charge every member of class ``c`` ``amounts[c]`` at slot ``t`` for ``part``.

        Refuses (``PrivacyBudgetExceeded``) before recording anything if some class's window
        ending at ``t`` would exceed its ``ε_c``; the windows ending later hold no charge yet.
        """
        _check_t(t)
        if part not in ("dc", "pub"):
            raise ValueError(f"invalid part {part!r}; use 'dc' or 'pub'")
        spend = np.asarray(amounts, dtype=np.float64)
        if spend.shape != self.windows.shape or not np.all(np.isfinite(spend) & (spend >= 0)):
            raise ValueError(
                f"charge needs {self.classes} finite non-negative amounts, got {spend.tolist()}"
            )
        if t < self.last:
            raise ValueError(f"personalized ledger charged at t={t} after t={self.last}")
        total = self.window_spent(t) + spend
        over = np.flatnonzero(total > self.limits())
        if over.size:
            c = int(over[0])
            raise PrivacyBudgetExceeded(
                f"charging {part} at slot {t} would spend {total[c]:.6g} > ε={self.epsilons[c]:g} "
                f"in the window of w={int(self.windows[c])} of privacy class {c} "
                f"({over.size} of {self.classes} classes over budget)"
            )
        pos = t % self.slots.shape[0]
        if self.slots[pos] != t:
            self.slots[pos] = t
            self.dc[:, pos] = 0.0
            self.pub[:, pos] = 0.0
        (self.dc if part == "dc" else self.pub)[:, pos] += spend
        self.last = t
