"""Population growth under personalized w-event privacy (spec personalized-w-event §9.5).

Users register over time (``Requirements(registered=…)``): a user registering in an existing
class joins its ledger; a new class joins at its first step with zero history (PBD: empty
look-back, PBA: ``a_c = t_c``), appended to the stream's classes, growing the ledger's ring
when its window is the largest yet; a class that shrinks or disappears halts the stream before
anything is charged or released; the uniform baselines refuse a stricter class at the step it
appears; nobody registered means approximate (repeat the last release), charge nobody.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.families.registry import PERSONALIZED
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE
from privstream.mechanisms.personalized import (
    MECHANISMS,
    STATE_VERSION,
    PersonalizedConfig,
    PersonalizedMechanism,
    PersonalizedRelease,
    PersonalizedState,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.mechanisms.ledger_rows import Row, class_rows

Step = tuple[Release, LedgerEntry]
ALL = list(MECHANISMS)
UNIFORM = ["BD", "BA", "Uniform", "Sample"]


def build(name: str, config: PersonalizedConfig) -> PersonalizedMechanism:
    mech = PERSONALIZED.build(name, config)
    assert isinstance(mech, PersonalizedMechanism)
    return mech


def details(release: Release) -> PersonalizedRelease:
    assert isinstance(release.details, PersonalizedRelease)
    return release.details


def config(n: int, eps: float = 1.0, w: int = 4, d: int = 2) -> PersonalizedConfig:
    return PersonalizedConfig(population=n, epsilon=eps, window=w, task=FrequencyTask(d))


def forced(mech: PersonalizedMechanism, decide: Callable[[int], bool]) -> PersonalizedMechanism:
    mech.wants_publication = lambda t, dis, threshold: decide(t)  # type: ignore[method-assign]
    return mech


class Population:
    """Users with fixed requirements who register at given steps; ``Requirements`` is rebuilt
    only at the steps somebody registers, as an operator would."""

    def __init__(
        self, eps: Sequence[float], win: Sequence[int], arrival: Sequence[int], d: int = 2
    ) -> None:
        self.eps, self.win = np.array(eps, dtype=np.float64), np.array(win, dtype=np.int64)
        self.arrival = np.array(arrival, dtype=np.int64)
        self.n, self.d = self.arrival.shape[0], d
        self._cache: dict[int, Requirements] = {}

    def requirements(self, t: int) -> Requirements:
        count = int((self.arrival <= t).sum())
        if count not in self._cache:
            self._cache[count] = Requirements(self.eps, self.win, registered=self.arrival <= t)
        return self._cache[count]

    def values(self, t: int) -> NDArray[np.int64]:
        rng = np.random.default_rng([17, t])
        return np.asarray(rng.integers(0, self.d, self.n))


def drive(
    mech: PersonalizedMechanism,
    requirements: Callable[[int], Requirements],
    values: Callable[[int], NDArray[np.int64]],
    T: int,
    state: PersonalizedState | None = None,
    first: int = 1,
) -> tuple[PersonalizedState, list[Step]]:
    state = mech.initial_state() if state is None else state
    steps: list[Step] = []
    for t in range(first, first + T):
        port = SimulatedCurator(values(t), mech.config.task, requirements(t))
        state, (release, entry, *_) = mech.step(
            state, Slot("g", t, port, SlotRandomness(3, "g", t))
        )
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        steps.append((release, entry))
    return state, steps


def rows(steps: list[Step]) -> list[tuple[Row, ...]]:
    return [class_rows(entry) for _, entry in steps]


def per_class(steps: list[Step]) -> dict[tuple[int, float], list[tuple[int, float]]]:
    """Per class ``(w, ε)``: (step, charge) from its first appearance on."""
    out: dict[tuple[int, float], list[tuple[int, float]]] = {}
    for t, classes in enumerate(rows(steps), start=1):
        for c in classes:
            out.setdefault((c.window, c.epsilon), []).append((t, c.epsilon_dc + c.epsilon_pub))
    return out


def assert_c1(steps: list[Step]) -> None:
    """(C1) per class over every window of its own w since it joined, and window_spent agrees;
    a class never leaves the entries once it appeared, and keeps its position."""
    seen: list[tuple[int, float]] = []
    for classes in rows(steps):
        keys = [(c.window, c.epsilon) for c in classes]
        assert keys[: len(seen)] == seen, "a class moved or disappeared"
        seen = keys
    spent = {(c.window, c.epsilon): [] for c in rows(steps)[-1]}  # type: dict[tuple[int, float], list[float]]
    for classes in rows(steps):
        for c in classes:
            spent[(c.window, c.epsilon)].append(c.window_spent)
    for (w, eps), charges in per_class(steps).items():
        x = np.array([c for _, c in charges])
        sums = np.convolve(x, np.ones(w))[: x.shape[0]]
        assert sums.max() <= eps * (1 + RELATIVE_TOLERANCE), (w, eps)
        assert np.allclose(spent[(w, eps)], sums, rtol=0, atol=1e-12)


# -- a user registering in an existing class --------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_user_joining_an_existing_class_shares_its_ledger(name: str) -> None:
    """The class's budgets do not depend on who is registered: a late member is charged what
    the class is charged from then on (its history already holds spend they never incurred)."""
    eps, win = [1.0, 1.0, 2.0, 2.0], [2, 2, 4, 4]
    early = Population(eps, win, [1, 1, 1, 1])
    late = Population(eps, win, [1, 1, 1, 6])
    decide = [True, False, True, True, False, True, True, True, False, True, True, True] * 2

    def run(pop: Population) -> list[Step]:
        mech = forced(build(name, config(4, w=4)), lambda t: decide[t - 1])
        return drive(mech, pop.requirements, early.values, 24)[1]

    a, b = run(early), run(late)
    for t, (ra, rb) in enumerate(zip(rows(a), rows(b), strict=True), start=1):
        assert [(c.window, c.epsilon) for c in ra] == [(c.window, c.epsilon) for c in rb]
        assert [c.users for c in rb] == [2, 1 if t < 6 else 2]
        for ca, cb in zip(ra, rb, strict=True):
            assert (ca.epsilon_dc, ca.epsilon_pub, ca.window_spent) == (
                cb.epsilon_dc,
                cb.epsilon_pub,
                cb.window_spent,
            )
    assert [r.strategy for r, _ in a] == [r.strategy for r, _ in b]
    assert_c1(b)


# -- a new class mid-stream -------------------------------------------------------------------------


def test_pbd_new_class_with_a_larger_window_starts_fresh() -> None:
    """(3, 1.0) from step 1; (10, 2.0) joins at step 7 (the ring grows from 3 to 10); (1, 0.5)
    joins at step 9, sorted first by the curator but appended to the stream's classes."""
    pop = Population([1.0, 2.0, 0.5], [3, 10, 1], [1, 7, 9])
    mech = forced(build("PBD", config(3, eps=0.5, w=10)), lambda t: True)
    state6, first = drive(mech, pop.requirements, pop.values, 6)
    assert state6.ledger is not None and state6.ledger.slots.shape == (3,)
    state, later = drive(mech, pop.requirements, pop.values, 14, state6, first=7)
    steps = first + later
    assert state.ledger is not None
    assert state.ledger.windows.tolist() == [3, 10, 1]
    assert state.ledger.joined.tolist() == [1, 7, 9]
    assert state.ledger.slots.shape == (10,) and state.ledger.dc.shape == (3, 10)
    assert state.sizes.tolist() == [1, 1, 1]
    table = rows(steps)
    assert [len(r) for r in table] == [1] * 6 + [2] * 2 + [3] * 12
    join = table[6][1]  # the new class at its first step: ε/(2w) + ε/4 (empty look-back)
    assert (join.window, join.epsilon) == (10, 2.0)
    assert join.epsilon_dc == 0.1 and join.epsilon_pub == 0.5 and join.window_spent == 0.6
    narrow = table[8][2]
    assert (narrow.window, narrow.epsilon, narrow.epsilon_dc) == (1, 0.5, 0.25)
    assert narrow.epsilon_pub == 0.125  # ε/2 − nothing, halved
    # the old class never noticed: its trace is PBD-1's w = 3 sequence throughout
    alone = forced(build("PBD", config(1, w=3)), lambda t: True)
    solo = drive(alone, lambda t: Requirements([1.0], [3]), lambda t: np.zeros(1, np.int64), 20)
    assert [r[0] for r in table] == [r[0] for r in rows(solo[1])]
    assert_c1(steps)


