"""The seven w-event LDP mechanisms of LDP-IDS (spec ``ldp-ids.md`` §3.1–§3.7).

All of them satisfy w-event ε-LDP for every user (spec §1.3):

* budget division (LBU, LBD, LBA; Thm 4.1): every user's ``Σ_{window}(ε_{τ,1} + ε_{τ,2}) ≤ ε``,
  enforced by ``BudgetLedger``;
* population division (LSP, LPU, LPD, LPA; Thm 5.2): every report uses the full ε and a user
  reports at most once in any ``w`` consecutive slots, enforced by ``PopulationLedger``.

Time ``t`` is the mechanism's own 1-based step counter (the operator feeds every slot,
including empty ones, in order); releases carry the stream's slot index. Decisions use only
earlier LDP outputs and public counts, so they are post-processing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import Aggregate
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Division,
    LedgerEntry,
    Mechanism,
    Release,
    Rounds,
    Slot,
    Strategy,
    finite_or_none,
)
from privstream.mechanisms.guarantees import Guarantee, PureDP, WindowScope
from privstream.mechanisms.ledger import BudgetLedger, PopulationLedger
from privstream.mechanisms.rounds import Answers, Finished, Request, Requests, RoundProgress
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_fraction, check_population, check_requirement

STATE_VERSION: Final = 1
AbsorptionInit = Literal["literal", "tA_eq_t"]
IntervalRule = Literal["normalized", "literal"]


@dataclass(frozen=True)
class LdpIdsConfig:
    """Configuration shared by the LDP-IDS mechanisms; defaults are the paper's (spec §6.7).

    Attributes:
        epsilon: window budget ε (> 0).
        window: window size w (≥ 1 slots).
        population: registered population size n (≥ 1 users).
        task: what is estimated; a histogram over d values with Ada by default.
        beta: share β of budget or population given to the dissimilarity step M1 (0 < β < 1).
        u_min: LPD's smallest publication group (≥ 1).
        include_sampling_variance: add the subsampling term of spec §2.5 to ``V`` (A9).
        absorption_init: LBA/LPA start, ``"literal"`` (t_A = t + 1) or ``"tA_eq_t"`` (A5).
        force_first_publish: publish at the first slot whatever ``dis`` says (A36).

    The adaptive samplers' parameters (spec §3.8–§3.9; their paper's values are unavailable,
    these are the spec's placeholders) are shown in ``repr`` only when set away from their
    defaults, so a stream's snapshot binding is unchanged for the seven other mechanisms:

    Attributes:
        publications: DSAT's C, publications allowed per window (0, the default: ``⌈w/5⌉``).
        threshold_scale: DSAT's multiplier on the PID step and the ``[0, 2]`` clamp (A20).
        pid_gains, pid_span: the PID controller ``(K_p, K_i, K_d)`` and ``π``.
        rate_tolerance: DSAT's σ (default ``0.1·C/w``).
        initial_threshold: DSAT's T (default the publication error scale ``V``).
        decay_scale, max_share: RescueDP's log-decay φ and its cap ``p_max``.
        interval_gain: RescueDP's θ; ``interval_rule`` ``"normalized"`` (δ²/V) or
            ``"literal"`` ((δ/V)², A22).
        max_users: LP-RescueDP's ``n_max`` (default ``⌊n/2⌋``).
        max_budget_share: LB-RescueDP's ``ε_max`` as a share of ε (default 1/2).
        process_variance: the Kalman filter's process variance Q, a public prior.
        measurement_factor: ``κ_R`` in ``R = κ_R·V(ε_t, n_t)``.
    """

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(2))
    beta: float = 0.5
    u_min: int = 1
    include_sampling_variance: bool = False
    absorption_init: AbsorptionInit = "literal"
    force_first_publish: bool = False
    publications: int = field(default=0, repr=False)
    threshold_scale: float = field(default=1.0, repr=False)
    pid_gains: tuple[float, float, float] = field(default=(0.9, 0.1, 0.0), repr=False)
    pid_span: int = field(default=5, repr=False)
    rate_tolerance: float | None = field(default=None, repr=False)
    initial_threshold: float | None = field(default=None, repr=False)
    decay_scale: float = field(default=0.2, repr=False)
    max_share: float = field(default=0.6, repr=False)
    interval_gain: float = field(default=10.0, repr=False)
    interval_rule: IntervalRule = field(default="normalized", repr=False)
    max_users: int | None = field(default=None, repr=False)
    max_budget_share: float = field(default=0.5, repr=False)
    process_variance: float = field(default=0.0025**2, repr=False)
    measurement_factor: float = field(default=1.0, repr=False)

    def __repr__(self) -> str:
        shown = (
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.repr or getattr(self, f.name) != f.default
        )
        return f"{type(self).__qualname__}({', '.join(shown)})"

    def shared(self, share: float) -> LdpIdsConfig:
        """This config for a mechanism given the share ``s`` of the budget: it runs with s·ε."""
        return replace(self, epsilon=self.epsilon * share)

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not isinstance(self.task, EstimationTask):
            raise ValueError(f"task must be a FrequencyTask or MeanTask, got {self.task!r}")
        check_fraction("beta", self.beta)
        if not isinstance(self.u_min, int) or self.u_min < 1:
            raise ValueError(f"u_min must be an integer >= 1, got {self.u_min!r}")
        if self.absorption_init not in ("literal", "tA_eq_t"):
            raise ValueError(
                f"absorption_init must be 'literal' or 'tA_eq_t', got {self.absorption_init!r}"
            )
        _check_sampling(self)


def _positive(name: str, value: Any) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_sampling(cfg: LdpIdsConfig) -> None:
    """Refuse adaptive-sampler parameters outside their domains (spec §3.8–§3.9)."""
    if not isinstance(cfg.publications, int) or not 0 <= cfg.publications <= cfg.window:
        raise ValueError(
            f"publications (DSAT's C) must be an integer in 1..w={cfg.window} "
            f"(0: ⌈w/5⌉), got {cfg.publications!r}"
        )
    for name in ("threshold_scale", "interval_gain", "measurement_factor"):
        _positive(name, getattr(cfg, name))
    for name in ("rate_tolerance", "initial_threshold"):
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
    for name in ("decay_scale", "max_share", "max_budget_share"):
        value = getattr(cfg, name)
        _positive(name, value)
        if value > 1:
            raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    if not (math.isfinite(cfg.process_variance) and cfg.process_variance >= 0):
        raise ValueError(f"process_variance must be finite and >= 0, got {cfg.process_variance!r}")
    if cfg.max_users is not None and (not isinstance(cfg.max_users, int) or cfg.max_users < 1):
        raise ValueError(f"max_users must be an integer >= 1, got {cfg.max_users!r}")
    if cfg.interval_rule not in ("normalized", "literal"):
        raise ValueError(
            f"interval_rule must be 'normalized' or 'literal', got {cfg.interval_rule!r}"
        )
    if not isinstance(cfg.pid_span, int) or cfg.pid_span < 1:
        raise ValueError(f"pid_span must be an integer >= 1, got {cfg.pid_span!r}")
    if len(cfg.pid_gains) != 3 or not all(math.isfinite(g) and g >= 0 for g in cfg.pid_gains):
        raise ValueError(f"pid_gains must be three finite gains >= 0, got {cfg.pid_gains!r}")


@dataclass
class LdpIdsState:
    """Everything needed to continue a stream after a restart (spec §3.13).

    ``t`` is the number of slots processed, ``last_slot`` the stream slot of the last step,
    ``r_prev`` the last release, ``l`` the step of the last fresh publication and
    ``absorbed`` the resource it took (LBA: units ``k_l``; LPA: users ``n_l2``).
    ``pending`` is the round in flight of a two-round step (``TwoRounds``), None between slots.
    ``controller`` is an adaptive sampler's controller state (DSAT's threshold and PID history,
    RescueDP's Kalman filter and interval); None for the seven mechanisms of the paper.
    """

    mechanism: str
    d: int
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    r_prev: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    l: int = 0
    source_slot: int | None = None
    absorbed: int = 0
    budget: BudgetLedger | None = None
    population: PopulationLedger | None = None
    groups: NDArray[np.int32] | None = None
    pending: RoundProgress | None = None
    controller: Any = None


@dataclass(frozen=True)
class LdpIdsRelease(Details):
    """The LDP-IDS facts of a release (spec §5.3): the per-user budgets a reporting user spent
    in the dissimilarity (M1) and publication (M2) steps, how many users reported in each, the
    de-biased dissimilarity ``dis`` and potential publication error ``err`` (post-processing of
    LDP reports), and the slot's communication cost in bits (§5.3.4)."""

    family: ClassVar[str] = "ldp-ids"
    epsilon_m1: float
    epsilon_m2: float
    users_m1: int
    users_m2: int
    dissimilarity: float | None
    error: float | None
    bits: int


