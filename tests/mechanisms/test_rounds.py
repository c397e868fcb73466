"""Request/report rounds (``mechanisms.rounds``, design §13): LBD, LBA, LPD and LPA run as two
rounds per slot. Driven round by round, with the state pickled and unpickled between rounds
and a fresh simulated port answering each round, they give exactly the releases and ledger
entries of the one-shot ``step``."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.mechanisms.client import ABSENT, Aggregate, ClientPath, SimulatedClientPort
from privstream.mechanisms.contract import Rounds, Slot
from privstream.mechanisms.ldp_ids import MECHANISMS, LdpIdsConfig, LdpIdsMechanism, TwoRounds
from privstream.mechanisms.rounds import (
    Finished,
    Request,
    Requests,
    UnknownRequest,
    answer,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.stages import by_stream
from privstream.mechanisms.tasks import FrequencyTask
from tests.mechanisms.round_driving import Recording, by_rounds, one_shot

N, D, W, T, SEED = 900, 4, 5, 36, 11
TASK = FrequencyTask(D)
TWO_ROUNDS = ("LBD", "LBA", "LPD", "LPA")


def values_at(t: int) -> NDArray[np.int64]:
    """A population whose distribution shifts every 6 slots; ~5% hold no value at a slot."""
    rng = np.random.default_rng([SEED, t])
    phase = (t // 6) % 3
    p = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.25, 0.25, 0.25, 0.25]][phase]
    values = rng.choice(D, size=N, p=p).astype(np.int64)
    values[rng.random(N) < 0.05] = ABSENT
    return values


def slot_at(t: int, path: ClientPath = "aggregate", port: Any = None) -> Slot:
    randomness = SlotRandomness(SEED, "s", t, scope="test")
    port = port or SimulatedClientPort(values_at(t), TASK, randomness, path)
    return Slot("s", t, port, randomness)


def build(name: str) -> LdpIdsMechanism:
    return MECHANISMS[name](LdpIdsConfig(1.0, W, N, task=TASK))


def rounds_of(name: str) -> TwoRounds:
    mech = build(name)
    assert isinstance(mech, TwoRounds)
    return mech


@pytest.mark.parametrize("path", ["aggregate", "per-user"])
@pytest.mark.parametrize("name", TWO_ROUNDS)
def test_round_by_round_with_pickled_state_equals_one_shot(name: str, path: ClientPath) -> None:
    expected = one_shot(build(name), lambda t: slot_at(t, path), T)
    got, rounds = by_rounds(rounds_of(name), lambda t: slot_at(t, path), T)
    assert got == expected
    assert len(got) == 2 * T
    strategies = [json.loads(e)["strategy"] for e in got[0::2]]
    # Two rounds exactly when the slot publishes; one (M1 only) otherwise.
    assert rounds == [2 if s == "publish" else 1 for s in strategies]
    assert "publish" in strategies and len(set(strategies)) >= 2


@pytest.mark.parametrize("name", ["LBU", "LSP", "LPU"])
def test_one_shot_mechanisms_keep_their_step(name: str) -> None:
    assert not isinstance(build(name), Rounds)


def test_the_port_answers_only_the_requested_users() -> None:
    mech = rounds_of("LPD")
    state, t = mech.initial_state(), 1
    port = Recording(slot_at(t, "per-user").port)  # type: ignore[arg-type]
    slot = slot_at(t, port=port)
    first = mech.plan(state, slot)
    assert isinstance(first, Requests) and first.round == 1
    (ask,) = first.asks
    assert ask.users is not None and ask.users.size == (N // 2) // W
    answers = answer(slot.client, first)
    np.testing.assert_array_equal(port.asked["m1"], ask.users)
    assert answers["m1"].reports == ask.users.size
    mech.absorb(state, slot, answers)
    second = mech.plan(state, slot)  # the first slot always publishes (dis > err from r_0 = 0)
    assert isinstance(second, Requests) and second.round == 2
    (publication,) = second.asks
    assert publication.users is not None and publication.users.size > 0
    # Population division: nobody asked for the dissimilarity is asked again in the window.
    assert not set(publication.users.tolist()) & set(ask.users.tolist())
    mech.absorb(state, slot, answer(slot.client, second))
    assert set(port.asked) == {"m1", "m2"}
    np.testing.assert_array_equal(port.asked["m2"], publication.users)
    assert isinstance(mech.plan(state, slot), Finished) and state.pending is None


def test_budget_division_asks_every_eligible_user() -> None:
    mech = rounds_of("LBD")
    state, slot = mech.initial_state(), slot_at(1)
    first = mech.plan(state, slot)
    assert isinstance(first, Requests)
    (ask,) = first.asks
    assert ask.users is None and ask.epsilon == pytest.approx(0.5 / W)
    answers = answer(slot.client, first)
    assert answers["m1"].reports == int(slot.client.eligible().sum())


def test_an_unknown_request_kind_is_refused_by_name() -> None:
    request = Requests(1, (Request("m1", 1.0, kind="dissimilarity-to-neighbours"),))
    with pytest.raises(UnknownRequest, match="'dissimilarity-to-neighbours'"):
        answer(slot_at(1).client, request)


def test_answers_that_do_not_match_the_round_are_refused() -> None:
    mech = rounds_of("LBD")
    state, slot = mech.initial_state(), slot_at(1)
    planned = mech.plan(state, slot)
    assert isinstance(planned, Requests)
    with pytest.raises(ValueError, match=r"not answered yet"):
        mech.plan(state, slot)
    bogus = {"m2": answer(slot.client, planned)["m1"]}
    with pytest.raises(ValueError, match=r"miss \['m1'\] and hold unexpected \['m2'\]"):
        mech.absorb(state, slot, bogus)
    fresh = rounds_of("LBD")
    with pytest.raises(ValueError, match="no round in flight"):
        fresh.absorb(fresh.initial_state(), slot, bogus)


def test_requests_need_distinct_purposes_and_hide_users() -> None:
    with pytest.raises(ValueError, match="distinct request purposes"):
        Requests(1, (Request("m1", 1.0), Request("m1", 2.0)))
    shown = repr(Request("m2", 1.0, np.array([17, 42], dtype=np.int64)))
    assert "2 users" in shown and "17" not in shown and "42" not in shown


def test_a_failed_round_leaves_the_last_good_state() -> None:
    """``step`` stays pure: a port that fails in round 2 leaves the input state unchanged."""

    class Fails(Recording):
        def collect(self, users: Any, eps: float, purpose: str) -> Aggregate:
            if purpose == "m2":
                raise ConnectionError("devices unreachable")
            return super().collect(users, eps, purpose)

    mech = build("LPD")
    state = mech.initial_state()
    before = pickle.dumps(state)
    with pytest.raises(ConnectionError):
        mech.step(state, slot_at(1, port=Fails(slot_at(1).port)))  # type: ignore[arg-type]
    assert pickle.dumps(state) == before


def test_today_s_mechanisms_declare_one_server_stage() -> None:
    mech = build("LBD")
    (stage,) = mech.stages()
    assert (stage.name, stage.role, stage.key.name) == ("LBD", "curator", by_stream().name)
    assert stage.trust_domain == "curator" and stage.step == mech.step
    state = stage.state()
    assert pickle.loads(pickle.dumps(state)).mechanism == "LBD"
    assert stage.key.of(slot_at(3)) == "s"
