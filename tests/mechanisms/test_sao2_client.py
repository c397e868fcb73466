"""SaO2's simulated devices (``mechanisms.sao2_client``) and ``BinaryTask``: the vectorised
stepper's transcript has ExSub's exact law (spec sao2 §4.4, §11.2), it clips and encodes as the
per-device reference does (§3.1, §3.2), it is causal, and its state stays O(s) per user.

Law test tolerances: TV threshold ``E[TV] + 6 sd`` as in ``test_sao2_exsub`` (``tv_threshold``);
the chi-square over the ``k`` cells of positive probability is below ``df + 5·√(2·df)``
(``df = k − 1``: the statistic has mean ``df`` and variance ``2·df``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privstream.mechanisms.sao2_client import (
    Sao2Clients,
    Sao2Protocol,
    block_residue,
    clip_step,
    skip_support,
    uniform_ranks,
)
from privstream.mechanisms.sao2_encoding import LevelEncoder
from privstream.mechanisms.sao2_exsub import exsub_params
from privstream.mechanisms.sao2_task import BinaryTask
from tests.mechanisms.test_sao2_exsub import all_outputs, law_of, tv_threshold

# d = 2, T = 2, r = 2, s = 2, ε = 0.7, m = 3 at level 0: d' = 2·2 + 2 = 6, spec §11.2's case
D, T, R, S, EPS, M = 2, 2, 2, 2, 0.7, 3


def transcripts(task: BinaryTask, values: list[int], N: int, seed: int) -> np.ndarray:
    """Each of ``N`` level-0 users' emitted symbols over the horizon, as a bitmask over the
    ``2·d·T`` symbols (bit ``2k + [sign > 0]`` for coordinate ``k``)."""
    state, code = None, np.zeros(N, dtype=np.int64)
    for tau, v in enumerate(values, start=1):
        enrol = np.zeros(N, dtype=np.int64) if tau == 1 else None
        proto = Sao2Protocol(tau, T, R, S, EPS, task, (M, 2), enrol)
        state, emitted = proto.emit(
            np.full(N, v), np.ones(N, bool), state, np.random.default_rng(seed + tau)
        )
        for e in emitted:
            if e.level == 0:
                k = (e.block - 1) * D + e.coord
                np.add.at(code, e.user, 1 << (2 * k + (e.sign > 0)))
    return code


def exact_transcript_law(support: set[tuple[int, int]]) -> np.ndarray:
    """The law of the real-coordinate part of a (6, 2, 0.7, 3)-ExSub output (stubs dropped)."""
    params = exsub_params(D * T + S, S, EPS, M)
    P = np.zeros(1 << (2 * D * T))
    for Z in all_outputs(D * T + S, M):
        P[sum(1 << (2 * i + (g > 0)) for i, g in Z if i < D * T)] += law_of(support, Z, params)
    return P


@pytest.mark.parametrize(
    ("kind", "values", "support"),
    [
        # x_1 = e_1, x_2 = e_0: 3 changes, clipped to 2 (coordinate 0 first): R = (0,+1 | +1,0)
        ("onehot", [1, 0], {(1, 1), (2, 1)}),
        # x_1 = {1}, x_2 = {} : R = (0,+1 | 0,−1), no stub
        ("bits", [0b10, 0b00], {(1, 1), (3, -1)}),
        # x_1 = {}, x_2 = {0}: one non-zero and one + stub at coordinate 4
        ("bits", [0b00, 0b01], {(2, 1), (4, 1)}),
    ],
)
def test_the_vectorised_devices_emit_exsubs_exact_law(kind, values, support) -> None:  # type: ignore[no-untyped-def]
    N = 200_000  # E[TV] ≈ 0.009 over 64 cells, threshold ≈ 0.013
    code = transcripts(BinaryTask(D, kind), values, N, seed=11)
    P = exact_transcript_law(support)
    counts = np.bincount(code, minlength=P.size)
    assert counts[P == 0].sum() == 0  # nothing outside the support of the law
    assert 0.5 * np.abs(counts / N - P).sum() < tv_threshold(P, N)
    cells = P > 0
    expected = N * P[cells]
    chi2 = float(((counts[cells] - expected) ** 2 / expected).sum())
    df = int(cells.sum()) - 1
    assert chi2 < df + 5 * math.sqrt(2 * df)
    # power: the law of the unclipped or of another input is far outside the threshold
    other = exact_transcript_law({(0, 1), (3, 1)})
    assert 0.5 * np.abs(other - P).sum() > 5 * tv_threshold(P, N)


def test_clip_and_residues_match_the_per_device_reference() -> None:
    """Random bitmask streams with many changes (so clipping bites) through ``clip_step`` and
    ``block_residue`` equal ``LevelEncoder`` (CLIP-STREAM + Algorithm 1, one device) exactly."""
    d, T_, r, s, n = 5, 8, 2, 3, 150
    task = BinaryTask(d, "bits")
    rng = np.random.default_rng(3)
    masks = rng.integers(0, 1 << d, (T_, n))
    for h in range(4):
        encoders = [LevelEncoder(d, r, h, s) for _ in range(n)]
        clipped = np.full((n, s), -1, dtype=np.int64)
        pred, budget = clipped.copy(), np.full(n, s)
        for t in range(1, T_ + 1):
            dense = task.dense(masks[t - 1])
            clipped, budget = clip_step(clipped, budget, task.support(masks[t - 1]))
            ref = [enc.push(list(row)) for enc, row in zip(encoders, dense.tolist(), strict=True)]
            if t % r**h:
                assert all(x is None for x in ref)
                continue
            index, sign = block_residue(clipped, pred)
            pred = clipped.copy()
            got = np.zeros((n, d), dtype=np.int64)
            j, k = np.nonzero(index >= 0)
            got[j, index[j, k]] = sign[j, k]
            assert np.array_equal(got, np.array([x[1] for x in ref if x is not None]))


def test_a_blocks_symbols_depend_only_on_data_up_to_its_time() -> None:
    """Two populations equal up to slot 4 and different after emit the same symbols at slots
    1..4 (same per-slot randomness): the stepper is causal. ``s = 12`` leaves budget after
    slot 4 (at most 7 changes by then), so the later slots do differ."""
    task, n, T_ = BinaryTask(6), 400, 8
    rng = np.random.default_rng(5)
    a = rng.integers(0, 6, (T_, n))
    b = a.copy()
    b[4:] = (b[4:] + 1) % 6
    streams = []
    for values in (a, b):
        state, out = None, []
        for tau in range(1, T_ + 1):
            enrol = np.arange(n, dtype=np.int64) % 4 if tau == 1 else None
            proto = Sao2Protocol(tau, T_, 2, 12, 1.0, task, (5, 4, 3, 2), enrol)
            state, emitted = proto.emit(
                values[tau - 1], np.ones(n, bool), state, np.random.default_rng(tau)
            )
            out.append(
                [(e.level, e.user.tolist(), e.coord.tolist(), e.sign.tolist()) for e in emitted]
            )
        streams.append(out)
    assert streams[0][:4] == streams[1][:4]
    assert streams[0][4:] != streams[1][4:]


def test_device_state_is_o_s_integers_per_user() -> None:
    """n = 10⁵ users, s = 20: the devices' state is under 20 MB whatever d (one-hot d = 1000
    would be 10⁸ entries densely)."""
    state = Sao2Clients.empty(100_000, 20)
    assert sum(a.nbytes for a in vars(state).values()) < 20e6


def test_a_device_carries_its_last_value_forward_and_an_unenrolled_one_only_remembers() -> None:
    """Spec §10.2: a device without a new value at a slot keeps its last one (sparse streams send
    only changes); one that never had a value reads 0; a device not enrolled in the horizon
    remembers its value (for the next horizon) and emits nothing."""
    task = BinaryTask(4)
    proto = Sao2Protocol(1, 4, 2, 3, 1.0, task, (3, 3, 2), np.array([0, 0, -1]))
    asked = np.array([True, False, True])
    state, _ = proto.emit(np.array([2, 3, 1]), asked, None, np.random.default_rng(0))
    assert state.clipped[0].tolist() == [2, -1, -1] and state.clipped[1].tolist() == [-1] * 3
    assert state.last.tolist() == [2, -1, 1] and state.clipped[2].tolist() == [-1] * 3
    later = Sao2Protocol(2, 4, 2, 3, 1.0, task, (3, 3, 2))
    state, out = later.emit(
        np.array([-1, 0, -1]), np.array([False, True, False]), state, np.random.default_rng(0)
    )
    assert state.clipped[0].tolist() == [2, -1, -1]  # carried forward, no change spent
    assert state.budget[0] == 3 - 1 and state.clipped[1].tolist() == [0, -1, -1]
    assert state.last.tolist() == [2, 0, 1]
    assert all(2 not in e.user.tolist() for e in out)  # not enrolled: never emits


@pytest.mark.parametrize(("pop", "k"), [(9, 2), (5, 4)])
def test_uniform_ranks_are_uniform_subsets_and_skip_support_skips(pop: int, k: int) -> None:
    """Both paths (sparse redraw: 4k ≤ pop; dense permutation) give each of the C(pop, k)
    subsets equally often (chi-square as above); ``skip_support`` maps ranks past the support."""
    N = 60_000
    ranks = uniform_ranks(np.full(N, pop), np.full(N, k), k, np.random.default_rng(9))
    codes = (1 << ranks).sum(axis=1)
    _, counts = np.unique(codes, return_counts=True)
    cells = math.comb(pop, k)
    assert counts.size == cells
    chi2 = float(((counts - N / cells) ** 2 / (N / cells)).sum())
    assert chi2 < cells - 1 + 5 * math.sqrt(2 * (cells - 1))
    support = np.array([[1, 3, -1], [-1, -1, -1]])
    got = skip_support(support, np.array([[0, 1, 2, -1], [0, 1, 2, 3]]), 6)
    assert got.tolist() == [[0, 2, 4, -1], [0, 1, 2, 3]]


def test_binary_task_domain_and_encodings() -> None:
    bits = BinaryTask(4, "bits")
    assert bits.support(np.array([0b1010, 0])).tolist() == [[1, 3, -1, -1], [-1, -1, -1, -1]]
    assert bits.dense(np.array([0b0101])).tolist() == [[1, 0, 1, 0]]
    assert bits.in_domain(np.array([15.0, 16.0, -1.0, 2.5, np.nan])).tolist() == [
        True,
        False,
        False,
        False,
        False,
    ]
    onehot = BinaryTask(3)
    assert onehot.in_domain(np.array([0.0, 2.0, 3.0])).tolist() == [True, True, False]
    assert onehot.dense(np.array([2])).tolist() == [[0, 0, 1]]
    for bad in ({"d": 0}, {"d": 53, "kind": "bits"}, {"d": 3, "kind": "set"}):
        with pytest.raises(ValueError):
            BinaryTask(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="SaO2 protocol"):
        onehot.select(1.0)
