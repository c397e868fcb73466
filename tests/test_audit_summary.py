"""``privstream audit``'s output for a person (``privstream.audit.summary``) and for scripts
(``--json``), and its progress line (issue 20, "Watching the spend")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privstream.audit.main import CHECKS, Collector, progress_line
from privstream.audit.summary import CHECKED, SHOWN_PROBLEMS, summary
from privstream.cli.commands import main
from tests.test_audit import BUDGET, EPSILON, SLOTS, USERS, Run, ldp, secure

__all__ = ["ldp", "secure"]  # the module fixtures of tests/test_audit.py


def _files(tmp_path: Path, run: Run) -> list[str]:
    releases, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    releases.write_text("\n".join(run.releases) + "\n")
    ledger.write_text("\n".join(run.ledger) + "\n")
    return ["audit", "--releases", str(releases), "--ledger", str(ledger), "--no-progress",
            "--population", str(USERS), *BUDGET]  # fmt: skip


def test_json_prints_the_report_and_the_default_is_its_summary(
    tmp_path: Path, secure: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _files(tmp_path, secure)
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main([*argv, "--json", str(tmp_path / "report.json")]) == 0
    text = capsys.readouterr().out
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert main(argv) == 0 and capsys.readouterr().out == text  # --json FILE: same summary
    lines = text.splitlines()
    assert lines[0] == "privstream audit: ok (13 of 13 checks hold)"
    assert (
        lines[1]
        == f"read: {7 * SLOTS} releases and {7 * SLOTS} ledger entries; 1 stream, 7 mechanisms"
    )
    assert lines[2] == f"budget expected: ε ≤ {EPSILON:g}"
    found = report["budget"]["found"]["epsilon"]
    assert 0.5 < found <= EPSILON * (1 + 1e-9)  # the seven share ε: the worst window's spend
    assert f"at most ε={found:.6g} of" in report["checks"]["expected_budget"]["detail"]
    assert lines[3].startswith(f"budget found:    ε = {found:.4g} ")
    assert report["budget"]["expected"] == {"epsilon": EPSILON, "delta": None}
    assert report["budget"]["guarantees"] == ["pure ε=0.142857 over window w=10 (ldp)"]
    assert "  stated: pure ε=0.142857 over window w=10 (ldp)" in lines
    for name, check in report["checks"].items():  # each check: verdict, what, what it found
        at = lines.index(f"  ok   {name}: {CHECKED[name]}")
        assert lines[at + 1] == f"       {check['detail']}"
    assert "problems" not in text and "{" not in text


def test_the_summary_of_a_failed_audit_names_the_check_and_the_first_problems(
    tmp_path: Path, ldp: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_files(tmp_path, ldp), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert main(_files(tmp_path, ldp)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "privstream audit: FAILED: secure_noise (12 of 13 checks hold)"
    at = lines.index(f"  FAIL secure_noise: {CHECKED['secure_noise']}")
    assert (
        lines[at + 1] == f"       {2 * 7 * SLOTS} releases and ledger entries marked insecure_seed"
    )
    problems = report["problems"]
    assert len(problems) == 7  # one per mechanism, with its first release id
    at = lines.index("problems:")
    assert lines[at + 1 : at + 8] == [f"  {p['kind']} {p['id']}: {p['detail']}" for p in problems]
    assert lines[at + 1].startswith("  insecure_seed_output sin/LBU/1: noise from a public seed")
    many = {**report, "problems": problems * 3}  # more than the summary lists
    lines = summary(many).splitlines()
    at = lines.index(f"problems (the first {SHOWN_PROBLEMS}):")
    assert len([x for x in lines[at + 1 :] if x.startswith("  insecure_seed_output ")]) == 10
    assert lines[at + 1 + SHOWN_PROBLEMS].startswith("  … the rest with --json")


def test_the_summary_rounds_budgets_for_people() -> None:
    report = {
        "checks": {"expected_budget": {"ok": True, "count": 0, "detail": "d"}},
        "counts": {"releases": 1, "ledger_entries": 1, "streams": 2, "mechanisms": 1},
        "budget": {"expected": {"epsilon": 1.0, "delta": 1e-5},
                   "found": {"epsilon": 1.735e-18}, "guarantees": []},
        "problems": [], "notes": ["a note"],
    }  # fmt: skip
    lines = summary(report).splitlines()
    assert lines[1] == "read: 1 releases and 1 ledger entries; 2 streams, 1 mechanism"
    assert lines[2] == "budget expected: ε ≤ 1 at δ=1e-05"
    assert lines[3].startswith("budget found:    ε = 0 at δ=1e-05 ")
    report["budget"]["found"]["epsilon"] = 0.123456789
    assert "ε = 0.1235 at" in summary(report)
    report["budget"] = {"expected": {"epsilon": None, "delta": None}, "found": {"epsilon": None}}
    lines = summary(report).splitlines()
    assert lines[2] == "budget expected: not given (--max-epsilon or --config)"
    assert lines[3] == "checks:" and lines[-1] == "note: a note"


def test_every_check_says_what_it_verifies() -> None:
    assert set(CHECKED) == set(CHECKS)


def test_the_progress_line_never_reports_zero_lines_read() -> None:
    collector = Collector()
    assert progress_line(collector, 4.2) == (
        "audit: nothing read yet after 4 s, waiting for the first line"
    )
    collector.take("release", [b"{}", b"{}", b"{}"])  # pending: below the batch, not processed
    assert collector.lines == {"release": 0, "ledger": 0}
    assert progress_line(collector, 1.0) == "audit: read 3 release and 0 ledger lines (3/s)"
