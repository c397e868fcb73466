"""The operations assets against the real tools: every panel query of the Grafana dashboard
(``deploy/grafana``) evaluated by a real Prometheus scraping running flows, and the page
without Grafana (``deploy/prometheus/page``) rendered by headless Chromium against their
metrics.

Three flows run as their own processes over the embedded broker — LDP-IDS (three mechanisms
sharing ε), personalized (two), CGM (a Gaussian-DP family) — each with its public and internal
endpoints, plus ``privstream audit --metrics-port`` over the LDP-IDS topics; one Prometheus
scrapes them under the deploy scrape config's job names (``privstream``,
``privstream-internal``, ``privstream-audit``) and serves the page at ``/user/``. The LDP-IDS
input also carries hostile and late messages, so the dead-letter and late-event panels have data.
"""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from privstream.connectors.broker import EmbeddedBroker, free_port
from privstream.connectors.kafka import KafkaSettings

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli, write_secret
from .prometheus import (
    FlowProcess,
    PrometheusServer,
    ensure_chromium,
    read_keyed,
    scrape_until,
)
from .test_kafka_flow import event, produce_lines

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "privstream-dashboard.json"
PAGE = ROOT / "deploy" / "prometheus" / "page"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "privstream.rules.yml"
SCREENSHOT = ROOT / "docs" / "images" / "privacy-page.png"
USERS, SLOTS, WINDOW = 2000, 30, 10


@dataclass(frozen=True)
class FlowSpec:
    """One flow of the fixture: its family, stream, and extra ``privstream run`` flags."""

    family: str
    stream: str
    mechanisms: tuple[str, ...]
    flags: tuple[str, ...] = ()


FLOWS = (
    FlowSpec("ldp-ids", "sin", ("LBU", "LPA", "LBA"), ("--budget-split", "equal")),
    FlowSpec("personalized", "visits", ("PBD", "PBA"), ("--budget-split", "equal")),
    FlowSpec("cgm", "load", ("CGM",), ("--domain", "0:1", "--bound", "1")),
)


@dataclass
class Operations:
    prom: PrometheusServer
    flows: dict[str, FlowProcess]
    internal_ports: dict[str, int]
    workdir: Path


def _start_flow(
    spec: FlowSpec, kafka: KafkaSettings, stack: ExitStack, workdir: Path, secret: Path
) -> tuple[FlowProcess, int, Topics]:
    topics = Topics(kafka)
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--stream", spec.stream, "--users", str(USERS), "--slots", str(SLOTS), "--seed", "3",
        "--no-progress",
    )  # fmt: skip
    if spec.family == "ldp-ids":  # a late event, a malformed one, one of an unknown stream
        produce_lines(
            kafka, topics.events, [event(1, 1, 1), b"{not json", event(2, SLOTS, 0, "other")]
        )
    flags = list(spec.flags)
    if spec.family == "personalized":  # two privacy classes: every third user asks for more
        table = workdir / "registrations.csv"
        table.write_text(
            "user,epsilon,window\n"
            + "".join(f"u{u},{2.0 if u % 3 == 0 else 1.0},{WINDOW}\n" for u in range(USERS))
        )
        flags += ["--registrations", str(table)]
    internal = free_port()
    command = [
        *PRIVSTREAM, "run", spec.family, "--stream", spec.stream, "--mechanism",
        ",".join(spec.mechanisms), "--users", str(USERS), "--window", str(WINDOW),
        "--no-progress", "--secret-file", str(secret), "--internal-metrics-port", str(internal),
        *flags, *topics.run_flags(kafka),
    ]  # fmt: skip
    directory = workdir / spec.family
    directory.mkdir()
    flow = stack.enter_context(FlowProcess(command, free_port(), directory, cli_env()))
    return flow, internal, topics


def _start_audit(kafka: KafkaSettings, topics: Topics, stack: ExitStack, workdir: Path) -> int:
    """``privstream audit --metrics-port`` over the LDP-IDS topics, lingering for the test."""
    port = free_port()
    with open(workdir / "audit.stderr", "wb") as err:
        process = subprocess.Popen(
            [*PRIVSTREAM, "audit", "--bootstrap", kafka.bootstrap, "--release-topic",
             topics.releases, "--ledger-topic", topics.ledger, "--population", str(USERS),
             "--max-epsilon", "1", "--no-progress", "--metrics-port", str(port), "--linger", "600"],
            stdout=subprocess.DEVNULL, stderr=err, env=cli_env(),
        )  # fmt: skip
    stack.callback(lambda: (process.kill(), process.wait()))
    text = scrape_until(port, lambda text: "privstream_audit_passed " in text, timeout=120)
    assert "privstream_audit_passed 1.0" in text, (workdir / "audit.stderr").read_text()[-3000:]
    return port


