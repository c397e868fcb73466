"""The ``ldp-reports`` server stage (``operators.report_rounds``, ``operators.report_book``)
under the fleet's faults (issue 23): lying devices, devices that drop out, late reports,
forged and runaway round markers, and a replay of the report topic (fresh, and resumed from a
snapshot taken between rounds or inside one).

Runs are in-process (``experiments.reports_loop``) with a seeded fleet; ``reports_stats``
keeps the batches the server got, so they can be fed again to a fresh server stage.
"""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest

from privstream.experiments.reports_loop import seeded_devices
from privstream.mechanisms.contract import LedgerEntry
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.report_book import RoundBook
from privstream.operators.report_rounds import (
    MAX_OPEN_AHEAD,
    ReportItem,
    ReportRoundsLogic,
    ReportsPlan,
)
from privstream.operators.slotting import make_plan
from privstream.runtime.fleet import EXPECTED_REASONS, LIES, Fleet, FleetConfig
from privstream.schema.events import UNAUTHENTICATED_MARKER
from privstream.schema.protocol import CLOSED_ROUND, Close, Report, decode_message
from privstream.schema.report_wire import ReportColumns
from tests.mechanisms.reports_stats import (
    EPSILON,
    TASK,
    WINDOW,
    Captured,
    build,
    canonical,
    captured,
    check_standard,
    replay,
    request_ids,
    sin,
    standardized,
)

HONEST, SLOTS, SEED = 200, 8, 5
STREAM = "reports"
BUDGET_TOLERANCE = 1e-9  # the ledgers' float slack (client.ledger.RELATIVE_TOLERANCE)


def book_of(c: Captured) -> RoundBook:
    assert c.logic.state is not None
    book = c.logic.state.protocol
    assert isinstance(book, RoundBook)
    return book


def entries(c: Captured) -> list[LedgerEntry]:
    return [e for e in c.run.ledger if isinstance(e, LedgerEntry)]


def spends(c: Captured) -> list[tuple[float, float]]:
    """Each slot's (charged, spent) of the one class."""
    return [(e.classes[0].charged, e.classes[0].spent) for e in entries(c)]


def assert_within_budget(c: Captured) -> None:
    for e in entries(c):
        for cls in e.classes:
            assert cls.charged <= cls.budget * (1 + BUDGET_TOLERANCE), e
            assert cls.spent <= cls.budget * (1 + BUDGET_TOLERANCE), e


def items(c: Captured) -> list[ReportItem]:
    """The server's inputs one message at a time (its runs of columns as their reports)."""
    return [
        (partition, message)
        for batch in c.batches
        for partition, item in batch
        for message in (item.reports() if isinstance(item, ReportColumns) else [item])
    ]


def device_of(payload: str) -> str:
    return str(json.loads(payload)["device"])


# -- lying devices -----------------------------------------------------------------------------


def lying_run(name: str, liars: int) -> Captured:
    """``HONEST`` honest devices (the same ones whatever ``liars``) plus ``liars`` liars."""
    source = sin(HONEST + len(LIES), SLOTS, SEED)  # one dataset: the honest hold the same values
    fleet = FleetConfig(HONEST + liars, EPSILON, WINDOW, liars=liars)
    return captured([name], source, fleet, slots=SLOTS, seed=SEED)


def reasons_by_lie(c: Captured) -> dict[str, set[str]]:
    """The dead letters' reasons, by the lie of the device each names (every one a liar)."""
    out: dict[str, set[str]] = defaultdict(set)
    for dead in c.run.dead_letters:
        device = device_of(dead.payload)
        assert device in c.fleet.liars, f"an honest device's report was refused: {dead.reason}"
        out[c.fleet.liars[device]].add(dead.reason)
    return out


def test_every_lie_is_dead_lettered_for_exactly_its_reasons() -> None:
    """One liar per lie. Budget division (LBU) asks every device, so the ``not-asked`` lie
    never fits there; population division (LPU) asks a group, so it does."""
    covered = set()
    for name in ("LBU", "LPU"):
        c = lying_run(name, len(LIES))
        found = reasons_by_lie(c)
        assert set(found) == set(c.fleet.stats.lies), name  # every lie sent was refused
        for lie, reasons in found.items():
            assert reasons == set(EXPECTED_REASONS[lie]), (name, lie, reasons)
        covered |= set(found)
        assert_within_budget(c)
    assert covered == set(LIES)


