"""Engine-free mathematics of CGM, the correlated Gaussian mechanism (spec cgm §2–§5, §8.4).

Bao, Yang, Xiao & Ding, "CGM: An Enhanced Mechanism for Streaming Data Collection with Local
Differential Privacy" (PVLDB 14(11), 2021). A user who reports one value per timestamp adds
Gaussian noise ``γ_i = η_i + r_i·γ_{i−1}``: part of the noise already published is reused, so the
fresh noise only has to cover ``T_i = x_i − r_i·x_{i−1}``, whose sensitivity ``V_i = 1 − r_i·b``
is below 1 when consecutive items differ by at most ``C̃`` (``b = 1 − 2C̃``).

This module holds the pieces that need no engine and no randomness:

* the analytic Gaussian mechanism's ratio ``μ*(ε, δ)`` (Balle & Wang 2018), computed with a
  local overflow-free ``erfcx`` so that no scipy is needed at run time (spec §2);
* the public schedule ``r_i``, ``V_i``, ``v_i`` of Algorithm 3, its closed forms (Eq. 21/22), the
  one-step update of a user's chain and its gap-aware variant (spec §4.3, §4.7);
* the covariance of the noise across timestamps, for windowed and differenced aggregates
  (spec §5.4);
* the clipping that maps any raw stream into the valid domain and enforces the C-bound: range
  clip, then the *recursive* differential clip against the previous clipped value (spec §4.6,
  erratum A2);
* ``t_max``, the number of reports a fixed σ̃₁ affords under a budget (spec §4.7).

Units. The schedule and ``μ*`` are in normalized units (data of diameter 1, sensitivity 1); the
clipping functions work in raw units. ``σ_raw = D·σ̃`` and ``C̃ = C_raw/D`` (spec §0).

Privacy (spec §4.5). Every report i is the Gaussian release of ``T_i/V_i`` with noise σ̃₁, and
``T_i/V_i`` has L2 sensitivity at most 1 over clipped streams as long as ``0 ≤ r_i ≤ 1`` and
``σ_i = V_i·σ̃₁``. Everything computed here except the clipping depends only on public
parameters, so publishing it leaks nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

ERFCX_SERIES_FROM: Final = 26.0
"""Above this argument ``erfcx`` uses its asymptotic series (``exp(z²)`` would soon overflow)."""
AGM_TOLERANCE: Final = 1e-13
"""Width of the final bracket on χ in :func:`agm_mu` (spec §2.4)."""
T_MAX_TOLERANCE: Final = 1e-9
"""Added before flooring in :func:`t_max`, so a budget met exactly in reals is not lost to
rounding (spec §4.7)."""

_AGM_MAX_HALVINGS: Final = 200
_SERIES_CUTOFF: Final = 1e-17


# -- analytic Gaussian mechanism (spec §2) ----------------------------------------------------


def erfcx(z: float) -> float:
    """The scaled complementary error function ``exp(z²)·erfc(z)``, safe for large ``z``.

    For ``z ≤ 26`` it is the direct product (``exp(676)`` is finite and ``erfc(26)`` is still a
    normal double). Beyond, it sums the asymptotic series
    ``1/(z√π)·Σ_n (−1)^n (2n−1)!!/(2z²)^n`` until a term drops below 1e−17; there the terms
    shrink by a factor of at least 1352 at first, so the sum is accurate to double precision.
    The direct product loses about ``z²·2⁻⁵³`` relative (≤ 1e−13) through the rounding of ``z²``.
    For ``z < −26.6`` the true value exceeds the double range and ``OverflowError`` is raised.
    """
    if z <= ERFCX_SERIES_FROM:
        return math.exp(z * z) * math.erfc(z)
    two_z2 = 2.0 * z * z
    term, total, n = 1.0, 1.0, 0
    while abs(term) > _SERIES_CUTOFF:
        n += 1
        term *= -(2 * n - 1) / two_z2
        total += term
    return total / (z * math.sqrt(math.pi))


def _check_epsilon_delta(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


def _agm_gap(chi: float, epsilon: float) -> float:
    """``g(χ) = erfc(χ) − e^ε·erfc(√(χ²+ε))`` of spec Eq. 3, strictly decreasing in χ.

    Uses ``e^ε·erfc(√(χ²+ε)) = e^{−χ²}·erfcx(√(χ²+ε))``, so ``e^ε`` is never formed (spec §2.4).
    """
    s = math.sqrt(chi * chi + epsilon)
    if chi >= 0:
        return math.exp(-chi * chi) * (erfcx(chi) - erfcx(s))
    return math.erfc(chi) - math.exp(-chi * chi) * erfcx(s)


def agm_mu(epsilon: float, delta: float) -> float:
    """``μ*(ε, δ) = √2(√(χ²+ε) − χ)``: the largest sensitivity/noise-std ratio of an (ε, δ)-DP
    Gaussian mechanism (analytic Gaussian mechanism, spec §2.1, Eq. 2–3).

    Guarantee: releasing ``F(x) + N(0, σ²I)`` with ``S(F)/σ ≤ agm_mu(ε, δ)`` is (ε, δ)-DP, and
    the bound is tight. χ, the unique root of ``g(χ) = 2δ``, is bracketed by doubling from
    ``[−1, 1]`` (it may be negative: δ > 0.28621 at ε = 1) and bisected to a bracket narrower
    than 1e−13 (spec §2.4). The result is the bracket's midpoint, accurate to about 1e−12
    relative on the spec §2.5 table. ``μ*`` is formed as ``√2·ε/(√(χ²+ε) + χ)`` for χ ≥ 0 to
    avoid cancellation. Raises ValueError naming ``epsilon`` (unless finite and > 0) or
    ``delta`` (unless in (0, 1)).
    """
    _check_epsilon_delta(epsilon, delta)
    target = 2.0 * delta
    lo, hi = -1.0, 1.0
    while _agm_gap(lo, epsilon) < target:
        lo *= 2.0
    while _agm_gap(hi, epsilon) > target:
        hi *= 2.0
    for _ in range(_AGM_MAX_HALVINGS):
        if hi - lo < AGM_TOLERANCE:
            break
        mid = 0.5 * (lo + hi)
        if _agm_gap(mid, epsilon) > target:
            lo = mid
        else:
            hi = mid
    chi = 0.5 * (lo + hi)
    s = math.sqrt(chi * chi + epsilon)
    if chi >= 0:
        return math.sqrt(2.0) * epsilon / (s + chi)
    return math.sqrt(2.0) * (s - chi)


def agm_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest Gaussian noise std that makes a query of L2 ``sensitivity`` (ε, δ)-DP:
    ``sensitivity / μ*(ε, δ)`` (spec §2.1).

    With ``sensitivity = √l`` in normalized units this is CGM's (and Algorithm 1's) σ̃₁ for a
    whole-stream budget over l reports; with 1 it is the per-timestamp σ̃₁ (spec §1.6, Eq. 14).
    Raises ValueError for a bad ``epsilon``, ``delta`` or ``sensitivity`` (finite, > 0).
    """
    _check_epsilon_delta(epsilon, delta)
    ok = isinstance(sensitivity, (int, float)) and math.isfinite(sensitivity) and sensitivity > 0
    if not ok:
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    return sensitivity / agm_mu(epsilon, delta)