@dataclass(frozen=True)
class AdaptiveRelease(LdpIdsRelease):
    """An adaptive sampler's release (DSAT, RescueDP; spec §3.8–§3.9): the LDP-IDS facts plus
    its controller's public state after the slot (``control``: DSAT's threshold ``T̃``, PID
    output ``u_t`` and publication rate; RescueDP's interval ``I``, share ``p``, Kalman gain
    and next sampling slot). All of it is computed from public counts and released values."""

    control: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class LdpIdsLedger(Details):
    """The LDP-IDS facts of a ledger entry: the slot's M1/M2 budgets and reporting users, the
    users who reported in the window ending here and those available for the next slot
    (population division), and what is left: ``ε_rm`` or the absorbable budget (budget
    division), ``n_rm`` or the absorbable users (population division)."""

    family: ClassVar[str] = "ldp-ids"
    epsilon_m1: float
    epsilon_m2: float
    users_m1: int
    users_m2: int
    window_users: int
    available_users: int
    remaining: float


@dataclass
class _Outcome:
    """What one slot did, gathered for its Release and LedgerEntry."""

    strategy: Strategy
    eps1: float = 0.0
    eps2: float = 0.0
    users1: int = 0
    users2: int = 0
    dis: float = math.nan
    err: float = math.nan
    bits: int = 0
    remaining: float = 0.0
    control: dict[str, float | None] | None = None


