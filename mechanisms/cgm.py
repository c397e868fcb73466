"""CGM: correlated Gaussian noise for numeric streams under (ε, δ)-LDP (spec cgm §3–§5, §8).

Every enrolled user reports a perturbed value ``x*`` at every slot. ``Alg1`` (spec §3.1, the
paper's baseline) adds independent Gaussian noise of std ``σ₁`` to each range-clipped value.
``CGM`` (Algorithm 3, spec §4.3–§4.4) clips each value to within ``C`` of the user's previous
clipped value, then reuses the share ``r_i`` of the previous report's noise and adds fresh noise
of std ``V_i·σ₁`` only: ``x*_i = (x'_i − r_i x'_{i−1} + η_i) + r_i x*_{i−1}``. Both are
(ε, δ)-LDP for the user's whole stream (user-level, not event-level): every report is a Gaussian
mechanism whose normalised surrogate has sensitivity 1 and noise ``σ̃₁``, so a user's reports
compose exactly as μ-Gaussian DP with ``μ_step = 1/σ̃₁`` (spec §8.4). With ``budget_scope =
"stream"`` a user's ``l = window`` reports share μ*(ε, δ) (``σ̃₁ = √l/μ*``, the ledger admits
exactly ``l`` reports); with ``"timestamp"`` every slot has its own budget and *every single
report* is μ*-GDP: a CGM report carries noise of variance ``v_i·σ₁²`` (not ``σ₁²``), so CGM
calibrates ``σ̃₁ = 1/(μ*·√v_∞)`` with ``v_∞ = 4C̃(1 − C̃)`` the least ``v_i`` of any chain
(Algorithm 1: ``σ̃₁ = 1/μ*``); the ledger renews every slot while the noise chain goes on.

The noise is attack-proof like the central families' Laplace: each fresh term is rounded at
random (unbiased) to a public grid (``2^−grid_bits`` of the domain) and gets exact discrete
Gaussian noise on that grid (the sensitivity bound grows by two grid steps, which the noise
covers), drawn from the slot's keyed AES-CTR stream, so a replayed slot releases byte-identical reports. The client side (clipping,
the noise chain ``(v, x'_{i−1}, x*_{i−1})`` per user and lag phase) runs behind the client port
and keeps its state there; the server side only sees the reports ``(x*, v_i)`` and releases
their mean with its standard error ``σ₁·√(Σ v_k)/n`` and a 95 % interval (spec §8.5). In
``ldp-reports`` the chain runs on the devices (``privstream.client.cgm``, each with its own μ²
ledger): a request names the public step (``CgmProtocol.request_oracle``) and ``n`` is the
number of reports that came back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar, Final, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.cgm_math import (
    agm_mu,
    ball_clip,
    diff_clip,
    range_clip,
    variance_floor,
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
    Strategy,
)
from privstream.mechanisms.guarantees import GaussianDP, Guarantee, PeriodScope, StreamScope
from privstream.mechanisms.noise import discrete_gaussian
from privstream.mechanisms.tasks import BallTask, MeanTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_fraction, check_population, check_requirement
from privstream.schema.protocol import CgmStep, OracleSpec

STATE_VERSION: Final = 1
BudgetScope = Literal["stream", "timestamp"]
Z95: Final = 1.959963984540054
LEVELS: Final = 128
"""Gap-aware runs round each report's noise level up to a power of ``2^(1/LEVELS)`` (at most
0.55 % more noise) so users at irregular steps share a few exact sampler calls."""
MIN_REQUEST_EPSILON: Final = 1e-9
"""The ε a CGM request states for a report so noisy that it is ``(0, δ)``-DP (a request's ε
must be positive; any ε above the true one is a true statement)."""


@dataclass(frozen=True, kw_only=True)
class CgmConfig:
    """Configuration of the CGM family (spec cgm §8.6); defaults are the paper's Taxi setting.

    Attributes:
        epsilon, delta: the (ε, δ)-LDP budget of a user's stream (ε in [10⁻³, 10⁶], δ in (0, 1)).
        window: ``l``, the reports one budget covers (``budget_scope = "stream"``); ignored
            per timestamp. Default 48.
        population: registered population size n (≥ 1).
        task: ``MeanTask(lo, hi)``, the public range of scalar values (diameter ``D = hi − lo``),
            or ``BallTask(center, R)`` for ``d``-dimensional values (``D = 2R``, L2 norms).
        bound: ``C``, the public bound on a user's change between reports, raw units (≥ 0;
            ``C/D ≥ 1/2`` makes CGM the baseline). Default 0.05.
        budget_scope: ``stream`` (one budget for ``l`` reports) or ``timestamp`` (per slot).
        lag: ``j``: values repeat with period ``j`` (spec §4.7); the stream splits into ``j``
            chains by slot mod ``j``, calibrated to the total count. Default 1.
        gap_aware: after ``g`` missed slots use ``C_g = min(g·C/D, 1/2)`` (spec §4.7 b)
            instead of restarting nothing; only reachable when users may miss slots.
        grid_bits: ``2^grid_bits`` steps of the public noise grid span the diameter
            (``grid_steps``). Default 14.
        budget_share: this mechanism's share ``s`` of the budget in μ² (several mechanisms).
    """

    epsilon: float = 1.0
    delta: float = 1e-5
    window: int = 48
    population: int
    task: MeanTask | BallTask = field(default_factory=lambda: MeanTask(0.0, 1.0))
    bound: float = 0.05
    budget_scope: BudgetScope = "stream"
    lag: int = 1
    gap_aware: bool = False
    grid_bits: int = 14
    budget_share: float = 1.0

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the stream's budget")
        check_population(self.population)
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if not isinstance(self.task, (MeanTask, BallTask)):
            raise ValueError(
                f"task must be a MeanTask (a range) or a BallTask (vectors), got {self.task!r}"
            )
        if not (
            isinstance(self.bound, (int, float)) and math.isfinite(self.bound) and self.bound >= 0
        ):
            raise ValueError(f"bound must be a finite number >= 0, got {self.bound!r}")
        if self.budget_scope not in ("stream", "timestamp"):
            raise ValueError(
                f"budget_scope must be 'stream' or 'timestamp', got {self.budget_scope!r}"
            )
        if not isinstance(self.lag, int) or not 1 <= self.lag <= 366:
            raise ValueError(f"lag must be an integer in [1, 366], got {self.lag!r}")
        if not isinstance(self.grid_bits, int) or not 8 <= self.grid_bits <= 20:
            raise ValueError(f"grid_bits must be an integer in [8, 20], got {self.grid_bits!r}")
        check_fraction("budget_share", self.budget_share, closed=True)
        grid_steps(self.sigma1, self.grid_bits, self.task.d)  # refuse a noise beyond the sampler

    def shared(self, share: float) -> CgmConfig:
        """This config for a mechanism given the share ``s`` of the budget in μ² (μ·√s)."""
        return dataclasses.replace(self, budget_share=share)

    @property
    def diameter(self) -> float:
        """``D``: the domain's diameter (``hi − lo``, or ``2R`` for a ball)."""
        if isinstance(self.task, BallTask):
            return 2 * float(self.task.radius)
        return float(self.task.upper - self.task.lower)

    @property
    def mu_budget(self) -> float:
        """This mechanism's μ: μ*(ε, δ)·√s (spec §2.4, §8.4)."""
        return agm_mu(self.epsilon, self.delta) * math.sqrt(self.budget_share)

    @property
    def reports_per_budget(self) -> int:
        return self.window if self.budget_scope == "stream" else 1

    @property
    def sigma1(self) -> float:
        """Algorithm 1's ``σ̃₁ = √l/μ`` (stream) or ``1/μ`` (timestamp), normalised units
        (spec §1.6); CGM's is :meth:`sigma1_for` ``(reuse=True)``."""
        return math.sqrt(self.reports_per_budget) / self.mu_budget

    def sigma1_for(self, reuse: bool) -> float:
        """``σ̃₁`` of a mechanism that reuses noise (CGM) or not (Algorithm 1).

        Guarantee: with ``budget_scope = "timestamp"`` each report alone is μ-GDP. A CGM
        report's noise has variance ``v_i·σ₁²`` and ``v_i ≥ v_∞ = 4C̃(1 − C̃)`` on every chain,
        so CGM takes ``σ̃₁ = ρ/(μ·√v_∞)``; ``1/μ`` would leave a report at ``μ/√v_i``
        (0.615 for μ* = 0.268 at C̃ = 0.05). ``ρ = 1 + √d/(K·C̃)`` covers the grid roundings a
        report carries (one step per fresh term, weighted by ``∏ r ≤ b^k``: at most
        ``2√d/(K(1 − b))`` of the diameter between neighbours). Over a whole stream
        (``"stream"``) the surrogates compose to ``√l/σ̃₁ = μ`` (spec §4.5) and the paper's
        ``√l/μ`` stands. Raises ValueError for CGM per timestamp with ``bound = 0``
        (``v_∞ = 0``).
        """
        if not reuse or self.budget_scope == "stream":
            return self.sigma1
        c_norm = min(self.bound / self.diameter, 0.5)
        floor = variance_floor(c_norm)
        if floor == 0:
            raise ValueError(
                "CGM with budget_scope 'timestamp' needs bound > 0: with bound 0 the chain "
                "averages the reports and no single report can be held to the per-slot μ; "
                "set a bound, use Alg1, or use budget_scope 'stream'"
            )
        base, d = self.sigma1 / math.sqrt(floor), self.task.d
        sigma, steps = base, 0.0
        while grid_steps(sigma, self.grid_bits, d) != steps:  # K shrinks only for huge σ̃₁
            steps = grid_steps(sigma, self.grid_bits, d)
            sigma = base * (1 + math.sqrt(d) / (steps * c_norm))
        return sigma

    @property
    def report_charge(self) -> float:
        """μ² a report is charged in its budget: ``1/σ̃₁²`` of Algorithm 1 (a whole stream of
        ``l`` reports composes to μ²), so per timestamp the stated ``μ²`` of one slot."""
        return 1 / self.sigma1**2


