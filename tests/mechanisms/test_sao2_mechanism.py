"""SaO2 as a privstream mechanism (``mechanisms.sao2``), engine-free in ``ldp-simulated``: every
test steps it slot by slot through ``SimulatedClientPort``, handing the devices' state of one
slot to the next as the operator does.

Statistics (fixed seeds). Over ``RUNS`` independent runs (seeds) of one population, the mean
error of each release coordinate has standard deviation at most ``SE_t/√RUNS``: ``SE_t`` is
spec §5.2's bound ``√(Σ digit_h(t)·max(V_nz,h, V_z,h)/n_h)`` (per-user variances of Lemma B.1
at their maximum), so ``z = mean error / (SE_t/√RUNS)`` is at most standard normal in spread and
``|z| < Z_MAX = 4`` over the 48 cells fails with probability below 48·6.3e−5 ≈ 0.3 % for an
unbiased estimator. A range's bound is ``√(Σ_h Σ_j coef(h, j)²·max V_h/n_h)``, ``coef`` the
number of its slots that add residue ``(h, j)`` (Algorithm 2; spec §3.5), horizons independent.
The true means are 0.1–0.5 and ``SE_t/√RUNS`` is 0.019–0.038 (n = 12,000), so a bias of
0.1 shows as |z| ≈ 3–5: checked by hand, every level mean scaled by 1/1.3 fails the release test
and four of the five range tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import privstream.families.sao2  # noqa: F401  (registers the sao2-lifetime division)
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import LifetimeScope, PureDP
from privstream.mechanisms.sao2 import (
    ACCOUNTANT,
    Sao2Config,
    Sao2Ledger,
    Sao2Mechanism,
    Sao2Release,
)
from privstream.mechanisms.sao2_encoding import usage
from privstream.mechanisms.sao2_exsub import optimal_m
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.shuffle_accountant import classical_bound
from privstream.mechanisms.tasks import MeanTask

N, D, T, S = 12_000, 3, 8, 4  # H = 4 levels at r = 2
HORIZONS, RUNS, Z_MAX = 2, 24, 4.0
Values = Callable[[int], NDArray[np.int64]]


def synthetic(n: int, horizons: int, seed: int = 1) -> NDArray[np.int64]:
    """``(horizons·T, n)`` categories (−1: no value). Per horizon each user starts in a cell
    (probabilities 0.5/0.3/0.2), 20 % join late (no value before a uniform slot 2..4) and half
    move once, at a uniform slot 5..8, to another cell: at most 3 ≤ s changes per horizon."""
    rng = np.random.default_rng(seed)
    out = np.empty((horizons * T, n), dtype=np.int64)
    for k in range(horizons):
        first = rng.choice(D, n, p=[0.5, 0.3, 0.2])
        second = (first + rng.integers(1, D, n)) % D
        move = np.where(rng.random(n) < 0.5, rng.integers(5, T + 1, n), T + 1)
        join = np.where(rng.random(n) < 0.2, rng.integers(2, 5, n), 1)
        for tau in range(1, T + 1):
            row = np.where(tau >= move, second, first)
            out[k * T + tau - 1] = np.where(tau >= join, row, -1)
    return out


def truth(values: NDArray[np.int64]) -> NDArray[np.float64]:
    """``x̄_t``: the mean one-hot vector, a user without a value counting as 0 (never released)."""
    return np.stack([np.bincount(v[v >= 0], minlength=D) / v.size for v in values])


def config(**changes: Any) -> Sao2Config:
    base = Sao2Config(
        epsilon=1.0, window=T, population=N, task=BinaryTask(D), s=S, lifetime_epsilon=2.0
    )
    return dataclasses.replace(base, **changes)


def run(
    mech: Sao2Mechanism,
    values: Values,
    slots: range,
    seed: int,
    state: Any = None,
    clients: Any = None,
) -> tuple[Any, Any, list[tuple[Release, LedgerEntry]]]:
    state = mech.initial_state() if state is None else state
    clients = mech.client_state() if clients is None else clients
    out = []
    for t in slots:
        randomness = SlotRandomness(seed, "s", t, mech.name)
        port = SimulatedClientPort(values(t), mech.config.task, randomness, client_state=clients)
        state, (release, entry, *_) = mech.step(state, Slot("s", t, port, randomness))
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        if port.client_state_after is not None:
            clients = port.client_state_after
        out.append((release, entry))
    return state, clients, out


@cache
def population() -> NDArray[np.int64]:
    return synthetic(N, HORIZONS)


@cache
def runs() -> tuple[Sao2Mechanism, list[list[tuple[Release, LedgerEntry]]]]:
    mech = Sao2Mechanism(config())
    values = population()
    slots = range(1, HORIZONS * T + 1)
    return mech, [run(mech, lambda t: values[t - 1], slots, seed)[2] for seed in range(RUNS)]


def details(release: Release) -> Sao2Release:
    assert isinstance(release.details, Sao2Release)
    return release.details


def test_releases_are_unbiased_against_the_analytic_standard_error() -> None:
    mech, all_runs = runs()
    estimates = np.array([[r.estimate for r, _ in one] for one in all_runs])
    error = estimates.mean(axis=0) - truth(population())
    se = np.array([details(r).stderr for r, _ in all_runs[0]])
    z = error / (se[:, None] / math.sqrt(RUNS))
    assert np.abs(z).max() < Z_MAX
    # the SE is §5.2's: digit-weighted max(V_nz, V_z)/n_h (slot 8 of a horizon uses level 3 only)
    n_h = details(all_runs[0][7][0]).n_h
    assert se[7] == pytest.approx(math.sqrt(mech.variance[3] / n_h[3]))
    assert se[6] == pytest.approx(math.sqrt(sum(mech.variance[h] / n_h[h] for h in range(3))))
    # and it bounds the spread: the pooled squared error per SE² is at most 1 (+ 5 sd of the
    # mean of RUNS per-run averages, each of variance ≤ 2 as χ²₁-like terms however correlated)
    ratio = float((((estimates - truth(population())) / se[None, :, None]) ** 2).mean())
    assert ratio < 1 + 5 * math.sqrt(2 / RUNS)


def range_sd(mech: Sao2Mechanism, n_h: tuple[int, ...], a: int, b: int) -> float:
    """The range bound within one horizon, slots ``a..b`` (module docstring)."""
    total = 0.0
    for h, v in enumerate(mech.variance):
        coef = usage(T, 2, h)[a - 1 : b].sum(axis=0)
        total += float((coef**2).sum()) * v / n_h[h]
    return total


@pytest.mark.parametrize(("t1", "t2"), [(1, 16), (3, 6), (5, 12), (9, 9), (2, 15)])
def test_range_answers_from_the_released_prefix_sums_are_unbiased(t1: int, t2: int) -> None:
    mech, all_runs = runs()
    answers = []
    for one in all_runs:
        prefix = [np.zeros(D)] + [np.asarray(details(r).prefix) for r, _ in one]
        answers.append(prefix[t2] - prefix[t1 - 1])
    target = truth(population())[t1 - 1 : t2].sum(axis=0)
    var = 0.0
    for k in range(HORIZONS):  # horizons are independent
        a, b = max(t1, k * T + 1) - k * T, min(t2, (k + 1) * T) - k * T
        if a <= b:
            var += range_sd(mech, details(all_runs[0][k * T][0]).n_h, a, b)
    z = (np.mean(answers, axis=0) - target) / math.sqrt(var / RUNS)
    assert np.abs(z).max() < Z_MAX
    # the prefix is the running sum of the releases (post-processing, nothing else)
    one = all_runs[0]
    running = np.cumsum([r.estimate for r, _ in one], axis=0)
    assert np.allclose([details(r).prefix for r, _ in one], running, rtol=0, atol=1e-12)


def test_release_and_ledger_details() -> None:
    _mech, all_runs = runs()
    release, entry = all_runs[0][0]
    info, ledger = details(release), entry.details
    assert isinstance(ledger, Sao2Ledger)
    assert sum(info.n_h) == N and max(info.n_h) - min(info.n_h) <= 1  # uniform weights
    d_primes = tuple(D * (T // 2**h) + S for h in range(4))
    assert ledger.d_prime == d_primes
    assert info.m_h == ledger.m_h == tuple(optimal_m(dp, S, 1.0) for dp in d_primes)
    assert info.accountant == ACCOUNTANT == "classical-7.1"
    assert info.epsilon_central == tuple(classical_bound(1.0, n, 1e-5).epsilon for n in info.n_h)
    assert all(0 < e <= 1.0 for e in info.epsilon_central)
    assert release.guarantee.measure == PureDP(2.0) and release.guarantee.scope == LifetimeScope()
    assert release.guarantee.model == "ldp" and release.strategy == "publish"
    charged = [e.classes[0].charged for _, e in all_runs[0]]
    spent = [e.classes[0].spent for _, e in all_runs[0]]
    assert charged == [1.0] + [0.0] * 7 + [1.0] + [0.0] * 7  # ε once per horizon, at its start
    assert spent == [1.0] * 8 + [2.0] * 8
    assert [e.details.horizon for _, e in all_runs[0]] == [0] * 8 + [1] * 8  # type: ignore[attr-defined]


def small(n: int = 200, **changes: Any) -> tuple[Sao2Mechanism, Values]:
    mech = Sao2Mechanism(config(population=n, window=4, **changes))
    values = np.random.default_rng(2).integers(0, D, n)
    return mech, lambda t: values


def test_the_lifetime_budget_refuses_enrolment_beyond_it() -> None:
    mech, values = small(lifetime_epsilon=2.0)
    _, _, out = run(mech, values, range(1, 13), seed=5)
    ledgers = [e.details for _, e in out]
    assert all(isinstance(x, Sao2Ledger) for x in ledgers)
    starts = [ledgers[0], ledgers[4], ledgers[8]]
    assert [x.enrolled for x in starts] == [200, 200, 0]  # type: ignore[attr-defined]
    assert [x.refused for x in starts] == [0, 0, 200]  # type: ignore[attr-defined]
    assert [e.classes[0].charged for _, e in out[::4]] == [1.0, 1.0, 0.0]
    assert max(e.classes[0].spent for _, e in out) == 2.0 == out[-1][1].budget
    third = [r for r, _ in out[8:]]
    assert all(r.strategy == "approximate" and r.estimate == out[7][0].estimate for r in third)
    assert all(details(r).stderr is None and r.source_slot == 8 for r in third)


def test_users_with_spent_lifetime_are_not_enrolled_and_the_invariant_refuses_before_release() -> (
    None
):
    mech, values = small(lifetime_epsilon=1.5)
    state = mech.initial_state()
    state.horizons[:80] = 1  # these users already spent ε = 1 of 1.5
    state2, _, out = run(mech, values, range(1, 5), seed=5, state=state)
    ledger = out[0][1].details
    assert isinstance(ledger, Sao2Ledger)
    assert (ledger.enrolled, ledger.refused, ledger.lifetime_spent) == (120, 80, 1.0)
    assert sum(details(out[0][0]).n_h) == 120 and np.all(state2.level[:80] == -1)
    assert np.all(state2.horizons == 1)
    bad = mech.initial_state()
    bad.horizons[0] = 2  # a state that already broke the budget (restored under a larger one)
    before = pickle.dumps(bad)
    with pytest.raises(PrivacyBudgetExceeded):
        run(mech, values, range(1, 2), seed=5, state=bad)
    assert pickle.dumps(bad) == before


def dump(out: list[tuple[Release, LedgerEntry]]) -> str:
    return json.dumps([[r.to_dict(), e.to_dict()] for r, e in out], sort_keys=True)


def test_same_seed_same_bytes_and_a_pickled_state_resumes_identically() -> None:
    mech, values = small(n=300, lifetime_epsilon=3.0)
    whole = run(mech, values, range(1, 11), seed=7)[2]
    assert dump(whole) == dump(run(mech, values, range(1, 11), seed=7)[2])
    assert dump(whole) != dump(run(mech, values, range(1, 11), seed=8)[2])
    state, clients, head = run(mech, values, range(1, 4), seed=7)  # mid-horizon (T = 4)
    state, clients = pickle.loads(pickle.dumps(state)), pickle.loads(pickle.dumps(clients))
    tail = run(
        Sao2Mechanism(mech.config), values, range(4, 11), seed=7, state=state, clients=clients
    )[2]
    assert dump(head + tail) == dump(whole)


def test_the_step_is_pure() -> None:
    mech, values = small()
    state, clients, _ = run(mech, values, range(1, 3), seed=4)
    frozen_state, frozen_clients = pickle.dumps(state), pickle.dumps(clients)
    run(mech, values, range(3, 6), seed=4, state=state, clients=clients)
    assert pickle.dumps(state) == frozen_state and pickle.dumps(clients) == frozen_clients


@pytest.mark.parametrize(
    "changes",
    [
        {"lifetime_epsilon": 0.5},
        {"m": (3, 2)},
        {"m": (10_000, 2, 2, 2)},
        {"population": 3},
        {"task": MeanTask(0.0, 1.0)},
        {"s": 0},
        {"r": 1},
        {"weights": "best"},
        {"delta": 1.0},
    ],
)
def test_invalid_configs_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        config(**changes)


def test_weights_and_explicit_m_are_used() -> None:
    mech = Sao2Mechanism(config(weights="calibrated-paper", m=(2, 2, 2, 2)))
    assert mech.m_h == (2, 2, 2, 2)
    assert mech.weights.sum() == pytest.approx(1.0) and mech.weights[3] > mech.weights[0]
    optimal = Sao2Mechanism(config(weights="optimal"))
    assert optimal.weights.sum() == pytest.approx(1.0)
