"""The worked example's output axis: ``example_outputs`` (``site/``) declares an internal extra
output ``audit`` and a release-key part ``query`` (one release per query per slot, DPI's shape)
and runs through ``privstream run --audit-out``, a flow file, the bench harness, the conformance
checks and ``privstream audit`` with no edit to privstream."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from privstream.cli import main
from privstream.families import registry
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension import surfaces

USERS, SLOTS, W, EPS, D = 2000, 6, 5, 1.0, 3
QUERIES = [f"cat-{i}" for i in range(D)]
AUDIT = ["--allow-insecure-seed", "--max-epsilon", str(EPS), "--population", str(USERS)]


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "example-outputs", "--dataset", "lns", "--domain", str(D), "--users",
            str(USERS), "--slots", str(SLOTS), "--epsilon", str(EPS), "--window", str(W),
            "--insecure-seed", "3", "--no-progress", "--out", str(tmp_path / "r.jsonl"),
            "--ledger-out", str(tmp_path / "l.jsonl"), *extra]  # fmt: skip


def _check_run(tmp_path: Path) -> None:
    releases, audit = surfaces.lines(tmp_path / "r.jsonl"), surfaces.lines(tmp_path / "a.jsonl")
    expected = [(t, q) for t in range(1, SLOTS + 1) for q in QUERIES]
    assert [(r["slot"], r["key"]["query"]) for r in releases] == expected
    assert [r["release_id"] for r in releases[:3]] == [f"lns/LBUQ/1/{q}" for q in QUERIES]
    assert all("output" not in r for r in releases)  # the internal output never joins them
    for t in range(1, SLOTS + 1):  # the three queries are one histogram's categories
        assert math.isclose(sum(r["estimate"][0] for r in releases if r["slot"] == t), 1.0)
    assert [a["slot"] for a in audit] == list(range(1, SLOTS + 1))
    assert audit[0] == {
        "schema": 3, "output": "audit", "release_id": "lns/LBUQ/1", "stream": "lns",
        "mechanism": "LBUQ", "slot": 1, "payload": {"strategy": "publish", "queries": D},
        "insecure_seed": True, "evaluation": False,
    }  # fmt: skip
    assert len(surfaces.lines(tmp_path / "l.jsonl")) == SLOTS  # one ledger entry per slot


def test_the_family_declares_its_output_and_key(external_site: dict[str, str]) -> None:
    family = registry.family("example-outputs")
    assert [(o.name, o.public) for o in family.outputs] == [("audit", False)]
    assert family.release_key == ("query",)
    with pytest.raises(ValueError, match="declares no output 'trace'"):
        family.output("trace")


def test_run_writes_the_output_in_process(external_site: dict[str, str], tmp_path: Path) -> None:
    assert main(_argv(tmp_path, "--audit-out", str(tmp_path / "a.jsonl"))) == 0
    _check_run(tmp_path)


def test_run_writes_the_output_in_a_subprocess(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    surfaces.run_subprocess(
        external_site, _argv(tmp_path, "--audit-out", str(tmp_path / "a.jsonl"))
    )
    _check_run(tmp_path)


def test_an_unrouted_output_is_written_nowhere(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    assert main(_argv(tmp_path)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl", "r.jsonl"]
    assert all("output" not in r for r in surfaces.lines(tmp_path / "r.jsonl"))


def test_a_family_without_the_output_has_no_flag(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(tmp_path, "--audit-out", str(tmp_path / "a.jsonl"))
    argv[1] = "ldp-ids"
    with pytest.raises(SystemExit):
        main([*argv, "--mechanism", "LBU"])
    assert "--audit-out" in capsys.readouterr().err


def _flow(tmp_path: Path, audit_topic: str, family: str = "example-outputs") -> Path:
    mechanism = "LBUQ" if family == "example-outputs" else "LBU"
    stream = {"name": "load", "family": family, "mechanisms": [mechanism], "domain": 3,
              "share": 1.0}  # fmt: skip
    return surfaces.flow_file(tmp_path, kafka={**surfaces.KAFKA, "audit_topic": audit_topic},
                     population={"users": 1000, "epsilon": 2.0, "window": 20},
                     streams=[stream])  # fmt: skip


def test_a_flow_file_routes_the_output_to_a_topic(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from privstream.flows.config import load
    from privstream.flows.streams import kafka_io

    flow = _flow(tmp_path, "audit")
    assert surfaces.config_check(flow, capsys)[0] == 0
    config = load(flow)
    assert config.kafka.extra_topics == {"audit": "audit"}
    assert kafka_io(config).extra_topics == {"audit": "audit"}
    assert "audit" in kafka_io(config).topics()
    # an internal output never shares the public release topic
    code, _, err = surfaces.config_check(_flow(tmp_path, "releases"), capsys)
    assert code == 2 and "each role needs its own topic" in err
    # a stream whose family declares no such output
    code, _, err = surfaces.config_check(_flow(tmp_path, "a", "ldp-ids"), capsys)
    assert code == 2 and "no stream's family declares the output 'audit'" in err


def test_the_bench_harness_runs_the_keyed_family(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    results = surfaces.bench(tmp_path, "example-outputs", "--users", "4000", "--slots", "20", "--window",
                    str(W), "--seeds", "2", "--no-progress")  # fmt: skip
    assert set(results) == {"LBUQ", "LPUQ"}
    # LBU's first query (category 0 of a binary histogram): mean |N(0, σ²)| = σ·√(2/π)
    expected = math.sqrt(FrequencyTask(2).variance(EPS / W, 4000)) * math.sqrt(2 / math.pi)
    assert abs(results["LBUQ"]["mae"] - expected) < 0.35 * expected
    assert results["LPUQ"]["mae"] < results["LBUQ"]["mae"]


def test_the_conformance_checks_run_the_keyed_family(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-outputs", flows=False, skips=True)
    assert len(ran) >= 2 * 5


def _audit(tmp_path: Path, releases: Path) -> dict[str, Any]:
    report = tmp_path / "audit.json"
    main(["audit", "--releases", str(releases), "--ledger", str(tmp_path / "l.jsonl"),
          *AUDIT, "--json", str(report), "--no-progress"])  # fmt: skip
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def test_the_audit_reads_keyed_releases(external_site: dict[str, str], tmp_path: Path) -> None:
    assert main(_argv(tmp_path)) == 0
    clean = _audit(tmp_path, tmp_path / "r.jsonl")
    assert clean["ok"], clean["problems"]
    assert clean["counts"]["releases"] == SLOTS * D and clean["counts"]["mechanisms"] == 1
    assert clean["counts"]["duplicates"] == clean["counts"]["missing_slots"] == 0
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"lns/LBUQ/3/cat-1"' not in line]
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([*kept, lines[0]]) + "\n")  # one query lost, one replayed
    report = _audit(tmp_path, damaged)
    assert not report["ok"]
    counts = report["counts"]
    assert (counts["missing_slots"], counts["duplicates"], counts["conflicting_duplicates"]) == (
        1, 1, 0
    )  # fmt: skip
    assert report["problems"] == [
        {"kind": "missing_slot", "id": "lns/LBUQ/3/cat-1", "detail": "release missing"}
    ]
