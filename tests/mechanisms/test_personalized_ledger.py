"""PersonalizedLedger and the trusted-curator port (design §3, §4; spec personalized-w-event
§1.4, §9.2, §9.3)."""

from __future__ import annotations

import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.client import (
    NO_CLASS,
    ClientPort,
    CuratorPort,
    Requirements,
    SimulatedClientPort,
    SimulatedCurator,
)
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE, PersonalizedLedger
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask, MeanTask


def snapshot(ledger: PersonalizedLedger) -> bytes:
    return pickle.dumps(ledger)


# -- PersonalizedLedger ---------------------------------------------------------------------------


def test_window_sums_use_each_class_window() -> None:
    led = PersonalizedLedger(np.array([2, 4]), np.array([1.0, 1.0]))
    for t, (dc, pub) in enumerate([(0.1, 0.2), (0.1, 0.0), (0.1, 0.3), (0.1, 0.0)], start=1):
        led.charge(t, np.array([dc, dc]), "dc")
        led.charge(t, np.array([pub, pub]), "pub")
    # w = 2 sees slots 3..4, w = 4 sees slots 1..4
    assert led.window_spent(4) == pytest.approx([0.5, 0.9])
    assert led.lookback(4, "pub") == pytest.approx([0.3, 0.5])  # slots 3 and 1..3
    assert led.spent(1, 4, "dc") == pytest.approx([0.4, 0.4])
    # slot 5 takes slot 1's ring position (ring length = max w = 4)
    led.charge(5, np.array([0.1, 0.1]), "dc")
    assert led.window_spent(5) == pytest.approx([0.2, 0.7])


def test_stale_positions_read_zero() -> None:
    led = PersonalizedLedger(np.array([3]), np.array([1.0]))
    led.charge(2, np.array([0.7]), "pub")
    assert led.window_spent(4) == pytest.approx([0.7])
    assert led.window_spent(5)[0] == 0.0
    assert led.window_spent(8)[0] == 0.0  # slot 8 shares slot 2's position but nobody charged


def test_refusal_leaves_no_trace() -> None:
    led = PersonalizedLedger(np.array([3, 5]), np.array([1.0, 2.0]))
    led.charge(1, np.array([0.5, 0.5]), "pub")
    before = snapshot(led)
    with pytest.raises(PrivacyBudgetExceeded, match="class 0"):
        led.charge(2, np.array([0.6, 0.1]), "pub")  # class 0: 1.1 > 1.0; class 1 would fit
    assert snapshot(led) == before
    led.charge(2, np.array([0.5, 0.1]), "pub")  # exactly ε fits
    assert led.window_spent(2) == pytest.approx([1.0, 0.6])


def test_every_class_is_checked() -> None:
    led = PersonalizedLedger(np.array([1, 10]), np.array([5.0, 1.0]))
    for t in range(1, 5):
        led.charge(t, np.array([0.25, 0.25]), "dc")
    with pytest.raises(PrivacyBudgetExceeded, match="w=10"):
        led.charge(5, np.array([0.25, 0.25]), "dc")  # class 1 would reach 1.25 in its window


def test_tolerance_is_relative_and_tiny() -> None:
    led = PersonalizedLedger(np.array([1]), np.array([4.0]))
    led.charge(1, np.array([4.0 * (1 + RELATIVE_TOLERANCE / 2)]), "dc")
    with pytest.raises(PrivacyBudgetExceeded):
        led.charge(2, np.array([4.0 * (1 + 2 * RELATIVE_TOLERANCE)]), "dc")


@pytest.mark.parametrize(
    ("t", "amounts", "part", "match"),
    [
        (0, [0.1], "dc", "1-based"),
        (1, [-0.1], "dc", "non-negative"),
        (1, [math.nan], "dc", "non-negative"),
        (1, [0.1, 0.1], "dc", "1 finite"),
        (1, [0.1], "m1", "part"),
    ],
)
def test_bad_charges(t: int, amounts: list[float], part: str, match: str) -> None:
    led = PersonalizedLedger(np.array([3]), np.array([1.0]))
    with pytest.raises(ValueError, match=match):
        led.charge(t, np.array(amounts), part)  # type: ignore[arg-type]


