"""DPI: user-level ε-DP over an infinite stream (Feng et al., IEEE S&P 2024; spec ``dpi.md``).

A trusted curator releases, at every slot, one probability distribution over a public domain
of ``k`` categories for a query sampled from a public pool (the accumulated, the current or the
mean distribution). No noise is added to counts: the release is the mean of ``n_A`` synopses
drawn from a fixed, data-independent pool (Algorithm 2, 0-DP); the data only steer which
synopses are drawn. Each slot spends one element of a convergent series whose sum is ε
(§3.3), picked by RBA (Algorithms 3 and 4) so that each element is used once.

**Guarantee (``DPI``, ``update_mode = public_prior``).** Pure ε-DP over the stream's lifetime
against user-level neighbours (all of one user's records, over the whole stream, added or
removed; spec §1.2), with the trusted curator of the ``cdp`` trust mode. Every query answer is a
PDF, so one user moves it by at most ``Δ_Q = 2`` in L1 however many events they send, and the
clipped score ``g`` by at most ``s_g = min(2, 2Δ_Q/μ)``. Each slot's draws are exponential
mechanisms costing ``ε_t`` together (``mechanisms.dpi_boosting``); ``Σ_t ε_t ≤ Σ_i ε_i = ε`` by
the series ledger, which refuses an element twice and never resets.

``DPI-paper`` (``update_mode = paper``) is Algorithm 1 as printed, for reproduction: its nominal
account (Theorem 5.1) charges only the current round, which the standard analysis of
multiplicative weights does not support (A9, A31). Its outputs are marked ``evaluation`` and its
ledger entries carry the conservative account of §3.10 beside the nominal one.

``DPI-prior`` is the harness baseline B2 (α ≡ 0): releases drawn from the pool prior, 0-DP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms import dpi_boosting as boosting
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Event,
    ExtraRecord,
    Mechanism,
    Slot,
)
from privstream.mechanisms.dpi_boosting import QUERIES, Drawn, Query
from privstream.mechanisms.dpi_pool import SynopsisPool, shared_pool
from privstream.mechanisms.dpi_rba import Alg3State, Alg4State, Draw, RbaState
from privstream.mechanisms.dpi_series import ETA_MODES, BudgetSeries, EtaMode, StepSizes
from privstream.mechanisms.guarantees import Guarantee, LifetimeScope, PureDP
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_population, check_requirement

STATE_VERSION: Final = 1
DIVISION: Final = "dpi-series"
"""DPI's own division: every user charged ε_t per slot from a series used once per element."""
LIFETIME: Final = 0
"""The ``ClassSpend.scope`` of a lifetime account: no window, every slot counts."""
UpdateMode = Literal["public_prior", "paper", "none"]
SensitivityMode = Literal["unbounded", "bounded"]


