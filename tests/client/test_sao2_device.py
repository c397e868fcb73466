"""SaO2's device side behind a shuffler (privstream.client.sao2, issue 25): the level rule, the
clip and residues, the law of a horizon's symbols, the wire reports, the lifetime ledger and its
store, and unbiased estimates from a simulated fleet (privstream.runtime.sao2_fleet)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from privstream.client.randomizers import SeededRandomness, uniform
from privstream.client.sao2 import (
    Run,
    Sao2Device,
    level_of,
    read_task,
    subgroup_table,
)
from privstream.client.store import FileStore
from privstream.mechanisms.sao2 import Sao2Config, Sao2Mechanism
from privstream.mechanisms.sao2_encoding import ExSubDevice, LevelEncoder, SlotReconstructor
from privstream.mechanisms.sao2_exsub import exsub_params, subgroup_law, value_estimate
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.runtime.sao2_fleet import Sao2Fleet, run_horizon
from privstream.schema.shuffle import Sao2Report, Sao2Task, counts_of, decode

SALT = "5a1f" * 8


def make_task(T: int = 8, r: int = 2, s: int = 3, d: int = 4, kind: str = "onehot",
              eps: float = 1.0, life: float | None = None, m: tuple[int, ...] | None = None,
              weights: tuple[float, ...] | None = None, horizon: int = 0,
              first_slot: int = 1, salt: str = SALT) -> Sao2Task:  # fmt: skip
    H = len([h for h in range(T + 1) if r**h <= T])
    lengths = [T // r**h for h in range(H)]
    m = m or tuple(min(2, d * T_h + s) for T_h in lengths)
    weights = weights or (1.0 / H,) * H
    return Sao2Task("st", horizon, first_slot, T, r, s, d, kind, eps, life or eps, m, weights,
                    salt)  # fmt: skip


def as_obj(task: Sao2Task) -> dict[str, Any]:
    """The task as a device receives it: the JSON object of its wire text."""
    obj: dict[str, Any] = json.loads(task.to_json())
    return obj


def device_at(task: Sao2Task, level: int) -> str:
    """A device id whose level in ``task`` is ``level`` (the public rule)."""
    return next(f"dev-{k}" for k in itertools.count() if task.level_of(f"dev-{k}") == level)


# -- (a) the level rule ------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [(0.25, 0.25, 0.25, 0.25), (0.1, 0.2, 0.3, 0.4),
                                     (0.5, 0.5, 0.0, 0.0)])  # fmt: skip
def test_the_device_level_is_the_servers_level_rule(weights: tuple[float, ...]) -> None:
    task = make_task(weights=weights)
    view = read_task(as_obj(task))
    ids = [f"user-{k}" for k in range(1000)]
    client = [level_of(view.weights, view.salt, i) for i in ids]
    assert client == [task.level_of(i) for i in ids]
    share = Counter(client)
    for h, w in enumerate(weights):  # each level's share within 5σ of its weight (binomial)
        assert abs(share[h] - 1000 * w) <= 5 * math.sqrt(1000 * w * (1 - w)) + 1e-9


def test_the_task_id_is_recomputed_and_a_forged_one_refused() -> None:
    task = make_task()
    assert read_task(as_obj(task)).id == task.id
    assert read_task({k: v for k, v in as_obj(task).items() if k != "id"}).id == task.id
    for forged in ({"id": "0" * 32}, {"epsilon": 2.0}, {"extra": 1}, {"m": [99, 1, 1, 1]},
                   {"salt": "xyz"}, {"version": True}):  # fmt: skip
        device = Sao2Device("dev-1")
        assert not device.begin(as_obj(task) | forged)
        assert device.refusal is not None and device.refusal.reason == "invalid"


# -- (b) clip and residues ---------------------------------------------------------------------


def dense(value: int | None, d: int, kind: str) -> list[int]:
    """The server's reading of a carried value (``BinaryTask.dense``; none: ``x = 0``)."""
    if value is None:
        return [0] * d
    return [int(b) for b in BinaryTask(d, kind).dense(np.asarray([value]))[0]]  # type: ignore[arg-type]


