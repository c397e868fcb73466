"""DPI's public metrics (spec §10, ``privstream.families.dpi.METRICS``) and the generic gauges of
a lifetime scope: what a DPI stream exports, that its spends are shown against ε like the
generic spend gauges (within the ledger's slack exactly ε, beyond it as they are), that the
generic gauges read a lifetime scope sensibly (no window length, a ``lifetime`` class and scope)
and that no internal number (active users, leakage) reaches the public endpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from privstream.cli.commands import main
from privstream.families.dpi import METRICS
from privstream.families.spec import MetricSpec
from privstream.mechanisms.cgm import CgmLedger
from privstream.mechanisms.contract import ClassSpend, LedgerEntry
from privstream.mechanisms.dpi import DIVISION, LIFETIME, DpiLedger
from privstream.mechanisms.guarantees import (
    GaussianDP,
    Guarantee,
    LifetimeScope,
    PureDP,
    StreamScope,
)
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE
from privstream.operators import metrics
from privstream.operators.metrics import BOARD, LedgerBoard, class_label
from privstream.operators.stream_state import Tally
from tests.metric_names import exposed_name

DPI_METRICS = {
    "privstream_dpi_epsilon_slot",
    "privstream_dpi_series_index",
    "privstream_dpi_epsilon_spent_nominal",
    "privstream_dpi_epsilon_spent_conservative",
    "privstream_dpi_epsilon_remaining",
    "privstream_dpi_budget_exhausted",
}
EPSILON = 2.0
LIFE = Guarantee(PureDP(EPSILON), LifetimeScope(), "cdp")
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _scrape(registry: CollectorRegistry | None = None, board: LedgerBoard | None = None) -> Samples:
    if registry is None:
        registry = CollectorRegistry()
        registry.register(board)
    text = generate_latest(registry).decode()
    return {
        exposed_name(family): {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def _details(nominal: float, conservative: float, *, exhausted: bool = False) -> DpiLedger:
    return DpiLedger(
        series_index=7, series_epsilon=1e-3, nominal_charge=1e-3, nominal_spent=nominal,
        conservative_charge=2e-3, conservative_spent=conservative, alpha_q=0.0, alpha_a=0.0,
        eta_q=0.0, eta_a=0.0, exhausted=exhausted, series={},
    )  # fmt: skip


def _entry(nominal: float, conservative: float, **kw: Any) -> LedgerEntry:
    classes = (ClassSpend(LIFETIME, EPSILON, 50, 1e-3, nominal),)
    details = _details(nominal, conservative, **kw)
    return LedgerEntry("s", "DPI", 9, LIFE, DIVISION, classes, details)


def _dpi_samples(entry: LedgerEntry) -> dict[str, float]:
    board = LedgerBoard()
    board.update("s", "DPI", LIFE, 50, Tally(last_slot=9, last_ledger=entry), False,
                 division=DIVISION)  # fmt: skip
    got = _scrape(board=board)
    key = (("mechanism", "DPI"), ("stream", "s"))
    return {name: got[name][key] for name in DPI_METRICS}


def test_every_declared_dpi_metric_is_public_and_allow_listed() -> None:
    assert {"privstream_" + spec.name for spec in METRICS} == DPI_METRICS
    assert all(spec.public for spec in METRICS)
    assert metrics.public_metrics() >= DPI_METRICS


def test_the_gauges_read_the_last_entry_s_details() -> None:
    got = _dpi_samples(_entry(0.75, 1.25, exhausted=True))
    assert got == {
        "privstream_dpi_epsilon_slot": 1e-3,
        "privstream_dpi_series_index": 7.0,
        "privstream_dpi_epsilon_spent_nominal": 0.75,
        "privstream_dpi_epsilon_spent_conservative": 1.25,
        "privstream_dpi_epsilon_remaining": 1.25,
        "privstream_dpi_budget_exhausted": 1.0,
    }


def test_a_spend_within_the_ledger_slack_is_shown_as_exactly_epsilon() -> None:
    """``budget_exact`` sums to ε exactly; a sum of floats may round a hair above it. Shown as ε
    (like ``privstream_scope_budget_spent``), so "DPI over ε" never fires on an honest stream;
    a spend past the slack is shown as it is — that is the alert's case."""
    hair = EPSILON * (1 + RELATIVE_TOLERANCE / 4)
    got = _dpi_samples(_entry(hair, hair))
    assert got["privstream_dpi_epsilon_spent_nominal"] == EPSILON
    assert got["privstream_dpi_epsilon_spent_conservative"] == EPSILON
    assert got["privstream_dpi_epsilon_remaining"] == 0.0
    over = EPSILON * (1 + 4 * RELATIVE_TOLERANCE)
    got = _dpi_samples(_entry(over, 3.5))  # the paper's update: conservative past ε (§3.10)
    assert got["privstream_dpi_epsilon_spent_nominal"] == over
    assert got["privstream_dpi_epsilon_spent_conservative"] == 3.5
    assert got["privstream_dpi_epsilon_remaining"] == 0.0


