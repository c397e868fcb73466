"""The worked example's axis "a new privacy measure with its own ledger": ``example-measure`` (a
module in ``site/``, registered by entry point) charges Rényi DP of order α = 8 (ε(α) adds
under composition) in its own charge type and ledger. Nothing in privstream names it: the
population accountant composes it because its charge type declares an additive unit, and the
metrics, ``config check`` and the audit show it in the unit it declares (ε(α)).

Tolerances: a release's coordinate is the mean of n one-hot reports plus N(0, σ²) noise each,
σ² = αΔ²w/(2ε) (Δ² = 2): variance ``(p(1−p) + σ²)/n`` (``example_measure.variance``).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from privstream.cli import main
from privstream.conformance.checks import make_slot
from privstream.connectors.datasets import synthetic_dataset
from privstream.families import registry
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.accountant import ClassKey, PopulationAccountant
from privstream.mechanisms.accounting import (
    AllUsers,
    PrivacyClass,
    PureCharge,
    UnsupportedCharge,
)
from privstream.mechanisms.driver import Lane, drive_slot
from privstream.mechanisms.guarantees import ClassScope, WindowScope
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.ledger import BudgetLedger, PersonalizedLedger, PopulationLedger
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.metrics import LedgerBoard
from privstream.operators.stream_state import Tally
from tests.extension import surfaces

USERS, SLOTS, EPS, WINDOW = 4000, 10, 5.0, 5
ARGV = ["run", "example-measure", "--users", str(USERS), "--slots", str(SLOTS),
        "--insecure-seed", "7", "--dataset", "sin", "--no-progress"]  # fmt: skip


def _site() -> Any:
    return importlib.import_module("example_measure")


def _mechanism(scale: float = 1.0, users: int = USERS) -> Any:
    family = registry.family("example-measure")
    config = family.make_config(epsilon=EPS, window=WINDOW, population=users,
                                task=FrequencyTask(2), charge_scale=scale)  # fmt: skip
    return family.build("RGM", config)


def _renyi(spent: float = 1.0) -> Any:
    return _site().RenyiCharge(AllUsers(), WindowScope(WINDOW), WINDOW, 10, 1.0, spent, EPS)


def _run(tmp_path: Path, *extra: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out, ledger = tmp_path / "rgm.jsonl", tmp_path / "rgm-ledger.jsonl"
    assert main([*ARGV, *extra, "--out", str(out), "--ledger-out", str(ledger)]) == 0
    return surfaces.lines(out), surfaces.lines(ledger)


def _check_releases(releases: list[dict[str, Any]]) -> None:
    data = synthetic_dataset("sin", USERS, SLOTS, 1)
    mech = _mechanism()
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    for release in releases:
        p = float(data.truth(release["slot"])[1])
        sd = math.sqrt(_site().variance(mech.config, p))
        assert abs(release["estimate"][1] - p) <= 4 * sd, (release["slot"], p)
        assert release["guarantee"] == {"measure": "renyi", "alpha": 8.0, "budget": EPS,
                                        "unit": "ε(α)", "scope": "window", "window": WINDOW,
                                        "model": "ldp"}  # fmt: skip


def test_its_ledger_and_the_built_in_ones_refuse_each_others_charges(
    external_site: dict[str, str],
) -> None:
    site = _site()
    ledger = site.RenyiLedger(EPS, WINDOW)
    assert ledger.supports(_renyi())
    pure = PureCharge(AllUsers(), WindowScope(WINDOW), WINDOW, 10, 1.0, 1.0, EPS)
    assert not ledger.supports(pure)
    with pytest.raises(
        UnsupportedCharge, match=r"RenyiLedger cannot account a pure charge \(in ε\)"
    ):
        ledger.accept(pure)
    in_class = site.RenyiCharge(
        PrivacyClass(WINDOW, EPS), ClassScope(WINDOW), WINDOW, 10, 1, 1, EPS
    )
    for builtin, charge in ((BudgetLedger(EPS, WINDOW), _renyi()),
                            (PopulationLedger(10, WINDOW), in_class),
                            (PersonalizedLedger([WINDOW], [EPS]), in_class)):  # fmt: skip
        assert not builtin.supports(charge)
        with pytest.raises(UnsupportedCharge, match=r"cannot account a renyi charge \(in ε\(α\)\)"):
            builtin.accept(charge)


def test_the_accountant_composes_it_and_refuses_it_beside_a_built_in_measure(
    external_site: dict[str, str],
) -> None:
    accountant = PopulationAccountant()
    assert accountant.supports(_renyi())  # its type declares an additive unit
    key = ClassKey(WINDOW, EPS)
    accountant.charge_events(1, [([_renyi(2.0)], 0.5, key), ([_renyi(2.5)], 0.5, key)])
    assert accountant.last == {key: 4.5}
    pure = PureCharge(AllUsers(), WindowScope(WINDOW), WINDOW, 10, 0.1, 0.1, EPS)
    with pytest.raises(UnsupportedCharge, match=r"a renyi charge \(in ε\(α\)\) and a pure charge"):
        accountant.charge_events(2, [([_renyi()], 0.5, key), ([pure], 0.5, key)])


def test_one_stream_of_it_and_a_built_in_measure_halts_before_release(
    external_site: dict[str, str],
) -> None:
    """RGM and LBU on one population (shares ½): the driver refuses the slot with the reason,
    every stepped mechanism halts and nothing of it is released."""
    site, n = _site(), LDP_IDS.mechanisms["LBU"].conformance.population
    rgm = registry.family("example-measure").build("RGM", site.RgmConfig(EPS / 2, WINDOW, n))
    lbu = LDP_IDS.build("LBU", LdpIdsConfig(epsilon=EPS / 2, window=WINDOW, population=n))
    lanes = {name: Lane(m, m.initial_state(), m.client_state(), 0.5, ClassKey(WINDOW, EPS))
             for name, m in (("RGM", rgm), ("LBU", lbu))}  # fmt: skip
    mechs = {"RGM": rgm, "LBU": lbu}

    def port_for(name: str, randomness: SlotRandomness, clients: Any) -> Any:
        return make_slot(mechs[name], 1, clients=clients).port

    step = drive_slot(lanes, "s", 1, port_for, lambda n: SlotRandomness(1, "s", 1, scope=n),
                      accountant=PopulationAccountant())  # fmt: skip
    assert not step.stepped and {h.name for h in step.halts} == {"RGM", "LBU"}
    assert all("do not add" in h.reason and h.violation for h in step.halts), step.halts


def test_an_overspend_of_its_budget_halts_before_release(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    """charge_scale 2: each slot charges 2ε/w = 2, so slot 3 would spend 6 > ε(α) = 5 in the
    window: its ledger refuses before anybody reports, and slot 3 is never released."""
    releases, ledger = _run(tmp_path, "--charge-scale", "2")
    assert [r["slot"] for r in releases] == [1, 2]
    entries = [e for e in ledger if e["kind"] == "ledger"]
    assert [e["classes"][0]["spent"] for e in entries] == [2.0, 4.0]
    (halt,) = [e for e in ledger if e["kind"] == "halt"]
    assert halt["slot"] == 3 and "ε(α=8) = 6 > budget 5" in halt["reason"]


def test_privstream_run_in_process_and_the_audit(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    releases, ledger = _run(tmp_path)
    _check_releases(releases)
    assert [e["classes"][0]["spent"] for e in ledger] == [
        float(min(t, WINDOW)) for t in range(1, SLOTS + 1)
    ]
    argv = ["audit", "--releases", str(tmp_path / "rgm.jsonl"), "--ledger",
            str(tmp_path / "rgm-ledger.jsonl"), "--allow-insecure-seed", "--population",
            str(USERS), "--expect-slots", str(SLOTS), "--max-delta", "1e-5", "--no-progress",
            "--json", str(tmp_path / "audit.json")]  # fmt: skip
    # (α, ε)-RDP is (ε + ln(1/δ)/(α−1), δ)-DP: 5 + ln(10⁵)/7 = 6.6447 at δ = 10⁻⁵
    at_delta = EPS + math.log(1e5) / 7
    assert main([*argv, "--max-epsilon", f"{at_delta * 1.001}"]) == 0
    assert main([*argv, "--max-epsilon", f"{at_delta * 0.999}"]) != 0
    report = json.loads((tmp_path / "audit.json").read_text())
    over = [p["detail"] for p in report["problems"] if p["kind"] == "guarantee_over_expected"]
    assert over and "renyi ε(α)=5 over window" in over[0]


def test_privstream_run_in_a_subprocess(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "rgm.jsonl"
    surfaces.run_subprocess(external_site, [*ARGV, "--out", str(out)])
    _check_releases(surfaces.lines(out))


def test_the_metrics_show_its_unit(external_site: dict[str, str]) -> None:
    from tests.test_metrics import scrape

    mech = _mechanism(users=_site().RGM.conformance.population)
    state, tally = mech.initial_state(), Tally()
    for t in (1, 2):
        state, events = mech.step(state, make_slot(mech, t))
        tally.record(e for e in events if not hasattr(e, "payer"))
    board = LedgerBoard()
    board.update("s", "RGM", mech.privacy_cost, mech.config.population, tally, False)
    got = scrape(board)
    labels = (("class", "w5_renyi5"), ("measure", "renyi"), ("mechanism", "RGM"), ("stream", "s"))
    assert got["privstream_class_budget_spent"] == {labels: 2.0}
    assert got["privstream_measure_unit"] == {
        (("measure", "renyi"), ("scale", "linear"), ("unit", "ε(α)")): 1.0
    }


def _flow(path: Path, charge_scale: float) -> Path:
    stream = {"name": "renyi", "family": "example-measure", "mechanisms": ["RGM"], "domain": 2,
              "charge_scale": charge_scale, "share": 1.0}  # fmt: skip
    population = {"users": 1000, "epsilon": 5.0, "window": 5}
    return surfaces.flow_file(path, population=population, streams=[stream])


def test_a_flow_file_with_the_family_checks_in_its_unit(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _flow(tmp_path / "good.toml", 1.0), _flow(tmp_path / "bad.toml", 0)
    surfaces.assert_flow_check(
        capsys, good, ["example-measure", "Rényi DP: ε(α) = 5"], bad, "charge_scale"
    )


def test_the_bench_harness(external_site: dict[str, str], tmp_path: Path) -> None:
    results = surfaces.bench(tmp_path, "example-measure", "--users", str(USERS), "--slots", str(SLOTS),
                    "--seeds", "2")  # fmt: skip
    (mae,) = {r["mae"] for r in results.values()}
    # mean |N(0, σ²/n)| = σ√(2/π)/√n; the value's own spread p(1−p)/n is at most 1/(4n)
    sd = math.sqrt(_site().variance(_mechanism().config, 0.5))
    assert 0.5 * sd * math.sqrt(2 / math.pi) < mae < 2 * sd


def test_the_conformance_checks_pass(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-measure", ["RGM"])
    assert {"pickle_restore", "purity_and_replay", "recovery_round_trip"} <= set(ran)