def random_values(rng: random.Random, T: int, d: int, kind: str) -> list[int | None]:
    """A stream with gaps (carried values) and often a first stretch with no value at all."""
    top = d if kind == "onehot" else 1 << d
    start = rng.randrange(T + 1)
    return [None if t < start or rng.random() < 0.5 else rng.randrange(top) for t in range(T)]


def test_clip_and_residues_equal_the_level_encoder() -> None:
    """``Run.advance`` on the carried value's bits gives ``LevelEncoder``'s blocks exactly, on
    400 random streams (one-hot and bitmask, carried values, never a value, clipping)."""
    rng = random.Random(11)
    clipped = 0
    for _ in range(400):
        T, r, d, kind = rng.choice([4, 8, 9, 16]), rng.choice([2, 3]), rng.randint(1, 6), rng.choice(["onehot", "bits"])  # fmt: skip
        s = rng.randint(1, 4)
        task = read_task(as_obj(make_task(T=T, r=r, s=s, d=d, kind=kind)))
        level = rng.randrange(len(task.m))
        run, encoder = Run.start(task, level, SeededRandomness(0)), LevelEncoder(d, r, level, s)
        last: int | None = None
        for value in random_values(rng, T, d, kind):
            last = value if value is not None else last
            ones = [] if last is None else [i for i, b in enumerate(dense(last, d, kind)) if b]
            want = encoder.push(dense(last, d, kind))
            got = run.advance(ones)
            assert (want is None and got is None) or (want == (run.block, got))
        clipped += run.budget == 0
    assert clipped > 50  # the clip is exercised


# -- (c) the law of a horizon's symbols --------------------------------------------------------


def test_the_subgroup_table_is_the_servers_bit_for_bit() -> None:
    for d_prime, s, eps, m in [(35, 3, 1.0, 2), (19, 3, 0.5, 7), (7, 3, 2.0, 7), (1030, 20, 1.0, 9),
                               (6, 5, 4.0, 3)]:  # fmt: skip
        ours, server = subgroup_table(d_prime, s, eps, m), subgroup_law(d_prime, s, eps, m)
        assert ours.pairs == tuple(map(tuple, server.pairs.tolist()))
        assert list(ours.cdf) == server.cdf.tolist()


def server_transcript(task: Sao2Task, level: int, values: list[int | None],
                      uniform_source: SeededRandomness) -> list[tuple[int, list[list[int]]]]:  # fmt: skip
    """``ExSubDevice`` (the server's per-device path) over the horizon, carried values dense."""
    params = exsub_params(task.d * task.lengths[level] + task.s, task.s, task.epsilon,
                          task.m[level])  # fmt: skip
    device = ExSubDevice(params, task.d, task.r, level, lambda: uniform(uniform_source))
    out, last = [], None
    for value in values:
        last = value if value is not None else last
        block = device.push(dense(last, task.d, task.kind))
        if block is not None:
            t, symbols = block
            out.append((t, [[k - (t - 1) * task.d, sign] for k, sign in symbols]))
    return out


