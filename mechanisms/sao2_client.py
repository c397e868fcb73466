"""The simulated SaO2 devices of one horizon, vectorised over users (spec sao2 §3.1, §3.2, §4.4,
§10.3): the client side of ``mechanisms.sao2`` in ``ldp-simulated``.

At every slot ``τ = 1..T`` of a horizon each enrolled user (level ``h``, drawn by the server
independently of the data) takes its current value ``x_τ`` (``BinaryTask``: a category index or
a bitmask; a user without a new value at ``τ`` carries its last one forward, spec §10.2, and a
user that never had one reads ``x_τ = 0``: in no cell, no set bit), runs CLIP-STREAM
(§3.1), and when ``τ ≡ 0 (mod r^h)`` forms the residue ``R_{τ/r^h, h} = x̃_τ − pred`` (Algorithm 1)
and runs Algorithm 4's step for that block (§4.4), emitting the block's symbols
``(coordinate i ∈ [0, d), sign)``. A block's symbols depend only on data up to its time.

**Per-user state** (``Sao2Clients``, O(s) integers, never ``n×d``): the level, the clip budget
``B``, ``x̃_{τ−1}`` and ``pred`` as their sets of ones (at most ``s`` each: ``x̃`` has at most
``s`` changes from ``x̃_0 = 0``), and Algorithm 4's counters ``a, b, c, remNZ, remZ``.

**Equal in law to ``OnlineExSubUser``.** Algorithm 4 runs two selection samplings (Knuth's
Algorithm S) over the support and over the zero coordinates, and one over the picked support
symbols for the trues. Algorithm S with ``k`` of ``N`` still to pick draws a uniform ``k``-subset
of the ``N`` remaining elements; its intersection with the next ``M`` elements (a block) has a
hypergeometric size ``Hyp(k, N−k, M)`` and, given its size, is a uniform subset of the block, and
the sampler then goes on with ``k`` reduced by it. So drawing each block's picks as
(hypergeometric count, uniform subset) gives exactly the law of the element-by-element device
loop, at O(s + picks) work per user and block instead of O(d).

**Privacy.** The symbols a user emits over the horizon are the real-coordinate part of one
``(d·T_h + s, s, ε, m_h)``-ExSub output (stub symbols are never sent): ε-LDP for the user's
whole clipped stream over the horizon (§1.2). The emission schedule is data-independent. The
subgroup ``(a, b)`` is drawn on the device (erratum A5). What leaves the devices here is what a
shuffler forwards (§10.4): per level and coordinate the counts ``c±`` of the symbols emitted
at this slot, never a user's symbols.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.sao2_encoding import level_lengths
from privstream.mechanisms.sao2_exsub import subgroup_law
from privstream.mechanisms.sao2_task import BinaryTask

IntArray = NDArray[np.int64]
_BIG: Final = np.iinfo(np.int64).max // 4  # sentinel above every coordinate
_CHUNK_ELEMENTS: Final = 1 << 22  # rows × width per chunk of the dense subset path


# -- padded sets (rows of coordinates, −1: none) ----------------------------------------------


def _compact(x: IntArray, width: int) -> IntArray:
    """Each row's entries ≥ 0 first (order kept), cut to ``width`` (refused if one is lost)."""
    order = np.argsort(x < 0, axis=1, kind="stable")
    out = np.take_along_axis(x, order, axis=1)
    if out.shape[1] > width:
        if np.any(out[:, width:] >= 0):
            raise ValueError(f"a set holds more than {width} coordinates")
        return out[:, :width]
    pad = np.full((out.shape[0], width - out.shape[1]), -1, dtype=np.int64)
    return np.concatenate([out, pad], axis=1)


def sets_xor(a: NDArray[Any], b: NDArray[Any], width: int) -> IntArray:
    """Row-wise symmetric difference of two padded sets, ascending then −1, ``width`` wide."""
    x = np.concatenate([a, b], axis=1).astype(np.int64)
    x = np.where(x >= 0, x, _BIG)
    x.sort(axis=1)
    same = x[:, 1:] == x[:, :-1]
    dup = np.zeros(x.shape, dtype=bool)
    dup[:, 1:] |= same
    dup[:, :-1] |= same
    return _compact(np.where((x != _BIG) & ~dup, x, -1), width)


