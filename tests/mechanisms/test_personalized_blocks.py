"""Building blocks of the personalized mechanisms (spec personalized-w-event §2, §10 items 1, 5).

* OBS (Alg. 1): Example 4.2 exactly (with erratum A11), the ratio switch points 0.888 and
  0.921, ties, candidates ≤ 0.
* SM (§2.2): inclusion rates, the per-class binomial sampler against per-user Bernoulli
  sampling, SM_d's Laplace variance ``2(Δ/θ)²``; DC (Alg. 3).

Statistical tolerances are four standard errors of the quantity tested, with fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import stats

from privstream.mechanisms.personalized import (
    SENSITIVITY,
    dissimilarity_calculation,
    inclusion_probabilities,
    laplace_error,
    obs,
    sampling_error,
    sm,
    sm_sample,
)

Z = 4.0
EXAMPLE_4_2 = [0.1, 0.4, 0.4, 0.1, 0.4, 0.4, 0.8, 0.8, 0.8, 0.4]

# -- OBS ------------------------------------------------------------------------------------------


def test_example_4_2_table() -> None:
    """Spec §2.4: err_s, err_dp and err of every candidate, the winner 0.4, and err(0.8) =
    27.733024 (the paper's 89.74 is an arithmetic slip, A11)."""
    budgets, sizes = [0.1, 0.4, 0.8], [2, 5, 3]
    rows = {
        0.1: (0.0, 200.0, 200.0),
        0.4: (2.808424, 12.5, 15.308424),
        0.8: (24.608024, 3.125, 27.733024),
    }
    for theta, (err_s, err_dp, err) in rows.items():
        assert sampling_error(theta, budgets, sizes) == pytest.approx(err_s, abs=5e-7)
        assert laplace_error(theta) == pytest.approx(err_dp, rel=1e-12)
        assert sampling_error(theta, budgets, sizes) + laplace_error(theta) == pytest.approx(
            err, abs=5e-7
        )
    choice = obs(EXAMPLE_4_2)
    assert choice is not None
    assert choice.theta == 0.4
    assert choice.error == pytest.approx(15.308424, abs=5e-7)
    by_class = obs(budgets, sizes)
    assert by_class == choice  # per-user and per-class inputs agree


def test_err_s_closed_form() -> None:
    """Eq. 1 by hand for θ = 0.8: p_k = (e^{ε_k} − 1)/(e^{0.8} − 1)."""
    p1, p4 = (math.expm1(e) / math.expm1(0.8) for e in (0.1, 0.4))
    expected = 2 * p1 * (1 - p1) + 5 * p4 * (1 - p4) + (2 * (1 - p1) + 5 * (1 - p4)) ** 2
    assert sampling_error(0.8, [0.1, 0.4, 0.8], [2, 5, 3]) == pytest.approx(expected, rel=1e-14)


def switch_point(n: int, low: float, high: float, steps: int = 1000) -> float:
    """Smallest ratio o on a grid of ``1/steps`` at which OBS, given ``round(n·o)`` users at
    ``high`` and the rest at ``low``, picks ``high``."""
    for k in range(steps + 1):
        users_high = round(n * k / steps)
        choice = obs([low, high], [n - users_high, users_high])
        assert choice is not None
        if choice.theta == high:
            return k / steps
    raise AssertionError("OBS never switched")


def test_ratio_switch_points() -> None:
    """Spec §6.5 claim 5 / §10 item 1 at n = 10,000: single-share budgets ε/240 with
    ε ∈ {0.6, 1.0} switch at ≈ 0.888; windows {40, 120} at ε = 0.6 (shares 0.6/80 and
    0.6/240) switch at ≈ 0.921."""
    assert switch_point(10_000, 0.6 / 240, 1.0 / 240) == 0.888
    assert switch_point(10_000, 0.6 / 240, 0.6 / 80) == 0.921
    # user by user, the switch happens at 8,871 users holding ε = 1.0
    assert obs([0.6 / 240, 1.0 / 240], [1130, 8870]) == obs([0.6 / 240], [1])
    high = obs([0.6 / 240, 1.0 / 240], [1129, 8871])
    assert high is not None and high.theta == 1.0 / 240


def literal_obs(budgets: list[float], sizes: list[int]) -> tuple[float, float] | None:
    """Alg. 1 line by line (O1–O9), one candidate at a time, strict ``<``."""
    merged: dict[float, int] = {}
    for b, n in zip(budgets, sizes, strict=True):
        merged[b] = merged.get(b, 0) + n
    values = sorted(merged)
    err_min, eps_opt = math.inf, None
    for theta in values:
        if theta <= 0:
            continue
        below = [(merged[v], math.expm1(v) / math.expm1(theta)) for v in values if 0 < v < theta]
        zero = sum(merged[v] for v in values if v <= 0)
        err_s = sum(n * p * (1 - p) for n, p in below)
        err_s += (sum(n * (1 - p) for n, p in below) + zero) ** 2
        e = err_s + 2 * SENSITIVITY**2 / theta**2
        if e < err_min:
            err_min, eps_opt = e, theta
    return None if eps_opt is None else (eps_opt, err_min)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.005, 0.01, 0.05, 0.1, 0.25, 0.4, 0.8, 1.0, 2.5]),
            st.integers(0, 5000),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_obs_matches_algorithm_1(pairs: list[tuple[float, int]]) -> None:
    """The vectorised OBS picks Alg. 1's candidate with Alg. 1's error."""
    budgets, sizes = [b for b, _ in pairs], [n for _, n in pairs]
    want = literal_obs(budgets, sizes)
    got = obs(budgets, sizes)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.theta == want[0]
    assert got.error == pytest.approx(want[1], rel=1e-9)


