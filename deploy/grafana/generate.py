"""Generate privstream's Grafana dashboard, ``privstream-dashboard.json``, as code.

The dashboard is built with the official ``grafana-foundation-sdk`` (Grafana 11.6 schema) and
written with sorted keys, so the committed JSON is deterministic and reviewable.

Rows:

* **Privacy spend (public metrics)** — only metrics of the public endpoint (job ``privstream``,
  the allow-list ``PUBLIC_METRICS``) and ``up``: the spend the ledger allows against ε, per
  stream × mechanism, per privacy class and for the whole population, release decisions and
  the flags that say a run's output is not private. Safe to show anyone.
* **Audit** — the audit CronJob's verdict (job ``privstream-audit``), public too.
* **Operations (operator-only: internal metrics)** — collapsed; ``privstream_internal_*`` from
  the internal endpoint (job ``privstream-internal``): true event counts and step timing, which
  need the same access as the input topic.

Run ``.venv/bin/python deploy/grafana/generate.py`` to rewrite the JSON, ``--check`` to exit 1
with a diff summary when the committed file is stale.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

OUTPUT: Final = Path(__file__).with_name("privstream-dashboard.json")
UID: Final = "privstream-privacy-spend"
TITLE: Final = "privstream — privacy spend"
DATASOURCE: Final = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE: Final = "$__rate_interval"
AUDIT_LOOKBACK: Final = "2h"  # the audit pod lives minutes; its last report is kept this long

PUBLIC_ROW: Final = "Privacy spend (public metrics)"
AUDIT_ROW: Final = "Audit"
OPERATIONS_ROW: Final = "Operations (operator-only: internal metrics)"

DASHED: Final = model.DynamicConfigValue(
    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
)


def sel(metric: str, *, mechanism: bool = True, measure: str | None = None) -> str:
    """``metric{stream=~"$stream", mechanism=~"$mechanism"}``: the dashboard's filters on a
    metric labelled by stream (and by mechanism unless ``mechanism=False``; by the budget's
    ``measure`` where given)."""
    matchers = (
        ['stream=~"$stream"', 'mechanism=~"$mechanism"'] if mechanism else ['stream=~"$stream"']
    )
    if measure is not None:
        matchers.append(f'measure=~"{measure}"')
    return f"{metric}{{{', '.join(matchers)}}}"


UNITS: Final = (("pure|approx", "ε", ""), ("gaussian", "μ", "sqrt"), ("zcdp", "ρ", ""))
"""Each measure's unit and how its budget-valued gauges (additive unit: ε, μ², ρ) become it:
Gaussian DP's μ² is shown as μ = √(μ²), never as an ε."""


def in_units(metric: str, by: str, *, mechanism: bool = True) -> str:
    """``max by (by)`` of a budget-valued ``metric`` in its measure's own unit, with a ``unit``
    label (ε, μ or ρ) for the legend."""
    parts = []
    for measures, unit, function in UNITS:
        inner = f"max by ({by}) ({sel(metric, mechanism=mechanism, measure=measures)})"
        inner = f"{function}({inner})" if function else inner
        parts.append(f'label_replace({inner}, "unit", "{unit}", "", "")')
    return " or ".join(parts)


def measured(metric: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    """A budget-valued gauge per stream × mechanism in its measure's own unit (``in_units``)."""
    expr = in_units(metric, "stream, mechanism")
    return query(expr, f"{{{{stream}}}} {{{{mechanism}}}} {legend}", ref)


def of_selected_flows(expr: str) -> str:
    """Keep only the series of ``expr`` (a per-process metric without a stream label) that
    come from a flow serving a selected stream × mechanism: joined on the scrape's ``instance``,
    the public endpoint both are served from."""
    return f"({expr} and on (instance) {sel('privstream_budget')})"


def query(expr: str, legend: str, ref: str = "A", *, instant: bool = False) -> prometheus.Dataquery:
    """A Prometheus target of the dashboard's datasource variable."""
    target = (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )
    return target.instant() if instant else target.range()


def pair(metric: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    """A public gauge per stream × mechanism (the largest where several flows report it)."""
    expr = f"max by (stream, mechanism) ({sel(metric)})"
    return query(expr, f"{{{{stream}}}} {{{{mechanism}}}} {legend}".rstrip(), ref)


def red_above(
    limit: float, *, base: str = "green", color: str = "red"
) -> dashboard_builders.ThresholdsConfig:
    """``base`` below ``limit``, ``color`` (red) from it on."""
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=None, color=base), model.Threshold(value=limit, color=color)])
    )