# -- the schedule of Algorithm 3 (spec §4.3, §4.7) --------------------------------------------


@dataclass(frozen=True, eq=False)
class Schedule:
    """The public schedule of Algorithm 3 for ``length`` reports (spec §4.3).

    ``r``, ``V`` and ``v`` are read-only arrays of ``length + 1`` entries indexed by the step
    ``i = 1..length``. Index 0 is the virtual step before the first report (no noise yet:
    ``γ_0 = 0``), so ``r[0] = V[0] = v[0] = 0``; step 1 is ``r[1] = 0``, ``V[1] = v[1] = 1``.

    * ``r[i]``: the reuse ratio, ``γ_i = η_i + r_i·γ_{i−1}``; ``0 < r_i < 1`` for i ≥ 2 when
      ``0 < C̃ < 1/2``;
    * ``V[i]``: the L2 sensitivity of the fresh term ``T_i = x_i − r_i·x_{i−1}`` (normalized), so
      the fresh noise has std ``σ_i = V_i·σ₁``;
    * ``v[i]``: ``Var(γ_i)/σ₁²`` per coordinate, the report's error relative to Algorithm 1
      (Theorem 5.1). ``V_i = v_i`` up to rounding.

    ``c_norm`` is C̃ as given; when it is ≥ 1/2 the schedule is Algorithm 1 (``independent``).
    """

    c_norm: float
    r: FloatArray
    V: FloatArray
    v: FloatArray

    @property
    def length(self) -> int:
        """The number of reports the schedule covers."""
        return len(self.v) - 1

    @property
    def independent(self) -> bool:
        """True when C̃ ≥ 1/2: the bound gives nothing and every step is Algorithm 1's."""
        return self.c_norm >= 0.5