def test_other_families_streams_get_no_dpi_sample_and_a_failing_reader_fails_no_scrape() -> None:
    """Declared gauges are read for every (stream, mechanism) of the process: a CGM stream next
    to a DPI one has no DPI sample; a reader that raises on a foreign entry loses its own sample
    only — the scrape (every other metric) still answers."""
    mu = 0.5
    cgm = Guarantee(GaussianDP(mu), StreamScope(), "ldp")
    foreign = LedgerEntry("t", "CGM", 1, cgm, "user", (ClassSpend(10, mu**2, 50, 0.0, 0.0),),
                          CgmLedger(0.0, 0.0, 1e-5, 0, 0, 0.0))  # fmt: skip
    board = LedgerBoard()
    board.update("t", "CGM", cgm, 50, Tally(last_slot=1, last_ledger=foreign), False)
    board.update("s", "DPI", LIFE, 50, Tally(last_slot=9, last_ledger=_entry(0.5, 0.5)), False)
    got = _scrape(board=board)
    for name in DPI_METRICS:
        assert {dict(k)["stream"] for k in got[name]} == {"s"}, name
    broken = MetricSpec("dpi_broken", "raises", lambda tally, entry: entry.details.nope)
    original = metrics._declared_metrics
    try:
        metrics._declared_metrics = lambda: {**original(), "dpi_broken": broken}  # type: ignore[assignment]
        got = _scrape(board=board)
    finally:
        metrics._declared_metrics = original  # type: ignore[assignment]
    assert got["privstream_dpi_broken"] == {}
    assert len(got["privstream_budget"]) == 2


def test_a_lifetime_scope_has_a_lifetime_class_and_no_window_length() -> None:
    """The class is ``lifetime_e2``, not ``s0_e2`` (a scope of 0 slots read as a length);
    ``privstream_scope_slots`` is absent (no window); ``mechanism_info`` says ``scope=lifetime``.
    """
    assert class_label(LIFETIME, EPSILON, LIFE) == "lifetime_e2"
    board = LedgerBoard()
    board.update("s", "DPI", LIFE, 50, Tally(last_slot=9, last_ledger=_entry(0.5, 0.5)), False,
                 division=DIVISION)  # fmt: skip
    board.update_population("s", EPSILON, LIFETIME, 0.5, 1)
    got = _scrape(board=board)
    assert got["privstream_scope_slots"] == {}
    assert got["privstream_mechanism_info"] == {
        (("division", DIVISION), ("mechanism", "DPI"), ("scope", "lifetime"), ("stream", "s")): 1.0
    }
    key = (("class", "lifetime_e2"), ("measure", "pure"), ("mechanism", "DPI"), ("stream", "s"))
    assert got["privstream_class_budget"] == {key: EPSILON}
    assert got["privstream_class_budget_spent"] == {key: 0.5}
    assert got["privstream_population_scope_slots"] == {(("stream", "s"),): 0.0}
    assert got["privstream_population_budget_remaining"] == {
        (("measure", "pure"), ("stream", "s")): 1.5
    }


@pytest.fixture(scope="module")
def dpi_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Samples, dict[str, Any], str]:
    """An in-process ``privstream run dpi`` (synthetic, 8 slots): the public registry's samples
    after it, its last ledger entry, and the exposition's text."""
    out = tmp_path_factory.mktemp("dpi")
    BOARD.clear()
    code = main(["run", "dpi", "--dataset", "synthetic", "--users", "2000", "--slots", "8",
                 "--rba", "alg4", "--insecure-seed", "1", "--no-progress",
                 "--out", str(out / "r.jsonl"), "--ledger-out", str(out / "l.jsonl"),
                 "--dpi-audit-out", str(out / "a.jsonl")])  # fmt: skip
    assert code in (0, None)
    entries = [json.loads(line) for line in (out / "l.jsonl").read_text().splitlines()]
    audit = [json.loads(line) for line in (out / "a.jsonl").read_text().splitlines()]
    assert audit, "the internal audit output was written"
    text = generate_latest(REGISTRY).decode()
    try:
        return _scrape(REGISTRY), {**entries[-1], "audit": audit}, text
    finally:
        BOARD.clear()


def test_a_dpi_run_exports_its_series_ledger(dpi_run: tuple[Samples, dict[str, Any], str]) -> None:
    got, last, _text = dpi_run
    key = (("mechanism", "DPI"), ("stream", "synthetic"))
    d = last["details"]
    assert last["slot"] == 8 and d["nominal_spent"] > 0
    assert got["privstream_dpi_epsilon_slot"][key] == d["series_epsilon"]
    assert got["privstream_dpi_series_index"][key] == d["series_index"]
    assert got["privstream_dpi_epsilon_spent_nominal"][key] == d["nominal_spent"]
    assert got["privstream_dpi_epsilon_spent_conservative"][key] == d["conservative_spent"]
    assert got["privstream_dpi_epsilon_remaining"][key] == EPSILON - d["nominal_spent"]
    assert got["privstream_dpi_budget_exhausted"][key] == 0.0
    measured = (("measure", "pure"), *key)
    assert got["privstream_budget"][measured] == EPSILON
    assert got["privstream_scope_budget_spent"][measured] == d["nominal_spent"]
    assert key not in got["privstream_scope_slots"]
    assert got["privstream_population_scope_slots"] == {(("stream", "synthetic"),): 0.0}
    assert {dict(k)["scope"] for k in got["privstream_mechanism_info"]} == {"lifetime"}


def test_a_dpi_run_shows_only_allow_listed_metrics_and_no_internal_number(
    dpi_run: tuple[Samples, dict[str, Any], str],
) -> None:
    """Active users, users charged and the leakage quantiles go to the internal ``dpi-audit``
    output only: no public name mentions them, and the public names are the allow-list's."""
    got, last, text = dpi_run
    exported = {name for name in got if name.startswith("privstream_")}
    assert exported <= metrics.public_metrics()
    assert exported >= DPI_METRICS
    assert "privstream_internal_" not in text
    internal = {k for record in last["audit"] for k in record["payload"]}
    assert internal >= {"users_charged", "leak_max"}, last["audit"][0]
    for word in (*internal, "leak", "users_seen", "active"):
        assert not [n for n in exported if word in n.removeprefix("privstream_")], word
    charged = {float(record["payload"]["users_charged"]) for record in last["audit"]}
    values = {v for name in exported for v in got[name].values()}
    assert not (charged - {2000.0}) & values  # n = 2000 is public configuration
