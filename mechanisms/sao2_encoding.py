"""SaO2's hierarchical encoding, reconstruction and level weights (spec sao2 §3, §5.2).

A user's binary stream ``x_1..x_T ∈ {0,1}^d`` (``x_0 = 0``) is held as its **change list**: the
flips ``(t, i)`` in stream order, at most a few per user, so ``n = 10⁶`` users cost ``n·K``
entries and never ``n·T·d`` (``Streams``; dense ``(n, T, d)`` arrays convert both ways for small
cases). Each user is clipped to ``s`` changes (CLIP-STREAM, §3.1), enrolled at one level ``h``
drawn independently of the data (§2), and encodes the level-``h`` residues
``R_{t',h} = x_{t'r^h} − x_{(t'−1)r^h}`` (Algorithm 1, §3.2) as one ternary vector of length
``d·T_h`` (coordinate ``(t'−1)·d + i``, 0-based ``t'·d + i``), which a ``TernaryMechanism``
randomises once per horizon. The server averages per level, rebuilds every ``x̂̄_t`` with
Algorithm 2 (§3.3) and answers ranges by prefix sums (§3.4).

**Privacy.** Nothing here adds noise: the guarantee is the mechanism's (ExSub: ε-LDP per user
over the whole horizon, §1.2). Clipping and encoding are local and deterministic; the level
draw and the emission schedule (``t ≡ 0 mod r^h``) do not depend on the data, so they may be
public. The server side (reconstruction, ranges, weights, analytic errors) is post-processing
of the mechanism's output. The number of clipped users is data-dependent: never publish it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.sao2_exsub import (
    ExSubParams,
    OnlineExSubUser,
    distinct_ranks,
    expected_l1,
    expected_max_abs,
    exsub_params,
    optimal_m,
)
from privstream.mechanisms.sao2_ternary import Ternary, TernaryMechanism

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
Weights = Sequence[float] | NDArray[np.float64]
_ROWS_PER_CHUNK: Final = 1 << 22  # rows × K² per chunk in ``residues`` (memory bound)
QUERY_FAMILIES: Final = ("mean", "prefix", "all")
WEIGHT_STRATEGIES: Final = (
    "uniform",
    "prefix-paper",
    "all-range-paper",
    "calibrated-paper",
    "optimal",
)


# -- the hierarchy (spec §3.2, erratum A14) ---------------------------------------------------


def num_levels(T: int, r: int) -> int:
    """``H = L + 1`` with ``L = ⌊log_r T⌋`` (exact integer arithmetic; A14)."""
    if T < 1 or r < 2:
        raise ValueError(f"the hierarchy needs T ≥ 1 and r ≥ 2 (got T = {T}, r = {r})")
    H, width = 1, r
    while width <= T:
        H, width = H + 1, width * r
    return H


def level_lengths(T: int, r: int) -> list[int]:
    """``T_h = ⌊T / r^h⌋`` for ``h = 0..L`` (A14: floor, as Algorithm 1 computes)."""
    return [T // r**h for h in range(num_levels(T, r))]


# -- users' streams as change lists -----------------------------------------------------------


def _padded(
    n: int, user: IntArray, *cols: NDArray[Any], width: int | None = None
) -> list[IntArray]:
    """Flat entries sorted by ``user`` laid out as ``(n, width)`` rows, −1 where none."""
    held = np.bincount(user, minlength=n)
    width = int(held.max(initial=0)) if width is None else width
    slot = np.arange(user.size) - np.repeat(np.cumsum(held) - held, held)
    out = []
    for col in cols:
        arr = np.full((n, width), -1, dtype=np.int64)
        arr[user, slot] = col
        out.append(arr)
    return out


@dataclass(frozen=True)
class Streams:
    """``n`` users' binary streams over ``T`` slots and ``d`` bits as change lists.

    ``time[j, k]`` (1-based slot) and ``coord[j, k]`` (0-based bit) give user ``j``'s ``k``-th
    flip, sorted by ``(t, i)``; −1 pads the rows. ``x_{j,t}[i]`` is the parity of the flips of
    ``i`` at slots ``≤ t``."""

    T: int
    d: int
    time: IntArray
    coord: IntArray

    def __post_init__(self) -> None:
        if self.time.shape != self.coord.shape or self.time.ndim != 2:
            raise ValueError("time and coord must be (n, K) arrays of one shape")
        present = self.time >= 1
        if np.any(present != (self.coord >= 0)) or np.any(present[:, 1:] & ~present[:, :-1]):
            raise ValueError("each row lists its flips first, then −1 in both arrays")
        if np.any(self.time > self.T) or np.any(self.coord >= self.d):
            raise ValueError(f"flips must lie in slots 1..{self.T} and bits 0..{self.d - 1}")
        key = self.time * self.d + self.coord
        if np.any((key[:, 1:] <= key[:, :-1]) & present[:, 1:]):
            raise ValueError("a row's flips must be distinct and sorted by (t, i)")

    @property
    def n(self) -> int:
        return int(self.time.shape[0])

    @classmethod
    def from_flips(
        cls, T: int, d: int, user: IntArray, time: IntArray, coord: IntArray, n: int
    ) -> Streams:
        """From flat flips ``(user, t, i)`` in any order (each at most once)."""
        order = np.lexsort((coord, time, user))
        t_pad, i_pad = _padded(n, user[order], time[order], coord[order])
        return cls(T, d, t_pad, i_pad)

    @classmethod
    def from_dense(cls, x: NDArray[Any]) -> Streams:
        """From dense ``(n, T, d)`` 0/1 streams (small cases)."""
        x = np.asarray(x, dtype=np.int8)
        n, T, d = x.shape
        change = np.diff(x, axis=1, prepend=np.zeros((n, 1, d), dtype=np.int8))
        j, t, i = np.nonzero(change)
        return cls.from_flips(T, d, j, t + 1, i, n)

    @classmethod
    def from_categorical(cls, cells: NDArray[Any], d: int) -> Streams:
        """From ``(n, T)`` categorical values in ``[0, d)`` (−1: none), one-hot per slot.

        A move from cell a to cell b flips a and b; the first value flips its own bit."""
        cells = np.asarray(cells, dtype=np.int64)
        n, T = cells.shape
        prev = np.concatenate([np.full((n, 1), -1, dtype=np.int64), cells[:, :-1]], axis=1)
        moved = prev != cells
        users, times, coords = [], [], []
        for side in (prev, cells):
            j, t = np.nonzero(moved & (side >= 0))
            users.append(j)
            times.append(t + 1)
            coords.append(side[j, t])
        flat = [np.concatenate(part) for part in (users, times, coords)]
        return cls.from_flips(T, d, flat[0], flat[1], flat[2], n=n)

    def dense(self) -> NDArray[np.int8]:
        """The ``(n, T, d)`` 0/1 streams (tests and small cases only)."""
        change = np.zeros((self.n, self.T + 1, self.d), dtype=np.int8)
        j, k = np.nonzero(self.time >= 1)
        change[j, self.time[j, k], self.coord[j, k]] = 1
        return (np.cumsum(change, axis=1, dtype=np.int8)[:, 1:] % 2).astype(np.int8)

    def changes(self) -> IntArray:
        """Each user's number of flips (internal: never publish it for real users)."""
        return np.asarray((self.time >= 1).sum(axis=1), dtype=np.int64)


