"""DPI's harness baselines B1 (``DPI-uniform``) and B3 (``Laplace-horizon``), spec dpi.md §7.

Engine-free: each test steps a mechanism slot by slot through ``SimulatedCurator`` with keyed
``SlotRandomness`` (fixed seeds). The statistical check of B3's noise compares the sample mean
and variance of ``M`` draws with the discrete Laplace's: the sample variance of ``M`` i.i.d.
draws has standard deviation ``√((m₄ − σ⁴)/M)`` (``m₄`` the fourth moment, summed exactly from
the pmf), the sample mean ``σ/√M``; the tolerance is ``TOL_SD`` of those.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.families.dpi import FAMILY, recompute_horizon
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import ExtraRecord, LedgerEntry, Release, Slot
from privstream.mechanisms.dpi import DpiConfig, DpiMechanism, DpiState
from privstream.mechanisms.dpi_baselines import (
    MECHANISMS,
    DPIUniform,
    HorizonLedger,
    LaplaceHorizon,
    horizon_scale,
    noisy_histogram,
)
from privstream.mechanisms.dpi_boosting import normalized
from privstream.mechanisms.driver import Lane, drive_slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import LifetimeScope, PureDP
from privstream.mechanisms.noise import discrete_laplace_variance
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

TOL_SD = 5.0
N, K = 600, 10
Values = Callable[[int], NDArray[np.int64]]


def _config(epsilon: float = 1.0, window: int = 6, k: int = K, **kw: Any) -> DpiConfig:
    return DpiConfig(epsilon=epsilon, window=window, population=N, task=FrequencyTask(k), **kw)


def _values(seed: int, k: int = K) -> Values:
    """One value (or none, −1) per user per slot, drifting with the slot."""

    def at(t: int) -> NDArray[np.int64]:
        rng = np.random.default_rng([seed, t])
        v = rng.integers(0, k, size=N)
        return np.where(rng.random(N) < 0.3, -1, v).astype(np.int64)

    return at


def _slot(mech: DpiMechanism, values: Values, t: int, seed: int = 7) -> Slot:
    curator = SimulatedCurator(values(t), mech.config.task, Requirements(population=N))
    return Slot("s", t, curator, SlotRandomness(seed, "s", t, scope=mech.name))


def _drive(
    mech: DpiMechanism, values: Values, slots: int, seed: int = 7
) -> tuple[DpiState, list[tuple[Release, LedgerEntry]]]:
    state, out = mech.initial_state(), []
    for t in range(1, slots + 1):
        state, events = mech.step(state, _slot(mech, values, t, seed))
        release, entry, audit = events[:3]
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        assert isinstance(audit, ExtraRecord) and audit.output == "dpi-audit"
        out.append((release, entry))
    return state, out


def test_both_are_registered_in_the_dpi_family_on_its_contract() -> None:
    assert set(MECHANISMS) == {"DPI-uniform", "Laplace-horizon"}
    assert {"DPI", "DPI-paper", "DPI-prior", "DPI-uniform", "Laplace-horizon"} == set(
        FAMILY.mechanisms
    )
    for cls in MECHANISMS.values():
        assert cls.trust_modes == ("cdp",) and issubclass(cls, DpiMechanism)
        mech = FAMILY.build(cls.name, _config())
        assert (
            mech.privacy_cost.measure == PureDP(1.0) and mech.privacy_cost.scope == LifetimeScope()
        )


# -- B1 -----------------------------------------------------------------------------------------


def test_b1_releases_exactly_uniform_whatever_the_data_and_charges_nothing() -> None:
    mech = DPIUniform(_config(queries=("acc", "inst", "mean")))
    _, a = _drive(mech, _values(1), 12)
    _, b = _drive(mech, _values(2), 12)
    assert [r for r, _ in a] == [r for r, _ in b]  # data-independent, byte for byte
    assert {r.estimate for r, _ in a} == {(1.0 / K,) * K}
    assert len({r.key for r, _ in a}) > 1  # the query is drawn from the pool, keyed
    for _, entry in a:
        (cls,) = entry.classes
        assert (cls.charged, cls.spent, cls.budget) == (0.0, 0.0, 1.0)
        assert entry.guarantee.measure == PureDP(1.0)  # ε as its cap, nothing spent


# -- B3 -----------------------------------------------------------------------------------------


def _dlap_fourth_moment(b: float) -> float:
    x = np.arange(1, int(60 * b) + 10, dtype=np.float64)
    w = np.exp(-x / b)
    return float(2.0 * np.sum(x**4 * w) / (1.0 + 2.0 * np.sum(w)))


@pytest.mark.parametrize(("epsilon", "horizon"), [(1.0, 10), (0.5, 3)])
def test_b3_noise_is_discrete_laplace_at_scale_2T_over_epsilon(
    epsilon: float, horizon: int
) -> None:
    b = 2 * horizon / epsilon
    assert horizon_scale(epsilon, horizon) == b  # on the public grid exactly
    m = 40_000
    counts = np.full(m, 50, dtype=np.int64)
    noise = noisy_histogram(counts, epsilon, horizon, np.random.default_rng(2024)) - counts
    var = discrete_laplace_variance(b)
    sd_var = math.sqrt((_dlap_fourth_moment(b) - var**2) / m)
    assert abs(float(np.mean(noise))) <= TOL_SD * math.sqrt(var / m)
    assert abs(float(np.var(noise)) - var) <= TOL_SD * sd_var
    assert noise.dtype == np.int64


def test_b3_releases_the_clipped_normalised_noisy_histogram_of_the_slot() -> None:
    mech = LaplaceHorizon(_config(window=20, queries=("inst",)))
    values = _values(3)
    _, steps = _drive(mech, values, 5)
    for t, (release, _) in enumerate(steps, start=1):
        slot = _slot(mech, values, t)
        counts = np.bincount(values(t)[values(t) >= 0], minlength=K)
        noisy = noisy_histogram(counts, 1.0, 20, slot.randomness("dpi/laplace"))
        assert release.estimate == tuple(normalized(np.maximum(noisy, 0)))
        assert release.key == (("query", "inst"),)


def test_b3_all_clipped_slot_releases_uniform() -> None:
    mech = LaplaceHorizon(_config(epsilon=0.1, window=50, k=2, queries=("inst",)))
    _, steps = _drive(mech, lambda t: np.full(N, -1, dtype=np.int64), 30)
    assert (0.5, 0.5) in {r.estimate for r, _ in steps}  # both bins clipped to 0 at some slot


def test_b3_releases_are_pdfs_for_every_query() -> None:
    mech = LaplaceHorizon(_config(window=40, queries=("acc", "inst", "mean")))
    _, steps = _drive(mech, _values(4), 40)
    assert {r.key[0][1] for r, _ in steps} == {"acc", "inst", "mean"}
    for release, _ in steps:
        pdf = np.array(release.estimate)
        assert pdf.shape == (K,) and (pdf >= 0).all() and abs(pdf.sum() - 1.0) < 1e-12


def test_b3_ledger_reaches_epsilon_at_T_and_refuses_slot_T_plus_1_before_release() -> None:
    T, eps = 6, 1.0
    mech = LaplaceHorizon(_config(epsilon=eps, window=T))
    values = _values(5)
    state, steps = _drive(mech, values, T)
    entries = [e for _, e in steps]
    assert [e.classes[0].charged for e in entries] == [eps / T] * T
    assert [e.classes[0].spent for e in entries] == [float(eps * t / T) for t in range(1, T + 1)]
    assert entries[-1].classes[0].spent == eps  # exactly ε at slot T
    details = [e.details for e in entries]
    assert all(isinstance(d, HorizonLedger) and d.horizon == T for d in details)
    horizon = [d for d in details if isinstance(d, HorizonLedger)]
    assert [d.exhausted for d in horizon] == [False] * (T - 1) + [True]
    assert entries[0].division == "dpi-horizon"
    before = pickle.dumps(state)
    with pytest.raises(PrivacyBudgetExceeded, match=r"horizon of T = 6 slots is spent"):
        mech.step(state, _slot(mech, values, T + 1))
    assert pickle.dumps(state) == before  # nothing of slot T+1 was charged or released


def test_b3_halts_the_stream_with_a_reason_and_releases_nothing_more() -> None:
    mech = LaplaceHorizon(_config(window=2))
    lane = Lane(mech, mech.initial_state())
    values = _values(6)
    released = []
    for t in (1, 2, 3):

        def port_for(_name: str, _r: SlotRandomness, _c: Any, t: int = t) -> SimulatedCurator:
            return SimulatedCurator(values(t), mech.config.task, Requirements(population=N))

        def randomness_for(name: str, t: int = t) -> SlotRandomness:
            return SlotRandomness(7, "s", t, scope=name)

        step = drive_slot({mech.name: lane}, "s", t, port_for, randomness_for)
        if mech.name in step.stepped:
            lane.state = step.stepped[mech.name].state
            released += [e for e in step.stepped[mech.name].events if isinstance(e, Release)]
    assert [r.slot for r in released] == [1, 2]
    (halt,) = step.halts
    assert halt.violation and "slot 3" in halt.reason and "--window T" in halt.reason


def test_b3_audit_recomputes_epsilon_over_T_and_flags_an_entry_past_the_horizon() -> None:
    T = 4
    mech = LaplaceHorizon(_config(epsilon=2.0, window=T))
    _, steps = _drive(mech, _values(7), T)
    dicts = [e.to_dict() for _, e in steps]
    got = recompute_horizon(dicts)
    assert [(s, spent) for s, spent, _ in got] == [(t, 2.0 * t / T) for t in range(1, T + 1)]
    assert [spent for _, spent, _ in got] == [e.classes[0].spent for _, e in steps]
    forged = {**dicts[-1], "slot": T + 1}
    *_, (slot, spent, budget) = recompute_horizon([*dicts, forged])
    assert slot == T + 1 and spent > budget == 2.0


def test_b3_window_is_its_horizon_and_dpi_ignores_it() -> None:
    assert LaplaceHorizon(_config(window=37)).horizon == 37
    assert LaplaceHorizon.conformance.window > 3 * LaplaceHorizon.conformance.slots
    assert _config(window=0).window == 0  # DPI's own config accepts it (DPI ignores window)
    with pytest.raises(ValueError, match=r"window >= 1 \(--window T\)"):
        LaplaceHorizon(_config(window=0))
