"""Synthetic streams of spec ldp-ids §5.1 (``privstream.connectors.synthetic``)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from privstream.connectors.synthetic import (
    CON_SIGMA,
    DATASETS,
    SyntheticStream,
    lns_probabilities,
    log_probabilities,
    sin_probabilities,
    uniform_subset_mask,
)

BINARY = [name for name in DATASETS if not name.endswith("-con")]


def test_sin_and_log_use_one_based_time() -> None:
    """§5.1: ``t = 1..T`` in the formulas, so Log starts at 0.25/(1+e^{−0.01})."""
    sin = sin_probabilities(800)
    log = log_probabilities(800)
    assert sin[0] == pytest.approx(0.05 * math.sin(0.01) + 0.075, abs=1e-15)
    assert log[0] == pytest.approx(0.25 / (1 + math.exp(-0.01)), abs=1e-15)
    assert sin[799] == pytest.approx(0.05 * math.sin(8.0) + 0.075, abs=1e-15)
    assert log[799] == pytest.approx(0.25 / (1 + math.exp(-8.0)), abs=1e-15)
    assert sin.min() >= 0.025 and sin.max() <= 0.125
    assert 0.125 < log[0] < log[-1] < 0.25


def test_lns_reflects_at_zero_and_caps_at_one() -> None:
    """A25: ``p_t = min(1, |p_{t−1} + N(0, Q)|)``, so every p lies in [0, 1]. A large Q makes
    both boundaries bite."""
    slots, sqrt_q = 2000, 0.3
    p = lns_probabilities(slots, np.random.default_rng(7), p0=0.05, sqrt_q=sqrt_q)
    steps = np.random.default_rng(7).normal(0.0, sqrt_q, size=slots)
    prev, reflected, capped = 0.05, 0, 0
    for t in range(slots):
        raw = prev + steps[t]
        reflected += raw < 0
        capped += raw > 1
        prev = min(1.0, abs(raw))
        assert p[t] == prev
    assert reflected > 0 and capped > 0
    assert np.all((p >= 0) & (p <= 1))
    default = SyntheticStream("lns", 1000, 800, seed=3).probabilities
    assert np.all((default >= 0) & (default <= 1))


@pytest.mark.parametrize("name", BINARY)
def test_binary_slots_hold_exactly_round_p_n_ones(name: str) -> None:
    s = SyntheticStream(name, 20_001, 50, seed=5)
    for t in (1, 2, 17, 50):
        v = s.values(t)
        assert v.dtype == np.int64 and v.shape == (20_001,)
        assert set(np.unique(v).tolist()) <= {0, 1}
        k = round(float(s.probabilities[t - 1]) * 20_001)
        assert s.ones(t) == k == int(v.sum())
        np.testing.assert_array_equal(s.truth(t), [1 - k / 20_001, k / 20_001])
        assert s.truth(t) == pytest.approx(np.bincount(v, minlength=2) / 20_001, abs=1e-15)


@pytest.mark.parametrize("name", DATASETS)
def test_values_are_a_pure_function_of_seed_and_slot(name: str) -> None:
    a = SyntheticStream(name, 5_000, 30, seed=11)
    b = SyntheticStream(name, 5_000, 30, seed=11)
    later_first = b.values(20)
    for t in (1, 7, 20, 30):
        np.testing.assert_array_equal(a.values(t), b.values(t))
    np.testing.assert_array_equal(later_first, a.values(20))
    np.testing.assert_array_equal(a.values(7), a.values(7))
    other = SyntheticStream(name, 5_000, 30, seed=12)
    assert not np.array_equal(a.values(7), other.values(7))
    assert not np.array_equal(a.values(7), a.values(8))
    assert len(list(a)) == 30


@pytest.mark.parametrize("name", [n for n in DATASETS if n.endswith("-con")])
def test_con_streams_are_gaussian_around_p_t(name: str) -> None:
    s = SyntheticStream(name, 200_000, 40, seed=2)
    assert s.numeric and s.d == 1
    lo, hi = s.bounds
    assert lo == pytest.approx(s.probabilities.min() - 3 * CON_SIGMA)
    assert hi == pytest.approx(s.probabilities.max() + 3 * CON_SIGMA)
    for t in (1, 40):
        v = s.values(t)
        se = CON_SIGMA / math.sqrt(v.shape[0])
        assert abs(v.mean() - s.probabilities[t - 1]) < 5 * se
        assert v.std() == pytest.approx(CON_SIGMA, rel=0.01)
        assert s.truth(t) == pytest.approx([v.mean()], abs=1e-12)


def test_binary_metadata_and_validation() -> None:
    s = SyntheticStream("sin", 100, 10)
    assert not s.numeric and s.d == 2
    with pytest.raises(ValueError, match="unknown synthetic dataset"):
        SyntheticStream("cos", 100, 10)
    with pytest.raises(ValueError, match="users and slots"):
        SyntheticStream("sin", 0, 10)
    with pytest.raises(ValueError, match="slot must lie"):
        s.values(0)
    with pytest.raises(ValueError, match="slot must lie"):
        s.values(11)
    with pytest.raises(ValueError, match="binary streams"):
        SyntheticStream("sin-con", 100, 10, independent=True)


@pytest.mark.parametrize("name", BINARY)
def test_independent_population_counts_what_it_drew(name: str) -> None:
    """The personalized population (each user 1 with probability p_t) reports the ones it drew,
    not round(p_t·n), and shares the probability sequence of the LDP-IDS population."""
    s = SyntheticStream(name, 3_000, 20, seed=8, independent=True)
    exact = SyntheticStream(name, 3_000, 20, seed=8)
    np.testing.assert_array_equal(s.probabilities, exact.probabilities)
    for t in (1, 20):
        v = s.values(t)
        assert v.dtype == np.int64 and s.ones(t) == int(v.sum())
        assert s.truth(t) == pytest.approx(np.bincount(v, minlength=2) / 3_000, abs=1e-15)


@pytest.mark.parametrize("n,k", [(6, 2), (6, 4), (7, 3)])
def test_subset_sampler_is_exactly_uniform(n: int, k: int) -> None:
    """Every k-subset is equally likely (k > n/2 goes through the complement)."""
    rng = np.random.default_rng(1234)
    subsets = {c: i for i, c in enumerate(itertools.combinations(range(n), k))}
    counts = np.zeros(len(subsets))
    draws = 400 * len(subsets)
    for _ in range(draws):
        mask = uniform_subset_mask(n, k, rng)
        counts[subsets[tuple(np.flatnonzero(mask).tolist())]] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_subset_sampler_sizes_and_edges() -> None:
    rng = np.random.default_rng(0)
    for n, k in [(1, 0), (1, 1), (10, 0), (10, 10), (200_000, 25_000), (200_000, 199_000)]:
        assert int(uniform_subset_mask(n, k, rng).sum()) == k
    with pytest.raises(ValueError):
        uniform_subset_mask(5, 6, rng)
    # Inclusion is uniform over positions: each user holds a 1 w.p. k/n.
    hits = sum(uniform_subset_mask(50, 10, rng).astype(np.int64) for _ in range(4000))
    assert stats.chisquare(hits).pvalue > 1e-3
