"""SaO2: real-time private means of sparse binary streams (spec sao2 §2, §3, §4.4, §5.2, §7,
§10), an engine-free ``Mechanism`` in ``ldp-simulated``.

Time is cut into **horizons** of ``T = window`` slots (a power of ``r`` recommended, spec §3.2).
At a horizon's first slot the server enrols every user whose lifetime budget still holds one
more horizon and gives each a level ``h`` drawn independently of the data from the slot's keyed
randomness (``levels``; exactly ``level_counts(n, W)`` users per level, spec §2, §3.5). At every
slot the devices (``sao2_client.Sao2Protocol``) clip their stream to ``s`` changes, and each level
whose block ends emits its ExSub symbols; the shuffler forwards per level the counts ``c±``.
The server turns them into unbiased level means (E1, spec §4.5), rebuilds ``x̂̄_t`` with
Algorithm 2 and releases it with its analytic standard error (§5.2) and the running prefix sum
``P[t]`` (so any range ``[t1, t2]`` is ``P[t2] − P[t1−1]``, post-processing).

**Privacy guarantee.** User-level ε-LDP per horizon: a user's whole transcript over a horizon is
one ``(d·T_h + s, s, ε, m_h)``-ExSub output of its clipped stream (spec §1.2, §4.2), and the level
and the emission schedule do not depend on the data. Across horizons a user's ε composes
basically: the ledger charges each enrolled user ε once per horizon, at its start, and never
enrols a user whose lifetime spend would pass ``ε_life`` (spec §10.6), so every user is
``ε_life``-LDP over its lifetime in the stream (the declared guarantee). Behind a shuffler each
level's reports are also central ``(ε_c, δ)``-DP, stated per level with the classical bound of
Lemma 3.4 at ``n = n_h`` (``classical-7.1``, spec §7.1, A35); that statement is informational: the
ledger accounts the local ε. Releases carry no raw value, true count or user identifier; the
per-level ``n_h`` are public (data-independent).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import ClassVar, Final

import numpy as np
from numpy.typing import NDArray

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
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee, LifetimeScope, PureDP
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.sao2_client import Sao2Clients, Sao2Protocol
from privstream.mechanisms.sao2_encoding import (
    QUERY_FAMILIES,
    WEIGHT_STRATEGIES,
    SlotReconstructor,
    assign_levels,
    level_G,
    level_lengths,
    level_weights,
)
from privstream.mechanisms.sao2_exsub import (
    ExSubParams,
    exsub_params,
    optimal_m,
    subgroup_law,
    value_estimate,
)
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.mechanisms.shuffle_accountant import classical_bound
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_population, check_requirement

STATE_VERSION: Final = 1
LIFETIME: Final = 0
"""The ``ClassSpend.scope`` of the lifetime account: no window, every horizon counts."""
DIVISION: Final = "sao2-lifetime"
"""The lifetime division (one account per user; ε per enrolled horizon; declared with its audit
by ``families.sao2``)."""
ACCOUNTANT: Final = "classical-7.1"
"""The shuffle bound a release states (spec §7.1; §7.2 is unverified, A23)."""


@dataclass(frozen=True, kw_only=True)
class Sao2Config:
    """SaO2's configuration (spec sao2 §2, §3.5, §4.7, §10).

    Attributes:
        epsilon: ε, each enrolled user's local budget for one horizon.
        window: ``T``, the horizon's length in slots (a power of ``r`` recommended, §3.2).
        population: registered population size ``n`` (at least one user per level).
        task: ``BinaryTask(d, kind)``, one-hot categories or bitmasks.
        s: the change bound: each user's stream is clipped to ``s`` changes per horizon (§3.1).
        r: the hierarchy's fan-out (≥ 2; the paper recommends 2).
        weights: the level weights' strategy (``WEIGHT_STRATEGIES``, §3.5); ``optimal`` weighs
            by ``√G_h`` for the query family ``query_family``.
        m: ``m_h`` per level (``1 ≤ m_h ≤ d'_h``), None for ``m*`` at every level (§4.7).
        lifetime_epsilon: ``ε_life ≥ ε``, a user's budget over all horizons (None: ε, one
            horizon per user).
        delta: the δ of the stated central (shuffle) ε_c (§7).
    """

    epsilon: float = 1.0
    window: int = 32
    population: int
    task: BinaryTask = field(default_factory=lambda: BinaryTask(8))
    s: int = 8
    r: int = 2
    weights: str = "uniform"
    query_family: str = "prefix"
    m: tuple[int, ...] | None = None
    lifetime_epsilon: float | None = None
    delta: float = 1e-5

    def __post_init__(self) -> None:
        check_requirement(self.epsilon, self.window, "the horizon's budget")
        check_population(self.population)
        if not isinstance(self.task, BinaryTask):
            raise ValueError(f"task must be a BinaryTask, got {self.task!r}")
        for name, low in (("s", 1), ("r", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.weights not in WEIGHT_STRATEGIES or self.query_family not in QUERY_FAMILIES:
            raise ValueError(f"weights must be one of {WEIGHT_STRATEGIES} and query_family one "
                             f"of {QUERY_FAMILIES}, got {self.weights!r}, {self.query_family!r}")  # fmt: skip
        life = self.lifetime
        if not (math.isfinite(life) and life >= self.epsilon):
            raise ValueError(f"lifetime_epsilon must be finite and >= epsilon, got {life!r}")
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        H = len(self.d_primes)
        if self.population < H:
            raise ValueError(f"population must hold a user per level ({H}), got {self.population}")
        if self.m is not None and (
            len(self.m) != H
            or any(not isinstance(m, int) or not 1 <= m <= dp for m, dp in zip(self.m, self.d_primes, strict=False))
        ):  # fmt: skip
            raise ValueError(
                f"m must give 1 <= m_h <= d'_h for each of the {H} levels, got {self.m!r}"
            )

    def shared(self, share: float) -> Sao2Config:
        """This config for a mechanism given the share ``s`` of the budget: s·ε per horizon and
        s·ε_life over the lifetime."""
        life = None if self.lifetime_epsilon is None else self.lifetime_epsilon * share
        return dataclasses.replace(self, epsilon=self.epsilon * share, lifetime_epsilon=life)

    @property
    def lifetime(self) -> float:
        """``ε_life``."""
        return float(self.epsilon if self.lifetime_epsilon is None else self.lifetime_epsilon)

    @property
    def d_primes(self) -> tuple[int, ...]:
        """``d'_h = d·T_h + s`` per level (spec §5.1)."""
        return tuple(self.task.d * T_h + self.s for T_h in level_lengths(self.window, self.r))