def red_below(limit: float) -> dashboard_builders.ThresholdsConfig:
    """Red below ``limit``, green from it on."""
    return red_above(limit, base="red", color="green")


def graph(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "none",
    dashed: Sequence[str] = (),
    width: int = 12,
) -> timeseries.Panel:
    """A time series panel; the targets whose ref ids are in ``dashed`` (limits such as ε)
    are drawn as dashed lines."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .min(0)
        .span(width)
        .height(8)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    for ref in dashed:
        panel = panel.override_by_query(ref, [DASHED])
    return panel


def flag(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    thresholds: dashboard_builders.ThresholdsConfig,
    *,
    width: int = 4,
    unit: str = "none",
) -> stat.Panel:
    """A stat panel of the last value of each series, coloured by ``thresholds``."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .thresholds(thresholds)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .span(width)
        .height(5)
    )


def privacy_flags() -> list[Builder[model.Panel]]:
    """Stat tiles that must stay 0: halts, privacy violations, the run's flags."""
    return [
        flag(
            "Halted mechanisms",
            "How many stream × mechanism pairs have halted: the ledger refused a charge or a "
            "step failed, so nothing more is released for them (the log says why). Must be 0; "
            "red otherwise.",
            [query(f"sum({sel('privstream_halted')})", "halted", instant=True)],
            red_above(1),
        ),
        flag(
            "Privacy violations",
            "Charges the ledger refused, summed over the selected streams and mechanisms. A "
            "refused charge is never released, but any value above 0 means a mechanism tried "
            "to overspend: it must be 0; red otherwise.",
            [
                query(
                    f"sum({sel('privstream_privacy_violations_total')})", "violations", instant=True
                )
            ],
            red_above(1),
        ),
        flag(
            "Insecure seed / evaluation run",
            "1 (red) when a flow's noise comes from a public reproducible seed (its output is "
            "never private), or when it runs the mechanisms side by side with the full budget "
            "each as an evaluation (--compare), not a release. Production must show 0 for both.",
            [
                query(
                    f"max({of_selected_flows('privstream_insecure_seed')})",
                    "insecure seed",
                    instant=True,
                ),
                query(
                    f"max({of_selected_flows('privstream_evaluation')})",
                    "evaluation",
                    "B",
                    instant=True,
                ),
            ],
            red_above(1),
        ),
    ]


def liveness_flags() -> list[Builder[model.Panel]]:
    """Stat tiles that must stay 1: the Kafka clients and the flows' scrape."""
    return [
        flag(
            "Kafka connected",
            "Kafka runs only: 1 while every client of the kind reaches the broker (source: "
            "the input's consumers, sink: the output producers), 0 (red) while one does not.",
            [
                query(
                    f"min by (client) ({of_selected_flows('privstream_kafka_connected')})",
                    "{{client}}",
                    instant=True,
                )
            ],
            red_below(1),
        ),
        flag(
            "Flow up",
            'Whether Prometheus can scrape each flow\'s public endpoint (job "privstream"). '
            "0 (red): the flow is down or unreachable, and every other panel is stale.",
            [query('up{job="privstream"}', "{{instance}}", instant=True)],
            red_below(1),
            width=8,
        ),
    ]


