"""How a stream's snapshotted state grows with the population n and the window w (issue 13).

Every ledger keeps what its guarantee needs and no more: budget division charges every user
alike, so one spend per slot of the window (O(w), nothing per user); population division one
last-report slot per user (O(n), nothing per user and slot); personalized w-event one spend
per class and slot (O(classes·w)); CGM two report counters per user (O(n), whatever its l).
The states are the slotted operator's own (``privstream.experiments.state``), after w + 5 slots.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

from privstream.experiments.state import Case, Setup, build_state, scaling
from privstream.schema.events import EventBatch

N, W = 100_000, 20
LDP_IDS = Case("ldp-ids", ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA"), W)
BUDGET_DIVISION = ("LBU", "LBD", "LBA")
POPULATION_DIVISION = ("LSP", "LPU", "LPD", "LPA")
WORD = 8  # bytes of one int64 or float64
HEADERS = 64  # pickle's array headers: a few bytes that do not scale


Sizes = dict[tuple[int, int], dict[str, int]]


@pytest.fixture(scope="module")
def ldp_ids() -> Sizes:
    return scaling(LDP_IDS, (N, 2 * N), (W, 2 * W))


@pytest.fixture(scope="module")
def personalized() -> Sizes:
    return scaling(Case("personalized", ("PBD", "PBA"), W), (N, 2 * N), (W, 2 * W))


@pytest.fixture(scope="module")
def cgm() -> Sizes:
    # CGM's client protocol is the slow part; its scaling shows at a tenth of the population.
    return scaling(Case("cgm", ("CGM",), W), (N // 10, N // 5), (W, 2 * W))


def by_n(sizes: Sizes, part: str) -> int:
    """What ``part`` grows by when the population doubles (at the window W)."""
    n = min(n for n, _ in sizes)
    return sizes[(2 * n, W)][part] - sizes[(n, W)][part]


def by_w(sizes: Sizes, part: str, n: int) -> int:
    """What ``part`` grows by when the window doubles from W to 2W (at population ``n``)."""
    return sizes[(n, 2 * W)][part] - sizes[(n, W)][part]


@pytest.mark.parametrize("name", BUDGET_DIVISION)
def test_budget_division_ledger_is_one_spend_per_slot_of_the_window(
    ldp_ids: Sizes, name: str
) -> None:
    part = f"{name} ledger"
    assert by_n(ldp_ids, part) == 0  # nothing per user
    assert 0 < by_w(ldp_ids, part, N) <= 3 * WORD * W + HEADERS  # slot, M1 and M2 per slot
    assert ldp_ids[(N, W)][part] < 1000


@pytest.mark.parametrize("name", POPULATION_DIVISION)
def test_population_division_ledger_is_one_last_report_per_user(ldp_ids: Sizes, name: str) -> None:
    part = f"{name} ledger"
    assert by_n(ldp_ids, part) == WORD * N  # one int64 per user
    for n in (N, 2 * N):  # the window adds its counts, never a row per user
        assert 0 < by_w(ldp_ids, part, n) <= 3 * WORD * W + HEADERS
    assert by_w(ldp_ids, part, N) == by_w(ldp_ids, part, 2 * N)


def test_lpu_groups_are_one_small_integer_per_user(ldp_ids: Sizes) -> None:
    assert by_n(ldp_ids, "LPU other") == 4 * N
    assert by_w(ldp_ids, "LPU other", N) == 0


@pytest.mark.parametrize("name", ["PBD", "PBA"])
def test_personalized_ledger_is_per_class_never_per_user(personalized: Sizes, name: str) -> None:
    part, classes = f"{name} ledger", 2
    assert by_n(personalized, part) == 0
    # per slot of the ring: the slot that wrote it and each class's two parts' spend
    assert 0 < by_w(personalized, part, N) <= (1 + 2 * classes) * WORD * W + HEADERS
    assert personalized[(N, W)][part] < 2000


def test_cgm_counters_are_per_user_whatever_the_window(cgm: Sizes) -> None:
    n = min(n for n, _ in cgm)
    assert by_n(cgm, "CGM ledger") == 2 * WORD * n  # reports charged, lifetime reports
    assert by_w(cgm, "CGM ledger", n) == 0
    assert by_w(cgm, "CGM clients", n) == 0


@pytest.mark.parametrize("family", ["ldp_ids", "personalized", "cgm"])
def test_the_whole_state_has_no_term_in_n_times_w(
    family: str, request: pytest.FixtureRequest
) -> None:
    """Doubling w adds the same few bytes at n and 2n; doubling n at most doubles the state."""
    sizes: Sizes = request.getfixturevalue(family)
    n = min(n for n, _ in sizes)
    grow_w = [by_w(sizes, "total", m) for m in (n, 2 * n)]
    assert abs(grow_w[1] - grow_w[0]) <= HEADERS and grow_w[0] <= 64 * W * len(sizes[(n, W)])
    assert sizes[(2 * n, W)]["total"] <= 2 * sizes[(n, W)]["total"]


def test_a_snapshot_copies_the_directory_flat_and_shares_nothing() -> None:
    """``StreamState.__deepcopy__`` (what ``SlottedLogic.snapshot`` takes): the named users'
    directory is a new dict with the same entries, the arrays are copies, and the copy
    pickles to the same bytes."""
    case = Case("ldp-ids", ("LPA",), 5)
    state = build_state(case, 500, 8, named=True)
    snap = copy.deepcopy(state)
    assert snap.directory == state.directory and snap.directory is not state.directory
    assert len(snap.directory) == 500
    mechanism: Any = snap.mechanisms["LPA"]
    assert not np.shares_memory(mechanism.population.last_report,
                                state.mechanisms["LPA"].population.last_report)  # fmt: skip
    assert not np.shares_memory(snap.current, state.current)
    assert pickle.dumps(snap) == pickle.dumps(state)
    snap.directory["someone-new"] = 500
    assert "someone-new" not in state.directory


def _newcomers(first: int, count: int, slot: int, through: int | None = None) -> EventBatch:
    users = np.array([f"newcomer-{i}" for i in range(first, first + count)], dtype=object)
    return EventBatch("state", np.full(count, slot, dtype=np.int64), users, np.ones(count),
                      complete_through=through)  # fmt: skip


def test_a_snapshot_copies_the_held_newcomers_one_dict_per_slot() -> None:
    """The reports of users not seated yet, held until their slot closes, are copied one dict
    per slot (a generic deep copy took 4 µs per held report at every snapshot): the copy
    pickles to the same bytes, and what the live state does next — more reports held, the
    slot closed and its newcomers seated or refused — leaves it as it was."""
    setup = Setup.of(Case("ldp-ids", ("LPA",), 5), 500, named=True)
    logic = setup.logic()
    for batch in setup.batches(3):
        logic.on_batch([batch])
    logic.on_batch([_newcomers(0, 40, 5)])  # two slots ahead of the clock: held
    state = logic.state
    assert state is not None and len(state.newcomers[5]) == 40
    snap = logic.snapshot()
    taken = pickle.dumps(snap)
    assert taken == pickle.dumps(state) and snap.newcomers == state.newcomers
    assert snap.newcomers[5] is not state.newcomers[5]
    assert all(snap.newcomers[5][u] is held for u, held in state.newcomers[5].items())  # not walked
    logic.on_batch([_newcomers(40, 10, 5), _newcomers(50, 5, 6)])
    assert len(state.newcomers[5]) == 50 and 6 in state.newcomers
    logic.on_batch([_newcomers(60, 1, 5, through=5)])  # slots 4 and 5 close
    assert 5 not in state.newcomers and state.last_closed == 5
    assert pickle.dumps(snap) == taken and len(snap.newcomers[5]) == 40


def test_named_users_cost_their_directory_once() -> None:
    """Named users add their directory (one entry per user) and nothing per slot."""
    case = Case("ldp-ids", ("LBU",), 5)
    dense = build_state(case, 2000, 10, named=False)
    named = build_state(case, 2000, 10, named=True)
    assert len(named.directory) == 2000 and not dense.directory
    extra = len(pickle.dumps(named)) - len(pickle.dumps(dense))
    assert extra <= len(pickle.dumps(named.directory)) + 64
    assert Setup.of(case, 10, named=True).ids[3] == "user-0000003"
