"""The family template's promise, tested on a worked example: a new family is one mechanisms
module and one registry entry; the CLI, the flow, the bench harness and the conformance checks
run it with no change of their own (docs/architecture.md, "Adding a family").

The example family ``toy`` has one mechanism, ``EVERY``: every user reports with ε/w at every
slot, so it is w-event ε-DP in the local model (ε-LDP per window), like LBU of LDP-IDS.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from privstream.cli import commands as cli
from privstream.conformance.checks import yield_checks
from privstream.experiments import scores as utility
from privstream.families import registry
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    LedgerEntry,
    Mechanism,
    Release,
    Slot,
    Strategy,
)
from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
from privstream.mechanisms.ledger import BudgetLedger
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_population, check_requirement

# -- 1. the family's mechanisms module (here inline) ---------------------------------------------


@dataclass(frozen=True)
class ToyConfig:
    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)

    def shared(self, share: float) -> ToyConfig:
        return dataclasses.replace(self, epsilon=self.epsilon * share)


@dataclass
class ToyState:
    mechanism: str
    ledger: BudgetLedger
    version: int = 1
    t: int = 0
    last_slot: int | None = None
    estimate: tuple[float, ...] = ()
    source_slot: int | None = None


@dataclass(frozen=True)
class ToyDetails(Details):
    family: ClassVar[str] = "toy"
    reports: int


class Every(Mechanism[ToyConfig, ToyState]):
    """Every user reports with ε/w at every slot (spec ldp-ids §3.1, as LBU)."""

    name = "EVERY"
    state_version = 1
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    conformance = Conformance(invalid=(("epsilon", 0.0), ("window", 0), ("population", 0)))

    @property
    def privacy_cost(self) -> Guarantee:
        return Guarantee(PureDP(self.config.epsilon), WindowScope(self.config.window), "ldp")

    def initial_state(self) -> ToyState:
        return ToyState(self.name, BudgetLedger(self.config.epsilon, self.config.window))

    def _advance(self, state: ToyState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg = self.config
        self.enter(state, slot, slot.client.population, cfg.population)
        eps = cfg.epsilon / cfg.window
        state.ledger.charge(state.t, eps, "m2")
        strategy: Strategy = "approximate"
        reports = 0
        if slot.client.eligible().any():
            agg = slot.client.collect(None, eps, purpose="m2")
            state.estimate, state.source_slot = tuple(agg.estimate.tolist()), slot.index
            reports, strategy = agg.reports, "publish"
        spend = ClassSpend(cfg.window, cfg.epsilon, cfg.population, eps,
                           state.ledger.window_spent(state.t))  # fmt: skip
        estimate = state.estimate or (0.0,) * cfg.task.d
        return [
            self.release(slot, strategy, estimate, state.source_slot, ToyDetails(reports)),
            self.ledger_entry(slot, (spend,), ToyDetails(reports)),
        ]


# -- 2. its registry entry ----------------------------------------------------------------------

TOY = registry.Family(
    name="toy",
    summary="a worked example family",
    mechanisms={"EVERY": Every},
    config=ToyConfig,
    epsilon=1.0,
    window=5,
    users=500,
    default="EVERY",
    bench=registry.BenchSpec(
        datasets=("sin",),
        files=False,
        counts=False,
        score=utility.ldp_ids_scores,
        fields=("mre", "mae", "bits_per_user", "publications", "seconds"),
        mechanisms=("EVERY",),
        users=500,
        slots=20,
    ),
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> registry.Family:
    monkeypatch.setitem(registry.families(), "toy", TOY)  # the cached discovery
    return TOY


# -- 3. the template runs it --------------------------------------------------------------------


def test_privstream_run_runs_a_new_family(toy: registry.Family, tmp_path: Path) -> None:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    rc = cli.main(["run", "toy", "--users", "500", "--slots", "12", "--insecure-seed", "4",
                   "--out", str(out), "--ledger-out", str(ledger), "--no-progress"])  # fmt: skip
    assert rc == 0
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["slot"] for r in releases] == list(range(1, 13))
    assert {r["details"]["family"] for r in releases} == {"toy"}
    assert releases[0]["guarantee"] == {"measure": "pure", "epsilon": 1.0, "scope": "window",
                                        "window": 5, "model": "ldp"}  # fmt: skip
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert max(e["classes"][0]["spent"] for e in entries) == pytest.approx(1.0)


def test_privstream_bench_runs_a_new_family(toy: registry.Family, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "toy", "--slots", "20", "--json", str(path), "--no-progress"])
    assert rc == 0
    result = json.loads(path.read_text())
    assert result["params"]["family"] == "toy"
    assert set(result["results"]["EVERY"]) == set(TOY.bench.fields)
    assert result["results"]["EVERY"]["publications"] == 20


def test_every_conformance_check_runs_on_a_new_family(toy: registry.Family) -> None:
    checks = list(yield_checks(registry.Registered(toy, "EVERY")))
    assert len(checks) == 13
    for check in checks:
        check()


def test_the_cli_offers_the_family_with_its_defaults(
    toy: registry.Family, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "toy", "--help"])
    text = capsys.readouterr().out
    # LDP families take a registration table too (a closed population, issue 18 §4)
    assert "--client-path" in text and "--registrations" in text and "EVERY" in text


def test_an_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        registry.family("nope")