def test_charges_come_in_slot_order() -> None:
    led = PersonalizedLedger(np.array([3]), np.array([1.0]))
    led.charge(5, np.array([0.1]), "dc")
    with pytest.raises(ValueError, match="after t=5"):
        led.charge(4, np.array([0.1]), "dc")


@pytest.mark.parametrize(("windows", "epsilons"), [([0], [1.0]), ([3], [0.0]), ([3, 4], [1.0])])
def test_bad_classes(windows: list[int], epsilons: list[float]) -> None:
    with pytest.raises(ValueError, match="class"):
        PersonalizedLedger(np.array(windows, dtype=np.int64), np.array(epsilons))
    led = PersonalizedLedger(np.array([2]), np.array([1.0]))
    with pytest.raises(ValueError, match="class"):
        led.add_classes(1, np.array(windows, dtype=np.int64), np.array(epsilons))
    assert led.classes == 1


# -- classes joining over time (spec §9.5) --------------------------------------------------------


def test_empty_ledger_charges_nobody() -> None:
    led = PersonalizedLedger(np.zeros(0, dtype=np.int64), np.zeros(0))
    assert led.classes == 0 and led.slots.shape == (1,)
    led.charge(1, np.zeros(0), "dc")
    assert led.window_spent(1).shape == (0,)
    with pytest.raises(ValueError, match="0 finite"):
        led.charge(2, np.array([0.1]), "dc")
    assert PersonalizedLedger(np.zeros(0, dtype=np.int64), np.zeros(0), horizon=7).slots.shape == (
        7,
    )
    with pytest.raises(ValueError, match="horizon"):
        PersonalizedLedger(np.array([2]), np.array([1.0]), horizon=0)


def test_added_class_starts_with_zero_history() -> None:
    led = PersonalizedLedger(np.array([4]), np.array([1.0]))
    for t in range(1, 4):
        led.charge(t, np.array([0.3]), "pub")
    led.add_classes(4, np.array([3]), np.array([0.5]))
    assert led.joined.tolist() == [1, 4] and led.windows.tolist() == [4, 3]
    assert led.window_spent(4).tolist() == [pytest.approx(0.9), 0.0]
    assert led.lookback(4, "pub").tolist() == [pytest.approx(0.9), 0.0]
    led.charge(4, np.array([0.1, 0.5]), "pub")  # the new class may spend its whole ε at once
    with pytest.raises(PrivacyBudgetExceeded, match="privacy class 1"):
        led.charge(5, np.array([0.0, 0.1]), "dc")
    assert led.window_spent(6).tolist() == pytest.approx([0.4, 0.5])
    assert led.window_spent(7).tolist() == pytest.approx([0.1, 0.0])


def test_added_class_with_a_larger_window_grows_the_ring() -> None:
    led = PersonalizedLedger(np.array([2, 3]), np.array([1.0, 1.0]))
    for t in range(1, 8):  # slot t charges t/100 to both
        led.charge(t, np.array([t / 100, t / 100]), "dc")
    before = led.window_spent(7).copy(), led.lookback(8, "dc").copy()
    led.add_classes(7, np.array([6, 1]), np.array([2.0, 0.25]))
    assert led.slots.shape == (6,) and led.dc.shape == led.pub.shape == (4, 6)
    assert np.array_equal(led.window_spent(7)[:2], before[0])  # old classes keep their slots
    assert np.array_equal(led.lookback(8, "dc")[:2], before[1])
    assert led.window_spent(7)[2:].tolist() == [0.0, 0.0]

    def old(k: int) -> float:
        return k / 100 if k <= 7 else 0.01

    for t in range(8, 20):
        led.charge(t, np.array([0.01, 0.01, 0.05, 0.01]), "dc")
        want = [old(t - 1) + old(t), old(t - 2) + old(t - 1) + old(t), 0.05 * min(6, t - 7), 0.01]
        assert led.window_spent(t).tolist() == pytest.approx(want)


