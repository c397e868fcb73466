"""DPI's budget series over infinite time and its step sizes (spec dpi §3.3, Theorem 5.1/5.4).

Feng et al., "DPI: Ensuring Strict Differential Privacy for Infinite Data Streaming" (IEEE S&P
2024). A stream that never ends can only spend a finite ε if its per-slot spends come from a
convergent series used at most once per element. The series has the shape of Theorem 5.4 /
Appendix B.4 and is normalised so that it sums to ε exactly (``budget_exact``)::

    C   = Δ_Q / (μ ζ)
    r   = Li₂⁻¹(π²/6 − ε/C)      ∈ (0, 1)
    ε_i = C · (1 − rⁱ) / i²,     i = 1, 2, …      Σ_i ε_i = C·(π²/6 − Li₂(r)) = ε

``paper_thm54`` (reproduction only) keeps the paper's closed form ``X_i = (1 − rⁱ)/(ζ i²)``
for the step sizes of both distributions; its nominal charge per draw is then exactly ``4·ε_i``
(A10), so its ledger can reach 4ε.

**Public, and why it costs no privacy.** Everything here is a function of the public
hyperparameters (ε, μ, ζ, Δ_Q) and of a series index, never of user data (spec §1.3, §1.6): the
series, ε_t, α_t and η_t may be published with every release.

Numerics. ``r`` is often within 1e−5 of 1, so the series is parametrised by ``s = 1 − r``:
``Li₂(r) = spence(s)`` (scipy's ``spence(z)`` is ``Li₂(1 − z)``), solved for ``s`` by Brent's
method, and ``1 − rⁱ = −expm1(i·log1p(−s))``, which keeps full relative precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

EtaMode = Literal["budget_exact", "paper_thm54"]
ETA_MODES: Final[tuple[EtaMode, ...]] = ("budget_exact", "paper_thm54")
PI2_6: Final = math.pi**2 / 6.0
"""Li₂(1) = π²/6, the supremum of ε/C."""
MAX_INDEX: Final = 2**53
"""The largest series index this module returns: indices stay exact in a float64 and an int64.
ε_i there is below C·1.2e−32, far under any value RBA can ask for in practice."""
NO_INDEX: Final = 0
"""The index of "no draw" (an exhausted RBA): ε = 0, no step, no charge. Series indices are ≥ 1."""

FloatArray = NDArray[np.float64]


class StepSizes(NamedTuple):
    """One slot's step sizes for P_Q and P_A (α = ½·ln((1+2η)/(1−2η)), η = ½·tanh(α))."""

    alpha_q: float
    alpha_a: float
    eta_q: float
    eta_a: float


ZERO_STEPS: Final = StepSizes(0.0, 0.0, 0.0, 0.0)


def _spence(z: float) -> float:
    """scipy's ``spence(z) = Li₂(1 − z)``, imported on first use: every process discovers the
    families at start, and importing scipy there would add ~0.4 s to each one's start-up."""
    from scipy.special import spence

    return float(spence(z))


def dilog(x: float) -> float:
    """Li₂(x) = Σ_{n≥1} xⁿ/n² for x ≤ 1, via ``scipy.special.spence(1 − x)``."""
    return float(_spence(1.0 - x))


