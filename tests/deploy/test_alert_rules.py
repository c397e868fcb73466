"""Static checks of privstream's alerting (deploy/prometheus/rules, deploy/alertmanager).

Each rule file (the flows' privstream.rules.yml, the shuffler's own privstream-shuffler.rules.yml)
passes ``promtool check rules`` and its unit tests (``promtool test rules``); every alert has a
unit-test case where it fires and one where it stays silent, so a new rule without tests fails
here; every rule reads only metrics privstream exports (or ``up``) and names the
mechanisms of a budget kind exactly as the code classifies them; the example Alertmanager
configuration passes ``amtool check-config``, pages only for ``severity="page"`` and inhibits
with alerts that exist.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from privstream.audit.metrics import AuditMetrics
from privstream.families.registry import FAMILIES
from privstream.mechanisms import personalized
from privstream.operators.metrics import PUBLIC_METRICS
from privstream.runtime.shuffler_metrics import ShufflerMetrics
from privstream.schema.exposition import INTERNAL, INTERNAL_PREFIX
from tests.metric_names import exposed_name

from ..integration.prometheus import ensure_alertmanager, ensure_prometheus
from .test_dashboard import metric_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "privstream.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "privstream.rules.test.yml"
SHUFFLER_RULES = RULES.with_name("privstream-shuffler.rules.yml")
# Every rule file (all that prometheus.yml's rules/*.yml loads) and its unit tests.
RULE_FILES = {
    RULES: RULE_TESTS,
    SHUFFLER_RULES: RULE_TESTS.with_name("privstream-shuffler.rules.test.yml"),
}
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"

SEVERITIES = frozenset({"page", "ticket", "info"})
ANNOTATIONS = frozenset({"summary", "description", "runbook"})
# Mechanisms whose privacy classes each have their own (w_c, eps_c), and those that divide the
# population (each report uses the full eps): the rules single them out by name.
PERSONAL = frozenset(name for name, m in personalized.MECHANISMS.items() if not m.uniform)
POPULATION_DIVISION = frozenset(
    name
    for family in FAMILIES.values()
    for name, mechanism in family.mechanisms.items()
    if mechanism.division == "population"
)
_MECHANISM_MATCHER = re.compile(r'\bmechanism\s*[=!]~\s*"([^"]*)"')
_ALERTNAME_MATCHER = re.compile(r'^alertname\s*!?=~?\s*"([^"]*)"$')


def run(command: Sequence[str]) -> str:
    """``command``'s stdout; fails the test with its output when it exits non-zero."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, (
        f"`{' '.join(command)}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout


def rules_of(path: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES for rule in rules_of(path)]


@pytest.fixture(scope="module")
def alerts(rules: list[dict[str, Any]]) -> set[str]:
    return {rule["alert"] for rule in rules}


def exported_metrics() -> set[str]:
    """Every name privstream serves: the public allow-list, the internal registry (filled by
    the modules that define its metrics), the audit job's verdict and the shuffler's own."""
    for module in (
        "privstream.operators.metrics", "privstream.connectors.kafka_health", "privstream.runtime.heartbeat"
    ):  # fmt: skip
        importlib.import_module(module)
    internal = {exposed_name(f) for f in INTERNAL.collect() if f.name.startswith(INTERNAL_PREFIX)}
    audit = AuditMetrics(0, "127.0.0.1")
    try:
        report = {"ok": True, "checks": {}, "counts": {"releases": 0, "ledger_entries": 0}}
        audit.record(report, 0.0)
        verdict = {family.name for family in audit.registry.collect()}
    finally:
        audit.close()
    shuffler = {exposed_name(f) for f in ShufflerMetrics().registry.collect()}
    return set(PUBLIC_METRICS) | internal | verdict | shuffler


def test_every_rule_file_is_listed_here() -> None:
    """A new file in rules/ (Prometheus loads them all) must come with its unit tests."""
    assert set(RULES.parent.glob("*.yml")) == set(RULE_FILES)
    assert set(RULE_TESTS.parent.glob("*.yml")) == set(RULE_FILES.values())


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_checks_the_rules(path: Path) -> None:
    run([ensure_prometheus()["promtool"], "check", "rules", str(path)])


