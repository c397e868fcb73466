"""The public gauges of the population's composed budget and of the run (``operators.metrics``),
and the split between the public default registry and the ``INTERNAL`` one."""

from __future__ import annotations

import math

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import privstream.connectors.kafka_health
import privstream.runtime.heartbeat  # noqa: F401  (defines the cluster members' progress age)
from privstream.operators.metrics import (
    BOARD,
    EVENTS,
    INTERNAL,
    INTERNAL_PREFIX,
    LATE_EVENTS,
    PUBLIC_METRICS,
    REJECTED,
    STEP_SECONDS,
    LedgerBoard,
)
from tests.metric_names import exposed_name

POPULATION = (
    "privstream_population_budget",
    "privstream_population_scope_slots",
    "privstream_population_budget_spent",
    "privstream_population_budget_remaining",
    "privstream_population_mechanisms",
)


def scrape(board: LedgerBoard) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Family name → sorted label pairs → value, as a scrape of ``board`` alone reads it."""
    registry = CollectorRegistry()
    registry.register(board)
    text = generate_latest(registry).decode()
    return {
        exposed_name(family): {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def unmeasured(
    got: dict[str, dict[tuple[tuple[str, str], ...], float]],
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``got`` without the ``measure`` label (checked on its own)."""
    return {
        name: {tuple(kv for kv in labels if kv[0] != "measure"): v for labels, v in series.items()}
        for name, series in got.items()
    }


MEASURED = ("privstream_population_budget", "privstream_population_budget_spent",
            "privstream_population_budget_remaining")  # fmt: skip


def test_population_gauges_show_the_composed_budget_per_stream() -> None:
    board = LedgerBoard()
    board.update_population("sin", budget=2.0, scope=20, spent=1.5, mechanisms=3)
    board.update_population("lns", budget=1.0, scope=10, spent=0.0, mechanisms=1)
    raw = scrape(board)
    for name in MEASURED:  # budget-valued gauges name their measure (the default: pure ε)
        assert all(dict(labels)["measure"] == "pure" for labels in raw[name]), name
    got = unmeasured(raw)
    sin, lns = (("stream", "sin"),), (("stream", "lns"),)
    assert {name: got[name][sin] for name in POPULATION} == {
        "privstream_population_budget": 2.0,
        "privstream_population_scope_slots": 20.0,
        "privstream_population_budget_spent": 1.5,
        "privstream_population_budget_remaining": 0.5,
        "privstream_population_mechanisms": 3.0,
    }
    assert got["privstream_population_budget_remaining"][lns] == 1.0
    assert all(set(got[name]) == {sin, lns} for name in POPULATION)  # label {stream} only


def test_population_spend_is_clamped_within_the_ledger_slack_only() -> None:
    board = LedgerBoard()
    board.update_population("a", budget=1.0, scope=5, spent=1.0 + 1e-12, mechanisms=2)
    board.update_population("b", budget=1.0, scope=5, spent=1.25, mechanisms=2)
    got = unmeasured(scrape(board))
    spent = got["privstream_population_budget_spent"]
    remaining = got["privstream_population_budget_remaining"]
    assert spent[(("stream", "a"),)] == 1.0  # rounding of summed shares: exactly ε
    assert spent[(("stream", "b"),)] == 1.25  # a real overspend is shown as it is
    assert remaining == {(("stream", "a"),): 0.0, (("stream", "b"),): 0.0}


def test_a_later_update_replaces_the_stream_and_non_finite_values_are_left_out() -> None:
    board = LedgerBoard()
    board.update_population("sin", budget=1.0, scope=5, spent=0.2, mechanisms=2)
    board.update_population("sin", budget=math.inf, scope=5, spent=0.4, mechanisms=2)
    got = unmeasured(scrape(board))
    assert got["privstream_population_budget"] == {}
    assert got["privstream_population_budget_spent"] == {(("stream", "sin"),): 0.4}


