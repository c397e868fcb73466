"""The audit's report for a person: what was checked, each check's verdict, the first problems
with their ids, and the budget found against the budget expected (``privstream audit``'s
default output; ``--json`` prints the report itself).

The summary is built from the JSON report alone, so it says nothing the report does not.
"""

from __future__ import annotations

from typing import Any

SHOWN_PROBLEMS = 10
"""Problems listed (the report keeps the first ``PROBLEM_LIMIT``; each check counts all)."""

CHECKED = {
    "well_formed": "every line is a release or ledger entry of the schema",
    "complete_slots": "no slot missing, nothing after a halt or inside a recorded gap",
    "unique_payloads": "no release id published with two payloads",
    "window_budget": "no window of a mechanism, class or user over its budget",
    "declared_spend": "the declared spends match their recomputation",
    "population_accountant": "no window over the population's budget",
    "no_user_ids": "no raw user id in any output",
    "secure_noise": "no output drew its noise from a public seed",
    "not_evaluation": "no output of an evaluation (--compare)",
    "repeated_publications": "approximations and nullifications repeat their publication",
    "stated_guarantee": "releases state their ledger entry's guarantee",
    "expected_budget": "every guarantee and all streams together within the expected budget",
    "flow_file": "the streams and shares of the flow file",
    "something_read": "something was read",
}
"""What each check verifies, in a line (the report's ``detail`` says what it found)."""


def _number(value: float) -> str:
    """A budget for a person: a few significant digits, and 0 for a rounding residue."""
    return "0" if abs(value) < 1e-12 else f"{value:.4g}"


def _many(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _budget_lines(budget: dict[str, Any]) -> list[str]:
    """The budget found (composed as ε at the expected δ, and each stated guarantee in its
    measure's own units) against the budget expected."""
    expected, found = budget.get("expected", {}), budget.get("found", {})
    epsilon, delta = expected.get("epsilon"), expected.get("delta")
    at = "" if delta is None else f" at δ={delta:g}"
    want = "not given (--max-epsilon or --config)" if epsilon is None else f"ε ≤ {epsilon:g}{at}"
    spent = found.get("epsilon")
    lines = [f"budget expected: {want}"]
    if spent is not None:
        lines.append(
            f"budget found:    ε = {_number(spent)}{at} (all streams composed, the worst window)"
        )
    lines += [f"  stated: {text}" for text in budget.get("guarantees", [])]
    return lines


def _check_lines(checks: dict[str, dict[str, Any]]) -> list[str]:
    """Per check: its verdict, name and what it verifies, then what it found."""
    lines = []
    for name, check in checks.items():
        verdict = "ok  " if check["ok"] else "FAIL"
        lines.append(f"  {verdict} {name}: {CHECKED.get(name, name)}")
        lines.append(f"       {check['detail']}")
    return lines


def _problem_lines(report: dict[str, Any], failed: int) -> list[str]:
    problems = report.get("problems", [])
    if not problems:
        return []
    more = "" if len(problems) <= SHOWN_PROBLEMS else f" (the first {SHOWN_PROBLEMS})"
    lines = [f"problems{more}:"]
    for problem in problems[:SHOWN_PROBLEMS]:
        ident = f" {problem['id']}" if problem.get("id") else ""
        lines.append(f"  {problem['kind']}{ident}: {problem['detail']}")
    if failed and len(problems) > SHOWN_PROBLEMS:
        lines.append("  … the rest with --json (each check counts all of its own)")
    return lines


def summary(report: dict[str, Any]) -> str:
    """``report`` (``privstream.audit.main.audit``) as text for a person."""
    checks: dict[str, dict[str, Any]] = report["checks"]
    failed = [name for name, check in checks.items() if not check["ok"]]
    counts = report.get("counts", {})
    verdict = f"FAILED: {', '.join(failed)}" if failed else "ok"
    lines = [
        f"privstream audit: {verdict} ({len(checks) - len(failed)} of {len(checks)} checks hold)",
        f"read: {counts.get('releases', 0):,} releases and {counts.get('ledger_entries', 0):,} "
        f"ledger entries; {_many(counts.get('streams', 0), 'stream')}, "
        f"{_many(counts.get('mechanisms', 0), 'mechanism')}",
        *_budget_lines(report.get("budget", {})),
        "checks:",
        *_check_lines(checks),
        *_problem_lines(report, len(failed)),
    ]
    lines += [f"note: {note}" for note in report.get("notes", [])]
    return "\n".join(lines)
