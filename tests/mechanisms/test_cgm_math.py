"""CGM mathematics (``mechanisms.cgm_math``): AGM, schedule, covariance, clipping, ledger values.

The recipes are spec cgm §5.5 (T-AGM, T-SCHED, T-CLIP, T-PRIV structural) and the numbers of
§2.5, §4.1, §5.3, §5.4, §4.7 and §8.4. scipy serves only as an independent cross-check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.special import erfcx as scipy_erfcx
from scipy.stats import norm

from privstream.mechanisms.cgm_math import (
    agm_mu,
    agm_sigma,
    ball_clip,
    cgm_schedule,
    closed_form_r,
    closed_form_v,
    covariance,
    diff_clip,
    difference_variance,
    erfcx,
    range_clip,
    schedule_step,
    schedule_step_after_gap,
    t_max,
    window_sum_variance,
)
from privstream.mechanisms.guarantees import GaussianDP

# -- T-AGM (spec §2.5) ------------------------------------------------------------------------

# (ε, δ, χ, μ*, σ for S = 1)
AGM_TABLE = [
    (0.01, 1e-5, 1.7223730967, 0.0041019677, 243.7854376757),
    (0.1, 1e-5, 2.1628248396, 0.0325207841, 30.7495661320),
    (0.25, 1e-5, 2.3219593225, 0.0752698883, 13.2855252371),
    (0.5, 1e-5, 2.4358471380, 0.1422105587, 7.0318266756),
    (1, 1e-5, 2.5431845436, 0.2680511232, 3.7306316348),
    (2, 1e-5, 2.6423513012, 0.5015516892, 1.9938124456),
    (4, 1e-5, 2.7309750465, 0.9249308977, 1.0811618495),
    (8, 1e-5, 2.8063776110, 1.6660305978, 0.6002290722),
    (20, 1e-5, 2.8828295426, 3.4477834469, 0.2900414180),
    (0.25, 1e-6, 2.7011525774, 0.0648937105, 15.4098138569),
    (1, 1e-6, 2.9036114546, 0.2367043807, 4.2246788893),
    (2, 1e-6, 2.9958595257, 0.4483347404, 2.2304762712),
    (1, 1e-10, 4.0888920661, 0.1704222693, 5.8677777496),
    (1, 0.3, -0.0241583223, 1.4487912141, 0.6902305800),
    (0.5, 0.4, -0.2499274484, 1.4140767623, 0.7071751879),
]


def _chi_of(eps: float, mu: float) -> float:
    """Invert μ* = √2(√(χ²+ε) − χ): with s − χ = μ/√2 and s + χ = √2·ε/μ."""
    return (math.sqrt(2) * eps / mu - mu / math.sqrt(2)) / 2


def _phi_form_delta(eps: float, mu: float) -> float:
    """δ(ε; μ) of spec §2.2, with scipy's normal CDF."""
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


@pytest.mark.parametrize(("eps", "delta", "chi", "mu", "sigma"), AGM_TABLE)
def test_agm_reproduces_the_table(
    eps: float, delta: float, chi: float, mu: float, sigma: float
) -> None:
    got = agm_mu(eps, delta)
    # the table prints 10 decimals, so its own rounding is 5e-11 absolute
    assert got == pytest.approx(mu, rel=1e-8, abs=6e-11)
    assert agm_sigma(eps, delta, 1.0) == pytest.approx(sigma, rel=1e-8)
    assert _chi_of(eps, got) == pytest.approx(chi, rel=1e-8, abs=6e-11)
    assert _phi_form_delta(eps, got) == pytest.approx(delta, rel=1e-6)
    assert GaussianDP(got).delta(eps) == pytest.approx(delta, rel=1e-6)


