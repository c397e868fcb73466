"""``privstream audit`` over real flow outputs, and one test per kind of defect it must catch."""

from __future__ import annotations

import functools
import json
import math
import re
import secrets
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bytewax.testing import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.audit.checks import window_sums
from privstream.audit.main import CHECKS
from privstream.cli.commands import main
from privstream.flows import dataflow, ldp_ids, personalized

LDP = "LBU,LSP,LPU,LBD,LBA,LPD,LPA"
USERS, SLOTS, WINDOW, EPSILON = 1000, 40, 10, 1.0
PERSONALIZED = "PBD,PBA,Uniform,Sample"
P_USERS, P_SLOTS = 500, 150
ZERO = {
    "halted": 0, "missing_slots": 0, "duplicates": 0, "conflicting_duplicates": 0,
    "windows_over_budget": 0, "windows_over_users": 0, "population_over_budget": 0,
    "declared_mismatches": 0, "insecure_outputs": 0, "evaluation_outputs": 0,
    "unfaithful_repeats": 0, "stated_mismatches": 0, "over_expected_budget": 0,
}  # fmt: skip


@dataclass(frozen=True)
class Run:
    """A flow's outputs as JSON lines."""

    releases: list[str]
    ledger: list[str]

    def records(self, which: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in getattr(self, which)]


def run_flow(build: Callable[..., Any], directory: Path, **kwargs: Any) -> Run:
    """A flow's outputs; its noise from the public seed 1 unless ``secret`` is given."""
    out, ledger = directory / "releases.jsonl", directory / "ledger.jsonl"
    key = {"insecure_seed": 1} if "secret" not in kwargs else {}
    run_main(build(out=str(out), ledger_out=str(ledger), **key, **kwargs))
    return Run(out.read_text().splitlines(), ledger.read_text().splitlines())


def ldp_flow(directory: Path, mechanisms: str = LDP, **kwargs: Any) -> Run:
    setting = {"users": USERS, "slots": SLOTS, "epsilon": EPSILON, "window": WINDOW, **kwargs}
    return run_flow(ldp_ids.build, directory, dataset="sin", mechanisms=mechanisms, **setting)


