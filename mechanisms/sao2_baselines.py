"""The offline baselines of SaO2 — Collision, SUCCINCT, FutureRand (spec sao2 §6.1) — and the
samplers every SaO2 baseline shares (keyed hashing, uniform and ternary noise, binary and
generalised randomized response, slot picks, sign reports).

Each baseline is a ``TernaryMechanism`` (``sao2_ternary``): it randomises ``n`` users' sparse
ternary vectors of length ``D`` with at most ``s`` non-zeros, vectorised over users, one report
per user and horizon, and estimates the population mean ``(1/n) Σ_j R_j``. None of the three can
be run in stream order as written (``online = False``): Collision and SUCCINCT need every
non-zero before the first draw. The streamable seven live in ``sao2_online_baselines``, with the
``BASELINES`` registry of all ten.

A user's "slots" are the ``s`` columns of the ``Ternary`` arrays; an empty slot (index −1) plays
the spec's *stub* (§4.1): a mechanism that picks uniformly among the ``s`` slots picks each real
non-zero with probability ``1/s`` whatever ``s₀``, exactly as the spec's stream-order selection
sampling with stubs last does; a stub's own output is never sent (post-processing).

Randomness: every draw comes from the ``np.random.Generator`` passed in (on a device, the keyed
per-slot randomness of ``privstream.mechanisms.seeding``). The hashing seeds of Collision and
SUCCINCT are data-independent draws sent with the report, so the server can recompute the hash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.noise import discrete_laplace, public_scale
from privstream.mechanisms.sao2_ternary import Ternary

_CHUNK: Final = 1 << 16  # array elements per chunk of users (bounds every temporary)
_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)
_MIX1: Final = np.uint64(0xBF58476D1CE4E5B9)
_MIX2: Final = np.uint64(0x94D049BB133111EB)

Signs = NDArray[np.int8]


# ---- shared samplers ---------------------------------------------------------------------


def check_params(D: int, s: int, eps: float) -> None:
    """Refuse a domain, sparsity or budget no baseline can run with."""
    if D < 1 or s < 1:
        raise ValueError(f"need D >= 1 and s >= 1, got D={D}, s={s}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"ε must be a positive finite number, got {eps!r}")


def check_batch(batch: Ternary, D: int, s: int) -> Ternary:
    """The batch in the mechanism's domain, widened to exactly ``s`` slots (the extra ones are
    stubs); a batch of another ``D`` or wider than ``s`` is refused (it would break ε)."""
    if batch.D != D or batch.s > s:
        raise ValueError(f"batch has D={batch.D}, s={batch.s}; the mechanism needs D={D}, s<={s}")
    if batch.s == s:
        return batch
    pad = ((0, 0), (0, s - batch.s))
    index = np.pad(batch.index, pad, constant_values=-1)
    return Ternary(D, index, np.pad(batch.sign, pad, constant_values=0))


def row_chunks(n: int, width: int) -> Iterator[slice]:
    """Slices of users whose ``(rows, width)`` temporaries stay under ``_CHUNK`` elements."""
    step = max(1, _CHUNK // max(width, 1))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def random_seeds(rng: np.random.Generator, n: int) -> NDArray[np.uint64]:
    """``n`` uniform 64-bit hashing seeds (data-independent; sent with the report)."""
    return rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)


def keyed_hash(seeds: NDArray[np.uint64], keys: NDArray[np.int64]) -> NDArray[np.uint64]:
    """SplitMix64 of ``seed + (key + 1)·γ`` (broadcasting): a public hash family whose values at
    distinct keys behave as independent uniform 64-bit words over a uniform seed."""
    with np.errstate(over="ignore"):
        x = seeds + (keys.astype(np.uint64) + np.uint64(1)) * _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
    return np.asarray(x ^ (x >> np.uint64(31)), dtype=np.uint64)


def hash_below(words: NDArray[np.uint64], t: int) -> NDArray[np.int64]:
    """Map hash words to ``[0, t)`` (multiply-shift on the top 32 bits; bias ≤ t/2³²)."""
    return ((words >> np.uint64(32)) * np.uint64(t) >> np.uint64(32)).astype(np.int64)


def ternary_noise(rng: np.random.Generator, shape: tuple[int, int], b: float) -> Signs:
    """Entries ``+1`` and ``−1`` with probability ``b/2`` each, else ``0`` (``b = 1``: uniform ±1)."""
    out = np.empty(shape, dtype=np.int8)
    for rows in row_chunks(*shape):
        size = (rows.stop - rows.start, shape[1])
        if b == 1.0:
            out[rows] = rng.integers(0, 2, size=size, dtype=np.int8) * 2 - 1
        else:
            u = rng.random(size)
            out[rows] = (u < b / 2).astype(np.int8) - ((u >= b / 2) & (u < b)).astype(np.int8)
    return out


def keep_sign(rng: np.random.Generator, signs: NDArray[np.int8], keep: float) -> Signs:
    """Binary randomized response on signs: each kept with probability ``keep``, else negated."""
    flip = rng.random(signs.shape) >= keep
    return np.where(flip, -signs, signs).astype(np.int8)


def grr_keep(
    rng: np.random.Generator, values: NDArray[np.int64], k: int, keep: float
) -> NDArray[np.int64]:
    """Generalised randomized response on ``{0..k−1}``: each value kept with probability
    ``keep``, else replaced by a uniform one of the other ``k − 1`` values."""
    other = rng.integers(0, k - 1, size=values.shape)
    other = other + (other >= values)
    return np.where(rng.random(values.shape) < keep, values, other).astype(np.int64)


def pick_slot(rng: np.random.Generator, batch: Ternary) -> tuple[NDArray[np.int64], Signs]:
    """One uniform slot of ``s`` per user: its coordinate (−1 for a stub) and sign."""
    rows = np.arange(batch.n)
    slot = rng.integers(0, batch.s, size=batch.n)
    return batch.index[rows, slot], batch.sign[rows, slot]


def select_slots(rng: np.random.Generator, n: int, s: int, k: int) -> NDArray[np.bool_]:
    """A uniform ``k``-subset of the ``s`` slots per user, as an ``(n, s)`` mask."""
    if k >= s:
        return np.ones((n, s), dtype=bool)
    keys = rng.random((n, s))
    return np.asarray(keys < np.partition(keys, k, axis=1)[:, k : k + 1])


def sign_report(
    rng: np.random.Generator, batch: Ternary, chosen: NDArray[np.bool_], agree: NDArray[np.bool_]
) -> Signs:
    """``(n, D)`` signs: uniform ±1, except at each chosen real non-zero ``(j, k)``, where the
    report is the non-zero's sign if ``agree[j, k]`` and its negation otherwise."""
    z = ternary_noise(rng, (batch.n, batch.D), 1.0)
    rows, slots = np.nonzero(chosen & (batch.index >= 0))
    signs = batch.sign[rows, slots]
    z[rows, batch.index[rows, slots]] = np.where(agree[rows, slots], signs, -signs)
    return z