def test_pba_new_class_starts_at_its_join_step() -> None:
    """PBA: a class joining at step t_c has a_c = t_c: one share at its join, and it does not
    lift another class's nullified period; it may itself be nullified by the others'."""
    pop = Population([1.0, 1.0, 1.0], [4, 8, 2], [1, 3, 6])
    decide = {1: False, 2: False, 3: True, 4: True, 5: True, 6: True, 7: True, 8: True}
    mech = forced(build("PBA", config(3, w=8)), lambda t: decide.get(t, True))
    state, steps = drive(mech, pop.requirements, pop.values, 12)
    strategies = [r.strategy for r, _ in steps]
    # t=3: class w=4 absorbs 3 shares (a: 1 → 6); class w=8 joins with 1 share (a: 3 → 4).
    # t=4, 5 nullified (t < max a = 6). t=6: w=4 has 1 share (a → 7), w=8 has 3 (a → 9), w=2
    # joins with 1 (a → 7). t=7, 8 nullified by w=8, w=2's shares accrue. t=9: 3, 1, 2 shares.
    assert strategies[:9] == ["approximate", "approximate", "publish"] + ["nullified"] * 2 + [
        "publish",
        "nullified",
        "nullified",
        "publish",
    ]
    shares = [
        [round(c.epsilon_pub / (c.epsilon / (2 * c.window))) for c in row] for row in rows(steps)
    ]
    assert shares[2] == [3, 1] and shares[5] == [1, 3, 1] and shares[8] == [3, 1, 2]
    assert all(c.epsilon_dc == c.epsilon / (2 * c.window) for r in rows(steps) for c in r)
    assert state.absorbed is not None and len(state.absorbed) == 3
    assert_c1(steps)