class LdpIdsMechanism(Mechanism[LdpIdsConfig, LdpIdsState]):
    """Shared skeleton: state, ledgers, M1 dissimilarity (spec §3.0) and event emission."""

    state_version: ClassVar[int] = STATE_VERSION
    division: ClassVar[Division]

    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("epsilon", -1.0), ("epsilon", float("inf")), ("window", 0),
                 ("population", 0), ("beta", 0.0), ("beta", 1.0), ("u_min", 0),
                 ("absorption_init", "sometimes"), ("publications", -1), ("threshold_scale", 0.0),
                 ("interval_rule", "sometimes"), ("process_variance", -1.0), ("max_share", 1.5)),
    )  # fmt: skip

    @property
    def privacy_cost(self) -> Guarantee:
        """w-event ε-LDP (spec §1.3): pure ε over every window of w slots, per user."""
        return Guarantee(PureDP(self.config.epsilon), WindowScope(self.config.window), "ldp")

    @property
    def n(self) -> int:
        return self.config.population

    def initial_state(self) -> LdpIdsState:
        cfg = self.config
        state = LdpIdsState(mechanism=self.name, d=cfg.task.d, r_prev=np.zeros(cfg.task.d))
        if self.division == "budget":
            state.budget = BudgetLedger(cfg.epsilon, cfg.window)
        else:
            state.population = PopulationLedger(cfg.population, cfg.window)
        return state

    def V(self, eps: float, m: int) -> float:
        """``V(ε, m)`` of spec §2.4, plus the optional subsampling term of §2.5."""
        v = self.config.task.variance(eps, m)
        if self.config.include_sampling_variance and 0 < m < self.n and self.n > 1:
            d = self.config.task.d
            v += (1 - 1 / d) / (d * m) * (self.n - m) / (self.n - 1) * self.config.task.scale**2
        return v

    def dissimilarity(self, state: LdpIdsState, agg: Aggregate, eps: float) -> float:
        """De-biased ``dis = mean_k (c̄_{t,1}[k] − r_{t−1}[k])² − V(ε_{M1}, m_{M1})`` (Eq. 3)."""
        if agg.reports == 0:
            return -math.inf
        return float(np.mean((agg.estimate - state.r_prev) ** 2)) - self.V(eps, agg.reports)

    # -- collection through the ledgers --------------------------------------------------------

    def ask_all(self, state: LdpIdsState, eps: float, part: str) -> Request:
        """Every eligible user is to report with ``eps``; charged to all users first (budget
        division)."""
        assert state.budget is not None
        state.budget.charge(state.t, eps, part)
        return Request(part, eps)

    def ask_sample(self, state: LdpIdsState, slot: Slot, k: int, part: str) -> Request:
        """``k`` users sampled from ``U_A`` are to report with the full ε; charged first
        (population division)."""
        assert state.population is not None
        users = state.population.sample(
            state.t, k, slot.client.eligible(), slot.randomness(f"{part}/sample")
        )
        state.population.charge(state.t, users, part)
        return Request(part, self.config.epsilon, users)

    def bits(self, agg: Aggregate, instructed: bool) -> int:
        """Report bits plus one instruction bit per individually requested report (spec §5.3.4)."""
        return agg.report_bits + (agg.reports if instructed else 0)

    # -- the step ------------------------------------------------------------------------------

    def _advance(self, state: LdpIdsState, slot: Slot) -> list[Release | LedgerEntry]:
        self.enter(state, slot, slot.client.population, self.n)
        outcome = self.decide(state, slot)
        return [self._release(state, slot, outcome), self._ledger_entry(state, slot, outcome)]

    def decide(self, state: LdpIdsState, slot: Slot) -> _Outcome:
        """Run the mechanism's pseudocode for slot ``state.t``; update ``r_prev``/``l``."""
        raise NotImplementedError

    def publish(self, state: LdpIdsState, slot: Slot, agg: Aggregate) -> None:
        state.r_prev = np.asarray(agg.estimate, dtype=np.float64)
        state.l = state.t
        state.source_slot = slot.index

    def uniform_publication(
        self, state: LdpIdsState, slot: Slot, users: NDArray[np.int64] | None, eps: float
    ) -> _Outcome:
        """A data-independent publication (LBU, LSP, LPU): charge the ledger, then publish what
        ``users`` (every eligible user when None, budget division) report with ``eps``, or
        repeat the last release when nobody can report. ``epsilon_m2`` is what the ledger
        charged a reporting user (budget division charges every user, reporting or not)."""
        if users is None:
            assert state.budget is not None
            state.budget.charge(state.t, eps, "m2")
            if not slot.client.eligible().any():
                return _Outcome("approximate", eps2=eps)
        else:
            assert state.population is not None
            state.population.charge(state.t, users, "m2")
            if users.size == 0:
                return _Outcome("approximate")
        agg = slot.client.collect(users, eps, purpose="m2")
        self.publish(state, slot, agg)
        instructed = self.division == "population"
        return _Outcome("publish", eps2=eps, users2=agg.reports, bits=self.bits(agg, instructed))

    def first_forced(self, state: LdpIdsState) -> bool:
        return self.config.force_first_publish and state.l == 0

    def _release(self, state: LdpIdsState, slot: Slot, o: _Outcome) -> Release:
        details = LdpIdsRelease(
            epsilon_m1=o.eps1,
            epsilon_m2=o.eps2,
            users_m1=o.users1,
            users_m2=o.users2,
            dissimilarity=finite_or_none(o.dis),
            error=finite_or_none(o.err),
            bits=o.bits,
        )
        if o.control is not None:
            details = AdaptiveRelease(**asdict(details), control=o.control)
        return self.release(slot, o.strategy, state.r_prev, state.source_slot, details)

    def _ledger_entry(self, state: LdpIdsState, slot: Slot, o: _Outcome) -> LedgerEntry:
        """The slot's spend as one class (every user shares ``(w, ε)``). Budget division charges
        every user ``ε_{t,1} + ε_{t,2}``; population division charges a reporting user the full
        ε at most once per window (its ledger enforces it), so the most any user spent over the
        window is ε once anybody reported in it."""
        cfg, t = self.config, state.t
        if state.budget is not None:
            charged, spent = o.eps1 + o.eps2, state.budget.window_spent(t)
            window_users, available = 0, int(slot.client.eligible().sum())
        else:
            assert state.population is not None
            window_users = state.population.window_users(t)
            available = state.population.available_count(t + 1)
            charged = cfg.epsilon if o.users1 + o.users2 > 0 else 0.0
            spent = cfg.epsilon if window_users > 0 else 0.0
        classes = (ClassSpend(cfg.window, cfg.epsilon, cfg.population, charged, spent),)
        details = LdpIdsLedger(
            epsilon_m1=o.eps1,
            epsilon_m2=o.eps2,
            users_m1=o.users1,
            users_m2=o.users2,
            window_users=window_users,
            available_users=available,
            remaining=o.remaining,
        )
        return self.ledger_entry(slot, classes, details)