@pytest.fixture(scope="module")
def ldp(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """All seven LDP-IDS mechanisms sharing ε equally."""
    return ldp_flow(tmp_path_factory.mktemp("ldp"), budget_split="equal")


@pytest.fixture(scope="module")
def pers(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Four personalized mechanisms sharing every class's ε equally (windows up to 120)."""
    return run_flow(
        personalized.build, tmp_path_factory.mktemp("pers"), dataset="sin",
        mechanisms=PERSONALIZED, users=P_USERS, slots=P_SLOTS, budget_split="equal",
    )  # fmt: skip


def dumps(records: list[dict[str, Any]]) -> list[str]:
    """Canonical JSON lines, as the flows write them."""
    return [json.dumps(r, separators=(",", ":")) for r in records]


EXPECTED = ("--allow-insecure-seed", "--max-epsilon", str(EPSILON), "--max-delta", "1e-5")
"""What these tests' honest runs are audited against: their noise comes from public seeds
(``run_flow``: expected, so allowed) and their population's budget is ε = 1 (δ = 10⁻⁵ for CGM)."""


def audit(
    tmp_path: Path,
    releases: list[str],
    ledger: list[str],
    *flags: str,
    expect: tuple[str, ...] = EXPECTED,
) -> tuple[int, dict[str, Any]]:
    """Run ``privstream audit`` on these lines; its exit status and JSON report."""
    paths = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    for path, lines in zip(paths, (releases, ledger), strict=True):
        path.write_text("".join(line + "\n" for line in lines))
    report = tmp_path / "report.json"
    status = main(
        ["audit", "--releases", str(paths[0]), "--ledger", str(paths[1]), "--json", str(report),
         "--no-progress", *expect, *flags]
    )  # fmt: skip
    return status, json.loads(report.read_text())


def failed(report: dict[str, Any]) -> set[str]:
    return {name for name, check in report["checks"].items() if not check["ok"]}


def edit(
    lines: list[str],
    where: Callable[[dict[str, Any]], bool],
    change: Callable[[dict[str, Any]], None],
) -> list[str]:
    """``lines`` with ``change`` applied to the records ``where`` selects (exactly one or more)."""
    records = [json.loads(line) for line in lines]
    hits = [r for r in records if where(r)]
    assert hits
    for record in hits:
        change(record)
    return dumps(records)


def at(mechanism: str, slot: int) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r["mechanism"] == mechanism and r["slot"] == slot


# -- real outputs pass ------------------------------------------------------------------------


def test_the_ldp_ids_flow_passes(tmp_path: Path, ldp: Run) -> None:
    status, report = audit(tmp_path, ldp.releases, ldp.ledger, "--population", str(USERS))
    assert status == 0 and report["ok"] and report["problems"] == [] and report["notes"] == []
    assert report["counts"] == {
        "releases": 7 * SLOTS, "ledger_entries": 7 * SLOTS, "streams": 1, "mechanisms": 7,
        "slots_expected": 7 * SLOTS, **ZERO,
    }  # fmt: skip
    assert set(report["checks"]) == {
        "well_formed", "complete_slots", "unique_payloads", "window_budget", "declared_spend",
        "population_accountant", "no_user_ids", "something_read", "secure_noise",
        "not_evaluation", "repeated_publications", "stated_guarantee", "expected_budget",
    }  # fmt: skip


ADAPTED = "LB-DSAT,LP-DSAT,LB-RescueDP,LP-RescueDP"


def test_the_adapted_stream_algorithms_pass(tmp_path: Path) -> None:
    """LB/LP-DSAT and LB/LP-RescueDP (issue 21) sharing ε equally, on a flow that publishes,
    approximates and (DSAT) skips: every window, spend and repeat checks out."""
    run = ldp_flow(tmp_path, ADAPTED, budget_split="equal")
    status, report = audit(tmp_path, run.releases, run.ledger, "--population", str(USERS))
    assert status == 0 and report["ok"] and report["problems"] == [], report["problems"]
    assert report["counts"] == {
        "releases": 4 * SLOTS, "ledger_entries": 4 * SLOTS, "streams": 1, "mechanisms": 4,
        "slots_expected": 4 * SLOTS, **ZERO,
    }  # fmt: skip
    strategies = {(r["mechanism"], r["strategy"]) for r in run.records("releases")}
    for name in ADAPTED.split(","):
        assert {(name, "publish"), (name, "approximate")} <= strategies


def test_the_personalized_flow_passes(tmp_path: Path, pers: Run) -> None:
    classes = {len(e["classes"]) for e in pers.records("ledger")}
    assert min(classes) > 1  # the spec's user types: several privacy classes per mechanism
    status, report = audit(tmp_path, pers.releases, pers.ledger)
    assert status == 0 and report["ok"] and report["problems"] == []
    assert report["counts"] == {
        "releases": 4 * P_SLOTS, "ledger_entries": 4 * P_SLOTS, "streams": 1, "mechanisms": 4,
        "slots_expected": 4 * P_SLOTS, **ZERO,
    }  # fmt: skip


def test_expect_slots_counts_a_lost_tail(tmp_path: Path, ldp: Run) -> None:
    """The last slots of one mechanism lost entirely are only visible against --expect-slots."""

    def keep(line: str) -> bool:
        record = json.loads(line)
        return not (record["mechanism"] == "LPD" and record["slot"] > SLOTS - 3)

    releases, ledger = list(filter(keep, ldp.releases)), list(filter(keep, ldp.ledger))
    assert audit(tmp_path, releases, ledger)[0] == 0
    status, report = audit(tmp_path, releases, ledger, "--expect-slots", str(SLOTS))
    assert status == 1 and failed(report) == {"complete_slots"}
    assert report["counts"]["missing_slots"] == 3
    assert report["counts"]["slots_expected"] == 7 * SLOTS


# -- each defect is caught ---------------------------------------------------------------------


def test_a_deleted_release_is_a_missing_slot(tmp_path: Path, ldp: Run) -> None:
    """(Issue 18 §3: the repeats of a deleted publication cannot be checked, so they fail
    ``repeated_publications`` too.)"""
    releases = [line for line in ldp.releases if '"release_id":"sin/LPA/17"' not in line]
    deleted = json.loads(next(x for x in ldp.releases if '"release_id":"sin/LPA/17"' in x))
    repeats = sum(
        r["source_slot"] == 17 and r["strategy"] != "publish"
        for r in ldp.records("releases") if r["mechanism"] == "LPA"
    )  # fmt: skip
    status, report = audit(tmp_path, releases, ldp.ledger)
    assert failed(report) == {"complete_slots"} | (
        {"repeated_publications"} if deleted["strategy"] == "publish" and repeats else set()
    )
    assert status == 1 and report["counts"]["missing_slots"] == 1
    assert report["counts"]["releases"] == 7 * SLOTS - 1
    assert report["problems"][0] == {
        "kind": "missing_slot",
        "id": "sin/LPA/17",
        "detail": "release missing",
    }


def test_a_halt_record_makes_the_later_slots_not_expected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LBA fails at slot 25: the operator halts it there (its last window spend keeps counting
    in the population accountant) and the others go on."""
    from privstream.mechanisms.ldp_ids import LBA

    advance = LBA._advance

    def failing(self: LBA, state: Any, slot: Any) -> Any:
        if slot.index == 25:
            raise RuntimeError("injected failure")
        return advance(self, state, slot)

    monkeypatch.setattr(LBA, "_advance", failing)
    run = ldp_flow(tmp_path, budget_split="equal")
    assert max(r["slot"] for r in run.records("releases") if r["mechanism"] == "LBA") == 24
    halts = [r for r in run.records("ledger") if r.get("kind") == "halt"]
    assert [(h["mechanism"], h["slot"]) for h in halts] == [("LBA", 25)]  # the flow's record
    expect = ("--expect-slots", str(SLOTS), "--population", str(USERS))
    status, report = audit(tmp_path, run.releases, run.ledger, *expect)
    assert status == 0, report["problems"]
    assert report["counts"] == {
        "releases": 6 * SLOTS + 24, "ledger_entries": 6 * SLOTS + 24, "streams": 1,
        "mechanisms": 7, "slots_expected": 6 * SLOTS + 24, **ZERO, "halted": 1,
    }  # fmt: skip
    entries = [line for line in run.ledger if '"kind":"halt"' not in line]
    status, report = audit(tmp_path, run.releases, entries, *expect)
    assert status == 1 and failed(report) == {"complete_slots"}
    assert report["counts"]["missing_slots"] == SLOTS - 24
    assert report["problems"][0] == {
        "kind": "missing_slot", "id": "sin/LBA/25", "detail": "release and ledger entry missing"
    }  # fmt: skip
    late = json.loads(next(x for x in run.releases if '"release_id":"sin/LBA/24"' in x))
    late.update(slot=30, release_id="sin/LBA/30")
    status, report = audit(tmp_path, [*run.releases, json.dumps(late)], run.ledger, *expect)
    assert status == 1 and failed(report) == {"complete_slots"}
    assert report["problems"] == [
        {"kind": "published_after_halt", "id": "sin/LBA/30", "detail": "halted at slot 25"}
    ]


def test_a_conflicting_duplicate_is_caught(tmp_path: Path, ldp: Run) -> None:
    original = next(line for line in ldp.releases if '"release_id":"sin/LBU/5"' in line)
    other = json.loads(original)
    other["estimate"] = [0.5, 0.5]
    status, report = audit(tmp_path, [*ldp.releases, json.dumps(other)], ldp.ledger)
    assert status == 1 and failed(report) == {"unique_payloads"}
    assert report["counts"]["duplicates"] == 1
    assert report["counts"]["conflicting_duplicates"] == 1
    assert report["counts"]["releases"] == 7 * SLOTS
    assert report["problems"][0]["kind"] == "conflicting_duplicate"
    assert report["problems"][0]["id"] == "sin/LBU/5"


def test_identical_duplicates_are_counted_not_failed(tmp_path: Path, ldp: Run) -> None:
    """At-least-once output: a replayed slot repeats its lines byte for byte."""
    releases = [*ldp.releases, *ldp.releases[10:13]]
    ledger = [*ldp.ledger, *ldp.ledger[:2]]
    status, report = audit(tmp_path, releases, ledger)
    assert status == 0 and report["ok"]
    assert report["counts"]["duplicates"] == 5
    assert report["counts"]["conflicting_duplicates"] == 0
    assert report["counts"]["releases"] == report["counts"]["ledger_entries"] == 7 * SLOTS


def test_an_overspent_window_is_caught(tmp_path: Path, ldp: Run) -> None:
    """One LBU entry charges ε_j more at slot 12: every window of w slots holding it is over."""

    def overcharge(r: dict[str, Any]) -> None:
        r["classes"][0]["charged"] += r["guarantee"]["epsilon"]

    ledger = edit(ldp.ledger, at("LBU", 12), overcharge)
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1 and "window_budget" in failed(report)
    assert report["counts"]["windows_over_budget"] == WINDOW  # windows ending at 12..21
    first = report["problems"][0]
    assert (first["kind"], first["id"]) == ("window_over_budget", "sin/LBU/12")


def test_a_population_window_with_too_many_users_is_caught(tmp_path: Path, ldp: Run) -> None:
    def more_users(r: dict[str, Any]) -> None:
        r["details"]["users_m2"] += USERS

    ledger = edit(ldp.ledger, at("LPU", 20), more_users)
    status, report = audit(tmp_path, ldp.releases, ledger, "--population", str(USERS))
    assert status == 1 and "window_budget" in failed(report)
    assert report["counts"]["windows_over_users"] == WINDOW
    assert report["counts"]["windows_over_budget"] == 0
    over = [p for p in report["problems"] if p["kind"] == "window_over_users"]
    assert over[0]["id"] == "sin/LPU/20"
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert report["counts"]["windows_over_users"] == 0
    assert any("--population" in note for note in report["notes"])


def test_a_personalized_class_overspending_is_caught(tmp_path: Path, pers: Run) -> None:
    entry = next(r for r in pers.records("ledger") if r["mechanism"] == "PBD" and r["slot"] == 20)
    window = entry["classes"][0]["scope"]

    def overspend(r: dict[str, Any]) -> None:
        r["classes"][0]["charged"] += r["classes"][0]["budget"]

    ledger = edit(pers.ledger, at("PBD", 20), overspend)
    status, report = audit(tmp_path, pers.releases, ledger)
    assert status == 1 and "window_budget" in failed(report)
    assert report["counts"]["windows_over_budget"] == min(window, P_SLOTS - 20 + 1)
    first = report["problems"][0]
    assert (first["kind"], first["id"]) == ("class_over_budget", "sin/PBD/20")


def composed_spend(ledger: list[dict[str, Any]]) -> dict[int, float]:
    """A naive recomputation of the population accountant for one LDP-IDS stream: per slot,
    Σ over the mechanisms of each one's per-user spend over its window."""
    entries: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in ledger:
        entries[e["mechanism"]][e["slot"]] = e
    out = {}
    for t in range(1, SLOTS + 1):
        total = 0.0
        for by_slot in entries.values():
            window = [by_slot[s] for s in range(t - WINDOW + 1, t + 1) if s in by_slot]
            if by_slot[t]["division"] == "budget":
                total += sum(e["classes"][0]["charged"] for e in window)
            elif sum(e["details"]["users_m1"] + e["details"]["users_m2"] for e in window) > 0:
                total += by_slot[t]["guarantee"]["epsilon"]
        out[t] = total
    return out


def test_the_accountant_overspend_across_mechanisms_is_caught(tmp_path: Path, ldp: Run) -> None:
    """LBU and LBA each spend 3× what they did with a 3× budget: each stays within its own ε,
    together the mechanisms overspend the population's."""
    assert max(composed_spend(ldp.records("ledger")).values()) <= EPSILON * (1 + 1e-9)

    def triple(r: dict[str, Any]) -> None:
        r["guarantee"]["epsilon"] *= 3
        for field in ("budget", "charged", "spent"):
            r["classes"][0][field] *= 3
        for field in ("epsilon_m1", "epsilon_m2", "remaining"):
            r["details"][field] *= 3

    ledger = edit(ldp.ledger, lambda r: r["mechanism"] in ("LBU", "LBA"), triple)
    over = sum(
        v > EPSILON * (1 + 1e-9) for v in composed_spend([json.loads(x) for x in ledger]).values()
    )
    assert over > 0
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1 and "population_accountant" in failed(report)
    assert "window_budget" not in failed(report)
    assert report["counts"]["population_over_budget"] == over
    assert report["counts"]["windows_over_budget"] == 0


def test_a_mechanism_charging_beyond_its_declared_share_is_caught(tmp_path: Path, ldp: Run) -> None:
    """LBU's ledger charges the full ε (its class says ε) while its guarantee and releases
    declare its share ε/7: its own windows look fine, but its class still composes under the
    population's ε, where the stream now overspends."""

    def full(r: dict[str, Any]) -> None:
        for field in ("budget", "charged", "spent"):
            r["classes"][0][field] *= 7

    ledger = edit(ldp.ledger, lambda r: r["mechanism"] == "LBU", full)
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1
    # issue 18 §3: the stream also spends more than the expected ε = 1
    assert failed(report) == {"population_accountant", "declared_spend", "expected_budget"}
    assert report["counts"]["windows_over_budget"] == 0
    assert report["counts"]["population_over_budget"] > 0


def test_a_uniform_baseline_gaining_a_class_is_summed_as_one_mechanism(tmp_path: Path) -> None:
    """Uniform serves one class (the stream default) until a second requirement registers at
    slot 6: its first class's window sums run across the change."""
    from privstream.families.registry import PERSONALIZED
    from privstream.mechanisms.client import Requirements, SimulatedCurator
    from privstream.mechanisms.contract import Slot
    from privstream.mechanisms.personalized import PersonalizedConfig
    from privstream.mechanisms.seeding import SlotRandomness

    n = 6
    late = np.arange(n) >= 4  # users 4 and 5 require (2.0, 3) and register at slot 6
    eps, win = np.where(late, 2.0, 1.0), np.where(late, 3, 8)
    config = PersonalizedConfig(population=n, epsilon=1.0, window=8)
    mech = PERSONALIZED.build("Uniform", config)
    state, lines = mech.initial_state(), {"release": [], "ledger": []}
    for t in range(1, 16):
        req = Requirements(eps, win, registered=~late | (t >= 6))
        port = SimulatedCurator(np.arange(n) % 2, config.task, req)
        state, (release, entry, *_) = mech.step(
            state, Slot("g", t, port, SlotRandomness(1, "g", t))
        )
        lines["release"].append(json.dumps(release.to_dict(), separators=(",", ":")))
        lines["ledger"].append(json.dumps(entry.to_dict(), separators=(",", ":")))
    assert [len(json.loads(x)["classes"]) for x in lines["ledger"]] == [1] * 5 + [2] * 10
    status, report = audit(tmp_path, lines["release"], lines["ledger"])
    assert status == 0 and report["problems"] == [], report["problems"]
    assert any("before the population accountant" in note for note in report["notes"])


def test_a_lying_window_spent_is_caught(tmp_path: Path, ldp: Run) -> None:
    def halve(r: dict[str, Any]) -> None:
        r["classes"][0]["spent"] /= 2

    ledger = edit(ldp.ledger, at("LBD", 15), halve)
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1 and failed(report) == {"declared_spend"}
    assert report["counts"]["declared_mismatches"] == 1
    assert report["problems"][0]["kind"] == "declared_mismatch"
    assert report["problems"][0]["id"] == "sin/LBD/15"


def test_releases_whose_every_ledger_entry_is_malformed_fail_without_a_crash(
    tmp_path: Path, ldp: Run
) -> None:
    """With releases present and every ledger entry unreadable, the claim checks have nothing
    to compare the releases with: the audit reports the malformed and missing entries (exit 1)
    instead of failing with an IndexError (exit 2 would read as an input error)."""

    def drop_classes(r: dict[str, Any]) -> None:
        r.pop("classes")

    ledger = edit(ldp.ledger, lambda r: r.get("kind") == "ledger", drop_classes)
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1 and {"well_formed", "complete_slots"} <= failed(report)
    assert "malformed" in {p["kind"] for p in report["problems"]}


def test_a_lying_population_division_class_is_caught(tmp_path: Path, ldp: Run) -> None:
    """A population-division class has spent ε once anybody reported in its window: an entry
    declaring less is a mismatch."""

    def understate(r: dict[str, Any]) -> None:
        assert r["classes"][0]["spent"] > 0
        r["classes"][0]["spent"] = 0.0

    ledger = edit(ldp.ledger, at("LPU", 15), understate)
    status, report = audit(tmp_path, ldp.releases, ledger)
    assert status == 1 and failed(report) == {"declared_spend"}
    assert report["counts"]["declared_mismatches"] == 1
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("declared_mismatch", "sin/LPU/15")
    ]


def test_a_lying_population_window_spent_is_caught(tmp_path: Path, pers: Run) -> None:
    ledger = edit(
        pers.ledger,
        at("PBA", 90),
        lambda r: r.update(population_spent=r["population_spent"] * 0.9),
    )
    status, report = audit(tmp_path, pers.releases, ledger)
    assert status == 1 and failed(report) == {"declared_spend"}
    assert report["counts"]["declared_mismatches"] == 1


def test_a_raw_user_field_is_caught(tmp_path: Path, ldp: Run) -> None:
    releases = edit(ldp.releases, at("LSP", 3), lambda r: r.update(user="u17"))
    ledger = edit(ldp.ledger, at("LPD", 8), lambda r: r.update(users=["u1", "u2"]))
    status, report = audit(tmp_path, releases, ledger)
    assert status == 1 and failed(report) == {"no_user_ids"}
    assert report["checks"]["no_user_ids"]["count"] == 2
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("raw_user_field", "sin/LSP/3"),
        ("raw_user_field", "sin/LPD/8"),
    ]