def test_a_gaussian_population_is_labelled_with_its_measure() -> None:
    """CGM's population budget is μ² (its additive unit): the gauge says so by its label, so a
    reader shows μ = √value and never the value as an ε."""
    board = LedgerBoard()
    board.update_population("load", budget=0.0625, scope=30, spent=0.04, mechanisms=1,
                            measure="gaussian")  # fmt: skip
    got = scrape(board)
    key = (("measure", "gaussian"), ("stream", "load"))
    assert got["privstream_population_budget"] == {key: 0.0625}
    assert got["privstream_population_budget_spent"] == {key: 0.04}
    assert got["privstream_population_scope_slots"] == {(("stream", "load"),): 30.0}


def test_run_gauges_are_zero_by_default_and_set_by_set_run() -> None:
    board = LedgerBoard()
    assert scrape(board)["privstream_insecure_seed"] == {(): 0.0}
    assert scrape(board)["privstream_evaluation"] == {(): 0.0}
    board.set_run(insecure_seed=True, evaluation=False)
    assert scrape(board)["privstream_insecure_seed"] == {(): 1.0}
    assert scrape(board)["privstream_evaluation"] == {(): 0.0}
    board.set_run(insecure_seed=False, evaluation=True)
    assert scrape(board)["privstream_insecure_seed"] == {(): 0.0}
    assert scrape(board)["privstream_evaluation"] == {(): 1.0}


def test_clear_forgets_the_populations_and_resets_the_run_flags() -> None:
    board = LedgerBoard()
    board.update_population("sin", budget=1.0, scope=5, spent=0.2, mechanisms=2)
    board.set_run(insecure_seed=True, evaluation=True)
    board.clear()
    got = scrape(board)
    assert all(got[name] == {} for name in POPULATION)
    assert got["privstream_insecure_seed"] == got["privstream_evaluation"] == {(): 0.0}


def test_every_family_of_the_board_is_an_allow_listed_public_metric() -> None:
    board = LedgerBoard()
    board.update_population("sin", budget=1.0, scope=5, spent=0.2, mechanisms=2)
    # every public metric comes from the board, except the connectivity gauge of the clients
    assert set(scrape(board)) == PUBLIC_METRICS - {
        "privstream_kafka_connected", "privstream_cluster_member_progress_age_seconds"
    }  # fmt: skip
    assert REGISTRY.get_sample_value("privstream_evaluation") is not None  # BOARD is public
    assert INTERNAL.get_sample_value("privstream_evaluation") is None


def test_operational_metrics_live_in_the_internal_registry_only() -> None:
    EVENTS.labels("unit").inc(3)
    REJECTED.labels("unit", "late_event").inc()
    LATE_EVENTS.labels("unit").inc()
    STEP_SECONDS.labels("unit", "LBU").observe(0.01)
    internal = {exposed_name(f) for f in INTERNAL.collect() if f.name.startswith("privstream_")}
    assert internal == {
        INTERNAL_PREFIX + "events_total",
        INTERNAL_PREFIX + "events_rejected_total",
        INTERNAL_PREFIX + "late_events_total",
        INTERNAL_PREFIX + "markers_ignored_total",
        INTERNAL_PREFIX + "last_progress_timestamp_seconds",
        INTERNAL_PREFIX + "dead_letters_undeliverable_total",
        INTERNAL_PREFIX + "step_seconds",
        INTERNAL_PREFIX + "consumer_lag",
    }
    assert (
        INTERNAL.get_sample_value(INTERNAL_PREFIX + "events_total", {"stream": "unit"}) or 0
    ) >= 3
    public = {exposed_name(f) for f in REGISTRY.collect() if f.name.startswith("privstream_")}
    assert public == PUBLIC_METRICS and not public & internal


def test_the_process_board_is_served_by_the_public_registry() -> None:
    BOARD.set_run(insecure_seed=True, evaluation=True)
    BOARD.update_population("unit", budget=1.0, scope=4, spent=0.5, mechanisms=2)
    try:
        assert REGISTRY.get_sample_value("privstream_insecure_seed") == 1.0
        assert REGISTRY.get_sample_value("privstream_evaluation") == 1.0
        remaining = "privstream_population_budget_remaining"
        unit = {"stream": "unit", "measure": "pure"}
        assert REGISTRY.get_sample_value(remaining, unit) == 0.5
    finally:
        BOARD.clear()
    assert REGISTRY.get_sample_value("privstream_insecure_seed") == 0.0
    assert REGISTRY.get_sample_value("privstream_population_budget", unit) is None