def pair_spend_panels() -> list[Builder[model.Panel]]:
    """The ledger's spend against ε per stream × mechanism, and per privacy class."""
    by_class = "stream, mechanism, class"
    return [
        graph(
            "Budget spent vs budget",
            "The most budget any single user has spent in the scope ending at the last "
            "released slot, per stream × mechanism, with the configured budget as a dashed "
            "line, each in its measure's own unit (legend: ε for pure DP, μ for Gaussian DP, "
            "ρ for zCDP). The ledger never lets the spend cross the budget: good is a solid "
            "line at or under its dashed line. Mechanisms that spend their whole window by "
            "design (LBU, population division) sit at ε; that is normal. Personalized "
            "mechanisms: the spend is their class closest to its own ε_c, which may lie above "
            "the stream's default ε — read the per-class panel for them.",
            [
                measured("privstream_scope_budget_spent", "spent {{unit}}"),
                measured("privstream_budget", "budget {{unit}}", "B"),
            ],
            dashed=["B"],
        ),
        graph(
            "Spend per privacy class",
            "Each privacy class's spend over its own scope (class label w<w_c>_e<ε_c>; "
            "s<l>_mu<μ> for Gaussian DP), with its budget dashed, in the measure's unit. Personalized mechanisms have one class per privacy "
            "requirement, the other families one class of all users. The ledger never lets a "
            "class's spend cross its ε_c: a solid line above its dashed line is a privacy "
            "violation (the PrivstreamWindowBudgetAboveEpsilon alert).",
            [
                query(
                    in_units("privstream_class_budget_spent", by_class),
                    "{{stream}} {{mechanism}} {{class}} spent {{unit}}",
                ),
                query(
                    in_units("privstream_class_budget", by_class),
                    "{{stream}} {{mechanism}} {{class}} budget {{unit}}",
                    "B",
                ),
            ],
            dashed=["B"],
        ),
    ]


def composed_spend_panels() -> list[Builder[model.Panel]]:
    """The Gaussian families' spend in μ and in ε at δ, and the population's composed budget."""
    return [
        graph(
            "Gaussian-DP spend: μ and ε at δ",
            "Gaussian-DP families only (e.g. CGM; empty for the others): μ the most-charged "
            "user has spent in the budget's scope, and the same spend expressed as ε at the "
            "configured δ (dashed). Bad: ε at δ above the configured ε of the panel above.",
            [pair("privstream_mu_spent", "μ"), pair("privstream_epsilon_spent", "ε at δ", "B")],
            dashed=["B"],
        ),
        graph(
            "Population budget (all mechanisms composed)",
            "The accountant's composed spend of the most-charged user (or class) over every "
            "mechanism of the stream, over the scope ending at the last slot, with the "
            "population's composed budget dashed, in the measure's unit (ε; μ for Gaussian "
            "DP; ρ). Per stream only (all mechanisms share it). Bad: the solid line above the "
            "dashed one.",
            [
                query(
                    in_units("privstream_population_budget_spent", "stream", mechanism=False),
                    "{{stream}} spent {{unit}}",
                ),
                query(
                    in_units("privstream_population_budget", "stream", mechanism=False),
                    "{{stream}} budget {{unit}}",
                    "B",
                ),
            ],
            dashed=["B"],
        ),
    ]


def dpi_panels() -> list[Builder[model.Panel]]:
    """DPI (user-level ε-DP over an infinite stream): its lifetime spend against ε, the series
    element it spent last, and whether the series is exhausted (empty without a DPI stream)."""
    nominal = sel("privstream_dpi_epsilon_spent_nominal")
    budget = f"({in_units('privstream_budget', 'stream, mechanism')}) and on (stream, mechanism) {nominal}"
    return [
        graph(
            "DPI lifetime spend: nominal and conservative vs ε",
            "DPI streams only: the nominal lifetime spend Σ ε_t (the guarantee's account), the "
            "conservative account of the spec's §3.10 (equal to the nominal under the "
            "production update, above it under the paper's update, an "
            "evaluation) and the lifetime budget ε dashed. It never renews. Bad: the nominal "
            "line above the dashed one (PrivstreamDpiOverEpsilon); past 90 % of ε a ticket "
            "(PrivstreamDpiBudgetNearlySpent).",
            [
                pair("privstream_dpi_epsilon_spent_nominal", "nominal ε"),
                pair("privstream_dpi_epsilon_spent_conservative", "conservative ε", "B"),
                query(budget, "{{stream}} {{mechanism}} budget {{unit}}", "C"),
            ],
            dashed=["C"],
        ),
        graph(
            "DPI series element ε_t",
            "DPI streams only: the series element ε_t the last slot spent (public: drawn by the "
            "random budget allocation, independent of the data). It shrinks as the series goes "
            "on; 0 once the series is exhausted.",
            [pair("privstream_dpi_epsilon_slot", "ε_t")],
            width=8,
        ),
        flag(
            "DPI series exhausted",
            "DPI streams whose series has no element left or whose nominal account is full "
            "(1, red): their releases no longer depend on the data. Expected only at the end "
            "of a stream's life; 0 otherwise.",
            [query(f"max({sel('privstream_dpi_budget_exhausted')})", "exhausted", instant=True)],
            red_above(1),
        ),
    ]


