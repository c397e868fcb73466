"""A family with a division of its own (issue 19's worked example, "a new division"), from
outside privstream's packages: **cohorts**. The n users are split into k public cohorts (user
``u`` is in cohort ``u mod k``); slot t charges one cohort, ``c_t = (t − 1) mod k``
(round-robin), whose members each send one randomized response at ``ε_s``.

Guarantee: w-event ε-LDP. Any w consecutive slots charge one cohort at most ``⌈w/k⌉`` times, so
with ``ε_s = ε / ⌈w/k⌉`` a user's spend over any window — the sum over the slots their cohort
was charged — is at most ε (sequential composition of ε_s-LDP reports); a user outside the
charged cohort sends nothing and spends nothing.

What the audit needs is public in every ledger entry: the cohort charged (``details.cohort``)
and the charge (``classes[0].charged``). The division's ``recompute`` sums, per cohort, the
charges of the slots it was charged in the window ending at each entry and takes the
most-charged cohort: the entry's ``spent`` must not claim less.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family, Option
from privstream.mechanisms.accounting import DivisionSpec, PureCharge
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Division,
    LedgerEntry,
    Mechanism,
    Release,
    Slot,
)
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_population, check_requirement


@dataclass(frozen=True)
class CohortMember:
    """The payer of a cohort charge: every member of the cohort charged at the slot (the
    charge's ``spent`` is the most-charged cohort's)."""

    kind: ClassVar[str] = "cohort"


def cohort_of(slot: int, cohorts: int) -> int:
    """The cohort slot ``slot`` charges (round-robin from slot 1)."""
    return (slot - 1) % cohorts


def recompute(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """The audit of the cohort division from the public entries of one mechanism (slot
    order): at each entry, the most-charged cohort's sum of charges over the window of w slots
    ending there, and the budget."""
    out = []
    for entry in entries:
        cls, t = entry["classes"][0], entry["slot"]
        per: dict[int, float] = {}
        for e in entries:
            if t - cls["scope"] < e["slot"] <= t:
                cohort = int(e["details"]["cohort"])
                per[cohort] = per.get(cohort, 0.0) + float(e["classes"][0]["charged"])
        out.append((t, max(per.values(), default=0.0), float(cls["budget"])))
    return out


COHORTS: Final = DivisionSpec(
    "cohort",
    lambda _spend, _personalized: CohortMember(),
    recompute,
    summary="k public cohorts, one charged per slot (round-robin)",
)


@dataclass
class CohortLedger:
    """Each cohort's charges by slot; refuses (unchanged) a charge that would take a cohort
    past ε over the window ending at the slot."""

    epsilon: float
    window: int
    cohorts: int
    charges: dict[int, tuple[int, float]] = field(default_factory=dict)

    def spent(self, t: int) -> float:
        """The most-charged cohort's spend over the window ending at t."""
        per = [0.0] * self.cohorts
        for s, (cohort, amount) in self.charges.items():
            if t - self.window < s <= t:
                per[cohort] += amount
        return max(per)

    def charge(self, t: int, cohort: int, amount: float) -> None:
        trial = {**self.charges, t: (cohort, amount)}
        spent = CohortLedger(self.epsilon, self.window, self.cohorts, trial).spent(t)
        if spent > budget_limit(self.epsilon):
            raise PrivacyBudgetExceeded(
                f"slot {t} would charge cohort {cohort} {spent:.6g} > ε={self.epsilon:g} over "
                f"the window of {self.window} slot(s) ending at it"
            )
        self.charges = {s: v for s, v in trial.items() if s > t - self.window}


@dataclass(frozen=True)
class CohortConfig:
    """ε over a window of w slots, n users, the binary task and k cohorts (2 ≤ k ≤ n)."""

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    cohorts: int = 3

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not isinstance(self.task, FrequencyTask) or self.task.d != 2:
            raise ValueError(f"task must be a histogram over 2 categories, got {self.task!r}")
        k = self.cohorts
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= self.population:
            raise ValueError(f"cohorts must be an integer in [2, n], got {k!r}")

    def shared(self, share: float) -> CohortConfig:
        return replace(self, epsilon=self.epsilon * share)

    @property
    def slot_epsilon(self) -> float:
        """ε_s = ε / ⌈w/k⌉: a cohort is charged at most ⌈w/k⌉ times in any window."""
        return self.epsilon / math.ceil(self.window / self.cohorts)


def keep(eps: float) -> float:
    return math.exp(eps) / (1 + math.exp(eps))


