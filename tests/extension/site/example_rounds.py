"""A mechanism that asks its users twice per slot (issue 19's worked example, "a mechanism with
two rounds per slot"), from outside privstream's packages, built on the round contract
(``privstream.mechanisms.rounds``).

Each slot, round 1 (**probe**) asks ``k₁ = ⌊βn/w⌋`` users sampled from those who have not
reported in the last w − 1 slots for one ε-LDP report each; the server compares the probe's
histogram ``c₁`` with its last release ``r`` (published from ``m_r`` reports). When there is no
release yet, or some coordinate moved more than ``z·√(V(ε, m₁) + V(ε, m_r))`` (``V``: the
oracle's variance over that many reports), round 2 (**refine**) asks a second, disjoint sample
of ``k₂ = ⌊n/w⌋ − k₁`` users, and the release is their estimate ``c₂``, of variance
``V(ε, m₂)`` (the probe, which decided, is not pooled into it: that would bias the release
toward the probe's extreme draws). Otherwise the slot repeats ``r`` (``approximate``) after one
round.

Guarantee: w-event ε-LDP by population division (as LDP-IDS, spec ldp-ids §1.3, Thm 5.2):
every report is ε-LDP and the ``PopulationLedger`` charges each asked user when the round is
planned, refusing anybody who reported within w slots, so no user reports twice in any window.
The decision to refine reads only the probe's LDP reports (post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family, Option
from privstream.mechanisms.client import Aggregate
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Division,
    Rounds,
    Slot,
    Strategy,
)
from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
from privstream.mechanisms.ledger import PopulationLedger
from privstream.mechanisms.rounds import Answers, Finished, Request, Requests, RoundProgress
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_fraction, check_population, check_requirement

PROBE: Final = "probe"
REFINE: Final = "refine"


@dataclass(frozen=True)
class ProbeConfig:
    """ε over w slots, n users, a histogram task, the probe's share ``beta`` of the ⌊n/w⌋
    users a slot may ask, and ``z``: how many standard deviations a change must exceed."""

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    beta: float = 0.5
    z: float = 3.0

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not isinstance(self.task, FrequencyTask):
            raise ValueError(f"task must be a FrequencyTask (a histogram), got {self.task!r}")
        check_fraction("beta", self.beta)
        if isinstance(self.z, bool) or not isinstance(self.z, int | float) or not self.z > 0:
            raise ValueError(f"z must be a number > 0, got {self.z!r}")
        per_slot = self.population // self.window
        if self.probe_users < 1 or per_slot - self.probe_users < 1:
            raise ValueError(
                f"population={self.population}, window={self.window}, beta={self.beta} leave "
                f"{self.probe_users} probe and {per_slot - self.probe_users} refine users per "
                "slot; both need >= 1: raise the population or lower the window"
            )

    @property
    def probe_users(self) -> int:
        """``k₁ = ⌊βn/w⌋``."""
        return math.floor(self.beta * self.population / self.window)

    @property
    def refine_users(self) -> int:
        """``k₂ = ⌊n/w⌋ − k₁``."""
        return self.population // self.window - self.probe_users

    def shared(self, share: float) -> ProbeConfig:
        return replace(self, epsilon=self.epsilon * share)


STATE_VERSION: Final = 1


@dataclass
class ProbeOutcome:
    """What the slot did so far, for its release and ledger entry."""

    strategy: Strategy = "approximate"
    rounds: int = 1
    probe_users: int = 0
    refine_users: int = 0
    deviation: float | None = None
    threshold: float | None = None


@dataclass
class ProbeState:
    """The server's state between slots and between the two rounds of a slot (picklable):
    the slot counter, the population ledger, the last release and the round in flight."""

    mechanism: str
    d: int
    ledger: PopulationLedger
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    estimate: tuple[float, ...] = ()
    source_slot: int | None = None
    reports: int = 0
    """The reports behind ``estimate`` (0 before the first publication)."""
    pending: RoundProgress | None = None


@dataclass(frozen=True)
class ProbeRelease(Details):
    """The rounds the slot ran, the users each asked, and the probe's largest move from the
    last release against the threshold ``z·√V`` (post-processing of LDP reports)."""

    family: ClassVar[str] = "example-rounds"
    rounds: int
    probe_users: int
    refine_users: int
    deviation: float | None
    threshold: float | None


@dataclass(frozen=True)
class ProbeLedger(Details):
    """Both rounds' accounting: each round's ε and reporting users, the users charged in the
    window ending here and those available for the next slot."""

    family: ClassVar[str] = "example-rounds"
    rounds: int
    epsilon_probe: float
    epsilon_refine: float
    probe_users: int
    refine_users: int
    window_users: int
    available_users: int


class Probe(Rounds[ProbeConfig, ProbeState]):
    """Probe, then refine on a change (population division, spec ldp-ids §1.3 Thm 5.2 for the
    accounting): a probe sample reports every slot; a second, disjoint sample reports in the
    same slot only when the probe saw a change beyond ``z`` standard deviations."""

    name = "PRB"
    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    division: ClassVar[Division] = "population"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("window", 0), ("population", 0), ("beta", 1.0),
                 ("z", 0.0), ("window", 400)),
    )  # fmt: skip

    @property
    def privacy_cost(self) -> Guarantee:
        return Guarantee(PureDP(self.config.epsilon), WindowScope(self.config.window), "ldp")

    def initial_state(self) -> ProbeState:
        cfg = self.config
        d = cfg.task.d
        ledger = PopulationLedger(cfg.population, cfg.window)
        return ProbeState(self.name, d, ledger, estimate=(1.0 / d,) * d)

    def ask(self, state: ProbeState, slot: Slot, k: int, purpose: str, part: str) -> Request:
        """``k`` users who may report (sampled, then charged before anybody is asked)."""
        users = state.ledger.sample(state.t, k, slot.client.eligible(),
                                    slot.randomness(f"{purpose}/sample"))  # fmt: skip
        state.ledger.charge(state.t, users, part)
        return Request(purpose, self.config.epsilon, users)

    def plan(self, state: ProbeState, slot: Slot) -> Requests | Finished:
        progress = state.pending
        if progress is None:
            self.enter(state, slot, slot.client.population, self.config.population)
            ask = self.ask(state, slot, self.config.probe_users, PROBE, "m1")
            if ask.users is None or ask.users.size == 0:  # nobody can report: repeat
                return self._finish(state, slot, ProbeOutcome(rounds=0))
            state.pending = progress = RoundProgress(outcome=ProbeOutcome())
            return progress.ask(Requests(1, (ask,)))
        out: ProbeOutcome = progress.outcome
        if progress.round == 1:
            refine = self._refine(state, slot, progress.answer(PROBE), out)
            if refine is not None:
                return progress.ask(Requests(2, (refine,)))
        else:
            self._publish(state, slot, progress.answer(REFINE), out)
        state.pending = None
        return self._finish(state, slot, out)

    def absorb(self, state: ProbeState, slot: Slot, answers: Answers) -> None:
        if state.pending is None:
            raise ValueError(f"{self.name} has no round in flight at slot {slot.index}")
        state.pending.take(answers)

    def _refine(
        self, state: ProbeState, slot: Slot, c1: Aggregate, out: ProbeOutcome
    ) -> Request | None:
        """Round 2's request when the probe saw a change (or nothing was released yet)."""
        cfg, v = self.config, self.config.task.variance
        out.probe_users = c1.reports
        last = v(cfg.epsilon, state.reports) if state.reports else 0.0
        out.threshold = cfg.z * math.sqrt(v(cfg.epsilon, c1.reports) + last)
        out.deviation = float(np.max(np.abs(c1.estimate - np.asarray(state.estimate))))
        if state.source_slot is not None and out.deviation <= out.threshold:
            return None
        out.rounds = 2
        return self.ask(state, slot, cfg.refine_users, REFINE, "m2")

    def _publish(self, state: ProbeState, slot: Slot, c2: Aggregate, out: ProbeOutcome) -> None:
        """Publish the refine sample's estimate ``c₂``."""
        state.estimate = tuple(float(x) for x in c2.estimate)
        state.source_slot, state.reports = slot.index, c2.reports
        out.strategy, out.refine_users = "publish", c2.reports

    def _finish(self, state: ProbeState, slot: Slot, out: ProbeOutcome) -> Finished:
        cfg, t = self.config, state.t
        window_users = state.ledger.window_users(t)
        charged = cfg.epsilon if out.probe_users + out.refine_users > 0 else 0.0
        spent = cfg.epsilon if window_users > 0 else 0.0
        spend = ClassSpend(cfg.window, cfg.epsilon, cfg.population, charged, spent)
        eps2 = cfg.epsilon if out.rounds == 2 else 0.0
        ledger = ProbeLedger(out.rounds, cfg.epsilon if out.rounds else 0.0, eps2,
                             out.probe_users, out.refine_users, window_users,
                             state.ledger.available_count(t + 1))  # fmt: skip
        details = ProbeRelease(out.rounds, out.probe_users, out.refine_users, out.deviation,
                               out.threshold)  # fmt: skip
        release = self.release(slot, out.strategy, state.estimate, state.source_slot, details)
        return Finished((release, self.ledger_entry(slot, (spend,), ledger)))


