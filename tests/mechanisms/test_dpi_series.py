"""DPI's budget series (``mechanisms.dpi_series``): spec dpi §3.3's reference values and laws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privstream.mechanisms.dpi_series import (
    MAX_INDEX,
    NO_INDEX,
    PI2_6,
    BudgetSeries,
    dilog,
    exact_step_sizes,
)

# (ε, μ, ζ), C, r, and ε_i for i = 1, 2, 10, 100, 1000, 10000 as printed in spec §3.3.
REFERENCE = [
    (
        (2.0, 0.05, 0.1),
        "400",
        "0.999407076985",
        ["2.371692e-1", "1.185494e-1", "2.365374e-2", "2.303413e-3", "1.789551e-4", "3.989377e-6"],
    ),
    (
        (2.0, 0.5, 1.0),
        "4",
        "0.833731253410",
        ["6.650750e-1", "3.048922e-1", "3.350886e-2", "4.000000e-4", "4.0e-6", "4.0e-8"],
    ),
    (
        (10.0, 0.05, 0.1),
        "400",
        "0.996203649957",
        ["1.518540", "7.578288e-1", "1.492859e-1", "1.265532e-2", "3.910836e-4", "4.0e-6"],
    ),
    (
        (0.1, 0.05, 0.1),
        "400",
        "0.999978739270",
        ["8.504292e-3", "4.252101e-3", "8.503478e-4", "8.495348e-5", "8.414614e-6", "7.661131e-7"],
    ),
]
INDICES = [1, 2, 10, 100, 1000, 10000]


def half_unit(printed: str) -> float:
    """Half a unit in the last printed digit of a decimal or e-notation number."""
    mantissa, _, exponent = printed.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


@pytest.mark.parametrize(("params", "c", "r", "eps"), REFERENCE)
def test_reference_table(
    params: tuple[float, float, float], c: str, r: str, eps: list[str]
) -> None:
    series = BudgetSeries(*params)
    assert abs(series.C - float(c)) <= 1e-12
    assert abs(series.r - float(r)) <= half_unit(r)
    for i, printed in zip(INDICES, eps, strict=True):
        assert abs(series.epsilon_i(i) - float(printed)) <= half_unit(printed), (i, printed)
    np.testing.assert_array_equal(series.epsilons(INDICES), [series.epsilon_i(i) for i in INDICES])


def test_step_sizes_at_i1() -> None:
    exact = BudgetSeries(2.0, 0.05, 0.1)
    steps = exact.step_sizes(1)
    assert steps.alpha_a == pytest.approx(7.411538e-4, abs=5e-11)
    assert steps.eta_a == pytest.approx(3.705768e-4, abs=5e-11)
    assert steps.alpha_q == steps.alpha_a  # ρ_Q = ½
    # Theorem 5.1's check: (2Δ_Q/μ)·ln((1+2η)/(1−2η)) = ε_X = ε_1/2 per distribution
    cost = (2 * 2.0 / 0.05) * math.log((1 + 2 * steps.eta_a) / (1 - 2 * steps.eta_a))
    assert cost == pytest.approx(exact.epsilon_i(1) / 2, rel=1e-12)
    assert exact.nominal_charge(1) == exact.epsilon_i(1)

    paper = BudgetSeries(2.0, 0.05, 0.1, mode="paper_thm54")
    assert paper.x_i(1) == pytest.approx(5.929230e-3, abs=5e-10)
    p_steps = paper.step_sizes(1)
    assert p_steps.eta_q == p_steps.eta_a == pytest.approx(1.482303e-3, abs=5e-10)
    assert p_steps.alpha_a == pytest.approx(paper.x_i(1) / 2, rel=1e-15)
    assert paper.nominal_charge(1) == pytest.approx(9.486768e-1, abs=5e-8)
    # I9: the paper's charge is exactly 4·ε_i, at every index
    for i in (1, 7, 38, 1709, 10**6):
        charge = (4 * 2.0 / 0.05) * 2 * paper.step_sizes(i).alpha_q
        assert charge == pytest.approx(4 * paper.epsilon_i(i), rel=1e-12)
        assert paper.nominal_charge(i) == 4 * paper.epsilon_i(i)


def test_step_sizes_split_and_no_draw() -> None:
    series = BudgetSeries(2.0, 0.05, 0.1)
    steps = series.step_sizes(3, query_share=0.25, k_q=2)
    eps = series.epsilon_i(3)
    assert steps.alpha_q == pytest.approx(0.05 * 0.25 * eps / 8, rel=1e-15)
    assert steps.alpha_a == pytest.approx(0.05 * 0.75 * eps / 16, rel=1e-15)
    assert steps.eta_a == pytest.approx(0.5 * math.tanh(steps.alpha_a), rel=1e-15)
    assert series.step_sizes(NO_INDEX) == (0.0, 0.0, 0.0, 0.0)
    assert series.nominal_charge(NO_INDEX) == 0.0
    assert exact_step_sizes(0.0, 0.05, 2.0) == (0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="query_share"):
        exact_step_sizes(0.1, 0.05, 2.0, query_share=1.5)
    with pytest.raises(ValueError, match="k_Q"):
        series.step_sizes(1, k_q=0)


def test_dilog_half() -> None:
    assert dilog(0.5) == pytest.approx(0.5822405265, abs=5e-11)
    assert dilog(0.5) == pytest.approx(PI2_6 / 2 - math.log(2) ** 2 / 2, rel=1e-15)
    assert dilog(1.0) == pytest.approx(PI2_6, rel=1e-15)


def test_budget_share_of_the_first_indices() -> None:
    series = BudgetSeries(2.0, 0.05, 0.1)
    cumulative = np.cumsum(series.epsilons(np.arange(1, 2001)))
    assert cumulative[36] < 0.5 * 2.0 <= cumulative[37]  # 50 % within the first 38
    assert cumulative[1707] < 0.9 * 2.0 <= cumulative[1708]  # 90 % within the first 1709


@pytest.mark.parametrize(("params", "c", "r", "eps"), REFERENCE)
def test_series_sums_to_epsilon(
    params: tuple[float, float, float], c: str, r: str, eps: list[str]
) -> None:
    series = BudgetSeries(*params)
    epsilon = params[0]
    assert series.total == pytest.approx(epsilon, rel=1e-9)  # I2, closed form
    n = 10**6
    partial = math.fsum(series.epsilons(np.arange(1, n + 1)))
    # tail Σ_{i>n} ε_i lies between C(1 − r^{n+1})/(n+1) and C/n
    assert partial < epsilon
    lower = partial + series.C * -math.expm1((n + 1) * series.log_r) / (n + 1)
    upper = partial + series.C / n
    assert lower * (1 - 1e-12) <= epsilon <= upper * (1 + 1e-12)
    assert upper - lower < 1e-3 * epsilon


def test_strictly_decreasing_and_largest_index_above() -> None:
    for params, *_ in REFERENCE:
        series = BudgetSeries(*params)
        values = series.epsilons(np.arange(1, 200_001))
        assert np.all(np.diff(values) < 0)
        for i in (1, 2, 37, 38, 1709, 123_456):
            value = series.epsilon_i(i)
            assert series.largest_index_above(value) == i - 1
            assert series.largest_index_above(np.nextafter(value, 0.0)) == i
    series = BudgetSeries(2.0, 0.05, 0.1)
    assert series.largest_index_above(1.0) == 0
    assert series.largest_index_above(1e-8) == 199_999  # ε ≈ C/i² far out
    assert series.largest_index_above(0.0) == MAX_INDEX


def test_infeasible_refused_with_the_limit() -> None:
    with pytest.raises(ValueError) as excinfo:
        BudgetSeries(10.0, 0.5, 1.0)
    message = str(excinfo.value)
    assert "ε must be < (π²/6)·Δ_Q/(μζ) = 6.57974" in message
    assert "allow_underspend" in message
    assert "ε = 10" in message


def test_allow_underspend() -> None:
    series = BudgetSeries(10.0, 0.5, 1.0, allow_underspend=True)
    assert series.r == 0.0
    assert series.epsilon_i(3) == pytest.approx(4.0 / 9, rel=1e-15)
    assert series.total == pytest.approx(4 * PI2_6, rel=1e-15)
    assert series.underspend == pytest.approx(10.0 - 4 * PI2_6, rel=1e-15)
    assert series.total + series.underspend == pytest.approx(10.0, rel=1e-15)
    assert BudgetSeries(2.0, 0.5, 1.0, allow_underspend=True).underspend == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": 0.0, "mu": 0.05, "zeta": 0.1}, "epsilon must be"),
        ({"epsilon": 1.0, "mu": -1.0, "zeta": 0.1}, "mu must be"),
        ({"epsilon": 1.0, "mu": 0.05, "zeta": math.inf}, "zeta must be"),
        ({"epsilon": 1.0, "mu": 0.05, "zeta": 0.1, "delta_q": 0.0}, "delta_q must be"),
        ({"epsilon": 1.0, "mu": 0.05, "zeta": 0.1, "mode": "thm"}, "eta_mode must be one of"),
    ],
)
def test_invalid_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BudgetSeries(**kwargs)  # type: ignore[arg-type]


def test_indices_start_at_one() -> None:
    series = BudgetSeries(2.0, 0.05, 0.1)
    with pytest.raises(ValueError, match="start at 1"):
        series.epsilon_i(0)
    with pytest.raises(ValueError, match="start at 1"):
        series.epsilons([0, 1])