@dataclass(frozen=True)
class DpiConfig:
    """DPI's configuration (spec §2), the paper's symbols as names; defaults the spec's.

    ``epsilon`` is the total budget over infinite time; ``window`` is accepted for the family
    contract and unused (the guarantee has no window). ``lam``, ``mu``, ``zeta``: the score's
    λ, μ and the series' ζ; ``rba`` Algorithm 3 (rate ``rba_rate``) or 4; ``pool_size`` N,
    ``pool_trials`` (0: k), ``pool_seed`` (public); ``synopses`` n_A; ``queries`` the public
    query pool; ``candidates`` M and ``prior_rate`` κ of the public-prior update;
    ``sensitivity_mode = bounded`` smooths each PDF with a public prior of mass ``prior_mass``
    (N₀, §3.11-B): one user's one event per slot then moves it by ``Δ_Q = 2/(N₀ + 1)``.
    """

    epsilon: float
    window: int
    population: int
    task: EstimationTask = field(default_factory=lambda: FrequencyTask(100))
    lam: float = 0.2
    mu: float = 0.05
    zeta: float = 0.1
    query_share: float = 0.5
    rba: Literal["alg3", "alg4"] = "alg3"
    rba_rate: float = 1e8
    pool_size: int = 6500
    pool_trials: int = 0
    pool_seed: int = 0
    synopses: int = 20
    queries: tuple[Query, ...] = ("acc", "inst")
    eta_mode: EtaMode = "budget_exact"
    allow_underspend: bool = False
    candidates: int = 256
    prior_rate: float = 0.05
    sensitivity_mode: SensitivityMode = "unbounded"
    prior_mass: float = 0.0

    def shared(self, share: float) -> DpiConfig:
        """This config for a mechanism given the share ``s`` of the budget: it runs with s·ε."""
        return replace(self, epsilon=self.epsilon * share)

    @property
    def k(self) -> int:
        return self.task.d

    @property
    def delta_q(self) -> float:
        """Δ_Q: 2 for a PDF; ``2/(N₀+1)`` for a prior-smoothed PDF with one event per user
        per slot (the ingest keeps a user's first event of a slot)."""
        return 2.0 if self.sensitivity_mode == "unbounded" else 2.0 / (self.prior_mass + 1.0)

    @property
    def s_g(self) -> float:
        """The score's sensitivity ``min(2, 2Δ_Q/μ)`` (A9)."""
        return min(2.0, 2.0 * self.delta_q / self.mu)

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, max(self.window, 1), "DPI's lifetime budget")
        check_population(self.population)
        if not isinstance(self.task, FrequencyTask) or self.task.d < 2:
            raise ValueError(f"DPI releases PDFs over k >= 2 categories, got {self.task!r}")
        _check_dpi(self)
        try:
            self.series()
        except ValueError as exc:  # an infeasible (ε, μ, ζ): the message holds the limit
            raise ValueError(
                f"epsilon = {self.epsilon!r} does not fit DPI's series: {exc}"
            ) from None

    def series(self) -> BudgetSeries:
        return BudgetSeries(self.epsilon, self.mu, self.zeta, self.delta_q, self.eta_mode,
                            self.allow_underspend)  # fmt: skip