def _check_c_norm(c_norm: float) -> None:
    if not (isinstance(c_norm, (int, float)) and math.isfinite(c_norm) and c_norm >= 0):
        raise ValueError(f"c_norm must be a finite number >= 0, got {c_norm!r}")


def _check_step(name: str, value: int, lowest: int, highest: int | None = None) -> None:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lowest
    if not ok or (highest is not None and value > highest):
        span = f"[{lowest}, {highest}]" if highest is not None else f">= {lowest}"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")


def schedule_step(v_prev: float, c_norm: float) -> tuple[float, float, float]:
    """One step ``i ≥ 2`` of a user's chain: ``(r_i, V_i, v_i)`` from ``v_{i−1}`` (spec §4.3).

    With ``b = 1 − 2·min(C̃, 1/2)`` and ``q = b²``: ``r_i = b/(q + v_{i−1})`` (the minimiser of
    ``Var(γ_i)``), ``V_i = 1 − r_i·b`` (the sensitivity of ``T_i``, Eq. 19) and
    ``v_i = v_{i−1}/(q + v_{i−1})``. Guarantee: ``0 ≤ r_i ≤ 1`` and ``0 < V_i ≤ 1`` for every
    ``v_{i−1} ∈ (0, 1]``, so ``σ_i = V_i·σ₁`` keeps each report's surrogate at sensitivity 1.
    ``C̃ = 0`` gives ``r_i = 1/(1 + v_{i−1})`` (a running average, v_i = 1/i); ``C̃ ≥ 1/2`` gives
    exactly ``(0, 1, 1)``, Algorithm 1. Only public numbers go in, so the output is public.
    """
    _check_c_norm(c_norm)
    if not (isinstance(v_prev, (int, float)) and 0 < v_prev <= 1):
        raise ValueError(f"v_prev must lie in (0, 1], got {v_prev!r}")
    b = 1.0 - 2.0 * min(c_norm, 0.5)
    q = b * b
    r = b / (q + v_prev)
    return r, 1.0 - r * b, v_prev / (q + v_prev)


def schedule_step_after_gap(v_prev: float, c_norm: float, gap: int) -> tuple[float, float, float]:
    """The gap-aware step of spec §4.7(b) [X, not in the paper]: after ``gap`` timestamps since
    the user's last report, use ``C_g = min(gap·C̃, 1/2)`` in place of C̃.

    Sound because consecutive reports are then at most ``gap·C̃`` apart (the caller must
    differential-clip with radius ``gap·C_raw``); the privacy charge per report is unchanged.
    ``gap = 1`` is :func:`schedule_step`. The gap must be public (never data-dependent).
    """
    _check_c_norm(c_norm)
    _check_step("gap", gap, 1)
    return schedule_step(v_prev, min(gap * c_norm, 0.5))


