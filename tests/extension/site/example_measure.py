"""A family with a privacy measure of its own (issue 19's worked example, "a new privacy measure
with its own ledger"), from outside privstream's packages: Rényi differential privacy of one
order α (Mironov, CSF 2017), charged by a local Gaussian mechanism.

Each slot every user's device reports its one-hot value ``e_v ∈ {0,1}²`` plus Gaussian noise
``N(0, σ² I)``. Replacing a user's value moves ``e_v`` by L2 distance Δ = √2, so one report is
``(α, α Δ²/(2σ²)) = (α, α/σ²)``-RDP (Mironov 2017, Prop. 7); RDP of one order adds under
sequential composition (Prop. 1), so with ``σ² = α·w/ε`` a report costs ``ε/w`` and any window
of w slots costs every user at most ``ε`` in ε(α): w-event (α, ε)-RDP, hence
``(ε + ln(1/δ)/(α−1), δ)``-DP for every δ (Prop. 3).

Its pieces, none of them known to privstream: the measure ``RenyiDP`` (the guarantee states its
additive budget and unit), the charge ``RenyiCharge`` (additive in ε(α), refuses another order),
the ledger ``RenyiLedger`` (accepts only its own charges, refuses an overspend before release) and
the mechanism ``RGM``. ``charge_scale`` (a test knob, default 1) charges each slot
``charge_scale·ε/w`` with the noise calibrated to it: above 1 the window overspends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family, Option
from privstream.mechanisms.accounting import (
    AllUsers,
    Charge,
    refuse,
    register_charge,
    window_of,
)
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
from privstream.mechanisms.guarantees import Guarantee, WindowScope
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_population, check_requirement

SENSITIVITY_SQ: Final = 2.0
"""Δ²: a one-hot vector moves by L2 distance √2 when the value changes."""
ALPHA: Final = 8.0
"""The family's Rényi order α (one order: RDP composes additively at a fixed order)."""


@dataclass(frozen=True)
class RenyiDP:
    """(α, ε)-Rényi DP at α = ``ALPHA``: the Rényi divergence of order α between the outputs on
    neighbouring inputs is at most ε. ε adds under composition; the additive budget is ε."""

    epsilon: float
    kind: ClassVar[str] = "renyi"
    alpha: ClassVar[float] = ALPHA

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"ε(α) must be a positive finite number, got {self.epsilon!r}")

    @property
    def budget(self) -> float:
        """The additive number the ledgers count (``guarantees.budget_of``)."""
        return self.epsilon

    def scaled(self, share: float) -> RenyiDP:
        return RenyiDP(self.epsilon * share)

    def epsilon_at(self, delta: float) -> float:
        """(ε + ln(1/δ)/(α−1), δ)-DP (Mironov 2017, Prop. 3)."""
        return self.epsilon + math.log(1 / delta) / (self.alpha - 1)

    def to_dict(self) -> dict[str, Any]:
        return {"measure": self.kind, "alpha": ALPHA, "budget": self.epsilon,
                "unit": RenyiCharge.symbol}  # fmt: skip


@register_charge
@dataclass(frozen=True)
class RenyiCharge(Charge):
    """A charge in ε(α) at the family's order α = ``ALPHA``: adds up (Mironov 2017, Prop. 1)."""

    measure: ClassVar[str] = "renyi"
    unit: ClassVar[str] = "ε(α)"
    additive: ClassVar[bool] = True
    symbol: ClassVar[str] = "ε(α)"
    label: ClassVar[str] = "renyi"
    title: ClassVar[str] = "Rényi DP"

    @classmethod
    def epsilon_at(cls, value: Any, delta: float) -> Any:
        """(ε + ln(1/δ)/(α−1), δ)-DP (Mironov 2017, Prop. 3)."""
        return value + math.log(1 / delta) / (ALPHA - 1)


@dataclass
class RenyiLedger:
    """Every user's ε(α) spend per window of w slots (budget division at one Rényi order).
    Accepts only ``RenyiCharge`` of its order and window; refuses an overspend unchanged."""

    budget: float
    window: int
    charges: dict[int, float] = field(default_factory=dict)

    def supports(self, event: Charge) -> bool:
        return (isinstance(event, RenyiCharge) and isinstance(event.payer, AllUsers)
                and window_of(event.scope) == self.window)  # fmt: skip

    def accept(self, event: Charge) -> None:
        if not self.supports(event):
            raise refuse("RenyiLedger", event, f"Rényi charges in ε(α) at α={ALPHA:g} "
                         f"to all users alike over its window (w={self.window})")  # fmt: skip

    def window_spent(self, t: int) -> float:
        return math.fsum(v for s, v in self.charges.items() if t - self.window < s <= t)

    def charge(self, t: int, amount: float) -> None:
        """Charge every user ``amount`` at slot t; refuse (leaving the ledger as it was) when
        the window ending at t would exceed the budget."""
        spent = self.window_spent(t) + amount
        if spent > budget_limit(self.budget):
            raise PrivacyBudgetExceeded(
                f"slot {t} would spend ε(α={ALPHA:g}) = {spent:.6g} > budget "
                f"{self.budget:g} in the window of {self.window} slot(s) ending at it"
            )
        self.charges = {s: v for s, v in self.charges.items() if s > t - self.window}
        self.charges[t] = amount