def test_adding_classes_comes_in_slot_order() -> None:
    led = PersonalizedLedger(np.array([3]), np.array([1.0]))
    led.charge(5, np.array([0.1]), "dc")
    with pytest.raises(ValueError, match="after t=5"):
        led.add_classes(4, np.array([2]), np.array([1.0]))
    led.add_classes(6, np.array([2]), np.array([1.0]))
    with pytest.raises(ValueError, match="after t=6"):
        led.charge(5, np.array([0.1, 0.1]), "dc")


@settings(max_examples=100, deadline=None)
@given(
    joins=st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0])),
        min_size=1,
        max_size=5,
    ),
    charges=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8)), min_size=1, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_joining_classes_match_a_brute_force_history(
    joins: list[tuple[int, int, float]], charges: list[tuple[int, int]], seed: int
) -> None:
    """Classes join at random slots (possibly into an empty ledger, possibly with a window
    larger than the ring); every window sum equals an exact per-class recomputation over the
    slots since the class joined, and accepted/refused charges are exactly those that fit."""
    rng = np.random.default_rng(seed)
    led = PersonalizedLedger(np.zeros(0, dtype=np.int64), np.zeros(0))
    history: list[dict[int, Fraction]] = []
    windows: list[int] = []
    eps: list[float] = []
    pending = sorted(
        (1 + sum(j[0] for j in joins[: k + 1]), j[1], j[2]) for k, j in enumerate(joins)
    )
    t = 1
    for gap, eighths in charges:
        t += gap
        while pending and pending[0][0] <= t:
            _, w, e = pending.pop(0)
            led.add_classes(t, np.array([w]), np.array([e]))
            windows.append(w)
            eps.append(e)
            history.append({})
        amounts = rng.integers(0, eighths + 1, len(windows)) / 16 * np.array(eps)
        exact = [Fraction(float(a)) for a in amounts]

        def window(c: int, hi: int) -> Fraction:
            return sum(
                (history[c].get(k, Fraction(0)) for k in range(hi - windows[c] + 1, hi + 1)),
                Fraction(0),
            )

        fits = all(window(c, t) + exact[c] <= Fraction(eps[c]) for c in range(len(windows)))
        before = snapshot(led)
        if fits:
            led.charge(t, amounts, "dc")
            for c, x in enumerate(exact):
                history[c][t] = history[c].get(t, Fraction(0)) + x
        else:
            with pytest.raises(PrivacyBudgetExceeded):
                led.charge(t, amounts, "dc")
            assert snapshot(led) == before
        spent = led.window_spent(t)
        for c in range(len(windows)):
            assert spent[c] == pytest.approx(float(window(c, t)), abs=1e-12)
    assert led.dc.shape == (len(windows), max([1, *windows]))  # per class, never per user


def test_memory_grows_with_classes_not_users_and_pickles() -> None:
    led = PersonalizedLedger(np.array([40, 80, 120]), np.array([0.6, 0.8, 1.0]))
    assert led.dc.shape == led.pub.shape == (3, 120)
    led.charge(1, np.array([0.1, 0.1, 0.1]), "dc")
    copy = pickle.loads(pickle.dumps(led))
    assert np.array_equal(copy.window_spent(1), led.window_spent(1))


