"""The exact noise samplers (spec personalized-w-event §2.1, §9.6; Canonne, Kamath, Steinke 2020).

Every statistical check uses a fixed seed, so it passes or fails deterministically; the
thresholds are set so that a correct sampler would fail them rarely for a *random* seed:

* binomial z-tests (``bernoulli_exp``): ``|k − Np| ≤ 4·sqrt(Np(1−p))`` (two-sided normal tail
  ``6·10⁻⁵``);
* one-sample chi-square goodness of fit against the exact PMF, ``p > 1e-4``. Bins are the integers
  with expected count ``≥ 5`` (a contiguous window around 0, both PMFs being unimodal and
  symmetric) plus the two pooled tails. Discrete Laplace ``DLap(b)``:
  ``P(x) = (1−e^{−1/b})/(1+e^{−1/b})·e^{−|x|/b} = tanh(1/(2b))·e^{−|x|/b}``; discrete Gaussian:
  ``P(x) = e^{−x²/(2σ²)} / Σ_y e^{−y²/(2σ²)}``;
* moments within 4 standard errors: the sample mean of ``N`` draws has standard error
  ``sqrt(Var/N)``, the sample mean of ``X²`` has ``sqrt((E[X⁴] − Var²)/N)`` (``E X = 0``), with
  ``Var`` and ``E[X⁴]`` summed from the exact PMF;
* two-sample chi-square against OpenDP 0.16 (``chi2_contingency`` on the same bins, chosen from
  the PMF so that every expected cell is ``≥ 10``), ``p > 1e-6``. OpenDP's own randomness cannot
  be seeded, so these tests are random: under the null the p-value is (approximately) uniform,
  so each fails falsely with probability about ``10⁻⁶`` per run.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats

import privstream.mechanisms.noise as noise_module
from privstream.mechanisms.noise import (
    MAX_NUMERATOR,
    MAX_SCALE,
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_mechanism,
    discrete_laplace_variance,
    laplace_scale,
    laplace_variance,
    public_scale,
)
from privstream.mechanisms.seeding import derive_rng

Z = 4.0
N = 200_000
P_MIN = 1e-4  # one-sample chi-square with a fixed seed
P_MIN_OPENDP = 1e-6  # two-sample chi-square against unseedable OpenDP: false-failure rate ~1e-6
N_OPENDP = 40_000
KEY = 0x5EED_0F_C0FFEE_2020_CA17_0BAD_F00D

NDArray = np.ndarray[Any, Any]


def keyed_rng(key: int = KEY) -> np.random.Generator:
    """The production stream: keyed AES-CTR (``derive_rng``), here with a fixed test key."""
    return derive_rng(key.to_bytes(16, "little"), "noise-tests", 0, "draws")


def dlap_pmf(b: float) -> Callable[[NDArray], NDArray]:
    def pmf(x: NDArray) -> NDArray:
        return math.tanh(0.5 / b) * np.exp(-np.abs(x) / b)

    return pmf


def dgauss_pmf(sigma2: float) -> Callable[[NDArray], NDArray]:
    y = np.arange(-math.ceil(40 * math.sqrt(sigma2)) - 10, math.ceil(40 * math.sqrt(sigma2)) + 11)
    total = float(np.sum(np.exp(-(y * y) / (2.0 * sigma2))))

    def pmf(x: NDArray) -> NDArray:
        return np.exp(-(x.astype(np.float64) ** 2) / (2.0 * sigma2)) / total

    return pmf


def bins_for(pmf: Callable[[NDArray], NDArray], n: int, min_expected: float) -> NDArray:
    """The contiguous window ``[-h, h]`` of integers whose expected count is ``≥ min_expected``."""
    h = 0
    while n * float(pmf(np.array([h + 1]))[0]) >= min_expected:
        h += 1
    return np.arange(-h, h + 1)


def binned(x: NDArray, window: NDArray) -> NDArray:
    """Counts per integer of ``window`` plus the pooled lower and upper tails."""
    lo, hi = int(window[0]), int(window[-1])
    inner = np.bincount(np.clip(x, lo, hi) - lo, minlength=hi - lo + 1)
    inner[0] -= np.count_nonzero(x < lo)
    inner[-1] -= np.count_nonzero(x > hi)
    return np.concatenate([[np.count_nonzero(x < lo)], inner, [np.count_nonzero(x > hi)]])


def expected(pmf: Callable[[NDArray], NDArray], window: NDArray, n: int) -> NDArray:
    inner = pmf(window)
    tail = (1.0 - float(np.sum(inner))) / 2.0  # both PMFs are symmetric
    return n * np.concatenate([[tail], inner, [tail]])


def chi2_gof(x: NDArray, pmf: Callable[[NDArray], NDArray]) -> float:
    window = bins_for(pmf, x.size, 5.0)
    exp = expected(pmf, window, x.size)
    return float(stats.chisquare(binned(x, window), exp * (x.size / exp.sum())).pvalue)


def merged_edges(pmf: Callable[[NDArray], NDArray], bins: int, half_width: int) -> NDArray:
    """Upper edges of contiguous integer bins over ``[-half_width, half_width]`` holding at
    least ``1/bins`` of the probability each (the last one takes the remainder)."""
    x = np.arange(-half_width, half_width + 1)
    cdf = np.cumsum(pmf(x))
    edges = np.unique(np.searchsorted(cdf, np.arange(1, bins) / bins) + x[0])
    return edges[edges < half_width]


def chi2_two_sample(
    x: NDArray, y: NDArray, pmf: Callable[[NDArray], NDArray], half_width: int
) -> float:
    """Two-sample chi-square on 40 bins of (nearly) equal probability under ``pmf``; the
    expected cells are ``≥ N/50`` (far above 5), and the coarse bins keep the power that
    per-integer bins would spread over hundreds of degrees of freedom."""
    edges = merged_edges(pmf, 40, half_width)
    table = np.stack(
        [np.bincount(np.searchsorted(edges, z), minlength=edges.size + 1) for z in (x, y)]
    )
    return float(stats.chi2_contingency(table).pvalue)


def moments(pmf: Callable[[NDArray], NDArray], half_width: int) -> tuple[float, float]:
    """``(E[X²], E[X⁴])`` summed from the PMF over ``|x| ≤ half_width``."""
    x = np.arange(-half_width, half_width + 1).astype(np.float64)
    p = pmf(x)
    return float(np.sum(x**2 * p)), float(np.sum(x**4 * p))


def assert_moments(x: NDArray, var: float, fourth: float) -> None:
    n = x.size
    xf = x.astype(np.float64)
    assert abs(xf.mean()) <= Z * math.sqrt(var / n)
    assert abs(np.mean(xf * xf) - var) <= Z * math.sqrt((fourth - var * var) / n)


# --- the error model the papers use (unchanged) ---------------------------------------------


def test_scale_is_sensitivity_over_epsilon() -> None:
    assert laplace_scale(1.0, 0.5) == 2.0
    assert laplace_scale(0.5, 0.25) == 2.0
    assert laplace_variance(2.0) == 8.0  # 2b²
    # Eq. 2 of the paper: err_dp(ε) = 2/ε² with Δ = 1
    assert laplace_variance(laplace_scale(1.0, 0.1)) == pytest.approx(200.0, rel=1e-15)


@pytest.mark.parametrize(
    ("sensitivity", "epsilon"),
    [(0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (1.0, 0.0), (1.0, -0.5), (1.0, math.nan)],
)
def test_scale_rejects_bad_arguments(sensitivity: float, epsilon: float) -> None:
    with pytest.raises(ValueError, match=r"sensitivity|epsilon"):
        laplace_scale(sensitivity, epsilon)


FLOAT_SAMPLERS = frozenset(
    {"laplace", "normal", "standard_normal", "exponential", "standard_exponential", "gumbel",
     "logistic"}
)  # fmt: skip


def float_sampler_calls(source: str) -> list[str]:
    """The calls ``x.laplace(...)`` & co. in ``source``: NumPy/random's float noise samplers."""
    return [
        f"{node.func.attr} at line {node.lineno}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in FLOAT_SAMPLERS
    ]


