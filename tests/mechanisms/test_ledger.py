"""BudgetLedger and PopulationLedger (design §3, spec ldp-ids §1.4, §1.6)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import stats

from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.ledger import (
    RELATIVE_TOLERANCE,
    BudgetLedger,
    PopulationLedger,
    budget_limit,
)


def arrays_of(ledger: BudgetLedger | PopulationLedger) -> dict[str, NDArray[np.generic]]:
    return {k: v.copy() for k, v in vars(ledger).items() if isinstance(v, np.ndarray)}


def assert_same_arrays(
    before: dict[str, NDArray[np.generic]], ledger: BudgetLedger | PopulationLedger
) -> None:
    after = arrays_of(ledger)
    assert before.keys() == after.keys()
    for name, arr in before.items():
        assert np.array_equal(arr, after[name]), name


# -- BudgetLedger ----------------------------------------------------------------------------------


def test_budget_window_sums_and_parts() -> None:
    led = BudgetLedger(epsilon=1.0, window=3)
    led.charge(1, 0.1, "m1")
    led.charge(1, 0.2, "m2")
    led.charge(2, 0.1, "m1")
    led.charge(3, 0.1, "m1")
    led.charge(3, 0.3, "m2")
    assert led.window_spent(3) == pytest.approx(0.8)
    assert led.spent(1, 3, "m1") == pytest.approx(0.3)
    assert led.spent(1, 3, "m2") == pytest.approx(0.5)
    assert led.spent(2, 3) == pytest.approx(0.5)
    with pytest.raises(PrivacyBudgetExceeded):  # 0.2 is left in the window ending at 3
        led.charge(3, 0.25, "m2")
    assert led.window_spent(3) == pytest.approx(0.8)  # the refused charge left no trace
    # Ring reuse: slot 4 takes slot 1's position; slot 1 leaves the window.
    led.charge(4, 0.1, "m1")
    assert led.window_spent(4) == pytest.approx(0.6)
    assert led.spent(1, 1) == 0.0
    assert led.spent(2, 4, "m2") == pytest.approx(0.3)
    assert led.window_spent(1) == 0.0  # slot 1's entry was recycled by slot 4


def test_budget_stale_positions_read_zero() -> None:
    led = BudgetLedger(epsilon=1.0, window=4)
    led.charge(2, 0.7, "m2")
    assert led.window_spent(5) == pytest.approx(0.7)
    # Slot 6 has slot 2's ring position but nobody charged at 6: the old value must not count.
    assert led.window_spent(6) == 0.0
    assert led.window_spent(100) == 0.0
    led.charge(10, 0.9, "m1")  # position of slot 2 (10 mod 4 == 2): stale entry replaced
    assert led.window_spent(10) == pytest.approx(0.9)
    assert led.spent(2, 2) == 0.0


def test_budget_full_window_then_recycle() -> None:
    eps, w = 2.0, 5
    led = BudgetLedger(epsilon=eps, window=w)
    for t in range(1, 4 * w):
        led.charge(t, eps / w, "m2")  # LBU: exactly ε per window, forever
        assert led.window_spent(t) <= budget_limit(eps)
        assert led.window_spent(t) == pytest.approx(eps * min(t, w) / w)
        if t >= w:  # full window: not even a tiny extra charge fits
            with pytest.raises(PrivacyBudgetExceeded):
                led.charge(t, 2 * RELATIVE_TOLERANCE * eps, "m1")


@pytest.mark.parametrize("eps", [1e-3, 1.0, 1e3, 1e6])
def test_budget_tolerance_is_relative(eps: float) -> None:
    """The slack is ε·1e−9 at every scale: an absolute 1e−12 refused correct streams at
    ε ≈ 10³ (a window of ε/w shares sums to a few ulps above ε there)."""
    assert budget_limit(eps) == eps * (1 + RELATIVE_TOLERANCE)
    led = BudgetLedger(epsilon=eps, window=2)
    led.charge(1, eps * (1 + 0.5 * RELATIVE_TOLERANCE), "m2")
    led2 = BudgetLedger(epsilon=eps, window=2)
    with pytest.raises(PrivacyBudgetExceeded):
        led2.charge(1, eps * (1 + 2 * RELATIVE_TOLERANCE), "m2")


def test_budget_shares_at_large_epsilon_are_accepted_forever() -> None:
    """The audit's halt: at ε = 1000, w = 26 the 2w shares ε/(2w) of a full window sum to
    1.25e−12 above ε, which the old absolute 1e−12 slack refused (reproduced here)."""
    eps, w = 1000.0, 26
    total = 0.0
    for _ in range(2 * w):
        total += eps / (2 * w)
    assert total > eps + 1e-12  # the attack's premise: an absolute slack would halt here
    led = BudgetLedger(epsilon=eps, window=w)
    for t in range(1, 20 * w):
        led.charge(t, eps / (2 * w), "m1")
        led.charge(t, eps / (2 * w), "m2")
    assert led.window_spent(20 * w - 1) == pytest.approx(eps)


def test_budget_failed_charge_leaves_state_unchanged() -> None:
    led = BudgetLedger(epsilon=1.0, window=3)
    led.charge(1, 0.4, "m1")
    led.charge(2, 0.5, "m2")
    before = arrays_of(led)
    with pytest.raises(PrivacyBudgetExceeded, match="slot 2"):
        led.charge(2, 0.2, "m1")
    assert_same_arrays(before, led)
    assert led.window_spent(2) == pytest.approx(0.9)


def test_budget_failed_charge_leaves_stale_position_unchanged() -> None:
    """A refused charge must not touch the ledger at all (design §3: the invariant is checked
    before the charge takes effect), including resetting the ring position of an old slot."""
    led = BudgetLedger(epsilon=1.0, window=3)
    led.charge(1, 0.5, "m1")
    led.charge(3, 0.5, "m2")
    before = arrays_of(led)
    spent_1 = led.spent(1, 1)
    with pytest.raises(PrivacyBudgetExceeded):
        led.charge(4, 0.6, "m1")  # window 2..4 would hold 1.1; slot 4 reuses slot 1's position
    assert led.spent(1, 1) == spent_1 == 0.5
    assert_same_arrays(before, led)


def test_budget_rejects_bad_charges() -> None:
    led = BudgetLedger(epsilon=1.0, window=3)
    with pytest.raises(ValueError, match="1-based"):
        led.charge(0, 0.1, "m1")
    with pytest.raises(ValueError):
        led.charge(1, -0.1, "m1")
    with pytest.raises(ValueError):
        led.charge(1, 0.1, "m3")
    led.charge(5, 0.1, "m1")
    with pytest.raises(ValueError):
        led.charge(2, 0.1, "m1")  # same ring position, earlier slot


@settings(max_examples=150, deadline=None)
@given(
    eps=st.sampled_from([0.5, 1.0, 3.0]),
    w=st.integers(1, 8),
    plan=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["m1", "m2"]), st.floats(0.0, 0.7)),
        min_size=1,
        max_size=40,
    ),
)
def test_budget_ledger_matches_reference_model(
    eps: float, w: int, plan: list[tuple[int, str, float]]
) -> None:
    """Random charge sequences (slot gaps 0..3) against a dictionary model of Thm 4.1."""
    led = BudgetLedger(epsilon=eps, window=w)
    ref: dict[int, float] = {}
    t = 1
    for gap, part, amount in plan:
        t += gap
        window = sum(v for s, v in ref.items() if t - w + 1 <= s <= t)
        if window + amount > budget_limit(eps):
            with pytest.raises(PrivacyBudgetExceeded):
                led.charge(t, amount, part)
        else:
            led.charge(t, amount, part)
            ref[t] = ref.get(t, 0.0) + amount
        expected = sum(v for s, v in ref.items() if t - w + 1 <= s <= t)
        assert led.window_spent(t) == pytest.approx(expected, abs=1e-12)
        assert led.window_spent(t) <= budget_limit(eps)


# -- PopulationLedger ------------------------------------------------------------------------------


def test_population_available_and_report_again_after_w() -> None:
    n, w = 10, 4
    led = PopulationLedger(population=n, window=w)
    assert led.available(1).all()
    led.charge(3, np.array([2, 5]), "m1")
    for t in range(3, 3 + w):
        mask = led.available(t)
        assert not mask[2] and not mask[5] and mask.sum() == n - 2
    assert led.available(3 + w).all()
    for t in range(4, 3 + w):  # not before s + w
        with pytest.raises(PrivacyBudgetExceeded, match="within w"):
            led.charge(t, np.array([5]), "m2")
    led.charge(3 + w, np.array([5]), "m2")  # exactly w slots later
    assert led.last_report[5] == 3 + w and led.last_report[2] == 3


def test_population_window_one_allows_every_slot() -> None:
    led = PopulationLedger(population=3, window=1)
    for t in range(1, 6):
        led.charge(t, np.array([0, 1, 2]), "m2")
        assert led.window_users(t) == 3


def test_population_double_charge_in_one_slot() -> None:
    led = PopulationLedger(population=10, window=3)
    with pytest.raises(PrivacyBudgetExceeded, match="twice"):
        led.charge(1, np.array([1, 4, 1]), "m1")
    led.charge(1, np.array([1, 4]), "m1")
    before = arrays_of(led)
    with pytest.raises(PrivacyBudgetExceeded):
        led.charge(1, np.array([7, 4]), "m2")  # 4 already reported at slot 1 (M1)
    assert_same_arrays(before, led)  # refused charges change nothing, not even user 7
    assert led.available(2)[7]


def test_population_sample_capacity_and_eligibility() -> None:
    n, w = 20, 5
    led = PopulationLedger(population=n, window=w)
    rng = np.random.default_rng(0)
    led.charge(1, np.arange(12), "m1")
    eligible = np.ones(n, dtype=bool)
    assert led.available(2).sum() == 8
    with pytest.raises(PrivacyBudgetExceeded, match="only 8"):
        led.sample(2, 9, eligible, rng)
    eligible[[13, 15, 17]] = False
    got = led.sample(2, 8, eligible, rng)  # asks |U_A|: allowed, ineligible users skipped
    assert got.tolist() == [12, 14, 16, 18, 19]
    got = led.sample(2, 3, eligible, rng)
    assert got.shape == (3,) and np.all(np.diff(got) > 0)
    assert set(got.tolist()) <= {12, 14, 16, 18, 19}
    assert led.sample(2, 0, eligible, rng).shape == (0,)


def test_population_sample_is_uniform_without_replacement() -> None:
    n, k, reps = 30, 7, 6000
    led = PopulationLedger(population=n, window=2)
    led.charge(1, np.array([0, 1, 2]), "m1")
    eligible = np.ones(n, dtype=bool)
    rng = np.random.default_rng(11)
    hits = np.zeros(n, dtype=np.int64)
    for _ in range(reps):
        got = led.sample(2, k, eligible, rng)
        assert np.unique(got).shape == (k,)
        hits[got] += 1
    assert hits[:3].sum() == 0
    # Each of the 27 available users is in a sample w.p. 7/27: chi-square goodness of fit.
    assert stats.chisquare(hits[3:]).pvalue > 1e-3


def test_population_window_users_and_used() -> None:
    n, w = 100, 3
    led = PopulationLedger(population=n, window=w)
    led.charge(1, np.arange(0, 10), "m1")
    led.charge(1, np.arange(10, 30), "m2")
    assert led.window_users(1) == 30
    led.charge(2, np.arange(30, 35), "m1")
    assert led.window_users(2) == 35
    assert led.window_users(3) == 35
    assert led.used(1, 3, "m1") == 15 and led.used(1, 3, "m2") == 20 and led.used(2, 3) == 5
    led.charge(4, np.arange(35, 45), "m1")
    led.charge(4, np.arange(45, 46), "m2")
    assert led.window_users(4) == 16  # slot 1 left the window
    assert led.used(1, 4, "m1") == 15 and led.used(1, 4, "m2") == 1  # slot 1's counts recycled
    assert led.used(2, 4) == 16 and led.used(2, 3, "m2") == 0
    assert led.window_users(7) == 0  # stale positions read zero
    led.charge(7, np.array([0]), "m2")
    assert led.window_users(7) == 1 and led.used(4, 4) == 0


def test_population_rejects_bad_charges() -> None:
    led = PopulationLedger(population=5, window=2)
    with pytest.raises(ValueError, match="outside"):
        led.charge(1, np.array([5]), "m1")
    with pytest.raises(ValueError, match="outside"):
        led.charge(1, np.array([-1]), "m1")
    with pytest.raises(ValueError):
        led.charge(1, np.array([1]), "m3")
    with pytest.raises(ValueError, match="1-based"):
        led.charge(0, np.array([1]), "m1")
    assert led.available(1).all()


@settings(max_examples=100, deadline=None)
@given(
    w=st.integers(1, 6),
    plan=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 11), max_size=6)),
        min_size=1,
        max_size=30,
    ),
)
def test_population_ledger_matches_reference_model(
    w: int, plan: list[tuple[int, list[int]]]
) -> None:
    """Random charges against Thm 5.2: accept iff no user repeats or reported in the last w−1 slots."""
    n = 12
    led = PopulationLedger(population=n, window=w)
    last: dict[int, int] = {}
    history: list[tuple[int, int]] = []
    t = 1
    for gap, users in plan:
        t += gap
        ok = len(set(users)) == len(users) and all(t - last.get(u, -(10**9)) >= w for u in users)
        snapshot = copy.deepcopy(led)
        if ok:
            led.charge(t, np.array(users, dtype=np.int64), "m2")
            last.update({u: t for u in users})
            history.extend((t, u) for u in users)
        else:
            with pytest.raises(PrivacyBudgetExceeded):
                led.charge(t, np.array(users, dtype=np.int64), "m2")
            assert_same_arrays(arrays_of(snapshot), led)
        expected_avail = np.array([t + 1 - last.get(u, -(10**9)) >= w for u in range(n)])
        assert np.array_equal(led.available(t + 1), expected_avail)
        assert led.window_users(t) == sum(1 for s, _ in history if t - w + 1 <= s <= t)