def test_a_raw_user_field_in_details_is_caught(tmp_path: Path, pers: Run) -> None:
    releases = edit(pers.releases, at("PBA", 7), lambda r: r["details"].update(user_id=4))
    status, report = audit(tmp_path, releases, pers.ledger)
    assert status == 1 and failed(report) == {"no_user_ids"}
    assert report["problems"] == [{
        "kind": "raw_user_field", "id": "sin/PBA/7",
        "detail": "release has a field 'user_id' that looks like a raw user id",
    }]  # fmt: skip


def test_a_raw_user_list_in_a_privacy_class_is_caught(tmp_path: Path, pers: Run) -> None:
    def name_them(r: dict[str, Any]) -> None:
        r["classes"][1]["users"] = ["u3", "u9"]

    status, report = audit(tmp_path, pers.releases, edit(pers.ledger, at("Sample", 60), name_them))
    assert status == 1 and failed(report) == {"no_user_ids"}
    assert report["problems"] == [{
        "kind": "raw_user_field", "id": "sin/Sample/60",
        "detail": "ledger entry has a field 'users' that looks like a raw user id",
    }]  # fmt: skip


# -- per-user division (CGM) ------------------------------------------------------------------

C_USERS, C_SLOTS, C_WINDOW = 300, 20, 8