@pytest.mark.parametrize("path", RULE_FILES.values(), ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path) -> None:
    run([ensure_prometheus()["promtool"], "test", "rules", str(path)])


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_fires_and_stays_silent_in_a_unit_test(path: Path) -> None:
    """Each rule file's alerts, in its own unit tests (which load that file alone)."""
    alerts = {rule["alert"] for rule in rules_of(path)}
    tests = RULE_FILES[path]
    unit_tests = yaml.safe_load(tests.read_text())
    assert [(tests.parent / f).resolve() for f in unit_tests["rule_files"]] == [path]
    cases = [case for test in unit_tests["tests"] for case in test.get("alert_rule_test", ())]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert not alerts - firing, f"no unit-test case where these fire: {sorted(alerts - firing)}"
    assert not alerts - silent, f"no unit-test case where these stay silent: {alerts - silent}"
    assert firing | silent <= alerts, f"tests of unknown alerts: {(firing | silent) - alerts}"


def test_every_rule_is_an_alert_with_a_severity_and_a_runbook(rules: list[dict[str, Any]]) -> None:
    for rule in rules:
        assert rule.get("alert", "").startswith("Privstream"), rule
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert set(rule["annotations"]) == ANNOTATIONS, rule["alert"]
        assert all(text.strip() for text in rule["annotations"].values()), rule["alert"]


def test_rules_read_only_privstream_metrics(rules: list[dict[str, Any]]) -> None:
    allowed = exported_metrics() | {"up"}
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']} reads no metric"
        assert names <= allowed, f"{rule['alert']} reads unknown metrics {names - allowed}"


def test_mechanism_names_follow_the_code(rules: list[dict[str, Any]]) -> None:
    kinds = (PERSONAL, POPULATION_DIVISION, PERSONAL | POPULATION_DIVISION)
    listed = [
        frozenset(match.group(1).split("|"))
        for rule in rules
        for match in _MECHANISM_MATCHER.finditer(rule["expr"])
    ]
    assert {PERSONAL, POPULATION_DIVISION} <= set(listed), listed
    for names in listed:
        assert names in kinds, (
            f"{sorted(names)} is neither {sorted(PERSONAL)}, {sorted(POPULATION_DIVISION)} nor "
            "both: update the rules"
        )


def test_amtool_checks_the_alertmanager_config() -> None:
    run([ensure_alertmanager()["amtool"], "check-config", str(ALERTMANAGER)])


@pytest.mark.parametrize(("severity", "receiver"), [("page", "pager"), ("ticket", "tickets")])
def test_only_pages_reach_the_pager(severity: str, receiver: str) -> None:
    command = [ensure_alertmanager()["amtool"], "config", "routes", "test"]
    labels = [f"severity={severity}", "alertname=PrivstreamHalted", "stream=s", "mechanism=LBU"]
    routed = run([*command, f"--config.file={ALERTMANAGER}", *labels])
    assert routed.split() == [receiver]


def test_inhibitions_name_existing_alerts(alerts: set[str]) -> None:
    config = yaml.safe_load(ALERTMANAGER.read_text())
    named = {
        match.group(1)
        for rule in config["inhibit_rules"]
        for matcher in (*rule["source_matchers"], *rule["target_matchers"])
        if (match := _ALERTNAME_MATCHER.match(matcher))
    }
    assert {"PrivstreamHalted", "PrivstreamStalled", "PrivstreamFlowDown"} <= named
    assert named <= alerts, f"inhibitions name unknown alerts: {named - alerts}"


_SHUFFLER_LABEL = re.compile(r'\b(policy|reason)\s*[=!]~?\s*"([^"]*)"')


def test_shuffler_rules_read_the_shuffler_and_name_what_it_exports() -> None:
    """The shuffler's rules read only its own metrics (or ``up`` of its job), and every policy
    and refusal reason they name is one the shuffler exports from the start (a misspelt one
    would match nothing, and the rule would never fire)."""
    from privstream.runtime.shuffler_metrics import BATCH_POLICIES, REFUSALS

    own = {exposed_name(f) for f in ShufflerMetrics().registry.collect()}
    exported = {"policy": set(BATCH_POLICIES), "reason": set(REFUSALS)}
    named: set[str] = set()
    for rule in rules_of(SHUFFLER_RULES):
        expr = rule["expr"]
        assert metric_names(expr) <= own | {"up"}, rule["alert"]
        assert "up" not in metric_names(expr) or 'up{job="privstream-shuffler"}' in expr
        for label, values in _SHUFFLER_LABEL.findall(expr):
            assert set(values.split("|")) <= exported[label], (rule["alert"], values)
            named |= set(values.split("|"))
    assert {"drop", "below_min", "unauthenticated_marker"} <= named
    exprs = {rule["alert"]: " ".join(rule["expr"].split()) for rule in rules_of(SHUFFLER_RULES)}
    assert exprs["PrivstreamShufflerBatchBelowMinimum"] == (
        'increase(privstream_shuffler_batches_total{policy=~"drop|below_min"}[15m]) > 0'
    )
