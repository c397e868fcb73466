"""Finding 3 of the privacy audit: mechanisms side by side compose, and nothing accounted for it.

Reproduced: seven LDP-IDS mechanisms over one population, each with the full ε, charged a user
up to 6.84ε over one window while every ledger said ≤ ε. Fixed: a production run divides ε
among its mechanisms (``BudgetSplit``), the population accountant composes their spend at every
slot and refuses an overspend before release, and a side-by-side comparison is an explicit
evaluation whose outputs say so. The composed spend is recomputed here from the ledger entries,
independently of the accountant.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.accountant import BudgetSplit, PopulationAccountant
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee
from privstream.mechanisms.ldp_ids import LBU, MECHANISMS, LdpIdsConfig
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.operators.slotting import slotted_mechanism
from privstream.schema.events import EventBatch
from tests.attacks.helpers import Outputs, run_operator

N, T, W, EPS = 2000, 30, 5, 1.0
ALL = list(MECHANISMS)


def batches(n: int = N, t_max: int = T) -> list[EventBatch]:
    rng = np.random.default_rng(11)
    return [
        EventBatch(
            "s", np.full(n, t), np.arange(n), (rng.random(n) < 0.3 + t / 100).astype(float),
            None, t,
        )
        for t in range(1, t_max + 1)
    ]  # fmt: skip


def per_user_spend(entry: dict[str, Any]) -> float:
    """What the mechanism charged its most-charged user over the window ending at the entry's
    slot, read from the entry alone: budget division spends its one class's ``window_spent`` on
    every user; population division spends ``ε`` once per window on the users who reported in
    it (the details' ``window_users``)."""
    if entry["division"] == "budget":
        (one,) = entry["classes"]
        return float(one["spent"])
    reported = entry["details"]["window_users"] > 0
    return float(entry["guarantee"]["epsilon"]) if reported else 0.0


def composed(out: Outputs) -> dict[int, float]:
    total: dict[int, float] = defaultdict(float)
    for entry in out["ledger"]:
        if entry.get("kind") != "halt":
            total[entry["slot"]] += per_user_spend(entry)
    return total


def run_ldp(split: BudgetSplit) -> Outputs:
    config = LdpIdsConfig(epsilon=EPS, window=W, population=N)
    return run_operator(
        batches(),
        lambda keyed: family_mechanisms(
            "l", keyed, family=LDP_IDS, mechanism=ALL, config=config, secret=3, split=split
        ),
    )


def test_side_by_side_with_the_full_budget_overspends_and_says_so() -> None:
    """The audit's run, as an explicit evaluation: the composed per-user spend far exceeds ε,
    the accountant reports it, and every output is marked an evaluation."""
    out = run_ldp(BudgetSplit.parse(None, len(ALL), compare=True))
    worst = max(composed(out).values())
    assert worst > 5 * EPS  # the audit measured 6.84ε
    assert all(r["evaluation"] for r in out["releases"] + out["ledger"])
    assert max(e["population_spent"] for e in out["ledger"]) == pytest.approx(worst)
    assert REGISTRY.get_sample_value("privstream_evaluation") == 1.0


def test_an_equal_split_keeps_every_user_within_epsilon() -> None:
    out = run_ldp(BudgetSplit.parse("equal", len(ALL)))
    assert all(r["guarantee"]["epsilon"] == pytest.approx(EPS / len(ALL)) for r in out["releases"])
    assert len(out["releases"]) == len(ALL) * T  # nobody halted
    spend = composed(out)
    assert len(spend) == T and max(spend.values()) <= budget_limit(EPS)
    assert max(spend.values()) > 0.8 * EPS  # and the budget is actually used
    for entry in out["ledger"]:
        assert entry["population_budget"] == EPS and not entry["evaluation"]
        assert entry["population_spent"] == pytest.approx(spend[entry["slot"]])
    assert REGISTRY.get_sample_value("privstream_evaluation") == 0.0
    assert (
        REGISTRY.get_sample_value(
            "privstream_population_budget", {"stream": "s", "measure": "pure"}
        )
        == EPS
    )


def test_weights_divide_the_budget() -> None:
    split = BudgetSplit.parse("3,1", 2)
    assert split.shares == (0.75, 0.25)
    config = LdpIdsConfig(epsilon=EPS, window=W, population=N)
    out = run_operator(
        batches(),
        lambda k: family_mechanisms(
            "l", k, family=LDP_IDS, mechanism=["LBU", "LPA"], config=config, secret=3, split=split
        ),
    )
    eps = {r["mechanism"]: r["guarantee"]["epsilon"] for r in out["releases"]}
    assert eps == {"LBU": pytest.approx(0.75), "LPA": pytest.approx(0.25)}
    assert max(composed(out).values()) <= budget_limit(EPS)


class _Understated(LBU):
    """An LBU that declares half of the budget it spends (a mechanism bug): its own ledger is
    happy, only the composition can see the overspend."""

    name = "LBU_a"

    @property
    def privacy_cost(self) -> Guarantee:
        return super().privacy_cost.scaled(0.5)


class _Understated2(_Understated):
    name = "LBU_b"


def test_an_overspend_is_refused_before_release() -> None:
    """Two LBUs that each spend the full ε while declaring an equal split: at the first slot
    where their composed window spend 2·t·ε/w passes ε, both halt and nothing of it is
    released."""
    config = LdpIdsConfig(epsilon=EPS, window=W, population=N)
    mechanisms = [_Understated(config), _Understated2(config)]
    out = run_operator(
        batches(),
        lambda keyed: slotted_mechanism(
            "m", keyed, mechanisms=mechanisms, task=config.task, population=N, secret=1,
            split=BudgetSplit.parse("equal", 2), epsilon=EPS,
        ),
    )  # fmt: skip
    last = W // 2  # 2·(t/w)·ε ≤ ε up to t = w/2
    assert max(r["slot"] for r in out["releases"]) == last
    assert max(composed(out).values()) <= budget_limit(EPS)
    halts = [e for e in out["ledger"] if e.get("kind") == "halt"]
    assert sorted((h["mechanism"], h["slot"]) for h in halts) == [("LBU_a", 3), ("LBU_b", 3)]
    assert all("population budget refused slot 3" in h["reason"] for h in halts)
    for name in ("LBU_a", "LBU_b"):
        labels = {"stream": "s", "mechanism": name}
        assert REGISTRY.get_sample_value("privstream_privacy_violations_total", labels) == 1.0
        assert REGISTRY.get_sample_value("privstream_halted", labels) == 1.0


def test_mechanisms_built_without_their_share_are_refused() -> None:
    config = LdpIdsConfig(epsilon=EPS, window=W, population=N)
    with pytest.raises(ValueError, match="build it with its share"):
        run_operator(
            batches(t_max=1),
            lambda keyed: slotted_mechanism(
                "m", keyed, mechanisms=[LDP_IDS.build("LBU", config), LDP_IDS.build("LPA", config)],
                task=config.task, population=N, secret=1, split=BudgetSplit.parse("equal", 2),
                epsilon=EPS,
            ),
        )  # fmt: skip


def test_several_mechanisms_must_say_how_they_share() -> None:
    with pytest.raises(ValueError, match="--budget-split"):
        BudgetSplit.parse(None, 2)
    with pytest.raises(ValueError, match="positive finite weights"):
        BudgetSplit.parse("1,0", 2)
    with pytest.raises(ValueError, match="drop --budget-split"):
        BudgetSplit.parse("equal", 2, compare=True)
    config = LdpIdsConfig(epsilon=EPS, window=W, population=N)
    with pytest.raises(ValueError, match="compose"):
        run_operator(
            batches(t_max=1),
            lambda k: family_mechanisms(
                "l", k, family=LDP_IDS, mechanism=["LBU", "LPA"], config=config, secret=3
            ),
        )


def test_personalized_classes_compose_per_class() -> None:
    """Per-class accounting: every class's composed spend stays within its own ε_c."""
    kind = np.arange(N) % 2
    prefs = Preferences(epsilons=np.array([1.0, 2.0])[kind], windows=np.array([5, 3])[kind])
    config = PersonalizedConfig(population=N, epsilon=EPS, window=W)
    names = ["PBD", "PBA", "PU", "Uniform"]
    out = run_operator(
        batches(),
        lambda keyed: family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism=names, config=config, secret=5,
            registration=prefs, split=BudgetSplit.parse("equal", len(names)),
        ),
    )  # fmt: skip
    assert len(out["releases"]) == len(names) * T
    total: dict[tuple[int, int, float], float] = defaultdict(float)
    for entry in out["ledger"]:
        for c in entry["classes"]:
            total[(entry["slot"], c["scope"], c["budget"] * len(names))] += c["spent"]
    assert {round(k[2], 9) for k in total} == {1.0, 2.0}
    assert all(spent <= budget_limit(eps) for (_, _, eps), spent in total.items())


def test_the_accountant_refuses_and_then_reports() -> None:
    accountant = PopulationAccountant()
    accountant.charge(1, [{(5, 1.0): 0.5}, {(5, 1.0): 0.45}, {(3, 2.0): 1.9}])
    assert accountant.worst() == (5, 1.0, 0.95)
    with pytest.raises(PrivacyBudgetExceeded, match="population budget"):
        accountant.charge(2, [{(5, 1.0): 0.6}, {(5, 1.0): 0.5}])
    assert accountant.worst() == (5, 1.0, 0.95)  # a refused charge changes nothing