class TwoRounds(Rounds[LdpIdsConfig, LdpIdsState], LdpIdsMechanism):
    """The dissimilarity mechanisms (LBD, LBA, LPD, LPA) as two rounds per slot
    (``mechanisms.rounds``): round 1 asks the M1 users for their dissimilarity reports; round 2,
    when the mechanism publishes, asks the M2 users for their publication reports. Each round
    charges the ledger before it asks, and draws the randomness the one-shot step drew (named
    ``m1``/``m2``), so the releases and ledger entries are the same."""

    def dissimilarity_request(self, state: LdpIdsState, slot: Slot) -> Request | None:
        """Round 1 (M1): every user with ``βε/w`` (budget division) or ``⌊βn/w⌋`` sampled users
        with ε (population division). None: the slot asks nothing (``skipped``)."""
        cfg = self.config
        if self.division == "budget":
            return self.ask_all(state, cfg.beta * cfg.epsilon / cfg.window, "m1")
        return self.ask_sample(state, slot, math.floor(cfg.beta * self.n / cfg.window), "m1")

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        """From the M1 reports: the slot's outcome so far and the M2 request (charged) when the
        mechanism publishes, None when it approximates or is nullified."""
        raise NotImplementedError

    def plan(self, state: LdpIdsState, slot: Slot) -> Requests | Finished:
        progress = state.pending
        if progress is None:
            self.enter(state, slot, slot.client.population, self.n)
            first = self.dissimilarity_request(state, slot)
            if first is None:
                return Finished(self._events(state, slot, self.skipped(state)))
            state.pending = progress = RoundProgress()
            return progress.ask(Requests(1, (first,)))
        out: _Outcome = progress.outcome
        if progress.round == 1:
            out, ask = self.publication_plan(state, slot, progress.answer("m1"))
            progress.outcome = out
            if ask is not None:
                out.eps2 = ask.epsilon
                return progress.ask(Requests(2, (ask,)))
        else:
            agg = progress.answer("m2")
            self.publish(state, slot, agg)
            out.strategy, out.users2 = "publish", agg.reports
            out.bits += self.bits(agg, instructed=True)
        state.pending = None
        return Finished(self._events(state, slot, out))

    def _events(self, state: LdpIdsState, slot: Slot, out: _Outcome) -> tuple[Release, LedgerEntry]:
        return self._release(state, slot, out), self._ledger_entry(state, slot, out)

    def skipped(self, state: LdpIdsState) -> _Outcome:
        """The outcome of a slot whose ``dissimilarity_request`` asked nothing."""
        raise NotImplementedError

    def absorb(self, state: LdpIdsState, slot: Slot, answers: Answers) -> None:
        if state.pending is None:
            raise ValueError(f"{self.name} has no round in flight at slot {slot.index}")
        state.pending.take(answers)