@settings(max_examples=150, deadline=None)
@given(
    classes=st.lists(
        st.tuples(st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0])), min_size=1, max_size=4
    ),
    charges=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["dc", "pub"]), st.integers(0, 8)),
        min_size=1,
        max_size=80,
    ),
)
def test_accepts_exactly_what_fits(
    classes: list[tuple[int, float]], charges: list[tuple[int, str, int]]
) -> None:
    """Against an exact brute-force recomputation: a charge is accepted iff every class's
    window ending at its slot stays within ε_c, and refusals change nothing."""
    windows = np.array([w for w, _ in classes], dtype=np.int64)
    eps = np.array([e for _, e in classes])
    led = PersonalizedLedger(windows, eps)
    history: dict[int, list[Fraction]] = {}
    t = 1
    for gap, part, eighths in charges:
        t += gap
        amounts = np.full(len(classes), eighths / 8) * eps / 2  # multiples of ε/16
        exact = [Fraction(float(a)) for a in amounts]
        per_slot = history.get(t, [Fraction(0)] * len(classes))
        fits = all(
            sum(
                (history.get(k, [Fraction(0)] * len(classes))[c] for k in range(t - w + 1, t)),
                Fraction(0),
            )
            + per_slot[c]
            + exact[c]
            <= Fraction(float(eps[c]))
            for c, w in enumerate(windows.tolist())
        )
        before = snapshot(led)
        if fits:
            led.charge(t, amounts, part)  # type: ignore[arg-type]
            history[t] = [a + b for a, b in zip(per_slot, exact, strict=True)]
        else:
            with pytest.raises(PrivacyBudgetExceeded):
                led.charge(t, amounts, part)  # type: ignore[arg-type]
            assert snapshot(led) == before
        for c, w in enumerate(windows.tolist()):
            want = sum(
                (history.get(k, [Fraction(0)] * len(classes))[c] for k in range(t - w + 1, t + 1)),
                Fraction(0),
            )
            assert led.window_spent(t)[c] == pytest.approx(float(want), abs=1e-12)


# -- Requirements and the curator -----------------------------------------------------------------


def test_requirements_resolve_defaults_into_sorted_classes() -> None:
    req = Requirements([np.nan, 1.0, 0.5, 1.0, np.nan], [0, 3, 3, 0, 7])
    classes = req.classes(0.5, 7)
    # resolved: (7, .5), (3, 1), (3, .5), (7, 1), (7, .5)
    assert classes.windows.tolist() == [3, 3, 7, 7]
    assert classes.epsilons.tolist() == [0.5, 1.0, 0.5, 1.0]
    assert classes.sizes.tolist() == [1, 1, 2, 1]
    assert classes.members.tolist() == [2, 1, 0, 3, 2]
    assert req.classes(0.5, 7) is classes  # memoised per default
    assert req.classes(1.0, 3).digest != classes.digest
    assert "nan" not in repr(req) and "1.0" not in repr(req)


def test_requirements_without_preferences_are_one_class() -> None:
    classes = Requirements(population=4).classes(0.6, 120)
    assert (classes.windows.tolist(), classes.epsilons.tolist(), classes.sizes.tolist()) == (
        [120],
        [0.6],
        [4],
    )
    same = Requirements([np.nan] * 4, [0] * 4).classes(0.6, 120)
    assert same.digest == classes.digest


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilons": [0.5, -1.0]}, "epsilons"),
        ({"epsilons": [0.5, math.inf]}, "epsilons"),
        ({"windows": [3, 2.5]}, "windows"),
        ({"windows": [3, -1]}, "windows"),
        ({"epsilons": [0.5], "windows": [3, 4]}, "one population"),
        ({}, "one population"),
        ({"population": 0}, "population"),
    ],
)
def test_requirements_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Requirements(**kwargs)  # type: ignore[arg-type]


