"""Static checks of the Grafana dashboard (deploy/grafana): the committed JSON is the
generator's output, every query parses as PromQL (``promtool``), the public row reads only
public metrics, the operations row only internal ones, and every query honours the
dashboard's stream and mechanism filters."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from privstream.operators.metrics import PUBLIC_METRICS

from ..integration.prometheus import ensure_prometheus
from .dashboard import DASHBOARD, GRAFANA, instantiate, load_dashboard, panel_queries, rows

PUBLIC_ROW = "Privacy spend (public metrics)"
AUDIT_ROW = "Audit"
OPERATIONS_ROW = "Operations (operator-only: internal metrics)"

# The labels of every metric the dashboard reads (docs/operations.md, "Metrics" and "Internal metrics");
# a metric missing here fails the test, so a new one has to be classified first.
PAIR = frozenset({"stream", "mechanism"})
LABELS: dict[str, frozenset[str]] = {
    **{name: PAIR for name in PUBLIC_METRICS},
    **{name: frozenset({"stream"}) for name in PUBLIC_METRICS if "_population_" in name},
    **{name: PAIR | {"class"} for name in PUBLIC_METRICS if "_class_" in name},
    "privstream_insecure_seed": frozenset(),
    "privstream_evaluation": frozenset(),
    "privstream_kafka_connected": frozenset({"client"}),
    "privstream_cluster_member_progress_age_seconds": frozenset({"member"}),
    "up": frozenset(),
    "privstream_internal_events_total": frozenset({"stream"}),
    "privstream_internal_events_rejected_total": frozenset({"stream", "reason"}),
    "privstream_internal_late_events_total": frozenset({"stream"}),
    "privstream_internal_step_seconds_bucket": PAIR | {"le"},
    "privstream_internal_consumer_lag": frozenset({"topic", "partition"}),
    "privstream_internal_last_progress_timestamp_seconds": frozenset({"client"}),
    "privstream_internal_dead_letters_undeliverable_total": frozenset(),
    "privstream_audit_passed": frozenset(),
    "privstream_audit_check_passed": frozenset({"check"}),
    "privstream_audit_last_run_timestamp_seconds": frozenset(),
    "privstream_audit_releases": frozenset(),
    "privstream_audit_ledger_entries": frozenset(),
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
_SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are neither functions,
    aggregations, keywords, nor inside label matchers, groupings, ranges or strings."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    return {
        m.group(1)
        for m in _IDENTIFIER.finditer(text)
        if m.group(2) is None and m.group(1) not in _KEYWORDS
    }


def selectors(expr: str) -> list[tuple[str, str]]:
    """``(metric, matchers)`` of every vector selector of ``expr`` (``""`` when bare)."""
    names = metric_names(expr)
    return [(m.group(1), m.group(2) or "") for m in _SELECTOR.finditer(expr) if m.group(1) in names]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def by_row(dashboard: dict[str, Any], row: str) -> list[tuple[str, str]]:
    return [
        (str(panel["title"]), str(target["expr"]))
        for name, panel in rows(dashboard)
        if name == row
        for target in panel.get("targets", ())
    ]


def test_committed_json_is_the_generators_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .dashboard import load_generator

    generate = load_generator()
    assert DASHBOARD.read_text(encoding="utf-8") == generate.render(), (
        "deploy/grafana/privstream-dashboard.json is stale: run "
        ".venv/bin/python deploy/grafana/generate.py"
    )
    assert generate.main(["--check"]) == 0
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(generate, "OUTPUT", stale)
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0


def test_dashboard_identity_and_variables(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "privstream-privacy-spend"
    assert dashboard["title"] == "privstream — privacy spend"
    assert dashboard["refresh"] == "30s"
    assert dashboard["time"] == {"from": "now-6h", "to": "now"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    expected = {
        "stream": "label_values(privstream_budget, stream)",
        "mechanism": 'label_values(privstream_budget{stream=~"$stream"}, mechanism)',
    }
    for name, query in expected.items():
        variable = variables[name]
        assert (variable["type"], variable["query"]) == ("query", query)
        assert variable["multi"] and variable["includeAll"]
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_rows_and_panels(dashboard: dict[str, Any]) -> None:
    row_panels = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert [r["title"] for r in row_panels] == [PUBLIC_ROW, AUDIT_ROW, OPERATIONS_ROW]
    assert row_panels[-1]["collapsed"] is True  # restricted: closed until an operator opens it
    panels = [panel for _, panel in rows(dashboard)]
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for r in row_panels for p in r.get("panels", ())
    ]
    assert len(ids) == len(set(ids))
    for panel in panels:
        title = panel["title"]
        assert panel["targets"], f"{title}: no query"
        assert len(panel["description"]) > 40, f"{title}: describe what it shows and what is bad"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        unit = panel["fieldConfig"]["defaults"].get("unit")
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if "histogram_quantile" in exprs or "time()" in exprs:
            assert unit == "s", title
        elif "rate(" in exprs:
            assert unit == "ops", title
        else:
            assert unit == "none", title


def test_every_query_parses_with_promtool(dashboard: dict[str, Any], tmp_path: Path) -> None:
    queries = panel_queries(dashboard)
    assert len(queries) >= 25
    assert promtool_check(tmp_path / "ok", [instantiate(e) for _, e in queries]) == ""
    # the check is not vacuous: promtool refuses a broken query
    assert "parse error" in promtool_check(tmp_path / "bad", ['sum(rate(x{stream=~".+"}[1m])'])


def promtool_check(directory: Path, exprs: list[str]) -> str:
    """``promtool check rules`` on a rule file recording each of ``exprs``; its complaint,
    ``""`` when every expression parses."""
    directory.mkdir()
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = directory / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = ensure_prometheus()["promtool"]
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_rows_read_only_their_own_metrics(dashboard: dict[str, Any]) -> None:
    allowed = {
        PUBLIC_ROW: lambda name: name in PUBLIC_METRICS or name == "up",
        AUDIT_ROW: lambda name: name.startswith("privstream_audit_"),
        OPERATIONS_ROW: lambda name: name.startswith("privstream_internal_"),
    }
    for row, ok in allowed.items():
        queries = by_row(dashboard, row)
        assert queries, row
        for title, expr in queries:
            names = metric_names(expr)
            assert names, f"{title}: no metric in {expr}"
            assert all(ok(n) for n in names), f"{row} / {title} reads {names}"


def test_queries_filter_on_stream_and_mechanism(dashboard: dict[str, Any]) -> None:
    for title, expr in panel_queries(dashboard):
        for metric, matchers in selectors(expr):
            assert metric in LABELS, f"{title}: classify the labels of {metric}"
            if "stream" in LABELS[metric]:
                assert 'stream=~"$stream"' in matchers, f"{title}: {metric} ignores $stream"
            if "mechanism" in LABELS[metric]:
                assert 'mechanism=~"$mechanism"' in matchers, f"{title}: {metric}"
        for function in re.finditer(r"\b(?:rate|irate|increase)\(([^()]*)\)", expr):
            assert function.group(1).endswith("[$__rate_interval]"), f"{title}: {expr}"
    # the per-process flags follow the selection through the flows that serve it
    flags = [e for t, e in panel_queries(dashboard) if "privstream_insecure_seed" in e]
    assert flags and all(
        'and on (instance) privstream_budget{stream=~"$stream"' in e for e in flags
    )


def test_metric_names_and_selectors() -> None:
    expr = (
        'histogram_quantile(0.5, sum by (le, stream) (rate(a_bucket{stream=~"$stream"}'
        "[$__rate_interval]))) - time() and on (instance) b or up"
    )
    assert metric_names(expr) == {"a_bucket", "b", "up"}
    assert selectors(expr) == [("a_bucket", '{stream=~"$stream"}'), ("b", ""), ("up", "")]


def test_instantiate() -> None:
    expr = 'rate(x{stream=~"$stream", mechanism=~"${mechanism:regex}"}[$__rate_interval])'
    assert instantiate(expr) == 'rate(x{stream=~".+", mechanism=~".+"}[1m])'
    assert instantiate(expr, "a|b", r"L\.A", "2m") == (
        r'rate(x{stream=~"a|b", mechanism=~"L\\.A"}[2m])'
    )
    assert instantiate("avg_over_time(x[$__interval]) + y[$__range]", interval="30s") == (
        "avg_over_time(x[30s]) + y[6h]"
    )
    with pytest.raises(ValueError, match="unknown dashboard variable"):
        instantiate('x{pod="$pod"}')


def test_panel_queries_walks_collapsed_rows() -> None:
    board = {
        "panels": [
            {"type": "stat", "title": "top", "targets": [{"expr": "a"}]},
            {"type": "row", "title": "r", "collapsed": True, "panels": [
                {"type": "timeseries", "title": "nested", "targets": [{"expr": "b"}, {"refId": "x"}]}
            ]},
        ]
    }  # fmt: skip
    assert panel_queries(board) == [("top", "a"), ("nested", "b")]


def test_provisioning_files() -> None:
    provisioning = GRAFANA / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert (source["uid"], source["type"]) == ("prometheus", "prometheus")
    assert source["url"] == "http://prometheus:9090"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "privstream.yaml").read_text())
    (provider,) = dashboards["providers"]
    assert (provider["type"], provider["folder"]) == ("file", "privstream")
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/privstream"
    assert datasources["apiVersion"] == dashboards["apiVersion"] == 1


MEASURED = frozenset(
    {"privstream_scope_budget_spent", "privstream_budget", "privstream_class_budget_spent",
     "privstream_class_budget", "privstream_population_budget_spent",
     "privstream_population_budget"}
)  # fmt: skip


def test_budgets_are_shown_in_their_measures_units(dashboard: dict[str, Any]) -> None:
    """Every panel query of a budget-valued gauge (additive unit: ε, μ², ρ) reads each measure
    apart and labels its unit: Gaussian DP's μ² only under ``sqrt`` (shown as μ), never as an
    ε; a reader's legend names the unit."""
    shown = 0
    for title, expr in panel_queries(dashboard):
        if "and on (instance)" in expr:  # the per-process flags only join on privstream_budget
            continue
        for metric, matchers in selectors(expr):
            if metric not in MEASURED:
                continue
            assert "measure=~" in matchers, f"{title}: {metric} mixes the measures"
            if 'measure=~"gaussian"' in matchers:
                assert re.search(r"sqrt\(max by \([^)]*\) \(" + metric + r"\{", expr), title
        if any(m in MEASURED for m, _ in selectors(expr)):
            for unit in ("ε", "μ", "ρ"):
                assert f'"unit", "{unit}"' in expr, f"{title}: no {unit} unit in {expr}"
            shown += 1
    assert shown >= 5


