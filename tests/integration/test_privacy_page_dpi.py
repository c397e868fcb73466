"""The privacy page (``deploy/prometheus/page/privacy.html``) for a DPI stream, rendered by
headless Chromium against a real Prometheus: a lifetime budget's row shows its lifetime spend
against ε (scope "lifetime", never a window length or "0"), the measure's unit (ε), the class
``lifetime_e2``, and the conservative account beside the nominal one; the alert rules loaded
beside it fire no budget alert on the honest stream.

The DPI stream runs in this process (``privstream run dpi``, synthetic, RBA Algorithm 4 so the
spend is visible after 8 slots) and its public registry is served to Prometheus like a flow's
``--metrics-port``; the page's parser is ``test_operations``' one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from privstream.cli.commands import main
from privstream.connectors.broker import free_port
from privstream.operators.metrics import BOARD, serve_metrics

from .prometheus import PrometheusServer
from .test_operations import PAGE, RULES, _Cells, _chromium

EPSILON = 2.0
ROW = (("mechanism", "DPI"), ("stream", "synthetic"))


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[_Cells, dict[str, Any], Any]]:
    """The rendered page, the run's last ledger entry and the Prometheus serving it."""
    out = tmp_path_factory.mktemp("dpi-page")
    BOARD.clear()
    code = main(["run", "dpi", "--dataset", "synthetic", "--users", "2000", "--slots", "8",
                 "--rba", "alg4", "--insecure-seed", "1", "--no-progress",
                 "--out", str(out / "r.jsonl"), "--ledger-out", str(out / "l.jsonl")])  # fmt: skip
    assert code in (0, None)
    last = json.loads((out / "l.jsonl").read_text().splitlines()[-1])
    port = free_port()
    server = serve_metrics(port)
    try:
        with PrometheusServer(
            [f"127.0.0.1:{port}"], out, rule_files=[RULES], user_assets=PAGE
        ) as prom:
            prom.wait_until(
                lambda: (
                    bool(prom.query("privstream_dpi_epsilon_spent_conservative"))
                    and bool(prom.query("privstream_mechanism_info"))
                    and bool(prom.query('ALERTS{alertname="PrivstreamInsecureSeed"}'))
                ),
                "the DPI stream's metrics and the rules' first evaluation",
            )
            cells = _Cells()
            cells.feed(_chromium(f"{prom.url}/user/privacy.html", "--dump-dom"))
            yield cells, last, prom
    finally:
        server.close()
        BOARD.clear()


def test_the_dpi_row_shows_its_lifetime_spend_against_epsilon(
    page: tuple[_Cells, dict[str, Any], Any],
) -> None:
    cells, last, _prom = page
    assert cells.state == "ready"
    d = last["details"]
    nominal, conservative = d["nominal_spent"], d["conservative_spent"]
    assert 0.1 < nominal < EPSILON  # visible, honest

    def shown(table: str, row: tuple[tuple[str, str], ...], metric: str) -> tuple[str, str]:
        return cells.cells[(table, row, metric)]

    assert cells.divisions[("mechanisms", ROW)] == "dpi-series"
    assert cells.scopes[("mechanisms", ROW)] == "lifetime"
    # the scope: "lifetime", never a window length (privstream_scope_slots is absent)
    assert shown("mechanisms", ROW, "scope_slots") == ("", "lifetime")
    assert cells.scoped[("mechanisms", ROW, "scope_slots")] == "lifetime"
    # the budget and the spend in ε; the nominal and conservative lifetime accounts beside it
    for metric, truth in (("budget", EPSILON), ("scope_budget_spent", nominal),
                          ("scope_budget_remaining", EPSILON - nominal),
                          ("dpi_epsilon_spent_nominal", nominal),
                          ("dpi_epsilon_spent_conservative", conservative)):  # fmt: skip
        value, text = shown("mechanisms", ROW, metric)
        assert float(value) == pytest.approx(truth, rel=1e-12), metric
        assert text.startswith("ε "), (metric, text)
        assert float(text.removeprefix("ε ")) == pytest.approx(truth, rel=1e-3), (metric, text)
        assert cells.measures[("mechanisms", ROW, metric)] == "pure"
    value, text = shown("mechanisms", ROW, "share")
    assert float(value) == pytest.approx(nominal / EPSILON, rel=1e-12)
    assert text == f"{round(100 * nominal / EPSILON)} %"
    assert cells.notes.get(("mechanisms", ROW, "share"), "") == ""  # no population-division note
    # the class is named for its lifetime scope, against its own ε
    klass = (("class", "lifetime_e2"), *ROW)
    assert shown("classes", klass, "class_budget") == ("2", "ε 2")
    # the population: scope 0 slots reads "lifetime"
    population = (("stream", "synthetic"),)
    assert shown("population", population, "population_scope_slots") == ("0", "lifetime")
    value, text = shown("population", population, "population_budget_spent")
    assert float(value) == pytest.approx(nominal, rel=1e-12) and text.startswith("ε ")


def test_an_honest_dpi_stream_fires_no_budget_alert(
    page: tuple[_Cells, dict[str, Any], Any],
) -> None:
    """No budget alert fires: no window rule misreads the lifetime scope, and DPI's own rules
    stay silent below 90 % of ε (the test's insecure seed and the absent audit job fire, as
    they should, and the page lists what fires)."""
    cells, _last, prom = page
    firing = {s.labels["alertname"] for s in prom.query('ALERTS{alertstate="firing"}')}
    assert "PrivstreamInsecureSeed" in firing
    budget = {a for a in firing if any(w in a for w in ("Budget", "Exhausted", "Epsilon", "Dpi"))}
    assert budget == set()
    assert firing <= {"PrivstreamInsecureSeed", "PrivstreamAuditMissing"}, firing
    shown = {dict(r)["alertname"] for (t, r) in cells.flows if t == "alerts"}
    assert "PrivstreamInsecureSeed" in shown and shown <= firing
    text = generate_latest(REGISTRY).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "privstream_dpi_epsilon_spent_nominal" in names