def _check_dpi(cfg: DpiConfig) -> None:
    """Refuse parameters outside their domains (spec §10, "Configuration validation")."""
    for name in ("mu", "zeta", "rba_rate"):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if not (math.isfinite(cfg.lam) and cfg.lam >= 0):
        raise ValueError(f"lam (λ) must be finite and >= 0, got {cfg.lam!r}")
    for name in ("query_share", "prior_rate"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {getattr(cfg, name)!r}")
    for name, low in (("pool_size", 1), ("synopses", 1), ("candidates", 1), ("pool_trials", 0)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if cfg.synopses > cfg.candidates:
        raise ValueError(
            f"candidates (M = {cfg.candidates}) must be at least synopses (n_A = {cfg.synopses}): "
            "the released synopses are distinct candidates"
        )
    if cfg.synopses > cfg.pool_size:
        raise ValueError(
            f"synopses (n_A = {cfg.synopses}) must not exceed pool_size N = {cfg.pool_size}"
        )
    if (
        not cfg.queries
        or any(q not in QUERIES for q in cfg.queries)
        or len(set(cfg.queries)) != len(cfg.queries)
    ):
        raise ValueError(f"queries must be distinct names among {QUERIES}, got {cfg.queries!r}")
    if cfg.rba not in ("alg3", "alg4") or cfg.eta_mode not in ETA_MODES:
        raise ValueError(f"rba must be alg3 or alg4 and eta_mode one of {ETA_MODES}")
    if cfg.sensitivity_mode not in ("unbounded", "bounded"):
        raise ValueError(
            f"sensitivity_mode must be unbounded or bounded, got {cfg.sensitivity_mode!r}"
        )
    if cfg.sensitivity_mode == "bounded" and ("acc" in cfg.queries or cfg.prior_mass <= 0):
        raise ValueError(
            "sensitivity_mode = bounded needs prior_mass N₀ > 0 and bounds only the per-slot "
            "queries (inst, mean): a user's accumulated events are not capped, so drop 'acc'"
        )


@dataclass
class DpiState:
    """A DPI stream's state (spec §10, ``DPIState``); the pool is rebuilt from its public
    descriptor, never stored. ``priors``: the query prior and one prior over the pool per
    query (``public_prior``), or the log-weights ``L_Q``, ``L_A`` (``paper``)."""

    mechanism: str
    rba: RbaState
    query_prior: NDArray[np.float64]
    synopsis_prior: NDArray[np.float64]
    accumulated: NDArray[np.int64]
    pdf_sum: NDArray[np.float64]
    last: NDArray[np.float64]
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    spent_nominal: float = 0.0
    spent_conservative: float = 0.0
    acum_a: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    acum_q: float = 0.0
    exhausted: bool = False


@dataclass(frozen=True)
class DpiRelease(Details):
    """DPI's facts of a release (public: data-independent or already released): the query,
    the series element it spent (``series_index`` i_t, ``series_epsilon`` ε_t) and the pool
    indices whose mean it is (``synopses``; the pool is public)."""

    family: ClassVar[str] = "dpi"
    query: str
    series_index: int
    series_epsilon: float
    synopses: tuple[int, ...]


@dataclass(frozen=True)
class DpiLedger(Details):
    """DPI's facts of a ledger entry: the series element spent, the step sizes, the nominal
    and the conservative account over the stream's lifetime (§3.10), the series parameters the
    audit recomputes ε_t from, and whether the series is exhausted."""

    family: ClassVar[str] = "dpi"
    series_index: int
    series_epsilon: float
    nominal_charge: float
    nominal_spent: float
    conservative_charge: float
    conservative_spent: float
    alpha_q: float
    alpha_a: float
    eta_q: float
    eta_a: float
    exhausted: bool
    series: dict[str, Any]


@dataclass
class _Slot:
    """What one slot drew and spent."""

    draw: Draw
    steps: StepSizes
    nominal: float
    conservative: float
    drawn: Drawn


class DpiMechanism(Mechanism[DpiConfig, DpiState]):
    """The DPI step shared by its three update modes."""

    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("cdp",)
    division: ClassVar[Any] = DIVISION
    update_mode: ClassVar[UpdateMode] = "public_prior"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("epsilon", -1.0), ("mu", 0.0), ("zeta", -0.1),
                 ("synopses", 0), ("queries", ()), ("rba", "alg5"), ("epsilon", 1000.0)),
    )  # fmt: skip

    def __init__(self, config: DpiConfig) -> None:
        super().__init__(config)
        self.series = config.series()

    @property
    def pool(self) -> SynopsisPool:
        """Algorithm 2's pool, built once per process from its public descriptor and shared by
        every mechanism of that descriptor (``dpi_pool.shared_pool``); never snapshotted."""
        cfg = self.config
        return shared_pool(cfg.k, cfg.pool_trials or cfg.k, cfg.pool_size, cfg.pool_seed)

    @property
    def privacy_cost(self) -> Guarantee:
        """Pure ε-DP over the stream's lifetime, user-level neighbours, trusted curator."""
        return Guarantee(PureDP(self.config.epsilon), LifetimeScope(), "cdp")

    def initial_state(self) -> DpiState:
        cfg = self.config
        m, n, k = len(cfg.queries), cfg.pool_size, cfg.k
        rba: RbaState = (Alg3State(self.series, cfg.rba_rate) if cfg.rba == "alg3"
                         else Alg4State(self.series))  # fmt: skip
        paper = self.update_mode == "paper"
        return DpiState(
            mechanism=self.name,
            rba=rba,
            query_prior=np.zeros(m) if paper else np.full(m, 1.0 / m),
            synopsis_prior=np.zeros((m, n)) if paper else np.full((m, n), 1.0 / n),
            accumulated=np.zeros(k, dtype=np.int64),
            pdf_sum=np.zeros(k),
            last=np.full((m, k), 1.0 / k),
            acum_a=np.zeros(m),
        )

    def targets(self, state: DpiState, counts: NDArray[np.int64]) -> list[NDArray[np.float64]]:
        """The true answer ``y_q`` of every query after this slot (curator side, spec §3.1)."""
        cfg = self.config
        state.accumulated += counts
        inst = boosting.smoothed(counts, cfg.prior_mass)  # one slot's PDF: q_inst and q_mean
        state.pdf_sum += inst  # smoothed too, so q_mean keeps Δ_Q = 2/(N₀+1) when bounded
        answers = {
            "acc": boosting.normalized(state.accumulated),
            "inst": inst,
            "mean": state.pdf_sum / state.t,
        }
        return [answers[q] for q in cfg.queries]

    def _advance(self, state: DpiState, slot: Slot) -> list[Event]:
        cfg = self.config
        curator = slot.curator
        self.enter(state, slot, curator.population, cfg.population)
        counts = curator.class_histogram(cfg.epsilon, max(cfg.window, 1)).total
        targets = self.targets(state, np.asarray(counts, dtype=np.int64))
        drawn = self.spend(state, slot, targets)
        return self.events(state, slot, drawn, int(np.sum(counts)))

    def draw_element(self, state: DpiState, slot: Slot) -> tuple[Draw, float]:
        """RBA's element for this slot (I10: drawn even for an empty slot) and its nominal
        charge; ε_t = 0 when the series is exhausted or the charge would pass ε (§3.10).

        ``exhausted`` flags exactly the slots that spend nothing for either reason: a refused
        element (only ``paper_thm54``, whose charge is 4·ε_i, can reach the limit) does not
        stop the stream, a later smaller element that fits is still spent, so the account
        fills up to ε and never passes it; no entry shows ``exhausted`` beside a charge."""
        from privstream.mechanisms.dpi_rba import EXHAUSTED, draw

        element = draw(state.rba, slot.randomness("dpi/rba"))
        charge = 0.0 if element.exhausted else self.series.nominal_charge(element.series_index)
        limit = budget_limit(self.config.epsilon)
        state.exhausted = element.exhausted or state.spent_nominal + charge > limit
        return (EXHAUSTED, 0.0) if state.exhausted else (element, charge)

    def spend(self, state: DpiState, slot: Slot, targets: list[NDArray[np.float64]]) -> _Slot:
        """Draw this slot's release and update the priors (the mode's own ``update``)."""
        raise NotImplementedError

    def events(self, state: DpiState, slot: Slot, done: _Slot, active: int) -> list[Event]:
        """The release of the sampled query, the ledger entry and the internal audit record."""
        cfg, q = self.config, cfg_query(self.config, done.drawn.query)
        state.last[done.drawn.query] = done.drawn.release
        state.spent_nominal += done.nominal
        state.spent_conservative += done.conservative
        details = DpiRelease(q, done.draw.series_index, done.draw.epsilon,
                             tuple(int(j) for j in done.drawn.synopses))  # fmt: skip
        release = self.release(slot, "publish", done.drawn.release, slot.index, details,
                               key=(("query", q),))  # fmt: skip
        if self.update_mode == "paper":
            release = replace(release, evaluation=True)
        entry = self.ledger_entry(slot, (ClassSpend(LIFETIME, cfg.epsilon, cfg.population,
                                                    done.nominal, state.spent_nominal),),
                                  self.ledger_details(state, done))  # fmt: skip
        if self.update_mode == "paper":
            entry = replace(entry, evaluation=True)
        audit = ExtraRecord("dpi-audit", slot.stream, self.name, slot.index,
                            {"users_charged": active, "leak_max": state.spent_nominal},
                            evaluation=self.update_mode == "paper")  # fmt: skip
        return [release, entry, audit]

    def ledger_details(self, state: DpiState, done: _Slot) -> DpiLedger:
        cfg, s = self.config, done.steps
        return DpiLedger(
            series_index=done.draw.series_index, series_epsilon=done.draw.epsilon,
            nominal_charge=done.nominal, nominal_spent=state.spent_nominal,
            conservative_charge=done.conservative, conservative_spent=state.spent_conservative,
            alpha_q=s.alpha_q, alpha_a=s.alpha_a, eta_q=s.eta_q, eta_a=s.eta_a,
            exhausted=state.exhausted,
            series={"epsilon": cfg.epsilon, "mu": cfg.mu, "zeta": cfg.zeta,
                    "delta_q": cfg.delta_q, "eta_mode": cfg.eta_mode,
                    "allow_underspend": cfg.allow_underspend},
        )  # fmt: skip