def exact_step_sizes(
    eps_t: float, mu: float, delta_q: float, query_share: float = 0.5, k_q: int = 1
) -> StepSizes:
    """The exact inverse of Theorem 5.1 for a slot that spends ``eps_t`` (spec §3.3).

    ``ε_Q = ρ_Q·ε_t`` and ``ε_A = (1 − ρ_Q)·ε_t / k_Q`` (each of the k_Q sampled queries
    updates its own P_A row); ``α_X = μ·ε_X/(4Δ_Q)``, ``η_X = ½·tanh(α_X)``, so that
    ``(2Δ_Q/μ)·ln((1+2η_X)/(1−2η_X)) = ε_X``. ``eps_t = 0`` gives zero steps.
    """
    if not (math.isfinite(eps_t) and eps_t >= 0.0):
        raise ValueError(f"eps_t must be a finite number ≥ 0, got {eps_t!r}")
    if not 0.0 <= query_share <= 1.0:
        raise ValueError(f"query_share (ρ_Q) must be in [0, 1], got {query_share!r}")
    if k_q < 1:
        raise ValueError(f"k_Q (queries_per_slot) must be ≥ 1, got {k_q!r}")
    alpha_q = mu * query_share * eps_t / (4.0 * delta_q)
    alpha_a = mu * (1.0 - query_share) * eps_t / (4.0 * delta_q * k_q)
    return StepSizes(alpha_q, alpha_a, 0.5 * math.tanh(alpha_q), 0.5 * math.tanh(alpha_a))


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _solve_one_minus_r(target: float) -> float:
    """``s`` in (0, 1) with ``π²/6 − Li₂(1 − s) = target`` (0 < target < π²/6).

    ``π²/6 − spence(s)`` rises from 0 at s = 0 to π²/6 at s = 1, so the root is bracketed.
    """
    from scipy.optimize import brentq

    root = brentq(
        lambda s: (PI2_6 - float(_spence(s))) - target,
        0.0,
        1.0,
        xtol=1e-300,
        rtol=4 * np.finfo(float).eps,
        maxiter=500,
    )
    return float(root)