def variance_floor(c_norm: float) -> float:
    """``v_∞ = 4C̃(1 − C̃)``, the infimum of ``v_i = Var(γ_i)/σ₁²`` over every chain of
    Algorithm 3 with bound C̃ (spec §4.3; ``1`` when ``C̃ ≥ 1/2``, Algorithm 1).

    ``v ↦ v/(b² + v)`` maps ``[1 − b², 1]`` into itself and a larger gap-aware ``C_g`` only
    lowers ``b``, so no step of any chain (lag phases, gaps) reports with less noise than
    ``v_∞·σ₁²``. ``C̃ = 0`` gives 0: a running average, whose reports' noise vanishes.
    """
    _check_c_norm(c_norm)
    c = min(c_norm, 0.5)
    return 4.0 * c * (1.0 - c)


def cgm_schedule(c_norm: float, length: int) -> Schedule:
    """The schedule ``r_i, V_i, v_i`` for ``i = 1..length`` by the exact recursion (spec §4.3).

    Step 1 is ``(0, 1, 1)``; every later step is :func:`schedule_step`. The recursion is used for
    every C̃, including ``C̃ = 0`` (where the closed forms are 0/0) and ``C̃ ≥ 1/2`` (Algorithm 1).
    It agrees with the closed forms of Eq. 21/22 to about 1e−15.
    """
    _check_c_norm(c_norm)
    _check_step("length", length, 1)
    r, V, v = np.zeros(length + 1), np.zeros(length + 1), np.zeros(length + 1)
    V[1] = v[1] = 1.0
    for i in range(2, length + 1):
        r[i], V[i], v[i] = schedule_step(float(v[i - 1]), c_norm)
    for array in (r, V, v):
        array.setflags(write=False)
    return Schedule(float(c_norm), r, V, v)


def _check_open_c_norm(c_norm: float) -> None:
    if not (isinstance(c_norm, (int, float)) and 0 < c_norm < 0.5):
        raise ValueError(f"c_norm must lie in (0, 1/2) for the closed forms, got {c_norm!r}")


def closed_form_v(c_norm: float, i: int) -> float:
    """Eq. 22: ``v_i = (4C − 4C²)/(1 − (1 − 2C)^{2i})`` for ``0 < C̃ < 1/2`` and ``i ≥ 1``.

    For tests of the recursion; ``1 − q^i`` is computed as ``−expm1(i·ln q)``.
    """
    _check_open_c_norm(c_norm)
    _check_step("i", i, 1)
    q = (1.0 - 2.0 * c_norm) ** 2
    return 4.0 * c_norm * (1.0 - c_norm) / -math.expm1(i * math.log(q))


def closed_form_r(c_norm: float, i: int) -> float:
    """Eq. 21: ``r_i = (1−2C)/((1−2C)² + (4C − 4C²)/(1 − (1−2C)^{2i−2}))`` for ``i ≥ 2``;
    ``r_1 = 0``. Valid for ``0 < C̃ < 1/2``; for tests of the recursion.
    """
    _check_open_c_norm(c_norm)
    _check_step("i", i, 1)
    if i == 1:
        return 0.0
    b = 1.0 - 2.0 * c_norm
    q = b * b
    return b / (q + 4.0 * c_norm * (1.0 - c_norm) / -math.expm1((i - 1) * math.log(q)))


# -- noise covariance (spec §5.4) -------------------------------------------------------------


def covariance(schedule: Schedule, i: int, j: int) -> float:
    """``Cov(γ_i, γ_j)/σ₁²`` per coordinate: ``v_m·∏_{k=m+1}^{M} r_k`` with ``m = min(i, j)``,
    ``M = max(i, j)`` (spec §5.4). Symmetric; ``covariance(s, i, i) = v_i``.

    A function of the public schedule only. Reports of one user are positively correlated, so
    a CI for a multi-timestamp aggregate must use this, not independence.
    """
    _check_step("i", i, 1, schedule.length)
    _check_step("j", j, 1, schedule.length)
    m, M = min(i, j), max(i, j)
    return float(schedule.v[m] * np.prod(schedule.r[m + 1 : M + 1]))