@pytest.fixture(scope="module")
def operations(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operations]:
    workdir = tmp_path_factory.mktemp("operations")
    kafka = KafkaSettings((broker.bootstrap,))
    secret = write_secret(workdir / "noise.key")
    with ExitStack() as stack:
        flows, internals, audit_topics = {}, {}, None
        for spec in FLOWS:
            flow, internal, topics = _start_flow(spec, kafka, stack, workdir, secret)
            flows[spec.family], internals[spec.family] = flow, internal
            expected = {f"{spec.stream}/{m}/{t}" for m in spec.mechanisms for t in range(1, SLOTS)}
            read_keyed(kafka, topics.ledger, expected, flow, timeout=180)
            audit_topics = audit_topics or topics
        assert audit_topics is not None
        audit = _start_audit(kafka, audit_topics, stack, workdir)
        jobs = {
            "privstream": [f"127.0.0.1:{f.metrics_port}" for f in flows.values()],
            "privstream-internal": [f"127.0.0.1:{p}" for p in internals.values()],
            "privstream-audit": [f"127.0.0.1:{audit}"],
        }
        prom = stack.enter_context(
            PrometheusServer(jobs, workdir / "prometheus", user_assets=PAGE, rule_files=[RULES])
        )
        prom.wait_until(lambda: len(prom.query("up == 1")) == 7, "every target up", 30)
        yield Operations(prom, flows, internals, workdir)