def refused_items(c: Captured) -> set[int]:
    """Which of the server's inputs it dead-lettered (fed one at a time to a fresh stage)."""
    logic, refused = ReportRoundsLogic("reports", c.plan, None), set()
    for i, item in enumerate(items(c)):
        out, _ = logic.on_batch([item])
        if any(kind == "dead_letter" for kind, _e in out):
            refused.add(i)
    return refused


@pytest.mark.parametrize("name", ["LBU", "LBD", "LBA", "LSP"])
def test_liars_change_nobody_elses_result(name: str) -> None:
    """Liars added to the same honest devices: the server's input without the liars' messages
    releases exactly what the run without liars released, and its input without the messages
    it refused releases exactly what it released — a lie changes nothing but the liar's own
    accepted report (the first copy of a ``duplicate`` or ``flood`` is well-formed and asked,
    so it counts like an honest report). The server asks the same (request ids), and nothing
    is overspent."""
    honest, lied = lying_run(name, 0), lying_run(name, len(LIES))
    assert honest.run.dead_letters == [] and lied.run.dead_letters
    reasons_by_lie(lied)  # every dead letter names a liar
    assert [r.id for r in lied.run.requests] == [r.id for r in honest.run.requests]
    liars = set(lied.fleet.liars)
    all_items = items(lied)
    truthful = [i for i in all_items if not (isinstance(i[1], Report) and i[1].device in liars)]
    _, out = replay(lied.plan, [[i] for i in truthful])
    assert canonical(out, "release") == canonical(outputs_of(honest), "release")
    refused = refused_items(lied)
    assert len(refused) == len(lied.run.dead_letters)
    kept = [item for i, item in enumerate(all_items) if i not in refused]
    _, out = replay(lied.plan, [[i] for i in kept])
    assert canonical(out, "release") == canonical(outputs_of(lied), "release")
    assert canonical(out, "ledger") == canonical(outputs_of(lied), "ledger")
    assert spends(lied) == spends(honest)
    assert_within_budget(honest)
    assert_within_budget(lied)


def outputs_of(c: Captured) -> list[tuple[str, Any]]:
    """The run's releases and ledger entries as server outputs."""
    return [("release", r) for r in c.run.releases] + [
        ("ledger", e) for e in c.run.ledger if isinstance(e, LedgerEntry)
    ]


# -- dropout -----------------------------------------------------------------------------------


def dropout_run(
    name: str, dropout: float, seed: int, users: int = 400, slots: int = 20
) -> Captured:
    fleet = FleetConfig(users, EPSILON, WINDOW, dropout=dropout, seed=seed)
    return captured([name], sin(users, slots, seed), fleet, slots=slots, seed=seed)


@pytest.mark.parametrize("name", ["LBU", "LPU"])
def test_dropout_releases_stay_unbiased(name: str) -> None:
    """30% of the asked devices never answer: each publication is the oracle's unbiased
    estimate over the reports that came (``reports_stats``: ``m`` = the actual reports, the
    reporting set a uniform ``m``-subset, hence the hypergeometric term)."""
    runs = [dropout_run(name, 0.3, seed) for seed in (1, 2, 3)]
    z = np.concatenate([standardized(c.run.releases, sin(400, 20, s))
                        for c, s in zip(runs, (1, 2, 3), strict=True)])  # fmt: skip
    check_standard(z, f"{name} with dropout")
    for c in runs:  # the reports really were fewer
        m = [r.details.users_m2 for r in c.run.releases if r.strategy == "publish"]  # type: ignore[attr-defined]
        assert c.fleet.stats.dropped > 0 and all(k > 0 for k in m)


@pytest.mark.parametrize("name", ["LBU", "LBD", "LBA"])
def test_missing_counts_the_budget_division_reports_never_sent(name: str) -> None:
    """Every device is asked by a budget-division request; those that dropped out are what
    the book counts missing (no device's ledger refused, nobody lied or was late)."""
    c = dropout_run(name, 0.25, 7, users=200, slots=10)
    stats = c.fleet.stats
    assert sum(stats.refused.values()) == 0 and stats.late == 0 and stats.dropped > 0
    assert book_of(c).missing == stats.dropped
    assert stats.reports + stats.dropped == 200 * len(c.run.requests)  # every device asked


