"""A family whose devices keep per-user state across slots (issue 19's worked example, "per-user
device state"), from outside privstream's packages: memoized randomized response in the manner
of RAPPOR (Erlingsson, Pihur & Korolova, CCS 2014, §3).

Each user's device holds, for each value ``v ∈ {0, 1}`` it has held, a **permanent** randomized
bit ``B_v`` drawn once (``v`` kept with ``p = e^{ε∞}/(1+e^{ε∞})``, else flipped) and memoized
for the life of the stream. Every slot it reports ``B_{v_t}`` through a fresh **instantaneous**
randomized response at ``ε/w`` (kept with ``q = e^{ε/w}/(1+e^{ε/w})``). The memo is the
client state (``Mechanism.client_state``): it lives in the stream's snapshotted state, only the
client port hands it to the devices, and the server step sees the reports alone.

Guarantee: w-event ε-LDP. Whatever the device's memo holds, a report is 1 with probability in
``[1−q, q]``, so two value sequences differing within w consecutive slots change the likelihood
of every output by at most ``(q/(1−q))^w = e^ε`` (pointwise in the memo, hence after it); the
``BudgetLedger`` charges every user ``ε/w`` per slot. Beside it, the longitudinal guarantee of
the permanent response: a user whose value never changes reveals at most ``ε∞`` about it over
any number of slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family, Option
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Division,
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

UNDRAWN: Final = -1
"""A memo entry of a value the user has not held yet."""


def keep(eps: float) -> float:
    """Randomized response's probability of keeping the bit, ``e^ε/(1+e^ε)``."""
    return math.exp(eps) / (1 + math.exp(eps))


def report_one(permanent: float, instantaneous: float) -> float:
    """``a``: a report is 1 with probability ``a`` when the value is 1 and ``1 − a`` when it is
    0, ``a = q·p + (1−q)(1−p)`` (both responses kept, or both flipped)."""
    p, q = keep(permanent), keep(instantaneous)
    return q * p + (1 - q) * (1 - p)


def variance(permanent: float, instantaneous: float, m: int) -> float:
    """Variance of the de-biased fraction of ones over ``m`` reports (over the memo's and the
    slot's draws): ``a(1−a) / (m (2a−1)²)``."""
    a = report_one(permanent, instantaneous)
    return a * (1 - a) / (m * (2 * a - 1) ** 2)


@dataclass(frozen=True)
class MemoConfig:
    """ε over a window of w slots, n users, the binary task, and ``permanent_epsilon`` (ε∞ of
    the memoized permanent response, > 0)."""

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    permanent_epsilon: float = 2.0

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not isinstance(self.task, FrequencyTask) or self.task.d != 2:
            raise ValueError(f"task must be a histogram over 2 categories, got {self.task!r}")
        eps = self.permanent_epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 50:
            raise ValueError(f"permanent_epsilon must lie in (0, 50), got {eps!r}")

    def shared(self, share: float) -> MemoConfig:
        return replace(self, epsilon=self.epsilon * share)


@dataclass
class Memo:
    """The devices' state: ``permanent[u, v]`` is user u's permanent bit for value v
    (``UNDRAWN`` until u first holds v). Secret: it is the randomised value itself."""

    permanent: NDArray[np.int8]

    def __repr__(self) -> str:  # never print the users' bits
        drawn = int((self.permanent != UNDRAWN).sum())
        return f"Memo(users={self.permanent.shape[0]}, drawn={drawn})"


@dataclass(frozen=True)
class MemoizedResponse:
    """The device side of one slot (a ``ClientProtocol``): draw the permanent bit of a value
    held for the first time, then report it through instantaneous randomized response."""

    permanent: float
    instantaneous: float
    task: EstimationTask

    def respond(
        self, values: NDArray[Any], asked: NDArray[np.bool_], state: Memo,
        rng: np.random.Generator,
    ) -> tuple[NDArray[np.float64], Memo]:  # fmt: skip
        users = np.flatnonzero(asked)
        bits = np.asarray(self.task.encode(np.asarray(values)[users]), dtype=np.int64)
        memo = Memo(state.permanent.copy())
        new = memo.permanent[users, bits] == UNDRAWN
        flip = rng.random(int(new.sum())) >= keep(self.permanent)
        memo.permanent[users[new], bits[new]] = np.where(flip, 1 - bits[new], bits[new])
        held = memo.permanent[users, bits].astype(np.float64)
        fresh = rng.random(users.shape[0]) >= keep(self.instantaneous)
        return np.where(fresh, 1.0 - held, held).reshape(-1, 1), memo


