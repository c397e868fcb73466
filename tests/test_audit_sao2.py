"""``privstream audit`` on SaO2's outputs: an honest run over three horizons (the third refused:
ε_life = 2ε) passes, and each edit of its lifetime ledger fails with a finding that names it —
a charge at a slot that is not an enrolling horizon start, a lifetime spend below what the
entries force or above what they allow, a stated central ε_c that is not Lemma 3.4's, enrolled
users that are not the levels' sum, and a spend over ε_life."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main
from tests.test_audit import Run, audit, dumps, failed

USERS, T, SLOTS = 600, 4, 12
EXPECTED = ("--allow-insecure-seed", "--max-epsilon", "2")


@pytest.fixture(scope="module")
def sao2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    directory = tmp_path_factory.mktemp("sao2")
    out, ledger = directory / "r.jsonl", directory / "l.jsonl"
    argv = ["run", "sao2", "--dataset", "trajectory", "--binary", "6", "--users", str(USERS),
            "--slots", str(SLOTS), "--window", str(T), "--epsilon", "2", "--horizons",
            "2", "--max-changes", "4", "--insecure-seed", "1", "--no-progress", "--out",
            str(out), "--ledger-out", str(ledger)]  # fmt: skip
    assert main(argv) == 0
    return Run(out.read_text().splitlines(), ledger.read_text().splitlines())


def change(ledger: list[str], slot: int, edit: Callable[[dict[str, Any]], None]) -> list[str]:
    records = [json.loads(line) for line in ledger]
    edit(next(r for r in records if r["slot"] == slot))
    return dumps(records)


def findings(report: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in report["problems"]:
        out.setdefault(p["kind"], []).append(p["detail"])
    return out


def test_an_honest_sao2_run_passes(tmp_path: Path, sao2: Run) -> None:
    status, report = audit(tmp_path, sao2.releases, sao2.ledger, expect=EXPECTED)
    assert status == 0, report["problems"]
    entries = sao2.records("ledger")
    assert {e["division"] for e in entries} == {"sao2-lifetime"}
    assert [e["classes"][0]["charged"] for e in entries] == [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert entries[-1]["details"]["refused"] == USERS
    first = entries[0]["details"]  # ε = 1 per horizon: n_min = 562 > n_h = 200 at each level
    assert (first["n_min"], first["small_levels"], first["n_h"]) == (562, 3, [200, 200, 200])
    assert first["shuffle"] == "simulated" and first["accountant"] == "classical-7.1"


@pytest.mark.parametrize(
    ("slot", "edit", "why"),
    [
        (3, lambda e: e["classes"][0].update(charged=1.0),
         "charged 1.0, want 0.0 at this slot"),
        (6, lambda e: (e["classes"][0].update(spent=1.0), e["details"].update(lifetime_spent=1.0)),
         None),
        (2, lambda e: (e["classes"][0].update(spent=2.0), e["details"].update(lifetime_spent=2.0)),
         "lifetime spend 2.0 passes 1 enrolled horizons"),
        (5, lambda e: e["details"]["epsilon_central"].__setitem__(0, 0.1),
         "level 0: ε_c 0.1 is not Lemma 3.4's"),
        (1, lambda e: e["details"].update(enrolled=USERS - 1), "enrolled 599 but the levels hold 600"),
        (7, lambda e: e["details"].update(s=5), "parameters"),
        (8, lambda e: e["details"].update(n_min=10), "n_min 10 is not"),
        (8, lambda e: e["details"].update(small_levels=2), "small_levels 2 but"),
        (2, lambda e: e["details"]["subgroup_cdf"].__setitem__(1, "0" * 16),
         "level 1: subgroup CDF digest"),
    ],
)  # fmt: skip
def test_each_edit_of_the_lifetime_ledger_is_named(
    tmp_path: Path, sao2: Run, slot: int, edit: Callable[[dict[str, Any]], None], why: str | None
) -> None:
    status, report = audit(tmp_path, sao2.releases, change(sao2.ledger, slot, edit),
                           expect=EXPECTED)  # fmt: skip
    assert status == 1 and "declared_spend" in failed(report)
    found = findings(report)
    if why is None:  # a spend below the two enrolled horizons the entries force
        assert any("claims" in d or "recomput" in d for d in found["declared_mismatch"]), found
    else:
        assert any(why in d for d in found["division_inconsistent"]), found


def test_a_ledger_spending_past_the_lifetime_fails(tmp_path: Path, sao2: Run) -> None:
    """Every user enrolled at the third horizon's start too: 3ε > ε_life is over budget."""
    records = [json.loads(line) for line in sao2.ledger]
    first = records[0]
    for e in records[2 * T :]:
        e["details"].update(enrolled=USERS, refused=0, n_h=first["details"]["n_h"],
                            epsilon_central=first["details"]["epsilon_central"],
                            lifetime_spent=3.0)  # fmt: skip
        e["classes"][0].update(spent=3.0, charged=1.0 if e["slot"] == 2 * T + 1 else 0.0)
    status, report = audit(tmp_path, sao2.releases, dumps(records), expect=EXPECTED)
    assert status == 1 and "window_budget" in failed(report)
    assert any("sao2-lifetime division: recomputed spend 3" in d
               for d in findings(report)["window_over_budget"])  # fmt: skip