def test_the_last_released_slot_is_what_was_handed_to_the_sink() -> None:
    """A far-future marker once let the gauge say 28,165 while the output topic stopped at
    1,014: the operator had computed slots the sink never got. The gauge (and the ``--slots``
    stop) now follow the releases handed to the sink; a resumed state's last slot counts as
    handed (it was written before its snapshot)."""
    from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
    from privstream.operators.stream_state import Tally

    cost = Guarantee(PureDP(1.0), WindowScope(10), "ldp")
    board = LedgerBoard()
    tally = Tally()
    board.update("s", "LBU", cost, 100, tally, False)  # a fresh stream: nothing handed
    tally.last_slot = 50
    board.update("s", "LBU", cost, 100, tally, False)  # computed up to slot 50
    last = (("mechanism", "LBU"), ("stream", "s"))
    assert scrape(board)["privstream_last_released_slot"][last] == -1
    board.mark_handed("s", "LBU", 7)
    assert scrape(board)["privstream_last_released_slot"][last] == 7
    assert board.released_through([("s", "LBU")], 7)
    assert not board.released_through([("s", "LBU")], 8)
    resumed = LedgerBoard()
    resumed.update("s", "LBU", cost, 100, Tally(last_slot=30), False)
    assert scrape(resumed)["privstream_last_released_slot"][last] == 30