def test_every_dashboard_query_returns_data_for_running_flows(operations: Operations) -> None:
    from tests.deploy.dashboard import instantiate, panel_queries

    queries = panel_queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 20
    prom = operations.prom
    # rates need two samples after the series appeared: wait for a few scrapes of everything
    prom.wait_until(lambda: bool(prom.query("count_over_time(up[1m]) >= 8")), "eight scrapes", 30)
    empty = []
    for title, expr in queries:
        promql = instantiate(expr, stream_regex=".*", mechanism_regex=".*", rate_interval="1m")
        if not prom.query(promql):
            empty.append(f"{title}: {promql}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)


class _Cells(html.parser.HTMLParser):
    """The page's rendered cells: (table, key labels, metric) → (data-value, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = ""
        self.row: dict[str, str] = {}
        self.cell: tuple[str, str] | None = None
        self.cells: dict[tuple[str, tuple[tuple[str, str], ...], str], tuple[str, str]] = {}
        self.text = ""
        self.state = ""
        self.measure = ""
        self.measures: dict[tuple[str, tuple[tuple[str, str], ...], str], str] = {}
        """Each budget cell's ``data-measure`` (the others have none)."""
        self.flows: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, str]] = {}
        """Each row's flow: its ``data-job`` and ``data-instance`` (dropped from its key)."""
        self.total = False
        self.totals: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        """The rows of a flow's total over its streams (``data-total``)."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.state = found.get("data-state", "")
        if tag == "table":
            self.table = found.get("id", "")
        elif tag == "tr":
            self.row = {
                k.removeprefix("data-"): v for k, v in found.items() if k.startswith("data-")
            }
            flow = (self.row.pop("job", ""), self.row.pop("instance", ""))
            self.total = self.row.pop("total", "") == "flow"
            if self.row or flow != ("", ""):
                self.flows[(self.table, tuple(sorted(self.row.items())))] = flow
        elif tag == "td" and "data-metric" in found:
            self.cell = (found["data-metric"], found.get("data-value", ""))
            self.measure = found.get("data-measure", "")
            self.text = ""

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.cell is not None:
            key = (self.table, tuple(sorted(self.row.items())), self.cell[0])
            if self.total:
                self.totals.add(key[:2])
            self.cells[key] = (self.cell[1], self.text.strip())
            if self.measure:
                self.measures[key] = self.measure
            self.cell = None


def _chromium(url: str, *flags: str) -> str:
    done = subprocess.run(
        [ensure_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-dev-shm-usage", "--virtual-time-budget=20000", *flags, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _exposed(flows: dict[str, FlowProcess]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every public sample of the flows: (name, labels) → value."""
    samples = {}
    for flow in flows.values():
        for family in text_string_to_metric_families(flow.metrics()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


UNITS = {"pure": ("ε", 1), "approx": ("ε", 1), "gaussian": ("μ", 2), "zcdp": ("ρ", 1)}
"""The symbol a budget-valued cell shows for each measure, and the root taken of its value
(Gaussian DP's metrics hold μ², the page shows μ)."""


def _truth(
    exposed: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    row: tuple[tuple[str, str], ...],
) -> tuple[float, str]:
    """The exposed value of ``name`` for ``row`` and its ``measure`` label ("" for none)."""
    for (found, labels), value in exposed.items():
        rest = tuple(kv for kv in labels if kv[0] != "measure")
        if found == name and rest == row:
            return value, dict(labels).get("measure", "")
    raise KeyError((name, row))


def _share(
    exposed: dict[tuple[str, tuple[tuple[str, str], ...]], float], row: tuple[tuple[str, str], ...]
) -> float:
    """The spend of the (stream, mechanism)'s class closest to its own ε_c, as a share of it
    (a class row: that class's own)."""
    ratios = [
        value / exposed[("privstream_class_budget", labels)]
        for (name, labels), value in exposed.items()
        if name == "privstream_class_budget_spent"
        and {k: v for k, v in labels if k != "measure" and (k != "class" or "class" in dict(row))}
        == dict(row)
    ]
    return max(ratios)


def _firing(prom: PrometheusServer) -> set[tuple[str, str]]:
    """(alertname, instance) of every alert firing now."""
    samples = prom.query('ALERTS{alertstate="firing"}')
    return {(s.labels["alertname"], s.labels.get("instance", "")) for s in samples}


def _check_flows(page: _Cells, flows: dict[str, FlowProcess]) -> None:
    """Every row of the spend tables names its flow: job ``privstream`` and the ``instance`` of
    the flow whose endpoint serves its stream (three flows share the tables)."""
    ports = {spec.stream: flows[spec.family].metrics_port for spec in FLOWS}
    for (table, row), (job, instance) in page.flows.items():
        if table in ("mechanisms", "population", "classes"):
            assert job == "privstream", (table, row)
            assert instance == f"127.0.0.1:{ports[dict(row)['stream']]}", (table, row)
    assert {t for t, _r in page.flows} >= {"mechanisms", "population", "classes"}


def test_the_page_without_grafana_shows_the_flows_metrics(
    operations: Operations, tmp_path: Path
) -> None:
    url = f"{operations.prom.url}/user/privacy.html"
    page = _Cells()
    before = _firing(operations.prom)
    page.feed(_chromium(url, "--dump-dom"))
    after = _firing(operations.prom)
    shown = {(dict(r)["alertname"], i) for (t, r), (_j, i) in page.flows.items() if t == "alerts"}
    assert before & after <= shown <= before | after  # the alerts firing while it rendered
    assert page.state == "ready"
    exposed = _exposed(operations.flows)
    checked = 0
    budgets: dict[str, int] = {}
    _check_flows(page, operations.flows)
    for (table, row, metric), (value, text) in page.cells.items():
        if not value or table == "alerts":
            continue
        if metric == "share":
            truth = _share(exposed, row)
            assert float(value) == truth and 0 < truth <= 1, (row, value)
            continue
        truth, measure = _truth(exposed, "privstream_" + metric, row)
        assert float(value) == truth, (table, row, metric)
        expected = measure if "budget" in metric else ""  # the budget cells name theirs
        assert page.measures.get((table, row, metric), "") == expected, (table, row, metric)
        if "budget" in metric:  # a budget, in its measure's own unit: never μ² shown as an ε
            symbol, root = UNITS[measure]
            assert text.startswith(symbol + " "), (table, row, metric, text)
            shown = float(text.removeprefix(symbol + " "))
            assert shown == pytest.approx(truth ** (1 / root), rel=1e-3), (row, metric, text)
            budgets[measure] = budgets.get(measure, 0) + 1
        else:
            assert float(text) == pytest.approx(truth, rel=1e-3), (table, row, metric, text)
        number = text.split(" ")[-1]  # rounded for people: 4 significant digits, a residue 0
        assert len(number.replace(".", "").replace("-", "").lstrip("0")) <= max(
            4, len(str(int(abs(truth))))
        ), (table, row, metric, text)
        if 0 < abs(truth) < 1e-9:
            assert number == "0", (table, row, metric, text)
        checked += 1
    rows = {(t, r) for t, r, _m in page.cells}
    mechanisms = {r for t, r in rows if t == "mechanisms"}
    assert mechanisms == {
        (("mechanism", m), ("stream", spec.stream)) for spec in FLOWS for m in spec.mechanisms
    }
    assert {r for t, r in rows if t == "population"} == {(("stream", s.stream),) for s in FLOWS}
    assert checked >= 6 * 10
    assert budgets.get("pure", 0) > 0 and budgets.get("gaussian", 0) > 0  # CGM shown in μ
    assert set(page.measures.values()) == {"pure", "gaussian"}
    shot = tmp_path / "page.png"
    _chromium(url, f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("PRIVSTREAM_UPDATE_SCREENSHOT") == "1":  # refreshes the one in docs/
        shutil.copyfile(shot, SCREENSHOT)
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