def synthetic_streams(n: int, d: int, T: int, s: int, rng: np.random.Generator) -> Streams:
    """Spec §8.1 online synthetic: each user flips ``s`` distinct ``(i, t)`` cells chosen
    uniformly among the ``d·T``, so its level-0 residues hold exactly ``s`` non-zeros."""
    cells = distinct_ranks(d * T, np.full(n, s, dtype=np.int64), s, rng)
    time, coord = cells // d + 1, cells % d
    order = np.argsort(time * d + coord, axis=1)
    return Streams(T, d, np.take_along_axis(time, order, 1), np.take_along_axis(coord, order, 1))


def clip_stream(streams: Streams, s: int) -> Streams:
    """CLIP-STREAM (spec §3.1) for every user: at most ``s`` changes.

    While budget remains, ``x̃`` follows ``x`` exactly; the ``s``-th accepted flip (in ``(t, i)``
    order) exhausts the budget and ``x̃`` freezes. So ``x̃``'s change list is the first ``s``
    flips, and every level's residue vector has at most ``s`` non-zeros."""
    if s < 1:
        raise ValueError(f"the change bound s must be ≥ 1, got {s}")
    return Streams(streams.T, streams.d, streams.time[:, :s].copy(), streams.coord[:, :s].copy())


# -- Algorithm 1: residues at level h (spec §3.2) ---------------------------------------------