def cfg_query(cfg: DpiConfig, index: int) -> str:
    """The public name of query ``index`` of the pool (the release key part)."""
    return cfg.queries[index]


class DPI(DpiMechanism):
    """Production DPI (spec §3.11-A, on §3.2–§3.6): exponential-mechanism draws over public
    candidates; pure ε-DP over the stream's lifetime, user-level neighbours."""

    name = "DPI"

    def spend(self, state: DpiState, slot: Slot, targets: list[NDArray[np.float64]]) -> _Slot:
        cfg = self.config
        element, charge = self.draw_element(state, slot)
        eps_q, eps_a = cfg.query_share * element.epsilon, (1 - cfg.query_share) * element.epsilon
        alpha_q, alpha_a = eps_q / (2 * cfg.s_g), eps_a / (2 * cfg.s_g * cfg.synopses)
        rng = slot.randomness
        drawn = boosting.public_prior_draw(
            self.pool, targets, list(state.last), (state.query_prior, state.synopsis_prior),
            (alpha_q, alpha_a), (cfg.candidates, cfg.synopses), (cfg.lam, cfg.mu),
            (rng("dpi/query"), rng("dpi/candidates"), rng("dpi/synopses")),
        )  # fmt: skip
        q = drawn.query
        state.synopsis_prior[q] = boosting.move_prior(
            state.synopsis_prior[q], drawn.synopses, cfg.prior_rate
        )
        state.query_prior = boosting.move_prior(state.query_prior, np.array([q]), cfg.prior_rate)
        steps = StepSizes(alpha_q, alpha_a, 0.5 * math.tanh(alpha_q), 0.5 * math.tanh(alpha_a))
        return _Slot(element, steps, charge, charge, drawn)