CGM_EXPECTED = ("--allow-insecure-seed", "--max-epsilon", "2", "--max-delta", "1e-5")
"""The CGM runs' population budget: (ε, δ) = (2, 10⁻⁵), which their μ-GDP guarantees meet."""


def cgm_flow(directory: Path, **kwargs: Any) -> Run:
    return run_flow(
        functools.partial(dataflow.build, "cgm"), directory, dataset="taxi",
        mechanisms="CGM,Alg1", users=C_USERS, slots=C_SLOTS, window=C_WINDOW, epsilon=2.0,
        budget_split="equal", **kwargs,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cgm(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """CGM and Alg1 sharing μ² equally; a user's stream budget covers 8 reports, so from slot 9
    on every user is refused and both spends rest at their share."""
    return cgm_flow(tmp_path_factory.mktemp("cgm"))


def respend(
    ledger: list[str], mechanism: str, slot: int, spent: Callable[[float], float]
) -> list[str]:
    """``ledger`` with ``mechanism``'s ``window_spent`` at ``slot`` changed, its ``mu_spent`` and
    every ``population_window_spent`` of the slot kept consistent with it (so only the check
    under test can fail)."""
    records = [json.loads(line) for line in ledger]
    entry = next(r for r in records if r["mechanism"] == mechanism and r["slot"] == slot)
    one = entry["classes"][0]
    new = spent(one["spent"])
    shift = new - one["spent"]
    one["spent"], entry["details"]["mu_spent"] = new, math.sqrt(new)
    for r in records:
        if r["slot"] == slot:
            r["population_spent"] += shift
    return dumps(records)


@pytest.mark.parametrize("scope", ["stream", "timestamp"])
def test_the_cgm_flow_passes(tmp_path: Path, cgm: Run, scope: str) -> None:
    """Per-user division: a stream budget of 8 reports (refusals from slot 9 on), and a budget
    per timestamp (the scope renews every slot)."""
    run = cgm if scope == "stream" else cgm_flow(tmp_path, budget_scope=scope)
    entries = run.records("ledger")
    assert {e["division"] for e in entries} == {"user"}
    last, spend = entries[-1], entries[-1]["classes"][0]
    assert last["slot"] == C_SLOTS and spend["spent"] == pytest.approx(spend["budget"])
    if scope == "stream":
        assert last["guarantee"]["scope"] == "stream" and last["details"]["refused"] > 0
    else:
        assert (last["guarantee"]["scope"], last["guarantee"]["length"]) == ("period", 1)
    status, report = audit(tmp_path, run.releases, run.ledger, expect=CGM_EXPECTED)
    assert status == 0 and report["ok"] and report["problems"] == [] and report["notes"] == []
    assert report["counts"] == {
        "releases": 2 * C_SLOTS, "ledger_entries": 2 * C_SLOTS, "streams": 1, "mechanisms": 2,
        "slots_expected": 2 * C_SLOTS, **ZERO,
    }  # fmt: skip


def test_a_user_spend_over_its_budget_is_caught(tmp_path: Path, cgm: Run) -> None:
    """Past the class's ε at slot 3; the next entry's honest spend then falls below it."""
    epsilon = cgm.records("ledger")[0]["classes"][0]["budget"]
    ledger = respend(cgm.ledger, "CGM", 3, lambda _: 1.01 * epsilon)
    status, report = audit(tmp_path, cgm.releases, ledger, expect=CGM_EXPECTED)
    assert status == 1 and failed(report) == {"window_budget"}
    assert report["counts"]["windows_over_budget"] == 1
    assert report["checks"]["window_budget"]["count"] == 2
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("window_over_budget", "taxi/CGM/3"), ("user_spend_inconsistent", "taxi/CGM/4"),
    ]  # fmt: skip


def test_a_user_spend_falling_within_the_stream_is_caught(tmp_path: Path, cgm: Run) -> None:
    """A stream-scope account never renews: the most-charged user's spend cannot fall (and the
    next, honest, entry then spends more than one slot's charge above it)."""
    ledger = respend(cgm.ledger, "Alg1", 5, lambda spent: spent / 2)
    status, report = audit(tmp_path, cgm.releases, ledger, expect=CGM_EXPECTED)
    assert status == 1 and failed(report) == {"window_budget"}
    assert report["counts"]["windows_over_budget"] == 0
    assert report["checks"]["window_budget"]["count"] == 2
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("user_spend_inconsistent", "taxi/Alg1/5"), ("user_spend_inconsistent", "taxi/Alg1/6"),
    ]  # fmt: skip
    assert "fell" in report["problems"][0]["detail"]
    assert "the slot before" in report["problems"][1]["detail"]


