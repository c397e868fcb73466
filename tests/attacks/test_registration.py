"""Finding 4 of the privacy audit: under central DP, who had registered was a true count.

Reproduced (as it was): a user registered on their first accepted event, so two neighbouring
inputs — user X's first event at slot 15 or at slot 16 — released different class sizes at
slot 15 (51 vs 50), deterministically, with no noise. Fixed: the population and its
requirements come from the registration table before the data; data of anybody else are
``unregistered_user`` dead letters; everything that is not a noisy estimate is the same for
neighbouring inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privstream.families.registry import PERSONALIZED
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.validation import distinct_requirements
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.schema.events import UNREGISTERED, EventBatch
from tests.attacks.helpers import Outputs, run_operator

N, T, W, EPS = 60, 24, 6, 1.0
MECHANISMS = ["PBD", "PBA", "BD", "Uniform", "PLBU", "PU", "Sample", "BA"]
USERS = [f"u{i}" for i in range(N)]
# Fields of a release and a ledger entry (envelope or ``details``) that are neither noisy nor
# decided from noisy values: none may depend on the data. (users_pub follows the publish
# decision: checked against it.)
PUBLIC_RELEASE = ("stream", "mechanism", "slot", "guarantee", "users_dc", "registered", "bits")
PUBLIC_LEDGER = ("guarantee", "division", "epsilon_dc", "sizes")


def table() -> dict[str, tuple[float, int]]:
    return {u: ((1.0, 6) if i % 3 else (2.0, 3)) for i, u in enumerate(USERS)}


def events(
    first_of_x: int,
    extra: list[str] = (),  # type: ignore[assignment]
    t_max: int = T,
) -> list[EventBatch]:
    """Every registered user reports every slot, except ``u7`` whose first event is at
    ``first_of_x``; ``extra`` users (not registered) report too."""
    rng = np.random.default_rng(2)
    out = []
    for t in range(1, t_max + 1):
        registered = (rng.random(N) < 0.5).astype(float)
        keep = [i for i, u in enumerate(USERS) if u != "u7" or t >= first_of_x]
        users = [USERS[i] for i in keep] + list(extra)
        values = np.concatenate([registered[keep], np.ones(len(extra))])
        out.append(
            EventBatch("s", np.full(len(users), t), np.array(users, dtype=object), values, None, t)
        )
    return out


def run(items: list[EventBatch], mechanisms: list[str] = MECHANISMS) -> Outputs:
    config = PersonalizedConfig(population=2 * N, epsilon=EPS, window=W)
    return run_operator(
        items,
        lambda keyed: family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism=mechanisms, config=config, secret=4,
            registration=Preferences(by_user=table()),
            split=BudgetSplit.parse(None, len(mechanisms), compare=True),
        ),
    )  # fmt: skip


def project(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """``fields`` of every row, read from the envelope or its ``details``, plus the sizes of
    its privacy classes (``sizes``)."""
    out = []
    for r in rows:
        flat = {**r.get("details", {}), **r, "sizes": [c["users"] for c in r.get("classes", ())]}
        out.append(tuple(str(flat.get(f)) for f in ("mechanism", "slot", *fields)))
    return sorted(out)


def test_neighbouring_first_events_release_the_same_public_fields() -> None:
    """User X's first event at slot 15 or 16: slot 15 (and every other slot) shows the same
    class sizes, user counts and communication bits. Only noisy estimates may differ."""
    at15, at16 = run(events(15)), run(events(16))
    assert project(at15["releases"], PUBLIC_RELEASE) == project(at16["releases"], PUBLIC_RELEASE)
    assert project(at15["ledger"], PUBLIC_LEDGER) == project(at16["ledger"], PUBLIC_LEDGER)
    for r in at15["releases"] + at16["releases"]:  # everybody registered gets the budget
        assert r["details"]["users_pub"] == (N if r["details"]["theta_pub"] > 0 else 0)
    sizes = {c["users"] for e in at15["ledger"] for c in e["classes"]}
    assert sizes == {N // 3, N - N // 3}  # the registration's class sizes, from slot 1 on
    assert {sum(c["users"] for c in e["classes"]) for e in at15["ledger"]} == {N}
    assert {r["details"]["registered"] for r in at15["releases"]} == {N}


def test_unregistered_users_are_dead_letters_and_change_nothing() -> None:
    """Same noise key: adding data from users outside the registration leaves every release
    byte-identical; each of their events is an ``unregistered_user`` dead letter."""
    plain = run(events(1))
    strangers = run(events(1, extra=["x1", "x2", "x3"]))
    assert strangers["releases"] == plain["releases"]
    assert strangers["ledger"] == plain["ledger"]
    dead = strangers["dead_letters"]
    assert len(dead) == 3 * T and {d.reason for d in dead} == {UNREGISTERED}
    assert all('"x' in d.payload for d in dead)


def test_plbu_bits_count_registered_users_not_senders() -> None:
    """PLBU's communication bits were ``true count × d``: now every registered user is asked,
    whether or not they sent data."""
    sparse = events(20)
    out = run(sparse, ["PLBU"])
    assert {r["details"]["bits"] for r in out["releases"]} == {N * 2}


def test_a_registration_outside_the_limits_is_refused_at_start() -> None:
    """A user-stated window of 2^62 sized the ledger ring (MemoryError), ε = 1e-310 made a
    noise scale infinite: both are refused before anything runs, naming no user."""
    for bad in ({"u1": (1.0, 2**62)}, {"u1": (1e-310, 5)}):
        with pytest.raises(ValueError, match="registration entry 1") as err:
            Preferences(by_user=bad)
        assert "u1" not in str(err.value)


def test_a_bad_entry_behind_many_good_ones_is_named_by_its_own_number() -> None:
    """The table is checked per distinct requirement (``distinct_requirements``), and the
    refusal still names the first bad entry; a window ``True`` equal to 1 is not taken for
    the good entry ``(1.0, 1)`` before it."""
    good = {f"u{i}": (1.0 if i % 2 else 0.5, 10) for i in range(1000)}
    for bad, number in (((1.0, 2**62), 1001), ((1e-310, 10), 1001)):
        table = {**good, "x": bad, "y": bad}
        with pytest.raises(ValueError, match=f"registration entry {number}:"):
            Preferences(by_user=table)
    with pytest.raises(ValueError, match="registration entry 2: window must be an integer"):
        Preferences(by_user={"a": (1.0, 1), "b": (1.0, True)})  # type: ignore[dict-item]
    assert distinct_requirements([(1.0, 5), (2.0, 5), (1.0, 5), (3.0, 6)]) == [
        (1, (1.0, 5)), (2, (2.0, 5)), (4, (3.0, 6))]  # fmt: skip


def test_events_cannot_change_a_registered_requirement() -> None:
    items = events(1)
    first = items[0]
    rows = len(first)
    stating = np.arange(rows) % 2 == 0  # half the rows state a requirement of their own
    stated = EventBatch(
        "s", first.slots, first.users, first.values, None, 1,
        epsilons=np.where(stating, 0.5, np.nan), windows=np.where(stating, 2**40, 0),
    )  # fmt: skip
    out = run([stated, *items[1:]], ["PBD"])
    assert len(out["dead_letters"]) == stating.sum()
    assert {d.reason for d in out["dead_letters"]} == {"requirement_changed"}
    assert len(out["releases"]) == T


def public_metric_samples(names: tuple[str, ...]) -> dict[tuple[str, tuple[Any, ...]], float]:
    from prometheus_client import REGISTRY

    out = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in names and sample.labels.get("stream") == "s":
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_neighbouring_first_events_export_the_same_population_metrics() -> None:
    """The public metrics of a cdp stream that do not follow from noisy decisions — class
    sizes, users available or used, population, budgets — are the same for neighbours."""
    names = (
        "privstream_class_users", "privstream_users_available", "privstream_window_users_used",
        "privstream_population", "privstream_budget", "privstream_scope_slots",
        "privstream_population_budget",
    )  # fmt: skip
    run(events(15, t_max=15))  # scraped right after slot 15: X sent data or not yet
    at15 = public_metric_samples(names)
    run(events(16, t_max=15))
    at16 = public_metric_samples(names)
    assert at15 == at16 and len(at15) > 5 * len(MECHANISMS)