class LBU(LdpIdsMechanism):
    """LDP Budget Uniform (spec §3.1): all users report with ``ε/w`` at every slot."""

    name = "LBU"
    division = "budget"

    def decide(self, state: LdpIdsState, slot: Slot) -> _Outcome:
        return self.uniform_publication(state, slot, None, self.config.epsilon / self.config.window)


class LSP(LdpIdsMechanism):
    """LDP Sampling (spec §3.2, A1): all users report with ε at ``t ≡ 1 (mod w)``; the other
    slots approximate. Each user reports once per ``w`` slots (population division)."""

    name = "LSP"
    division = "population"

    def decide(self, state: LdpIdsState, slot: Slot) -> _Outcome:
        if (state.t - 1) % self.config.window != 0:
            return _Outcome("approximate")
        assert state.population is not None
        pool = state.population.available(state.t)
        everyone = np.flatnonzero(pool & slot.client.eligible())
        return self.uniform_publication(state, slot, everyone, self.config.epsilon)


class LPU(LdpIdsMechanism):
    """LDP Population Uniform (spec §3.3): users are split at random into ``w`` groups whose
    sizes differ by at most one; group ``((t−1) mod w)`` reports with ε at slot t."""

    name = "LPU"
    division = "population"

    def decide(self, state: LdpIdsState, slot: Slot) -> _Outcome:
        pop = state.population
        assert pop is not None
        if state.groups is None:
            order = slot.randomness.stream_level("lpu/groups").permutation(self.n)
            groups = np.empty(self.n, dtype=np.int32)
            groups[order] = np.arange(self.n, dtype=np.int32) % self.config.window
            state.groups = groups
        members = np.flatnonzero(
            (state.groups == (state.t - 1) % self.config.window) & slot.client.eligible()
        )
        return self.uniform_publication(state, slot, members, self.config.epsilon)


