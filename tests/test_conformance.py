"""One conformance suite over every registered mechanism (design §10 item 4, river-style).

Each mechanism must: restore from a pickled snapshot and continue identically; give the same
releases for the same seed; release identically when a slot is replayed; charge no more than
its declared privacy cost; reject bad configuration with a ValueError naming the field; refuse
an incompatible state version; keep ``step`` pure; and document its guarantee and spec section.

Slots carry the port of the mechanism's trust mode: simulated LDP clients, or a trusted curator
(``cdp``) over the same values with personalized requirements (spec personalized-w-event §1.1)
where a third of the users keep the stream default.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

from privstream.mechanisms.client import Requirements, SimulatedClientPort, SimulatedCurator
from privstream.mechanisms.contract import LedgerEntry, Mechanism, Release, Slot
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.registry import REGISTRY, Registered
from privstream.mechanisms.seeding import SlotRandomness

N, T, SEED = 400, 24, 11
IDS = [f"{r.family}:{r.name}" for r in REGISTRY]
TRUST = {r.name: r.trust for r in REGISTRY}
# Personalized requirements for the cdp examples (stream default ε = 1, w = 5): NaN/0 = default.
REQUIREMENTS = Requirements(np.resize([np.nan, 1.0, 2.0, 1.5], N), np.resize([0, 3, 5, 2, 5], N))


def population_values(t: int) -> np.ndarray:
    """A drifting binary population so adaptive mechanisms both publish and approximate."""
    rng = np.random.default_rng([99, t])
    p = 0.2 + 0.15 * np.sin(t / 3)
    return (rng.random(N) < p).astype(np.float64)


def make_slot(mech: Mechanism[Any, Any], t: int, seed: int = SEED) -> Slot:
    randomness = SlotRandomness(seed, "conf", t)
    values, task = population_values(t), mech.config.task
    if TRUST[mech.name] == "cdp":
        return Slot("conf", t, SimulatedCurator(values, task, REQUIREMENTS), randomness)
    return Slot("conf", t, SimulatedClientPort(values, task, randomness), randomness)


def run(
    mech: Mechanism[Any, Any], state: Any, slots: range, seed: int = SEED
) -> tuple[Any, list[Any]]:
    events: list[Any] = []
    for t in slots:
        state, out = mech.step(state, make_slot(mech, t, seed))
        events.extend(out)
    return state, events


def releases(events: list[Any]) -> list[Release]:
    return [e for e in events if isinstance(e, Release)]


@pytest.fixture(params=REGISTRY, ids=IDS)
def registered(request: pytest.FixtureRequest) -> Registered:
    return request.param  # type: ignore[no-any-return]


def test_every_family_member_is_registered() -> None:
    assert {r.name for r in REGISTRY if r.family == "ldp-ids"} == {
        "LBU",
        "LSP",
        "LPU",
        "LBD",
        "LBA",
        "LPD",
        "LPA",
    }
    assert {r.name for r in REGISTRY if r.family == "personalized"} == {
        "BD",
        "BA",
        "Uniform",
        "Sample",
        "PLBU",
        "PU",
        "PBD",
        "PBA",
    }
    assert all(r.trust == "cdp" for r in REGISTRY if r.family == "personalized")


def test_one_release_and_one_ledger_entry_per_slot(registered: Registered) -> None:
    mech = registered.example(N)
    _, events = run(mech, mech.initial_state(), range(1, T + 1))
    assert [type(e) for e in events] == [Release, LedgerEntry] * T
    assert [r.slot for r in releases(events)] == list(range(1, T + 1))
    assert all(r.release_id == f"conf/{mech.name}/{r.slot}" for r in releases(events))


def test_snapshot_pickles_and_restores(registered: Registered) -> None:
    mech = registered.example(N)
    half, first = run(mech, mech.initial_state(), range(1, T // 2 + 1))
    restored = pickle.loads(pickle.dumps(half))
    _, resumed = run(mech, restored, range(T // 2 + 1, T + 1))
    _, straight = run(mech, mech.initial_state(), range(1, T + 1))
    assert first + resumed == straight


def test_same_seed_same_releases_other_seed_other_noise(registered: Registered) -> None:
    mech = registered.example(N)
    _, a = run(mech, mech.initial_state(), range(1, T + 1))
    _, b = run(mech, mech.initial_state(), range(1, T + 1))
    _, c = run(mech, mech.initial_state(), range(1, T + 1), seed=SEED + 1)
    assert a == b
    assert [r.estimate for r in releases(a)] != [r.estimate for r in releases(c)]


def test_replayed_slot_is_identical_and_step_is_pure(registered: Registered) -> None:
    mech = registered.example(N)
    state, _ = run(mech, mech.initial_state(), range(1, 8))
    before = pickle.dumps(state)
    slot = make_slot(mech, 8)
    once = mech.step(state, slot)
    twice = mech.step(state, slot)
    assert pickle.dumps(state) == before, "step mutated its input state"
    assert once[1] == twice[1]
    assert pickle.dumps(once[0]) == pickle.dumps(twice[0])


def test_charges_stay_within_declared_cost(registered: Registered) -> None:
    mech = registered.example(N)
    cost = mech.privacy_cost
    eps, w = mech.config.epsilon, mech.config.window
    assert (cost.epsilon, cost.window) == (eps, w)
    state, events = run(mech, mech.initial_state(), range(1, 3 * T + 1))
    entries = [e for e in events if isinstance(e, LedgerEntry)]
    assert {e.division for e in entries} == {cost.division}
    if registered.family == "personalized":
        check_personalized_charges(mech, entries)
    elif cost.division == "budget":
        per_slot = np.array([e.epsilon_m1 + e.epsilon_m2 for e in entries])
        window_sums = np.convolve(per_slot, np.ones(w))[: len(per_slot)]
        assert window_sums.max() <= eps + 1e-12
        assert np.allclose([e.window_spent for e in entries], window_sums)
        if mech.name == "LBU":  # uniform: exactly ε/w every slot, the whole ε every window
            assert np.allclose(per_slot, eps / w)
    else:
        assert all(e.epsilon_m1 in (0.0, eps) and e.epsilon_m2 in (0.0, eps) for e in entries)
        assert state.population.window_users(3 * T) <= N
        assert all(e.window_users <= N for e in entries)


def check_personalized_charges(mech: Mechanism[Any, Any], entries: list[LedgerEntry]) -> None:
    """(C1) per privacy class over its own window; a uniform baseline also within its (ε, w)."""
    cost = mech.privacy_cost
    assert all(e.classes is not None for e in entries)
    classes = [e.classes for e in entries if e.classes is not None]
    first = classes[0]
    assert len(first) == 9  # {2, 3, 5} × {1, 1.5, 2} once the default (5, 1.0) is resolved
    assert sum(c.users for c in first) == N
    for k, cls in enumerate(first):
        per_slot = np.array([row[k].epsilon_dc + row[k].epsilon_pub for row in classes])
        sums = np.convolve(per_slot, np.ones(cls.window))[: len(per_slot)]
        assert sums.max() <= cls.epsilon * (1 + 1e-9)
        assert np.allclose([row[k].window_spent for row in classes], sums, rtol=0, atol=1e-12)
        if cost.model == "w-event ε-DP":  # one (ε, w) for everybody
            uniform = np.convolve(per_slot, np.ones(cost.window))[: len(per_slot)]
            assert uniform.max() <= cost.epsilon + 1e-12
    if mech.name in ("Uniform", "PU", "PLBU"):  # the whole window budget, every window
        for k, cls in enumerate(first):
            w = cost.window if mech.name == "Uniform" else cls.window
            e = cost.epsilon if mech.name == "Uniform" else cls.epsilon
            assert all(row[k].epsilon_pub == pytest.approx(e / w, rel=1e-15) for row in classes)


INVALID: dict[str, list[tuple[str, Any]]] = {
    "ldp-ids": [("epsilon", 0.0), ("epsilon", -1.0), ("epsilon", float("inf")), ("window", 0),
                ("population", 0), ("beta", 0.0), ("beta", 1.0), ("u_min", 0),
                ("absorption_init", "sometimes")],
    "personalized": [("epsilon", 0.0), ("epsilon", -1.0), ("epsilon", float("nan")),
                     ("window", 0), ("window", 2.5), ("population", 0), ("task", None),
                     ("threshold_mode", "sometimes")],
}  # fmt: skip
INVALID_CASES = [(r, f, v) for r in REGISTRY for f, v in INVALID[r.family]]


@pytest.mark.parametrize(
    ("registered", "field", "value"),
    INVALID_CASES,
    ids=[f"{r.family}:{r.name}-{f}={v!r}" for r, f, v in INVALID_CASES],
)
def test_config_validation_names_the_field(registered: Registered, field: str, value: Any) -> None:
    config = registered.example(N).config
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(config, **{field: value})


def test_incompatible_state_is_refused(registered: Registered) -> None:
    mech = registered.example(N)
    state = mech.initial_state()
    state.version += 1
    with pytest.raises(IncompatibleState, match="version"):
        mech.step(state, make_slot(mech, 1))


def test_skipping_a_slot_is_refused(registered: Registered) -> None:
    mech = registered.example(N)
    state, _ = run(mech, mech.initial_state(), range(1, 3))
    with pytest.raises(ValueError, match="expected slot 3"):
        mech.step(state, make_slot(mech, 5))


def test_documents_guarantee_and_spec(registered: Registered) -> None:
    doc = type(registered.example(N)).__doc__ or ""
    assert "spec §" in doc, "docstring must cite the spec section it implements"
    module_doc = __import__(type(registered.example(N)).__module__, fromlist=["_"]).__doc__ or ""
    guarantee = {"ldp-ids": "LDP", "personalized": "EPDP"}[registered.family]
    assert "ε" in module_doc and guarantee in module_doc, (
        "module docstring must state the privacy guarantee"
    )
