"""DPI's synopsis pool (``mechanisms.dpi_pool``): Algorithm 2 of spec dpi §3.2."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from scipy.stats import binom

from privstream.mechanisms.dpi_pool import SynopsisPool, synopsis_counts


@pytest.fixture(scope="module")
def pool() -> SynopsisPool:
    return SynopsisPool(k=100, n_trials=100, size=2000, seed=20240522)


def test_every_synopsis_is_a_quantised_pdf(pool: SynopsisPool) -> None:
    for j in range(pool.size):
        lo, hi = pool.indptr[j], pool.indptr[j + 1]
        assert int(pool.counts[lo:hi].astype(np.int64).sum()) == pool.n_trials
        assert np.all(pool.counts[lo:hi] > 0)
        assert np.all(np.diff(pool.indices[lo:hi].astype(np.int64)) > 0)
    a = pool.synopsis(17)
    assert math.fsum(a) == 1.0
    np.testing.assert_array_equal(a, np.round(a * pool.n_trials) / pool.n_trials)


def test_deterministic_per_index_whatever_came_first(pool: SynopsisPool) -> None:
    again = SynopsisPool(k=100, n_trials=100, size=2000, seed=20240522)
    np.testing.assert_array_equal(again.indptr, pool.indptr)
    np.testing.assert_array_equal(again.indices, pool.indices)
    np.testing.assert_array_equal(again.counts, pool.counts)
    small = SynopsisPool(k=100, n_trials=100, size=10, seed=20240522)  # a prefix of the pool
    for j in (9, 3, 0):  # and one synopsis alone, out of order
        np.testing.assert_array_equal(small.synopsis(j), pool.synopsis(j))
        np.testing.assert_array_equal(
            synopsis_counts(20240522, j, 100, 100) / 100, pool.synopsis(j)
        )
    other = SynopsisPool(k=100, n_trials=100, size=10, seed=20240523)
    assert not np.array_equal(other.synopsis(0), pool.synopsis(0))
    assert other.fingerprint != small.fingerprint
    assert small.fingerprint == SynopsisPool(100, 100, 10, 20240522).fingerprint
    assert len(small.fingerprint) == 16


def test_same_synopses_in_another_process(pool: SynopsisPool) -> None:
    code = (
        "import sys; from privstream.mechanisms.dpi_pool import SynopsisPool;"
        "p = SynopsisPool(100, 100, 2000, 20240522);"
        "sys.stdout.write(p.fingerprint + ' ' + p.synopsis(1999).tobytes().hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    fingerprint, hexbytes = out.stdout.split()
    assert fingerprint == pool.fingerprint
    assert bytes.fromhex(hexbytes) == pool.synopsis(1999).tobytes()


def test_pickles_as_its_public_descriptor(pool: SynopsisPool) -> None:
    small = SynopsisPool(100, 100, 50, 3)
    data = pickle.dumps(small)
    assert len(data) < 300  # the four numbers, not the arrays
    back = pickle.loads(data)
    np.testing.assert_array_equal(back.counts, small.counts)
    assert back.fingerprint == small.fingerprint


def test_geometry_against_uniform(pool: SynopsisPool) -> None:
    """E‖A_i − u‖₁ = 2(1 − 1/k)^k exactly when n_trials = k (≈ 2/e; spec §3.2)."""
    u = np.full(pool.k, 1.0 / pool.k)
    d = pool.l1_errors(np.arange(pool.size), u)
    expected = 2.0 * (1.0 - 1.0 / pool.k) ** pool.k
    assert expected == pytest.approx(2 / math.e, abs=0.004)
    assert abs(d.mean() - expected) <= 4 * d.std(ddof=1) / math.sqrt(pool.size)


def test_l1_errors_match_dense(pool: SynopsisPool) -> None:
    rng = np.random.default_rng(5)
    y = rng.dirichlet(np.ones(pool.k))
    drawn = np.array([4, 4, 1999, 0, 77])
    dense = np.array([np.abs(y - pool.synopsis(j)).sum() for j in drawn])
    np.testing.assert_allclose(pool.l1_errors(drawn, y), dense, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="shape"):
        pool.l1_errors(drawn, y[:-1])
    with pytest.raises(ValueError, match=r"\[0, 2000\)"):
        pool.l1_errors([2000], y)


def test_mean_of_draws(pool: SynopsisPool) -> None:
    drawn = np.array([5, 9, 5, 1200])  # repeats allowed: counted twice
    expected = (2 * pool.synopsis(5) + pool.synopsis(9) + pool.synopsis(1200)) / 4
    release = pool.mean_of(drawn)
    np.testing.assert_allclose(release, expected, rtol=0, atol=1e-16)
    assert math.fsum(release) == pytest.approx(1.0, abs=1e-15)
    m = 4 * pool.n_trials  # every entry is the double nearest to an integer / (n_A·n_trials)
    np.testing.assert_array_equal(release, np.round(release * m) / m)


def test_mean_of_n_a_draws_is_a_finer_multinomial(pool: SynopsisPool) -> None:
    """The mean of n_A synopses ~ Multinomial(n_A·n_trials, u)/(n_A·n_trials) (spec §3.2)."""
    n_a = 20
    m = n_a * pool.n_trials
    groups = np.arange(pool.size).reshape(-1, n_a)
    u = np.full(pool.k, 1.0 / pool.k)
    d = np.array([np.abs(pool.mean_of(g) - u).sum() for g in groups])
    c = np.arange(m + 1)
    expected = pool.k * float(np.sum(binom.pmf(c, m, 1.0 / pool.k) * np.abs(c - m / pool.k))) / m
    assert abs(d.mean() - expected) <= 4 * d.std(ddof=1) / math.sqrt(len(d))


def test_large_pool_is_sparse_and_built_without_a_dense_matrix() -> None:
    """k = 10⁴, N = 6,500, n_trials = k: the build's peak is the sparse arrays + O(k) scratch."""
    k, size = 10_000, 6_500
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        big = SynopsisPool(k=k, n_trials=k, size=size, seed=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    nnz = int(big.indptr[-1])
    assert nnz <= size * min(k, k)
    # about 1 − (1 − 1/k)^k ≈ 63.2 % of the categories are hit per synopsis
    hit = 1 - (1 - 1 / k) ** k
    sd = math.sqrt(size * k * hit * (1 - hit))
    assert abs(nnz - size * k * hit) <= 4 * sd
    assert big.indices.dtype == np.uint16 and big.counts.dtype == np.uint8
    assert big.nbytes == 8 * (size + 1) + 3 * nnz  # ≈ 123 MB
    assert big.nbytes < size * k * 8 / 4  # a quarter of the dense float64 pool
    assert peak - big.nbytes <= 64 * k + 1_000_000  # scratch only: no N×k anywhere