def test_fed_the_same_draws_the_device_emits_the_servers_symbols() -> None:
    """300 random horizons (one-hot and bitmask, random m_h, the device skipping slots): the
    device's blocks and symbols equal ``ExSubDevice``'s driven by the same uniforms."""
    rng = random.Random(5)
    symbols = 0
    for trial in range(300):
        T, r, d, kind = rng.choice([4, 8, 9]), rng.choice([2, 3]), rng.randint(1, 5), rng.choice(["onehot", "bits"])  # fmt: skip
        s = rng.randint(1, 4)
        H = len(make_task(T=T, r=r, s=s, d=d).m)
        m = tuple(rng.randint(1, d * (T // r**h) + s) for h in range(H))
        task = make_task(T=T, r=r, s=s, d=d, kind=kind, m=m, first_slot=rng.randint(1, 50))
        values = random_values(rng, T, d, kind)
        device = Sao2Device(f"dev-{trial}", rng=SeededRandomness(trial))
        assert device.begin(as_obj(task))
        got = []
        for k, value in enumerate(values):  # skipped slots are carried forward on the device
            if value is not None or rng.random() < 0.3 or k == T - 1:
                got += device.push(task.first_slot + k, value)
        want = server_transcript(task, task.level_of(f"dev-{trial}"), values,
                                 SeededRandomness(trial))  # fmt: skip
        assert [(rep["block"], rep["symbols"]) for rep in got] == want
        symbols += sum(len(rep["symbols"]) for rep in got)
    assert symbols > 300


def exact_transcript_law(task: Sao2Task, level: int, support: set[tuple[int, int]]
                         ) -> dict[frozenset[tuple[int, int]], float]:  # fmt: skip
    """The law of the sent symbols: every ExSub output ``Z`` of ``d'`` coordinates with
    ``P = e^{ε·u}/Ω`` (``u = 0`` iff ``Z`` meets ``S_R``, stubs included), projected on the
    ``d·T_h`` real coordinates (stub symbols are never sent)."""
    D = task.d * task.lengths[level]
    d_prime, m = D + task.s, task.m[level]
    stubs = {(D + k, 1) for k in range(task.s - len(support))}
    s_r = support | stubs
    law: Counter[frozenset[tuple[int, int]]] = Counter()
    for coords in itertools.combinations(range(d_prime), m):
        for signs in itertools.product((1, -1), repeat=m):
            z = set(zip(coords, signs, strict=True))
            weight = 1.0 if z & s_r else math.exp(-task.epsilon)
            law[frozenset(x for x in z if x[0] < D)] += weight
    total = sum(law.values())
    return {k: v / total for k, v in law.items()}


@pytest.mark.parametrize(("level", "values", "support"), [
    (0, [None, 1, None, 0], {(3, 1), (6, 1)}),  # clipped: bit 1 stays on at τ = 4
    (0, [None, None, 1, 1], {(5, 1)}),  # one change: one stub symbol
    (1, [0, 1, None, 1], set()),  # clipped to x̃ = 0 from τ = 2: no level-1 change, 2 stubs
])  # fmt: skip
def test_the_transcript_law_is_the_exact_exsub_law(
    level: int, values: list[int | None], support: set[tuple[int, int]]
) -> None:
    """d = 2 one-hot, T = 4, r = 2, s = 2, ε = 1, m_h = 2: 30,000 device horizons. χ² of the
    transcripts (flattened symbols) against the exact projected law below the 1 − 1e−6
    quantile of χ²_{K−1}; the TV distance below ``E[TV]·(1 + 5·0.603/(0.798·√K))``: for
    multinomial frequencies, ``|p̂_k − p_k|`` is about half-normal of scale
    ``σ_k = √(p_k(1−p_k)/N)``, mean ``0.798σ_k``, sd ``0.603σ_k``, so the TV's sd is about
    ``0.603/(0.798·√K)`` of its mean; and the law at ε = 0.5 is refused (the test's power)."""
    task = make_task(T=4, r=2, s=2, d=2, m=(2, 2, 2), eps=1.0)
    law = exact_transcript_law(task, level, support)
    name, n = device_at(task, level), 30_000
    seen: Counter[frozenset[tuple[int, int]]] = Counter()
    obj = as_obj(task)
    for k in range(n):
        device = Sao2Device(name, rng=SeededRandomness(1000 + k))
        device.begin(obj)
        reports = [rep for t, v in enumerate(values) for rep in device.push(t + 1, v)]
        assert len(reports) == task.lengths[level]
        seen[frozenset((c + (rep["block"] - 1) * task.d, sg) for rep in reports
                       for c, sg in rep["symbols"])] += 1  # fmt: skip
    assert set(seen) <= set(law)
    keys = sorted(law, key=sorted)
    observed = np.asarray([seen[key] for key in keys], dtype=float)
    K = len(keys)
    limit = stats.chi2.ppf(1 - 1e-6, K - 1)
    chi2 = float(((observed - n * np.asarray([law[k] for k in keys])) ** 2
                  / (n * np.asarray([law[k] for k in keys]))).sum())  # fmt: skip
    assert chi2 < limit
    p = np.asarray([law[k] for k in keys])
    tv = 0.5 * float(np.abs(observed / n - p).sum())
    floor = 0.5 * float(np.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())
    assert tv < floor * (1 + 5 * 0.603 / (0.798 * math.sqrt(K)))
    wrong = exact_transcript_law(make_task(T=4, r=2, s=2, d=2, m=(2, 2, 2), eps=0.5), level,
                                 support)  # fmt: skip
    q = np.asarray([wrong[k] for k in keys])
    assert float(((observed - n * q) ** 2 / (n * q)).sum()) > limit


# -- (d) wire reports and (f) unbiased estimates from a fleet ----------------------------------


def population(n: int, T: int, d: int, seed: int) -> np.ndarray:
    """``(T, n)`` one-hot values, −1: none new. A user's first value comes at a random slot (or
    never), and it may move once: at most 3 changes, so nothing is clipped at ``s = 3``."""
    rng = np.random.default_rng(seed)
    values = np.full((T, n), -1, dtype=np.int64)
    start = rng.integers(0, T + 2, n)
    move = rng.integers(0, T + 4, n)
    first, second = rng.integers(0, d, n), rng.integers(0, d, n)
    for j in range(n):
        if start[j] < T:
            values[start[j], j] = first[j]
            if start[j] < move[j] < T:
                values[move[j], j] = second[j]
    return values


def truth(values: np.ndarray, d: int) -> np.ndarray:
    """``x̄_τ``: the mean of the carried one-hot values (zero before a user's first)."""
    T, n = values.shape
    last = np.full(n, -1)
    out = np.zeros((T, d))
    for t in range(T):
        last = np.where(values[t] >= 0, values[t], last)
        out[t] = np.bincount(last[last >= 0], minlength=d) / n
    return out


def estimate(task: Sao2Task, lines: list[list[str]], n_h: list[int] | None) -> np.ndarray:
    """The server side: each block's batch counts through E1 (``n_h``, or the batch size when
    None), Algorithm 2 (``SlotReconstructor``) at every slot."""
    recon, out = SlotReconstructor(task.T, task.d, task.r), []
    for tau, slot_lines in enumerate(lines, start=1):
        reports = [decode(line, Sao2Report) for line in slot_lines]
        for h, block in task.ending(task.first_slot + tau - 1):
            batch = [rep for rep in reports if (rep.level, rep.block) == (h, block)]
            plus, minus = counts_of(batch, task.d)
            params = exsub_params(task.d * task.lengths[h] + task.s, task.s, task.epsilon,
                                  task.m[h])  # fmt: skip
            n = len(batch) if n_h is None else n_h[h]
            recon.put(h, block, value_estimate(np.asarray(plus), np.asarray(minus), n, params))
        out.append(recon.release(tau))
    return np.asarray(out)


N_FLEET, D, T, S, EPS = 3000, 4, 8, 3, 2.0


def fleet_mechanism(m: tuple[int, ...] | None = None) -> Sao2Mechanism:
    """The server's SaO2 for the fleet's setting (its ``m*`` and ``stderr``)."""
    return Sao2Mechanism(Sao2Config(epsilon=EPS, window=T, population=N_FLEET,
                                    task=BinaryTask(D), s=S, r=2, m=m))  # fmt: skip


@pytest.fixture(scope="module")
def fleet_run() -> tuple[Sao2Task, np.ndarray, list[list[str]], list[int], Any]:
    m = fleet_mechanism().m_h
    task = make_task(T=T, r=2, s=S, d=D, eps=EPS, m=m, first_slot=17)
    values = population(N_FLEET, T, D, seed=3)
    devices = [f"phone-{j}" for j in range(N_FLEET)]
    lines, stats_ = run_horizon(task, devices, values, seed=9)
    n_h = np.bincount([task.level_of(x) for x in devices], minlength=len(m)).tolist()
    return task, values, lines, n_h, stats_


def test_fleet_reports_decode_fit_and_come_at_every_block_end(fleet_run: Any) -> None:
    task, _, lines, n_h, stats_ = fleet_run
    assert stats_.enrolled == N_FLEET and stats_.dropped == 0
    for tau, slot_lines in enumerate(lines, start=1):
        reports = [decode(line, Sao2Report) for line in slot_lines]
        assert all(rep.fits(task) is None for rep in reports)
        assert [rep.to_json() for rep in reports] == slot_lines  # the canonical text
        per_block = Counter((rep.level, rep.block) for rep in reports)
        assert per_block == {(h, b): n_h[h] for h, b in task.ending(task.first_slot + tau - 1)}
    sent = Counter()
    for rep in (decode(x, Sao2Report) for slot_lines in lines for x in slot_lines):
        sent[(rep.level, rep.device)] += len(rep.symbols)
    assert all(k <= task.m[h] for (h, _), k in sent.items())


def test_fleet_estimates_are_unbiased(fleet_run: Any) -> None:
    """3,000 devices, d = 4, T = 8, s = 3, ε = 2: every ``x̂̄_τ[i]`` within 4 standard errors of
    the truth, the SE being ``Sao2Mechanism.stderr`` (Lemma B.1's ``max(V_nz, V_z)/n_h`` per
    residue used: an upper bound; the within-user covariance it ignores is 0 between
    coordinates outside a user's support, spec §4.6). 32 estimates at |z| < 4: a false alarm
    has probability < 32·6.3e−5 = 0.2% (fixed seeds)."""
    task, values, lines, n_h, _ = fleet_run
    mech = fleet_mechanism(task.m)
    se = np.asarray([mech.stderr(tau, tuple(n_h)) for tau in range(1, T + 1)])
    x = truth(values, D)
    assert x.max() > 0.15  # a population with mass to estimate
    z = (estimate(task, lines, n_h) - x) / se[:, None]
    assert np.abs(z).max() < 4


def test_dropouts_bias_the_enrolled_count_but_not_the_batch_size() -> None:
    """3,000 devices all in category 1 from the first slot (d = 2, T = 4, s = 1, ε = 2, m*),
    a quarter of them never get the task: dividing by each batch's size ``n`` (the shuffler's
    manifest) stays within 4 standard errors (dropouts are independent of the data); dividing
    by the level's enrolled count ``n_h`` (what the public rule names) shrinks ``x̂̄_τ[1]`` by
    about 1/4, i.e. 0.25/SE ≈ 5–6 standard errors (SE 0.04–0.05 here), so |z| > 4."""
    mech = Sao2Mechanism(Sao2Config(epsilon=2.0, window=4, population=N_FLEET,
                                    task=BinaryTask(2), s=1, r=2))  # fmt: skip
    task = make_task(T=4, r=2, s=1, d=2, eps=2.0, m=mech.m_h)
    values = np.full((4, N_FLEET), -1, dtype=np.int64)
    values[0] = 1
    devices = [f"phone-{j}" for j in range(N_FLEET)]
    lines, stats_ = run_horizon(task, devices, values, seed=2, dropout=0.25)
    assert abs(stats_.dropped - 750) < 5 * math.sqrt(N_FLEET * 0.25 * 0.75)
    n_h = np.bincount([task.level_of(x) for x in devices], minlength=3).tolist()
    reporting = tuple(round(0.75 * n) for n in n_h)
    se = np.asarray([mech.stderr(tau, reporting) for tau in range(1, 5)])[:, None]
    x = truth(values, 2)
    assert np.abs((estimate(task, lines, None) - x) / se).max() < 4
    assert np.abs((estimate(task, lines, n_h) - x) / se).max() > 4


# -- the device: values, slots, the lifetime ledger and its store ------------------------------


def test_values_outside_the_domain_are_refused_without_naming_them() -> None:
    device = Sao2Device("dev-1", rng=SeededRandomness(1))
    assert device.begin(as_obj(make_task(d=4)))
    for bad in (4, -3, 7.0, True):
        with pytest.raises(ValueError) as err:
            device.push(1, bad)  # type: ignore[arg-type]
        assert str(bad) not in str(err.value).replace("[0, 4)", "")
    device.push(3, 1)
    with pytest.raises(ValueError, match="already pushed"):
        device.push(2, 1)
    bits = Sao2Device("dev-2")
    assert bits.begin(as_obj(make_task(d=3, kind="bits")))
    bits.push(1, 7)
    with pytest.raises(ValueError):
        bits.push(2, 8)


def run_horizon_on(device: Sao2Device, task: Sao2Task, value: int = 1) -> list[dict[str, Any]]:
    return [rep for t in range(task.T) for rep in device.push(task.first_slot + t, value)]


@pytest.mark.parametrize(("eps", "k"), [(0.5, 3), (0.1, 3), (1 / 3, 6), (0.7, 1)])
def test_the_lifetime_ledger_refuses_horizon_k_plus_1_and_survives_a_restart(
    tmp_path: Path, eps: float, k: int
) -> None:
    """ε_life = k·ε (as a float product and, for k = 3, as a float sum): horizons 0..k−1 enrol,
    horizon k is refused (``exhausted``), also by a device restarted from its store."""
    for life in {k * eps, sum([eps] * k)}:
        path = tmp_path / f"{life!r}.json"
        device = Sao2Device("dev-7", FileStore(path, create=True), SeededRandomness(1))
        for h in range(k):
            task = make_task(T=4, eps=eps, life=life, horizon=h, first_slot=1 + 4 * h)
            if 0 < h == k - 1:  # restart before the last horizon
                device = Sao2Device("dev-7", FileStore(path), SeededRandomness(2))
            assert device.begin(as_obj(task)), device.refusal
            assert len(run_horizon_on(device, task)) == task.lengths[task.level_of("dev-7")]
        again = Sao2Device("dev-7", FileStore(path), SeededRandomness(3))
        last = make_task(T=4, eps=eps, life=life, horizon=k, first_slot=1 + 4 * k)
        assert not again.begin(as_obj(last))
        assert again.refusal is not None and again.refusal.reason == "exhausted"
        raised = make_task(T=4, eps=eps, life=10 * life, horizon=k + 1, first_slot=1 + 4 * k)
        assert not again.begin(as_obj(raised))  # the first ε_life stays pinned
        stale = make_task(T=4, eps=eps, life=life, horizon=0)
        assert not again.begin(as_obj(stale)) and again.refusal.reason == "stale"


def test_a_missing_or_corrupt_store_refuses_and_a_cap_is_kept(tmp_path: Path) -> None:
    task = as_obj(make_task(eps=0.5, life=2.0))
    missing = Sao2Device("d", FileStore(tmp_path / "none.json"))
    assert not missing.begin(task) and missing.refusal.reason == "store"  # type: ignore[union-attr]
    path = tmp_path / "ledger.json"
    Sao2Device("d", FileStore(path, create=True)).begin(task)
    path.write_text(path.read_text().replace('"horizon"', '"horizom"'))
    corrupt = Sao2Device("d", FileStore(path))
    assert not corrupt.begin(task) and corrupt.refusal.reason == "store"  # type: ignore[union-attr]
    assert corrupt.push(1, 0, "st") == []
    capped = Sao2Device("d", max_lifetime_epsilon=1.0)
    assert not capped.begin(task) and capped.refusal.reason == "policy"  # type: ignore[union-attr]


def test_a_restart_mid_horizon_resumes_without_drawing_a_block_twice(tmp_path: Path) -> None:
    """A device stopped after slot 5 and restarted from its store (same randomness stream)
    sends exactly the reports of an uninterrupted device, each block once."""
    task = make_task(T=8, s=3, d=4, m=(5, 4, 3, 2), eps=1.0)
    name = device_at(task, 0)
    values = [None, 2, None, None, 3, None, 1, None]
    whole = Sao2Device(name, rng=SeededRandomness(8))
    whole.begin(as_obj(task))
    want = [rep for t, v in enumerate(values, start=1) for rep in whole.push(t, v)]
    rng = SeededRandomness(8)
    first = Sao2Device(name, FileStore(tmp_path / "s.json", create=True), rng)
    first.begin(as_obj(task))
    got = [rep for t, v in enumerate(values[:5], start=1) for rep in first.push(t, v)]
    second = Sao2Device(name, FileStore(tmp_path / "s.json"), rng)
    assert second.begin(as_obj(task))  # resumes: no new charge, no new subgroup
    got += [rep for t, v in enumerate(values[5:], start=6) for rep in second.push(t, v)]
    assert got == want and [rep["block"] for rep in got] == list(range(1, 9))
    assert not second.begin(as_obj(task))  # the horizon is over: enrolled already


def test_values_carry_across_horizons_and_before_the_first_slot() -> None:
    """The last value carries into the next horizon (the server's clients keep it); a value
    pushed before the horizon's first slot is the device's value at its first slot."""
    task = make_task(T=4, r=2, s=2, d=2, m=(2, 2, 2), eps=1.0, life=2.0, first_slot=5)
    name = device_at(task, 2)
    early = Sao2Device(name, rng=SeededRandomness(4))
    early.begin(as_obj(task))
    early.push(2, 1)
    reports = [rep for t in range(5, 9) for rep in early.push(t, None)]
    direct = Sao2Device(name, rng=SeededRandomness(4))
    direct.begin(as_obj(task))
    assert reports == [rep for t in range(5, 9) for rep in direct.push(t, 1 if t == 5 else None)]
    nxt = make_task(T=4, r=2, s=2, d=2, m=(2, 2, 2), eps=1.0, life=2.0, first_slot=9, horizon=1)
    twin = SeededRandomness(0)
    twin._rng.setstate(early.rng._rng.getstate())  # type: ignore[attr-defined]
    assert early.begin(as_obj(nxt))
    later = [rep for t in range(9, 13) for rep in early.push(t, None)]
    want = server_transcript(nxt, 2, [1, None, None, None], twin)
    assert [(rep["block"], rep["symbols"]) for rep in later] == want


def test_a_fleet_over_stores_keeps_the_ledgers(tmp_path: Path) -> None:
    devices = [f"phone-{j}" for j in range(40)]
    fleet = Sao2Fleet(devices, seed=1, store_dir=tmp_path)
    task = make_task(T=4, eps=1.0, life=1.0)
    assert fleet.begin(task).enrolled == 40
    lines = [fleet.push(t, np.full(40, 1)) for t in range(1, 5)]
    assert sum(map(len, lines)) == sum(task.lengths[task.level_of(x)] for x in devices)
    again = Sao2Fleet(devices, seed=1, store_dir=tmp_path)
    stats_ = again.begin(make_task(T=4, eps=1.0, life=1.0, horizon=1, first_slot=5))
    assert stats_.enrolled == 0 and stats_.refused == Counter({"exhausted": 40})