def test_registered_mask_limits_the_classes() -> None:
    eps = [0.5, 1.0, np.nan, 1.0, 0.5, np.nan]
    win = [3, 3, 0, 7, 3, 0]
    everyone = Requirements(eps, win).classes(1.0, 7)
    req = Requirements(eps, win, registered=[True, False, True, True, False, False])
    assert req.registered_count == 3 and req.registered is not None
    classes = req.classes(1.0, 7)
    # registered: (3, .5), (7, 1) default, (7, 1) → classes (3, .5):1, (7, 1):2
    assert classes.windows.tolist() == [3, 7] and classes.epsilons.tolist() == [0.5, 1.0]
    assert classes.sizes.tolist() == [1, 2] and classes.registered == 3
    assert classes.members.tolist() == [0, NO_CLASS, 1, 1, NO_CLASS, NO_CLASS]
    assert classes.digest != everyone.digest
    assert req.classes(1.0, 7) is classes  # memoised per default
    full = Requirements(eps, win, registered=np.ones(6, dtype=bool))
    assert full.registered is None and full.classes(1.0, 7).digest == everyone.digest
    assert "registered=3" in repr(req) and "0.5" not in repr(req)


def test_nobody_registered_has_no_classes() -> None:
    for req in (
        Requirements(population=4, registered=np.zeros(4, dtype=bool)),
        Requirements([1.0, 2.0], [3, 0], registered=[False, False]),
    ):
        classes = req.classes(0.6, 120)
        assert classes.count == 0 and classes.registered == 0
        assert classes.sizes.shape == classes.windows.shape == classes.epsilons.shape == (0,)
        assert np.all(classes.members == NO_CLASS)
        hist = SimulatedCurator(np.zeros(req.population), FrequencyTask(3), req).class_histogram(
            0.6, 120
        )
        assert hist.counts.shape == (0, 3) and hist.total.tolist() == [0, 0, 0]
    only = Requirements(population=3, registered=[False, True, False]).classes(0.6, 120)
    assert only.sizes.tolist() == [1] and only.members.tolist() == [NO_CLASS, 0, NO_CLASS]