class DPIPaper(DpiMechanism):
    """Algorithm 1 as printed (spec §3.6, reproduction only): multiplicative weights on
    log-weights, the paper's per-round charge (Theorem 5.1); outputs marked ``evaluation``."""

    name = "DPI-paper"
    update_mode: ClassVar[UpdateMode] = "paper"

    def spend(self, state: DpiState, slot: Slot, targets: list[NDArray[np.float64]]) -> _Slot:
        cfg = self.config
        element, charge = self.draw_element(state, slot)
        steps = (self.series.step_sizes(element.series_index, cfg.query_share)
                 if charge > 0 else StepSizes(0.0, 0.0, 0.0, 0.0))  # fmt: skip
        rng = slot.randomness
        drawn = boosting.paper_draw(self.pool, state.query_prior, state.synopsis_prior,
                                    cfg.synopses, (rng("dpi/query"), rng("dpi/synopses")))  # fmt: skip
        q = drawn.query
        # §3.10: the conservative charge uses the step sizes accumulated before this slot
        conservative = 2 * cfg.s_g * (cfg.synopses * float(state.acum_a[q]) + state.acum_q)
        boosting.paper_update(self.pool, drawn, targets[q], (state.query_prior, state.synopsis_prior),
                              (steps.alpha_q, steps.alpha_a), (cfg.lam, cfg.mu))  # fmt: skip
        state.acum_a[q] += steps.alpha_a
        state.acum_q += steps.alpha_q
        return _Slot(element, steps, charge, conservative, drawn)


class DPIPrior(DpiMechanism):
    """Baseline B2 (spec §7): DPI with α ≡ 0, the releases drawn from the uniform pool prior;
    0-DP, so it draws no series element and charges nothing."""

    name = "DPI-prior"
    update_mode: ClassVar[UpdateMode] = "none"

    def spend(self, state: DpiState, slot: Slot, targets: list[NDArray[np.float64]]) -> _Slot:
        cfg = self.config
        element = Draw(0, 0.0)
        rng = slot.randomness
        drawn = boosting.paper_draw(self.pool, np.zeros(len(cfg.queries)),
                                    np.zeros((len(cfg.queries), cfg.pool_size)), cfg.synopses,
                                    (rng("dpi/query"), rng("dpi/synopses")))  # fmt: skip
        return _Slot(element, StepSizes(0.0, 0.0, 0.0, 0.0), 0.0, 0.0, drawn)


MECHANISMS: Final[dict[str, type[DpiMechanism]]] = {m.name: m for m in (DPI, DPIPaper, DPIPrior)}