def release_panels() -> list[Builder[model.Panel]]:
    """What the mechanisms decided to release, and whom they could ask."""

    def rate(metric: str, legend: str, ref: str) -> prometheus.Dataquery:
        expr = f"sum by (stream, mechanism) (rate({sel(metric)}[{RATE}]))"
        return query(expr, "{{stream}} {{mechanism}} " + legend, ref)

    return [
        graph(
            "Publications, approximations and nullified slots",
            "Released slots per second, by decision: a fresh noisy estimate (publication), a "
            "repeat of the last estimate (approximation), or a slot nullified to absorb budget "
            "(LBA/LPA). Their sum follows the slot rate. Bad: everything dropping to 0 while "
            "input flows (the mechanism halted or the flow stalled).",
            [
                rate("privstream_publications_total", "publications", "A"),
                rate("privstream_approximations_total", "approximations", "B"),
                rate("privstream_nullified_total", "nullified", "C"),
            ],
            unit="ops",
        ),
        graph(
            "Users available and used in the window",
            "Users able to report at the next slot, and users who already reported in the "
            "current window (population division; curator families: their registered users). "
            "Bad: available users near 0, so the next publication is noisy or approximated.",
            [
                pair("privstream_users_available", "available"),
                pair("privstream_window_users_used", "used in window", "B"),
            ],
        ),
    ]


def progress_panels() -> list[Builder[model.Panel]]:
    """How far each mechanism has released, and the LDP-IDS publication decision."""
    return [
        graph(
            "Last released slot",
            "Index of the last slot whose release reached the output, per stream × mechanism. "
            "Good: a line that keeps rising at the slot rate. Bad: a flat line while input "
            "arrives (stalled or halted).",
            [pair("privstream_last_released_slot", "")],
        ),
        graph(
            "LDP-IDS: dissimilarity vs publication error",
            "LDP-IDS families only: the last de-biased dissimilarity between the current "
            "statistic and the last release, and the potential publication error (dashed). "
            "The mechanism publishes when the dissimilarity exceeds the error, approximates "
            "otherwise. Informational; both are computed from private LDP reports.",
            [
                pair("privstream_dissimilarity", "dissimilarity"),
                pair("privstream_publication_error", "publication error", "B"),
            ],
            dashed=["B"],
        ),
    ]


def configuration_panel() -> table.Panel:
    """The configured ε, window and population per stream × mechanism, as one table."""
    columns = {
        "A": ("privstream_budget", "budget (in unit)"),
        "B": ("privstream_scope_slots", "scope (slots)"),
        "C": ("privstream_population", "population n"),
    }
    exprs = {ref: f"max by (stream, mechanism) ({sel(metric)})" for ref, (metric, _) in
             columns.items()}  # fmt: skip
    exprs["A"] = in_units("privstream_budget", "stream, mechanism")  # ε, μ or ρ: never μ² as ε
    targets = [
        query(expr, "", ref, instant=True).format(prometheus_model.PromQueryFormat.TABLE)
        for ref, expr in exprs.items()
    ]
    rename = {f"Value #{ref}": name for ref, (_, name) in columns.items()}
    return (
        table.Panel()
        .title("Configuration")
        .description(
            "The privacy parameters each stream × mechanism runs with: its budget (column unit: "
            "ε, μ for Gaussian DP, ρ for zCDP) per scope of w slots over a registered "
            "population of n users. Public configuration; a value "
            "that differs from the deployment's intent is bad."
        )
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit("none")
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True}, "renameByName": rename},
            )
        )
        .span(24)
        .height(6)
    )


