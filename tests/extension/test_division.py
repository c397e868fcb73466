"""The worked example's axis "a new division": ``example-division`` (a module in ``site/``,
registered by entry point) splits the users into k public cohorts and charges one per slot,
round-robin. Nothing in privstream names it: the family declares its division
(``Family.divisions``: a ``DivisionSpec`` with its payer and how the audit recomputes a
window's spend from the published entries), and ``privstream audit`` asks the family for it.

Tolerances: slot t's release de-biases the randomized responses (at ε_s = ε/⌈w/k⌉) of the
charged cohort's m members: its variance around their fraction of ones is
``q(1−q)/(m(2q−1)²)``, q = e^ε_s/(1+e^ε_s) (``example_division.variance``); against the whole
population's fraction the cohort's own sampling adds ``p(1−p)(1 − m/n)/m`` at most (without
replacement).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privstream.cli import main
from privstream.connectors.datasets import synthetic_dataset
from privstream.families import registry
from privstream.mechanisms.accounting import (
    BUDGET,
    DIVISIONS,
    AllUsers,
    DivisionSpec,
    division_of,
    register_division,
)
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import ClassSpend, LedgerEntry, Release, Slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension import surfaces

USERS, SLOTS, EPS, WINDOW, K = 6000, 12, 4.0, 6, 3
SLOT_EPS = EPS / math.ceil(WINDOW / K)  # 2.0: a cohort is charged twice in any 6 slots
ARGV = ["run", "example-division", "--users", str(USERS), "--slots", str(SLOTS),
        "--insecure-seed", "7", "--dataset", "sin", "--no-progress"]  # fmt: skip


def _site() -> Any:
    return importlib.import_module("example_division")


def _mechanism(users: int = USERS) -> Any:
    family = registry.family("example-division")
    config = family.make_config(epsilon=EPS, window=WINDOW, population=users,
                                task=FrequencyTask(2), cohorts=K)  # fmt: skip
    return family.build("COH", config)


def _run(tmp_path: Path) -> tuple[Path, Path]:
    out, ledger = tmp_path / "coh.jsonl", tmp_path / "coh-ledger.jsonl"
    assert main([*ARGV, "--out", str(out), "--ledger-out", str(ledger)]) == 0
    return out, ledger


def _audit(out: Path, ledger: Path, report: Path) -> tuple[int, dict[str, Any]]:
    code = main(["audit", "--releases", str(out), "--ledger", str(ledger),
                 "--allow-insecure-seed", "--population", str(USERS), "--expect-slots",
                 str(SLOTS), "--max-epsilon", str(EPS), "--no-progress", "--json",
                 str(report)])  # fmt: skip
    return code, json.loads(report.read_text())


def _check_releases(path: Path) -> None:
    """Against the population's fraction: the cohort's randomized responses and its sampling."""
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    m = USERS // K
    releases = surfaces.lines(path)
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    for r in releases:
        p = float(data.truth(r["slot"])[1])
        var = _site().variance(SLOT_EPS, m) + p * (1 - p) * (1 - m / USERS) / m
        assert r["details"]["cohort"] == (r["slot"] - 1) % K and r["details"]["reports"] == m
        assert abs(r["estimate"][1] - p) <= 4 * math.sqrt(var), (r["slot"], p)


def test_the_division_is_declared_by_the_family(external_site: dict[str, str]) -> None:
    family = registry.family("example-division")
    cohorts = division_of("cohort")  # registered when discovery imported the family
    assert cohorts is _site().COHORTS and cohorts in family.divisions
    assert cohorts.recompute is not None and BUDGET.recompute is None  # built-ins: the audit's
    assert DIVISIONS["budget"].payer(ClassSpend(5, 1.0, 10, 0.2, 0.2), False) == AllUsers()
    with pytest.raises(ValueError, match="'budget' is built in"):
        register_division(DivisionSpec("budget", BUDGET.payer))
    with pytest.raises(ValueError, match="division 'nope' is not declared"):
        division_of("nope")


def test_each_slot_charges_one_cohort_and_the_estimate_is_within_its_variance(
    external_site: dict[str, str],
) -> None:
    """Driven directly on random values (fixed seed): every release within 4 sd of the charged
    cohort's own fraction of ones; every entry's spend is the most-charged cohort's."""
    mech = _mechanism()
    values = (np.random.default_rng(11).random((SLOTS, USERS)) < 0.3).astype(np.int64)
    state, cohort_of = mech.initial_state(), np.arange(USERS) % K
    sd = math.sqrt(_site().variance(SLOT_EPS, USERS // K))
    for t in range(1, SLOTS + 1):
        randomness = SlotRandomness(5, "s", t)
        port = SimulatedClientPort(values[t - 1], FrequencyTask(2), randomness, "per-user")
        state, events = mech.step(state, Slot("s", t, port, randomness))
        release, entry = (
            next(e for e in events if isinstance(e, k)) for k in (Release, LedgerEntry)
        )
        cohort = (t - 1) % K
        truth = float(values[t - 1][cohort_of == cohort].mean())
        assert abs(release.estimate[1] - truth) <= 4 * sd, t
        assert entry.division == "cohort" and entry.details.cohort == cohort
        assert entry.classes[0].spent == SLOT_EPS * min(2, (t + K - 1) // K)


def test_the_audit_recomputes_its_spend_and_catches_a_lying_entry(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    out, ledger = _run(tmp_path)
    _check_releases(out)
    code, report = _audit(out, ledger, tmp_path / "audit.json")
    assert code == 0 and report["ok"], report["problems"]
    # slot 5 charged cohort 1 for the second time in its window: spent 4.0; claim 2.0
    entries = surfaces.lines(ledger)
    (entry,) = [e for e in entries if e["slot"] == 5]
    assert entry["classes"][0]["spent"] == 4.0
    entry["classes"][0]["spent"] = 2.0
    lying = tmp_path / "lying.jsonl"
    lying.write_text("".join(json.dumps(e) + "\n" for e in entries))
    code, report = _audit(out, lying, tmp_path / "audit2.json")
    assert code != 0 and not report["checks"]["declared_spend"]["ok"]
    found = [p for p in report["problems"] if p["kind"] == "declared_mismatch"]
    assert found[0]["id"] == "sin/COH/5"
    assert (
        "cohort division: the entry claims 2 but its charges recompute to 4" in found[0]["detail"]
    )


def test_an_entry_of_an_undeclared_division_is_refused_by_the_audit(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    out, ledger = _run(tmp_path)
    rows = ledger.read_text().splitlines(keepends=True)
    rows[3] = rows[3].replace('"division":"cohort"', '"division":"cliques"')
    ledger.write_text("".join(rows))
    code, report = _audit(out, ledger, tmp_path / "audit.json")
    assert code != 0
    assert any("division 'cliques' is neither" in p["detail"] for p in report["problems"])


def test_privstream_run_in_a_subprocess(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "coh.jsonl"
    surfaces.run_subprocess(external_site, [*ARGV, "--out", str(out)])
    _check_releases(out)


def _flow(path: Path, cohorts: int) -> Path:
    stream = {"name": "cohorts", "family": "example-division", "mechanisms": ["COH"],
              "domain": 2, "cohorts": cohorts, "share": 1.0}  # fmt: skip
    population = {"users": 6000, "epsilon": 4.0, "window": 6}
    return surfaces.flow_file(path, population=population, streams=[stream])


def test_a_flow_file_with_the_family_checks(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _flow(tmp_path / "good.toml", 3), _flow(tmp_path / "bad.toml", 1)
    surfaces.assert_flow_check(capsys, good, ["example-division"], bad, "cohorts")


def test_the_bench_harness(external_site: dict[str, str], tmp_path: Path) -> None:
    results = surfaces.bench(tmp_path, "example-division", "--users", str(USERS), "--slots", str(SLOTS),
                    "--seeds", "2")  # fmt: skip
    (mae,) = {r["mae"] for r in results.values()}
    m = USERS // K
    sd = math.sqrt(_site().variance(SLOT_EPS, m) + 0.25 * (1 - m / USERS) / m)
    assert mae < 2 * sd  # mean |error| ≤ sd·√(2/π) in expectation, by the variance bound


def test_the_conformance_checks_pass(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-division", ["COH"])
    assert {"declared_cost", "pickle_restore", "purity_and_replay"} <= set(ran)