def test_no_mechanism_draws_float_noise() -> None:
    """The floating-point attack (Mironov 2012) needs noise drawn from a float distribution:
    every noise draw goes through the exact integer samplers above, so no module of the engine-
    free core may call a float Laplace (or Gaussian, or exponential) sampler."""
    assert float_sampler_calls("noise = rng.laplace(0.0, b, d)") == ["laplace at line 1"]
    for path in sorted(Path(noise_module.__file__).parent.glob("*.py")):
        found = float_sampler_calls(path.read_text())
        allowed = DATA_INDEPENDENT.get(path.name, ())
        assert [call for call in found if call.split(" at ")[0] not in allowed] == [], path.name


DATA_INDEPENDENT: dict[str, tuple[str, ...]] = {
    "dpi_rba.py": ("exponential",),
}
"""Float draws that touch no data: DPI's Algorithm 3 picks a public series element with an
Exp(Λ) draw from its own randomness; the element's ε_t is published with every release, so
inverting the float draw reveals nothing that is not already public (spec dpi §1.6)."""


def test_module_is_engine_free() -> None:
    tree = ast.parse(Path(noise_module.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    roots = {name.split(".")[0] for name in imported}
    assert roots <= {"__future__", "math", "fractions", "typing", "numpy"}, roots


# --- public_scale ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1 / 0.6, 0.1, 3.3, 1e-9, 200.0, 1e4, math.pi * 1e6])
@pytest.mark.parametrize("bits", [0, 8, 20])
def test_public_scale_is_the_smallest_dyadic_above(scale: float, bits: int) -> None:
    r = public_scale(scale, denominator_bits=bits)
    exact = Fraction(scale)
    step = Fraction(1, 2**bits)
    assert (2**bits) % r.denominator == 0
    assert exact <= r < exact + step


@pytest.mark.parametrize(
    ("scale", "bits"),
    [
        (Fraction(3, 8), 20),
        (Fraction(3, 8), 3),
        (Fraction(5, 2**20), 20),
        (Fraction(200), 0),
        (Fraction(2**32), 20),
        (Fraction(2**40), 12),
        (7, 20),
        (0.75, 2),
    ],
)
def test_public_scale_keeps_dyadic_input(scale: float | Fraction, bits: int) -> None:
    assert public_scale(scale, denominator_bits=bits) == Fraction(scale)


def test_public_scale_rounds_a_finer_dyadic_up() -> None:
    assert public_scale(Fraction(3, 8), denominator_bits=2) == Fraction(1, 2)
    assert public_scale(Fraction(2**20 + 1, 2**21), denominator_bits=20) == Fraction(
        2**19 + 1, 2**20
    )


@pytest.mark.parametrize(
    ("scale", "match"),
    [
        (0.0, "positive"),
        (-1.0, "positive"),
        (Fraction(-1, 3), "positive"),
        (math.inf, "positive"),
        (math.nan, "positive"),
        (True, "positive"),
        (2.0**40 + 1, str(MAX_SCALE)),
        (Fraction(2**41), str(MAX_SCALE)),
        (2.0**33, str(MAX_NUMERATOR)),  # numerator 2⁵³ over 2²⁰
    ],
)
def test_public_scale_rejects(scale: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        public_scale(scale)


@pytest.mark.parametrize("bits", [-1, 53, True, 2.0])
def test_public_scale_rejects_bad_denominator_bits(bits: Any) -> None:
    with pytest.raises(ValueError, match="denominator_bits"):
        public_scale(1.0, denominator_bits=bits)


def test_public_scale_numerator_limit_follows_the_bits() -> None:
    assert public_scale(2.0**33, denominator_bits=19) == Fraction(2**33)
    assert public_scale(float(MAX_SCALE), denominator_bits=12) == MAX_SCALE
    with pytest.raises(ValueError, match=str(MAX_NUMERATOR)):
        public_scale(float(MAX_SCALE), denominator_bits=13)


# --- bernoulli_exp -----------------------------------------------------------------------------


def binomial_ok(hits: int, n: int, p: float) -> bool:
    return abs(hits - n * p) <= Z * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize(("num", "den"), [(0, 1), (3, 10), (1, 1), (27, 10), (0, 7)])
def test_bernoulli_exp_probability(num: int, den: int) -> None:
    draws = bernoulli_exp(keyed_rng(num * 100 + den), np.full(N, num, dtype=np.int64), den)
    assert draws.dtype == np.bool_ and draws.shape == (N,)
    p = math.exp(-num / den)
    if num == 0:
        assert draws.all()
    else:
        assert binomial_ok(int(draws.sum()), N, p)


def test_bernoulli_exp_mixed_gammas_in_one_call() -> None:
    gammas = [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 3), Fraction(13, 3)]
    num = np.repeat([int(g * 3) for g in gammas], N // 5).astype(np.int64)
    draws = bernoulli_exp(keyed_rng(11), num.reshape(len(gammas), N // 5), 3)
    assert draws.shape == (len(gammas), N // 5)
    for g, row in zip(gammas, draws, strict=True):
        p = math.exp(-float(g))
        assert row.all() if g == 0 else binomial_ok(int(row.sum()), row.size, p)


@pytest.mark.parametrize(
    ("num", "den"),
    [
        # den·k reaches 2⁶² at k = 2: the loop switches to Bernoulli(1/k)·Bernoulli(num/den)
        (3 * (2**61 + 1) // 10, 2**61 + 1),
        (7 * (2**61 + 1) // 3, 2**61 + 1),
        # den above 2⁶²: the uniform is compared with num/den digit by digit
        (2**63 - 1, 2**64 + 13),
        (2**62 + 12345, 3 * 2**63 + 1),
    ],
)
def test_bernoulli_exp_huge_denominators(num: int, den: int) -> None:
    draws = bernoulli_exp(keyed_rng(num % 1000), np.full(N, num, dtype=np.int64), den)
    assert binomial_ok(int(draws.sum()), N, math.exp(-num / den))


@pytest.mark.parametrize(
    ("num", "den"),
    [(np.array([1, -1]), 3), (np.array([0.5]), 3), (np.array([1]), 0), (np.array([1]), True)],
)
def test_bernoulli_exp_rejects(num: Any, den: Any) -> None:
    with pytest.raises(ValueError, match="gamma"):
        bernoulli_exp(keyed_rng(), num, den)


# --- discrete Laplace --------------------------------------------------------------------------

DLAP_SCALES = [Fraction(5, 3), public_scale(1 / 0.6), Fraction(7, 2), Fraction(200)]


@pytest.mark.parametrize("scale", DLAP_SCALES, ids=str)
def test_discrete_laplace_matches_the_exact_pmf(scale: Fraction) -> None:
    x = discrete_laplace(keyed_rng(scale.numerator), scale, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    assert chi2_gof(x, dlap_pmf(float(scale))) > P_MIN


@pytest.mark.parametrize("scale", [Fraction(5, 3), Fraction(200), public_scale(1e4)], ids=str)
def test_discrete_laplace_moments(scale: Fraction) -> None:
    b = float(scale)
    var, fourth = moments(dlap_pmf(b), math.ceil(80 * b))
    assert var == pytest.approx(discrete_laplace_variance(scale), rel=1e-9)
    assert_moments(discrete_laplace(keyed_rng(3 + scale.numerator), scale, N), var, fourth)


def test_discrete_laplace_variance_formula() -> None:
    for b in [0.2, 5 / 3, 3.5, 200.0]:
        var, _ = moments(dlap_pmf(b), math.ceil(80 * b) + 50)
        assert discrete_laplace_variance(b) == pytest.approx(var, rel=1e-12)
        assert discrete_laplace_variance(b) < laplace_variance(b)
    # 2b² − 1/6 + O(1/b²): stable where 1 − e^{−1/b} cancels
    assert discrete_laplace_variance(1e6) == pytest.approx(2e12 - 1 / 6, rel=1e-15)
    assert discrete_laplace_variance(Fraction(5, 3)) == discrete_laplace_variance(5 / 3)
    with pytest.raises(ValueError, match="scale"):
        discrete_laplace_variance(0.0)


@pytest.mark.parametrize(
    "scale", [0, -1, Fraction(-3, 2), math.nan, Fraction(MAX_NUMERATOR + 1, 3), 2.0**41]
)
def test_discrete_laplace_rejects_bad_scale(scale: Any) -> None:
    with pytest.raises(ValueError, match="scale"):
        discrete_laplace(keyed_rng(), scale, 3)


@pytest.mark.parametrize("size", [-1, 2.0, True])
def test_samplers_reject_bad_size(size: Any) -> None:
    with pytest.raises(ValueError, match="size"):
        discrete_laplace(keyed_rng(), Fraction(2), size)
    with pytest.raises(ValueError, match="size"):
        discrete_gaussian(keyed_rng(), Fraction(2), size)


def test_size_zero_draws_nothing() -> None:
    assert discrete_laplace(keyed_rng(), Fraction(2), 0).shape == (0,)
    assert discrete_gaussian(keyed_rng(), Fraction(2), 0).shape == (0,)
    assert bernoulli_exp(keyed_rng(), np.zeros(0, dtype=np.int64), 3).shape == (0,)


# --- the mechanism -----------------------------------------------------------------------------


def test_mechanism_releases_integer_counts_with_the_rounded_up_scale() -> None:
    counts = np.arange(12, dtype=np.int64).reshape(3, 4) * 1000
    out = discrete_laplace_mechanism(counts, 3, 0.7, keyed_rng(5))
    assert out.dtype == np.int64 and out.shape == (3, 4)
    # the same draws as DLap(b) with b = ⌈(3/0.7)·2²⁰⌉/2²⁰ computed exactly, in row-major order
    b = public_scale(Fraction(3) / Fraction(0.7))
    assert b >= Fraction(3) / Fraction(0.7)
    expected_noise = discrete_laplace(keyed_rng(5), b, 12).reshape(3, 4)
    assert np.array_equal(out - counts, expected_noise)
    assert np.array_equal(
        discrete_laplace_mechanism(counts.astype(np.float64), 3, 0.7, keyed_rng(5)), out
    )
    assert np.array_equal(discrete_laplace_mechanism(counts.tolist(), 3, 0.7, keyed_rng(5)), out)


def test_mechanism_noise_is_independent_across_coordinates() -> None:
    n, d = 40_000, 6
    counts = np.tile(np.arange(d) * 7, (n, 1))
    noise = (discrete_laplace_mechanism(counts, 1, 0.5, keyed_rng(6)) - counts).astype(np.float64)
    b = float(public_scale(2.0))
    var, fourth = moments(dlap_pmf(b), 200)
    for column in noise.T:
        assert_moments(column, var, fourth)
    corr = np.corrcoef(noise.T)[np.triu_indices(d, 1)]
    assert np.all(np.abs(corr) <= Z / math.sqrt(n))


@pytest.mark.parametrize(
    "counts", [[1.5, 2.0], [math.nan], [math.inf], np.array([1 + 0j]), ["3"], [2.0**60]]
)
def test_mechanism_rejects_non_integer_counts(counts: Any) -> None:
    with pytest.raises(ValueError, match="counts"):
        discrete_laplace_mechanism(counts, 1, 1.0, keyed_rng())


@pytest.mark.parametrize(
    ("sensitivity", "epsilon", "match"),
    [
        (0, 1.0, "sensitivity"),
        (1.5, 1.0, "sensitivity"),
        (True, 1.0, "sensitivity"),
        (1, 0.0, "epsilon"),
        (1, math.nan, "epsilon"),
        (1, 1e-13, "maximum scale"),
        (1, 1e-11, "numerator"),
    ],
)
def test_mechanism_rejects_bad_parameters(sensitivity: Any, epsilon: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        discrete_laplace_mechanism([1, 2], sensitivity, epsilon, keyed_rng())


# --- discrete Gaussian -------------------------------------------------------------------------

# 9/4 + 2⁻⁷⁰ forces the exponent into Python integers and the uniform into base-2⁶² digits
SIGMA2 = [Fraction(1), Fraction(10), Fraction(9, 4), Fraction(9 * 2**68 + 1, 2**70)]


@pytest.mark.parametrize("sigma2", SIGMA2, ids=str)
def test_discrete_gaussian_matches_the_exact_pmf(sigma2: Fraction) -> None:
    x = discrete_gaussian(keyed_rng(sigma2.numerator % 997), sigma2, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    assert chi2_gof(x, dgauss_pmf(float(sigma2))) > P_MIN


@pytest.mark.parametrize("sigma2", [Fraction(1), Fraction(10), Fraction(9, 4)], ids=str)
def test_discrete_gaussian_moments(sigma2: Fraction) -> None:
    pmf = dgauss_pmf(float(sigma2))
    var, fourth = moments(pmf, math.ceil(40 * math.sqrt(sigma2)) + 10)
    assert var == pytest.approx(discrete_gaussian_variance(sigma2), rel=1e-12)
    assert_moments(discrete_gaussian(keyed_rng(17 + sigma2.numerator), sigma2, N), var, fourth)


def test_discrete_gaussian_variance_is_close_to_sigma2() -> None:
    # Poisson summation: Var = σ² − O(σ⁴·e^{−2π²σ²}), below double precision for σ² ≥ 2
    for s2 in [2.0, 10.0, 1e4]:
        assert discrete_gaussian_variance(s2) == pytest.approx(s2, rel=1e-14)
    assert discrete_gaussian_variance(1.0) < 1.0
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian_variance(-1.0)


@pytest.mark.parametrize("sigma2", [0, -2, math.inf, 2.0**41])
def test_discrete_gaussian_rejects_bad_sigma2(sigma2: Any) -> None:
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(keyed_rng(), sigma2, 3)


# --- agreement with OpenDP ---------------------------------------------------------------------


def opendp_samples(kind: str, scale: float, n: int) -> NDArray:
    dp.enable_features("contrib")
    if kind == "laplace":
        space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
        meas = dp.m.make_laplace(*space, scale=scale)
    else:
        space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
        meas = dp.m.make_gaussian(*space, scale=scale)
    return np.asarray(meas([0] * n), dtype=np.int64)


@pytest.mark.parametrize("scale", [1 / 0.6, 200.0])
def test_discrete_laplace_agrees_with_opendp(scale: float) -> None:
    ours = discrete_laplace(keyed_rng(23), public_scale(scale), N_OPENDP)
    theirs = opendp_samples("laplace", scale, N_OPENDP)
    assert chi2_two_sample(ours, theirs, dlap_pmf(scale), math.ceil(60 * scale)) > P_MIN_OPENDP


@pytest.mark.parametrize("sigma", [1.0, 1.5])
def test_discrete_gaussian_agrees_with_opendp(sigma: float) -> None:
    sigma2 = Fraction(sigma) ** 2
    ours = discrete_gaussian(keyed_rng(29), sigma2, N_OPENDP)
    theirs = opendp_samples("gaussian", sigma, N_OPENDP)
    pmf = dgauss_pmf(float(sigma2))
    assert chi2_two_sample(ours, theirs, pmf, math.ceil(20 * sigma)) > P_MIN_OPENDP


@pytest.mark.parametrize(
    ("b", "wrong"), [(Fraction(200), Fraction(216)), (Fraction(5, 3), Fraction(9, 5))]
)
def test_two_sample_check_detects_a_wrong_scale(b: Fraction, wrong: Fraction) -> None:
    """The OpenDP comparison has power: 8% more scale is rejected at these sample sizes."""
    ours = discrete_laplace(keyed_rng(31), b, N_OPENDP)
    wider = discrete_laplace(keyed_rng(37), wrong, N_OPENDP)
    pmf = dlap_pmf(float(b))
    assert chi2_two_sample(ours, wider, pmf, math.ceil(60 * b)) < P_MIN_OPENDP


# --- only uniform integers, replayable -----------------------------------------------------------


class IntegersOnly:
    """A generator that offers ``integers`` and nothing else (no float method to call)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self.calls = 0

    def integers(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._rng.integers(*args, **kwargs)


def test_samplers_draw_only_uniform_integers() -> None:
    spy = IntegersOnly(keyed_rng())
    rng = cast(np.random.Generator, spy)
    discrete_laplace(rng, public_scale(1 / 0.6), 500)
    discrete_gaussian(rng, SIGMA2[-1], 500)
    discrete_gaussian(rng, Fraction(10), 500)
    bernoulli_exp(rng, np.full(50, 2**63 - 1, dtype=np.int64), 2**64 + 13)
    discrete_laplace_mechanism([3, 4, 5], 2, 0.9, rng)
    assert spy.calls > 0


def test_same_key_same_draws() -> None:
    def draw(rng: np.random.Generator) -> list[NDArray]:
        return [
            discrete_laplace(rng, Fraction(7, 2), 1000),
            discrete_gaussian(rng, SIGMA2[-1], 300),
            bernoulli_exp(rng, np.arange(100, dtype=np.int64), 7),
            discrete_laplace_mechanism(np.arange(50), 1, 0.3, rng),
        ]

    first, again, other = draw(keyed_rng(41)), draw(keyed_rng(41)), draw(keyed_rng(43))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, c) for a, c in zip(first[:2], other[:2], strict=True))