@dataclass
class CgmState:
    """The server's state: the ledger of every user (reports charged in the current budget and
    over their lifetime, dense by user index), the last release and the step counter."""

    mechanism: str
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    charged: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    lifetime: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    estimate: tuple[float, ...] = (0.0,)
    source_slot: int | None = None


@dataclass
class CgmClients:
    """The devices' state, per user index and lag phase (secret: it reveals the clipped value):
    reports made, ``v`` of the last one, the last clipped value ``x'`` and report ``x*``, and
    the slot of the last report (for gaps)."""

    steps: NDArray[np.int64]
    v: NDArray[np.float64]
    clipped: NDArray[np.float64]
    reported: NDArray[np.float64]
    last_slot: NDArray[np.int64]

    @classmethod
    def empty(cls, n: int, lag: int, d: int = 1) -> CgmClients:
        return cls(np.zeros((n, lag), np.int64), np.ones((n, lag)), np.zeros((n, lag, d)),
                   np.zeros((n, lag, d)), np.full((n, lag), -1, np.int64))  # fmt: skip

    def copy(self) -> CgmClients:
        return CgmClients(*(a.copy() for a in dataclasses.astuple(self)))


@dataclass(frozen=True)
class CgmRelease(Details):
    """The CGM facts of a release (spec §8.5): the reports aggregated, the theoretical standard
    error of the mean and its 95 % interval (noise only: clipping bias is not in it), the
    noise scale ``σ₁`` in raw units and the users the ledger refused at this slot."""

    family: ClassVar[str] = "cgm"
    reports: int
    stderr: tuple[float, ...]
    ci_low: tuple[float, ...]
    ci_high: tuple[float, ...]
    sigma1: float
    refused: int