def test_agm_papers_worked_example_and_experiment_sigmas() -> None:
    assert agm_sigma(1.0, 1e-5, math.sqrt(2)) == pytest.approx(5.275910, abs=5e-7)
    assert _chi_of(1.0, agm_mu(1.0, 1e-5)) == pytest.approx(2.543185, abs=5e-7)
    kaggle = [agm_sigma(e, 1e-5, 20000.0) for e in (0.25, 0.5, 1.0, 2.0)]
    assert kaggle == pytest.approx([265710.5, 140636.5, 74612.6, 39876.2], abs=0.05)
    taxi = [agm_sigma(e, 1e-5, math.sqrt(48)) for e in (0.25, 0.5, 1.0, 2.0)]
    assert taxi == pytest.approx([92.045, 48.718, 25.847, 13.814], abs=5e-4)


@pytest.mark.parametrize("eps", [0.25, 0.5, 1.0, 2.0, 8.0])
def test_agm_beats_the_classic_gaussian(eps: float) -> None:
    classic = math.sqrt(2 * math.log(1.25 / 1e-5)) / eps
    assert agm_sigma(eps, 1e-5, 1.0) < classic


def test_agm_is_monotone_in_epsilon_and_delta() -> None:
    by_eps = [agm_mu(e, 1e-5) for e in (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)]
    by_delta = [agm_mu(1.0, d) for d in (1e-300, 1e-50, 1e-10, 1e-3, 0.3, 0.9, 0.999999)]
    assert by_eps == sorted(by_eps)
    assert by_delta == sorted(by_delta)


def _scipy_agm_mu(eps: float, delta: float) -> float:
    def gap(chi: float) -> float:
        s = math.sqrt(chi * chi + eps)
        return float(math.exp(-chi * chi) * (scipy_erfcx(chi) - scipy_erfcx(s))) - 2 * delta

    chi = float(brentq(gap, 0.0, 60.0, xtol=1e-15, rtol=1e-15))
    return math.sqrt(2) * eps / (math.sqrt(chi * chi + eps) + chi)


@pytest.mark.parametrize(("eps", "delta"), [(700.0, 1e-5), (1000.0, 1e-5), (5000.0, 1e-300)])
def test_agm_large_epsilon_does_not_overflow(eps: float, delta: float) -> None:
    assert agm_mu(eps, delta) == pytest.approx(_scipy_agm_mu(eps, delta), rel=1e-10)


@pytest.mark.parametrize(
    "z", [-26.0, -5.0, -0.5, 0.0, 1e-3, 1.0, 3.0, 10.0, 25.9, 26.0, 26.001, 30.0, 1e3, 1e8]
)
def test_erfcx_matches_scipy(z: float) -> None:
    assert erfcx(z) == pytest.approx(float(scipy_erfcx(z)), rel=1e-12)


