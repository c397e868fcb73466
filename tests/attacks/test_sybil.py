"""Issue 18 §4, "Sybils take an LDP population": whoever writes to the input topic picks the ids.

Reproduced (as it was): an open LDP stream enrolled the newcomers of a slot in user-id order up
to its population n. 1,000 sybil ids that sort first ("0000-sybil-…"), reporting category 1 in
the first slot beside the 1,000 real users, took all n = 1,000 seats: every one of the 20,000
real events was a ``population_full`` dead letter and LBU released 0.998–1.000 for category 1
against a truth of 0.101.

Fixed: (1) the newcomers of a slot enrol in the keyed order of the run's secret
(``EnrolmentOrder``), so the ids a sender picks gain nothing: the sybils take their share of the
newcomers (500 ± 11 seats, hypergeometric), not all of them; (2) an LDP stream may take a
registration table (a closed population): only its users enrol, the sybils are
``unregistered_user`` dead letters and the release is the truth within the LDP noise. The keyed
order has an honest limit, pinned here too: sybils who report in an earlier slot than the real
users still take every seat first; only the table defends against that. (3) A filling population
is visible: ``privstream_population_enrolled_ratio`` reaches 1 (alert
``PrivstreamPopulationFilling``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from privstream.families.registry import LDP_IDS
from privstream.mechanisms.guarantees import Guarantee, PeriodScope, PureDP, StreamScope
from privstream.mechanisms.seeding import EnrolmentOrder, NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences, check_closed_population
from privstream.schema.events import POPULATION_FULL, UNREGISTERED, EventBatch
from tests.attacks.helpers import Outputs, run_operator

N, T, EPS, W = 1000, 20, 4.0, 1
TASK = FrequencyTask(2)
SECRET = NoiseKey.from_text("9b1f4c7e2a8d3b6f0e5c1a9d7b3f8e2c4a6d0b5f")
OTHER = NoiseKey.from_text("e3a7c1f9b5d2086a4c8e1b7f3d9a5c2e0b6f4d81")
REAL = [f"user-{i:05d}" for i in range(N)]
SYBILS = [f"0000-sybil-{i:04d}" for i in range(N)]  # sort before every real id
VALUES = (np.random.default_rng(18).random(N) < 0.1).astype(float)
TRUTH = float(VALUES.mean())  # 0.101
SD = math.sqrt(TASK.variance(EPS, N) / T)  # of the mean of T independent releases over N users


def events(sybils_first: bool) -> list[EventBatch]:
    """The real users report their value at every one of ``T`` slots (20,000 events); the
    sybils report category 1 at every slot too (a value is carried at most w − 1 slots, so a
    sybil must keep reporting to keep counting), from the real users' first slot or from one
    slot before it."""
    out = [] if not sybils_first else [_batch(0, SYBILS, np.ones(N))]
    for t in range(1, T + 1):
        users, values = SYBILS + REAL, np.concatenate([np.ones(N), VALUES])
        out.append(_batch(t, users, values))
    return out


def _batch(t: int, users: list[str], values: Any) -> EventBatch:
    ids = np.array(users, dtype=object)
    return EventBatch("s", np.full(len(users), t), ids, np.asarray(values, float), None, t)


def run(items: list[EventBatch], secret: NoiseKey = SECRET, table: bool = False) -> Outputs:
    config = LDP_IDS.make_config(epsilon=EPS, window=W, population=N, task=TASK)
    registration = Preferences(by_user={u: (EPS, W) for u in REAL}) if table else None
    return run_operator(
        items,
        lambda keyed: family_mechanisms(
            "l", keyed, family=LDP_IDS, mechanism="LBU", config=config, secret=secret,
            registration=registration,
        ),
    )  # fmt: skip


def mean_estimate(out: Outputs) -> float:
    releases = [r for r in out["releases"] if r["slot"] >= 1]
    assert len(releases) == T
    return float(np.mean([r["estimate"][1] for r in releases]))


def turned_away(out: Outputs) -> Counter[str]:
    """Real users whose events were refused, by reason (one per user: they report each slot)."""
    refused: Counter[str] = Counter()
    for letter in out["dead_letters"]:
        event = json.loads(letter.payload)
        if event["user"].startswith("user-") and event["slot"] == 1:
            refused[letter.reason] += 1
    return refused


def reasons(out: Outputs) -> Counter[str]:
    return Counter(letter.reason for letter in out["dead_letters"])


@pytest.fixture(scope="module")
def beside() -> Outputs:
    return run(events(sybils_first=False))


def test_sybil_ids_that_sort_first_take_only_their_share_of_the_seats(beside: Outputs) -> None:
    # Before: all 1,000 seats went to the sybils (20,000 population_full real events, 0.998).
    seated_sybils = turned_away(beside)[POPULATION_FULL]  # each sybil seat turns a real user away
    hypergeometric_sd = math.sqrt(N * 0.5 * 0.5 * N / (2 * N - 1))  # 11.2
    assert abs(seated_sybils - N / 2) <= 5 * hypergeometric_sd, seated_sybils
    # seated sybils turn their real users away at every slot; unseated sybils are refused too
    assert reasons(beside)[POPULATION_FULL] == seated_sybils * T + (N - seated_sybils) * T
    seated_real = np.ones(N, dtype=bool)
    refused = {letter.payload for letter in beside["dead_letters"]}
    for i, user in enumerate(REAL):
        seated_real[i] = not any(f'"{user}"' in raw for raw in refused)
    expected = (seated_sybils + VALUES[seated_real].sum()) / N
    assert abs(mean_estimate(beside) - expected) <= 5 * SD
    # still biased by the sybils' share: the keyed order is no defence against volume
    assert mean_estimate(beside) > TRUTH + 0.3


def test_the_keyed_order_is_replayed_and_depends_on_the_secret(beside: Outputs) -> None:
    again = run(events(sybils_first=False))
    assert [d.payload for d in again["dead_letters"]] == [d.payload for d in beside["dead_letters"]]
    assert again["releases"] == beside["releases"]
    other = run(events(sybils_first=False), secret=OTHER)
    assert {d.payload for d in other["dead_letters"]} != {d.payload for d in beside["dead_letters"]}


def test_the_order_is_a_keyed_prf_of_the_id_not_the_id() -> None:
    order = EnrolmentOrder.of(SECRET)
    ranked = order.sort("s", SYBILS + REAL)
    assert ranked == order.sort("s", list(reversed(SYBILS + REAL)))  # not the input order
    assert ranked != sorted(SYBILS + REAL)
    assert sum(u.startswith("0000") for u in ranked[:N]) < N * 0.6  # ids gain no precedence
    assert EnrolmentOrder.of(OTHER).sort("s", REAL) != order.sort("s", REAL)
    assert order.sort("t", REAL) != order.sort("s", REAL)  # each stream its own order
    assert "key" not in repr(order) or SECRET.material.hex() not in repr(order)


def test_sybils_who_report_first_still_take_every_seat_without_a_table() -> None:
    # The honest limit of the keyed order: it orders one slot's newcomers only.
    out = run(events(sybils_first=True))
    assert turned_away(out)[POPULATION_FULL] == N
    assert reasons(out)[POPULATION_FULL] == N * T  # every real event
    assert mean_estimate(out) > 1 - 5 * SD


@pytest.mark.parametrize("sybils_first", [False, True])
def test_a_registration_table_closes_the_population(sybils_first: bool) -> None:
    out = run(events(sybils_first), table=True)
    sybil_events = N * (T + sybils_first)
    assert reasons(out) == Counter({UNREGISTERED: sybil_events})  # every sybil event, no other
    assert abs(mean_estimate(out) - TRUTH) <= 5 * SD, (mean_estimate(out), TRUTH, SD)


def test_a_filling_population_is_visible_on_the_public_endpoint(beside: Outputs) -> None:
    assert ratio() == 1.0  # every seat taken: the alert's condition
    run([_batch(t, REAL[:250], VALUES[:250]) for t in range(1, 4)], table=True)
    assert ratio() == 0.25  # a quarter of the registered users ever reported


def ratio() -> float | None:
    return REGISTRY.get_sample_value("privstream_population_enrolled_ratio", {"stream": "s"})


def test_a_table_the_stream_cannot_honour_is_refused_by_entry() -> None:
    window = Guarantee(PureDP(1.0), PeriodScope(1), "ldp")
    lifetime = Guarantee(PureDP(1.0), StreamScope(), "ldp")
    table = Preferences(by_user={"a": (1.0, 1), "b": (2.0, 3)})
    with pytest.raises(ValueError, match=r"entry 2 asks .* 3 over 3 slots"):
        check_closed_population(table, 1.0, window, 10)
    assert check_closed_population(table, 1.0, lifetime, 10) == {"a", "b"}
    with pytest.raises(ValueError, match="holds 2 users but the stream's population is n=1"):
        check_closed_population(table, 1.0, lifetime, 1)
    with pytest.raises(ValueError, match="must name its users"):
        check_closed_population(Preferences(epsilons=np.ones(3)), 1.0, lifetime, 10)