@pytest.mark.parametrize("name", ALL)
def test_growing_population_keeps_every_class_within_its_requirement(name: str) -> None:
    """Natural decisions on drifting data; an empty start, registrations every few steps into
    old and new classes (new windows both smaller and larger than the ring), 90 steps."""
    rng = np.random.default_rng(5)
    n = 300
    kinds = [(1.0, 5), (1.5, 3), (2.0, 9), (1.0, 2), (3.0, 9)]
    kind = rng.integers(0, len(kinds), n)
    eps = [kinds[k][0] for k in kind]
    win = [kinds[k][1] for k in kind]
    arrival = rng.integers(4, 70, n)
    arrival[kind == 2] += 15  # the widest class joins late
    pop = Population(eps, win, arrival, d=3)
    mech = build(name, config(n, eps=1.0, w=9, d=3))
    state, steps = drive(mech, pop.requirements, pop.values, 90)
    assert [r.strategy for r, _ in steps[:3]] == ["approximate"] * 3
    assert state.ledger is not None and state.ledger.classes == len(kinds)
    assert state.sizes.sum() == n
    assert_c1(steps)
    if name in UNIFORM:  # every class follows the stream's (ε, w) schedule from its join on
        oldest = per_class(steps)[(rows(steps)[-1][0].window, rows(steps)[-1][0].epsilon)]
        x = np.array([c for _, c in oldest])
        assert np.convolve(x, np.ones(9))[: x.shape[0]].max() <= 1.0 + 1e-12
    assert any(r.strategy == "publish" for r, _ in steps)


# -- shrinking or disappearing classes ----------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "after",
    [
        ([1.0, 1.0, 2.0, 2.0], [4, 4, 4, 4], [True, True, True, False]),  # a user unregisters
        ([1.0, 2.0, 2.0, 2.0], [4, 4, 4, 4], [True] * 4),  # a user changes class
        ([2.0, 2.0, 2.0, 2.0], [4, 4, 4, 4], [True] * 4),  # a class disappears
    ],
    ids=["unregistered", "moved", "vanished"],
)
def test_shrinking_class_is_refused_without_trace(
    name: str, after: tuple[list[float], list[int], list[bool]]
) -> None:
    before = Requirements([1.0, 1.0, 2.0, 2.0], [4, 4, 4, 4])
    mech = build(name, config(4, w=4))
    values = Population([1.0] * 4, [4] * 4, [1] * 4).values
    state, _ = drive(mech, lambda t: before, values, 3)
    snapshot = pickle.dumps(state)
    shrunk = Requirements(after[0], after[1], registered=after[2])
    port = SimulatedCurator(values(4), mech.config.task, shrunk)
    with pytest.raises(PrivacyBudgetExceeded, match="shrank"):
        mech.step(state, Slot("g", 4, port, SlotRandomness(3, "g", 4)))
    assert pickle.dumps(state) == snapshot
    drive(mech, lambda t: before, values, 2, state, first=4)  # the last good state goes on


# -- an empty population ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_empty_population_approximates_and_charges_nobody(name: str) -> None:
    d = 3
    pop = Population([1.0, 2.0, 1.0], [4, 2, 4], [4, 4, 6], d=d)
    mech = forced(build(name, config(3, w=4, d=d)), lambda t: True)
    state, steps = drive(mech, pop.requirements, pop.values, 12)
    for release, entry in steps[:3]:
        assert release.strategy == "approximate" and release.estimate == (0.0,) * d
        assert release.source_slot is None
        assert details(release).users_dc == details(release).users_pub == 0
        assert details(release).registered == 0
        assert entry.classes == () and entry.spent == 0.0
        assert (entry.budget, entry.scope, entry.budget - entry.spent) == (1.0, 4, 1.0)
    assert all(len(r) == 2 for r in rows(steps)[3:])
    assert details(steps[4][0]).registered == sum(c.users for c in steps[4][1].classes) == 2
    assert details(steps[5][0]).registered == sum(c.users for c in steps[5][1].classes) == 3
    if name != "Sample":  # Sample's next sampling step is 5 (t ≡ 1 mod w)
        assert steps[3][0].strategy == "publish"
    assert any(r.strategy == "publish" for r, _ in steps)
    assert state.ledger is not None and state.ledger.joined.tolist() == [4, 4]
    assert_c1(steps)