@pytest.mark.parametrize(
    ("eps", "delta", "name"),
    [
        (0.0, 1e-5, "epsilon"),
        (-1.0, 1e-5, "epsilon"),
        (math.inf, 1e-5, "epsilon"),
        (math.nan, 1e-5, "epsilon"),
        (1.0, 0.0, "delta"),
        (1.0, 1.0, "delta"),
        (1.0, -1e-5, "delta"),
        (1.0, math.nan, "delta"),
    ],
)
def test_agm_rejects_bad_parameters(eps: float, delta: float, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        agm_mu(eps, delta)
    with pytest.raises(ValueError, match=name):
        agm_sigma(eps, delta, 1.0)


@pytest.mark.parametrize("sensitivity", [0.0, -1.0, math.inf, math.nan])
def test_agm_sigma_rejects_bad_sensitivity(sensitivity: float) -> None:
    with pytest.raises(ValueError, match="sensitivity"):
        agm_sigma(1.0, 1e-5, sensitivity)


# -- T-SCHED (spec §4.3, §5.3) ----------------------------------------------------------------

C_GRID = [0.01, 0.025, 0.05, 0.1, 0.25]


@pytest.mark.parametrize("c", C_GRID)
def test_schedule_recursion_matches_the_closed_forms(c: float) -> None:
    s = cgm_schedule(c, 550)
    assert s.length == 550 and not s.independent
    for i in range(1, 551):
        assert s.v[i] == pytest.approx(closed_form_v(c, i), rel=1e-10, abs=0)
        assert s.r[i] == pytest.approx(closed_form_r(c, i), rel=1e-10, abs=0)
    assert np.allclose(s.V, s.v, rtol=0, atol=1e-14)  # identity V_i = v_i
    assert s.r[0] == s.V[0] == s.v[0] == 0.0  # the virtual step 0
    assert (s.r[1], s.V[1], s.v[1]) == (0.0, 1.0, 1.0)
    assert np.all((s.r[2:] > 0) & (s.r[2:] < 1))
    assert np.all(np.diff(s.r[1:]) >= 0) and np.all(np.diff(s.v[1:]) <= 0)
    assert s.r[2] < s.r[3] and s.v[2] > s.v[3]  # strictly at the start


# C̃: q, r₂, v₂, v₃, v₅, v₁₀, v₂₀, v₄₈, v_∞, r_∞, mean v (l=48), mean v (l=550)
SCHEDULE_TABLE = {
    0.01: (0.9604, 0.49989798, 0.51009998, 0.34688880, 0.21647957, 0.11913643, 0.07144151,
           0.04624988, 0.0396, 0.98, 0.11400816, 0.04636442),
    0.025: (0.9025, 0.49934297, 0.52562418, 0.36805215, 0.24298275, 0.15198419, 0.11187764,
            0.09821390, 0.0975, 0.95, 0.15438463, 0.10247645),
    0.05: (0.81, 0.49723757, 0.55248619, 0.40549856, 0.29171459, 0.21629662, 0.19285050,
           0.19000769, 0.19, 0.90, 0.23107786, 0.19358504),
    0.1: (0.64, 0.48780488, 0.60975610, 0.48790008, 0.40330449, 0.36419893, 0.36004786,
          0.36000000, 0.36, 0.80, 0.38511046, 0.36219146),
    0.25: (0.25, 0.40000000, 0.80000000, 0.76190476, 0.75073314, 0.75000072, 0.75000000,
           0.75, 0.75, 0.50, 0.75657965, 0.75057422),
}  # fmt: skip


@pytest.mark.parametrize("c", C_GRID)
def test_schedule_reproduces_the_reference_table(c: float) -> None:
    q, r2, v2, v3, v5, v10, v20, v48, v_inf, r_inf, mean48, mean550 = SCHEDULE_TABLE[c]
    s = cgm_schedule(c, 550)
    got = [
        (1 - 2 * c) ** 2,
        s.r[2],
        s.v[2],
        s.v[3],
        s.v[5],
        s.v[10],
        s.v[20],
        s.v[48],
        4 * c - 4 * c * c,
        1 - 2 * c,
        s.v[1:49].mean(),
        s.v[1:551].mean(),
    ]
    want = [q, r2, v2, v3, v5, v10, v20, v48, v_inf, r_inf, mean48, mean550]
    assert got == pytest.approx(want, rel=0, abs=1e-8)
    assert s.v[550] == pytest.approx(v_inf, abs=1e-8)  # the chain converges to v_∞ ...
    assert s.r[550] == pytest.approx(r_inf, abs=1e-8)  # ... and r_∞ = b


def test_schedule_more_reuse_ratios() -> None:
    s = cgm_schedule(0.05, 10)
    assert [s.r[3], s.r[5], s.r[10]] == pytest.approx(
        [0.66055716, 0.78698379, 0.87078153], abs=1e-8
    )


def test_schedule_two_value_example() -> None:
    """Spec §4.1: l = 2, C = 0.1; α = 1 + (1−2C)², β = 1 − 2C."""
    c, sigma = 0.1, 5.275910
    alpha, beta = 1 + (1 - 2 * c) ** 2, 1 - 2 * c
    s = cgm_schedule(c, 2)
    assert s.r[2] == pytest.approx(beta / alpha, rel=1e-14)
    assert s.V[2] == pytest.approx(1 / alpha, rel=1e-14)
    assert s.v[2] * sigma**2 == pytest.approx(16.9727, abs=5e-5)


def test_schedule_constant_streams_average() -> None:
    s = cgm_schedule(0.0, 200)
    i = np.arange(1, 201)
    assert np.allclose(s.v[1:], 1 / i, rtol=1e-13, atol=0)
    assert np.allclose(s.r[2:], (i[1:] - 1) / i[1:], rtol=1e-13, atol=0)


@pytest.mark.parametrize("c", [0.5, 0.7, 3.0])
def test_schedule_without_a_useful_bound_is_algorithm_1(c: float) -> None:
    s = cgm_schedule(c, 20)
    assert s.independent
    assert np.all(s.r[1:] == 0.0) and np.all(s.V[1:] == 1.0) and np.all(s.v[1:] == 1.0)


@pytest.mark.parametrize("c", [0.0, 0.01, 0.05, 0.3, 0.5, 2.0])
def test_schedule_step_is_the_schedule(c: float) -> None:
    s = cgm_schedule(c, 30)
    v = 1.0
    for i in range(2, 31):
        r, V, v = schedule_step(v, c)
        assert (r, V, v) == (s.r[i], s.V[i], s.v[i])


def test_gap_aware_step_uses_the_widened_bound() -> None:
    v_prev = 0.3
    assert schedule_step_after_gap(v_prev, 0.05, 1) == schedule_step(v_prev, 0.05)
    assert schedule_step_after_gap(v_prev, 0.05, 3) == schedule_step(v_prev, 0.15)
    assert schedule_step_after_gap(v_prev, 0.05, 10) == (0.0, 1.0, 1.0)
    assert schedule_step_after_gap(v_prev, 0.05, 100) == (0.0, 1.0, 1.0)
    # a gap widens the bound, so less can be reused and the report is noisier
    assert schedule_step_after_gap(v_prev, 0.05, 2)[2] > schedule_step(v_prev, 0.05)[2]


def test_schedule_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="c_norm"):
        cgm_schedule(-0.1, 10)
    with pytest.raises(ValueError, match="c_norm"):
        cgm_schedule(math.nan, 10)
    with pytest.raises(ValueError, match="length"):
        cgm_schedule(0.05, 0)
    with pytest.raises(ValueError, match="v_prev"):
        schedule_step(0.0, 0.05)
    with pytest.raises(ValueError, match="v_prev"):
        schedule_step(1.5, 0.05)
    with pytest.raises(ValueError, match="gap"):
        schedule_step_after_gap(0.5, 0.05, 0)
    for c in (0.0, 0.5):
        with pytest.raises(ValueError, match="c_norm"):
            closed_form_v(c, 3)
        with pytest.raises(ValueError, match="c_norm"):
            closed_form_r(c, 3)