def test_missing_ignores_population_division() -> None:
    """A population-division request asks a sample: the devices it did not reach are not
    missing reports (the count is the budget division's)."""
    c = dropout_run("LPU", 0.25, 7, users=200, slots=10)
    assert c.fleet.stats.dropped > 0 and book_of(c).missing == 0


def test_the_ledger_mirror_charges_what_it_asked() -> None:
    """The server never believes a budget went unspent: LBU's ledger is the same whoever
    answered (nobody at all with dropout 1), and LBD's each slot charges exactly the budgets
    of the requests it published."""
    base = dropout_run("LBU", 0.0, 3, users=200, slots=10)
    for dropout in (0.3, 1.0):
        c = dropout_run("LBU", dropout, 3, users=200, slots=10)
        assert spends(c) == spends(base)
        assert [r.id for r in c.run.requests] == [r.id for r in base.run.requests]
    assert all(r.details.users_m2 == 0 for r in c.run.releases)  # type: ignore[attr-defined]
    assert book_of(c).missing == 200 * 10
    lbd = dropout_run("LBD", 0.3, 3, users=200, slots=10)
    asked: dict[int, float] = defaultdict(float)
    for r in lbd.run.requests:
        asked[r.slot] += r.epsilon
    for e in entries(lbd):
        assert e.classes[0].charged == pytest.approx(asked[e.slot], rel=1e-12)
    assert_within_budget(lbd)


# -- late reports and round markers ------------------------------------------------------------


@pytest.mark.parametrize("names", [("LBU",), ("LBD",), ("LBU", "LBD")], ids="+".join)
def test_late_reports_become_closed_round_dead_letters(names: tuple[str, ...]) -> None:
    """A report held back past its round's marker is refused as ``closed_round``, every one of
    them (with two mechanisms, the first request's late reports too: they reach the server
    after the marker, not with the round's other request)."""
    fleet = FleetConfig(HONEST, EPSILON, WINDOW, late=0.2, seed=2)
    c = captured(list(names), sin(HONEST, SLOTS, SEED), fleet, slots=SLOTS, seed=SEED)
    assert c.fleet.stats.late > 0
    assert Counter(d.reason for d in c.run.dead_letters) == {CLOSED_ROUND: c.fleet.stats.late}


def manual(name: str = "LBU", users: int = 50) -> tuple[ReportRoundsLogic, Fleet, bytes]:
    """A server stage fed by hand, a fleet to answer it, and the clock's key."""
    key = NoiseKey.coerce(SEED)
    plan = ReportsPlan.of(make_plan("reports", [build(name, users)], TASK, users, key), 1)
    fleet = Fleet(FleetConfig(users, EPSILON, WINDOW), sin(users, 100, SEED), seeded_devices(1))
    return ReportRoundsLogic("reports", plan, None), fleet, key.clock_key()


def feed(logic: ReportRoundsLogic, *messages: Any) -> list[tuple[str, Any]]:
    out, _ = logic.on_batch([(0, m) for m in messages])
    return list(out)


def answers(fleet: Fleet, out: list[tuple[str, Any]]) -> list[Report | Close]:
    return [decode_message(m) for _k, r in out if _k == "request"
            for _d, m in fleet.receive(r.to_json())]  # fmt: skip


def test_an_unauthenticated_marker_is_dead_lettered_and_closes_nothing() -> None:
    logic, fleet, clock = manual()
    forged = Close(STREAM, 1, 0, "ab" * 32)
    out = feed(logic, forged)
    assert [(k, e.reason) for k, e in out] == [("dead_letter", UNAUTHENTICATED_MARKER)]
    assert logic.state is not None and logic.state.protocol.opened == 0  # opened nothing
    out = feed(logic, Close(STREAM, 1, 0).signed(clock))
    assert [k for k, _e in out] == ["request"]
    other_clock = NoiseKey.coerce(SEED + 1).clock_key()
    out = feed(logic, *answers(fleet, out), Close(STREAM, 1, 1, "00" * 32))
    assert [(k, e.reason) for k, e in out] == [("dead_letter", UNAUTHENTICATED_MARKER)]
    out = feed(logic, Close(STREAM, 1, 1).signed(other_clock))  # another deployment's clock
    assert [(k, e.reason) for k, e in out] == [("dead_letter", UNAUTHENTICATED_MARKER)]
    book = logic.state.protocol
    assert (book.slot, book.round, len(book.open)) == (1, 1, 1)  # the round is still open
    out = feed(logic, Close(STREAM, 1, 1).signed(clock))
    released = [e for k, e in out if k == "release"]
    assert len(released) == 1 and released[0].details.users_m2 == 50