def clip_step(
    clipped: NDArray[Any], budget: NDArray[Any], current: NDArray[Any]
) -> tuple[IntArray, IntArray]:
    """One slot of CLIP-STREAM (spec §3.1) for many users: the coordinates where ``x_τ`` and
    ``x̃_{τ−1}`` differ, in ascending order, are accepted while the budget lasts. Both sets come
    ascending then −1, so a row whose value did not change (or whose budget is spent) is
    skipped without work."""
    s, w = clipped.shape[1], current.shape[1]
    new = np.asarray(clipped, dtype=np.int64).copy()
    left = np.asarray(budget, dtype=np.int64).copy()
    same = (new[:, : min(s, w)] == current[:, : min(s, w)]).all(axis=1)
    same &= (new[:, w:] < 0).all(axis=1) & (current[:, s:] < 0).all(axis=1)
    rows = np.flatnonzero(~same & (left > 0))
    diff = sets_xor(new[rows], current[rows], s + w)
    accept = (diff >= 0) & (np.arange(diff.shape[1])[None, :] < left[rows, None])
    new[rows] = sets_xor(new[rows], np.where(accept, diff, -1), s)
    left[rows] -= accept.sum(axis=1)
    return new, left


def block_residue(clipped: NDArray[Any], pred: NDArray[Any]) -> tuple[IntArray, IntArray]:
    """Algorithm 1's residue ``x̃ − pred`` as ``(index, sign)`` rows (spec §3.2)."""
    index = sets_xor(clipped, pred, clipped.shape[1])
    inside = (index[:, :, None] == clipped[:, None, :]).any(axis=2)
    return index, np.where(index < 0, 0, np.where(inside, 1, -1)).astype(np.int64)


# -- uniform subsets with a per-row population ------------------------------------------------