class LBD(TwoRounds):
    """LDP Budget Distribution (spec §3.4): M1 spends ``βε/w``; a publication takes half of the
    remaining publication budget ``ε_rm = (1−β)ε − Σ_{i=t−w+1}^{t−1} ε_{i,2}``."""

    name = "LBD"
    division = "budget"

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        cfg, t, ledger = self.config, state.t, state.budget
        assert ledger is not None
        eps1 = cfg.beta * cfg.epsilon / cfg.window
        dis = self.dissimilarity(state, c1, eps1)
        eps_rm = (1 - cfg.beta) * cfg.epsilon - ledger.spent(t - cfg.window + 1, t - 1, "m2")
        eps_pp = eps_rm / 2
        err = self.V(eps_pp, c1.reports) if eps_pp > 0 else math.inf
        out = _Outcome(
            "approximate", eps1=eps1, users1=c1.reports, dis=dis, err=err, remaining=eps_rm
        )
        out.bits = self.bits(c1, instructed=False)
        if (dis > err or self.first_forced(state)) and eps_pp > 0:
            return out, self.ask_all(state, eps_pp, "m2")
        return out, None


class LBA(TwoRounds):
    """LDP Budget Absorption (spec §3.5): each slot earns ``ε_u = (1−β)ε/w``; a publication
    absorbs the units of skipped slots (at most ``w``) and nullifies the next ``k−1`` slots."""

    name = "LBA"
    division = "budget"

    def initial_state(self) -> LdpIdsState:
        state = super().initial_state()
        state.absorbed = 0 if self.config.absorption_init == "literal" else 1
        return state

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        cfg, t = self.config, state.t  # M1 ran at nullified slots too (A7)
        eps1 = cfg.beta * cfg.epsilon / cfg.window
        eps_u = (1 - cfg.beta) * cfg.epsilon / cfg.window
        dis = self.dissimilarity(state, c1, eps1)
        out = _Outcome(
            "nullified", eps1=eps1, users1=c1.reports, dis=dis, bits=self.bits(c1, False)
        )
        t_n = state.absorbed - 1
        if t - state.l <= t_n:
            return out, None
        k = min(t - (state.l + t_n), cfg.window)
        eps_pp = k * eps_u
        out.err, out.remaining, out.strategy = self.V(eps_pp, c1.reports), eps_pp, "approximate"
        if dis > out.err or self.first_forced(state):
            state.absorbed = k
            return out, self.ask_all(state, eps_pp, "m2")
        return out, None