def test_a_marker_too_far_ahead_is_ignored() -> None:
    logic, fleet, clock = manual()
    out = feed(logic, Close(STREAM, 1, 0).signed(clock))
    out = feed(logic, *answers(fleet, out), Close(STREAM, 1, 1).signed(clock))
    assert [k for k, _e in out] == ["release", "ledger"]
    book = logic.state.protocol  # type: ignore[union-attr]
    for ignored in (1 + MAX_OPEN_AHEAD + 1, 10**9, 1):  # too far, far beyond, stale
        assert feed(logic, Close(STREAM, ignored, 0).signed(clock)) == []
        assert (book.slot, book.opened, book.round) == (1, 1, 0)
    out = feed(logic, Close(STREAM, 1 + MAX_OPEN_AHEAD, 0).signed(clock))  # the farthest allowed
    assert book.opened == 1 + MAX_OPEN_AHEAD
    assert [(k, e.slot) for k, e in out] == [("request", 2)]  # slots run on one at a time


# -- replay ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty() -> Captured:
    """LBD (two rounds a slot) with every fault: dropout, late reports and liars."""
    fleet = FleetConfig(HONEST + len(LIES), EPSILON, WINDOW, dropout=0.1, late=0.1,
                        liars=len(LIES), seed=4)  # fmt: skip
    c = captured(["LBD"], sin(HONEST + len(LIES), SLOTS, SEED), fleet, slots=SLOTS, seed=SEED)
    assert c.run.dead_letters and any(r.round == 2 for r in c.run.requests)
    return c


def recorded(c: Captured) -> dict[str, list[str]]:
    run = c.run
    return {
        "release": [json.dumps(r.to_dict(), sort_keys=True) for r in run.releases],
        "ledger": [json.dumps(e.to_dict(), sort_keys=True) for e in run.ledger],
        "dead_letter": [json.dumps(d.to_dict(), sort_keys=True) for d in run.dead_letters],
        "request": [r.id for r in run.requests],
    }


def replayed(out: list[tuple[str, Any]]) -> dict[str, list[str]]:
    kinds = ("release", "ledger", "dead_letter")
    return {k: canonical(out, k) for k in kinds} | {"request": request_ids(out)}


def test_a_replay_of_the_report_topic_releases_the_same(faulty: Captured) -> None:
    _, out = replay(faulty.plan, faulty.batches)
    assert replayed(out) == recorded(faulty)


def cut_points(c: Captured) -> dict[str, int]:
    """Where to snapshot: right after round 2 of a slot opened (between rounds), and after
    half of that round's messages (inside it, reports collected but not yet answered)."""
    logic, flat = ReportRoundsLogic("reports", c.plan, None), items(c)
    for i, item in enumerate(flat):
        logic.on_batch([item])
        book = logic.state.protocol  # type: ignore[union-attr]
        if book.round == 2 and book.open and not any(book.collected.values()):
            rest = flat[i + 1 :]
            closing = next(j for j, x in enumerate(rest) if isinstance(x[1], Close))
            return {"between rounds": i + 1, "inside a round": i + 1 + math.ceil(closing / 2)}
    raise AssertionError("no slot published")


@pytest.mark.parametrize("where", ["between rounds", "inside a round"])
def test_a_resumed_server_releases_the_same(faulty: Captured, where: str) -> None:
    """The server stops at ``where``; a fresh one resumes from its pickled snapshot and the
    rest of the topic: together they release, refuse and ask exactly what the run did."""
    flat = items(faulty)
    cut = cut_points(faulty)[where]
    first, before = replay(faulty.plan, [[i] for i in flat[:cut]])
    snapshot = pickle.loads(pickle.dumps(first.snapshot()))
    book = snapshot.protocol
    assert book.round == 2 and (any(book.collected.values()) == (where == "inside a round"))
    _, after = replay(faulty.plan, [[i] for i in flat[cut:]], resume=snapshot)
    assert replayed(before + after) == recorded(faulty)
