"""The floating-point attack on textbook Laplace noise (Mironov 2012; spec personalized-w-event
§9.6), reproduced against a float victim and shown not to apply to the exact discrete Laplace.

The victim is NumPy-style inverse-CDF Laplace on doubles, reimplemented here (the library no
longer has it): ``u = k·2⁻⁵³`` for a uniform ``k ∈ [1, 2⁵³)``, and the release is
``c − b·log(2 − 2u)`` for ``u ≥ 1/2``, else ``c + b·log(2u)``, every operation rounded to double.

The attacker decides whether a released double ``v`` is *reachable* from a candidate count
``c'``: whether some grid ``u`` makes the victim's formula produce exactly ``v``. The release is
non-decreasing in ``k`` (``log`` is monotone and so are the rounded products and sums; the lower
half ends at ``c`` and the upper half starts there), so a binary search finds the smallest ``k``
whose release is ``≥ v``; the ``±WINDOW`` grid points around it are then compared with ``v``,
which also covers a one-ulp non-monotonicity of the platform's ``log``. The checker is validated
on every release: each one is reachable from the count that produced it.

Thresholds were measured with the fixed seeds below (400 releases each): for ``b = 1/0.6`` at
``c = 1``, 265 releases are unreachable from ``c + 1``, 338 from ``c − 1`` and 379 from at least
one of them; for ``b = 200`` at ``c = 37``, 320, 313 and 372. The asserted fractions (0.5 and 0.8)
sit well below these and far above zero, so the attack is reproduced; an attacker who sees such a
release rules the neighbouring count out with certainty, i.e. no finite ε holds. (The audit saw
87/120.) The effect needs the noise to be large against the count: at ``c = 10⁶`` the ulps of the
count dominate and almost every release is reachable, which is why the tests use small counts.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from privstream.mechanisms.noise import discrete_laplace_mechanism, public_scale
from privstream.mechanisms.seeding import NoiseKey, derive_rng
from privstream.mechanisms.tasks import FrequencyTask

GRID = 2**53  # u = k / 2**53
HALF = 2**52  # u = 1/2
WINDOW = 4
RELEASES = 400


def victim(count: int, k: int, b: float) -> float:
    """The textbook float Laplace release ``count + Lap(b)`` for the grid point ``u = k·2⁻⁵³``."""
    u = k / GRID
    if k >= HALF:
        return count - b * math.log(2.0 - 2.0 * u)
    return count + b * math.log(2.0 * u)


def reachable(v: float, count: int, b: float) -> bool:
    """Whether some grid ``u`` makes ``victim(count, ·, b)`` release exactly ``v``."""
    lo, hi = 1, GRID - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if victim(count, mid, b) < v:
            lo = mid + 1
        else:
            hi = mid
    near = range(max(1, lo - WINDOW), min(GRID - 1, lo + WINDOW) + 1)
    return any(victim(count, k, b) == v for k in near)


def float_releases(count: int, b: float, seed: int) -> list[float]:
    ks = np.random.default_rng(seed).integers(1, GRID, RELEASES)
    return [victim(count, int(k), b) for k in ks]


@pytest.mark.parametrize(("b", "count"), [(1 / 0.6, 1), (200.0, 37)])
def test_float_laplace_releases_rule_out_the_neighbouring_counts(b: float, count: int) -> None:
    releases = float_releases(count, b, seed=2012)
    assert all(reachable(v, count, b) for v in releases)  # the checker finds the true count
    not_up = [not reachable(v, count + 1, b) for v in releases]
    not_down = [not reachable(v, count - 1, b) for v in releases]
    assert sum(not_up) / RELEASES > 0.5
    assert sum(not_down) / RELEASES > 0.5
    assert sum(u or d for u, d in zip(not_up, not_down, strict=True)) / RELEASES > 0.8


def test_the_victim_is_monotone_where_the_checker_searches() -> None:
    b = 1 / 0.6
    for k in np.random.default_rng(7).integers(2, GRID - 2, 200):
        k = int(k)
        assert victim(1, k - 1, b) <= victim(1, k, b) <= victim(1, k + 1, b)
    assert victim(1, HALF - 1, b) <= 1.0 == victim(1, HALF, b)


def test_large_counts_hide_the_float_grid() -> None:
    """The same checker finds nearly every release reachable when the count dominates."""
    count, b = 10**6, 1 / 0.6
    releases = float_releases(count, b, seed=2013)
    unreachable = sum(not reachable(v, count + 1, b) for v in releases)
    assert unreachable <= RELEASES // 50


def log_ratio(v: int, count: int, neighbour: int, b: Fraction) -> Fraction:
    """``log(P(v | count)/P(v | neighbour))`` for ``v = count + DLap(b)``, exactly: the PMF is
    ``tanh(1/(2b))·e^{−|x|/b}``, so the constants cancel and the logarithm is rational."""
    return Fraction(abs(v - neighbour) - abs(v - count)) / b


@pytest.mark.parametrize(
    ("epsilon", "sensitivity", "count"), [(0.6, 1, 1), (0.005, 1, 37), (0.9, 3, 12)]
)
def test_discrete_laplace_releases_are_reachable_and_bounded(
    epsilon: float, sensitivity: int, count: int
) -> None:
    rng = derive_rng(b"attack-test-key", "s", count, "pub/noise")
    releases = discrete_laplace_mechanism(np.full(RELEASES, count), sensitivity, epsilon, rng)
    assert releases.dtype == np.int64
    b = public_scale(Fraction(sensitivity) / Fraction(epsilon))
    bound = Fraction(epsilon)
    for v in releases.tolist():
        for neighbour in (count - sensitivity, count + sensitivity):
            # every integer has positive probability from every count: the release is reachable
            # from both neighbours, and the privacy loss is at most ε at this very release
            assert abs(log_ratio(v, count, neighbour, b)) <= Fraction(sensitivity) / b <= bound
    assert len(set(releases.tolist())) > 1


def test_the_audits_mechanisms_release_only_integers() -> None:
    """The audit's run (Uniform, BD, PBD, plus the other central mechanisms): every released
    estimate is an integer vector and every ``dissimilarity·d`` an integer, i.e. post-processing
    of integer counts plus integer noise whose support is all of ℤ, so each release is
    reachable from both neighbouring counts (the pointwise ε bound is checked above)."""
    import math as _math

    from privstream.families.registry import PERSONALIZED
    from privstream.mechanisms.accountant import BudgetSplit
    from privstream.mechanisms.personalized import PersonalizedConfig
    from privstream.operators.family import family_mechanisms
    from privstream.operators.registration import Preferences
    from privstream.schema.events import EventBatch
    from tests.attacks.helpers import run_operator

    n, t_max, d = 500, 40, 4
    rng = np.random.default_rng(6)
    items = [
        EventBatch("s", np.full(n, t), np.arange(n), rng.integers(0, d, n).astype(float), None, t)
        for t in range(1, t_max + 1)
    ]
    names = ["Uniform", "BD", "PBD", "BA", "PBA", "PU", "Sample"]
    config = PersonalizedConfig(population=n, epsilon=0.6, window=10, task=FrequencyTask(d))
    kind = np.arange(n) % 2
    prefs = Preferences(epsilons=np.array([0.6, 1.2])[kind], windows=np.array([10, 5])[kind])
    out = run_operator(
        items,
        lambda keyed: family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism=names, config=config,
            secret=NoiseKey.from_text("7f3a9c1e5b2d8f4a6c0e9b1d3f5a7c2e"),
            registration=prefs, split=BudgetSplit.parse("equal", len(names)),
        ),
    )  # fmt: skip
    releases = out["releases"]
    assert len(releases) == len(names) * t_max
    for r in releases:
        assert all(float(x).is_integer() for x in r["estimate"]), r
        dissimilarity = r["details"]["dissimilarity"]
        if dissimilarity is not None:
            assert _math.isclose(dissimilarity * d, round(dissimilarity * d), abs_tol=1e-9)
