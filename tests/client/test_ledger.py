"""The device's ledger refuses whatever would exceed its own budget, whatever the server asks."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.client.ledger import RELATIVE_TOLERANCE, Ledger, Policy
from privstream.mechanisms import ledger as server_ledger
from tests.client.helpers import FakeRequest

POLICY = Policy(epsilon=1.0, window=5)


def _answer(ledger: Ledger, request: FakeRequest) -> str | None:
    refusal = ledger.check(request)
    if refusal is None:
        ledger.charge(request)
        return None
    return refusal.reason


def test_the_slack_is_the_server_ledger_slack() -> None:
    assert RELATIVE_TOLERANCE == server_ledger.RELATIVE_TOLERANCE


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"oracle": "RAPPOR"}, "oracle"),
        ({"window": 4}, "window"),
        ({"window": 50}, "window"),
        ({"epsilon": 1.5}, "budget"),
        ({"epsilon": 0.0}, "budget"),
        ({"epsilon": math.nan}, "budget"),
        ({"division": "user"}, "division"),
        ({"slot": -1}, "invalid"),
        ({"d": 10**9}, "oracle"),
        ({"d": 1}, "oracle"),
    ],
)
def test_a_request_the_policy_does_not_accept_is_refused_with_its_reason(
    change: dict[str, object], reason: str
) -> None:
    ledger = Ledger(POLICY)
    refusal = ledger.check(replace(FakeRequest(window=5), **change))  # type: ignore[arg-type]
    assert refusal is not None and refusal.reason == reason and refusal.message
    assert ledger.streams == {}


def test_budget_division_refuses_the_request_that_would_overspend_the_window() -> None:
    ledger = Ledger(POLICY)
    assert [_answer(ledger, FakeRequest(slot=t, epsilon=0.3)) for t in range(5)] == [
        None,
        None,
        None,
        "exhausted",
        "exhausted",
    ]
    assert _answer(ledger, FakeRequest(slot=5, epsilon=0.3)) is None  # slot 0 left the window
    assert _answer(ledger, FakeRequest(slot=5, round=1, epsilon=0.1)) is None  # 0.3+0.3+0.3+0.1
    assert _answer(ledger, FakeRequest(slot=5, round=2, epsilon=0.01)) == "exhausted"


def test_ten_tenths_fit_a_budget_of_one() -> None:
    """Float rounding of ``Σ 0.1`` does not refuse the w-th report (the server's slack)."""
    ledger = Ledger(Policy(epsilon=1.0, window=10))
    assert all(
        _answer(ledger, FakeRequest(slot=t, epsilon=0.1, window=10)) is None for t in range(10)
    )
    assert _answer(ledger, FakeRequest(slot=9, round=1, epsilon=1e-6, window=10)) == "exhausted"


def test_population_division_allows_one_report_per_window() -> None:
    ledger = Ledger(POLICY)
    reasons = [
        _answer(ledger, FakeRequest(slot=t, epsilon=1.0, division="population")) for t in range(11)
    ]
    assert [t for t, r in enumerate(reasons) if r is None] == [0, 5, 10]
    assert set(reasons) == {None, "window"}


def test_replays_of_old_slots_and_answered_requests_are_refused() -> None:
    ledger = Ledger(POLICY)
    assert _answer(ledger, FakeRequest(slot=3, epsilon=0.1)) is None
    assert _answer(ledger, FakeRequest(slot=3, epsilon=0.1)) == "answered"
    assert _answer(ledger, FakeRequest(slot=2, epsilon=0.1)) == "stale"
    assert (
        _answer(ledger, FakeRequest(stream="other", slot=0, epsilon=1.0, division="population"))
        is None
    )


def test_mechanisms_of_one_stream_share_its_budget_and_each_has_its_own_population_rule() -> None:
    """Budget and population division side by side on one stream (LBU and LPA with half of ε
    each), and two mechanisms asking in the same round: each request is its own (``answered``
    per round and purpose), the ε of all of them sums within the window, and the one report
    per window of population division holds per mechanism."""
    ledger = Ledger(POLICY)  # ε = 1 per w = 5
    lbu = [FakeRequest(slot=t, epsilon=0.1, purpose="LBU.m2") for t in range(5)]
    assert [_answer(ledger, r) for r in lbu[:2]] == [None, None]
    lpa = FakeRequest(slot=1, epsilon=0.5, purpose="LPA.m2", division="population")
    assert _answer(ledger, lpa) is None  # same slot and round as LBU's, another purpose
    again = FakeRequest(slot=2, epsilon=0.1, purpose="LPA.m1", division="population")
    assert _answer(ledger, again) == "window"  # LPA's one report in this window is spent
    lpu = FakeRequest(slot=2, epsilon=0.3, purpose="LPU.m2", division="population")
    assert _answer(ledger, lpu) is None  # another mechanism: its own rule, ε sums to 1.0
    assert _answer(ledger, lbu[2]) == "exhausted"  # 0.2 + 0.5 + 0.3 + 0.1 > 1


def test_charge_refuses_what_check_refuses() -> None:
    with pytest.raises(ValueError, match="budget"):
        Ledger(POLICY).charge(FakeRequest(epsilon=2.0))


def test_the_state_round_trips() -> None:
    ledger = Ledger(POLICY)
    for t in (0, 2, 9):
        ledger.charge(FakeRequest(slot=t, epsilon=0.25))
    again = Ledger.from_state(POLICY, ledger.to_state())
    assert again.to_state() == ledger.to_state()
    assert set(again.streams["s"].charges) == {9}  # slots no window can reach are forgotten


requests = st.builds(
    FakeRequest,
    stream=st.sampled_from(["a", "b"]),
    slot=st.integers(0, 40),
    round=st.integers(0, 2),
    oracle=st.sampled_from(["GRR", "OUE", "OLH", "HM", "RAPPOR"]),
    epsilon=st.one_of(st.floats(0.0, 1.5), st.sampled_from([0.1, 0.2, 1 / 3, 0.5, 1.0])),
    window=st.sampled_from([5, 5, 5, 3, 8]),
    division=st.sampled_from(["budget", "population"]),
    purpose=st.sampled_from(["LBU.m2", "LPA.m1", "LPA.m2", "LPU.m2"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, max_size=60))
def test_whatever_the_server_asks_the_device_never_overspends(sequence: list[FakeRequest]) -> None:
    """Σ ε over any w consecutive slots ≤ ε (with the float slack) and, under population
    division, each mechanism's reports at least w slots apart: for every adversarial request
    sequence."""
    ledger, w = Ledger(POLICY), POLICY.window
    sent: dict[str, list[FakeRequest]] = defaultdict(list)
    for request in sequence:
        if _answer(ledger, request) is None:
            sent[request.stream].append(request)
    for reports in sent.values():
        assert {r.window for r in reports} <= {w}
        for start in range(0, 41):
            spent = math.fsum(r.epsilon for r in reports if start <= r.slot < start + w)
            assert spent <= POLICY.epsilon * (1 + RELATIVE_TOLERANCE)
        for mechanism in {r.purpose.split(".")[0] for r in reports}:
            slots = [r.slot for r in reports if r.division == "population"
                     and r.purpose.split(".")[0] == mechanism]  # fmt: skip
            assert all(b - a >= w for a, b in itertools.pairwise(slots))
