"""The operations assets against the real tools: every panel query of the Grafana dashboard
(``deploy/grafana``) evaluated by a real Prometheus scraping running flows, and the page
without Grafana (``deploy/prometheus/page``) rendered by headless Chromium against their
metrics.

Four flows run as their own processes over the embedded broker — LDP-IDS (three mechanisms
sharing ε), personalized (two), CGM (a Gaussian-DP family), and a flow file of two LDP-IDS streams
sharing one population's budget (the page's "all streams" row) — each with its public and
internal endpoints, plus ``privstream audit --metrics-port`` over the LDP-IDS topics; one Prometheus
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
    FlowSpec("dpi", "items", ("DPI",)),  # a lifetime budget: the DPI panels and page cells
)

FLOW_FILE = "flow-file"
"""The fixture's flow of several streams over one population (``privstream run --config``)."""


@dataclass(frozen=True)
class FileStream:
    """A stream of the flow file: its name, mechanisms, share of the population's ε, dataset."""

    stream: str
    mechanisms: tuple[str, ...]
    share: float
    dataset: str


FILE_STREAMS = (  # LPU alone and LPA beside LBU: population division, 100 % by design
    FileStream("country", ("LPU",), 0.5, "sin"),
    FileStream("device", ("LBU", "LPA"), 0.3, "log"),
)
FILE_EPSILON = 1.0


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
    if spec.family == "dpi":  # a trusted curator counts registered users only: one class
        table = workdir / "dpi-registrations.csv"
        table.write_text(
            "user,epsilon,window\n" + "".join(f"u{u},2.0,{WINDOW}\n" for u in range(USERS))
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


def _flow_file(directory: Path, kafka: KafkaSettings, topics: Topics) -> Path:
    """The flow file of ``FILE_STREAMS`` over one population of ``USERS``, ε ``FILE_EPSILON``."""
    streams = "".join(
        f'[[streams]]\nname = "{s.stream}"\nfamily = "ldp-ids"\nmechanisms = {list(s.mechanisms)}\n'
        f"domain = 2\nshare = {s.share}\n"
        + ('budget_split = "equal"\n' if len(s.mechanisms) > 1 else "")
        + "\n"
        for s in FILE_STREAMS
    ).replace("'", '"')
    path = directory / "flow.toml"
    path.write_text(
        f'[kafka]\nbootstrap = "{kafka.bootstrap}"\ninput_topic = "{topics.events}"\n'
        f'output_topic = "{topics.releases}"\nledger_topic = "{topics.ledger}"\n'
        f'dead_letter_topic = "{topics.dlq}"\nclock = "data"\ntrust_input_clock = true\n\n'
        f"[population]\nusers = {USERS}\nepsilon = {FILE_EPSILON}\nwindow = {WINDOW}\n\n" + streams
    )
    return path


def _start_flow_file(
    kafka: KafkaSettings, stack: ExitStack, workdir: Path, secret: Path
) -> tuple[FlowProcess, int, Topics]:
    """``privstream run --config`` over ``FILE_STREAMS``, their events on one input topic."""
    topics = Topics(kafka)
    for s in FILE_STREAMS:
        run_cli(
            "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset",
            s.dataset, "--stream", s.stream, "--users", str(USERS), "--slots", str(SLOTS),
            "--seed", "5", "--no-progress",
        )  # fmt: skip
    directory = workdir / FLOW_FILE
    directory.mkdir()
    internal = free_port()
    command = [
        *PRIVSTREAM, "run", "--config", str(_flow_file(directory, kafka, topics)),
        "--no-progress", "--secret-file", str(secret), "--internal-metrics-port", str(internal),
    ]  # fmt: skip
    flow = stack.enter_context(FlowProcess(command, free_port(), directory, cli_env()))
    expected = {f"{s.stream}/{m}/{t}" for s in FILE_STREAMS for m in s.mechanisms
                for t in range(1, SLOTS)}  # fmt: skip
    read_keyed(kafka, topics.ledger, expected, flow, timeout=180)
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
        flows[FLOW_FILE], internals[FLOW_FILE], _ = _start_flow_file(kafka, stack, workdir, secret)
        audit = _start_audit(kafka, audit_topics, stack, workdir)
        jobs = {
            "privstream": [f"127.0.0.1:{f.metrics_port}" for f in flows.values()],
            "privstream-internal": [f"127.0.0.1:{p}" for p in internals.values()],
            "privstream-audit": [f"127.0.0.1:{audit}"],
        }
        prom = stack.enter_context(
            PrometheusServer(jobs, workdir / "prometheus", user_assets=PAGE, rule_files=[RULES])
        )
        targets = sum(map(len, jobs.values()))
        prom.wait_until(lambda: len(prom.query("up == 1")) == targets, "every target up", 30)
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
        self.divisions: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        """Each mechanism's and class's row's ``data-division`` (dropped from its key)."""
        self.scopes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        """Each mechanism's row's ``data-scope`` (its guarantee's scope kind; dropped from its
        key)."""
        self.scoped: dict[tuple[str, tuple[tuple[str, str], ...], str], str] = {}
        """Each cell's ``data-scope`` (a scope cell of a lifetime budget: ``lifetime``)."""
        self.note = ""
        self.scope = ""
        self.notes: dict[tuple[str, tuple[tuple[str, str], ...], str], str] = {}
        """Each cell's ``data-note`` (a share at 100 % by design: ``population-division``)."""

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
            division = self.row.pop("division", None)
            scope = self.row.pop("scope", None)
            if division is not None:
                self.divisions[(self.table, tuple(sorted(self.row.items())))] = division
            if scope is not None:
                self.scopes[(self.table, tuple(sorted(self.row.items())))] = scope
            if self.row or flow != ("", ""):
                self.flows[(self.table, tuple(sorted(self.row.items())))] = flow
        elif tag == "td" and "data-metric" in found:
            self.cell = (found["data-metric"], found.get("data-value", ""))
            self.measure = found.get("data-measure", "")
            self.note = found.get("data-note", "")
            self.scope = found.get("data-scope", "")
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
            if self.note:
                self.notes[key] = self.note
            if self.scope:
                self.scoped[key] = self.scope
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
    for stream in [s.stream for s in FILE_STREAMS] + [TOTAL]:
        ports[stream] = flows[FLOW_FILE].metrics_port
    for (table, row), (job, instance) in page.flows.items():
        if table in ("mechanisms", "population", "classes"):
            assert job == "privstream", (table, row)
            assert instance == f"127.0.0.1:{ports[dict(row)['stream']]}", (table, row)
    assert {t for t, _r in page.flows} >= {"mechanisms", "population", "classes"}


TOTAL = "all streams"
"""The stream label of a flow's total row in the population table."""
POPULATION_ADDED = ("budget", "budget_spent", "budget_remaining", "mechanisms")
"""The population columns the total sums over the flow's streams (its scope is the longest)."""


def _check_total(
    page: _Cells, exposed: dict[tuple[str, tuple[tuple[str, str], ...]], float]
) -> None:
    """The flow file's "all streams" row (the only total: every other flow has one stream) is
    the sum of its streams' population gauges in the measure's additive unit (ε here), and its
    budget is the streams' shares of the population's ε."""
    row = (("stream", TOTAL),)
    assert page.totals == {("population", row)}
    streams = [(("stream", s.stream),) for s in FILE_STREAMS]
    for column in (*POPULATION_ADDED, "scope_slots"):
        name = "privstream_population_" + column
        value, text = page.cells[("population", row, "population_" + column)]
        parts = [_truth(exposed, name, stream)[0] for stream in streams]
        truth = max(parts) if column == "scope_slots" else sum(parts)
        assert float(value) == pytest.approx(truth, rel=1e-12, abs=1e-15), (column, value, parts)
        number = float(text.removeprefix("ε "))
        assert number == pytest.approx(truth if abs(truth) > 1e-9 else 0, rel=1e-3), (column, text)
        if column in ("budget", "budget_spent", "budget_remaining"):
            assert text.startswith("ε "), (column, text)
            assert page.measures[("population", row, "population_" + column)] == "pure"
    budget = float(page.cells[("population", row, "population_budget")][0])
    assert budget == pytest.approx(sum(s.share for s in FILE_STREAMS) * FILE_EPSILON)
    mechanisms = float(page.cells[("population", row, "population_mechanisms")][0])
    assert mechanisms == sum(len(s.mechanisms) for s in FILE_STREAMS)


def _check_divisions(
    page: _Cells, exposed: dict[tuple[str, tuple[tuple[str, str], ...]], float]
) -> None:
    """Every mechanism's and class's row carries its mechanism's division (from
    ``privstream_mechanism_info``), and a share cell says "normal for population division"
    exactly where a population-division mechanism has spent 100 % (LPU, LPA: by design)."""
    info = {
        (labels["stream"], labels["mechanism"]): labels["division"]
        for (name, pairs), _value in exposed.items()
        if name == "privstream_mechanism_info" and (labels := dict(pairs))
    }
    noted = set()
    for (table, row, metric), (value, text) in page.cells.items():
        if metric != "share" or table not in ("mechanisms", "classes"):
            continue
        labels = dict(row)
        division = info[(labels["stream"], labels["mechanism"])]
        assert page.divisions[(table, row)] == division, (table, row)
        by_design = division == "population" and float(value) == 1.0
        note = page.notes.get((table, row, metric), "")
        assert note == ("population-division" if by_design else ""), (table, row, value, note)
        assert ("normal for population division" in text) == by_design, (table, row, text)
        if by_design:
            noted.add((table, labels["mechanism"]))
    assert {("mechanisms", "LPU"), ("mechanisms", "LPA"), ("classes", "LPU")} <= noted, noted
    assert {m for _t, m in noted} <= {"LSP", "LPU", "LPD", "LPA"}


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
    # population division at 100 % (LPU, LPA) and LBU's steady state: no budget alert fires
    # (CGM's stream budget, which never renews, is nearly spent by design of the fixture)
    budget_alerts = 'ALERTS{alertstate="firing", alertname=~"Privstream.*(Budget|Exhausted).*"}'
    fired = [a.labels for a in operations.prom.query(budget_alerts)]
    assert [a for a in fired if a["alertname"] != "PrivstreamGaussianBudgetNearlyExhausted"] == []
    assert page.state == "ready"
    exposed = _exposed(operations.flows)
    checked = 0
    budgets: dict[str, int] = {}
    _check_flows(page, operations.flows)
    _check_total(page, exposed)
    _check_divisions(page, exposed)
    for (table, row, metric), (value, text) in page.cells.items():
        if not value or table == "alerts" or (table, row) in page.totals:
            continue
        if metric == "share":
            truth = _share(exposed, row)
            assert float(value) == truth and 0 < truth <= 1, (row, value)
            continue
        if page.scoped.get((table, row, metric)) == "lifetime":  # DPI: no window, never a length
            assert metric in ("scope_slots", "population_scope_slots") and text == "lifetime"
            assert float(value) == 0.0, (table, row, metric, value)
            continue
        truth, measure = _truth(exposed, "privstream_" + metric, row)
        assert float(value) == truth, (table, row, metric)
        # DPI's lifetime spends are budget cells too: pure ε, without a measure label
        lifetime = metric.startswith("dpi_epsilon_spent")
        measure = "pure" if lifetime else measure
        budgeted = "budget" in metric or lifetime
        expected = measure if budgeted else ""  # the budget cells name theirs
        assert page.measures.get((table, row, metric), "") == expected, (table, row, metric)
        if budgeted:  # a budget, in its measure's own unit: never μ² shown as an ε
            symbol, root = UNITS[measure]
            assert text.startswith(symbol + " "), (table, row, metric, text)
            shown = float(text.removeprefix(symbol + " "))
            assert shown == pytest.approx(truth ** (1 / root), rel=1e-3), (row, metric, text)
            budgets[measure] = budgets.get(measure, 0) + 1
        else:
            assert float(text) == pytest.approx(truth, rel=1e-3), (table, row, metric, text)
        number = text.split(" ")[-1]  # rounded for people: 4 significant digits, a residue 0
        digits = number.split("e")[0]  # the significand: a DPI spend reads "2.445e-7"
        assert len(digits.replace(".", "").replace("-", "").lstrip("0")) <= max(
            4, len(str(int(abs(truth))))
        ), (table, row, metric, text)
        if 0 < abs(truth) < 1e-9:
            assert number == "0", (table, row, metric, text)
        checked += 1
    rows = {(t, r) for t, r, _m in page.cells}
    mechanisms = {r for t, r in rows if t == "mechanisms"}
    streams = [(spec.stream, spec.mechanisms) for spec in (*FLOWS, *FILE_STREAMS)]
    assert mechanisms == {(("mechanism", m), ("stream", s)) for s, ms in streams for m in ms}
    assert {r for t, r in rows if t == "population"} == {
        (("stream", s),) for s in [s for s, _ms in streams] + [TOTAL]
    }
    assert checked >= 6 * 10
    assert budgets.get("pure", 0) > 0 and budgets.get("gaussian", 0) > 0  # CGM shown in μ
    assert set(page.measures.values()) == {"pure", "gaussian"}
    shot = tmp_path / "page.png"
    _chromium(url, f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("PRIVSTREAM_UPDATE_SCREENSHOT") == "1":  # refreshes the one in docs/
        shutil.copyfile(shot, SCREENSHOT)
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