def uniform_ranks(pop: IntArray, k: IntArray, width: int, rng: np.random.Generator) -> IntArray:
    """Row ``j``: a uniform ``k[j]``-subset of ``[0, pop[j])``, ascending, then −1.

    Sparse rows draw i.i.d. and redraw repeats (the rule looks only at which draws are equal,
    so the set's law is invariant under permutations of the population: uniform); dense rows
    (``4k > pop``) take the first ``k`` of a random permutation."""
    n = k.size
    out = np.full((n, width), -1, dtype=np.int64)
    if width == 0 or n == 0:
        return out
    col = np.arange(width)
    dense = 4 * k > pop
    rows = np.flatnonzero(~dense & (k > 0))
    if rows.size:
        p = pop[rows][:, None]
        x = np.where(col < k[rows, None], (rng.random((rows.size, width)) * p).astype(np.int64),
                     _BIG + col)  # fmt: skip
        x.sort(axis=1)
        bad = np.flatnonzero((x[:, 1:] == x[:, :-1]).any(axis=1))
        while bad.size:
            sub = x[bad]
            dup = np.zeros(sub.shape, dtype=bool)
            dup[:, 1:] = sub[:, 1:] == sub[:, :-1]
            redraw = rng.random(sub.shape) * p[bad]
            sub[dup] = redraw.astype(np.int64)[dup]
            sub.sort(axis=1)
            x[bad] = sub
            bad = bad[(sub[:, 1:] == sub[:, :-1]).any(axis=1)]
        out[rows] = np.where(x < _BIG, x, -1)
    rows = np.flatnonzero(dense & (k > 0))
    if rows.size:
        top = int(pop[rows].max())
        step = max(1, _CHUNK_ELEMENTS // top)
        for lo in range(0, rows.size, step):
            part = rows[lo : lo + step]
            keys = rng.random((part.size, top))
            keys[np.arange(top)[None, :] >= pop[part, None]] = np.inf
            first = np.argsort(keys, axis=1)[:, :width]
            first = np.where(col[: first.shape[1]] < k[part, None], first, _BIG)
            first.sort(axis=1)
            out[part, : first.shape[1]] = np.where(first < _BIG, first, -1)
    return out


def skip_support(support: NDArray[Any], ranks: IntArray, d: int) -> IntArray:
    """The coordinate in ``[0, d)`` of each row's ``ranks``-th zero coordinate, the row's
    ``support`` (padded, any order) skipped: ``z + #{k : q_k − k ≤ z}`` for the sorted support
    ``q`` (one ``searchsorted`` for all rows); −1 ranks stay −1."""
    n, s = support.shape
    q = np.where(support >= 0, support, _BIG).astype(np.int64)
    q.sort(axis=1)
    col = np.arange(s)
    q = np.where(q < _BIG, q, d + col) - col  # pads: q' = d, above every rank
    offset = np.arange(n)[:, None] * (2 * d + 1)
    below = np.searchsorted((q + offset).ravel(), (np.maximum(ranks, 0) + offset).ravel(), "right")
    below = below.reshape(ranks.shape) - np.arange(n)[:, None] * s
    return np.where(ranks >= 0, ranks + below, -1)


# -- the devices ------------------------------------------------------------------------------


@dataclass
class Sao2Clients:
    """Every device's state in one horizon, by user index (secret: it reveals clipped values).

    ``level`` −1: not enrolled. ``budget``: the clip budget ``B``. ``clipped``/``pred``: the
    ones of ``x̃_{τ−1}`` and of the last block end, ``(n, s)`` padded with −1. ``a, b, c``:
    Algorithm 4's trues, reverses and falses still to emit; ``rem_nz``/``rem_z``: the support
    and zero coordinates still to visit."""

    level: NDArray[np.int8]
    budget: NDArray[np.int32]
    clipped: NDArray[np.int32]
    pred: NDArray[np.int32]
    a: NDArray[np.int32]
    b: NDArray[np.int32]
    c: NDArray[np.int32]
    rem_nz: NDArray[np.int32]
    rem_z: NDArray[np.int64]
    last: NDArray[np.int64]

    @classmethod
    def empty(cls, n: int, s: int) -> Sao2Clients:
        zeros = np.zeros(n, dtype=np.int32)
        return cls(np.full(n, -1, np.int8), zeros, np.full((n, s), -1, np.int32),
                   np.full((n, s), -1, np.int32), zeros.copy(), zeros.copy(), zeros.copy(),
                   zeros.copy(), np.zeros(n, np.int64), np.full(n, -1, np.int64))  # fmt: skip

    def copy(self) -> Sao2Clients:
        return Sao2Clients(*(a.copy() for a in dataclasses.astuple(self)))


@dataclass(frozen=True)
class Emitted:
    """One level's symbols of one slot: ``user``, ``coord`` (in ``[0, d)``, the block's
    coordinate ``(t'−1)·d + coord``) and ``sign``, flat. Internal (tests): never published."""

    level: int
    block: int
    user: IntArray
    coord: IntArray
    sign: IntArray


@dataclass(frozen=True)
class Sao2Protocol:
    """The device side of slot ``tau`` (1-based in the horizon) of SaO2 (module docstring).

    ``m``: ``m_h`` per level. ``enrol``: at the horizon's first slot, every user's level (−1:
    not enrolled); the devices then restart and draw their subgroup ``(a, b)`` privately."""

    tau: int
    T: int
    r: int
    s: int
    eps: float
    task: BinaryTask
    m: tuple[int, ...]
    enrol: NDArray[np.int64] | None = None

    def respond(
        self, values: NDArray[Any], asked: NDArray[np.bool_], state: Any, rng: np.random.Generator
    ) -> tuple[NDArray[np.float64], Sao2Clients]:
        """What the shuffler forwards (spec §10.4): ``(H, 2, d)`` counts, ``[h, 0, i]`` the
        ``i₊`` and ``[h, 1, i]`` the ``i₋`` symbols level ``h`` emitted at this slot (zero
        where no level-``h`` block ends); and the devices' state after the slot."""
        new, emitted = self.emit(values, asked, state, rng)
        d = self.task.d
        counts = np.zeros((len(self.m), 2, d))
        for e in emitted:
            counts[e.level, 0] = np.bincount(e.coord[e.sign > 0], minlength=d)
            counts[e.level, 1] = np.bincount(e.coord[e.sign < 0], minlength=d)
        return counts, new

    def emit(
        self, values: NDArray[Any], asked: NDArray[np.bool_], state: Any, rng: np.random.Generator
    ) -> tuple[Sao2Clients, list[Emitted]]:
        """The slot for every device: the ``asked`` users (those with a new value) keep it as
        their last value, whether enrolled or not; every enrolled device clips its last value
        (``x_τ = 0`` for one that never had one), then each level whose block ends now emits
        its symbols."""
        n = asked.shape[0]
        new = (Sao2Clients.empty(n, self.s) if state is None else state).copy()
        if self.enrol is not None:
            self._enrol(new, rng)
        new.last[asked] = self.task.encode(np.asarray(values)[asked])
        rows = np.flatnonzero(new.level >= 0)
        current = np.full((rows.size, self.task.width), -1, dtype=np.int64)
        has = new.last[rows] >= 0
        current[has] = self.task.support(new.last[rows[has]])
        clipped, budget = clip_step(new.clipped[rows], new.budget[rows], current)
        new.clipped[rows], new.budget[rows] = clipped, budget
        out = []
        for h in range(len(self.m)):
            if self.tau % self.r**h == 0:
                out.append(self._block(new, h, rng))
        return new, out

    def _enrol(self, state: Sao2Clients, rng: np.random.Generator) -> None:
        """Restart every device for a new horizon at its level (spec §10.3)."""
        assert self.enrol is not None
        fresh = Sao2Clients.empty(self.enrol.shape[0], self.s)
        for name, value in dataclasses.asdict(fresh).items():
            if name != "last":
                getattr(state, name)[...] = value
        state.level[:] = self.enrol
        for h, T_h in enumerate(level_lengths(self.T, self.r)):
            rows = np.flatnonzero(self.enrol == h)
            d_prime = self.task.d * T_h + self.s
            ab = subgroup_law(d_prime, self.s, self.eps, self.m[h]).draw(rng.random(rows.size))
            state.a[rows], state.b[rows] = ab[:, 0], ab[:, 1]
            state.c[rows] = self.m[h] - ab[:, 0] - ab[:, 1]
            state.budget[rows], state.rem_nz[rows], state.rem_z[rows] = (
                self.s,
                self.s,
                d_prime - self.s,
            )

    def _block(self, state: Sao2Clients, h: int, rng: np.random.Generator) -> Emitted:
        """Algorithm 4 for the level-``h`` block ending now, for every level-``h`` device."""
        rows = np.flatnonzero(state.level == h)
        index, sign = block_residue(state.clipped[rows], state.pred[rows])
        state.pred[rows] = state.clipped[rows]
        coord, sym, counters = exsub_block(
            index, sign, (state.a[rows], state.b[rows], state.c[rows], state.rem_nz[rows],
                          state.rem_z[rows]), self.task.d, rng)  # fmt: skip
        state.a[rows], state.b[rows], state.c[rows], state.rem_nz[rows], state.rem_z[rows] = (
            counters
        )
        j, k = np.nonzero(coord >= 0)
        return Emitted(h, self.tau // self.r**h, rows[j], coord[j, k], sym[j, k])


Counters = tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]


def exsub_block(
    index: IntArray, sign: IntArray, counters: Counters, d: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray, Counters]:
    """Algorithm 4 (spec §4.4, corrected) on one block of ``d`` coordinates for many devices.

    ``index``/``sign``: each device's non-zero residue coordinates in ``[0, d)``; ``counters``:
    ``(a, b, c, remNZ, remZ)``. Per device: ``Hyp(a+b, remNZ−a−b, nnz)`` of its support symbols
    picked (a uniform subset), ``Hyp(a, b, picked)`` of them kept (trues, the rest reversed),
    ``Hyp(c, remZ−c, d−nnz)`` zero coordinates picked (a uniform subset, uniform signs): the
    law of the element-by-element selection sampling (module docstring). Returns the symbols
    ``(coord, sign)`` as padded rows (−1/0) and the counters after the block."""
    a, b, c, rem_nz, rem_z = (np.asarray(x, dtype=np.int64) for x in counters)
    n, s = index.shape
    present = index >= 0
    nnz = present.sum(axis=1)
    need = a + b
    picked = rng.hypergeometric(need, rem_nz - need, nnz)
    trues = rng.hypergeometric(a, b, picked)
    order = np.argsort(np.where(present, rng.random((n, s)), 2.0), axis=1)  # uniform order
    col = np.arange(s)[None, :]
    sup_i = np.where(col < picked[:, None], np.take_along_axis(index, order, axis=1), -1)
    sup_s = np.take_along_axis(sign, order, axis=1)
    sup_s = np.where(sup_i < 0, 0, np.where(col < trues[:, None], sup_s, -sup_s))
    zeros = d - nnz
    falses = rng.hypergeometric(c, rem_z - c, zeros)
    zc = skip_support(index, uniform_ranks(zeros, falses, int(falses.max(initial=0)), rng), d)
    zs = np.where(zc < 0, 0, 2 * rng.integers(0, 2, zc.shape) - 1)
    after = (a - trues, b - (picked - trues), c - falses, rem_nz - nnz, rem_z - zeros)
    return (np.concatenate([sup_i, zc], axis=1), np.concatenate([sup_s, zs], axis=1), after)