# -- covariance (spec §5.4) -------------------------------------------------------------------


def test_covariance_reference_numbers() -> None:
    s = cgm_schedule(0.05, 550)

    def corr(i: int, j: int) -> float:
        return covariance(s, i, j) / math.sqrt(s.v[i] * s.v[j])

    assert corr(2, 1) == pytest.approx(0.669, abs=5e-4)
    assert corr(5, 4) == pytest.approx(0.842, abs=5e-4)
    assert corr(550, 549) == pytest.approx(0.9, abs=1e-8)
    assert window_sum_variance(s, 544, 550) == pytest.approx(7.428, abs=5e-4)
    assert window_sum_variance(s, 1, 7) == pytest.approx(12.938, abs=5e-4)
    assert difference_variance(s, 550) == pytest.approx(0.038, abs=1e-8)
    w, v_inf, r_inf = 7, 0.19, 0.9
    stable = v_inf * (w + 2 * sum((w - k) * r_inf**k for k in range(1, w)))
    assert window_sum_variance(s, 544, 550) == pytest.approx(stable, rel=1e-8)


@pytest.mark.parametrize(("a", "b"), [(1, 1), (1, 7), (3, 12), (20, 20), (5, 30)])
def test_window_sum_variance_is_the_sum_of_covariances(a: int, b: int) -> None:
    s = cgm_schedule(0.1, 30)
    brute = sum(covariance(s, i, j) for i in range(a, b + 1) for j in range(a, b + 1))
    assert window_sum_variance(s, a, b) == pytest.approx(brute, rel=1e-12)
    for i in range(max(a, 2), b + 1):
        expected = s.v[i] + s.v[i - 1] - 2 * covariance(s, i, i - 1)
        assert difference_variance(s, i) == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert covariance(s, i, i) == s.v[i]
        assert covariance(s, a, i) == covariance(s, i, a)