def test_nobody_registered_ever() -> None:
    for name in ALL:
        req = Requirements(population=5, registered=np.zeros(5, dtype=bool))
        mech = build(name, config(5))
        state, steps = drive(mech, lambda t, req=req: req, lambda t: np.ones(5, np.int64), 6)
        assert all(r.strategy == "approximate" and r.estimate == (0.0, 0.0) for r, _ in steps)
        assert state.ledger is not None and state.ledger.classes == 0


@pytest.mark.parametrize("name", ["Uniform", "PU", "PBD"])
def test_unregistered_users_data_is_never_released(name: str) -> None:
    """ε = 10⁶: releases track the histogram of the registered users only, although everybody
    holds a value."""
    n, d = 200, 4
    arrival = np.where(np.arange(n) < 120, 1, 10**9)
    pop = Population([1e6] * n, [2] * n, arrival, d=d)
    mech = build(name, config(n, eps=1e6, w=2, d=d))
    _, steps = drive(mech, pop.requirements, pop.values, 10)
    assert sum(r.strategy == "publish" for r, _ in steps) >= 5
    for t, (release, _) in enumerate(steps, start=1):
        truth = np.bincount(pop.values(t)[:120], minlength=d)
        if release.strategy == "publish":
            assert np.allclose(release.estimate, truth, atol=0.05)


# -- uniform baselines -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNIFORM)
@pytest.mark.parametrize("stricter", [(0.5, 3), (1.0, 6)], ids=["budget", "window"])
def test_uniform_baselines_refuse_a_stricter_class_when_it_appears(
    name: str, stricter: tuple[float, int]
) -> None:
    pop = Population([1.0, 2.0, stricter[0]], [5, 3, stricter[1]], [1, 2, 4])
    mech = build(name, config(3, eps=1.0, w=5))
    state, _ = drive(mech, pop.requirements, pop.values, 3)
    snapshot = pickle.dumps(state)
    port = SimulatedCurator(pop.values(4), mech.config.task, pop.requirements(4))
    with pytest.raises(PrivacyBudgetExceeded, match="cannot protect"):
        mech.step(state, Slot("g", 4, port, SlotRandomness(3, "g", 4)))
    assert pickle.dumps(state) == snapshot


def test_bd_looks_back_over_its_own_window() -> None:
    """BD's ε_rm covers its uniform w even when every class's window is shorter (the ledger
    keeps w slots readable): its trace equals BD's for a class with w_c = w."""
    decide = [True] * 30
    short = forced(build("BD", config(2, w=6)), lambda t: decide[t - 1])
    same = forced(build("BD", config(2, w=6)), lambda t: decide[t - 1])
    values = Population([1.0] * 2, [2] * 2, [1] * 2).values
    _, a = drive(short, lambda t: Requirements([1.0, 1.5], [2, 1]), values, 30)
    _, b = drive(same, lambda t: Requirements([1.0, 1.5], [6, 1]), values, 30)
    pub = np.array([details(r).theta_pub for r, _ in a])
    assert np.array_equal(pub, [details(r).theta_pub for r, _ in b])
    assert np.convolve(pub, np.ones(6))[:30].max() <= 0.5 * (1 + 1e-12)


# -- state ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("old", [1, 2])
def test_state_version_3_refuses_older_states(old: int) -> None:
    """Version 3: integer releases of the discrete sampler; a float-noise state of version 2
    (or the version 1 layout) must not be continued."""
    mech = build("PBA", config(2))
    state = mech.initial_state()
    assert state.version == STATE_VERSION == 3 and mech.state_version == 3
    assert state.ledger is not None and state.ledger.classes == 0 and state.sizes.shape == (0,)
    state.version = old
    port = SimulatedCurator(np.zeros(2), mech.config.task, Requirements(population=2))
    with pytest.raises(IncompatibleState, match=f"version={old}"):
        mech.step(state, Slot("g", 1, port, SlotRandomness(3, "g", 1)))


def test_growing_state_pickles_and_resumes_identically() -> None:
    pop = Population([1.0, 2.0, 0.5, 1.0], [3, 10, 1, 3], [2, 5, 9, 12])
    for name in ALL:
        mech = build(name, config(4, eps=0.5, w=10))
        half, first = drive(mech, pop.requirements, pop.values, 10)
        resumed = pickle.loads(pickle.dumps(half))
        _, rest = drive(mech, pop.requirements, pop.values, 10, resumed, first=11)
        _, straight = drive(mech, pop.requirements, pop.values, 20)
        assert first + rest == straight
