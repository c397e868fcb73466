"""Mean estimation on ``[−1, 1]``: SR (Duchi), PM and their hybrid HM (spec ldp-ids §2.7).

Each randomiser is ε-LDP for one report and unbiased for the user's value ``x``. The support of
``m`` reports is their sum, so the estimate is the sample mean of the reports. The worst-case
per-user variance ``Var*`` of HM follows spec §2.7 (erratum A11): ``"exact"`` is the true mixture
variance (the default), ``"paper"`` the printed Eq. 10.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.oracles import Oracle

HM_SWITCH: Final = 0.61  # HM uses SR only at or below this ε (spec §2.7)
MEAN_REPORT_BITS: Final = 64  # one real number per report (spec §2.7, our convention)

HmVariance = Literal["exact", "paper"]


def sr_scale(eps: float) -> float:
    """``C_s = (e^ε + 1)/(e^ε − 1)``, the magnitude of an SR report (A12)."""
    return (math.exp(eps) + 1) / (math.exp(eps) - 1)


def pm_scale(eps: float) -> float:
    """``C = (e^{ε/2} + 1)/(e^{ε/2} − 1)``, the bound of a PM report."""
    h = math.exp(eps / 2)
    return (h + 1) / (h - 1)


def sr_perturb(x: NDArray[np.float64], eps: float, rng: np.random.Generator) -> NDArray[np.float64]:
    """SR: ``±C_s`` with ``Pr[+C_s] = 1/2 + x(e^ε − 1)/(2(e^ε + 1))``; variance ``C_s² − x²``."""
    cs = sr_scale(eps)
    plus = rng.random(x.shape[0]) < 0.5 + x / (2 * cs)
    return np.where(plus, cs, -cs)


def pm_perturb(x: NDArray[np.float64], eps: float, rng: np.random.Generator) -> NDArray[np.float64]:
    """PM: uniform on ``[ℓ(x), r(x)]`` w.p. ``e^{ε/2}/(e^{ε/2}+1)``, else uniform on the rest of
    ``[−C, C]``; variance ``x²/(e^{ε/2}−1) + (e^{ε/2}+3)/(3(e^{ε/2}−1)²)``."""
    h = math.exp(eps / 2)
    c = pm_scale(eps)
    left = x * (c + 1) / 2 - (c - 1) / 2
    right = left + c - 1
    size = x.shape[0]
    inside = rng.random(size) < h / (h + 1)
    u = rng.random(size)
    centre = left + u * (c - 1)
    # Outside: [−C, ℓ) ∪ (r, C] has total length C + 1; map u over it.
    left_len = left + c
    v = u * (c + 1)
    outside = np.where(v < left_len, -c + v, right + (v - left_len))
    return np.where(inside, centre, outside)


def hm_worst_variance(eps: float, form: HmVariance = "exact") -> float:
    """Worst-case per-report variance ``Var*`` of HM (spec §2.7, Eq. 10 / A11)."""
    cs2 = sr_scale(eps) ** 2
    if eps <= HM_SWITCH:
        return cs2
    h = math.exp(eps / 2)
    pm_term = (h + 3) / (3 * (h - 1)) if form == "exact" else (h + 3) / (3 * (h - 1) ** 2)
    return math.exp(-eps / 2) * (cs2 + pm_term)


class HM(Oracle):
    """Hybrid mechanism: PM w.p. ``1 − e^{−ε/2}`` and SR otherwise when ε > 0.61, SR only below."""

    name = "HM"

    def __init__(self, variance_form: HmVariance = "exact") -> None:
        if variance_form not in ("exact", "paper"):
            raise ValueError(f"hm_variance must be 'exact' or 'paper', got {variance_form!r}")
        self.d = 1
        self.variance_form: HmVariance = variance_form

    def variance(self, eps: float, m: int) -> float:
        """``V(ε, m) = Var*(ε)/m`` in ``[−1, 1]`` units (spec §2.7)."""
        return math.inf if m <= 0 else hm_worst_variance(eps, self.variance_form) / m

    def report_bits(self, eps: float) -> int:
        return MEAN_REPORT_BITS

    def perturb(
        self, values: NDArray[np.float64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.float64]:
        x = np.clip(np.asarray(values, dtype=np.float64), -1.0, 1.0)
        sr = sr_perturb(x, eps, rng)
        if eps <= HM_SWITCH:
            return sr
        pm = pm_perturb(x, eps, rng)
        use_pm = rng.random(x.shape[0]) < 1 - math.exp(-eps / 2)
        return np.where(use_pm, pm, sr)

    def support(self, reports: NDArray[np.float64], eps: float) -> NDArray[np.float64]:
        return np.array([float(np.sum(reports))])

    def estimate(self, support: NDArray[np.float64], eps: float, m: int) -> NDArray[np.float64]:
        return np.zeros(1) if m == 0 else np.asarray(support, dtype=np.float64) / m