STATE_VERSION: Final = 1


@dataclass
class MemoState:
    """The server's state: its slot counter, the budget ledger and the last release. No user's
    value, report or memo entry."""

    mechanism: str
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    estimate: tuple[float, float] = (0.5, 0.5)
    source_slot: int | None = None
    ledger: BudgetLedger | None = None


@dataclass(frozen=True)
class MemoRelease(Details):
    """What a release says: the reports de-biased, and the two randomized responses' ε."""

    family: ClassVar[str] = "example-device-state"
    reports: int
    epsilon_instantaneous: float
    epsilon_permanent: float


@dataclass(frozen=True)
class MemoLedger(Details):
    """The slot's reports and the longitudinal bound of the memo: a user whose value never
    changes reveals at most ``longitudinal_epsilon`` (ε∞) about it over the stream."""

    family: ClassVar[str] = "example-device-state"
    reports: int
    longitudinal_epsilon: float


class MRR(Mechanism[MemoConfig, MemoState]):
    """Memoized randomized response (spec RAPPOR §3: permanent, then instantaneous randomized
    response): every user reports each slot at ε/w; the server de-biases the fraction of ones
    ``(mean − (1−a))/(2a−1)`` from the reports alone."""

    name = "MRR"
    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    division: ClassVar[Division] = "budget"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("window", 0), ("population", 0),
                 ("permanent_epsilon", 0.0), ("permanent_epsilon", float("nan"))),
    )  # fmt: skip

    @property
    def privacy_cost(self) -> Guarantee:
        return Guarantee(PureDP(self.config.epsilon), WindowScope(self.config.window), "ldp")

    @property
    def instantaneous(self) -> float:
        return float(self.config.epsilon / self.config.window)

    def initial_state(self) -> MemoState:
        return MemoState(self.name, ledger=BudgetLedger(self.config.epsilon, self.config.window))

    def client_state(self) -> Memo:
        return Memo(np.full((self.config.population, 2), UNDRAWN, dtype=np.int8))

    def protocol(self) -> MemoizedResponse:
        return MemoizedResponse(self.config.permanent_epsilon, self.instantaneous,
                                self.config.task)  # fmt: skip

    def _advance(self, state: MemoState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg, eps = self.config, self.instantaneous
        self.enter(state, slot, slot.client.population, cfg.population)
        assert state.ledger is not None
        state.ledger.charge(state.t, eps, "m2")  # every user, before anybody reports
        asked = slot.client.eligible()
        m = int(asked.sum())
        if m:
            reports = slot.client.respond(self.protocol(), asked, "report")
            a = report_one(cfg.permanent_epsilon, eps)
            ones = (float(reports.mean()) - (1 - a)) / (2 * a - 1)
            state.estimate, state.source_slot = (1.0 - ones, ones), slot.index
        details = MemoRelease(m, eps, cfg.permanent_epsilon)
        strategy: Strategy = "publish" if m else "approximate"
        spend = ClassSpend(cfg.window, cfg.epsilon, cfg.population, eps,
                           state.ledger.window_spent(state.t))  # fmt: skip
        return [
            self.release(slot, strategy, state.estimate, state.source_slot, details),
            self.ledger_entry(slot, (spend,), MemoLedger(m, cfg.permanent_epsilon)),
        ]


def _score(run: Any) -> dict[str, float]:
    return {"mae": float(np.mean(np.abs(run.estimates[:, 1] - run.truth[:, 1])))}


def _positive(text: str) -> float:
    value = float(text)
    if not 0 < value < 50:
        raise ValueError(f"must lie in (0, 50), got {text}")
    return value


FAMILY: Final = Family(
    name="example-device-state",
    summary="worked example: memoized randomized response, a per-user memo on the devices",
    mechanisms={"MRR": MRR},
    config=MemoConfig,
    epsilon=5.0,
    window=5,
    users=4000,
    default="MRR",
    oracle_reports=False,
    options=(Option("permanent_epsilon", _positive, 2.0,
                    "ε∞ of the memoized permanent response"),),
    bench=BenchSpec(datasets=("sin",), files=False, counts=False, score=_score,
                    fields=("mae",), mechanisms=("MRR",), users=4000, slots=20),
)  # fmt: skip