def test_covariance_matches_a_simulated_chain() -> None:
    """γ_i = η_i + r_i γ_{i−1}, η_i ~ N(0, V_i²): Monte Carlo within 5·√(2/M) (spec §5.5)."""
    users, l = 200_000, 8
    s = cgm_schedule(0.05, l)
    rng = np.random.default_rng(20210711)
    gamma = np.zeros((l + 1, users))
    for i in range(1, l + 1):
        gamma[i] = rng.normal(0.0, s.V[i], size=users) + s.r[i] * gamma[i - 1]
    tol = 5 * math.sqrt(2 / users)
    for i in (1, 2, 5, 8):
        assert np.var(gamma[i]) == pytest.approx(s.v[i], rel=tol)
    for i, j in ((2, 1), (5, 4), (8, 3)):
        emp = float(np.mean(gamma[i] * gamma[j]))
        assert emp == pytest.approx(covariance(s, i, j), abs=tol * s.v[j])
    total = gamma[2:8].sum(axis=0)
    assert np.var(total) == pytest.approx(window_sum_variance(s, 2, 7), rel=tol)


def test_covariance_rejects_steps_outside_the_schedule() -> None:
    s = cgm_schedule(0.05, 10)
    with pytest.raises(ValueError, match="j"):
        covariance(s, 1, 11)
    with pytest.raises(ValueError, match="i"):
        difference_variance(s, 1)
    with pytest.raises(ValueError, match="b"):
        window_sum_variance(s, 5, 4)
    with pytest.raises(ValueError, match="a"):
        window_sum_variance(s, 0, 4)


# -- T-CLIP (spec §4.6, erratum A2) -----------------------------------------------------------


def _clip_stream(stream: np.ndarray, bound: float) -> np.ndarray:
    """Apply ``diff_clip`` recursively along axis 0 (time) of a (l, n) or (l, n, d) array."""
    out = np.empty_like(stream, dtype=np.float64)
    out[0] = stream[0]
    for i in range(1, len(stream)):
        out[i] = diff_clip(stream[i], out[i - 1], bound)
    return out


def _literal_eq23(stream: np.ndarray, bound: float) -> np.ndarray:
    """The printed Eq. 23: clip around the *unclipped* previous value (scalars)."""
    out: np.ndarray = stream.astype(np.float64)
    out[1:] = stream[:-1] + np.clip(stream[1:] - stream[:-1], -bound, bound)
    return out


def _steps(clipped: np.ndarray) -> np.ndarray:
    diffs = np.diff(clipped, axis=0)
    return np.abs(diffs) if diffs.ndim == 2 else np.linalg.norm(diffs, axis=-1)