@dataclass(frozen=True)
class RgmConfig:
    """ε(α) over a window of w slots, n users, the binary task and the test knob
    ``charge_scale`` (each slot charges ``charge_scale·ε/w``)."""

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    charge_scale: float = 1.0

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not isinstance(self.task, FrequencyTask) or self.task.d != 2:
            raise ValueError(f"task must be a histogram over 2 categories, got {self.task!r}")
        RenyiDP(self.epsilon)
        if not (self.charge_scale > 0 and math.isfinite(self.charge_scale)):
            raise ValueError(f"charge_scale must be positive, got {self.charge_scale!r}")

    def shared(self, share: float) -> RgmConfig:
        return replace(self, epsilon=self.epsilon * share)

    @property
    def slot_epsilon(self) -> float:
        return self.charge_scale * self.epsilon / self.window

    @property
    def sigma(self) -> float:
        """σ with α Δ²/(2σ²) = the slot's ε(α)."""
        return math.sqrt(ALPHA * SENSITIVITY_SQ / (2 * self.slot_epsilon))


def variance(config: RgmConfig, p: float) -> float:
    """Variance of a release's coordinate: the fraction's ``p(1−p)/n`` plus the noise's
    ``σ²/n`` (over the users' values and the devices' draws)."""
    return (p * (1 - p) + config.sigma**2) / config.population


@dataclass(frozen=True)
class GaussianReport:
    """The device side: the one-hot value plus N(0, σ² I)."""

    sigma: float
    task: EstimationTask

    def respond(self, values: NDArray[Any], asked: NDArray[np.bool_], state: Any,
                rng: np.random.Generator) -> tuple[NDArray[np.float64], Any]:  # fmt: skip
        bits = np.asarray(self.task.encode(np.asarray(values)[asked]), dtype=np.int64)
        onehot = np.eye(2)[bits]
        return onehot + rng.normal(0.0, self.sigma, onehot.shape), state


STATE_VERSION: Final = 1


@dataclass
class RgmState:
    mechanism: str
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    ledger: RenyiLedger | None = None


@dataclass(frozen=True)
class RgmDetails(Details):
    family: ClassVar[str] = "example-measure"
    reports: int
    sigma: float


class RGM(Mechanism[RgmConfig, RgmState]):
    """The Rényi Gaussian mechanism on the devices (spec Mironov-2017 §VI, Prop. 7: the
    Gaussian mechanism is (α, αΔ²/(2σ²))-RDP): each slot charges every user ε(α)/w in its own
    ledger before anybody reports, then releases the mean report (unbiased)."""

    name = "RGM"
    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    division: ClassVar[Division] = "budget"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("window", 0), ("population", 0),
                 ("charge_scale", 0.0), ("charge_scale", float("nan"))),
    )  # fmt: skip

    @property
    def privacy_cost(self) -> Guarantee:
        measure = RenyiDP(self.config.epsilon)
        return Guarantee(measure, WindowScope(self.config.window), "ldp")  # type: ignore[arg-type]

    def initial_state(self) -> RgmState:
        cfg = self.config
        return RgmState(self.name, ledger=RenyiLedger(cfg.epsilon, cfg.window))

    def charges(self, entry: LedgerEntry) -> tuple[Charge, ...]:
        """One ``RenyiCharge`` per class (the step's accounting events)."""
        return tuple(
            RenyiCharge(
                AllUsers(), WindowScope(c.scope), c.scope, c.users, c.charged, c.spent, c.budget
            )
            for c in entry.classes
        )

    def _advance(self, state: RgmState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg = self.config
        self.enter(state, slot, slot.client.population, cfg.population)
        assert state.ledger is not None
        state.ledger.charge(state.t, cfg.slot_epsilon)  # every user, before anybody reports
        asked = slot.client.eligible()
        m = int(asked.sum())
        estimate = (0.5, 0.5)
        if m:
            reports = slot.client.respond(GaussianReport(cfg.sigma, cfg.task), asked, "report")
            estimate = tuple(float(x) for x in reports.mean(axis=0))  # type: ignore[assignment]
        spend = ClassSpend(cfg.window, cfg.epsilon, cfg.population, cfg.slot_epsilon,
                           state.ledger.window_spent(state.t))  # fmt: skip
        details = RgmDetails(m, cfg.sigma)
        return [
            self.release(
                slot,
                "publish" if m else "approximate",
                estimate,
                slot.index if m else None,
                details,
            ),
            self.ledger_entry(slot, (spend,), details),
        ]


def _score(run: Any) -> dict[str, float]:
    return {"mae": float(np.mean(np.abs(run.estimates[:, 1] - run.truth[:, 1])))}


def _scale(text: str) -> float:
    value = float(text)
    if not (0 < value < 1e6):
        raise ValueError(f"must be positive, got {text}")
    return value


FAMILY: Final = Family(
    name="example-measure",
    summary="worked example: Rényi DP of one order with its own ledger (local Gaussian noise)",
    mechanisms={"RGM": RGM},
    config=RgmConfig,
    epsilon=5.0,
    window=5,
    users=4000,
    default="RGM",
    oracle_reports=False,
    options=(Option("charge_scale", _scale, 1.0,
                    "each slot charges charge_scale·ε/w (above 1 the window overspends)"),),
    bench=BenchSpec(datasets=("sin",), files=False, counts=False, score=_score,
                    fields=("mae",), mechanisms=("RGM",), users=4000, slots=20),
)  # fmt: skip