@dataclass
class Sao2State:
    """The server's state: per user the horizons it was enrolled in (its lifetime spend is that
    times ε) and its level in the current horizon (−1: not enrolled; public), the horizon's
    ``n_h``, stated ``ε_c`` and reconstruction, the running prefix sum and the last release."""

    mechanism: str
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    horizon: int = -1
    horizons: NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    level: NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    n_h: tuple[int, ...] = ()
    epsilon_central: tuple[float, ...] = ()
    refused: int = 0
    reconstructor: SlotReconstructor | None = None
    prefix: tuple[float, ...] = ()
    estimate: tuple[float, ...] = ()
    source_slot: int | None = None


@dataclass(frozen=True)
class Sao2Release(Details):
    """The SaO2 facts of a release (spec §5.2, §10.5): the horizon and slot in it, the analytic
    standard error of every coordinate ``SE_t = √(Σ_{(h,t'') used by t} max(V_nz,h, V_z,h)/n_h)``
    (an upper bound), the prefix sum ``P[t]`` over the stream, per level ``n_h``, ``m_h`` and the
    stated central ε_c of the shuffled level (method ``accountant``, at ``delta``)."""

    family: ClassVar[str] = "sao2"
    horizon: int
    tau: int
    stderr: float | None
    prefix: tuple[float, ...]
    n_h: tuple[int, ...]
    m_h: tuple[int, ...]
    epsilon_central: tuple[float, ...]
    accountant: str
    delta: float


@dataclass(frozen=True)
class Sao2Ledger(Details):
    """The lifetime ledger after a slot (spec §10.6): ε per horizon, ``ε_life``, the most-spent
    user's lifetime spend, the users enrolled in the horizon and those refused at its start
    (lifetime spent), the public ``s``, ``r``, ``T``, per level ``d'_h``, ``m_h``, ``n_h``,
    ``W_h`` and the stated ε_c, and the last release's standard error (data-independent: it
    depends on ``n_h`` and the slot's place in the horizon only); the shuffler's minimum batch
    ``n_min = ⌈16 e^ε log(4/δ)⌉`` and the levels with ``n_h < n_min`` (§10.4: amplification is
    weak there), a hash of each level's subgroup CDF (the devices' public table, §4.3) and the
    shuffle mode (``simulated``: the counts are formed in-process; a deployed shuffler is its
    own trust domain). Dropouts and clipped users are device-side facts, never in this public
    ledger."""

    family: ClassVar[str] = "sao2"
    horizon: int
    tau: int
    s: int
    r: int
    window: int
    epsilon: float
    lifetime_epsilon: float
    lifetime_spent: float
    enrolled: int
    refused: int
    d_prime: tuple[int, ...]
    m_h: tuple[int, ...]
    n_h: tuple[int, ...]
    weights: tuple[float, ...]
    epsilon_central: tuple[float, ...]
    accountant: str
    delta: float
    stderr: float | None
    n_min: int
    small_levels: int
    subgroup_cdf: tuple[str, ...]
    shuffle: str = "simulated"