@dataclass(frozen=True)
class CgmLedger(Details):
    """The Gaussian-DP ledger after a slot (spec §8.4): the most-charged user's μ in the current
    budget and its ε at the configured δ, the reports of that user, the users refused, and the
    lifetime μ of the user with the most reports (the per-user lifetime counter)."""

    family: ClassVar[str] = "cgm"
    mu_spent: float
    epsilon_spent: float
    delta: float
    reports: int
    refused: int
    lifetime_mu: float
    """μ of the user with the most reports over the stream's life (across renewed budgets)."""


@dataclass(frozen=True)
class CgmProtocol:
    """The device side of one slot (spec §4.4 steps 1–14, §4.6, §4.7): range clip, differential
    clip against the previous clipped value, the reuse schedule from the previous report's
    ``v``, and snapped discrete Gaussian noise. ``reuse = False`` is Algorithm 1."""

    slot: int
    task: MeanTask | BallTask
    bound: float
    sigma1: float
    grid_bits: int
    lag: int
    reuse: bool
    gap_aware: bool
    delta: float | None = None
    """The δ a request for real devices states its per-report ε at (``request_oracle``)."""

    def request_oracle(self) -> tuple[OracleSpec, float, float]:
        """What an ``ldp-reports`` request asks the devices (``schema.protocol.CgmStep``): the
        public step (``σ̃₁``, grid, lag, ``C``, the switches, the domain), each device computing
        ``r, V, v`` from its own chain; and one report's budget ``(ε, δ)``: a report is
        ``1/σ̃₁``-GDP (spec §4.5, §8.4), i.e. ``(ε(δ; 1/σ̃₁), δ)``-DP at the configured δ."""
        if self.delta is None:
            raise ValueError("a CGM protocol names a request for real devices only with its δ")
        task = self.task
        if isinstance(task, BallTask):
            domain: dict[str, Any] = {"lower": None, "upper": None, "radius": float(task.radius),
                                      "center": tuple(float(c) for c in task.center)}  # fmt: skip
        else:
            domain = {"lower": float(task.lower), "upper": float(task.upper)}
        step = CgmStep(float(self.sigma1), self.grid_bits, self.lag, float(self.bound),
                       self.reuse, self.gap_aware, **domain)  # fmt: skip
        return OracleSpec("CGM", task.d, step), report_epsilon(self.sigma1, self.delta), self.delta

    def respond(
        self, values: NDArray[Any], asked: NDArray[np.bool_], state: CgmClients,
        rng: np.random.Generator,
    ) -> tuple[NDArray[np.float64], CgmClients]:  # fmt: skip
        new, users, phase = state.copy(), np.flatnonzero(asked), self.slot % self.lag
        x = self._domain_clip(np.asarray(values, np.float64)[users].reshape(users.size, -1))
        r, V, v, c_raw = self._schedule(new, users, phase)
        prev_clip, prev_report = new.clipped[users, phase], new.reported[users, phase]
        first = new.steps[users, phase] == 0
        # the differential clip matters only while C/D < 1/2 (else this is Algorithm 1, §4.3)
        skip = first | (c_raw >= self.diameter / 2)
        clip = x if not self.reuse else np.where(skip[:, None], x, diff_clip(x, prev_clip, c_raw))
        fresh = clip - r[:, None] * prev_clip
        report = self._perturb(fresh, V, rng) + r[:, None] * prev_report
        new.steps[users, phase] += 1
        new.v[users, phase], new.clipped[users, phase] = v, clip
        new.reported[users, phase], new.last_slot[users, phase] = report, self.slot
        return np.column_stack([report, v]), new

    @property
    def diameter(self) -> float:
        task = self.task
        return 2 * task.radius if isinstance(task, BallTask) else task.upper - task.lower

    def _domain_clip(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Range clip for scalars, projection onto the ball for vectors (spec §4.6)."""
        if isinstance(self.task, BallTask):
            return ball_clip(x, np.array(self.task.center), self.task.radius)
        return range_clip(x, self.task.lower, self.task.upper)

    def _schedule(
        self, state: CgmClients, users: NDArray[np.intp], phase: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """``r_i, V_i, v_i`` of every asked user's next report (spec §4.3) and their clip
        radius; a user's first report (of a lag chain) starts the chain, ``v = 1``. A step whose
        bound reaches ``1/2`` is Algorithm 1's (``r = 0``) and clips nothing: radius ``D``, as
        spec §4.4 S2 skips the differential clip."""
        diameter = self.diameter
        first = state.steps[users, phase] == 0
        if not self.reuse:
            ones = np.ones(users.size)
            return np.zeros(users.size), ones, ones, ones * diameter
        gap = np.maximum((self.slot - state.last_slot[users, phase]) // self.lag, 1)
        c_norm = self.bound / diameter * (gap if self.gap_aware else 1)
        c_norm = np.minimum(c_norm, 0.5)
        b = 1 - 2 * c_norm
        v_prev = state.v[users, phase]
        r = np.where(first, 0.0, b / (b * b + v_prev))
        V = np.where(first, 1.0, 1 - r * b)
        v = np.where(first, 1.0, v_prev / (b * b + v_prev))
        return r, V, v, np.where(c_norm < 0.5, c_norm, 1.0) * diameter

    def _perturb(
        self, fresh: NDArray[np.float64], V: NDArray[np.float64], rng: np.random.Generator
    ) -> NDArray[np.float64]:
        """``g·(R(fresh/g) + Z)``: ``R`` rounds each coordinate to a neighbouring grid step at
        random (up with probability its fraction: unbiased, so no rounding error builds up
        along a user's noise chain) and ``Z`` is exact discrete Gaussian noise of integer std
        ``s = ⌈(V·K + 2√d)·σ̃₁⌉`` steps (variance parameter ``s(s+1)``, so the exact sampler
        stays in int64), where ``K`` (``grid_steps``) steps span the diameter.
        Any rounding of two neighbours' terms lies within ``V·K + 2√d`` steps (L2), so each
        conditional mechanism, and so their mixture, keeps the ratio ``1/σ̃₁`` (spec §4.5); the
        noise is at most ``2√d/(V·K)`` above ``V·σ₁``. One draw per distinct noise level."""
        d = fresh.shape[1]
        K = grid_steps(self.sigma1, self.grid_bits, d)
        grid = self.diameter / K
        scaled = fresh / grid
        out = np.floor(scaled)
        out += rng.random(scaled.shape) < scaled - out
        steps = V * K + 2 * math.sqrt(d)
        if self.gap_aware:  # irregular gaps give every user its own V: share a few levels
            steps = 2.0 ** (np.ceil(np.log2(steps) * LEVELS) / LEVELS)
        same = steps.size and steps.min() == steps.max()  # the usual case: no 10⁶-float sort
        for level in steps[:1] if same else np.unique(steps):
            rows = np.flatnonzero(level == steps)
            sigma = math.ceil(float(level) * self.sigma1)  # σ² = s(s+1) ≥ s²: the fast path
            noise = discrete_gaussian(rng, Fraction(sigma * (sigma + 1)), rows.size * d)
            out[rows] += noise.reshape(rows.size, d)
        result: NDArray[np.float64] = out * grid
        return result


@functools.cache
def report_epsilon(sigma1: float, delta: float) -> float:
    """ε at ``delta`` of one report, a ``1/σ̃₁``-GDP mechanism (at least
    ``MIN_REQUEST_EPSILON``)."""
    return max(GaussianDP(1 / sigma1).epsilon(delta), MIN_REQUEST_EPSILON)


def grid_steps(sigma1: float, grid_bits: int, d: int = 1) -> float:
    """``K``: the public grid's steps per diameter, ``2^grid_bits`` — fine enough that the
    rounding's extra sensitivity (``2√d`` steps) adds little to the noise — unless the noise
    std in steps, at most ``(K + 2√d)·σ̃₁``, would pass ``2^20`` (the exact sampler's range):
    then the largest power of two that keeps it there."""
    room = 2**20 / sigma1 - 2 * math.sqrt(d)
    if room <= 0:
        raise ValueError(
            f"σ̃₁ = {sigma1:.6g} is too large for the exact Gaussian sampler: raise ε or δ, "
            "or cover fewer reports with one budget"
        )
    return 2.0 ** min(grid_bits, math.floor(math.log2(room)))


class CgmMechanism(Mechanism[CgmConfig, CgmState]):
    """Shared skeleton of the CGM family: the per-user Gaussian-DP ledger, the reports through
    the client port, the mean with its standard error (spec §8.4, §8.5)."""

    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated",)
    division: ClassVar[Division] = "user"
    reuse: ClassVar[bool]
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("epsilon", -1.0), ("delta", 0.0), ("delta", 1.0),
                 ("window", 0), ("population", 0), ("bound", -1.0), ("lag", 0),
                 ("budget_scope", "forever"), ("task", None)),
    )  # fmt: skip

    def __init__(self, config: CgmConfig) -> None:
        super().__init__(config)
        self.sigma1 = config.sigma1_for(self.reuse)
        """``σ̃₁`` of this mechanism (normalised units): see :meth:`CgmConfig.sigma1_for`."""
        grid_steps(self.sigma1, config.grid_bits, config.task.d)  # within the sampler's range

    @property
    def privacy_cost(self) -> Guarantee:
        """μ-GDP for a user's whole stream (``stream``) or for each slot's report alone
        (``timestamp``), spec §8.4; μ = μ*(ε, δ)·√s, which is (ε, δ)-LDP at the configured δ
        (spec §2.2)."""
        cfg = self.config
        scope = StreamScope() if cfg.budget_scope == "stream" else PeriodScope(1)
        return Guarantee(GaussianDP(cfg.mu_budget), scope, "ldp")

    def initial_state(self) -> CgmState:
        n = self.config.population
        zeros = np.zeros(n, dtype=np.int64)
        start = (0.0,) * self.config.task.d
        return CgmState(self.name, charged=zeros, lifetime=zeros.copy(), estimate=start)

    def client_state(self) -> CgmClients:
        return CgmClients.empty(self.config.population, self.config.lag, self.config.task.d)

    def protocol(self, slot: int) -> CgmProtocol:
        cfg = self.config
        return CgmProtocol(slot, cfg.task, cfg.bound, self.sigma1, cfg.grid_bits, cfg.lag,
                           self.reuse, cfg.gap_aware, cfg.delta)  # fmt: skip

    def _advance(self, state: CgmState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg = self.config
        self.enter(state, slot, slot.client.population, cfg.population)
        if cfg.budget_scope == "timestamp":
            state.charged[:] = 0  # the ledger renews every slot; the noise chain goes on
        eligible = slot.client.eligible()
        admitted = state.charged < cfg.reports_per_budget  # μ_total = √t·μ_step ≤ μ*
        asked = eligible & admitted
        refused = int((eligible & ~admitted).sum())
        reports, paid = np.zeros((0, cfg.task.d + 1)), bool(asked.any())
        if paid:  # ldp-reports: the rows of the reports that came back, maybe fewer than asked
            reports = slot.client.respond(self.protocol(slot.index), asked, "report")
            state.charged[asked] += 1
            state.lifetime[asked] += 1
        return [
            self._release(state, slot, reports, refused),
            self._entry(state, slot, paid, refused),
        ]

    def _release(
        self, state: CgmState, slot: Slot, reports: NDArray[np.float64], refused: int
    ) -> Release:
        """The mean of the reports with ``SE = σ₁·√(Σ v_k)/n`` (spec §8.5), ``n`` the rows
        received (``ldp-reports``: the reports that came back, not the users asked), or the
        last one when none came."""
        cfg, n = self.config, reports.shape[0]
        strategy: Strategy = "approximate"
        se: tuple[float, ...] = ()
        if n:
            state.estimate = tuple(float(x) for x in reports[:, :-1].mean(axis=0))
            state.source_slot, strategy = slot.index, "publish"
            sigma1_raw = self.sigma1 * cfg.diameter
            se = (sigma1_raw * math.sqrt(float(reports[:, -1].sum())) / n,) * len(state.estimate)
        low = tuple(m - Z95 * s for m, s in zip(state.estimate, se, strict=False))
        high = tuple(m + Z95 * s for m, s in zip(state.estimate, se, strict=False))
        details = CgmRelease(n, se, low, high, self.sigma1 * cfg.diameter, refused)
        return self.release(slot, strategy, state.estimate, state.source_slot, details)

    def _entry(self, state: CgmState, slot: Slot, paid: bool, refused: int) -> LedgerEntry:
        """One class (every user shares the budget): an asked user paid ``μ_step²`` at this
        slot (``paid``: charged when asked, whether or not its report came back); the
        most-charged user has ``t·μ_step²`` of ``μ²`` (spec §8.4). The lifetime μ composes the
        surrogates, ``√t/σ̃₁`` (spec §4.5)."""
        cfg = self.config
        step = cfg.report_charge
        most = int(state.charged.max(initial=0))
        spent = most * step
        spend = ClassSpend(cfg.reports_per_budget, cfg.mu_budget**2, cfg.population,
                           step if paid else 0.0, spent)  # fmt: skip
        eps = GaussianDP(math.sqrt(spent)).epsilon(cfg.delta) if spent > 0 else 0.0
        lifetime = math.sqrt(int(state.lifetime.max(initial=0))) / self.sigma1
        details = CgmLedger(math.sqrt(spent), eps, cfg.delta, most, refused, lifetime)
        return self.ledger_entry(slot, (spend,), details)


class Alg1(CgmMechanism):
    """Algorithm 1 (spec §3.1), the paper's baseline: every report gets independent Gaussian
    noise of std ``σ₁`` on the range-clipped value; no differential clip."""

    name = "Alg1"
    reuse = False


class CGM(CgmMechanism):
    """Algorithm 3 (spec §4.3–§4.4): differential clip, reuse ``r_i`` of the previous report's
    noise, fresh noise ``V_i·σ₁``; per-report variance ``v_i σ₁²`` (Theorem 5.1, spec §5.1)."""

    name = "CGM"
    reuse = True


MECHANISMS: Final[dict[str, type[CgmMechanism]]] = {m.name: m for m in (CGM, Alg1)}
