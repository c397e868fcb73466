"""The device's reports and the server's simulated ones have the same distribution, and the
server's estimator fed device reports is unbiased with the oracle's variance.

Seeds are fixed; every tolerance is a number of standard deviations of the statistic, computed
from the oracle's ``(p, q)`` or ``Var*``: 4.5 σ per category (two-sided 7e-6), χ² at 1e-4.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import chi2

from privstream.client.randomizers import randomize
from privstream.mechanisms.mean import HM, hm_worst_variance, pm_scale, sr_scale
from privstream.mechanisms.oracles import GRR, OLH, OUE, FrequencyOracle
from tests.client.helpers import SeededRandomness

Z: float = 4.5
ALPHA: float = 1e-4
D: int = 6
EPS: float = 1.0
FREQ = (0.4, 0.25, 0.15, 0.1, 0.06, 0.04)
SERVERS = {"GRR": GRR(D), "OUE": OUE(D), "OLH": OLH(D)}


def _values(m: int) -> np.ndarray[Any, Any]:
    """``m`` users' values with counts ``m·FREQ`` exactly."""
    return np.repeat(np.arange(D), [round(m * f) for f in FREQ])


def _device_reports(
    oracle: str, values: np.ndarray[Any, Any], eps: float, seed: int
) -> np.ndarray[Any, Any]:
    rng = SeededRandomness(seed)
    return np.array([randomize(oracle, int(v), eps, D, rng) for v in values])


def _per_category_variance(server: FrequencyOracle, eps: float, m: int) -> np.ndarray[Any, Any]:
    """``Var[ĉ_k] = (f_k p(1−p) + (1−f_k) q(1−q)) / (m (p−q)²)``: reports are independent and
    each supports ``k`` w.p. ``p`` (value k) or ``q`` (another value)."""
    p, q = server.pq(eps)
    f = np.array(FREQ)
    return (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (m * server.gap(eps) ** 2)


@pytest.mark.parametrize("oracle", ["GRR", "OUE", "OLH"])
def test_server_estimates_from_device_reports_are_unbiased_with_the_oracle_variance(
    oracle: str,
) -> None:
    """R rounds of m device reports through the server's ``support``/``estimate``: the mean error
    per category is within 4.5 σ/√R of 0 and the mean of ``err_k²/Var_k`` within 5 standard
    deviations (√(2·1.5/(R·d)), 1.5 allowing for the categories' correlation) of 1."""
    server, m, rounds = SERVERS[oracle], 1500, 40
    values, truth = _values(m), np.array(FREQ)
    var = _per_category_variance(server, EPS, m)
    errors = np.array([
        server.estimate(server.support(_device_reports(oracle, values, EPS, seed), EPS), EPS, m) - truth
        for seed in range(rounds)
    ])  # fmt: skip
    bias_z = errors.mean(axis=0) / np.sqrt(var / rounds)
    assert np.all(np.abs(bias_z) <= Z), bias_z
    ratio = float(np.mean(errors**2 / var))
    assert abs(ratio - 1) <= 5 * math.sqrt(2 * 1.5 / (rounds * D)), ratio


@pytest.mark.parametrize("oracle", ["GRR", "OUE"])
def test_the_per_category_variance_is_the_server_variance(oracle: str) -> None:
    """The d-average of the per-category variance is the server's ``V(ε, m)`` (spec §2.4)."""
    server = SERVERS[oracle]
    assert float(np.mean(_per_category_variance(server, EPS, 1000))) == pytest.approx(
        server.variance(EPS, 1000), rel=1e-12
    )


def _two_sample_z(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], n: int) -> np.ndarray[Any, Any]:
    """z of the difference of two binomial counts out of ``n`` each (pooled proportion)."""
    pooled = (a + b) / (2 * n)
    z: np.ndarray[Any, Any] = (a - b) / np.sqrt(2 * n * pooled * (1 - pooled))
    return z


@pytest.mark.parametrize("oracle", ["GRR", "OUE", "OLH"])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_device_and_server_reports_support_each_category_equally_often(
    oracle: str, eps: float
) -> None:
    """n users with the same value mix: the server's ``support`` counts of n device reports and
    of n server-simulated (``perturb``) reports differ by at most 4.5 σ per category."""
    server, n = SERVERS[oracle], 12000
    values = _values(n)
    device = server.support(_device_reports(oracle, values, eps, seed=7), eps)
    simulated = server.support(server.perturb(values, eps, np.random.default_rng(7)), eps)
    z = _two_sample_z(device, simulated, len(values))
    assert np.all(np.abs(z) <= Z), z


@pytest.mark.parametrize("oracle", ["GRR", "OLH"])
def test_device_and_server_categorical_reports_have_one_distribution(oracle: str) -> None:
    """χ² homogeneity of the reported category (GRR's value, OLH's ``y``) at level 1e-4."""
    server, eps, n = SERVERS[oracle], 1.0, 12000
    values = _values(n)
    device = _device_reports(oracle, values, eps, seed=11)
    simulated = server.perturb(values, eps, np.random.default_rng(11))
    if oracle == "OLH":
        device, simulated = device[:, 2], simulated[:, 2]
    k = int(max(device.max(), simulated.max())) + 1
    a, b = np.bincount(device, minlength=k), np.bincount(simulated, minlength=k)
    stat = float(np.sum((a - b) ** 2 / np.maximum(a + b, 1)))
    assert stat <= chi2.isf(ALPHA, k - 1), stat


def _hm_categories(
    reports: np.ndarray[Any, Any], eps: float, bins: int = 12
) -> np.ndarray[Any, Any]:
    """SR's two atoms ``±C_s`` and ``bins`` equal bins of ``[−C, C]`` for PM's reports."""
    cs = sr_scale(eps)
    atoms = np.isclose(reports, cs, rtol=1e-12) | np.isclose(reports, -cs, rtol=1e-12)
    c = pm_scale(eps) if eps > 0.61 else 1.0
    pm_bins = np.clip(((reports + c) / (2 * c) * bins).astype(int), 0, bins - 1)
    return np.where(atoms, np.where(reports > 0, bins + 1, bins), pm_bins)


@pytest.mark.parametrize("eps", [0.4, 1.0, 3.0])
@pytest.mark.parametrize("x", [-0.8, 0.1, 0.9])
def test_hm_device_and_server_reports_have_one_distribution(eps: float, x: float) -> None:
    """χ² homogeneity (level 1e-4) over SR's atoms and 12 bins of PM's range, and the device's
    mean within 4.5 √(Var*(ε)/n) of x."""
    n, rng = 12000, SeededRandomness(int(100 * (eps + x)))
    device = np.array([randomize("HM", x, eps, 0, rng) for _ in range(n)])
    simulated = HM().perturb(np.full(n, x), eps, np.random.default_rng(5))
    a = np.bincount(_hm_categories(device, eps), minlength=14)
    b = np.bincount(_hm_categories(simulated, eps), minlength=14)
    used = (a + b) > 0
    stat = float(np.sum((a - b)[used] ** 2 / (a + b)[used]))
    assert stat <= chi2.isf(ALPHA, int(used.sum()) - 1), stat
    assert abs(device.mean() - x) <= Z * math.sqrt(hm_worst_variance(eps) / n)