def variance(eps: float, m: int) -> float:
    """Variance of the de-biased fraction of ones over m randomized responses at ε:
    ``q(1−q) / (m (2q−1)²)``, q = e^ε/(1+e^ε)."""
    q = keep(eps)
    return q * (1 - q) / (m * (2 * q - 1) ** 2)


@dataclass(frozen=True)
class RandomizedResponse:
    eps: float
    task: EstimationTask

    def respond(self, values: NDArray[Any], asked: NDArray[np.bool_], state: Any,
                rng: np.random.Generator) -> tuple[NDArray[np.float64], Any]:  # fmt: skip
        bits = np.asarray(self.task.encode(np.asarray(values)[asked]), dtype=np.float64)
        flip = rng.random(bits.shape[0]) >= keep(self.eps)
        return np.where(flip, 1.0 - bits, bits).reshape(-1, 1), state


@dataclass
class CohortState:
    mechanism: str
    version: int = 1
    t: int = 0
    last_slot: int | None = None
    ledger: CohortLedger | None = None


@dataclass(frozen=True)
class CohortDetails(Details):
    """The cohort the slot charged (public: what the audit recomputes the spend from)."""

    family: ClassVar[str] = "example-division"
    cohort: int
    cohorts: int
    reports: int
    epsilon_slot: float


class COH(Mechanism[CohortConfig, CohortState]):
    """Cohort randomized response (spec ldp-ids §3.1, LBU's randomized response, one public
    cohort per slot): the charged cohort's members report at ε_s, the server de-biases their
    fraction of ones."""

    name = "COH"
    state_version: ClassVar[int] = 1
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    division: ClassVar[Division] = "cohort"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("window", 0), ("population", 0), ("cohorts", 1)),
    )

    @property
    def privacy_cost(self) -> Guarantee:
        return Guarantee(PureDP(self.config.epsilon), WindowScope(self.config.window), "ldp")

    def initial_state(self) -> CohortState:
        cfg = self.config
        return CohortState(self.name, ledger=CohortLedger(cfg.epsilon, cfg.window, cfg.cohorts))

    def charges(self, entry: LedgerEntry) -> tuple[PureCharge, ...]:
        """One pure charge to the charged cohort's members (its most-charged member's spend)."""
        return tuple(
            PureCharge(
                CohortMember(),
                WindowScope(c.scope),
                c.scope,
                c.users,
                c.charged,  # type: ignore[arg-type]
                c.spent,
                c.budget,
            )
            for c in entry.classes
        )

    def _advance(self, state: CohortState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg = self.config
        self.enter(state, slot, slot.client.population, cfg.population)
        assert state.ledger is not None
        cohort, eps = cohort_of(slot.index, cfg.cohorts), cfg.slot_epsilon
        state.ledger.charge(state.t, cohort, eps)  # the cohort, before anybody reports
        members = np.arange(cfg.population) % cfg.cohorts == cohort
        asked = slot.client.eligible() & members
        m = int(asked.sum())
        estimate = (0.5, 0.5)
        if m:
            reports = slot.client.respond(RandomizedResponse(eps, cfg.task), asked, "report")
            q = keep(eps)
            ones = (float(reports.mean()) - (1 - q)) / (2 * q - 1)
            estimate = (1.0 - ones, ones)
        details = CohortDetails(cohort, cfg.cohorts, m, eps)
        spend = ClassSpend(cfg.window, cfg.epsilon, cfg.population, eps,
                           state.ledger.spent(state.t))  # fmt: skip
        strategy = "publish" if m else "approximate"
        return [
            self.release(slot, strategy, estimate, slot.index if m else None, details),
            self.ledger_entry(slot, (spend,), details),
        ]


def _score(run: Any) -> dict[str, float]:
    return {"mae": float(np.mean(np.abs(run.estimates[:, 1] - run.truth[:, 1])))}


def _cohorts(text: str) -> int:
    value = int(text)
    if value < 2:
        raise ValueError(f"must be at least 2, got {text}")
    return value


FAMILY: Final = Family(
    name="example-division",
    summary="worked example: k public cohorts, one charged per slot (a division of its own)",
    mechanisms={"COH": COH},
    config=CohortConfig,
    epsilon=4.0,
    window=6,
    users=6000,
    default="COH",
    oracle_reports=False,
    options=(Option("cohorts", _cohorts, 3, "k public cohorts, one charged per slot"),),
    divisions=(COHORTS,),
    bench=BenchSpec(datasets=("sin",), files=False, counts=False, score=_score,
                    fields=("mae",), mechanisms=("COH",), users=6000, slots=20),
)  # fmt: skip