def test_process_and_python_collectors_are_internal() -> None:
    """CPU seconds, memory and GC counts grow with the events processed: a timing side channel
    on true counts, so they are served only on the internal endpoint."""
    public = {f.name for f in REGISTRY.collect()}
    internal = {f.name for f in INTERNAL.collect()}
    assert not {n for n in public if n.startswith(("process_", "python_"))}
    assert {"process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= internal


def test_ledger_gauges_read_the_entry_envelope_and_its_details() -> None:
    """The spend gauges follow the entry's class closest to its limit; the user gauges read
    LDP-IDS's details, and a curator family's registered users (its classes) otherwise."""
    from privstream.mechanisms.contract import ClassSpend, LedgerEntry
    from privstream.mechanisms.guarantees import ClassScope, Guarantee, PureDP, WindowScope
    from privstream.mechanisms.ldp_ids import LdpIdsLedger
    from privstream.mechanisms.personalized import PersonalizedLedgerDetails
    from privstream.operators.stream_state import Tally

    lpu = Guarantee(PureDP(0.5), WindowScope(10), "ldp")
    pbd = Guarantee(PureDP(1.0), ClassScope(4), "cdp")
    population = LedgerEntry(
        "s", "LPU", 3, lpu, "population", (ClassSpend(10, 0.5, 100, 0.5, 0.5),),
        LdpIdsLedger(0.0, 0.5, 0, 10, window_users=30, available_users=70, remaining=0.0),
    )  # fmt: skip
    classes = (ClassSpend(4, 1.0, 7, 0.25, 0.5), ClassSpend(2, 2.0, 3, 0.5, 1.5))
    split = PersonalizedLedgerDetails((0.125, 0.25), (0.125, 0.25))
    personal = LedgerEntry("s", "PBD", 3, pbd, "budget", classes, split)
    board = LedgerBoard()
    board.update("s", "LPU", lpu, 100, Tally(last_slot=3, last_ledger=population), False)
    board.update("s", "PBD", pbd, 10, Tally(last_slot=3, last_ledger=personal), False)
    raw = scrape(board)
    assert {dict(k)["measure"] for k in raw["privstream_budget"]} == {"pure"}
    assert {dict(k)["measure"] for k in raw["privstream_class_budget"]} == {"pure"}
    got = unmeasured(raw)
    lpu_labels = (("mechanism", "LPU"), ("stream", "s"))
    pbd_labels = (("mechanism", "PBD"), ("stream", "s"))
    assert got["privstream_budget"] == {lpu_labels: 0.5, pbd_labels: 1.0}
    assert got["privstream_scope_slots"] == {lpu_labels: 10.0, pbd_labels: 4.0}
    assert got["privstream_scope_budget_spent"] == {lpu_labels: 0.5, pbd_labels: 1.5}
    assert got["privstream_scope_budget_remaining"] == {lpu_labels: 0.0, pbd_labels: 0.5}
    assert got["privstream_window_users_used"] == {lpu_labels: 30.0, pbd_labels: 10.0}
    assert got["privstream_users_available"] == {lpu_labels: 70.0, pbd_labels: 10.0}
    assert got["privstream_class_users"] == {
        (("class", "w10_e0.5"), *lpu_labels): 100.0,
        (("class", "w4_e1"), *pbd_labels): 7.0,
        (("class", "w2_e2"), *pbd_labels): 3.0,
    }
    # per class, the spend is compared with the class's own ε_c: the personalized mechanism's
    # worst class spent 1.5 of its 2.0, above the stream default ε = 1.0 and yet within budget
    assert got["privstream_class_budget"] == {
        (("class", "w10_e0.5"), *lpu_labels): 0.5,
        (("class", "w4_e1"), *pbd_labels): 1.0,
        (("class", "w2_e2"), *pbd_labels): 2.0,
    }
    assert got["privstream_scope_budget_spent"][pbd_labels] > got["privstream_budget"][pbd_labels]


def test_a_gaussian_class_is_named_and_shown_in_mu() -> None:
    """CGM's class carries μ² (its additive unit); the class label and the measure label say
    μ, so no reader sees μ² as an ε (the page once showed CGM as "ε 0.007918", class
    ``w10_e0.00791805``)."""
    from privstream.mechanisms.contract import ClassSpend, LedgerEntry
    from privstream.mechanisms.guarantees import GaussianDP, Guarantee, PeriodScope, StreamScope
    from privstream.operators.metrics import class_label
    from privstream.operators.stream_state import Tally

    mu = 0.0889833  # √0.00791805
    cgm = Guarantee(GaussianDP(mu), StreamScope(), "ldp")
    assert class_label(10, mu**2, cgm) == "s10_mu0.0889833"
    assert class_label(1, mu**2, Guarantee(GaussianDP(mu), PeriodScope(1), "ldp")).startswith(
        "s1_mu"
    )
    assert class_label(5, 1.0) == "w5_e1"
    entry = LedgerEntry("s", "CGM", 1, cgm, "user", (ClassSpend(10, mu**2, 50, 0.0, 0.0),), _cgm())
    board = LedgerBoard()
    board.update("s", "CGM", cgm, 50, Tally(last_slot=1, last_ledger=entry), False)
    got = scrape(board)
    key = (("class", "s10_mu0.0889833"), ("measure", "gaussian"), ("mechanism", "CGM"),
           ("stream", "s"))  # fmt: skip
    assert got["privstream_class_budget"] == {key: mu**2}
    assert got["privstream_budget"] == {key[1:]: mu**2}


def _cgm() -> object:
    from privstream.mechanisms.cgm import CgmLedger

    return CgmLedger(0.0, 0.0, 1e-5, 0, 0, 0.0)


def test_each_mechanism_names_its_division_on_an_info_gauge() -> None:
    """``privstream_mechanism_info{stream, mechanism, division, scope}`` = 1: a population-division
    mechanism (LPU) spends its whole window budget whenever anybody reported, so a reader shows
    its 100 % as normal; the operator passes each mechanism's own ``division``."""
    from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
    from privstream.operators.stream_state import Tally

    cost = Guarantee(PureDP(1.0), WindowScope(10), "ldp")
    board = LedgerBoard()
    assert scrape(board)["privstream_mechanism_info"] == {}
    board.update("s", "LBU", cost, 100, Tally(), False)  # the base class's division: budget
    board.update("s", "LPU", cost, 100, Tally(), False, division="population")
    board.update("t", "CGM", cost, 100, Tally(), False, division="user")
    assert scrape(board)["privstream_mechanism_info"] == {
        (("division", "budget"), ("mechanism", "LBU"), ("scope", "window"), ("stream", "s")): 1.0,
        (
            ("division", "population"),
            ("mechanism", "LPU"),
            ("scope", "window"),
            ("stream", "s"),
        ): 1.0,
        (("division", "user"), ("mechanism", "CGM"), ("scope", "window"), ("stream", "t")): 1.0,
    }
    board.clear()
    assert scrape(board)["privstream_mechanism_info"] == {}
