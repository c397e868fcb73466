"""ExSub, SaO2's ε-LDP mechanism for sparse ternary vectors (spec sao2 §4, §5.3).

A user holds ``R ∈ {−1, 0, 1}^D`` with at most ``s`` non-zeros, written as the symbol set
``S_R = {i₊ : R_i = 1} ∪ {i₋ : R_i = −1}`` and padded with ``+`` stubs on coordinates
``D .. D+s−1`` (0-based) to exactly ``s`` symbols, so ``d' = D + s`` (§4.1, erratum A7). The
user reports a set ``Z`` of exactly ``m`` signed symbols, at most one per coordinate, drawn with

    P[Z | R] = exp(ε·u(S_R, Z)) / Ω,   u = 0 if Z ∩ S_R ≠ ∅ else −1        (§4.2)

**Privacy.** ``Ω`` depends only on ``(d', s, ε, m)`` because ``|S_R| = s`` for every input, so
the probability of any output changes by at most ``e^ε`` between any two inputs: ExSub is
exactly ε-LDP for the whole vector (in SaO2: the user's whole horizon, §1.2). A report lists
its symbols in coordinate order, a function of the set ``Z`` alone (the offline sampler must not
reveal which symbols it drew as "trues"). The subgroup table is public and data-independent;
the draw from it uses the user's own randomness (erratum A5).

Everything here is vectorised over users: a batch of ``n`` users holds ``n·s`` input entries
and ``n·m`` report entries, never ``n·d'``. Exact integer binomials (``math.comb``) feed the
rates; ratios are exact int/int divisions, so no float binomial ever overflows (§4.7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.sao2_ternary import Ternary

Sampler = Literal["offline", "online"]
SAMPLERS: Final = ("offline", "online")
M_RULES: Final = ("argmin", "paper_closed_form")
IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

_CHUNK_ELEMENTS: Final = 1 << 22  # rows × width per chunk in the dense paths (memory bound)
ROW_CACHE_LIMIT: Final = 4096
"""Binomial rows ``C(a, ·)`` are cached up to this ``a`` (a row of ``a = 4096`` is ~8 MB)."""
EXHAUSTIVE_LIMIT: Final = 2048
"""``optimal_m`` searches every ``m`` exactly up to this ``d'``; above it a float screen of
every ``m`` picks the window that is then searched exactly (``optimal_m``)."""
SCREEN_TOLERANCE: Final = 1e-6


@lru_cache(maxsize=64)
def _binomial_row(a: int) -> tuple[int, ...]:
    """``C(a, 0..a)`` as exact integers (multiplicative recurrence; cached per ``a``)."""
    row = [1]
    for j in range(a):
        row.append(row[-1] * (a - j) // (j + 1))
    return tuple(row)


def _comb(a: int, b: int) -> int:
    """``C(a, b)``, 0 outside ``0 ≤ b ≤ a`` (spec §0); cached rows up to ``ROW_CACHE_LIMIT``."""
    if not 0 <= b <= a:
        return 0
    return _binomial_row(a)[b] if a <= ROW_CACHE_LIMIT else math.comb(a, b)


def _check_shape(d_prime: int, s: int, m: int) -> None:
    if not (1 <= s < d_prime):
        raise ValueError(f"ExSub needs 1 ≤ s < d' (got s = {s}, d' = {d_prime})")
    if not (1 <= m <= d_prime):
        raise ValueError(f"ExSub needs 1 ≤ m ≤ d' (got m = {m}, d' = {d_prime})")


def _check_eps(eps: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"ε must be a positive finite number, got {eps!r}")


# -- exact counts, rates and variances (spec §4.2, §4.5, §4.6) --------------------------------


@dataclass(frozen=True)
class ExSubCounts:
    """The exact integer counts of spec §4.2/§4.5 for ``(d', s, m)``.

    ``C1 = |𝒵^{m±}|``; ``C2`` outputs missing a given ``s``-set; ``A`` outputs holding a given
    symbol; ``Cf`` (``Cr``) those of them that also miss ``S_R`` when the symbol's coordinate
    is a zero (its reverse is in ``S_R``)."""

    C1: int
    C2: int
    A: int
    Cf: int
    Cr: int


@lru_cache(maxsize=4096)
def exsub_counts(d_prime: int, s: int, m: int) -> ExSubCounts:
    """The counts ``C1, C2, A, Cf, Cr`` of spec §4.2 and §4.5 (``C(d'−s, ·)``: erratum A1)."""
    _check_shape(d_prime, s, m)
    z = d_prime - s
    C1 = 2**m * _comb(d_prime, m)
    C2 = sum(_comb(s, k) * _comb(z, m - k) * 2 ** (m - k) for k in range(min(s, m) + 1))
    A = 2 ** (m - 1) * _comb(d_prime - 1, m - 1)
    Cf = sum(
        _comb(s, k) * _comb(z - 1, m - 1 - k) * 2 ** (m - 1 - k) for k in range(min(s, m - 1) + 1)
    )
    Cr = sum(
        _comb(s - 1, k) * _comb(z, m - 1 - k) * 2 ** (m - 1 - k)
        for k in range(min(s - 1, m - 1) + 1)
    )
    return ExSubCounts(C1, C2, A, Cf, Cr)


@dataclass(frozen=True)
class ExSubParams:
    """The public parameters of one ``(d', s, ε, m)``-ExSub (spec §4.5, §4.6, §5.1).

    ``omega`` is ``Ω/C1``; ``value_gap = p_t − p_r`` and ``freq_gap = p_t + p_r − 2p_f`` are
    computed from the counts without cancellation. ``V_*``/``F_*`` are the per-user,
    per-coordinate variances of the value/frequency estimators (Lemma B.1, erratum A11)."""

    d_prime: int
    s: int
    eps: float
    m: int
    omega: float
    p_t: float
    p_r: float
    p_f: float
    value_gap: float
    freq_gap: float
    V_nz: float
    V_z: float
    F_nz: float
    F_z: float

    @property
    def value_mse(self) -> float:
        """One user's total value MSE over all ``d'`` coordinates: ``s·V_nz + (d'−s)·V_z``."""
        return self.s * self.V_nz + (self.d_prime - self.s) * self.V_z

    @property
    def frequency_mse(self) -> float:
        """One user's total frequency MSE: ``s·F_nz + (d'−s)·F_z`` (inf if E2 is undefined)."""
        return self.s * self.F_nz + (self.d_prime - self.s) * self.F_z


@lru_cache(maxsize=4096)
def exsub_params(d_prime: int, s: int, eps: float, m: int) -> ExSubParams:
    """``Ω/C1``, the rates ``p_t, p_r, p_f`` and the variances of spec §4.5–§4.6."""
    _check_eps(eps)
    k = exsub_counts(d_prime, s, m)
    q, one_minus_q = math.exp(-eps), -math.expm1(-eps)  # e^{−ε}, 1 − e^{−ε}
    omega = (k.C1 - k.C2) / k.C1 + q * (k.C2 / k.C1)
    p_t = (k.A / k.C1) / omega
    p_r = ((k.A - k.Cr) / k.C1 + q * (k.Cr / k.C1)) / omega
    p_f = ((k.A - k.Cf) / k.C1 + q * (k.Cf / k.C1)) / omega
    gap = one_minus_q * (k.Cr / k.C1) / omega
    fgap = one_minus_q * ((2 * k.Cf - k.Cr) / k.C1) / omega
    both = p_t + p_r
    V_nz = (both - gap**2) / gap**2
    V_z = 2 * p_f / gap**2
    F_nz = both * (1 - both) / fgap**2 if fgap else math.inf
    F_z = 2 * p_f * (1 - 2 * p_f) / fgap**2 if fgap else math.inf
    return ExSubParams(d_prime, s, eps, m, omega, p_t, p_r, p_f, gap, fgap, V_nz, V_z, F_nz, F_z)


@dataclass(frozen=True)
class SubgroupLaw:
    """The public law of the subgroup ``(a, b)`` = (#trues, #reverses) of spec §4.3.

    ``pairs[k] = (a, b)`` in a fixed order (``a`` then ``b`` ascending), ``sizes[k] = l(a, b)``
    (exact), ``prob[k] = P(a, b)`` and ``cdf`` its running sum (last entry exactly 1)."""

    pairs: IntArray
    sizes: tuple[int, ...]
    prob: FloatArray
    cdf: FloatArray

    def draw(self, u: NDArray[np.float64] | float) -> IntArray:
        """Inverse-CDF draw: the row of ``pairs`` for each uniform in ``u`` (user's own rng)."""
        k = np.searchsorted(self.cdf, u, side="right")
        return self.pairs[np.minimum(k, len(self.sizes) - 1)]


@lru_cache(maxsize=1024)
def subgroup_law(d_prime: int, s: int, eps: float, m: int) -> SubgroupLaw:
    """``P(a, b) = l(a, b)·w(a)/Ω`` with ``w(0) = e^{−ε}``, else 1 (spec §4.3, erratum A2)."""
    k = exsub_counts(d_prime, s, m)
    omega = exsub_params(d_prime, s, eps, m).omega
    pairs, sizes, prob = [], [], []
    for a in range(min(s, m) + 1):
        for b in range(min(s, m) - a + 1):
            c = m - a - b
            size = _comb(s, a) * _comb(s - a, b) * _comb(d_prime - s, c) * 2**c
            if size == 0:
                continue
            pairs.append((a, b))
            sizes.append(size)
            prob.append((size / k.C1) * (1.0 if a else math.exp(-eps)) / omega)
    cdf = np.cumsum(prob)
    cdf[-1] = 1.0
    return SubgroupLaw(np.asarray(pairs, dtype=np.int64), tuple(sizes), np.asarray(prob), cdf)


def output_probability(d_prime: int, s: int, eps: float, m: int, a: int, b: int) -> float:
    """``P[Z | R]`` for an output with ``a`` trues and ``b`` reverses: ``P(a, b)/l(a, b)``.

    Every output of a subgroup is equally likely given the subgroup (Algorithm 3 samples
    uniformly inside it), so this is the sampler's exact law; it equals ``e^{ε·u}/Ω``."""
    law = subgroup_law(d_prime, s, eps, m)
    for row, (pa, pb) in enumerate(law.pairs.tolist()):
        if (pa, pb) == (a, b):
            return float(law.prob[row]) / law.sizes[row]
    return 0.0


# -- the choice of m (spec §4.7) --------------------------------------------------------------


@lru_cache(maxsize=512)
def optimal_m(d_prime: int, s: int, eps: float, objective: str = "value") -> int:
    """``m* = argmin_{1 ≤ m ≤ d'}`` of one user's total MSE (spec §4.7, normative rule).

    ``objective``: ``"value"`` (``s·V_nz + (d'−s)·V_z``) or ``"frequency"`` (the ``F`` terms).
    Exact counts for every ``m`` when ``d' ≤ EXHAUSTIVE_LIMIT``. For a larger ``d'`` (where the
    exact search costs ``O(d'²)`` big-integer work) a float (log-gamma) screen of every ``m``
    keeps the ``m`` within ``SCREEN_TOLERANCE`` (relative) of the screened minimum, two more on
    each side, and those are searched exactly (the screen agrees with the exact objective to
    ~1e−12 relative). Ties go to the smaller ``m``."""
    if objective not in ("value", "frequency"):
        raise ValueError(f"objective is 'value' or 'frequency', got {objective!r}")
    candidates = range(1, d_prime + 1)
    if d_prime > EXHAUSTIVE_LIMIT and objective == "value":
        screen = _value_mse_screen(d_prime, s, eps)
        near = np.flatnonzero(screen <= screen.min() * (1 + SCREEN_TOLERANCE)) + 1
        candidates = range(max(1, int(near.min()) - 2), min(d_prime, int(near.max()) + 2) + 1)
    best_m, best = 1, math.inf
    for m in candidates:
        p = exsub_params(d_prime, s, eps, m)
        total = p.value_mse if objective == "value" else p.frequency_mse
        if total < best:
            best_m, best = m, total
    return best_m


def _value_mse_screen(d_prime: int, s: int, eps: float) -> FloatArray:
    """Float (log-gamma) ``s·V_nz + (d'−s)·V_z`` for every ``m = 1..d'`` (screen only)."""
    from scipy.special import gammaln

    def log_comb(a: int, b: NDArray[np.float64]) -> FloatArray:
        ok = (b >= 0) & (b <= a)
        bb = np.where(ok, b, 0)
        return np.where(ok, gammaln(a + 1) - gammaln(bb + 1) - gammaln(a - bb + 1), -np.inf)

    m = np.arange(1, d_prime + 1, dtype=np.float64)[:, None]
    k = np.arange(s + 1, dtype=np.float64)[None, :]
    z, ln2 = d_prime - s, math.log(2.0)
    log_c1 = m * ln2 + log_comb(d_prime, m)

    def ratio(
        top: int, rest: int, off: int
    ) -> FloatArray:  # Σ_k C(top,k)C(rest,m−off−k)2^{m−off−k}/C1
        terms = log_comb(top, k) + log_comb(rest, m - off - k) + (m - off - k) * ln2 - log_c1
        return np.asarray(np.exp(terms).sum(axis=1), dtype=np.float64)

    q = -math.expm1(-eps)
    c2, cf, cr = ratio(s, z, 0), ratio(s, z - 1, 1), ratio(s - 1, z, 1)
    a = m[:, 0] / (2 * d_prime)  # A/C1
    omega = 1 - q * c2
    gap = q * cr / omega
    both = (2 * a - q * cr) / omega
    p_f = (a - q * cf) / omega
    with np.errstate(divide="ignore", invalid="ignore"):
        total = s * (both - gap**2) / gap**2 + z * 2 * p_f / gap**2
    return np.where(np.isfinite(total), total, np.inf)


def paper_closed_form_m(d_prime: int, s: int, eps: float, objective: str = "value") -> int:
    """The paper's ``m`` (Thm 5.3): ``⌈d'/(e^ε s + s + 2)⌉`` (value) or
    ``⌈d'/(e^ε s + 2s + 1)⌉`` (frequency); documented option ``m_rule="paper_closed_form"``."""
    denom = math.exp(eps) * s + (s + 2 if objective == "value" else 2 * s + 1)
    return max(1, min(d_prime, math.ceil(d_prime / denom)))


# -- input preparation (spec §4.1) ------------------------------------------------------------


def add_stubs(batch: Ternary, s: int) -> Ternary:
    """The batch padded with ``+`` stubs to exactly ``s`` symbols per user (spec §4.1, A7).

    The result has length ``D + s``: a user with ``s₀`` non-zeros gets stubs on coordinates
    ``D .. D+s−s₀−1`` (0-based). Refuses more than ``s`` non-zeros or a repeated coordinate."""
    present = batch.index >= 0
    held = present.sum(axis=1)
    if np.any(held > s):
        raise ValueError(f"a user holds {int(held.max())} non-zeros, more than s = {s}")
    _check_distinct(batch.index)
    index, sign = _compact(batch.index, batch.sign, s)
    empty = index < 0
    stub_rank = np.cumsum(empty, axis=1) - 1
    index[empty] = batch.D + stub_rank[empty]
    sign[empty] = 1
    return Ternary(batch.D + s, index, sign)


def _compact(index: IntArray, sign: NDArray[np.int8], s: int) -> tuple[IntArray, NDArray[np.int8]]:
    """The non-zeros moved to the first columns (stable), the arrays cut or padded to ``s``."""
    n, width = index.shape
    if width < s:
        index = np.concatenate([index, np.full((n, s - width), -1, dtype=np.int64)], axis=1)
        sign = np.concatenate([sign, np.zeros((n, s - width), dtype=np.int8)], axis=1)
    order = np.argsort(index < 0, axis=1, kind="stable")[:, :s]
    return (
        np.take_along_axis(index, order, axis=1).astype(np.int64),
        np.take_along_axis(sign, order, axis=1).astype(np.int8),
    )


def _check_distinct(index: IntArray) -> None:
    ordered = np.sort(index, axis=1)
    if np.any((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)):
        raise ValueError("a user's vector lists one coordinate twice")


def _prepared(batch: Ternary, d_prime: int, s: int) -> tuple[IntArray, NDArray[np.int8], int]:
    """The exactly-``s`` symbol arrays for ExSub and the length of the real part."""
    length = batch.D
    if length == d_prime - s:
        stubbed = add_stubs(batch, s)
        return stubbed.index, stubbed.sign, length
    if length == d_prime:
        if batch.s != s or np.any(batch.index < 0):
            raise ValueError("without stubs every user must hold exactly s non-zeros (spec §4.1)")
        _check_distinct(batch.index)
        return batch.index, batch.sign, batch.D
    raise ValueError(f"batch length {batch.D} is neither d' = {d_prime} nor d' − s = {d_prime - s}")


# -- sampling helpers -------------------------------------------------------------------------


def distinct_ranks(
    population: int, counts: IntArray, width: int, rng: np.random.Generator
) -> IntArray:
    """Row ``j``: ``counts[j]`` distinct uniform values of ``[0, population)``, sorted, then −1.

    Few draws per row: i.i.d. draws whose repeats are redrawn until distinct. The rule looks only
    at which draws are equal, so the law of the final set is invariant under any permutation of
    the population, hence uniform over ``counts[j]``-subsets. Dense rows (``4·width >
    population``) take the first ``counts[j]`` of a random permutation instead."""
    n = counts.size
    if width == 0 or n == 0:
        return np.full((n, width), -1, dtype=np.int64)
    col = np.arange(width)
    active = col < counts[:, None]
    if 4 * width > population:
        return _permutation_prefix(population, active, rng)
    x = np.where(active, rng.integers(0, population, (n, width)), population + col)
    x.sort(axis=1)
    rows = np.flatnonzero((x[:, 1:] == x[:, :-1]).any(axis=1))
    while rows.size:  # only rows holding a repeat are redrawn and re-sorted
        sub = x[rows]
        dup = np.zeros(sub.shape, dtype=bool)
        dup[:, 1:] = sub[:, 1:] == sub[:, :-1]
        sub[dup] = rng.integers(0, population, int(dup.sum()))
        sub.sort(axis=1)
        x[rows] = sub
        rows = rows[(sub[:, 1:] == sub[:, :-1]).any(axis=1)]
    return np.where(x < population, x, -1)


def _permutation_prefix(
    population: int, active: NDArray[np.bool_], rng: np.random.Generator
) -> IntArray:
    n, width = active.shape
    out = np.full((n, width), -1, dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // population)
    pad = ((0, 0), (0, max(0, width - population)))  # columns past the population: never active
    for lo in range(0, n, step):
        keys = rng.random((min(step, n - lo), population))
        first = (
            np.argpartition(keys, width - 1, axis=1)[:, :width]
            if width < population
            else np.pad(np.argsort(keys, axis=1), pad, constant_values=population)
        )
        first = np.sort(np.where(active[lo : lo + step], first, population), axis=1)
        out[lo : lo + step] = np.where(first < population, first, -1)
    return out


def zero_coordinates(support: IntArray, ranks: IntArray, d_prime: int) -> IntArray:
    """The coordinate of the ``ranks[j, k]``-th (0-based) zero coordinate of user ``j``.

    ``support`` holds each user's ``s`` distinct non-zero coordinates (stubs included); −1
    ranks stay −1. With ``q`` sorted, ``q'_k = q_k − k`` and the answer is
    ``z + #{k : q'_k ≤ z}``, found for all users at once by one ``searchsorted``."""
    n, s = support.shape
    q = np.sort(support, axis=1) - np.arange(s)
    rows = np.arange(n)[:, None] * (d_prime + 1)
    keys = (q + rows).ravel()
    below = np.searchsorted(keys, (np.maximum(ranks, 0) + rows).ravel(), side="right")
    below = below.reshape(ranks.shape) - np.arange(n)[:, None] * s
    return np.where(ranks >= 0, ranks + below, -1)


def _random_signs(shape: tuple[int, int], rng: np.random.Generator) -> NDArray[np.int8]:
    return (2 * rng.integers(0, 2, shape, dtype=np.int8) - 1).astype(np.int8)


# -- the two samplers (spec §4.3, §4.4) -------------------------------------------------------


def _assemble(
    sup_i: IntArray,
    sup_s: NDArray[np.int8],
    k: IntArray,
    zc: IntArray,
    zs: NDArray[np.int8],
    m: int,
) -> tuple[IntArray, NDArray[np.int8]]:
    """Each row's report: its first ``k`` support symbols then its zero symbols, coordinate-sorted.

    Sorting makes the report a function of the set ``Z`` alone (module docstring)."""
    s = sup_i.shape[1]
    p = np.arange(m)[None, :]
    src = np.where(p < k[:, None], p, s + p - k[:, None])
    out_i = np.take_along_axis(np.concatenate([sup_i, zc], axis=1), src, axis=1)
    out_s = np.take_along_axis(np.concatenate([sup_s, zs], axis=1), src, axis=1)
    order = np.argsort(out_i, axis=1)
    return np.take_along_axis(out_i, order, axis=1), np.take_along_axis(out_s, order, axis=1)


def offline_sample(
    index: IntArray, sign: NDArray[np.int8], params: ExSubParams, rng: np.random.Generator
) -> tuple[IntArray, NDArray[np.int8]]:
    """Algorithm 3, corrected (spec §4.3: A2 weight, A3 coordinates then signs), for all users.

    ``index``/``sign``: each user's exactly ``s`` symbols (stubs included). Draws the subgroup
    ``(a, b)``, a uniform ``(a+b)``-subset of the support (the first ``a`` kept, the rest
    reversed), and a uniform ``c``-subset of the ``d'−s`` zero coordinates with uniform signs."""
    n, s = index.shape
    d_prime, m = params.d_prime, params.m
    ab = subgroup_law(d_prime, s, params.eps, m).draw(rng.random(n))
    a, k = ab[:, 0], ab[:, 0] + ab[:, 1]
    order = np.argsort(rng.random((n, s)), axis=1)
    sup_i = np.take_along_axis(index, order, axis=1)
    sup_s = np.take_along_axis(sign, order, axis=1)
    sup_s = np.where(np.arange(s)[None, :] < a[:, None], sup_s, -sup_s).astype(np.int8)
    zc = zero_coordinates(index, distinct_ranks(d_prime - s, m - k, m, rng), d_prime)
    return _assemble(sup_i, sup_s, k, zc, _random_signs((n, m), rng), m)


def _selection_support(
    s: int, a: IntArray, b: IntArray, rng: np.random.Generator
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Algorithm 4 lines 11–15 for all users: which of the ``s`` support symbols (in stream
    order) are picked, and which of the picked are kept ("trues"), by selection sampling."""
    n = a.size
    need, trues = a + b, a.copy()
    picked = np.zeros((n, s), dtype=bool)
    kept = np.zeros((n, s), dtype=bool)
    u = rng.random((n, s, 2))
    for j in range(s):
        sel = u[:, j, 0] * (s - j) < need  # test first, then decrement (A4)
        keep = sel & (u[:, j, 1] * need < trues)
        picked[:, j], kept[:, j] = sel, keep
        need = need - sel
        trues = trues - keep
    return picked, kept


def _selection_ranks(
    population: int, c: IntArray, width: int, rng: np.random.Generator
) -> IntArray:
    """Algorithm 4 lines 8–10 for all users: selection sampling of ``c[j]`` of the zero
    coordinates, visited in stream order (rank 0, 1, …); the chosen ranks, then −1."""
    n = c.size
    out = np.full((n, width), -1, dtype=np.int64)
    fill = np.zeros(n, dtype=np.int64)
    rem = c.astype(np.int64).copy()
    rows = np.arange(n)
    block = max(1, _CHUNK_ELEMENTS // max(n, 1))
    for start in range(0, population, block):
        u = rng.random((n, min(block, population - start)))
        for j in range(u.shape[1]):
            sel = rows[u[:, j] * (population - start - j) < rem]
            out[sel, fill[sel]] = start + j
            fill[sel] += 1
            rem[sel] -= 1
    return out


def online_sample(
    index: IntArray, sign: NDArray[np.int8], params: ExSubParams, rng: np.random.Generator
) -> tuple[IntArray, NDArray[np.int8]]:
    """Algorithm 4, corrected (spec §4.4: A4 counters, A6, A9 offsets), for all users at once.

    Each user visits coordinates in stream order (stubs last); non-zeros and zeros run their own
    selection sampling with their own counters, so simulating the two streams one after the
    other gives exactly the law of the interleaved device loop (``OnlineExSubUser``)."""
    n, s = index.shape
    d_prime, m = params.d_prime, params.m
    ab = subgroup_law(d_prime, s, params.eps, m).draw(rng.random(n))
    a, b = ab[:, 0], ab[:, 1]
    order = np.argsort(index, axis=1)
    sup_i = np.take_along_axis(index, order, axis=1)
    sup_s = np.take_along_axis(sign, order, axis=1)
    picked, kept = _selection_support(s, a, b, rng)
    sup_s = np.where(kept, sup_s, -sup_s).astype(np.int8)
    first = np.argsort(~picked, axis=1, kind="stable")  # picked symbols first, stream order
    sup_i = np.take_along_axis(sup_i, first, axis=1)
    sup_s = np.take_along_axis(sup_s, first, axis=1)
    ranks = _selection_ranks(d_prime - s, m - a - b, m, rng)
    zc = zero_coordinates(index, ranks, d_prime)
    return _assemble(sup_i, sup_s, a + b, zc, _random_signs((n, m), rng), m)


class OnlineExSubUser:
    """One device's Algorithm 4 (spec §4.4, corrected): O(1) state ``a, b, c, remNZ, remZ``.

    The subgroup is drawn at construction from the public table with the user's own uniform
    source (``uniform() ∈ [0, 1)``, A5). ``block(values)`` takes the next coordinates of the
    ternary vector in stream order and returns the symbols ``(coordinate, sign)`` to emit now
    (possibly none; the emission schedule is data-independent). ``finish()`` runs the ``s``
    stub coordinates and returns their symbols, which need not be sent (post-processing).

    Privacy: the emitted symbols over the horizon are one ExSub output ``Z``, ε-LDP."""

    def __init__(self, params: ExSubParams, uniform: Callable[[], float]) -> None:
        law = subgroup_law(params.d_prime, params.s, params.eps, params.m)
        a, b = (int(v) for v in law.draw(np.array([uniform()]))[0])
        self.params, self._uniform = params, uniform
        self._a, self._b, self._c = a, b, params.m - a - b
        self._rem_nz, self._rem_z, self._next = params.s, params.d_prime - params.s, 0

    def block(self, values: Sequence[int]) -> list[tuple[int, int]]:
        """Symbols for the next ``len(values)`` coordinates (each value in {−1, 0, 1})."""
        out: list[tuple[int, int]] = []
        for v in values:
            k, self._next = self._next, self._next + 1
            if v == 0:
                if self._rem_z <= 0:
                    raise ValueError("more zero coordinates than d' − s")
                if self._uniform() * self._rem_z < self._c:
                    out.append((k, 1 if self._uniform() < 0.5 else -1))
                    self._c -= 1
                self._rem_z -= 1
            else:
                if self._rem_nz <= 0:
                    raise ValueError("more than s non-zeros: clip the stream first (spec §3.1)")
                need = self._a + self._b
                if self._uniform() * self._rem_nz < need:
                    true = self._uniform() * need < self._a
                    out.append((k, v if true else -v))
                    self._a, self._b = (self._a - 1, self._b) if true else (self._a, self._b - 1)
                self._rem_nz -= 1
        return out

    def finish(self) -> list[tuple[int, int]]:
        """The stub coordinates: ``s − s₀`` ``+`` stubs, then ``s₀`` zeros (spec §4.4)."""
        if self._next != self.params.d_prime - self.params.s:
            raise ValueError("finish() before every real coordinate was processed")
        return self.block([1] * self._rem_nz + [0] * self._rem_z)


# -- the mechanism and its estimators (spec §4.5) ---------------------------------------------


@dataclass(frozen=True)
class ExSubReports:
    """``n`` users' ExSub reports: ``index[j]`` the ``m`` coordinates of ``Z_j`` (sorted, in
    ``[0, d')``, stubs included), ``sign[j]`` their signs; ``D`` the real (non-stub) length."""

    D: int
    d_prime: int
    index: NDArray[np.int32]
    sign: NDArray[np.int8]

    @property
    def n(self) -> int:
        return int(self.index.shape[0])


class ExSub:
    """``(d', s, ε, m)``-ExSub as a ``TernaryMechanism`` (spec §4): exactly ε-LDP per user.

    ``m=None`` takes ``m*`` (``optimal_m``, §4.7); ``m_rule="paper_closed_form"`` the paper's
    closed form. ``sampler`` picks the simulation of the same law: ``"offline"`` (Algorithm 3)
    or ``"online"`` (Algorithm 4, what devices run). Batches of length ``d' − s`` get stubs
    (§4.1); batches of length ``d'`` must hold exactly ``s`` non-zeros per user (offline
    benchmarks). Either way the mechanism can run in stream order, hence ``online = True``.
    Costs per user: offline ``O(s log s + m log m)`` (vectorised), online ``O(d')`` as on the
    device, so simulate a large ``d'`` with the offline sampler (same law)."""

    name = "ExSub"
    online = True

    def __init__(
        self,
        d_prime: int,
        s: int,
        eps: float,
        m: int | None = None,
        sampler: Sampler = "offline",
        m_rule: str = "argmin",
    ) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler is one of {SAMPLERS}, got {sampler!r}")
        if m_rule not in M_RULES:
            raise ValueError(f"m_rule is one of {M_RULES}, got {m_rule!r}")
        if m is None:
            closed = m_rule == "paper_closed_form"
            m = paper_closed_form_m(d_prime, s, eps) if closed else optimal_m(d_prime, s, eps)
        self.params = exsub_params(d_prime, s, float(eps), m)
        self.sampler: Sampler = sampler

    @property
    def d_prime(self) -> int:
        return self.params.d_prime

    @property
    def s(self) -> int:
        return self.params.s

    @property
    def m(self) -> int:
        return self.params.m

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> ExSubReports:
        """Every user's report ``Z`` (one ε-LDP draw per user)."""
        index, sign, D = _prepared(batch, self.d_prime, self.s)
        draw = offline_sample if self.sampler == "offline" else online_sample
        n, m = index.shape[0], self.m
        out_i = np.empty((n, m), dtype=np.int32)
        out_s = np.empty((n, m), dtype=np.int8)
        step = max(1, _CHUNK_ELEMENTS // (4 * (m + self.s)))  # bounds the temporaries
        for lo in range(0, n, step):
            rows = slice(lo, min(lo + step, n))
            out_i[rows], out_s[rows] = draw(index[rows], sign[rows], self.params, rng)
        return ExSubReports(D, self.d_prime, out_i, out_s)

    def counts(self, reports: ExSubReports) -> tuple[IntArray, IntArray]:
        """``(c₊, c₋)``: how many reports hold ``i₊`` / ``i₋``, for all ``d'`` coordinates."""
        plus = reports.sign > 0
        c_plus = np.bincount(reports.index[plus], minlength=self.d_prime)
        c_minus = np.bincount(reports.index[~plus], minlength=self.d_prime)
        return c_plus.astype(np.int64), c_minus.astype(np.int64)

    def estimate(self, reports: ExSubReports, n: int) -> FloatArray:
        """E1, the unbiased mean value ``(1/n) Σ_j R_j`` of the ``D`` real coordinates."""
        return value_estimate(*self.counts(reports), n, self.params)[: reports.D]

    def estimate_frequency(self, reports: ExSubReports, n: int) -> FloatArray:
        """E2, the unbiased mean frequency ``(1/n) Σ_j |R_j|`` of the ``D`` real coordinates."""
        return frequency_estimate(*self.counts(reports), n, self.params)[: reports.D]


def value_estimate(c_plus: IntArray, c_minus: IntArray, n: int, params: ExSubParams) -> FloatArray:
    """(E1) ``(c₊ − c₋) / (n (p_t − p_r))`` (spec §4.5)."""
    if n <= 0:
        raise ValueError("the estimate needs n ≥ 1 enrolled users")
    return np.asarray(c_plus - c_minus, dtype=np.float64) / (n * params.value_gap)


def frequency_estimate(
    c_plus: IntArray, c_minus: IntArray, n: int, params: ExSubParams
) -> FloatArray:
    """(E2) ``(c₊ + c₋ − 2 n p_f) / (n (p_t + p_r − 2 p_f))`` (spec §4.5, erratum A10)."""
    if n <= 0:
        raise ValueError("the estimate needs n ≥ 1 enrolled users")
    if params.freq_gap == 0:
        raise ValueError("p_t + p_r = 2 p_f here: the frequency estimator is undefined")
    total = np.asarray(c_plus + c_minus, dtype=np.float64)
    return (total - 2 * n * params.p_f) / (n * params.freq_gap)


# -- post-processing (spec §5.3); free of privacy cost ---------------------------------------


def project_capped_simplex(v: FloatArray, k: float, *, equality: bool = True) -> FloatArray:
    """``argmin ‖y − v‖₂`` over ``{0 ≤ y ≤ 1, Σy = k}`` (``Σy ≤ k`` when not ``equality``).

    Bisection on the shift ``τ`` of ``g(τ) = Σ clip(v − τ, 0, 1)`` (monotone) to machine
    precision (spec §5.3, PROJECT-CAPPED-SIMPLEX)."""
    v = np.asarray(v, dtype=np.float64)
    if not 0 <= k <= v.size:
        raise ValueError(f"the capped simplex needs 0 ≤ k ≤ {v.size}, got {k}")
    if not equality and np.clip(v, 0.0, 1.0).sum() <= k:
        return np.clip(v, 0.0, 1.0)
    lo, hi = float(v.min()) - 1.0, float(v.max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if np.clip(v - mid, 0.0, 1.0).sum() > k else (lo, mid)
    return np.clip(v - 0.5 * (lo + hi), 0.0, 1.0)


def postprocess_projection(
    value: FloatArray, frequency: FloatArray, s: int, *, stubs: bool
) -> FloatArray:
    """The capped-simplex post-processing of spec §5.3 (A21 reading, authors' decoder).

    ``p̂± = (Ř ± R̂̄)/2`` (E3) for every coordinate; the ``2d'`` vector ``(p̂₊, p̂₋)`` is projected
    onto ``{y ∈ [0,1]^{2d'} : Σy = s}`` when the stub coordinates are included (``stubs``), or
    ``Σy ≤ s`` without them; returns ``y₊ − y₋``. Post-processing: no privacy cost."""
    value, frequency = np.asarray(value, dtype=np.float64), np.asarray(frequency, dtype=np.float64)
    stacked = np.concatenate([(frequency + value) / 2, (frequency - value) / 2])
    y = project_capped_simplex(stacked, float(s), equality=stubs)
    return y[: value.size] - y[value.size :]


def clip_unit(value: FloatArray) -> FloatArray:
    """SUCCINCT's post-processing (spec §5.3): each mean residue value clipped to ``[−1, 1]``."""
    return np.clip(np.asarray(value, dtype=np.float64), -1.0, 1.0)


# -- Gaussian error model (spec §8.2 metrics, §11 analytic values) ----------------------------


def expected_l1(sd: NDArray[np.float64]) -> float:
    """``E Σ_k |X_k|`` for centred Gaussians of standard deviations ``sd``: ``√(2/π)·Σ sd``."""
    return float(math.sqrt(2 / math.pi) * np.sum(sd))


def expected_max_abs(sd: NDArray[np.float64], grid: int = 4000) -> float:
    """``E max_k |X_k|`` for independent centred Gaussians of standard deviations ``sd``.

    ``∫₀^∞ (1 − Π_k erf(x/(σ_k√2))) dx`` by the trapezoid rule on ``[0, 12·max σ]`` (the
    integrand is below 1e−30 past it); equal ``σ`` are grouped, so large arrays are cheap."""
    from scipy.special import erf

    values, counts = np.unique(np.asarray(sd, dtype=np.float64).ravel(), return_counts=True)
    values, counts = values[values > 0], counts[values > 0]
    if values.size == 0:
        return 0.0
    x = np.linspace(0.0, 12.0 * values.max(), grid + 1)[1:]
    log_cdf = np.zeros_like(x)
    for lo in range(0, values.size, 256):
        v, c = values[lo : lo + 256], counts[lo : lo + 256]
        log_cdf += (
            np.log(np.maximum(erf(x[:, None] / (v[None, :] * math.sqrt(2))), 1e-300)) * c
        ).sum(axis=1)
    tail = -np.expm1(log_cdf)
    step = x[1] - x[0]
    return float(step * (0.5 * 1.0 + tail[:-1].sum() + 0.5 * tail[-1]))


def offline_expected_errors(
    d_prime: int, s: int, eps: float, n: int, m: int | None = None
) -> tuple[float, float]:
    """The analytic ``(TVE, MAE)`` of the population mean of ``n`` users, each with exactly ``s``
    non-zeros on uniform coordinates (spec §8.1 offline synthetic, §11.4 Fig. 3/5 values).

    Per coordinate ``Var = (f·V_nz + (1−f)·V_z)/n`` with ``f = s/d'``; Gaussian model, the
    within-user covariance ignored (§4.6). ``TVE = Σ_i E|err_i|``, ``MAE = E max_i |err_i|``."""
    m = optimal_m(d_prime, s, eps) if m is None else m
    p = exsub_params(d_prime, s, eps, m)
    f = s / d_prime
    sd = np.full(d_prime, math.sqrt((f * p.V_nz + (1 - f) * p.V_z) / n))
    return expected_l1(sd), expected_max_abs(sd)