@dataclass(frozen=True)
class BudgetSeries:
    """The series {ε_i} (spec §3.3) for a total ``epsilon``; all of it is public.

    ``epsilon`` is the total budget over infinite time (config key ``epsilon``), so the i-th
    term is :meth:`epsilon_i`. An infeasible ε (ε/C ≥ π²/6) is refused with the limit, unless
    ``allow_underspend``: then r = 0, ε_i = C/i² and the series sums to Cπ²/6 < ε
    (:attr:`underspend` says by how much).
    """

    epsilon: float
    mu: float
    zeta: float
    delta_q: float = 2.0
    mode: EtaMode = "budget_exact"
    allow_underspend: bool = False
    C: float = field(init=False)
    one_minus_r: float = field(init=False)
    """s = 1 − r, kept instead of r for precision (r is often within 1e−5 of 1)."""
    log_r: float = field(init=False)
    """log r (−inf when r = 0)."""

    def __post_init__(self) -> None:
        for name in ("epsilon", "mu", "zeta", "delta_q"):
            _positive(name, getattr(self, name))
        if self.mode not in ETA_MODES:
            raise ValueError(f"eta_mode must be one of {', '.join(ETA_MODES)}, got {self.mode!r}")
        C = self.delta_q / (self.mu * self.zeta)
        limit = PI2_6 * C
        if self.epsilon / C < PI2_6:
            s = _solve_one_minus_r(self.epsilon / C)
        elif self.allow_underspend:
            s = 1.0
        else:
            raise ValueError(
                f"ε must be < (π²/6)·Δ_Q/(μζ) = {limit:.6g} for Δ_Q = {self.delta_q:g}, "
                f"μ = {self.mu:g}, ζ = {self.zeta:g}; got ε = {self.epsilon:g}. Lower ε, "
                "lower μ or ζ, or set allow_underspend (the series then sums to that limit, "
                "less than ε)"
            )
        object.__setattr__(self, "C", C)
        object.__setattr__(self, "one_minus_r", s)
        object.__setattr__(self, "log_r", math.log1p(-s) if s < 1.0 else -math.inf)

    @property
    def r(self) -> float:
        """r = Li₂⁻¹(π²/6 − ε/C) (0 when underspending)."""
        return 1.0 - self.one_minus_r

    @property
    def total(self) -> float:
        """Σ_i ε_i = C·(π²/6 − Li₂(r)): ε, or Cπ²/6 when underspending."""
        return self.C * (PI2_6 - float(_spence(self.one_minus_r)))

    @property
    def underspend(self) -> float:
        """How much of ε the series never spends (0 unless ``allow_underspend`` was needed)."""
        return self.epsilon - self.C * PI2_6 if self.one_minus_r == 1.0 else 0.0

    def epsilon_i(self, i: int) -> float:
        """ε_i = C·(1 − rⁱ)/i² for a series index i ≥ 1, computed as ``−expm1(i·log r)``.

        Bit-identical to the same index's entry of :meth:`epsilons` (both use numpy's expm1),
        so a ledger can check ε_t against the series exactly.
        """
        if i < 1:
            raise ValueError(f"series indices start at 1, got {i!r}")
        fi = float(i)
        with np.errstate(invalid="ignore"):
            one_minus_ri = -float(np.expm1(fi * self.log_r))
        return self.C * one_minus_ri / (fi * fi)

    def epsilons(self, indices: ArrayLike) -> FloatArray:
        """ε_i for an array of indices ≥ 1 (vectorised :meth:`epsilon_i`)."""
        i = np.asarray(indices, dtype=np.float64)
        if i.size and float(i.min()) < 1.0:
            raise ValueError("series indices start at 1")
        with np.errstate(invalid="ignore"):
            one_minus_ri = -np.expm1(i * self.log_r)
        return np.asarray(self.C * one_minus_ri / (i * i), dtype=np.float64)

    def x_i(self, i: int) -> float:
        """The paper's X_i = (1 − rⁱ)/(ζ i²) = μ·ε_i/Δ_Q (Theorem 5.4)."""
        return self.mu * self.epsilon_i(i) / self.delta_q

    def step_sizes(self, i: int, query_share: float = 0.5, k_q: int = 1) -> StepSizes:
        """(α_Q, α_A, η_Q, η_A) for a slot that drew series index ``i`` (0: no draw → zeros).

        ``budget_exact``: :func:`exact_step_sizes` of ε_i. ``paper_thm54``: α = X_i/2 and
        η = ½·tanh(X_i/2) for both distributions, whatever ρ_Q (α_A divided by k_Q, so the
        charge of the k_Q rows together stays the paper's).
        """
        if i == NO_INDEX:
            return ZERO_STEPS
        if self.mode == "budget_exact":
            return exact_step_sizes(self.epsilon_i(i), self.mu, self.delta_q, query_share, k_q)
        if k_q < 1:
            raise ValueError(f"k_Q (queries_per_slot) must be ≥ 1, got {k_q!r}")
        alpha = self.x_i(i) / 2.0
        return StepSizes(alpha, alpha / k_q, 0.5 * math.tanh(alpha), 0.5 * math.tanh(alpha / k_q))

    def nominal_charge(self, i: int) -> float:
        """The nominal ledger's charge of a draw of index i (Theorem 5.1 on both distributions).

        ``budget_exact``: ε_i. ``paper_thm54``: (4Δ_Q/μ)·(α_Q + k_Q·α_A) = 4·ε_i (A10, I9).
        Index 0 (no draw) charges 0.
        """
        if i == NO_INDEX:
            return 0.0
        eps = self.epsilon_i(i)
        return eps if self.mode == "budget_exact" else 4.0 * eps

    def largest_index_above(self, value: float) -> int:
        """max{i ≥ 1 : ε_i > value}; 0 when ε_1 ≤ value; :data:`MAX_INDEX` when ε_MAX > value.

        ε_i is strictly decreasing (spec §3.3), so doubling finds a bracket and bisection the
        boundary, in O(log i) evaluations.
        """
        if not value == value:  # NaN
            raise ValueError("value must be a number, got NaN")
        if self.epsilon_i(1) <= value:
            return 0
        lo, hi = 1, 2  # invariant: ε_lo > value
        while self.epsilon_i(hi) > value:
            if hi >= MAX_INDEX:
                return MAX_INDEX
            lo, hi = hi, min(2 * hi, MAX_INDEX)
        while hi - lo > 1:  # ε_lo > value ≥ ε_hi
            mid = (lo + hi) // 2
            if self.epsilon_i(mid) > value:
                lo = mid
            else:
                hi = mid
        return lo