def test_a_user_spend_beyond_the_charges_is_caught(tmp_path: Path, cgm: Run) -> None:
    """At slot 2 no user can have paid more than the spend at slot 1 plus the charge of 2."""
    ledger = respend(cgm.ledger, "CGM", 2, lambda spent: spent * 1.5)
    status, report = audit(tmp_path, cgm.releases, ledger, expect=CGM_EXPECTED)
    assert status == 1 and failed(report) == {"window_budget"}
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("user_spend_inconsistent", "taxi/CGM/2")
    ]
    assert "the spend at the slot before plus" in report["problems"][0]["detail"]


def test_a_lying_mu_spent_is_caught(tmp_path: Path, cgm: Run) -> None:
    ledger = edit(
        cgm.ledger,
        at("CGM", 7),
        lambda r: r["details"].update(mu_spent=r["details"]["mu_spent"] * 1.1),
    )
    status, report = audit(tmp_path, cgm.releases, ledger, expect=CGM_EXPECTED)
    assert status == 1 and failed(report) == {"declared_spend"}
    assert report["counts"]["declared_mismatches"] == 1
    assert [(p["kind"], p["id"]) for p in report["problems"]] == [
        ("declared_mismatch", "taxi/CGM/7")
    ]


def test_a_user_division_entry_without_its_scope_is_malformed(tmp_path: Path, cgm: Run) -> None:
    """A per-user account is checked within a stream or period scope, of one class."""
    windowed = edit(
        cgm.ledger, at("CGM", 4), lambda r: r["guarantee"].update(scope="window", window=8)
    )
    two = edit(windowed, at("Alg1", 4), lambda r: r["classes"].append(r["classes"][0]))
    status, report = audit(tmp_path, cgm.releases, two, expect=CGM_EXPECTED)
    assert status == 1 and failed(report) == {"well_formed", "complete_slots"}
    assert report["checks"]["well_formed"]["count"] == 2
    assert sorted(p["detail"] for p in report["problems"] if p["kind"] == "malformed") == [
        "taxi/Alg1/4: user division needs one class, of the guarantee's budget",
        "taxi/CGM/4: user division needs a stream scope or a period scope of length in [1, 2**40)",
    ]


# -- evaluations, older runs, bad input ---------------------------------------------------------


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``--compare``: LBU, LSP and LBA side by side with the full ε each (3ε per window)."""
    return ldp_flow(tmp_path_factory.mktemp("compare"), "LBU,LSP,LBA", compare=True)


def test_an_expected_evaluation_may_exceed_the_population_budget(
    tmp_path: Path, evaluation: Run
) -> None:
    """Only with ``--allow-evaluation`` (issue 18 §3: before, an evaluation passed unasked)."""
    run = evaluation
    status, report = audit(tmp_path, run.releases, run.ledger, "--allow-evaluation")
    assert status == 0 and report["counts"]["population_over_budget"] == 0
    unmarked = edit(run.ledger, lambda r: True, lambda r: r.update(evaluation=False))
    releases = edit(run.releases, lambda r: True, lambda r: r.update(evaluation=False))
    status, report = audit(tmp_path, releases, unmarked, "--allow-evaluation")
    assert status == 1
    assert failed(report) == {"population_accountant", "stated_guarantee", "expected_budget"}
    assert report["counts"]["population_over_budget"] == SLOTS  # 3 mechanisms × ε each
    assert report["counts"]["stated_mismatches"] == SLOTS  # 3ε stated against ε, every slot


def test_entries_from_before_the_accountant_skip_it_with_a_note(tmp_path: Path, ldp: Run) -> None:
    def strip(r: dict[str, Any]) -> None:
        del r["population_budget"], r["population_spent"]

    status, report = audit(tmp_path, ldp.releases, edit(ldp.ledger, lambda r: True, strip))
    assert status == 0
    assert any("before the population accountant" in note for note in report["notes"])


def test_a_malformed_line_fails_well_formed(tmp_path: Path, ldp: Run) -> None:
    ledger = [*ldp.ledger[:5], '{"stream": "sin", "mechanism": "LBU"', *ldp.ledger[5:]]
    negative = edit(ldp.ledger[5:6], lambda r: True, lambda r: r["details"].update(epsilon_m1=-1.0))
    status, report = audit(tmp_path, ldp.releases, [*ledger, *negative])
    assert status == 1 and failed(report) == {"well_formed"}
    assert report["checks"]["well_formed"]["count"] == 2
    assert [p["id"] for p in report["problems"]] == ["ledger #6", "ledger #282"]
    assert "negative spend" in report["problems"][1]["detail"]


def test_records_of_another_schema_are_refused_by_name(tmp_path: Path, ldp: Run) -> None:
    """The audit reads schemas 2 and 3 only: a record naming another schema, or none (an
    output from before the one release envelope), is not of the schema, with the reason said."""
    future = edit(ldp.releases[:1], lambda r: True, lambda r: r.update(schema=4))
    old = '{"release_id":"sin/LBU/1","stream":"sin","mechanism":"LBU","slot":1,"epsilon":0.1}'
    halt = '{"schema":1,"kind":"halt","stream":"sin","mechanism":"LBU","slot":3,"reason":"x"}'
    releases = [*future, old, *ldp.releases[1:]]
    status, report = audit(tmp_path, releases, [*ldp.ledger, halt])
    assert status == 1 and failed(report) == {"well_formed", "complete_slots"}
    assert report["checks"]["well_formed"]["count"] == 3
    assert report["counts"]["halted"] == 0
    details = {p["id"]: p["detail"] for p in report["problems"] if p["kind"] == "malformed"}
    assert details == {
        "release #1": "schema 4, but this audit reads schemas 2 and 3",
        "release #2": "no schema field (a privstream output from before schema 2)",
        "ledger #281": "halt record: schema 1, but this audit reads schemas 2 and 3",
    }


OLD_NAMES = {
    "population_budget": "population_epsilon",
    "population_spent": "population_window_spent",
}
OLD_CLASS_NAMES = {"scope": "window", "budget": "epsilon", "spent": "window_spent"}


def schema_2(line: str) -> str:
    """A schema-3 record as the tree before the measure-neutral rename wrote it."""
    r = json.loads(line)
    r = {OLD_NAMES.get(k, k): v for k, v in r.items()}
    if "classes" in r:
        r["classes"] = [{OLD_CLASS_NAMES.get(k, k): v for k, v in c.items()} for c in r["classes"]]
    r["schema"] = 2
    return json.dumps(r, separators=(",", ":"))


@pytest.mark.parametrize("run", ["ldp", "pers", "cgm"])
def test_schema_2_ledgers_from_before_the_rename_are_read_alike(
    tmp_path: Path, run: str, request: pytest.FixtureRequest
) -> None:
    """Topics written before schema 3 (a class's window/epsilon/window_spent, the entry's
    population_epsilon/population_window_spent) audit exactly as their schema-3 copies, and a
    lie in an old record is still caught."""
    r: Run = request.getfixturevalue(run)
    more: dict[str, Any] = {"expect": CGM_EXPECTED} if run == "cgm" else {}
    status, report = audit(tmp_path, r.releases, r.ledger, **more)
    old = [schema_2(x) for x in r.ledger]
    assert '"population_epsilon"' in old[0] and '"window_spent"' in old[0]
    old_status, old_report = audit(tmp_path, [schema_2(x) for x in r.releases], old, **more)
    assert (old_status, old_report["counts"]) == (status, report["counts"]) == (0, report["counts"])

    def lie(e: dict[str, Any]) -> None:
        e["classes"][0]["spent"] = e["classes"][0]["spent"] / 2 + 1e-3

    lying = [schema_2(x) for x in edit(r.ledger, lambda e: e["slot"] == 3, lie)]
    bad_status, _ = audit(tmp_path, r.releases, lying, **more)
    assert bad_status == 1


def test_input_errors_exit_2(tmp_path: Path, ldp: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["audit", "--releases", str(tmp_path / "none"), "--ledger", str(tmp_path / "x")]) == 2
    )
    assert "no such file" in capsys.readouterr().err
    assert main(["audit", "--releases", "a.jsonl"]) == 2
    assert main(["audit", "--releases", "a", "--ledger", "b", "--release-topic", "t"]) == 2
    assert main(["audit"]) == 2


def test_the_audit_shares_no_code_with_what_it_audits() -> None:
    code = "import sys, privstream.audit.main; print(sorted(m for m in sys.modules if m.startswith('privstream')))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    modules = json.loads(loaded.stdout.replace("'", '"'))
    assert not [m for m in modules if m.startswith("privstream.operators")]
    assert not {"privstream.mechanisms.ledger", "privstream.mechanisms.accountant"} & set(modules)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 60), st.floats(0, 10, allow_nan=False)),
        max_size=80,
        unique_by=lambda x: (x[0], x[1]),
    ),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 80), st.integers(1, 30)),
        min_size=1,
        max_size=20,
    ),
)
def test_window_sums_equal_a_naive_sum(
    rows: list[tuple[int, int, float]], queries: list[tuple[int, int, int]]
) -> None:
    group = np.array([r[0] for r in rows], dtype=np.int64)
    slot = np.array([r[1] for r in rows], dtype=np.int64)
    value = np.array([r[2] for r in rows], dtype=np.float64)
    g, t, w = (np.array(c, dtype=np.int64) for c in zip(*queries, strict=True))
    got = window_sums(group, slot, value, g, t, w)
    naive = [
        sum(v for gr, s, v in rows if gr == qg and qt - qw < s <= qt) for qg, qt, qw in queries
    ]
    np.testing.assert_allclose(got, naive, rtol=1e-12, atol=1e-12)


def test_the_audit_page_file_audit_runs_as_written(tmp_path: Path, secure: Run) -> None:
    """docs/audit.md's file audit (the section the README had) runs as written."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "audit.md").read_text()
    line = next(x for x in page.splitlines() if x.startswith("privstream audit --releases"))
    (tmp_path / "releases.jsonl").write_text("\n".join(secure.releases) + "\n")
    (tmp_path / "ledger.jsonl").write_text("\n".join(secure.ledger) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "privstream.cli", *line.split()[1:]],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and done.stdout.startswith("privstream audit: ok (")  # the summary
    assert "audit: ok" in done.stderr