def _require_dissimilarity_users(config: LdpIdsConfig, name: str) -> None:
    """Refuse a configuration whose M1 asks ``⌊βn/w⌋ = 0`` users: its dissimilarity is never
    measured, so the mechanism would never publish (a silent degradation)."""
    if math.floor(config.beta * config.population / config.window) < 1:
        raise ValueError(
            f"{name} needs a dissimilarity group ⌊βn/w⌋ >= 1 user; population={config.population}, "
            f"window={config.window}, beta={config.beta} give 0: it would never publish"
        )


class LPD(TwoRounds):
    """LDP Population Distribution (spec §3.6, Alg. 2): M1 asks ``⌊βn/w⌋`` users; a publication
    takes half of the remaining publication users ``n_rm = ⌊(1−β)n⌋ − Σ_{i=t−w+1}^{t−1}|U_{i,2}|``."""

    name = "LPD"
    division = "population"

    def __init__(self, config: LdpIdsConfig) -> None:
        super().__init__(config)
        _require_dissimilarity_users(config, self.name)

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        cfg, t, pop = self.config, state.t, state.population
        assert pop is not None
        dis = self.dissimilarity(state, c1, cfg.epsilon)
        n_rm = math.floor((1 - cfg.beta) * self.n) - pop.used(t - cfg.window + 1, t - 1, "m2")
        n_pp = n_rm // 2
        err = self.V(cfg.epsilon, n_pp)
        out = _Outcome(
            "approximate", eps1=cfg.epsilon, users1=c1.reports, dis=dis, err=err, remaining=n_rm
        )
        out.bits = self.bits(c1, instructed=True)
        if (dis > err or self.first_forced(state)) and n_pp >= cfg.u_min:
            return out, self.ask_sample(state, slot, n_pp, "m2")
        return out, None


class LPA(TwoRounds):
    """LDP Population Absorption (spec §3.7, Alg. 3): each slot earns ``m_u = ⌊(1−β)n/w⌋``
    publication users; a publication absorbs skipped units and nullifies as many slots."""

    name = "LPA"
    division = "population"

    def __init__(self, config: LdpIdsConfig) -> None:
        super().__init__(config)
        _require_dissimilarity_users(config, self.name)
        if math.floor((1 - config.beta) * config.population / config.window) < 1:
            raise ValueError(
                f"LPA needs a publication unit ⌊(1−β)n/w⌋ >= 1 user; population={config.population}, "
                f"window={config.window}, beta={config.beta} give 0"
            )

    def initial_state(self) -> LdpIdsState:
        state = super().initial_state()
        state.absorbed = 0 if self.config.absorption_init == "literal" else self._unit
        return state

    @property
    def _unit(self) -> int:
        return math.floor((1 - self.config.beta) * self.n / self.config.window)

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        cfg, t, m_u = self.config, state.t, self._unit
        dis = self.dissimilarity(state, c1, cfg.epsilon)
        out = _Outcome(
            "nullified", eps1=cfg.epsilon, users1=c1.reports, dis=dis, bits=self.bits(c1, True)
        )
        t_n = state.absorbed // m_u - 1
        if t - state.l <= t_n:
            return out, None
        n_pp = m_u * min(t - (state.l + t_n), cfg.window)
        out.err, out.remaining, out.strategy = self.V(cfg.epsilon, n_pp), n_pp, "approximate"
        if dis > out.err or self.first_forced(state):
            state.absorbed = n_pp
            return out, self.ask_sample(state, slot, n_pp, "m2")
        return out, None


MECHANISMS: Final[dict[str, type[LdpIdsMechanism]]] = {
    m.name: m for m in (LBU, LSP, LPU, LBD, LBA, LPD, LPA)
}