def min_batch(epsilon: float, delta: float) -> int:
    """``n_min = ⌈16 e^ε log(4/δ)⌉`` (spec §10.4): below it a level's shuffle amplification is
    weak (562 at ε = 1, δ = 1e−5)."""
    return math.ceil(16 * math.exp(epsilon) * math.log(4 / delta))


def subgroup_digest(cdf: NDArray[np.float64]) -> str:
    """A short SHA-256 of a level's subgroup CDF (spec §10.6), so a reader can tell that every
    device drew its subgroup from the same public table."""
    return hashlib.sha256(np.asarray(cdf, dtype="<f8").tobytes()).hexdigest()[:16]


class Sao2Mechanism(Mechanism[Sao2Config, Sao2State]):
    """SaO2 with online ExSub (spec sao2 §2, §4.4, §5.2; module docstring): ε-LDP per horizon,
    ``ε_life`` over a lifetime."""

    name: ClassVar[str] = "SaO2"
    state_version: ClassVar[int] = STATE_VERSION
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-simulated", "ldp-shuffled")
    division: ClassVar[Division] = DIVISION
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("window", 0), ("population", 0), ("s", 0), ("r", 1),
                 ("weights", "best"), ("lifetime_epsilon", 0.5), ("delta", 1.0), ("task", None)),
    )  # fmt: skip

    def __init__(self, config: Sao2Config) -> None:
        super().__init__(config)
        cfg = config
        d_primes = cfg.d_primes
        m = cfg.m or tuple(optimal_m(dp, cfg.s, float(cfg.epsilon)) for dp in d_primes)
        self.params: tuple[ExSubParams, ...] = tuple(
            exsub_params(dp, cfg.s, float(cfg.epsilon), mh) for dp, mh in zip(d_primes, m, strict=True)
        )  # fmt: skip
        self.variance = np.asarray([max(p.V_nz, p.V_z) for p in self.params])
        """``max(V_nz, V_z)`` per level: one user's per-coordinate variance bound (§4.6)."""
        G = level_G(cfg.window, cfg.r, self.variance, cfg.query_family, cfg.task.d)
        self.weights = level_weights(cfg.weights, cfg.window, cfg.r, G)
        self.n_min = min_batch(float(cfg.epsilon), cfg.delta)
        self.subgroup_cdf = tuple(
            subgroup_digest(subgroup_law(p.d_prime, cfg.s, float(cfg.epsilon), p.m).cdf)
            for p in self.params
        )

    @property
    def m_h(self) -> tuple[int, ...]:
        return tuple(p.m for p in self.params)

    @property
    def privacy_cost(self) -> Guarantee:
        """Pure ``ε_life``-LDP over a user's lifetime, user-level (ε per horizon, composed)."""
        return Guarantee(PureDP(self.config.lifetime), LifetimeScope(), "ldp")

    def initial_state(self) -> Sao2State:
        n, d = self.config.population, self.config.task.d
        return Sao2State(self.name, horizons=np.zeros(n, dtype=np.int32),
                         level=np.full(n, -1, dtype=np.int8), prefix=(0.0,) * d,
                         estimate=(0.0,) * d)  # fmt: skip

    def client_state(self) -> Sao2Clients:
        return Sao2Clients.empty(self.config.population, self.config.s)

    def protocol(self, tau: int, enrol: NDArray[np.int64] | None) -> Sao2Protocol:
        cfg = self.config
        return Sao2Protocol(tau, cfg.window, cfg.r, cfg.s, float(cfg.epsilon), cfg.task,
                            self.m_h, enrol)  # fmt: skip

    def _advance(self, state: Sao2State, slot: Slot) -> list[Release | LedgerEntry]:
        cfg = self.config
        self.enter(state, slot, slot.client.population, cfg.population)
        tau = (state.t - 1) % cfg.window + 1
        enrol = self._enrol(state, slot) if tau == 1 else None
        enrolled = sum(state.n_h) > 0
        charged = cfg.epsilon if enrol is not None and enrolled else 0.0
        strategy: Strategy = "publish"
        # every device with a new value keeps it (carried forward, spec §10.2); enrolled ones emit
        protocol = self.protocol(tau, None if enrol is None else enrol.astype(np.int64))
        counts = slot.client.respond(protocol, slot.client.eligible(), "symbols")
        if enrolled:
            estimate = self._estimate(state, tau, counts)
        else:  # nobody enrolled this horizon: the last release repeats, nothing is spent
            estimate, strategy = np.asarray(state.estimate), "approximate"
        release = self._release(state, slot, tau, estimate, strategy)
        assert isinstance(release.details, Sao2Release)
        return [release, self._entry(state, slot, tau, charged, release.details.stderr)]

    def _enrol(self, state: Sao2State, slot: Slot) -> NDArray[np.int8]:
        """A horizon starts: every user whose lifetime holds one more ε is enrolled at a level
        drawn from the slot's keyed randomness (data-independent, spec §2); fewer such users
        than levels enrol nobody (a level without users cannot be estimated). The ledger
        invariant is checked before anything is released (``PrivacyBudgetExceeded``)."""
        cfg = self.config
        state.horizon += 1
        fits = (state.horizons.astype(np.float64) + 1) * cfg.epsilon <= budget_limit(cfg.lifetime)
        users = np.flatnonzero(fits)
        state.refused = int((~fits).sum())
        state.level = np.full(cfg.population, -1, dtype=np.int8)
        H = len(self.params)
        if users.size >= H:
            levels = assign_levels(users.size, self.weights, slot.randomness("levels"), "share")
            state.level[users] = levels
            state.horizons[users] += 1
        if state.horizons.max(initial=0) * cfg.epsilon > budget_limit(cfg.lifetime):
            raise PrivacyBudgetExceeded(f"{self.name}: an enrolment would pass the lifetime budget")
        state.n_h = tuple(int(c) for c in np.bincount(state.level[state.level >= 0], minlength=H))
        state.epsilon_central = tuple(
            classical_bound(float(cfg.epsilon), n, cfg.delta).epsilon if n else float(cfg.epsilon)
            for n in state.n_h
        )
        state.reconstructor = SlotReconstructor(cfg.window, cfg.task.d, cfg.r)
        return state.level

    def _estimate(
        self, state: Sao2State, tau: int, counts: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """E1 for every level whose block ends at ``tau`` (spec §4.5), then Algorithm 2 (§3.3)."""
        cfg, recon = self.config, state.reconstructor
        assert recon is not None
        for h, params in enumerate(self.params):
            if tau % cfg.r**h == 0:
                c_plus, c_minus = counts[h, 0].astype(np.int64), counts[h, 1].astype(np.int64)
                recon.put(h, tau // cfg.r**h, value_estimate(c_plus, c_minus, state.n_h[h], params))
        return recon.release(tau)

    def stderr(self, tau: int, n_h: tuple[int, ...]) -> float:
        """``SE_t`` of spec §5.2: level ``h`` adds its ``h``-th base-``r`` digit of ``tau``
        residues to ``x̂̄_t`` (Algorithm 2), each of variance at most ``max(V_nz, V_z)/n_h``."""
        r = self.config.r
        digits = [(tau // r**h) % r for h in range(len(self.params))]
        return math.sqrt(
            sum(k * v / n for k, v, n in zip(digits, self.variance, n_h, strict=True) if k)
        )

    def _release(
        self,
        state: Sao2State,
        slot: Slot,
        tau: int,
        estimate: NDArray[np.float64],
        strategy: Strategy,
    ) -> Release:
        cfg = self.config
        state.prefix = tuple(float(p + x) for p, x in zip(state.prefix, estimate, strict=True))
        state.estimate = tuple(float(x) for x in estimate)
        if strategy == "publish":
            state.source_slot = slot.index
        se = self.stderr(tau, state.n_h) if strategy == "publish" else None
        details = Sao2Release(state.horizon, tau, se, state.prefix, state.n_h, self.m_h,
                              state.epsilon_central, ACCOUNTANT, cfg.delta)  # fmt: skip
        return self.release(slot, strategy, state.estimate, state.source_slot, details)

    def _entry(
        self, state: Sao2State, slot: Slot, tau: int, charged: float, stderr: float | None
    ) -> LedgerEntry:
        """One class, the lifetime account: an enrolled user pays ε at its horizon's start; the
        most-spent user has spent ``horizons·ε`` of ``ε_life``."""
        cfg = self.config
        spent = float(state.horizons.max(initial=0)) * cfg.epsilon
        spend = ClassSpend(LIFETIME, cfg.lifetime, cfg.population, charged, spent)
        details = Sao2Ledger(state.horizon, tau, cfg.s, cfg.r, cfg.window, cfg.epsilon,
                             cfg.lifetime, spent, sum(state.n_h), state.refused, cfg.d_primes,
                             self.m_h, state.n_h, tuple(float(w) for w in self.weights),
                             state.epsilon_central, ACCOUNTANT, cfg.delta, stderr, self.n_min,
                             sum(1 for n in state.n_h if 0 < n < self.n_min),
                             self.subgroup_cdf)  # fmt: skip
        return self.ledger_entry(slot, (spend,), details)