def test_ties_go_to_the_smaller_budget() -> None:
    """Equal budgets are one candidate, and near a tie the choice flips exactly where Alg. 1's
    strict ``<`` flips it.

    With ``n`` users at θ_a < θ_b (none at θ_b), err(θ_b) − err(θ_a) = err_s(θ_b) − (2/θ_a² −
    2/θ_b²) grows with ``n``; its real root ``n*`` is the tie. Just below it θ_b wins, just
    above it θ_a.
    """
    assert obs([0.5, 0.5, 0.5]) == obs([0.5])
    assert obs([0.5, 0.5], [2, 3]) == obs([0.5], [5])
    a, b = 0.5, 1.0
    gap = 2 / a**2 - 2 / b**2
    p = math.expm1(a) / math.expm1(b)
    qa, qb = (1 - p) ** 2, p * (1 - p)  # err_s(θ_b) = qb·n + qa·n²
    n_tie = (-qb + math.sqrt(qb * qb + 4 * qa * gap)) / (2 * qa)
    below, above = math.floor(n_tie), math.ceil(n_tie)
    assert below < n_tie < above
    lo, hi = obs([a, b], [below, 0]), obs([a, b], [above, 0])
    assert lo is not None and hi is not None
    assert (lo.theta, hi.theta) == (b, a)


def test_candidates_at_or_below_zero_are_ignored() -> None:
    assert obs([0.0, 0.0]) is None
    assert obs([-1.0, 0.0], [5, 5]) is None
    choice = obs([0.0, 0.3], [1000, 1])
    assert choice is not None and choice.theta == 0.3
    # a zero budget is never sampled, so it adds its whole class as bias: (1000·1)²
    assert choice.error == pytest.approx(1000**2 + laplace_error(0.3), rel=1e-12)