def column_sums(reports: Signs) -> NDArray[np.float64]:
    """Per-coordinate sums of ``(n, D)`` int8 reports (chunked, exact in int64)."""
    total = np.zeros(reports.shape[1], dtype=np.int64)
    for rows in row_chunks(reports.shape[0], reports.shape[1]):
        total += reports[rows].sum(axis=0, dtype=np.int64)
    return total.astype(np.float64)


def check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"an estimate needs n >= 1 reports, got {n}")


# ---- Collision ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SeededReports:
    """Per user: the hashing seed and the reported value (Collision: a bucket; SUCCINCT: ṽ)."""

    seed: NDArray[np.uint64]
    value: NDArray[np.int64] | NDArray[np.float64]


class Collision:
    """Collision [40] (spec sao2 §6.1; authors' code [C]): hash the user's signed symbols into
    ``t = ⌊s·e^ε + 2s − 1⌋`` buckets with a fresh public hash ``H_seed`` and report one bucket,
    each hit bucket with probability ``e^ε/N`` (``N = s·e^ε + t − s``), the rest sharing what is
    left. **ε-LDP**: for any fixed seed every bucket's probability lies in ``[1/N, e^ε/N]``
    whatever the input (``c ≤ s`` hits), and the seed is data-independent. Not online: the
    hits must all be known before the draw.

    Estimator (unbiased): a symbol of the user is hit with probability ``e^ε/N``, any other
    with ``1/t`` (its hash is uniform and independent of the draw), so
    ``f̂_σ = (Σ hit_σ − n/t) / (n(e^ε/N − 1/t))`` and ``R̂_i = f̂_{i₊} − f̂_{i₋}``. Unlike the
    authors' code no stub symbols are hashed: they change neither the rates nor ε.
    """

    name: str = "Collision"
    online: bool = False

    def __init__(self, D: int, s: int, eps: float) -> None:
        check_params(D, s, eps)
        self.D, self.s, self.eps = D, s, eps
        self.t = math.floor(s * math.exp(eps) + 2 * s - 1)
        self.N = s * math.exp(eps) + self.t - s
        self.p_true = math.exp(eps) / self.N
        self.p_false = 1.0 / self.t

    def bucket_law(self, hits: int) -> tuple[float, float]:
        """(probability of each hit bucket, of each other bucket) for ``hits`` distinct hits."""
        miss = (self.N - hits * math.exp(self.eps)) / ((self.t - hits) * self.N)
        return self.p_true, miss

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> SeededReports:
        batch = check_batch(batch, self.D, self.s)
        seeds = random_seeds(rng, batch.n)
        symbols = 2 * batch.index + (batch.sign < 0)
        buckets = hash_below(keyed_hash(seeds[:, None], symbols), self.t)
        return SeededReports(seeds, self.draw(np.where(batch.index >= 0, buckets, -1), rng))

    def draw(self, buckets: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
        """One reported bucket per row of hit buckets (−1: no symbol), by the bucket law."""
        n, t = buckets.shape[0], self.t
        srt = np.sort(buckets, axis=1)
        fresh = srt >= 0
        fresh[:, 1:] &= srt[:, 1:] != srt[:, :-1]
        hits = np.sort(np.where(fresh, srt, t), axis=1)  # distinct hits first, then t
        c = fresh.sum(axis=1)
        take_hit = rng.random(n) < c * self.p_true
        which = np.minimum((rng.random(n) * c).astype(np.int64), np.maximum(c - 1, 0))
        miss = (rng.random(n) * (t - c)).astype(np.int64)  # uniform rank among the misses
        for col in range(hits.shape[1]):  # the rank-th bucket that is not a hit
            miss += hits[:, col] <= miss
        return np.asarray(np.where(take_hit, hits[np.arange(n), which], miss), dtype=np.int64)

    def estimate(self, reports: SeededReports, n: int) -> NDArray[np.float64]:
        check_n(n)
        symbols = np.arange(2 * self.D, dtype=np.int64)
        counts = np.zeros(2 * self.D)
        for rows in row_chunks(reports.seed.size, 2 * self.D):
            buckets = hash_below(keyed_hash(reports.seed[rows, None], symbols), self.t)
            counts += (buckets == np.asarray(reports.value[rows])[:, None]).sum(axis=0)
        f = (counts - n * self.p_false) / (n * (self.p_true - self.p_false))
        return np.asarray(f[0::2] - f[1::2], dtype=np.float64)


# ---- SUCCINCT ----------------------------------------------------------------------------


class Succinct:
    """SUCCINCT [53] (spec sao2 §6.1; authors' code [C]): the user weighs each coordinate with
    a public pseudo-random sign ``σ_i = ±1`` (``H_seed``), sums ``v = Σ_i σ_i R_i``, clips it to
    ``[−Δ, Δ]`` with ``Δ = √(s ln n)/2.5`` and adds Laplace noise of scale ``2Δ/ε``.
    **ε-LDP**: the clipped sum has sensitivity ``2Δ`` and the seed is data-independent; the
    noise is the exact discrete Laplace on a grid of ``1/GRID`` (``Δ`` rounded down to it), so
    no floating-point draw is involved. Not online: ``v`` needs every non-zero first.

    Estimator ``R̂_i = (1/n) Σ_users σ_i ṽ``. **Biased by design** (spec §4.8): when clipping
    acts (``Δ < s``, the default for ``n < e^{6.25 s}``) the estimate shrinks towards 0; it is
    unbiased only when ``Δ ≥ s``. ``n`` in ``Δ`` is ``population`` if given, else the batch's
    size; ``delta`` overrides ``Δ``. The paper's post-processing (clip each mean to
    ``[−1, 1]``, §5.3) is left to the caller.
    """

    name: str = "SUCCINCT"
    online: bool = False

    def __init__(
        self, D: int, s: int, eps: float, population: int | None = None, delta: float | None = None
    ) -> None:
        check_params(D, s, eps)
        if delta is not None and not delta > 0:
            raise ValueError(f"the clipping bound Δ must be positive, got {delta!r}")
        self.D, self.s, self.eps = D, s, eps
        self.population, self.delta = population, delta

    def clip_bound(self, n: int) -> float:
        """``Δ`` for a population of ``n`` users (``delta`` when given)."""
        if self.delta is not None:
            return self.delta
        n = self.population or n
        if n < 2:
            raise ValueError("SUCCINCT's default Δ = √(s ln n)/2.5 needs n >= 2 users")
        return math.sqrt(self.s * math.log(n)) / 2.5

    def weights(self, seeds: NDArray[np.uint64], coords: NDArray[np.int64]) -> Signs:
        """The public signs ``σ`` of coordinates ``coords`` under each seed (broadcasting)."""
        top = keyed_hash(seeds, coords) >> np.uint64(63)
        return (top.astype(np.int8) * 2 - 1).astype(np.int8)

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> SeededReports:
        batch = check_batch(batch, self.D, self.s)
        delta = self.clip_bound(batch.n)
        seeds = random_seeds(rng, batch.n)
        sigma = self.weights(seeds[:, None], np.maximum(batch.index, 0))
        v = (sigma.astype(np.int64) * batch.sign).sum(axis=1)
        # Laplace(2Δ/ε) on the public grid of GRID steps (exact integer sampler, never a float
        # draw): Δ rounded down to the grid keeps the clipped value on it, so ε-DP is exact.
        steps = math.floor(delta * GRID)
        scale = public_scale(2 * steps / self.eps)
        noise = discrete_laplace(rng, scale, batch.n)
        clipped = np.clip(v * GRID, -steps, steps)
        return SeededReports(seeds, (clipped + noise).astype(np.float64) / GRID)

    def estimate(self, reports: SeededReports, n: int) -> NDArray[np.float64]:
        check_n(n)
        coords = np.arange(self.D, dtype=np.int64)
        total = np.zeros(self.D)
        for rows in row_chunks(reports.seed.size, self.D):
            sigma = self.weights(reports.seed[rows, None], coords)
            total += np.asarray(reports.value[rows], dtype=np.float64) @ sigma
        return total / n


GRID = 256
"""SUCCINCT's noise grid: steps per unit (the discrete Laplace of scale ``2Δ/ε`` in steps)."""


# ---- FutureRand --------------------------------------------------------------------------


def futurerand_law(s: int, eps: float) -> tuple[NDArray[np.float64], float]:
    """The law of the number ``F`` of the ``s`` non-zeros FutureRand reports with the wrong sign,
    and the privacy loss it spends (spec sao2 §6.1, following [29]).

    Each non-zero is flipped with ``q = 1/(e^{ε'}+1)``, ``ε' = ε/(5√s)``: a pattern with ``f``
    flips has weight ``w_f = (1−q)^{s−f} q^f``. [29] truncates the outputs too close to the
    input (``f < LB = s·q − 2√s``) and too far (``f > UB = (s/ε') ln(2e^{ε'}/(e^{ε'}+1))``, where
    ``w`` falls below ``2^{−s}``): here by clipping ``w`` to ``[w(UB), w(max(LB, 0))]``. A
    pattern's probability is then ``w̃_f / Z``, so the loss over any two inputs is
    ``ln(max w̃ / min w̃) = ε'·(min(UB, s) − max(LB, 0)) ≤ ε``.
    """
    e1 = eps / (5 * math.sqrt(s))
    log_q, log_keep = -math.log1p(math.exp(e1)), e1 - math.log1p(math.exp(e1))
    lb = max(s * math.exp(log_q) - 2 * math.sqrt(s), 0.0)
    ub = min(s / e1 * math.log(2 * math.exp(e1) / (math.exp(e1) + 1)), float(s))
    f = np.arange(s + 1, dtype=np.float64)
    log_w = (s - f) * log_keep + f * log_q
    clipped = np.clip(log_w, (s - ub) * log_keep + ub * log_q, (s - lb) * log_keep + lb * log_q)
    log_comb = np.array(
        [math.lgamma(s + 1) - math.lgamma(k + 1) - math.lgamma(s - k + 1) for k in f]
    )
    log_p = log_comb + clipped
    law = np.exp(log_p - log_p.max())
    return law / law.sum(), float(clipped.max() - clipped.min())


class FutureRand:
    """FutureRand [29] (spec sao2 §6.1, "sketch, low priority"): every coordinate is reported as
    a sign; zero coordinates uniformly, and the ``s`` non-zeros (stubs included) with ``F`` of
    them wrong, ``F`` drawn from the truncated binomial-pattern law of ``futurerand_law`` and
    the wrong ones a uniform ``F``-subset. **ε-LDP**, in fact ``privacy_loss`` (about ``0.4ε``:
    [29]'s constants are loose): a report's probability is ``2^{−D}·w̃_F/Z`` for each input.

    Deviation from the spec's sketch (from the authors' code): re-randomising only the flipped
    coordinates when ``F`` leaves ``[LB, UB]`` is not ε-LDP (exact enumeration: a loss of
    about ``s`` nats, 7.9 at ``s = 8``, ε = 1), so the truncation clips the pattern weight
    instead. Estimator (unbiased, exact rates): a non-zero is reported right with probability
    ``1 − E[F]/s``, so ``R̂_i = z_i / (1 − 2E[F]/s)``. ``online = False`` as the spec lists it
    among the offline competitors (drawing ``F`` first, the wrong subset could be chosen by
    selection sampling in stream order, as [29] does).
    """

    name: str = "FutureRand"
    online: bool = False

    def __init__(self, D: int, s: int, eps: float) -> None:
        check_params(D, s, eps)
        self.D, self.s, self.eps = D, s, eps
        self.law, self.privacy_loss = futurerand_law(s, eps)
        self.gain = 1.0 - 2.0 * float(self.law @ np.arange(s + 1)) / s

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> Signs:
        batch = check_batch(batch, self.D, self.s)
        cdf = np.cumsum(self.law)
        wrong = np.minimum(np.searchsorted(cdf, rng.random(batch.n), side="right"), self.s)
        rank = np.argsort(np.argsort(rng.random((batch.n, self.s)), axis=1), axis=1)
        everyone = np.ones((batch.n, self.s), dtype=bool)
        return sign_report(rng, batch, everyone, rank >= wrong[:, None])

    def estimate(self, reports: Signs, n: int) -> NDArray[np.float64]:
        check_n(n)
        return column_sums(reports) / (n * self.gain)
