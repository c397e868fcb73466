"""The shared Laplace noise module (spec personalized-w-event §2.1).

Statistical checks use fixed seeds and tolerances of four standard errors derived from the
Laplace moments: for ``X ~ Lap(b)``, ``E[X] = 0``, ``Var X = E[X²] = 2b²`` and
``E[X⁴] = 24b⁴``, so the sample mean of ``N`` draws has standard error ``b·sqrt(2/N)`` and the
sample mean of ``X²`` has ``b²·sqrt((24 − 4)/N)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privstream.mechanisms.noise import laplace, laplace_mechanism, laplace_scale, laplace_variance
from privstream.mechanisms.seeding import SlotRandomness

Z = 4.0
N = 200_000


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


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_laplace_rejects_bad_scale(scale: float) -> None:
    with pytest.raises(ValueError, match="scale"):
        laplace(np.random.default_rng(0), scale, 3)


@pytest.mark.parametrize("b", [0.01, 1.0, 240.0])
def test_laplace_moments(b: float) -> None:
    x = laplace(np.random.default_rng([7, int(b * 100)]), b, N)
    assert x.shape == (N,) and x.dtype == np.float64
    assert abs(x.mean()) <= Z * b * math.sqrt(2 / N)
    assert abs(np.mean(x**2) - laplace_variance(b)) <= Z * b * b * math.sqrt(20 / N)
    assert abs(np.mean(np.abs(x)) - b) <= Z * b / math.sqrt(N)  # E|X| = b, Var|X| = b²


def test_laplace_distribution_ks() -> None:
    b = 3.0
    x = laplace(np.random.default_rng(12345), b, 50_000)
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3


def test_mechanism_adds_independent_noise_per_coordinate() -> None:
    values = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = laplace_mechanism(values, 1.0, 0.5, np.random.default_rng(3))
    assert out.shape == values.shape
    noise = np.stack(
        [
            laplace_mechanism(values, 1.0, 0.5, np.random.default_rng([3, k])) - values
            for k in range(20_000)
        ]
    ).reshape(20_000, 6)
    b = 2.0
    assert np.all(
        np.abs(np.mean(noise**2, axis=0) - 2 * b * b) <= Z * b * b * math.sqrt(20 / 20_000)
    )
    corr = np.corrcoef(noise.T)[np.triu_indices(6, 1)]
    assert np.all(np.abs(corr) <= Z / math.sqrt(20_000))


def test_noise_is_replayable_from_slot_randomness() -> None:
    r = SlotRandomness(5, "stream", 9, scope="PBD")
    a = laplace(r("pub/noise"), 2.0, 4)
    b = laplace(r("pub/noise"), 2.0, 4)
    c = laplace(r("dc/noise"), 2.0, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
