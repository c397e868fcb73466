"""Alerts that reach someone: a real flow driven into a halted stream, the project's alert rules
(``deploy/prometheus/rules``) evaluated by a real Prometheus, a real Alertmanager, and the
notification arriving at a webhook the test serves — with its labels.

The fault is injected with ``tests.integration.faulty_flow``: ``privstream run`` with one more
LDP-IDS mechanism, ``LBU_halts``, whose step fails at slot 5, beside a healthy LBU.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from privstream.connectors.broker import free_port
from privstream.connectors.kafka import KafkaSettings

from .alerting import AlertmanagerServer, WebhookReceiver, webhook_config
from .conftest import Topics, cli_env, run_cli
from .prometheus import FlowProcess, PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "privstream.rules.yml"
HALTED = "PrivstreamHalted"
USERS, SLOTS, HALT_AT = 1000, 12, 5


def test_a_halted_stream_pages_through_alertmanager(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--users", str(USERS), "--slots", str(SLOTS), "--no-progress",
    )  # fmt: skip
    command = [
        sys.executable, "-m", "tests.integration.faulty_flow", "run", "ldp-ids", "--dataset", "sin",
        "--mechanism", "LBU,LBU_halts", "--budget-split", "equal", "--users", str(USERS),
        "--window", "4", "--no-progress", "--secret-file", str(secret_file),
        *topics.run_flags(kafka),
    ]  # fmt: skip
    env = cli_env(PYTHONPATH=str(ROOT), PRIVSTREAM_TEST_HALT_AT=str(HALT_AT))
    with (
        WebhookReceiver() as webhook,
        AlertmanagerServer(webhook_config(webhook.url), tmp_path / "alertmanager") as manager,
        FlowProcess(command, free_port(), tmp_path, env) as flow,
        PrometheusServer(
            [f"127.0.0.1:{flow.metrics_port}"], tmp_path / "prometheus",
            rule_files=[RULES], alertmanagers=[manager.address],
        ) as prom,
    ):  # fmt: skip
        halted = 'privstream_halted{mechanism="LBU_halts",stream="sin"} 1.0'
        flow.wait_metrics(lambda text: halted in text, "the halted mechanism", 120)
        halted_at = time.time()
        alert, received = webhook.wait_for(HALTED, timeout=120)
        delivery = received - halted_at
        labels = alert["labels"]
        assert labels["stream"] == "sin" and labels["mechanism"] == "LBU_halts", labels
        assert labels["severity"] == "page" and labels["job"] == "privstream", labels
        assert alert["annotations"]["summary"] and alert["annotations"]["runbook"], alert
        # the healthy mechanism never pages, and a halt by error is no privacy violation
        paged = [
            a["labels"] for n in webhook.notifications for a in n.body["alerts"]
            if a["labels"].get("severity") == "page"
        ]  # fmt: skip
        assert {(p["alertname"], p.get("mechanism")) for p in paged} == {(HALTED, "LBU_halts")}
        assert [s.value for s in prom.query("privstream_privacy_violations_total")] == [0.0, 0.0]
        (tmp_path / "delivery.json").write_text(json.dumps({"seconds": delivery}))
        print(f"{HALTED} delivered {delivery:.1f} s after the halt was exposed")
        assert delivery < 60, delivery