def test_staircase_is_clipped_recursively() -> None:
    stair = np.array([0.0, 1000.0, 2000.0, 3000.0])
    scalar = _clip_stream(stair[:, None], 500.0)  # one user, shape (n,) = (1,)
    assert scalar[:, 0].tolist() == [0.0, 500.0, 1000.0, 1500.0]
    column = _clip_stream(stair[:, None, None], 500.0)  # shape (n, 1)
    assert column[:, 0, 0].tolist() == [0.0, 500.0, 1000.0, 1500.0]
    assert np.all(_steps(scalar) <= 500.0 * (1 + 1e-12))
    literal = _literal_eq23(stair, 500.0)
    assert literal.tolist() == [0.0, 500.0, 1500.0, 2500.0]
    assert np.max(np.abs(np.diff(literal))) == 1000.0  # the printed form breaks the C-bound


def test_vector_staircase_is_clipped_recursively() -> None:
    direction = np.array([1.0, 2.0, 2.0]) / 3.0
    stair = np.array([0.0, 1000.0, 2000.0, 3000.0])[:, None, None] * direction  # (4, 1, 3)
    clipped = _clip_stream(stair, 500.0)
    assert np.all(_steps(clipped) <= 500.0 * (1 + 1e-12))
    assert np.allclose(clipped[:, 0], np.array([0.0, 500.0, 1000.0, 1500.0])[:, None] * direction)


def test_diff_clip_per_user_bounds() -> None:
    previous = np.array([0.0, 0.0, 10.0])
    current = np.array([5.0, -5.0, 0.0])
    out = diff_clip(current, previous, np.array([1.0, 10.0, 3.0]))
    assert out.tolist() == [1.0, -5.0, 7.0]
    vectors = diff_clip(np.array([[3.0, 4.0], [3.0, 4.0]]), np.zeros((2, 2)), np.array([1.0, 10.0]))
    assert np.allclose(vectors, [[0.6, 0.8], [3.0, 4.0]])


@settings(max_examples=60, deadline=None)
@given(
    d=st.integers(0, 3),
    users=st.integers(1, 5),
    bound=st.floats(0.1, 100.0),
    seed=st.integers(0, 2**32 - 1),
    spread=st.floats(1e-3, 100.0),
)
def test_diff_clip_enforces_the_bound(
    d: int, users: int, bound: float, seed: int, spread: float
) -> None:
    """d = 0 stands for scalars of shape (n,); the raw jumps range from tiny to ≫ C."""
    rng = np.random.default_rng(seed)
    shape = (12, users) if d == 0 else (12, users, d)
    raw = np.clip(np.cumsum(rng.normal(0.0, spread, size=shape), axis=0), -100.0, 100.0)
    clipped = _clip_stream(raw, bound)
    assert np.all(_steps(clipped) <= bound * (1 + 1e-12))
    for i in range(1, 12):
        jump = raw[i] - clipped[i - 1]
        size = np.abs(jump) if d == 0 else np.linalg.norm(jump, axis=-1)
        kept = size <= bound  # a step that obeys the bound is left untouched
        assert np.array_equal(clipped[i][kept], raw[i][kept])
        moved = clipped[i] - clipped[i - 1]  # x'_i lies on the segment towards x_i
        rest = raw[i] - clipped[i]
        moved_n = np.abs(moved) if d == 0 else np.linalg.norm(moved, axis=-1)
        rest_n = np.abs(rest) if d == 0 else np.linalg.norm(rest, axis=-1)
        assert np.allclose(moved_n + rest_n, size, rtol=1e-12, atol=1e-12)


def test_range_and_ball_clip() -> None:
    scalars = np.array([-3.0, 0.2, 7.0, math.inf])
    assert range_clip(scalars, 0.0, 1.0).tolist() == [0.0, 0.2, 1.0, 1.0]
    assert range_clip(scalars[:, None], 0.0, 1.0).shape == (4, 1)
    points = np.array([[0.0, 0.0], [0.5, 0.5], [6.0, 8.0]])
    center = np.array([0.0, 1.0])
    out = ball_clip(points, center, 2.0)
    assert np.all(np.linalg.norm(out - center, axis=1) <= 2.0 * (1 + 1e-12))
    assert np.array_equal(out[:2], points[:2])  # inside: unchanged
    assert np.allclose(out[2], center + 2.0 * np.array([6.0, 7.0]) / math.hypot(6.0, 7.0))
    assert ball_clip(np.array([3.0, 1.0]), center, 1.0).tolist() == [1.0, 1.0]


