"""SaO2 cost measurements (spec sao2 §4.4 costs, §5.2 loop): device encoding per user and the
server's estimation per slot, in the Trajectory setting by default (n = 10⁶, d = 12, T = 32,
s = 8, r = 2, uniform W).

The data are synthetic trajectory-like one-hot streams (a start cell and up to ``moves`` moves,
``1 + 2·moves ≤ s`` flips), generated from a public seed. The numbers are timings only: no
estimate, count or user value leaves this module.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.sao2_encoding import (
    ExSubDevice,
    SlotReconstructor,
    Streams,
    assign_levels,
    clip_stream,
    level_lengths,
    level_weights,
    residues,
)
from privstream.mechanisms.sao2_exsub import ExSub, ExSubReports, Sampler, value_estimate


def trajectory_like(n: int, d: int, T: int, moves: int, rng: np.random.Generator) -> Streams:
    """``n`` one-hot streams: a uniform start cell, then ``moves`` moves at distinct uniform
    slots ``2..T``, each to a uniform other cell (spec §8.1 Trajectory, synthetic stand-in)."""
    cells = np.empty((n, T), dtype=np.int64)
    cells[:, 0] = rng.integers(0, d, n)
    at = np.sort(np.argsort(rng.random((n, T - 1)), axis=1)[:, :moves] + 1, axis=1)
    step = np.zeros((n, T), dtype=np.int64)
    np.put_along_axis(step, at, rng.integers(1, d, (n, moves)), axis=1)
    cells = (cells[:, :1] + np.cumsum(step, axis=1)) % d
    return Streams.from_categorical(cells, d)


def _device_seconds(
    streams: Streams, levels: NDArray[np.int64], mechs: list[ExSub], r: int, users: int
) -> float:
    """Mean wall time of one device's whole horizon (clip, residues, online ExSub), pure Python."""
    dense = Streams(streams.T, streams.d, streams.time[:users], streams.coord[:users]).dense()
    rows = [[list(map(int, x)) for x in user] for user in dense]
    source = random.Random(0)
    start = time.perf_counter()
    for j, slots in enumerate(rows):
        h = int(levels[j])
        device = ExSubDevice(mechs[h].params, streams.d, r, h, source.random)
        for x in slots:
            device.push(x)
    return (time.perf_counter() - start) / max(len(rows), 1)


def _epochs(
    reports: ExSubReports, d: int, T_h: int
) -> list[tuple[NDArray[np.int64], NDArray[np.int8]]]:
    """The level's symbols split by block (what the shuffler delivers per epoch; stubs dropped)."""
    coord, sign = reports.index.ravel().astype(np.int64), reports.sign.ravel()
    real = coord < d * T_h
    coord, sign = coord[real], sign[real]
    order = np.argsort(coord // d, kind="stable")
    coord, sign = coord[order], sign[order]
    cuts = np.searchsorted(coord // d, np.arange(1, T_h))
    return list(zip(np.split(coord, cuts), np.split(sign, cuts), strict=True))


def sao2_perf(
    n: int = 10**6,
    d: int = 12,
    T: int = 32,
    s: int = 8,
    r: int = 2,
    eps: float = 1.0,
    seed: int = 0,
    device_users: int = 2000,
    sampler: Sampler = "online",
) -> dict[str, Any]:
    """Timings of SaO2 with ExSub (``m*`` per level, uniform ``W``, ``level_counts`` shares).

    Returns ``device_us_per_user`` (one device's horizon in pure Python, ``ExSubDevice``,
    averaged over ``device_users`` users), ``batch_encode_us_per_user`` (the vectorised
    simulation: clip, residues and ExSub for all ``n`` users, divided by ``n``),
    ``server_ms_per_slot`` (mean) and ``server_ms_per_slot_max``: per slot, count the epoch's
    symbols of every level closing at ``t``, E1, Algorithm 2 and the prefix sum (the shuffler's
    per-epoch batching is not timed), and ``setup_s`` (per-level parameters and ``m*``)."""
    rng = np.random.default_rng(seed)
    streams = trajectory_like(n, d, T, (s - 1) // 2, rng)
    start = time.perf_counter()
    lengths = level_lengths(T, r)
    mechs = [ExSub(d * T_h + s, s, eps, sampler=sampler) for T_h in lengths]
    setup = time.perf_counter() - start
    levels = assign_levels(n, level_weights("uniform", T, r), rng)
    start = time.perf_counter()
    clipped = clip_stream(streams, s)
    reports = []
    for h, mech in enumerate(mechs):
        rows = np.flatnonzero(levels == h)
        part = Streams(T, d, clipped.time[rows], clipped.coord[rows])
        reports.append(mech.randomize(residues(part, h, r), rng))
    batch = time.perf_counter() - start
    per_slot = _server_slots(reports, mechs, levels, d, T, r)
    return {
        "n": n, "d": d, "T": T, "s": s, "r": r, "eps": eps, "sampler": sampler,
        "m": [mech.m for mech in mechs],
        "setup_s": setup,
        "device_us_per_user": 1e6 * _device_seconds(streams, levels, mechs, r, device_users),
        "batch_encode_us_per_user": 1e6 * batch / n,
        "server_ms_per_slot": 1e3 * float(np.mean(per_slot)),
        "server_ms_per_slot_max": 1e3 * float(np.max(per_slot)),
    }  # fmt: skip


def _server_slots(
    reports: list[ExSubReports],
    mechs: list[ExSub],
    levels: NDArray[np.int64],
    d: int,
    T: int,
    r: int,
) -> list[float]:
    """Seconds the server spends at each slot ``t = 1..T`` (spec §5.2 loop)."""
    lengths = level_lengths(T, r)
    epochs = [_epochs(rep, d, T_h) for rep, T_h in zip(reports, lengths, strict=True)]
    n_h = np.bincount(levels, minlength=len(mechs))
    server = SlotReconstructor(T, d, r)
    out = []
    for t in range(1, T + 1):
        start = time.perf_counter()
        for h, mech in enumerate(mechs):
            if t % r**h:
                continue
            block = t // r**h
            coord, sign = epochs[h][block - 1]
            local = coord - (block - 1) * d
            c_plus = np.bincount(local[sign > 0], minlength=d)
            c_minus = np.bincount(local[sign < 0], minlength=d)
            server.put(h, block, value_estimate(c_plus, c_minus, int(n_h[h]), mech.params))
        server.release(t)
        out.append(time.perf_counter() - start)
    return out