def test_obs_rejects_mismatched_input() -> None:
    with pytest.raises(ValueError, match="OBS"):
        obs([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="OBS"):
        obs([0.1, math.nan])


# -- SM -------------------------------------------------------------------------------------------


def test_inclusion_probabilities() -> None:
    theta = 0.8
    p = inclusion_probabilities([0.0, 0.1, 0.4, 0.8, 2.0, -1.0], theta)
    expected = [0.0, math.expm1(0.1) / math.expm1(0.8), math.expm1(0.4) / math.expm1(0.8), 1, 1, 0]
    assert p == pytest.approx(expected, rel=1e-14)
    # tiny per-slot budgets keep their relative precision
    tiny = inclusion_probabilities([1e-12], 2e-12)[0]
    assert tiny == pytest.approx(0.5, rel=1e-9)
    # huge budgets neither overflow nor become NaN
    assert np.all(np.isfinite(inclusion_probabilities([1e4, 2e4, 3e5], 1e5)))


def test_amplified_loss_equals_budget() -> None:
    """§2.2 lemma: with p = (e^ε − 1)/(e^θ − 1), ln(1 + p(e^θ − 1)) = ε for ε < θ."""
    theta = 0.9
    for eps in (1e-6, 0.01, 0.3, 0.89):
        p = float(inclusion_probabilities([eps], theta)[0])
        assert math.log1p(p * math.expm1(theta)) == pytest.approx(eps, rel=1e-9)


def test_sm_sample_inclusion_rate() -> None:
    """Empirical inclusion rate of each class within four binomial standard errors of p_c."""
    budgets = np.array([0.05, 0.2, 0.5, 1.0])
    theta = 0.5
    n = 20_000
    counts = np.array([[n, 0], [0, n], [n, 0], [0, n]], dtype=np.int64)
    rng = np.random.default_rng(2024)
    p = inclusion_probabilities(budgets, theta)
    trials = 50
    for c in range(4):
        only = np.zeros_like(counts)
        only[c] = counts[c]
        got = np.array([sm_sample(only, budgets, theta, rng).sum() for _ in range(trials)])
        rate = got.sum() / (n * trials)
        se = math.sqrt(p[c] * (1 - p[c]) / (n * trials))
        assert abs(rate - p[c]) <= Z * se + 1e-15, (c, rate, p[c])


def per_user_sample(
    classes: NDArray[np.int64],
    values: NDArray[np.int64],
    p: NDArray[np.float64],
    d: int,
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """Alg. S1 literally: one Bernoulli per user, then the histogram of the sample."""
    kept = rng.random(classes.shape[0]) < p[classes]
    return np.bincount(values[kept], minlength=d)


def test_binomial_sampler_matches_per_user_bernoulli() -> None:
    """§2.2 efficient implementation / §10 item 5: the per-class binomial sampler has the
    distribution of per-user Bernoulli sampling (chi-square homogeneity on the joint outcome
    of two bins, p > 0.001 with a fixed seed)."""
    d = 3
    classes = np.repeat(np.arange(3), [7, 5, 6])
    values = np.array([0, 1, 2, 0, 0, 1, 2, 2, 2, 1, 0, 1, 0, 1, 2, 0, 0, 1])
    counts = np.zeros((3, d), dtype=np.int64)
    np.add.at(counts, (classes, values), 1)
    budgets = np.array([0.1, 0.3, 0.6])
    theta = 0.6
    p = inclusion_probabilities(budgets, theta)
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(12)
    trials = 4000
    fast = np.array([sm_sample(counts, budgets, theta, rng_a) for _ in range(trials)])
    slow = np.array([per_user_sample(classes, values, p, d, rng_b) for _ in range(trials)])
    # means agree with the closed form Σ_c counts[c, j]·p_c
    expected = (counts * p[:, None]).sum(axis=0)
    var = (counts * (p * (1 - p))[:, None]).sum(axis=0)
    for got in (fast, slow):
        assert np.all(np.abs(got.mean(axis=0) - expected) <= Z * np.sqrt(var / trials))
    key_fast = fast[:, 0] * 100 + fast[:, 1]
    key_slow = slow[:, 0] * 100 + slow[:, 1]
    outcomes = np.union1d(key_fast, key_slow)
    table = np.array([[np.sum(k == o) for o in outcomes] for k in (key_fast, key_slow)])
    table = table[:, table.sum(axis=0) >= 10]  # pool rare outcomes out of the test
    assert table.shape[1] >= 5
    assert stats.chi2_contingency(table)[1] > 1e-3


def test_sm_laplace_variance() -> None:
    """SM_d: with every budget ≥ θ the sample is everybody and r − c is Lap(Δ/θ)^d, whose
    per-bin variance is 2(Δ/θ)²."""
    counts = np.array([[40, 7, 0, 3]], dtype=np.int64)
    theta = 0.25
    trials = 30_000
    sample_rng, noise_rng = np.random.default_rng(1), np.random.default_rng(2)
    noise = np.stack(
        [sm(counts, [0.5], theta, sample_rng, noise_rng) - counts[0] for _ in range(trials)]
    )
    b = SENSITIVITY / theta
    draws = noise.reshape(-1)
    assert abs(np.mean(draws**2) - 2 * b * b) <= Z * b * b * math.sqrt(20 / draws.size)
    assert abs(draws.mean()) <= Z * b * math.sqrt(2 / draws.size)


# -- DC -------------------------------------------------------------------------------------------


def test_dissimilarity_calculation() -> None:
    """Alg. 3: θ1 = OBS(𝛆^{(1)}); dis = mean_j |c̃ − r_l| + Lap(Δ/(d·θ1)). With every user
    at θ1 the sample is the population, so dis − dis* is Laplace of scale Δ/(d·θ1)."""
    counts = np.array([[10, 20, 30, 40], [5, 5, 5, 5]], dtype=np.int64)
    budgets = np.array([0.02, 0.02])
    sizes = counts.sum(axis=1)
    r_last = np.array([12.0, 20.0, 40.0, 30.0])
    dis_star = float(np.mean(np.abs(counts.sum(axis=0) - r_last)))
    trials = 20_000
    draws = np.empty(trials)
    sample_rng, noise_rng = np.random.default_rng(3), np.random.default_rng(4)
    for k in range(trials):
        dis, theta = dissimilarity_calculation(
            counts, budgets, sizes, r_last, sample_rng, noise_rng
        )
        assert theta == 0.02
        draws[k] = dis - dis_star
    b = SENSITIVITY / (4 * 0.02)
    assert abs(np.mean(draws**2) - 2 * b * b) <= Z * b * b * math.sqrt(20 / trials)
    assert abs(draws.mean()) <= Z * b * math.sqrt(2 / trials)


def test_dc_uses_sampled_counts_without_reweighting() -> None:
    """A7: a class below θ1 contributes its *sampled* count, biased low, not re-weighted."""
    counts = np.array([[0, 1000], [0, 0]], dtype=np.int64)
    budgets = np.array([0.001, 0.5])
    sizes = np.array([1000, 10])
    p = float(inclusion_probabilities([0.001], 0.5)[0])
    assert obs(budgets, sizes) is not None
    got = []
    sample_rng, noise_rng = np.random.default_rng(5), np.random.default_rng(6)
    for _ in range(2000):
        dis, theta = dissimilarity_calculation(
            counts, budgets, sizes, np.zeros(2), sample_rng, noise_rng
        )
        got.append(dis)
    assert theta == 0.5
    # E[dis] = (1/2)·1000·p; sd per draw from the binomial (halved) and the Laplace noise
    mean_expected = 0.5 * 1000 * p
    sd = math.sqrt(0.25 * 1000 * p * (1 - p) + 2 * (1 / (2 * 0.5)) ** 2)
    assert abs(np.mean(got) - mean_expected) <= Z * sd / math.sqrt(2000)