def test_clipping_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="NaN"):
        range_clip(np.array([math.nan]), 0.0, 1.0)
    with pytest.raises(ValueError, match="lo and hi"):
        range_clip(np.array([0.5]), 1.0, 1.0)
    with pytest.raises(ValueError, match="radius"):
        ball_clip(np.zeros((2, 2)), np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="center"):
        ball_clip(np.zeros((2, 2)), np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="x must be finite"):
        diff_clip(np.array([math.nan]), np.zeros(1), 1.0)
    with pytest.raises(ValueError, match="share a shape"):
        diff_clip(np.zeros((2, 3)), np.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError, match="bound"):
        diff_clip(np.zeros(2), np.zeros(2), -1.0)


# -- T-PRIV structural (spec §4.5) ------------------------------------------------------------


def _valid_streams(rng: np.random.Generator, c: float, l: int, users: int, d: int) -> np.ndarray:
    """Arbitrary raw streams mapped into the valid set by the user-side preprocessing: range clip
    to |x| ≤ 1/2 (diameter 1), then the recursive differential clip with radius C̃."""
    raw = rng.uniform(-1.5, 1.5, size=(l, users, d)) * rng.choice([0.05, 1.0], size=(l, users, 1))
    if d == 1:
        ranged = range_clip(raw, -0.5, 0.5)
    else:
        ranged = np.stack([ball_clip(raw[i], np.zeros(d), 0.5) for i in range(l)])
    return _clip_stream(ranged, c)


@pytest.mark.parametrize("c", [0.0, 0.01, 0.05, 0.1, 0.25, 0.49])
@pytest.mark.parametrize("d", [1, 3])
def test_fresh_term_sensitivity_is_at_most_v(c: float, d: int) -> None:
    l, users = 25, 400
    s = cgm_schedule(c, l)
    rng = np.random.default_rng(int(1000 * c) + d)
    x, y = _valid_streams(rng, c, l, users, d), _valid_streams(rng, c, l, users, d)
    assert np.all(np.linalg.norm(x[0] - y[0], axis=-1) <= s.V[1] + 1e-12)
    for i in range(1, l):  # step i + 1 of the schedule
        tx, ty = x[i] - s.r[i + 1] * x[i - 1], y[i] - s.r[i + 1] * y[i - 1]
        assert np.all(np.linalg.norm(tx - ty, axis=-1) <= s.V[i + 1] + 1e-12)


@pytest.mark.parametrize("c", [0.01, 0.05, 0.25])
def test_fresh_term_bound_is_attained(c: float) -> None:
    """The tight pair of spec §4.3: x = (1/2 − C, 1/2) against y = (−1/2 + C, −1/2)."""
    s = cgm_schedule(c, 10)
    for i in range(2, 11):
        tx = 0.5 - s.r[i] * (0.5 - c)
        ty = -0.5 - s.r[i] * (-0.5 + c)
        assert abs(tx - ty) == pytest.approx(s.V[i], rel=1e-13)


@pytest.mark.parametrize("gap", [1, 2, 4, 20])
def test_gap_aware_fresh_term_sensitivity(gap: int) -> None:
    c, users = 0.04, 2000
    rng = np.random.default_rng(gap)
    v_prev = cgm_schedule(c, 6).v[6]
    r, V, _ = schedule_step_after_gap(v_prev, c, gap)
    last = rng.uniform(-0.5, 0.5, size=(2, users))
    now = diff_clip(rng.uniform(-0.5, 0.5, size=(2, users)), last, gap * c)
    t = now - r * last
    assert np.all(np.abs(t[0] - t[1]) <= V + 1e-12)


