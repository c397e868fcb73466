"""Frequency oracles GRR, OUE, OLH and the Ada choice (spec ldp-ids §2.1–§2.6, §7 items 1–2).

Statistical tests use fixed seeds. Their tolerances come from the closed forms: per-coordinate
standard errors from Eq. 1 (GRR) and Eq. 2 (OUE), and the standard deviation of an empirical
d-averaged variance from the exact covariance matrix of the estimate (normal approximation:
``Var(Σ_k S²_k) = 2‖Σ‖²_F/(R−1)`` over ``R`` repetitions).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import stats

from privstream.mechanisms.oracles import GRR, OLH, OUE, FrequencyOracle, ada_threshold
from privstream.mechanisms.tasks import FrequencyTask

Z = 4.0  # standard errors allowed for a single statistical comparison


# -- closed forms written out from the spec, independently of the package -------------------


def eq1_grr(eps: float, m: int, d: int, c: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-coordinate GRR variance, spec §2.1 Eq. 1."""
    e = math.exp(eps)
    return (d - 2 + e) / (m * (e - 1) ** 2) + c * (d - 2) / (m * (e - 1))


def eq2_oue(eps: float, m: int, c: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-coordinate OUE variance, spec §2.2 Eq. 2."""
    e = math.exp(eps)
    return 4 * e / (m * (e - 1) ** 2) + c / m


def olh_exact(eps: float, m: int, g: int, c: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-coordinate OLH variance: a report supports ω_k w.p. p if v = ω_k, else 1/g (§2.6)."""
    e = math.exp(eps)
    p, q = e / (e + g - 1), 1.0 / g
    return (c * p * (1 - p) + (1 - c) * q * (1 - q)) / (m * (p - q) ** 2)


def estimate_cov(
    oracle: FrequencyOracle, counts: NDArray[np.int64], eps: float
) -> NDArray[np.float64]:
    """Exact covariance matrix of the GRR/OUE estimate of users with value counts ``counts``."""
    d, m = oracle.d, int(counts.sum())
    p, q = oracle.pq(eps)
    cov = np.zeros((d, d))
    for v in range(d):
        pi = np.full(d, q)
        pi[v] = p
        if isinstance(oracle, GRR):  # one categorical report per user
            cov += counts[v] * (np.diag(pi) - np.outer(pi, pi))
        else:  # independent bits per user
            cov += counts[v] * np.diag(pi * (1 - pi))
    return cov / (m * (p - q)) ** 2


def averaged_variance_sd(cov: NDArray[np.float64], reps: int) -> float:
    """Standard deviation of ``mean_k S²_k`` over ``reps`` repetitions (normal approximation)."""
    return math.sqrt(2 * float(np.sum(cov**2)) / (reps - 1)) / int(cov.shape[0])


def values_from_counts(counts: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.repeat(np.arange(counts.shape[0]), counts)


# -- §2.4 test vectors and §2.3 Ada ------------------------------------------------------------

TABLE_2_4 = [
    # ε, m, d, V_GRR, V_OUE, Ada
    (1, 10_000, 2, 9.206736e-05, 4.182694e-04, "GRR"),
    (1, 10_000, 5, 2.285950e-04, 3.882694e-04, "GRR"),
    (0.05, 200_000, 2, 1.999583e-03, 8.000834e-03, "GRR"),
    (0.025, 200_000, 2, 7.999583e-03, 3.200083e-02, "GRR"),
    (1, 13_345, 77, 2.014972e-03, 2.769338e-04, "OUE"),
    (0.05, 1_023_154, 117, 4.316704e-02, 1.563475e-03, "OUE"),
]


@pytest.mark.parametrize(("eps", "m", "d", "v_grr", "v_oue", "ada"), TABLE_2_4)
def test_averaged_variance_vectors(
    eps: float, m: int, d: int, v_grr: float, v_oue: float, ada: str
) -> None:
    assert GRR(d).variance(eps, m) == pytest.approx(v_grr, rel=1e-6)
    assert OUE(d).variance(eps, m) == pytest.approx(v_oue, rel=1e-6)
    task = FrequencyTask(d)
    assert task.select(eps).name == ada
    assert task.variance(eps, m) == pytest.approx(v_grr if ada == "GRR" else v_oue, rel=1e-6)


def test_averaged_variance_is_mean_of_eq1_eq2() -> None:
    c = np.array([0.5, 0.2, 0.2, 0.1, 0.0])
    for eps in (0.1, 1.0, 3.0):
        assert GRR(5).variance(eps, 777) == pytest.approx(
            float(np.mean(eq1_grr(eps, 777, 5, c))), rel=1e-12
        )
        assert OUE(5).variance(eps, 777) == pytest.approx(
            float(np.mean(eq2_oue(eps, 777, c))), rel=1e-12
        )


@pytest.mark.parametrize("oracle", [GRR(3), OUE(3), OLH(3)], ids=repr)
def test_variance_of_no_reports_is_infinite(oracle: FrequencyOracle) -> None:
    assert oracle.variance(1.0, 0) == math.inf
    assert FrequencyTask(3).variance(1.0, 0) == math.inf


@pytest.mark.parametrize("eps", [1e-17, 1e-60])
def test_variance_finite_for_tiny_budget(eps: float) -> None:
    """V(ε, m) is defined for every ε > 0 (§2.4). ``exp(ε) − 1`` underflows to 0 below ~1.1e-16;
    the closed forms must still give the (huge) finite value, ≈ (d − 1)/(m ε²) for GRR."""
    for oracle, approx in ((GRR(2), 1 / (100 * eps**2)), (OUE(2), 4 / (100 * eps**2))):
        v = oracle.variance(eps, 100)
        assert math.isfinite(v)
        assert v == pytest.approx(approx, rel=1e-6)


ADA_TABLE = [
    (0.025, 5.076),
    (0.05, 5.154),
    (0.1, 5.316),
    (0.25, 5.852),
    (0.5, 6.946),
    (1, 10.155),
    (2, 24.167),
    (3, 62.257),
]


@pytest.mark.parametrize(("eps", "d_star"), ADA_TABLE)
def test_ada_threshold_table(eps: float, d_star: float) -> None:
    assert ada_threshold(eps) == pytest.approx(d_star, abs=5e-4)


@settings(max_examples=200, deadline=None)
@given(eps=st.floats(min_value=1e-12, max_value=50.0))
def test_ada_small_domains_always_grr(eps: float) -> None:
    assert FrequencyTask(2).select(eps).name == "GRR"
    assert FrequencyTask(5).select(eps).name == "GRR"


PAPER_EPS = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


@pytest.mark.parametrize("d", [77, 117, 118])
def test_ada_large_domains_use_oue(d: int) -> None:
    # §2.3: d = 77 uses OUE for ε < 3.22, d = 117/118 for ε < 3.65 — every ε the paper uses.
    for eps in PAPER_EPS:
        assert FrequencyTask(d).select(eps).name == "OUE"
    # The exact switch is where d = 3e^ε + 2, i.e. ε* = ln((d − 2)/3): 3.2189 (77), 3.6463 (117),
    # 3.6550 (118). (The spec's "3.22"/"3.65" are these values rounded.)
    switch = math.log((d - 2) / 3)
    assert FrequencyTask(d).select(switch - 1e-9).name == "OUE"
    assert FrequencyTask(d).select(switch + 1e-9).name == "GRR"
    assert switch == pytest.approx({77: 3.2189, 117: 3.6463, 118: 3.6550}[d], abs=1e-4)


def test_fixed_oracle_choice_ignores_ada() -> None:
    for eps in (0.1, 1.0, 5.0):
        assert FrequencyTask(77, oracle="grr").select(eps).name == "GRR"
        assert FrequencyTask(2, oracle="oue").select(eps).name == "OUE"
        assert FrequencyTask(2, oracle="olh").select(eps).name == "OLH"


def test_probabilities_and_bits() -> None:
    e = math.exp(1.3)
    assert GRR(7).pq(1.3) == pytest.approx((e / (e + 6), 1 / (e + 6)), rel=1e-15)
    assert OUE(7).pq(1.3) == pytest.approx((0.5, 1 / (e + 1)), rel=1e-15)
    assert OLH(7).g(1.3) == round(e + 1) == 5
    assert OLH(7).pq(1.3) == pytest.approx((e / (e + 4), 1 / 5), rel=1e-15)
    for d, bits in ((2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (77, 7), (117, 7), (118, 7)):
        assert GRR(d).report_bits(1.0) == bits
        assert OUE(d).report_bits(1.0) == d


@pytest.mark.parametrize("eps", [0.0, -1.0, math.inf, math.nan])
def test_invalid_report_budget_rejected(eps: float) -> None:
    for oracle in (GRR(3), OUE(3), OLH(3)):
        with pytest.raises(ValueError, match="ε"):
            oracle.pq(eps)


def test_domain_of_one_value_rejected() -> None:
    with pytest.raises(ValueError, match="d"):
        GRR(1)
    with pytest.raises(ValueError, match="d"):
        FrequencyTask(1)


# -- Monte Carlo unbiasedness on the per-user path (>= 1e5 reports) ------------------------------

M_BIG = 100_000
COUNTS_5 = np.array([40_000, 30_000, 15_000, 10_000, 5_000])


@pytest.mark.parametrize("eps", [0.25, 1.0, 3.0])
def test_grr_unbiased_per_user(eps: float) -> None:
    rng = np.random.default_rng(101)
    oracle, c = GRR(5), COUNTS_5 / M_BIG
    values = rng.permutation(values_from_counts(COUNTS_5))
    reports = oracle.perturb(values, eps, rng)
    assert reports.shape == (M_BIG,) and reports.min() >= 0 and reports.max() < 5
    est = oracle.estimate(oracle.support(reports, eps), eps, M_BIG)
    se = np.sqrt(eq1_grr(eps, M_BIG, 5, c))
    assert np.all(np.abs(est - c) < Z * se), (est - c) / se


@pytest.mark.parametrize("eps", [0.25, 1.0, 3.0])
def test_oue_unbiased_per_user(eps: float) -> None:
    rng = np.random.default_rng(102)
    oracle = OUE(20)
    counts = np.bincount(np.minimum(rng.geometric(0.2, size=M_BIG) - 1, 19), minlength=20)
    c = counts / M_BIG
    values = rng.permutation(values_from_counts(counts))
    reports = oracle.perturb(values, eps, rng)
    assert reports.shape == (M_BIG, 20) and reports.dtype == np.bool_
    est = oracle.estimate(oracle.support(reports, eps), eps, M_BIG)
    se = np.sqrt(eq2_oue(eps, M_BIG, c))
    assert np.all(np.abs(est - c) < Z * se), (est - c) / se


@pytest.mark.parametrize("eps", [0.5, math.log(3), 2.0])
def test_olh_unbiased_per_user(eps: float) -> None:
    rng = np.random.default_rng(103)
    oracle = OLH(6)
    counts = np.array([35_000, 25_000, 20_000, 10_000, 10_000, 0])
    c = counts / M_BIG
    reports = oracle.perturb(rng.permutation(values_from_counts(counts)), eps, rng)
    est = oracle.estimate(oracle.support(reports, eps), eps, M_BIG)
    se = np.sqrt(olh_exact(eps, M_BIG, oracle.g(eps), c))
    assert np.all(np.abs(est - c) < Z * se), (est - c) / se
    # §2.6's approximate variance is the c = 0 coordinate of the exact one to within a few %.
    assert oracle.variance(eps, M_BIG) == pytest.approx(float(se[-1] ** 2), rel=0.05)


def test_estimate_of_no_reports_is_zero() -> None:
    for oracle in (GRR(4), OUE(4), OLH(4)):
        assert np.array_equal(oracle.estimate(np.zeros(4), 1.0, 0), np.zeros(4))


# -- empirical d-averaged variance against V(ε, m) (within 5 %) ----------------------------------

COUNTS_GRR = np.array([400, 300, 150, 100, 50])  # m = 1000, d = 5
COUNTS_OUE = np.bincount(np.arange(1000) % 13, minlength=20)  # m = 1000, d = 20, 7 values absent


def check_averaged_variance(
    oracle: FrequencyOracle, counts: NDArray[np.int64], eps: float, estimates: NDArray[np.float64]
) -> None:
    reps, m = estimates.shape[0], int(counts.sum())
    cov = estimate_cov(oracle, counts, eps)
    v = oracle.variance(eps, m)
    c = counts / m
    per_coord = eq1_grr(eps, m, oracle.d, c) if isinstance(oracle, GRR) else eq2_oue(eps, m, c)
    assert np.allclose(np.diag(cov), per_coord, rtol=1e-12)  # the test's own algebra
    assert float(np.trace(cov)) / oracle.d == pytest.approx(v, rel=1e-12)
    sd = averaged_variance_sd(cov, reps)
    assert Z * sd < 0.05 * v, "too few repetitions for a 5 % comparison"
    empirical = float(np.mean(np.var(estimates, axis=0, ddof=1)))
    assert abs(empirical - v) < Z * sd, (empirical / v - 1, sd / v)
    assert abs(empirical / v - 1) < 0.05
    # Unbiased on average over the repetitions as well.
    se = np.sqrt(np.diag(cov) / reps)
    assert np.all(np.abs(estimates.mean(axis=0) - c) < Z * se)


@pytest.mark.parametrize(
    ("oracle", "counts", "eps"),
    [(GRR(5), COUNTS_GRR, 0.5), (GRR(5), COUNTS_GRR, 2.0), (OUE(20), COUNTS_OUE, 1.0)],
    ids=["GRR-eps0.5", "GRR-eps2", "OUE-eps1"],
)
def test_averaged_variance_fast_path(
    oracle: FrequencyOracle, counts: NDArray[np.int64], eps: float
) -> None:
    rng = np.random.default_rng(201)
    m, reps = int(counts.sum()), 12_000
    estimates = np.empty((reps, oracle.d))
    for i in range(reps):
        support = oracle.sample_support(counts, eps, rng)
        assert support is not None
        estimates[i] = oracle.estimate(support, eps, m)
    check_averaged_variance(oracle, counts, eps, estimates)


@pytest.mark.parametrize(
    ("oracle", "counts", "eps", "reps"),
    [(GRR(5), COUNTS_GRR, 1.0, 5000), (OUE(20), COUNTS_OUE // 2, 1.0, 2000)],
    ids=["GRR", "OUE"],
)
def test_averaged_variance_per_user_path(
    oracle: FrequencyOracle, counts: NDArray[np.int64], eps: float, reps: int
) -> None:
    rng = np.random.default_rng(202)
    values = values_from_counts(counts)
    m = values.shape[0]
    estimates = np.empty((reps, oracle.d))
    for i in range(reps):
        estimates[i] = oracle.estimate(
            oracle.support(oracle.perturb(values, eps, rng), eps), eps, m
        )
    check_averaged_variance(oracle, counts, eps, estimates)


def test_olh_averaged_variance_per_user_path() -> None:
    """At ε = ln 3, g = e^ε + 1 = 4 exactly, so OLH's per-coordinate variance is exactly
    ``4e^ε/(m(e^ε−1)²) + c[k]/m``: §2.6's approximation plus the c-term it leaves out."""
    rng = np.random.default_rng(203)
    oracle, eps, reps = OLH(8), math.log(3), 8000
    values = np.arange(100) % 8  # 13 users hold each of 0..3, 12 each of 4..7
    m = values.shape[0]
    c = np.bincount(values, minlength=8) / m
    assert oracle.g(eps) == 4
    per_coord = olh_exact(eps, m, 4, c)
    assert oracle.variance(eps, m) + 1 / (8 * m) == pytest.approx(
        float(per_coord.mean()), rel=1e-12
    )
    estimates = np.empty((reps, 8))
    for i in range(reps):
        estimates[i] = oracle.estimate(
            oracle.support(oracle.perturb(values, eps, rng), eps), eps, m
        )
    v = float(per_coord.mean())
    sd = math.sqrt(2 / (reps - 1)) * v  # bound: holds whatever the correlation between coordinates
    empirical = float(np.mean(np.var(estimates, axis=0, ddof=1)))
    assert abs(empirical - v) < Z * sd
    assert np.all(np.abs(estimates.mean(axis=0) - c) < Z * np.sqrt(per_coord / reps))


def test_olh_has_no_fast_path() -> None:
    assert OLH(4).sample_support(np.array([1, 2, 3, 4]), 1.0, np.random.default_rng(0)) is None


# -- the aggregate fast path and the per-user path have the same distribution -------------------


def homogeneity_pvalue(
    a: NDArray[np.float64], b: NDArray[np.float64], min_count: int = 20
) -> float:
    """Chi-square test that two samples of a discrete variable share one distribution; adjacent
    values are merged until every merged bin holds ``min_count`` pooled observations."""
    values = np.union1d(a, b)
    ca = np.array([np.count_nonzero(a == v) for v in values])
    cb = np.array([np.count_nonzero(b == v) for v in values])
    rows: list[list[int]] = []
    acc = [0, 0]
    for x, y in zip(ca, cb, strict=True):
        acc = [acc[0] + int(x), acc[1] + int(y)]
        if sum(acc) >= min_count:
            rows.append(acc)
            acc = [0, 0]
    if rows:
        rows[-1] = [rows[-1][0] + acc[0], rows[-1][1] + acc[1]]
    assert len(rows) >= 5, "degenerate comparison"
    return float(stats.chi2_contingency(np.array(rows).T)[1])


@pytest.mark.parametrize(
    ("oracle", "counts"),
    [
        (GRR(5), np.array([20, 15, 8, 5, 2])),
        (OUE(20), np.bincount(np.arange(50) % 13, minlength=20)),
    ],
    ids=["GRR-d5", "OUE-d20"],
)
def test_fast_path_matches_per_user_distribution(
    oracle: FrequencyOracle, counts: NDArray[np.int64]
) -> None:
    rng = np.random.default_rng(301)
    eps, reps = 1.0, 10_000
    values = values_from_counts(counts)
    fast = np.array([oracle.sample_support(counts, eps, rng) for _ in range(reps)])
    slow = np.array([oracle.support(oracle.perturb(values, eps, rng), eps) for _ in range(reps)])
    m = values.shape[0]
    if isinstance(oracle, GRR):  # one report per user: the supports add up to m on both paths
        assert np.all(fast.sum(axis=1) == m)
        assert np.all(slow.sum(axis=1) == m)
    p, q = oracle.pq(eps)
    mean_support = counts * p + (m - counts) * q
    var_support = np.diag(estimate_cov(oracle, counts, eps)) * (m * (p - q)) ** 2
    for sample in (fast, slow):
        se = np.sqrt(var_support / reps)
        assert np.all(np.abs(sample.mean(axis=0) - mean_support) < Z * se)
    # Same distribution, coordinate by coordinate (values with and without users) and in total.
    for k in (0, 1, oracle.d - 1):
        assert homogeneity_pvalue(fast[:, k], slow[:, k]) > 1e-3
    if isinstance(oracle, OUE):
        assert homogeneity_pvalue(fast.sum(axis=1), slow.sum(axis=1)) > 1e-3
    # The d-averaged variances of the two paths agree (two independent estimates of one value).
    cov = estimate_cov(oracle, counts, eps)
    rel_sd = averaged_variance_sd(cov, reps) / (float(np.trace(cov)) / oracle.d)
    ratio = float(np.var(fast, axis=0, ddof=1).mean() / np.var(slow, axis=0, ddof=1).mean())
    assert abs(ratio - 1) < Z * math.sqrt(2) * rel_sd