def test_the_dpi_panels_show_the_lifetime_spend_against_epsilon(dashboard: dict[str, Any]) -> None:
    """DPI's panels (issue 22): the nominal and the conservative lifetime spend with ε dashed
    (the DPI streams' ``privstream_budget``, in its unit), ε_t, and the exhausted flag."""
    panels = {panel["title"]: panel for _, panel in rows(dashboard)}
    spend = panels["DPI lifetime spend: nominal and conservative vs ε"]
    exprs = {t["refId"]: t["expr"] for t in spend["targets"]}
    assert "privstream_dpi_epsilon_spent_nominal{" in exprs["A"]
    assert "privstream_dpi_epsilon_spent_conservative{" in exprs["B"]
    assert "privstream_budget{" in exprs["C"]
    assert exprs["C"].endswith(
        'and on (stream, mechanism) privstream_dpi_epsilon_spent_nominal{stream=~"$stream", '
        'mechanism=~"$mechanism"}'
    )
    dashed = [o["matcher"]["options"] for o in spend["fieldConfig"]["overrides"]]
    assert dashed == ["C"]
    slot = panels["DPI series element ε_t"]
    assert [t["expr"] for t in slot["targets"]] == [
        'max by (stream, mechanism) (privstream_dpi_epsilon_slot{stream=~"$stream", '
        'mechanism=~"$mechanism"})'
    ]
    flag = panels["DPI series exhausted"]
    assert flag["type"] == "stat"
    assert "privstream_dpi_budget_exhausted{" in flag["targets"][0]["expr"]
