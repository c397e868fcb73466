"""``deploy/prometheus/local.yml``, the configuration of docs/operations.md's "Monitoring on one
machine", against Debian's Prometheus as is: ``promtool check config`` accepts it (the
Kubernetes one, ``prometheus.yml``, needs service discovery Debian's build lacks), Prometheus
starts on it with the alert rules loaded and the walkthrough's flow as its target, and the
walkthrough's commands name the same ports and files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from ..integration.prometheus import PrometheusServer, ensure_prometheus
from .test_alert_rules import RULE_FILES, run

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "deploy" / "prometheus" / "local.yml"
OPERATIONS = ROOT / "docs" / "operations.md"


def _walkthrough() -> list[list[str]]:
    """The shell commands of docs/operations.md's "Monitoring on one machine", as argv."""
    text = OPERATIONS.read_text()
    section = text[text.index("## Monitoring on one machine") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = [x for block in blocks for x in block.splitlines() if x and not x.startswith("#")]
    return [shlex.split(line) for line in lines]


def test_promtool_accepts_the_local_configuration_and_its_rules() -> None:
    out = run([ensure_prometheus()["promtool"], "check", "config", str(LOCAL)])
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in out
    for path in RULE_FILES:
        count = sum(len(g["rules"]) for g in yaml.safe_load(path.read_text())["groups"])
        assert f"Checking {path}\n  SUCCESS: {count} rules found" in out


def _rules() -> set[str]:
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    return {rule.get("alert") or rule["record"] for group in groups for rule in group["rules"]}


def test_the_walkthrough_uses_the_local_configuration_as_is() -> None:
    config = yaml.safe_load(LOCAL.read_text())
    (job,) = config["scrape_configs"]  # the optional jobs are commented out
    assert job["job_name"] == "privstream"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:19100"]}]
    assert "alerting" not in config and config["rule_files"] == ["rules/*.yml"]
    commands = _walkthrough()
    (flow,) = [c for c in commands if c[:2] == ["privstream", "run"]]
    assert flow[flow.index("--metrics-port") + 1] == "19100"
    (prometheus,) = [c for c in commands if c[0] == "prometheus"]
    assert "--config.file=deploy/prometheus/local.yml" in prometheus
    assert "--web.user-assets=deploy/prometheus/page" in prometheus
    assert "--web.listen-address=127.0.0.1:19090" in prometheus
    (broker,) = [c for c in commands if c[:2] == ["privstream", "broker"]]
    assert broker[broker.index("--port") + 1] == "19092"
    assert "http://127.0.0.1:19090/user/privacy.html" in OPERATIONS.read_text()


def test_prometheus_runs_the_local_configuration_with_the_rules(tmp_path: Path) -> None:
    """Started on ``local.yml`` unchanged (on a free port): every alert rule loaded, the flow's
    port its one target."""
    with PrometheusServer([], tmp_path, config=LOCAL) as prom:
        groups = prom.api("rules")["groups"]
        loaded = {rule["name"] for group in groups for rule in group["rules"]}
        assert loaded == _rules() and len(loaded) >= 20
        prom.wait_until(lambda: bool(prom.api("targets")["activeTargets"]), "its target", 30)
        targets = prom.api("targets")["activeTargets"]
        assert [(t["labels"]["job"], t["labels"]["instance"]) for t in targets] == [
            ("privstream", "127.0.0.1:19100")
        ]
