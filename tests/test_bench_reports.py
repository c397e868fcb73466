"""``privstream bench reports`` end to end at tiny sizes (embedded broker, the gateway as its
own process): every section runs and reports its fields, and the counts add up. No timing
assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privstream.cli import commands as cli
from privstream.experiments.reports_bench import FLEET_ORACLES, ORACLES, format_reports

ARGV = ["bench", "reports", "--users", "300", "--slots", "1", "--kafka-reports", "500",
        "--repeats", "1", "--gateway-reports", "40", "--gateway-batched", "200",
        "--gateway-batch", "50", "--connections", "4", "--fleet-devices", "60",
        "--file-devices", "10", "--fleet-requests", "2"]  # fmt: skip


def test_bench_reports_runs_every_section_and_the_counts_add_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reports.json"
    assert cli.main([*ARGV, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["params"]["sizes"] == [300] and result["params"]["mechanism"] == "LBU"

    [row] = result["server_stage"]
    assert row["n"] == 300 and len(row["events"]["runs"]) == 1
    events = row["events"]["events_per_second"]
    assert events > 0 and row["events"]["parse_s"] > 0 and row["events"]["slotting_s"] > 0
    for oracle in ORACLES:
        r = row[oracle]
        assert r["reports_per_second"] == 300 / r["seconds"]
        assert r["ratio_to_events"] == r["reports_per_second"] / events
        assert r["cpu_ratio_to_events"] == row["events"]["cpu_s"] / r["cpu_s"]
        assert r["seconds"] == pytest.approx(r["open_s"] + r["reports_s"] + r["close_s"])
        assert set(r["us_per_report"]) == {"open", "reports", "close", "seconds", "cpu"}

    kafka = result["kafka"]
    assert (kafka["n"], kafka["oracle"], len(kafka["runs"])) == (500, "GRR", 1)
    for rate in ("write_per_second", "raw_read_per_second", "stage_per_second",
                 "stage_after_first_per_second"):  # fmt: skip
        assert kafka[rate] > 0

    gateway = result["gateway"]
    assert gateway["connections"] == 4 and gateway["accepted"] == gateway["on_topic"] == 240
    single, batched = gateway["modes"]
    assert (single["reports"], single["per_post"], single["posts"]) == (40, 1, 40)
    assert (batched["reports"], batched["per_post"], batched["posts"]) == (200, 50, 4)
    assert single["accepted"] == 40 and batched["accepted"] == 200
    assert batched["latency_ms_p99"] >= batched["latency_ms_p50"] > 0

    assert set(result["fleet"]["store_save_ms"]) == set(FLEET_ORACLES)
    for store, devices in (("memory", 60), ("file", 10)):
        assert set(result["fleet"][store]) == set(FLEET_ORACLES)
        for r in result["fleet"][store].values():
            assert (r["devices"], r["requests"]) == (devices, 2)
            assert r["devices_per_second"] == 2 * devices / r["seconds"]

    printed = capsys.readouterr().out
    assert printed.strip() == format_reports(result)
    assert "1. server stage" in printed and "4. the fleet" in printed