def public_panels() -> list[Builder[model.Panel]]:
    """The public row: only ``PUBLIC_METRICS`` and ``up``."""
    return [
        *privacy_flags(),
        *liveness_flags(),
        *pair_spend_panels(),
        *composed_spend_panels(),
        *dpi_panels(),
        *release_panels(),
        *progress_panels(),
        configuration_panel(),
    ]


def input_panels() -> list[Builder[model.Panel]]:
    """True event counts and step latency from the internal endpoint (operators only)."""

    def rate(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({sel(metric, mechanism=False)}[{RATE}]))"

    step = f"sum by (le, stream, mechanism) (rate({sel('privstream_internal_step_seconds_bucket')}[{RATE}]))"
    quantiles = (("A", "0.5", "p50"), ("B", "0.95", "p95"), ("C", "0.99", "p99"))
    return [
        graph(
            "Events in and dead letters",
            "True event counts (restricted): events accepted into a slot per second, dead "
            'letters per second by reason (stream "": a stream that is not configured), and '
            "late events (for an already released slot). Bad: dead letters or late events "
            "growing with the input, or events in at 0 while producers write.",
            [
                query(rate("privstream_internal_events_total", "stream"), "{{stream}} events in"),
                query(
                    rate("privstream_internal_events_rejected_total", "stream, reason"),
                    "{{stream}} dead letters: {{reason}}",
                    "B",
                ),
                query(
                    rate("privstream_internal_late_events_total", "stream"), "{{stream}} late", "C"
                ),
            ],
            unit="ops",
        ),
        graph(
            "Step latency p50 / p95 / p99",
            "Wall time of one mechanism step (one slot), by quantile, from the step-seconds "
            "histogram (a timing side channel on true counts, hence restricted). Bad: p99 "
            "approaching the slot length, so slots queue up.",
            [
                query(f"histogram_quantile({q}, {step})", "{{stream}} {{mechanism}} " + name, ref)
                for ref, q, name in quantiles
            ],
            unit="s",
        ),
    ]


def kafka_panels() -> list[Builder[model.Panel]]:
    """The Kafka clients' lag, progress and undeliverable dead letters (operators only)."""
    return [
        graph(
            "Kafka consumer lag",
            "Messages between the consumer's position and each partition's high watermark, "
            "where the broker reports it. Bad: a lag that keeps growing (the flow falls behind "
            "its input).",
            [
                query(
                    "max by (topic, partition) (privstream_internal_consumer_lag)",
                    "{{topic}}[{{partition}}]",
                )
            ],
        ),
        graph(
            "Seconds since last Kafka progress",
            "Time since the last consumed input batch (source) or delivered output batch "
            "(sink), per flow. Bad: a value that keeps growing while producers write "
            "(stalled consumer or producer).",
            [
                query(
                    "time() - max by (instance, client) "
                    "(privstream_internal_last_progress_timestamp_seconds)",
                    "{{instance}} {{client}}",
                )
            ],
            unit="s",
        ),
        graph(
            "Undeliverable dead letters",
            "Dead letters per second that could not be written to the dead-letter topic (they "
            "are only logged). Must stay 0: anything else loses the record of rejected input.",
            [
                query(
                    "sum by (instance) "
                    f"(rate(privstream_internal_dead_letters_undeliverable_total[{RATE}]))",
                    "{{instance}}",
                )
            ],
            unit="ops",
            width=24,
        ),
    ]