def residues(streams: Streams, h: int, r: int, width: int | None = None) -> Ternary:
    """Every user's level-``h`` residues ``R_{t',h} = x_{t'r^h} − x_{(t'−1)r^h}``, flattened to
    one ternary vector of length ``D = d·T_h`` (0-based coordinate ``(t'−1)·d + i``).

    A coordinate is non-zero iff its bit flips an odd number of times inside the block, and
    its sign is the bit's value at the block's end (``+1``: 1). Flips after ``T_h·r^h`` (``T``
    not a power of ``r``) belong to no residue. ``width``: the batch's row width (default: the
    streams' row width, so every level of one population has the same width). Vectorised over
    users with ``O(K²)`` work per user of ``K`` flips (rows in chunks)."""
    T_h, span = streams.T // r**h, r**h
    K = streams.time.shape[1]
    w = K if width is None else width
    index = np.full((streams.n, w), -1, dtype=np.int64)
    sign = np.zeros((streams.n, w), dtype=np.int8)
    step = max(1, _ROWS_PER_CHUNK // max(K * K, 1))
    for lo in range(0, streams.n, step):
        rows = slice(lo, min(lo + step, streams.n))
        flat, sgn = _row_residues(streams.time[rows], streams.coord[rows], streams.d, span, T_h)
        if flat.shape[1] > w and np.any(flat[:, w:] >= 0):
            raise ValueError(f"a user has more than width = {w} non-zero residues")
        cut = min(w, flat.shape[1])
        index[rows, :cut], sign[rows, :cut] = flat[:, :cut], sgn[:, :cut]
    return Ternary(streams.d * T_h, index, sign)


def _row_residues(
    time: IntArray, coord: IntArray, d: int, span: int, T_h: int
) -> tuple[IntArray, NDArray[np.int8]]:
    """``residues`` for a chunk of rows: each row's non-zero coordinates (sorted, then −1)."""
    present = (time >= 1) & (time <= T_h * span)
    block = np.where(present, (time - 1) // span, -1)
    same_bit = (coord[:, :, None] == coord[:, None, :]) & present[:, :, None] & present[:, None, :]
    same_block = same_bit & (block[:, :, None] == block[:, None, :])
    earlier_or_self = np.tri(time.shape[1], dtype=bool)  # [k, k'] = k' ≤ k
    flips_so_far = (same_bit & earlier_or_self).sum(axis=2)
    in_block = same_block.sum(axis=2)
    later_in_block = (same_block & ~earlier_or_self).any(axis=2)
    keep = present & ~later_in_block & (in_block % 2 == 1)
    big = np.iinfo(np.int64).max
    flat = np.where(keep, block * d + coord, big)
    order = np.argsort(flat, axis=1)
    flat = np.take_along_axis(flat, order, axis=1)
    sgn = np.take_along_axis(np.where(flips_so_far % 2 == 1, 1, -1), order, axis=1)
    held = flat != big
    return np.where(held, flat, -1), np.where(held, sgn, 0).astype(np.int8)


class LevelEncoder:
    """One device's CLIP-STREAM (§3.1) and Algorithm 1 (§3.2) at level ``h``, streaming.

    State: ``x̃_{t−1}``, the clip budget, ``pred`` and the block counter (``O(d)``). ``push(x_t)``
    takes the next slot's raw vector and returns ``(t', R_{t',h})`` when ``t ≡ 0 (mod r^h)``,
    else ``None`` (a data-independent schedule)."""

    def __init__(self, d: int, r: int, h: int, s: int) -> None:
        self.d, self.span = d, r**h
        self._clipped, self._pred = [0] * d, [0] * d
        self._budget, self._t, self._block = s, 0, 0

    def push(self, x: Sequence[int]) -> tuple[int, list[int]] | None:
        if len(x) != self.d:
            raise ValueError(f"a slot's vector has {self.d} bits, got {len(x)}")
        self._t += 1
        clipped = self._clipped
        for i, bit in enumerate(x):
            if bit != clipped[i] and self._budget > 0:
                clipped[i] = bit
                self._budget -= 1
        if self._t % self.span:
            return None
        self._block += 1
        out = [c - p for c, p in zip(clipped, self._pred, strict=True)]
        self._pred = list(clipped)
        return self._block, out


class ExSubDevice:
    """A device's whole SaO2 randomiser for one horizon at level ``h`` (spec §10.3): clip,
    residues, online ExSub (Algorithm 4). ``push(x_t)`` returns ``(t', symbols)`` at every
    ``t ≡ 0 (mod r^h)`` (symbols ``(0-based coordinate, sign)``, possibly none), else ``None``.

    Privacy: the symbols over the horizon form one ``(d·T_h + s, s, ε, m)``-ExSub output, so the
    transcript is ε-LDP for the user's whole stream; stub symbols are never sent."""

    def __init__(
        self, params: ExSubParams, d: int, r: int, h: int, uniform: Callable[[], float]
    ) -> None:
        self._encoder = LevelEncoder(d, r, h, params.s)
        self._user = OnlineExSubUser(params, uniform)

    def push(self, x: Sequence[int]) -> tuple[int, list[tuple[int, int]]] | None:
        block = self._encoder.push(x)
        if block is None:
            return None
        return block[0], self._user.block(block[1])


# -- Algorithm 2 and queries (spec §3.3, §3.4) ------------------------------------------------


def reconstruct(level_means: Sequence[NDArray[Any]], T: int, r: int) -> FloatArray:
    """Algorithm 2 for every ``t = 1..T`` at once: ``(…, T, d)`` from levels ``(…, T_h, d)``.

    ``x̂_t = Σ_h Σ_{t''=lo+1}^{hi} R̂_h(t'')`` with ``lo = ⌊t/r^{h+1}⌋·r``, ``hi = ⌊t/r^h⌋``, summed
    through each level's running sum (a telescoping sum; linear, so unbiased)."""
    if len(level_means) != num_levels(T, r):
        raise ValueError(f"T = {T}, r = {r} has {num_levels(T, r)} levels, got {len(level_means)}")
    t = np.arange(1, T + 1)
    out: FloatArray | None = None
    for h, level in enumerate(level_means):
        R = np.asarray(level, dtype=np.float64)
        zero = np.zeros_like(R[..., :1, :])
        run = np.concatenate([zero, np.cumsum(R, axis=-2)], axis=-2)
        part = run[..., t // r**h, :] - run[..., (t // r ** (h + 1)) * r, :]
        out = part if out is None else out + part
    assert out is not None
    return out


def reconstruct_at(t: int, level_means: Sequence[NDArray[Any]], r: int) -> FloatArray:
    """Algorithm 2 for one ``t`` (spec §3.3, literal): at most ``r−1`` residues per level, all
    emitted at or before ``t``."""
    v = np.zeros(np.asarray(level_means[0]).shape[-1])
    for h in range(len(level_means) - 1, -1, -1):
        lo, hi = (t // r ** (h + 1)) * r, t // r**h
        for block in range(lo + 1, hi + 1):
            v = v + level_means[h][block - 1]
    return v


def prefix_sums(means: FloatArray) -> FloatArray:
    """``P[t] = Σ_{τ≤t} x̂̄_τ`` with ``P[0] = 0``: shape ``(T+1, d)`` (spec §3.4, A17)."""
    return np.concatenate([np.zeros_like(means[:1]), np.cumsum(means, axis=0)])


def range_query(prefix: FloatArray, t1: int, t2: int) -> FloatArray:
    """``Σ_{t=t1}^{t2} x̂̄_t = P[t2] − P[t1−1]`` for ``1 ≤ t1 ≤ t2 ≤ T``."""
    if not 1 <= t1 <= t2 < prefix.shape[0]:
        raise ValueError(f"a range needs 1 ≤ t1 ≤ t2 ≤ {prefix.shape[0] - 1}, got [{t1}, {t2}]")
    return np.asarray(prefix[t2] - prefix[t1 - 1], dtype=np.float64)


def all_ranges(prefix: FloatArray) -> FloatArray:
    """Every range ``[t1, t2]``, ``1 ≤ t1 ≤ t2 ≤ T``, in ``(t1, t2)`` order: ``(T(T+1)/2, …)``."""
    a, b = np.triu_indices(prefix.shape[0], k=1)
    return prefix[b] - prefix[a]


class SlotReconstructor:
    """The server's real-time loop (spec §5.2): level means arrive block by block
    (``put``), ``release(t)`` returns ``x̂̄_t`` at slot ``t`` and keeps the prefix sums for
    ranges. Post-processing of the mechanism's output: no privacy cost."""

    def __init__(self, T: int, d: int, r: int) -> None:
        self.T, self.d, self.r = T, d, r
        self.levels = [np.full((T_h, d), np.nan) for T_h in level_lengths(T, r)]
        self.prefix = np.zeros((T + 1, d))
        self.released = 0

    def put(self, h: int, block: int, mean: NDArray[Any]) -> None:
        """Level ``h``'s mean residue for block ``block`` (1-based, complete at ``block·r^h``)."""
        self.levels[h][block - 1] = mean

    def release(self, t: int) -> FloatArray:
        """``x̂̄_t`` (Algorithm 2); slots are released in order ``1, 2, …``."""
        if t != self.released + 1:
            raise ValueError(f"slot {t} released out of order (last {self.released})")
        x = reconstruct_at(t, self.levels, self.r)
        if np.isnan(x).any():
            raise ValueError(f"slot {t} needs a level block that has not arrived")
        self.prefix[t] = self.prefix[t - 1] + x
        self.released = t
        return x

    def range(self, t1: int, t2: int) -> FloatArray:
        if t2 > self.released:
            raise ValueError(f"range ends at {t2}, after the last released slot {self.released}")
        return range_query(self.prefix, t1, t2)


# -- query coefficients and level weights (spec §3.5) -----------------------------------------


def usage(T: int, r: int, h: int) -> IntArray:
    """``U[t−1, j−1] = 1`` iff ``x̂_t`` adds level-``h`` residue ``j`` (Algorithm 2): ``(T, T_h)``."""
    t = np.arange(1, T + 1)[:, None]
    j = np.arange(1, T // r**h + 1)[None, :]
    return np.asarray((j > (t // r ** (h + 1)) * r) & (j <= t // r**h), dtype=np.int64)


def coefficients(T: int, r: int, h: int, family: str) -> IntArray:
    """``coef_q(h, j)`` for every query ``q`` of ``family`` (rows) and residue ``j`` (columns).

    ``"mean"``: the ``T`` mean queries; ``"prefix"``: ranges ``[1, t₂]`` (A17); ``"all"``: all
    ``T(T+1)/2`` ranges ``[t₁, t₂]`` in ``(t₁, t₂)`` order."""
    U = usage(T, r, h)
    if family == "mean":
        return U
    if family == "prefix":
        return np.cumsum(U, axis=0)
    if family == "all":
        run = np.concatenate([np.zeros_like(U[:1]), np.cumsum(U, axis=0)])
        a, b = np.triu_indices(run.shape[0], k=1)
        return np.asarray(run[b] - run[a], dtype=np.int64)
    raise ValueError(f"query family is one of {QUERY_FAMILIES}, got {family!r}")


def level_G(T: int, r: int, v: Weights, family: str, d: int = 1) -> FloatArray:
    """``G_h = v_h · d · Σ_j Σ_q coef_q(h, j)²`` (spec §3.5): level ``h``'s weight in
    ``E(W) = Σ_h G_h / W_h`` for per-user per-coordinate variances ``v_h``."""
    energy = [float((coefficients(T, r, h, family) ** 2).sum()) for h in range(num_levels(T, r))]
    if len(v) != len(energy):
        raise ValueError(f"{len(energy)} levels need {len(energy)} variances, got {len(v)}")
    return np.asarray([vh * d * e for vh, e in zip(v, energy, strict=True)])


def level_weights(strategy: str, T: int, r: int, G: Weights | None = None) -> FloatArray:
    """The share ``W_h`` of users enrolled at each level (spec §3.5), summing to 1.

    ``uniform`` (default, paper); ``prefix-paper`` ``∝ r^h(T − r^h)``; ``all-range-paper``
    ``∝ r^h``; ``calibrated-paper`` ``∝ (max(0, T − r^{h+1}) + K(K+1)(2K+1)/(6K²))·r^h`` with
    ``K = (r−1)r^h`` (count term clamped at 0, A19); ``optimal`` ``∝ √G_h`` (A18, needs ``G``)."""
    H = num_levels(T, r)
    widths = np.asarray([float(r**h) for h in range(H)])
    if strategy == "uniform":
        raw = np.ones(H)
    elif strategy == "prefix-paper":
        raw = widths * (T - widths)
    elif strategy == "all-range-paper":
        raw = widths
    elif strategy == "calibrated-paper":
        K = (r - 1) * widths
        raw = (np.maximum(0.0, T - widths * r) + K * (K + 1) * (2 * K + 1) / (6 * K**2)) * widths
    elif strategy == "optimal":
        if G is None or len(G) != H:
            raise ValueError(f"the optimal weights need G for the {H} levels")
        raw = np.sqrt(np.asarray(G, dtype=np.float64))
    else:
        raise ValueError(f"weight strategy is one of {WEIGHT_STRATEGIES}, got {strategy!r}")
    return np.asarray(raw / raw.sum(), dtype=np.float64)


def level_counts(n: int, W: Weights) -> IntArray:
    """``n_h``: ``n·W_h`` rounded by largest remainder, then every level given at least one user
    (taken from the largest levels; spec §3.5 "give every level at least one user")."""
    w = np.asarray(W, dtype=np.float64)
    H = w.size
    if n < H or np.any(w < 0) or not math.isclose(w.sum(), 1.0, rel_tol=1e-9):
        raise ValueError(f"need n ≥ H = {H} and weights ≥ 0 summing to 1")
    exact = n * w
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: n - int(counts.sum())]] += 1
    for h in np.flatnonzero(counts == 0):
        counts[int(np.argmax(counts))] -= 1
        counts[h] = 1
    return counts


def assign_levels(n: int, W: Weights, rng: np.random.Generator, mode: str = "share") -> IntArray:
    """Each user's level, independent of the data (so it may be public; spec §2).

    ``"share"``: exactly ``level_counts(n, W)`` users per level, in a uniformly random order;
    ``"iid"``: each user draws ``h`` with probability ``W_h`` (a level may end up empty)."""
    if mode == "share":
        levels = rng.permutation(np.repeat(np.arange(len(W)), level_counts(n, W)))
        return np.asarray(levels, dtype=np.int64)
    if mode == "iid":
        return rng.choice(len(W), size=n, p=np.asarray(W, dtype=np.float64)).astype(np.int64)
    raise ValueError(f"level assignment mode is 'share' or 'iid', got {mode!r}")


# -- the simulated pipeline (spec §2, §3.4) ---------------------------------------------------


@dataclass(frozen=True)
class SaO2Estimate:
    """The server's answers: level means ``(T_h, d)``, ``x̂̄_t`` ``(T, d)`` and prefix sums."""

    r: int
    level_means: tuple[FloatArray, ...]
    means: FloatArray
    prefix: FloatArray

    @classmethod
    def from_levels(cls, level_means: Sequence[FloatArray], r: int) -> SaO2Estimate:
        T = level_means[0].shape[0]
        means = reconstruct(level_means, T, r)
        return cls(r, tuple(level_means), means, prefix_sums(means))

    def range(self, t1: int, t2: int) -> FloatArray:
        return range_query(self.prefix, t1, t2)


def true_means(streams: Streams) -> FloatArray:
    """The target ``x̄_t = (1/n) Σ_j x_{j,t}``, ``(T, d)`` (simulation only: never publish)."""
    level0 = residues(streams, 0, 2).mean().reshape(streams.T, streams.d)
    return np.cumsum(level0, axis=0)


def encode_levels(streams: Streams, levels: IntArray, r: int) -> list[Ternary]:
    """The users at each level ``h``, as level-``h`` residue batches (length ``d·T_h``)."""
    H = num_levels(streams.T, r)
    out = []
    for h in range(H):
        rows = np.flatnonzero(levels == h)
        part = Streams(streams.T, streams.d, streams.time[rows], streams.coord[rows])
        out.append(residues(part, h, r))
    return out


def simulate(
    streams: Streams,
    s: int,
    r: int,
    levels: IntArray,
    mechanism: Callable[[int, int], TernaryMechanism],
    rng: np.random.Generator,
) -> SaO2Estimate:
    """The whole protocol in one process: clip to ``s`` changes, encode each user's level,
    randomise each level's users with ``mechanism(h, D_h)`` (``D_h = d·T_h``), estimate and
    rebuild every ``x̂̄_t``. Privacy is the mechanism's, per user over the horizon."""
    batches = encode_levels(clip_stream(streams, s), levels, r)
    means = []
    for h, batch in enumerate(batches):
        if batch.n == 0:
            raise ValueError(f"level {h} has no users: its residues cannot be estimated")
        mech = mechanism(h, batch.D)
        mean = mech.estimate(mech.randomize(batch, rng), batch.n)
        means.append(np.asarray(mean, dtype=np.float64).reshape(-1, streams.d))
    return SaO2Estimate.from_levels(means, r)


# -- analytic errors (spec §3.5 G, §3.6, §11.5) -----------------------------------------------


def exsub_level_variances(
    d: int,
    T: int,
    r: int,
    s: int,
    eps: float,
    n_h: Sequence[int] | IntArray,
    f: Sequence[Any] | float = 0.0,
) -> list[FloatArray]:
    """Per level, the variance of each mean residue coordinate under ExSub with ``m*``:
    ``(f·V_nz + (1−f)·V_z)/n_h`` (spec §4.6), ``f`` the fraction of the level's users with a
    non-zero there (a number, or per level an array broadcastable to ``(T_h, d)``)."""
    out = []
    for h, T_h in enumerate(level_lengths(T, r)):
        d_prime = d * T_h + s
        p = exsub_params(d_prime, s, eps, optimal_m(d_prime, s, eps))
        fh = np.asarray(f if np.isscalar(f) else f[h], dtype=np.float64)  # type: ignore[index]
        out.append(np.broadcast_to((fh * p.V_nz + (1 - fh) * p.V_z) / n_h[h], (T_h, d)).copy())
    return out


def query_variances(T: int, r: int, level_var: Sequence[NDArray[Any]], family: str) -> FloatArray:
    """``Var(q, i) = Σ_h Σ_j coef_q(h, j)² · level_var[h][j, i]`` for every query of ``family``
    (independent residue estimates; within-user covariance ignored, spec §4.6)."""
    total: FloatArray | None = None
    for h, var in enumerate(level_var):
        part = (coefficients(T, r, h, family).astype(np.float64) ** 2) @ np.asarray(
            var, dtype=np.float64
        )
        total = part if total is None else total + part
    assert total is not None
    return total


def analytic_errors(
    T: int, r: int, level_var: Sequence[NDArray[Any]], family: str = "mean"
) -> tuple[float, float]:
    """The Gaussian-model ``(TVE, MAE)`` of a query family (spec §8.2): ``TVE = Σ_{q,i} E|err|``
    (not halved), ``MAE = E max_{q,i} |err|``."""
    sd = np.sqrt(query_variances(T, r, level_var, family))
    return expected_l1(sd), expected_max_abs(sd)


def error_order(family: str, d: int, s: int, T: int, r: int, n: int, eps: float) -> float:
    """The order (no constant) of the total squared error of spec §3.6: ``d s T (r−1) log_r²T``
    (mean, uniform W), ``d s T³ (r−1)² log_r T`` (prefix), ``d s T⁴ (r−1)² log_r T`` (all
    ranges), each over ``n ε²``. For scaling checks and documentation only."""
    log_t = max(math.log(T, r), 1.0)
    base = d * s / (n * eps**2)
    if family == "mean":
        return base * T * (r - 1) * log_t**2
    if family == "prefix":
        return base * T**3 * (r - 1) ** 2 * log_t
    if family == "all":
        return base * T**4 * (r - 1) ** 2 * log_t
    raise ValueError(f"query family is one of {QUERY_FAMILIES}, got {family!r}")