# -- ledger values (spec §8.4) and t_max (spec §4.7) ------------------------------------------


@pytest.mark.parametrize(
    ("daily_eps", "mu_total", "total_eps"),
    [
        (0.25, 1.765235, 8.5809),
        (0.5, 3.335133, 19.1443),
        (1.0, 6.286356, 45.8085),
        (2.0, 11.762430, 118.4906),
    ],
)
def test_kaggle_per_day_ledger(daily_eps: float, mu_total: float, total_eps: float) -> None:
    mu = math.sqrt(550) * agm_mu(daily_eps, 1e-5)
    assert mu == pytest.approx(mu_total, abs=5e-7)
    assert GaussianDP(mu).epsilon(1e-5) == pytest.approx(total_eps, abs=5e-5)


def test_whole_stream_ledger_and_t_max() -> None:
    mu_star = agm_mu(1.0, 1e-5)
    sigma1 = agm_sigma(1.0, 1e-5, math.sqrt(10))
    assert sigma1 == pytest.approx(11.797293, abs=5e-7)
    assert math.sqrt(10) / sigma1 == pytest.approx(0.268051, abs=5e-7)
    assert math.sqrt(10) / sigma1 == pytest.approx(mu_star, rel=1e-14)
    assert GaussianDP(math.sqrt(10) / sigma1).epsilon(1e-5) == pytest.approx(1.0, abs=1e-5)
    eleventh = GaussianDP(math.sqrt(11) / sigma1).delta(1.0)
    assert eleventh == pytest.approx(2.138e-5, rel=5e-4)
    assert eleventh > 1e-5  # the 11th report is refused
    assert t_max(mu_star, sigma1) == 10


@pytest.mark.parametrize("eps", [0.25, 1.0, 2.0])
def test_t_max_recovers_the_calibrated_length(eps: float) -> None:
    mu_star = agm_mu(eps, 1e-5)
    for l in (1, 2, 7, 48, 365, 550, 1000):
        assert t_max(mu_star, agm_sigma(eps, 1e-5, math.sqrt(l))) == l


def test_t_max_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="mu_budget"):
        t_max(0.0, 1.0)
    with pytest.raises(ValueError, match="sigma1_norm"):
        t_max(1.0, math.inf)


def test_a_huge_vector_is_clipped_to_the_ball_boundary_not_the_centre() -> None:
    """Issue 27 item 13: ``‖x − c‖`` overflowed to inf, ``R/inf = 0`` and the vector landed on
    the centre (a user far out in a direction was reported as average). It now lands on the
    sphere in its own direction, also when ``x − c`` itself overflows."""
    from privstream.mechanisms.cgm_math import ball_clip, diff_clip

    center = np.array([1.0, -2.0])
    out = ball_clip(np.array([[1e200, 1e200], [-1.7e308, 0.0], [3.0, -2.0]]), center, 2.0)
    direction = np.array([1.0, 1.0]) / np.sqrt(2.0)
    np.testing.assert_allclose(out[0], center + 2.0 * direction, rtol=1e-12)
    np.testing.assert_allclose(out[1], center + np.array([-2.0, 0.0]), rtol=1e-12)
    np.testing.assert_array_equal(out[2], [3.0, -2.0])  # inside: unchanged
    assert np.all(np.isfinite(out))
    far = ball_clip(np.array([[1.7e308, 1.7e308]]), np.array([-1.7e308, -1.7e308]), 1.0)
    assert np.all(np.isfinite(far))  # x − c overflows: still a finite point of the ball
    moved = diff_clip(np.array([[1e300, -1e300]]), np.array([[0.0, 0.0]]), np.array([3.0]))
    np.testing.assert_allclose(moved, [[3.0 / np.sqrt(2.0), -3.0 / np.sqrt(2.0)]], rtol=1e-12)
