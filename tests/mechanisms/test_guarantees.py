"""Guarantees as data (``mechanisms.guarantees``): measures, conversions, composition, scopes."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from privstream.mechanisms.guarantees import (
    ZCDP,
    ApproxDP,
    ClassScope,
    GaussianDP,
    Guarantee,
    LifetimeScope,
    PeriodScope,
    PureDP,
    StreamScope,
    WindowScope,
    compose,
)


@pytest.mark.parametrize(("mu", "eps"), [(0.5, 0.0), (1.0, 0.5), (1.0, 2.0), (3.0, 1.0)])
def test_gaussian_dp_delta_is_the_exact_curve(mu: float, eps: float) -> None:
    expected = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert GaussianDP(mu).delta(eps) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("mu", "delta"), [(0.5, 1e-5), (1.0, 1e-6), (2.0, 1e-3)])
def test_gaussian_dp_epsilon_inverts_delta(mu: float, delta: float) -> None:
    eps = GaussianDP(mu).epsilon(delta)
    assert GaussianDP(mu).delta(eps) == pytest.approx(delta, rel=1e-9)
    assert GaussianDP(mu).delta(eps * 0.99) > delta  # the smallest such ε
    assert GaussianDP(mu).to_approx(delta) == ApproxDP(eps, delta)


def test_standard_conversions() -> None:
    assert PureDP(2.0).to_zcdp() == ZCDP(2.0)  # ε²/2
    assert GaussianDP(2.0).to_zcdp() == ZCDP(2.0)  # μ²/2
    approx = ZCDP(0.5).to_approx(1e-6)
    assert approx.epsilon == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e6)))
    assert PureDP(1.0).to_approx() == ApproxDP(1.0, 0.0)


def test_composition_rules() -> None:
    assert compose([PureDP(0.25), PureDP(0.5)]) == PureDP(0.75)
    assert compose([ApproxDP(1, 1e-6), ApproxDP(2, 1e-6)]) == ApproxDP(3, 2e-6)
    assert compose([GaussianDP(3.0), GaussianDP(4.0)]) == GaussianDP(5.0)
    assert compose([ZCDP(0.1), ZCDP(0.2)]).rho == pytest.approx(0.3)
    with pytest.raises(ValueError, match="convert"):
        compose([PureDP(1.0), ZCDP(1.0)])


def test_a_budget_share_scales_the_measure() -> None:
    g = Guarantee(GaussianDP(2.0), StreamScope(), "ldp")
    assert g.scaled(0.25).measure == GaussianDP(1.0)  # μ² scales: two quarters compose back
    assert compose([g.scaled(0.5).measure] * 2).mu == pytest.approx(2.0)
    assert Guarantee(PureDP(1.0), WindowScope(5), "cdp").scaled(0.5).budget == 0.5


def test_guarantees_serialise_as_flat_data() -> None:
    g = Guarantee(PureDP(1.0), WindowScope(20), "ldp")
    assert g.to_dict() == {"measure": "pure", "epsilon": 1.0, "scope": "window", "window": 20,
                           "model": "ldp"}  # fmt: skip
    assert Guarantee(ZCDP(0.5), PeriodScope(7), "ldp").to_dict()["length"] == 7
    assert Guarantee(ApproxDP(1, 1e-6), LifetimeScope(), "ldp").window is None
    assert Guarantee(PureDP(1.0), ClassScope(120), "cdp").window == 120


@pytest.mark.parametrize(
    "build",
    [lambda: PureDP(-1.0), lambda: PureDP(math.inf), lambda: ApproxDP(1.0, 1.0),
     lambda: GaussianDP(math.nan), lambda: WindowScope(0), lambda: PeriodScope(-2),
     lambda: Guarantee(PureDP(1.0), StreamScope(), "central")],
)  # fmt: skip
def test_invalid_values_are_refused(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("mu", [29.0, 60.0, 200.0])
def test_large_mu_converts_without_overflow(mu: float) -> None:
    eps = GaussianDP(mu).epsilon(1e-5)
    assert math.isfinite(eps) and eps > mu  # a long lifetime spends a lot: but a number
    assert GaussianDP(mu).delta(eps) == pytest.approx(1e-5, rel=1e-6)