def difference_variance(schedule: Schedule, i: int) -> float:
    """``Var(γ_i − γ_{i−1})/σ₁² = v_i + v_{i−1} − 2·r_i·v_{i−1}`` for ``2 ≤ i ≤ length``
    (spec §5.4): the noise of a one-step trend, far below Algorithm 1's 2 once the chain is
    stable (``2·v_∞·(1 − r_∞)``, e.g. 0.038 at C̃ = 0.05).
    """
    _check_step("i", i, 2, schedule.length)
    v, r = schedule.v, schedule.r
    return float(v[i] + v[i - 1] - 2.0 * r[i] * v[i - 1])


def window_sum_variance(schedule: Schedule, a: int, b: int) -> float:
    """``Var(Σ_{i=a}^{b} γ_i)/σ₁²`` per coordinate for ``1 ≤ a ≤ b ≤ length`` (spec §5.4).

    O(b − a) recursion: ``c_a = 0``, ``c_i = r_i(c_{i−1} + v_{i−1})`` (the covariance of γ_i
    with the earlier terms of the window), ``S_i = S_{i−1} + v_i + 2c_i`` with ``S_a = v_a``.
    Sums are *not* improved by CGM (7.428 against 7 for a stable week at C̃ = 0.05).
    """
    _check_step("a", a, 1, schedule.length)
    _check_step("b", b, a, schedule.length)
    v, r = schedule.v, schedule.r
    c, total = 0.0, float(v[a])
    for i in range(a + 1, b + 1):
        c = float(r[i]) * (c + float(v[i - 1]))
        total += float(v[i]) + 2.0 * c
    return total


# -- clipping (spec §4.6) ---------------------------------------------------------------------


def _finite(name: str, x: ArrayLike) -> FloatArray:
    array = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (impute or range-clip missing values first)")
    return array


def _pull_within(x: FloatArray, anchor: FloatArray, radius: FloatArray | float) -> FloatArray:
    """Each row of ``x`` (vectors along the last axis) moved onto the L2 sphere of ``radius``
    around ``anchor`` if it lies outside; rows already within the radius come back unchanged.

    A row so far away that ``‖x − anchor‖`` (or ``x − anchor`` itself) overflows to inf is
    moved in the scaled space ``(x − anchor)/s``, ``s`` its largest magnitude: onto the sphere
    in its own direction (``R/inf`` used to give 0, which put it at the anchor)."""
    with np.errstate(over="ignore", invalid="ignore"):
        u = x - anchor
        norm = np.linalg.norm(u, axis=-1, keepdims=True)
    huge = ~np.isfinite(norm)
    if np.any(huge):
        s = np.maximum(np.abs(x), np.abs(anchor)).max(axis=-1, keepdims=True)
        scaled = x / np.where(huge, s, 1.0) - anchor / np.where(huge, s, 1.0)
        u = np.where(huge, scaled, u)
        norm = np.where(huge, np.linalg.norm(scaled, axis=-1, keepdims=True), norm)
    outside = huge | (norm > radius)
    scale = np.divide(radius, norm, out=np.ones_like(norm), where=outside)
    return np.where(outside, anchor + u * scale, x)