def audit_panels() -> list[Builder[model.Panel]]:
    """The last audit's verdict. Each CronJob run is a new pod (a new ``instance``) that lives
    minutes, so the reports of the last ``AUDIT_LOOKBACK`` are read back and only the run that
    finished last is shown: an older failed run does not stay red after a later one passed."""
    stamp = f"last_over_time(privstream_audit_last_run_timestamp_seconds[{AUDIT_LOOKBACK}])"
    latest = f"({stamp} == scalar(max({stamp})))"

    def last(metric: str) -> str:
        return f"(last_over_time({metric}[{AUDIT_LOOKBACK}]) and on (instance) {latest})"

    return [
        flag(
            "Audit passed",
            "1 when every check of the last privacy audit held, 0 (red) when one failed. No "
            f"value: no audit reported in the last {AUDIT_LOOKBACK}.",
            [query(f"min({last('privstream_audit_passed')})", "passed", instant=True)],
            red_below(1),
        ),
        flag(
            "Audit checks",
            "The last audit's result per check (1 held, 0 failed, red): complete slots, unique "
            "payloads, window budget, population accountant, declared spend, no user ids, "
            "well-formed records.",
            [
                query(
                    f"min by (check) ({last('privstream_audit_check_passed')})",
                    "{{check}}",
                    instant=True,
                )
            ],
            red_below(1),
            width=12,
        ),
        flag(
            "Time since last audit",
            "How long ago the last audit finished. Bad: longer than the CronJob's schedule "
            f"(orange after an hour); no value: no audit reported in the last {AUDIT_LOOKBACK} "
            "(the CronJob is not running or its pod is not scraped).",
            [query(f"time() - max({stamp})", "since last audit", instant=True)],
            red_above(3600, color="orange"),
            unit="s",
        ),
        flag(
            "Records read by the last audit",
            "Releases and ledger entries the last audit read. Bad: 0 (red) while the flow runs: "
            "the audit read nothing, so its verdict covers nothing.",
            [
                query(f"max({last('privstream_audit_releases')})", "releases", instant=True),
                query(
                    f"max({last('privstream_audit_ledger_entries')})",
                    "ledger entries",
                    "B",
                    instant=True,
                ),
            ],
            red_below(1),
        ),
    ]


def variables() -> list[Builder[model.VariableModel]]:
    """``datasource`` (any Prometheus), then ``stream`` and ``mechanism`` (multi, with All)."""

    def label_values(name: str, query_text: str, label: str) -> dashboard_builders.QueryVariable:
        return (
            dashboard_builders.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(query_text)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )

    return [
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        label_values("stream", "label_values(privstream_budget, stream)", "Stream"),
        label_values(
            "mechanism",
            'label_values(privstream_budget{stream=~"$stream"}, mechanism)',
            "Mechanism",
        ),
    ]


def build() -> dict[str, Any]:
    """The dashboard as the JSON object Grafana imports; panel ids numbered in layout order."""
    board = (
        dashboard_builders.Dashboard(TITLE)
        .uid(UID)
        .description(
            "Differential-privacy budget spend of privstream flows (public metrics), the "
            "privacy audit, and restricted operational metrics."
        )
        .tags(["privstream", "privacy"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .variables(variables())
        .annotation(
            dashboard_builders.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
        .with_row(dashboard_builders.Row(PUBLIC_ROW))
    )
    for panel in public_panels():
        board = board.with_panel(panel)
    board = board.with_row(dashboard_builders.Row(AUDIT_ROW))
    for panel in audit_panels():
        board = board.with_panel(panel)
    operations = dashboard_builders.Row(OPERATIONS_ROW).collapsed(True)
    for panel in [*input_panels(), *kafka_panels()]:
        operations = operations.with_panel(panel)
    board = board.with_row(operations)
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    number = 0
    for panel in data["panels"]:
        for item in (panel, *panel.get("panels", ())):
            number += 1
            item["id"] = number
    return data


def render() -> str:
    """The committed file's exact text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``OUTPUT``, or with ``--check`` compare it with the generator's output."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        OUTPUT.write_text(text, encoding="utf-8")
        return 0
    committed = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
    if committed == text:
        return 0
    diff = list(
        difflib.unified_diff(
            committed.splitlines(), text.splitlines(), str(OUTPUT), "generated", lineterm="", n=1
        )
    )
    print(
        f"{OUTPUT} is stale ({len(diff)} diff lines); regenerate with `python deploy/grafana/generate.py`:"
    )
    print("\n".join(diff[:60]))
    return 1


if __name__ == "__main__":
    sys.exit(main())