class Steps:
    """A binary population whose fraction of ones steps between ``low`` and ``high`` every
    ``period`` slots (exact: ``round(level·n)`` ones, on a seeded permutation of the users)."""

    numeric = False
    d = 2
    bounds = (0.0, 1.0)

    def __init__(self, users: int, slots: int, seed: int, task: EstimationTask | None,
                 low: float = 0.2, high: float = 0.6, period: int = 6) -> None:  # fmt: skip
        self.name, self.users, self.slots, self.seed = "steps", users, slots, seed
        self.low, self.high, self.period = low, high, period
        self.rank = np.random.default_rng(seed).permutation(users)

    def level(self, slot: int) -> float:
        return self.low if ((slot - 1) // self.period) % 2 == 0 else self.high

    def values(self, slot: int) -> NDArray[np.int64]:
        return (self.rank < round(self.level(slot) * self.users)).astype(np.int64)

    def truth(self, slot: int) -> NDArray[np.float64]:
        ones = round(self.level(slot) * self.users) / self.users
        return np.array([1.0 - ones, ones])


def _score(run: Any) -> dict[str, float]:
    error = np.abs(np.asarray(run.estimates)[:, 1] - np.asarray(run.truth)[:, 1])
    refined = sum(1 for s in run.strategies if s == "publish")
    return {"mae": float(error.mean()), "refined": float(refined)}


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(f"must lie in (0, 1), got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


FAMILY: Final = Family(
    name="example-rounds",
    summary="worked example: a probe sample, then a second sample in the same slot on a change",
    mechanisms={"PRB": Probe},
    config=ProbeConfig,
    epsilon=1.0,
    window=5,
    users=20000,
    default="PRB",
    options=(Option("beta", _fraction, 0.5, "share β of a slot's users that probe"),
             Option("z", _positive, 3.0, "standard deviations a probed change must exceed")),
    datasets={"steps": Steps},
    bench=BenchSpec(datasets=("steps",), files=False, counts=False, score=_score,
                    fields=("mae", "refined"), mechanisms=("PRB",), users=20000, slots=24),
)  # fmt: skip