@pytest.mark.parametrize(
    ("registered", "match"),
    [([1, 0, 1], "boolean"), ([True, False], "one population"), (["yes"] * 3, "boolean")],
)
def test_registered_mask_validation(registered: list[object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Requirements([1.0, 1.0, 1.0], registered=registered)


@pytest.mark.parametrize(("distinct", "seed"), [(4, 1), (1_000_000, 2)])
def test_class_table_matches_a_row_wise_unique(distinct: int, seed: int) -> None:
    """The linear factorisation (and its fallback for many distinct budgets) gives exactly the
    table, sizes and members of ``np.unique`` over (w, ε) rows of the registered users."""
    rng = np.random.default_rng(seed)
    n = 20_000
    eps = rng.choice(np.concatenate([[np.nan], rng.uniform(0.1, 3.0, distinct)]), n)
    win = rng.choice([0, 1, 40, 80, 120, 7], n)
    mask = rng.random(n) < 0.7
    classes = Requirements(eps, win, registered=mask).classes(0.6, 80)
    rows = np.stack(
        [np.where(win == 0, 80, win)[mask], np.where(np.isnan(eps), 0.6, eps)[mask]], axis=1
    )
    table, inverse, sizes = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    assert np.array_equal(classes.windows, table[:, 0].astype(np.int64))
    assert np.array_equal(classes.epsilons, table[:, 1])
    assert np.array_equal(classes.sizes, sizes)
    assert np.array_equal(classes.members[mask], inverse.reshape(-1))
    assert np.all(classes.members[~mask] == NO_CLASS)


def test_curator_ignores_unregistered_users() -> None:
    """Unregistered users hold values (even outside the domain): never counted, never checked."""
    req = Requirements([1.0, 2.0, 1.0, 2.0], [3, 3, 3, 3], registered=[True, False, True, False])
    values = np.array([0, 7, 1, 1], dtype=np.int64)
    port = SimulatedCurator(values, FrequencyTask(2), req)
    hist = port.class_histogram(1.0, 3)
    assert hist.counts.tolist() == [[1, 1]] and hist.sizes.tolist() == [2]
    assert port.eligible().tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="domain"):
        SimulatedCurator(values, FrequencyTask(2), Requirements(population=4)).class_histogram(
            1.0, 3
        )


def brute_force_counts(
    values: NDArray[np.float64], members: NDArray[np.intp], m: int, d: int
) -> NDArray[np.int64]:
    counts = np.zeros((m, d), dtype=np.int64)
    for v, c in zip(values.tolist(), members.tolist(), strict=True):
        if not math.isnan(v):
            counts[c, int(v)] += 1
    return counts


def test_curator_histogram_per_class() -> None:
    rng = np.random.default_rng(8)
    n, d = 500, 4
    req = Requirements(rng.choice([np.nan, 0.5, 1.0], n), rng.choice([0, 10, 20], n))
    values = rng.integers(0, d, n).astype(np.float64)
    values[rng.random(n) < 0.2] = np.nan  # users without a current value
    port = SimulatedCurator(values, FrequencyTask(d), req)
    hist = port.class_histogram(1.0, 20)
    classes = req.classes(1.0, 20)
    assert np.array_equal(
        hist.counts, brute_force_counts(values, classes.members, classes.count, d)
    )
    assert np.array_equal(hist.sizes, classes.sizes)  # registered, absent users included
    assert hist.sizes.sum() == n and hist.counts.sum() == np.count_nonzero(~np.isnan(values))
    assert np.array_equal(
        hist.total, np.bincount(values[~np.isnan(values)].astype(int), minlength=d)
    )
    assert port.class_histogram(1.0, 20) is hist
    assert port.population == n and np.array_equal(port.eligible(), ~np.isnan(values))
    assert "counts" not in repr(hist) and str(int(hist.counts[0, 0])) not in repr(hist)


def test_curator_accepts_integer_values_with_absent_marker() -> None:
    values = np.array([0, 1, -1, 1, 2], dtype=np.int64)
    hist = SimulatedCurator(values, FrequencyTask(3), Requirements(population=5)).class_histogram(
        1.0, 4
    )
    assert hist.counts.tolist() == [[1, 2, 1]]


def test_curator_rejects_bad_input() -> None:
    req = Requirements(population=3)
    with pytest.raises(ValueError, match="domain"):
        SimulatedCurator(np.array([0.0, 1.0, 2.0]), FrequencyTask(2), req).class_histogram(1.0, 3)
    with pytest.raises(ValueError, match="requirements describe 3"):
        SimulatedCurator(np.zeros(4), FrequencyTask(2), req)
    with pytest.raises(ValueError, match="FrequencyTask"):
        SimulatedCurator(np.zeros(3), MeanTask(0.0, 1.0), req)


def test_slot_ports_are_refused_across_trust_modes() -> None:
    r = SlotRandomness(1, "s", 1)
    curator = SimulatedCurator(np.zeros(10), FrequencyTask(2), Requirements(population=10))
    clients = SimulatedClientPort(np.zeros(10), FrequencyTask(2), r)
    assert isinstance(curator, CuratorPort) and not isinstance(clients, CuratorPort)
    cdp_slot, ldp_slot = Slot("s", 1, curator, r), Slot("s", 1, clients, r)
    assert cdp_slot.curator is curator and ldp_slot.client is clients
    with pytest.raises(TypeError, match="trusted curator"):
        _ = cdp_slot.client
    with pytest.raises(TypeError, match="LDP clients"):
        _ = ldp_slot.curator
    pbd = PERSONALIZED.build("PBD", PersonalizedConfig(population=10, epsilon=1.0, window=3))
    with pytest.raises(TypeError, match="CuratorPort"):
        pbd.step(pbd.initial_state(), ldp_slot)
    lbd = LDP_IDS.build("LBD", LdpIdsConfig(epsilon=1.0, window=3, population=10))
    with pytest.raises(TypeError, match="ClientPort"):
        lbd.step(lbd.initial_state(), cdp_slot)
    port: ClientPort = clients
    assert port.population == 10