def test_an_empty_output_fails_the_audit(tmp_path: Path) -> None:
    """Nothing read is no evidence of a healthy run (a wrong topic, a run that never wrote)."""
    releases, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    releases.write_text("")
    ledger.write_text("")
    out = tmp_path / "report.json"
    code = main(["audit", "--releases", str(releases), "--ledger", str(ledger), "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 1 and not report["ok"]
    assert report["checks"]["something_read"] == {
        "ok": False,
        "count": 0,
        "detail": "nothing was read",
    }


# -- the verdict as Prometheus metrics (``--metrics-port``, a periodic job in deploy/) ---------


def _serve_audit(tmp_path: Path, releases: list[str], ledger: list[str], *flags: str) -> Any:
    """``privstream audit ... --metrics-port P --linger 60`` as its own process: (process, its
    metrics text once the verdict is served)."""
    from privstream.connectors.broker import free_port
    from tests.integration.prometheus import scrape_until

    paths = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    for path, lines in zip(paths, (releases, ledger), strict=True):
        path.write_text("".join(line + "\n" for line in lines))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "privstream.cli", "audit", "--releases", str(paths[0]),
         "--ledger", str(paths[1]), "--no-progress", "--metrics-port", str(port), "--linger",
         "60", *EXPECTED, *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    text = scrape_until(port, lambda t: "privstream_audit_passed " in t, _alive(process))
    return process, text


def _alive(process: Any) -> Callable[[], None]:
    def check() -> None:
        if process.poll() is not None:
            pytest.fail(f"the audit exited with {process.returncode}: {process.stderr.read()}")

    return check


def _samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("privstream_audit_")
    }


def _stop(process: Any) -> tuple[int, str]:
    """SIGTERM ends the linger at once; the audit's own exit status and stderr."""
    process.terminate()
    _out, err = process.communicate(timeout=10)
    return process.returncode, err


def test_a_passing_audit_serves_its_verdict_until_sigterm(tmp_path: Path, ldp: Run) -> None:
    process, text = _serve_audit(tmp_path, ldp.releases, ldp.ledger, "--population", str(USERS))
    samples = _samples(text)
    assert samples["privstream_audit_passed"] == 1.0
    checks = {k: v for k, v in samples.items() if k.startswith("privstream_audit_check_passed")}
    assert checks == {
        f'privstream_audit_check_passed{{check="{name}"}}': 1.0
        for name in ("inputs", *CHECKS)
        if name != "flow_file"  # only with --config
    }  # fmt: skip
    assert samples["privstream_audit_releases"] == samples["privstream_audit_ledger_entries"]
    assert samples["privstream_audit_releases"] == 7 * SLOTS
    assert abs(samples["privstream_audit_last_run_timestamp_seconds"] - time.time()) < 60
    assert _stop(process)[0] == 0


def test_a_failing_audit_serves_0_and_names_the_check(tmp_path: Path, ldp: Run) -> None:
    ledger = edit(ldp.ledger, at("LBU", 12), lambda r: r["classes"][0].update(charged=9.0))
    process, text = _serve_audit(tmp_path, ldp.releases, ledger)
    samples = _samples(text)
    assert samples["privstream_audit_passed"] == 0.0
    assert samples['privstream_audit_check_passed{check="window_budget"}'] == 0.0
    assert samples['privstream_audit_check_passed{check="no_user_ids"}'] == 1.0
    assert _stop(process)[0] == 1


def test_an_audit_that_cannot_read_its_inputs_serves_0(tmp_path: Path) -> None:
    """A broken audit job (a missing file, topic or broker) is a failed audit, not silence."""
    from privstream.connectors.broker import free_port
    from tests.integration.prometheus import scrape_until

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "privstream.cli", "audit", "--releases", str(tmp_path / "none"),
         "--ledger", str(tmp_path / "none2"), "--metrics-port", str(port), "--linger", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    samples = _samples(
        scrape_until(port, lambda t: "privstream_audit_passed " in t, _alive(process))
    )
    assert samples["privstream_audit_passed"] == 0.0
    assert samples['privstream_audit_check_passed{check="inputs"}'] == 0.0
    assert "privstream_audit_releases" not in samples  # nothing was read: no count at all
    status, err = _stop(process)
    assert status == 2 and "no such file" in err.lower() and "Traceback" not in err


def test_a_taken_metrics_port_is_an_input_error(
    tmp_path: Path, ldp: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["audit", "--releases", "r", "--ledger", "l", "--metrics-port", str(port)])
    assert status == 2 and "cannot serve the audit's metrics" in capsys.readouterr().err


# -- issue 18 §3: what the outputs claim ----------------------------------------------------------
# Each attack passed the audit of main (e76ba93, exit 0 with --population); each now fails.

BUDGET = ("--max-epsilon", str(EPSILON))
"""An expected budget and nothing allowed: how a production audit runs."""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """All seven LDP-IDS mechanisms sharing ε equally, keyed by a random secret."""
    return ldp_flow(
        tmp_path_factory.mktemp("secure"), budget_split="equal", secret=secrets.token_hex(32)
    )


def test_a_keyed_run_passes_with_an_expected_budget_only(tmp_path: Path, secure: Run) -> None:
    status, report = audit(tmp_path, secure.releases, secure.ledger, "--population", str(USERS),
                           expect=BUDGET)  # fmt: skip
    assert status == 0 and report["problems"] == [], report["problems"]
    assert "at most ε=" in report["checks"]["expected_budget"]["detail"]


def test_an_insecure_seed_run_fails_unless_allowed(tmp_path: Path, ldp: Run) -> None:
    status, report = audit(tmp_path, ldp.releases, ldp.ledger, "--population", str(USERS),
                           expect=BUDGET)  # fmt: skip
    assert status == 1 and failed(report) == {"secure_noise"}
    assert report["counts"]["insecure_outputs"] == 2 * 7 * SLOTS  # every release and entry
    assert {p["kind"] for p in report["problems"]} == {"insecure_seed_output"}
    status, _ = audit(tmp_path, ldp.releases, ldp.ledger, "--allow-insecure-seed", *BUDGET,
                      expect=())  # fmt: skip
    assert status == 0


def test_an_evaluation_fails_unless_allowed(tmp_path: Path, evaluation: Run) -> None:
    """``--compare`` on real data: 3 mechanisms at the full ε each, 3ε per window."""
    run = evaluation
    flags = ("--allow-insecure-seed", *BUDGET)
    status, report = audit(tmp_path, run.releases, run.ledger, *flags, expect=())
    assert status == 1 and failed(report) == {"not_evaluation", "expected_budget"}
    assert report["counts"]["evaluation_outputs"] == 2 * 3 * SLOTS
    # the composed spend reaches 3ε once each mechanism's window is full
    assert "3" in report["checks"]["expected_budget"]["detail"] or any(
        p["kind"] == "over_expected_budget" for p in report["problems"]
    )


def test_evaluation_releases_relabelled_as_production_fail(tmp_path: Path, evaluation: Run) -> None:
    """The releases say ``evaluation: false`` while their ledger says true: the flag and the
    ledger's evaluation split (3 full budgets over one population ε) both give it away."""
    run = evaluation
    relabelled = edit(run.releases, lambda r: True, lambda r: r.update(evaluation=False))
    for allow in ((), ("--allow-evaluation",)):
        status, report = audit(tmp_path, relabelled, run.ledger, *allow)
        assert status == 1 and "stated_guarantee" in failed(report)
        kinds = [p["kind"] for p in report["problems"]]
        assert kinds.count("flag_mismatch") == min(3 * SLOTS, 50 - kinds.count("evaluation_output"))
        assert report["counts"]["stated_mismatches"] == 3 * SLOTS
    ledger = edit(run.ledger, lambda r: True, lambda r: r.update(evaluation=False))
    status, report = audit(tmp_path, relabelled, ledger, "--allow-evaluation")
    assert status == 1 and {"stated_guarantee", "population_accountant"} <= failed(report)
    assert "split_over_population" in {p["kind"] for p in report["problems"]}


def two_streams(directory: Path, epsilon: float) -> Run:
    """Streams ``a`` and ``b`` of one population (n = USERS), each run at ``epsilon``."""
    runs = [
        ldp_flow(directory / name, "LBU", stream=name, epsilon=epsilon)
        for name in ("a", "b")
        if not (directory / name).mkdir(parents=True)
    ]  # fmt: skip
    return Run([x for r in runs for x in r.releases], [x for r in runs for x in r.ledger])


def flow_file(path: Path, shares: dict[str, float]) -> Path:
    """A flow file of one population (ε = EPSILON per WINDOW slots) and these streams."""
    streams = "".join(
        f'\n[[streams]]\nname = "{name}"\nfamily = "ldp-ids"\nmechanisms = ["LBU"]\n'
        f"domain = 2\nshare = {share}\n"
        for name, share in shares.items()
    )
    path.write_text(
        '[kafka]\nbootstrap = "127.0.0.1:9092"\ninput_topic = "events"\n'
        'output_topic = "releases"\nledger_topic = "ledger"\n\n'
        f"[population]\nusers = {USERS}\nepsilon = {EPSILON}\nwindow = {WINDOW}\n{streams}"
    )
    return path


def test_two_streams_at_epsilon_each_over_one_population_fail(tmp_path: Path) -> None:
    run = two_streams(tmp_path, EPSILON)
    status, report = audit(tmp_path, run.releases, run.ledger, "--population", str(USERS))
    assert status == 1 and failed(report) == {"expected_budget"}
    # LBU charges ε/w a slot in each stream: together 2ε/w a slot, past ε from slot w/2 + 1 on
    assert report["counts"]["over_expected_budget"] == SLOTS - WINDOW // 2
    config = flow_file(tmp_path / "flow.toml", {"a": 0.5, "b": 0.5})
    status, report = audit(tmp_path, run.releases, run.ledger, "--config", str(config),
                           expect=("--allow-insecure-seed",))  # fmt: skip
    assert status == 1 and failed(report) == {"expected_budget", "flow_file"}
    assert report["checks"]["flow_file"]["count"] == 2 * SLOTS  # ε declared, the file's ε/2
    only_a = flow_file(tmp_path / "a.toml", {"a": 1.0})
    status, report = audit(tmp_path, run.releases, run.ledger, "--config", str(only_a),
                           expect=("--allow-insecure-seed",))  # fmt: skip
    assert status == 1 and "flow_file" in failed(report)
    assert {"kind": "stream_not_in_flow_file", "id": "b"} in [
        {k: p[k] for k in ("kind", "id")} for p in report["problems"]
    ]


def test_two_streams_within_their_shares_pass(tmp_path: Path) -> None:
    run = two_streams(tmp_path, EPSILON / 2)
    config = flow_file(tmp_path / "flow.toml", {"a": 0.5, "b": 0.5})
    status, report = audit(tmp_path, run.releases, run.ledger, "--config", str(config),
                           expect=("--allow-insecure-seed",))  # fmt: skip
    assert status == 0, report["problems"]
    assert "at most ε=1 of the expected ε=1" in report["checks"]["expected_budget"]["detail"]


def test_repeats_carrying_other_values_fail(tmp_path: Path, ldp: Run) -> None:
    """LBA's approximate/nullified releases carry other values than their source publication
    (say, the true frequencies): a repeat is post-processing only if it repeats exactly."""
    records = ldp.records("releases")
    repeats = [r for r in records if r["mechanism"] == "LBA" and r["strategy"] != "publish"]
    sourced = [r for r in repeats if r["source_slot"] is not None]
    assert len(sourced) >= 10

    def leak(r: dict[str, Any]) -> None:
        r["estimate"] = [0.5 + 1e-3 * r["slot"], 0.5 - 1e-3 * r["slot"]]

    leaky = edit(ldp.releases, lambda r: r in repeats, leak)
    status, report = audit(tmp_path, leaky, ldp.ledger)
    assert status == 1 and failed(report) == {"repeated_publications"}
    assert report["counts"]["unfaithful_repeats"] == len(repeats)
    kinds = {p["kind"] for p in report["problems"]}
    assert kinds == {"repeat_differs"} | ({"repeat_without_source"} if len(repeats) > len(
        sourced) else set())  # fmt: skip
    # one ulp off is caught too, and so is a repeat pointing at another repeat or the future
    first = sourced[0]
    ulp = edit(ldp.releases, lambda r: r["release_id"] == first["release_id"],
               lambda r: r.update(estimate=[math.nextafter(r["estimate"][0], 1),
                                            *r["estimate"][1:]]))  # fmt: skip
    assert audit(tmp_path, ulp, ldp.ledger)[1]["counts"]["unfaithful_repeats"] == 1
    future = edit(ldp.releases, lambda r: r["release_id"] == first["release_id"],
                  lambda r: r.update(source_slot=SLOTS))  # fmt: skip
    assert audit(tmp_path, future, ldp.ledger)[1]["counts"]["unfaithful_repeats"] == 1


def test_a_publication_without_a_charge_fails(tmp_path: Path, ldp: Run) -> None:
    """A release marked ``publish`` whose ledger entry charged nothing at its slot."""

    def free(r: dict[str, Any]) -> None:
        r["classes"][0]["charged"] = 0.0

    slot = next(r["slot"] for r in ldp.records("releases")
                if r["mechanism"] == "LBU" and r["strategy"] == "publish")  # fmt: skip
    status, report = audit(tmp_path, ldp.releases, edit(ldp.ledger, at("LBU", slot), free))
    assert status == 1 and "repeated_publications" in failed(report)
    assert report["counts"]["unfaithful_repeats"] == 1


def test_releases_stating_a_smaller_epsilon_than_their_ledger_fail(
    tmp_path: Path, ldp: Run
) -> None:
    """Releases state ε = 0.01 while the ledger and the noise are at the mechanisms' ε/7."""
    small = edit(ldp.releases, lambda r: True, lambda r: r["guarantee"].update(epsilon=0.01))
    status, report = audit(tmp_path, small, ldp.ledger, "--population", str(USERS))
    assert status == 1 and failed(report) == {"stated_guarantee"}
    assert report["counts"]["stated_mismatches"] == 7 * SLOTS
    problem = report["problems"][0]
    assert problem["kind"] == "guarantee_mismatch"
    assert "ε=0.01" in problem["detail"] and "ε=0.142857" in problem["detail"]


def test_an_honest_run_over_the_expected_budget_fails(tmp_path: Path) -> None:
    """An honest run at ε = 500 is consistent in itself: only an expectation can refuse it."""
    run = ldp_flow(tmp_path, "LBU,LPA", epsilon=500.0, budget_split="equal")
    status, report = audit(tmp_path, run.releases, run.ledger, "--population", str(USERS))
    assert status == 1 and failed(report) == {"expected_budget"}
    kinds = {p["kind"] for p in report["problems"]}
    assert kinds == {"guarantee_over_expected", "over_expected_budget"}
    status, report = audit(tmp_path, run.releases, run.ledger, expect=("--allow-insecure-seed",))
    assert status == 1 and failed(report) == {"expected_budget"}
    assert "not checked" in report["checks"]["expected_budget"]["detail"]
    assert report["problems"][0]["kind"] == "budget_not_checked"
    status, _ = audit(tmp_path, run.releases, run.ledger, "--allow-insecure-seed",
                      "--max-epsilon", "500", expect=())  # fmt: skip
    assert status == 0


def test_a_gaussian_guarantee_needs_an_expected_delta(tmp_path: Path, cgm: Run) -> None:
    """CGM states μ: its ε exists only at a δ, so an expected ε alone cannot check it; at
    δ = 10⁻⁵ the two mechanisms' μ compose to ε = 2, within 2 and not within 1.9."""
    base = ("--allow-insecure-seed", "--max-epsilon")
    status, report = audit(tmp_path, cgm.releases, cgm.ledger, expect=(*base, "2"))
    assert status == 1 and failed(report) == {"expected_budget"}
    assert "--max-delta" in json.dumps(report["problems"])
    status, _ = audit(
        tmp_path, cgm.releases, cgm.ledger, expect=(*base, "2", "--max-delta", "1e-5")
    )
    assert status == 0
    status, report = audit(tmp_path, cgm.releases, cgm.ledger,
                           expect=(*base, "1.9", "--max-delta", "1e-5"))  # fmt: skip
    assert status == 1 and failed(report) == {"expected_budget"}


def test_the_audit_page_and_deploy_docs_list_every_check() -> None:
    """docs/audit.md's table of checks and deploy/README's ``check`` label values are
    ``privstream.audit.main.CHECKS``."""
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "audit.md").read_text()
    table = [
        line.split("`")[1]
        for line in page.splitlines()
        if line.startswith("| `") and not line.startswith("| `privstream_")
    ]
    assert sorted(table) == sorted(CHECKS) and len(table) == len(CHECKS)
    deploy = (root / "deploy" / "README.md").read_text()
    row = next(x for x in deploy.splitlines() if x.startswith("| `privstream_audit_check_passed"))
    names = [n for n in re.findall(r"`([a-z_]+)`", row) if n != "inputs"]
    assert sorted(names) == sorted(CHECKS)


def test_the_audit_names_each_guarantee_in_its_own_units() -> None:
    """The audit's text shows CGM's Gaussian-DP guarantee in μ, never its μ² as an ε; the
    per-window checks name a budget, not an ε."""
    from privstream.audit.main import _Guarantee

    cgm = _Guarantee(measure="gaussian", mu=0.2680511232112917, scope="stream", model="ldp")
    assert cgm.text() == "gaussian μ=0.268051 over stream (ldp)"
    lbu = _Guarantee(measure="pure", epsilon=1.0, scope="window", window=5, model="ldp")
    assert lbu.text() == "pure ε=1 over window w=5 (ldp)"
