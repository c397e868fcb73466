"""``privstream audit`` on DPI's outputs: an honest run passes, and each edit of its series
ledger (an index used twice, an ε_t that is not its index's series value, a lifetime spend
over ε, a ``spent`` claiming less than the series sum) fails with a finding that names it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main
from privstream.mechanisms.dpi_series import BudgetSeries
from tests.test_audit import Run, audit, dumps, failed

USERS, SLOTS, EPSILON = 2000, 12, 2.0
DPI_EXPECTED = ("--allow-insecure-seed", "--max-epsilon", str(EPSILON))
"""The honest runs' noise comes from a public seed; their lifetime budget is ε = 2."""


def dpi_run(directory: Path, *flags: str) -> Run:
    out, ledger = directory / "r.jsonl", directory / "l.jsonl"
    argv = ["run", "dpi", "--dataset", "synthetic", "--users", str(USERS), "--slots",
            str(SLOTS), "--epsilon", str(EPSILON), "--insecure-seed", "1", "--pool-size", "500",
            "--no-progress", "--out", str(out), "--ledger-out", str(ledger), *flags]  # fmt: skip
    assert main(argv) == 0
    return Run(out.read_text().splitlines(), ledger.read_text().splitlines())


@pytest.fixture(scope="module")
def dpi(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """DPI and its 0-DP baseline DPI-prior sharing ε equally (two keyed series of queries)."""
    return dpi_run(
        tmp_path_factory.mktemp("dpi"), "--mechanism", "DPI,DPI-prior", "--budget-split", "equal"
    )


def dpi_audit(tmp_path: Path, ledger: list[str], run: Run, *flags: str) -> tuple[int, Any]:
    return audit(tmp_path, run.releases, ledger, *flags, expect=DPI_EXPECTED)


def change(ledger: list[str], slot: int, edit: Callable[[dict[str, Any]], None]) -> list[str]:
    """``ledger`` with DPI's entry at ``slot`` changed by ``edit``."""
    records = [json.loads(line) for line in ledger]
    edit(next(r for r in records if r["mechanism"] == "DPI" and r["slot"] == slot))
    return dumps(records)


def series_of(entry: dict[str, Any]) -> BudgetSeries:
    p = entry["details"]["series"]
    return BudgetSeries(p["epsilon"], p["mu"], p["zeta"], p["delta_q"], p["eta_mode"],
                        p["allow_underspend"])  # fmt: skip


def entries(run: Run, mechanism: str = "DPI") -> list[dict[str, Any]]:
    return [e for e in map(json.loads, run.ledger) if e["mechanism"] == mechanism]


def kinds(report: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in report["problems"]:
        out.setdefault(p["kind"], []).append(p["detail"])
    return out


def test_an_honest_dpi_run_passes(tmp_path: Path, dpi: Run) -> None:
    status, report = dpi_audit(tmp_path, dpi.ledger, dpi)
    assert status == 0, report["problems"]
    counts = report["counts"]
    assert counts["releases"] == 2 * SLOTS and counts["missing_slots"] == 0
    assert counts["ledger_entries"] == 2 * SLOTS
    mine = entries(dpi)
    assert {e["division"] for e in mine} == {"dpi-series"}
    assert {e["guarantee"]["scope"] for e in mine} == {"lifetime"}
    assert len({e["details"]["series_index"] for e in mine}) == SLOTS  # each element once
    spent = sum(series_of(e).epsilon_i(e["details"]["series_index"]) for e in mine)
    assert mine[-1]["classes"][0]["spent"] == pytest.approx(spent, rel=1e-12)
    assert 0 < spent < EPSILON / 2  # DPI's share


def test_a_lifetime_guarantee_over_the_expected_budget_fails(tmp_path: Path, dpi: Run) -> None:
    """The stated lifetime ε (1 per mechanism) against --max-epsilon: within 2, not within 0.5."""
    status, report = audit(tmp_path, dpi.releases, dpi.ledger,
                           expect=("--allow-insecure-seed", "--max-epsilon", "0.5"))  # fmt: skip
    assert status == 1 and failed(report) == {"expected_budget"}
    assert "guarantee_over_expected" in kinds(report)


def test_a_series_index_used_twice_fails(tmp_path: Path, dpi: Run) -> None:
    first = entries(dpi)[2]
    index, slot = first["details"]["series_index"], first["slot"]

    def reuse(e: dict[str, Any]) -> None:
        d, charge = e["details"], series_of(e).nominal_charge(index)
        d["series_index"], d["series_epsilon"], d["nominal_charge"] = index, charge, charge
        e["classes"][0]["charged"] = charge

    status, report = dpi_audit(tmp_path, change(dpi.ledger, 6, reuse), dpi)
    assert status == 1 and "declared_spend" in failed(report)
    assert (
        f"dpi-series division: series index {index} used twice (first at slot {slot})"
        in (kinds(report)["division_inconsistent"])
    )


@pytest.mark.parametrize("field", ["series_epsilon", "nominal_charge", "charged"])
def test_an_epsilon_t_not_the_series_value_fails(tmp_path: Path, dpi: Run, field: str) -> None:
    entry = entries(dpi)[4]
    index = entry["details"]["series_index"]
    right = series_of(entry).epsilon_i(index)

    def halve(e: dict[str, Any]) -> None:
        holder = e["classes"][0] if field == "charged" else e["details"]
        holder[field] = right / 2

    status, report = dpi_audit(tmp_path, change(dpi.ledger, 5, halve), dpi)
    assert status == 1 and failed(report) == {"declared_spend"}
    name = "classes[0].charged" if field == "charged" else field
    assert kinds(report) == {"division_inconsistent": [
        f"dpi-series division: {name} {right / 2!r} is not the series value {right!r} of index "
        f"{index}"
    ]}  # fmt: skip
    assert report["problems"][0]["id"] == "synthetic/DPI/5"


def test_a_lifetime_spend_over_epsilon_fails(tmp_path: Path, dpi: Run) -> None:
    """A ledger of the budget 1 drawn from a series of ε = 20 (stated in every entry, each
    entry spending the next element 1, 2, … exactly): the recomputed lifetime spend passes
    the budget at the first slot, and the series is named as not the budget's."""
    records = [json.loads(line) for line in dpi.ledger]
    mine = [r for r in records if r["mechanism"] == "DPI"]
    spent = 0.0
    for i, e in enumerate(mine, start=1):
        e["details"]["series"]["epsilon"] = 20.0
        charge = series_of(e).epsilon_i(i)
        spent += charge
        e["details"].update(series_index=i, series_epsilon=charge, nominal_charge=charge)
        e["details"]["nominal_spent"] = e["classes"][0]["spent"] = spent
        e["classes"][0]["charged"] = charge
    status, report = dpi_audit(tmp_path, dumps(records), dpi)
    assert status == 1 and {"window_budget", "declared_spend"} <= failed(report)
    found = kinds(report)
    assert found["window_over_budget"][0] == (
        f"dpi-series division: recomputed spend {series_of(mine[0]).epsilon_i(1):.12g} > "
        "budget 1 over the scope ending here"
    )
    assert found["division_inconsistent"][0] == (
        "dpi-series division: the series' epsilon 20.0 is not the budget 1.0 its sum must stay "
        "within"
    )
    assert report["counts"]["windows_over_budget"] == SLOTS


def test_a_spent_claiming_less_than_the_series_sum_fails(tmp_path: Path, dpi: Run) -> None:
    entry = entries(dpi)[-1]
    true = entry["classes"][0]["spent"]

    def claim_less(e: dict[str, Any]) -> None:
        e["classes"][0]["spent"] = e["details"]["nominal_spent"] = true / 2
        e["population_spent"] = true / 2

    status, report = dpi_audit(tmp_path, change(dpi.ledger, SLOTS, claim_less), dpi)
    assert status == 1 and "declared_spend" in failed(report)
    claims = kinds(report)["declared_mismatch"]
    assert f"dpi-series division: the entry claims {true / 2:.12g} but its charges " \
           f"recompute to {true:.12g}" in claims  # fmt: skip


def test_dpi_paper_outputs_are_evaluation(tmp_path: Path) -> None:
    run = dpi_run(tmp_path, "--mechanism", "DPI-paper")
    status, report = dpi_audit(tmp_path, run.ledger, run)
    assert status == 1 and failed(report) == {"not_evaluation"}
    assert report["counts"]["evaluation_outputs"] == 2 * SLOTS
    status, report = dpi_audit(tmp_path, run.ledger, run, "--allow-evaluation")
    assert status == 0, report["problems"]


def test_a_query_release_is_held_to_its_ledger_entry(tmp_path: Path, dpi: Run) -> None:
    """Keyed releases (``stream/DPI/slot/query``) are compared with their mechanism's entry:
    a release stating another ε fails ``stated_guarantee``; DPI-prior's publications charge
    nothing (0-DP, series index 0) and are no ``publish_uncharged``."""
    records = [json.loads(line) for line in dpi.releases]
    target = next(r for r in records if r["mechanism"] == "DPI" and r["slot"] == 4)
    target["guarantee"]["epsilon"] = 0.5
    status, report = audit(tmp_path, dumps(records), dpi.ledger, expect=DPI_EXPECTED)
    assert status == 1 and failed(report) == {"stated_guarantee"}
    assert report["problems"] == [{
        "kind": "guarantee_mismatch", "id": target["release_id"],
        "detail": "the release states pure ε=0.5 over lifetime (cdp) but its ledger entry "
                  "pure ε=1 over lifetime (cdp)",
    }]  # fmt: skip
    assert target["release_id"] == f"synthetic/DPI/4/{target['key']['query']}"
    prior = entries(dpi, "DPI-prior")
    assert {e["classes"][0]["charged"] for e in prior} == {0.0}


def test_a_slot_without_its_query_release_is_missing(tmp_path: Path, dpi: Run) -> None:
    """DPI samples one query per slot: a slot is complete with any one query's release, and
    missing (for the mechanism) without one."""
    kept = [line for line in dpi.releases if '"synthetic/DPI/7/' not in line]
    assert len(kept) == len(dpi.releases) - 1
    status, report = audit(tmp_path, kept, dpi.ledger, expect=DPI_EXPECTED)
    assert status == 1 and failed(report) == {"complete_slots"}
    assert report["problems"] == [
        {"kind": "missing_slot", "id": "synthetic/DPI/7", "detail": "release missing"}
    ]