def range_clip(x: ArrayLike, lo: float, hi: float) -> FloatArray:
    """Clamp scalar items to the public domain ``[lo, hi]`` (spec §4.6 range clip).

    Any shape, e.g. ``(n,)`` or ``(n, 1)``; the shape is kept and ±inf clamp to the ends.
    Guarantee: every output lies in ``[lo, hi]``, so two outputs differ by at most ``D = hi − lo``
    (sensitivity 1 after normalization). NaN is rejected (ValueError): impute first.
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"lo and hi must be finite with lo < hi, got {lo!r}, {hi!r}")
    array = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(array)):
        raise ValueError("x must not contain NaN (impute missing values first)")
    return np.clip(array, lo, hi)


def ball_clip(x: ArrayLike, center: ArrayLike, radius: float) -> FloatArray:
    """Project vector items (rows of an ``(n, d)`` array, or one ``(d,)`` vector) onto the L2
    ball of ``radius`` around ``center`` (spec §4.6 range clip for vectors).

    ``x ← c + (x − c)·min(1, R/‖x − c‖)``; points inside come back unchanged. Guarantee: every
    output lies in the ball, so two outputs differ by at most ``D = 2R``. Non-finite input is
    rejected (ValueError).
    """
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a finite number > 0, got {radius!r}")
    c = _finite("center", center)
    array = _finite("x", x)
    if array.ndim == 0 or c.shape != array.shape[-1:]:
        raise ValueError(f"center must have shape {array.shape[-1:]}, got {c.shape}")
    return _pull_within(array, c, radius)


def diff_clip(x: ArrayLike, previous_clipped: ArrayLike, bound: ArrayLike) -> FloatArray:
    """The differential clip, recursive form (spec §4.6, erratum A2): move each user's item to
    within ``bound`` of that user's previous *clipped* item.

    ``x`` and ``previous_clipped`` have one row per user: shape ``(n,)`` for scalars or
    ``(n, d)`` for vectors. For scalars and ``d = 1`` it is the clamp
    ``x'_{i−1} + clamp(x_i − x'_{i−1}, −C, C)``; for ``d > 1`` it scales
    ``u = x_i − x'_{i−1}`` to L2 norm ≤ C. ``bound`` (raw units) is one number or one per user,
    shape ``(n,)`` (e.g. ``gap·C_raw`` after a gap, spec §4.7(b)).

    Guarantee: ``‖x'_i − x'_{i−1}‖ ≤ bound`` per user (up to the rounding of the coordinates),
    which the privacy proof needs; clipping around the *unclipped* ``x_{i−1}`` (the printed
    Eq. 23) does not ensure it. An item already within the bound comes back unchanged (no bias
    on streams that obey it); otherwise ``x'_i`` lies on the segment from ``x'_{i−1}`` to
    ``x_i``, so it stays in any convex domain both lie in. Non-finite input is rejected
    (ValueError).
    """
    current = _finite("x", x)
    previous = _finite("previous_clipped", previous_clipped)
    radius = _finite("bound", bound)
    if current.shape != previous.shape or current.ndim not in (1, 2):
        raise ValueError(
            f"x and previous_clipped must share a shape (n,) or (n, d), got "
            f"{current.shape} and {previous.shape}"
        )
    if np.any(radius < 0) or radius.ndim > 1:
        raise ValueError("bound must be >= 0, one number or one per user")
    if current.ndim == 2 and radius.ndim == 1:
        radius = radius[:, np.newaxis]
    if current.ndim == 1 or current.shape[1] == 1:
        return np.clip(current, previous - radius, previous + radius)
    return _pull_within(current, previous, radius)


# -- reports under a fixed noise level (spec §4.7) --------------------------------------------


def t_max(mu_budget: float, sigma1_norm: float) -> int:
    """The number of reports a user with normalized first-step noise ``σ̃₁`` may send under a
    budget of Gaussian ratio ``μ_budget = μ*(ε, δ)``: ``⌊(μ_budget·σ̃₁)² + 1e−9⌋`` (spec §4.7).

    After t reports the user has spent a Gaussian mechanism of ratio ``√t/σ̃₁`` (μ-GDP composes
    in squares, spec §8.4), so t reports are (ε, δ)-DP exactly when ``t ≤ (μ*·σ̃₁)²``. The
    tolerance keeps a budget met exactly in reals (σ̃₁ = √l/μ*) from losing its last report.
    """
    for name, value in (("mu_budget", mu_budget), ("sigma1_norm", sigma1_norm)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return math.floor((mu_budget * sigma1_norm) ** 2 + T_MAX_TOLERANCE)
