"""Personalized w-event privacy over infinite streams (spec ``personalized-w-event.md``).

Trust mode ``cdp`` (design §4): a trusted curator sees every user's value; only the releases are
public. Every user ``i`` states a requirement ``(w_i, ε_i)`` (users without one get the stream
default ``(Config.window, Config.epsilon)``); users sharing a requirement form a privacy class.

**Guarantee — (𝐰, 𝛆)-EPDP (w-event ε-personalized DP, spec §1.3).** For every user ``i`` and
every slot ``t`` the budget charged to ``i`` over the user's own window satisfies (C1, §1.4)
``Σ_{k=max(1,t−w_i+1)}^{t} ε_{i,k} ≤ ε_i``; by sequential composition within a window, the
releases on any two ``w_i``-neighbouring stream prefixes that differ only in user ``i``'s rows
have probabilities within a factor ``e^{ε_i}``. ``PersonalizedLedger`` checks (C1) per class on
every charge and raises ``PrivacyBudgetExceeded`` before anything of the slot is released. The
charge is the *allocated* budget, never the possibly smaller loss after sampling (A5).

Mechanisms (all release one ``d``-bin count histogram ``r_t`` per slot, ``Δ = 1``):

* ``PBD``, ``PBA`` — the paper's PWSM instances (§4.2, §4.3), each user budgeted by class;
* ``BD``, ``BA`` (Kellaris et al., §3.3, §3.4), ``Uniform`` (§3.1), ``Sample`` (§3.2) — one
  ``(ε, w)`` for everybody; they refuse a population holding a requirement stricter than it;
* ``PU`` (§3.6) — personalized uniform through SM; ``PLBU`` (§3.5, A13) — personalized LDP
  budget uniform with OUE, simulated from the class histograms (exact in distribution).

Building blocks: ``obs`` (Optimal Budget Selection, Alg. 1), ``sampling_error`` (Eq. 1),
``sm_sample``/``sm`` (the Sampling Mechanism SM_s/SM_d of Jorgensen et al., §2.2, drawn per class
and bin with binomials), ``dissimilarity_calculation`` (DC, Alg. 3).

**Population growth (spec §9.5).** Users register over time (``Requirements.registered``); an
unregistered user belongs to no class and their data is never used. A user registering in an
existing class joins its ledger, which already holds spend they never incurred (conservative);
a new class ``(w_c, ε_c)`` joins at step ``t_c`` with zero history (PBD: empty look-back; PBA:
``a_c = t_c``), so (C1) holds for it over every window since ``t_c``. The uniform baselines keep
one stream-wide schedule and charge a class from its join on (a subset of a schedule that is
``(w, ε)``-bounded), refusing at once a class stricter than ``(w, ε)``. A class that shrinks or
disappears (a user left it or changed requirement) halts the stream with
``PrivacyBudgetExceeded`` before anything of the slot is charged or released. While nobody is
registered the mechanisms skip (repeat ``r_{t−1}``, ``0^d`` at first) and charge nobody.

Time ``t`` is the mechanism's own 1-based step counter; releases carry the stream's slot index.
Randomness: one generator per purpose (``dc/sample``, ``dc/noise``, ``pub/sample``,
``pub/noise``, ``pub/client``) from the slot's ``SlotRandomness``, so a replayed slot releases
identical output and sampling never shifts the noise draws.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar, Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privstream.mechanisms.client import ClassHistogram
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    LedgerEntry,
    Mechanism,
    Release,
    Slot,
    Strategy,
    finite_or_none,
)
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import ClassScope, Guarantee, Model, PureDP, WindowScope
from privstream.mechanisms.ledger import PersonalizedLedger
from privstream.mechanisms.noise import discrete_laplace, laplace_variance, public_scale
from privstream.mechanisms.oracles import OUE
from privstream.mechanisms.tasks import FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.mechanisms.validation import check_fraction, check_population, check_requirement

STATE_VERSION: Final = 3
"""Layout of ``PersonalizedState``. 2: classes join over time (spec §9.5): ``sizes`` holds each
class's registered size, the ledger appends classes (``joined``, ``horizon``) and may start
empty, PBA's ``absorbed`` grows with the classes; ``requirements`` is the last digest seen.
3: releases are integer-valued (exact discrete Laplace noise), so ``r_last`` holds integers."""
SENSITIVITY: Final = 1
"""``Δ``: L1 sensitivity of the histogram under add/remove-one-row neighbours (spec §1.5, A6).
A replace-one-row mode (Δ = 2) would break SM's amplification lemma and is not offered."""

MIN_SLOT_EPSILON: Final = 1e-11
"""Smallest per-slot budget a publication draws noise with (scale ``Δ/ε`` ≤ 10^11, inside the
discrete sampler's public grid); a smaller remainder is not spent (the slot skips)."""


ThresholdMode = Literal["sqrt_err", "laplace_scale"]

# ---------------------------------------------------------------------------------------------
# Building blocks: SM, the error model, OBS and DC (spec §2)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetChoice:
    """OBS's answer: the threshold ``ε_opt = θ`` and its estimated error ``err(θ)`` (Eqs. 1–2)."""

    theta: float
    error: float


def inclusion_probabilities(budgets: ArrayLike, theta: float) -> NDArray[np.float64]:
    """SM_s's sampling probabilities (spec §2.2, S4–S5): ``p = 1`` when ``ε ≥ θ``, else
    ``(e^ε − 1)/(e^θ − 1)``; a budget ``≤ 0`` is never sampled. Computed with ``expm1`` so tiny
    per-slot budgets keep their precision."""
    b = np.asarray(budgets, dtype=np.float64)
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError(f"SM threshold θ must be a positive finite number, got {theta!r}")
    return np.where(b >= theta, 1.0, _expm1_ratio(b, np.float64(theta)))


def _expm1_ratio(
    b: NDArray[np.float64], theta: NDArray[np.float64] | np.float64
) -> NDArray[np.float64]:
    """``(e^b − 1)/(e^θ − 1)`` for ``0 < b ≤ θ`` as ``e^{b−θ}·(1 − e^{−b})/(1 − e^{−θ})``: exact
    for tiny budgets (``expm1``) and free of overflow for huge ones; ``0`` where ``b ≤ 0``."""
    pos = np.maximum(b, np.finfo(np.float64).tiny)
    ratio = np.exp(np.minimum(pos - theta, 0.0)) * np.expm1(-pos) / np.expm1(-theta)
    return np.where(b > 0, np.minimum(ratio, 1.0), 0.0)


def sampling_error(theta: float, budgets: ArrayLike, sizes: ArrayLike) -> float:
    """``err_s(θ)`` of Eq. 1: variance plus squared bias of one all-user count sampled by SM_s
    (spec §2.3). Classes at or above ``θ`` are always sampled and add nothing. Used unchanged
    for a ``d``-bin histogram (A8)."""
    b = np.asarray(budgets, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)
    below = b < theta
    p = inclusion_probabilities(b[below], theta)
    return float(np.sum(n[below] * p * (1 - p)) + np.sum(n[below] * (1 - p)) ** 2)


def laplace_error(theta: float) -> float:
    """``err_dp(θ) = 2Δ²/θ²``: the variance of one ``Lap(Δ/θ)`` draw (Eq. 2)."""
    return laplace_variance(SENSITIVITY / theta)


def obs(budgets: ArrayLike, sizes: ArrayLike | None = None) -> BudgetChoice | None:
    """Optimal Budget Selection (spec §2.4, Alg. 1).

    ``budgets`` are per-user budgets, or per-class budgets with ``sizes`` their multiplicities
    ``n_k``. Equal budgets are merged; the candidates are the distinct budgets ``> 0`` (A9) and
    the winner minimises ``err(θ) = err_s(θ) + err_dp(θ)``, ties going to the smaller budget.
    Returns None when no budget is positive (the caller must then not publish). Cost O(m²) in
    the number ``m`` of distinct budgets (A10). Data-independent: it reads budgets and class
    sizes only, which are public metadata (A2).
    """
    b = np.asarray(budgets, dtype=np.float64).reshape(-1)
    n = np.ones_like(b) if sizes is None else np.asarray(sizes, dtype=np.float64).reshape(-1)
    if b.shape != n.shape or not np.all(np.isfinite(b)) or np.any(n < 0):
        raise ValueError("OBS needs finite budgets and non-negative sizes of one shape")
    return _obs(tuple(b.tolist()), tuple(n.tolist()))


@functools.lru_cache(maxsize=4096)
def _obs(budgets: tuple[float, ...], sizes: tuple[float, ...]) -> BudgetChoice | None:
    """OBS on validated input; memoised because a stream asks the same question every slot
    (PartDC budgets never change, PBA's take a few share counts)."""
    if not budgets:
        return None
    b, n = np.array(budgets), np.array(sizes)
    order = np.argsort(b, kind="stable")
    sorted_b = b[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_b[1:] != sorted_b[:-1])))
    values = sorted_b[starts]
    counts = np.add.reduceat(n[order], starts)
    theta = values[values > 0]
    if theta.size == 0:
        return None
    # P[k, j]: class j's sampling probability when candidate k is the threshold.
    below = values[None, :] < theta[:, None]
    p = np.where(below, _expm1_ratio(values[None, :], theta[:, None]), 1.0)
    weight = np.where(below, counts[None, :], 0.0)
    err_s = np.sum(weight * p * (1 - p), axis=1) + np.sum(weight * (1 - p), axis=1) ** 2
    err = err_s + 2.0 * (SENSITIVITY / theta) ** 2  # err_dp, as laplace_variance
    k = int(np.argmin(err))  # first minimum: the smaller budget wins ties
    return BudgetChoice(float(theta[k]), float(err[k]))


def sm_sample(
    counts: NDArray[np.int64], budgets: ArrayLike, theta: float, rng: np.random.Generator
) -> NDArray[np.int64]:
    """SM_s in class form (spec §2.2): ``Σ_c Binomial(counts[c, j], p_c)`` per bin ``j``.

    Exactly the distribution of ``Q`` over the per-user Bernoulli sample of Alg. S1, at cost
    O(m·d). No re-weighting (A7): the sampled counts are a biased, low estimate of ``c_t``.
    """
    p = inclusion_probabilities(budgets, theta)
    sampled: NDArray[np.int64] = rng.binomial(counts, p[:, None]).sum(axis=0)
    return sampled


def sm(
    counts: NDArray[np.int64],
    budgets: ArrayLike,
    theta: float,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
) -> NDArray[np.float64]:
    """SM = SM_d ∘ SM_s (spec §2.2): ``Q(SM_s(D_t, 𝛆, θ)) + DLap(Δ/θ)^d``. By amplification
    (add/remove) each member of class ``c`` gets ``min(ε_c, θ)``-DP, at most its budget. The
    noise is the exact discrete Laplace on the sampled integer counts (immune to the
    floating-point attacks of §9.6), so the release is an integer vector."""
    sampled = sm_sample(counts, budgets, theta, sample_rng)
    return (sampled + discrete_noise(noise_rng, theta, sampled.shape[0])).astype(np.float64)


def discrete_noise(rng: np.random.Generator, epsilon: float, size: int) -> NDArray[np.int64]:
    """``DLap(Δ/ε)^size`` with the scale rounded up to the public grid (``public_scale``): the
    ε-DP noise of an integer query of L1 sensitivity ``Δ = 1``. ``Δ/ε`` is computed exactly
    (a float division could round the scale down, spending slightly more than ε)."""
    return discrete_laplace(rng, noise_scale(epsilon), size)


def noise_scale(epsilon: float | Fraction) -> Fraction:
    """The public scale ``≥ Δ/ε`` of ``discrete_noise``: a multiple of ``2^−20`` (coarser for
    scales beyond ``2^31``, so the sampler's integers stay exact)."""
    exact = Fraction(SENSITIVITY) / Fraction(epsilon)
    bits = min(20, 51 - math.ceil(exact).bit_length())
    return public_scale(exact, denominator_bits=max(bits, 0))


def noisy_dissimilarity(
    counts: NDArray[np.int64] | NDArray[np.float64],
    r_last: NDArray[np.float64],
    epsilon: float,
    rng: np.random.Generator,
) -> float:
    """``dis = (1/d)·(Σ_j |c[j] − r_l[j]| + DLap(Δ/ε))``: ε-DP (spec §2.5 D5–D6, §3.3 BD4).

    Releases are integer vectors, so the sum of absolute differences is an integer of
    sensitivity ``Δ`` (one row moves one bin by one); exact discrete Laplace noise on it,
    divided by ``d`` afterwards, is the paper's ``Lap(Δ/(d·ε))`` on the mean made immune to
    floating-point attacks. A non-integer ``r_last`` is refused.
    """
    d = int(r_last.shape[0])
    gap = np.abs(np.asarray(counts, dtype=np.float64) - r_last)
    total = float(gap.sum())
    if not np.all(gap == np.rint(gap)) or total >= 2.0**53:
        raise ValueError("the dissimilarity needs integer counts and an integer last release")
    return float(int(total) + int(discrete_noise(rng, epsilon, 1)[0])) / d


def dissimilarity_calculation(
    counts: NDArray[np.int64],
    budgets: NDArray[np.float64],
    sizes: NDArray[np.int64],
    r_last: NDArray[np.float64],
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
) -> tuple[float, float]:
    """DC (spec §2.5, Alg. 3): ``θ1 = OBS(𝛆^{(1)})``, sample with SM_s, compare the raw sampled
    counts with the last non-null release ``r_l`` (zero before the first, A12) and add
    ``Lap(Δ/(d·θ1))``. Returns ``(dis, θ1)``."""
    choice = obs(budgets, sizes)
    if choice is None:
        raise ValueError("DC needs at least one positive PartDC budget")
    sampled = sm_sample(counts, budgets, choice.theta, sample_rng)
    return noisy_dissimilarity(sampled, r_last, choice.theta, noise_rng), choice.theta


# ---------------------------------------------------------------------------------------------
# Configuration and state
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PersonalizedConfig:
    """Configuration of the personalized w-event mechanisms; defaults are the paper's (§6.3).

    Attributes:
        population: size n (≥ 1) of the stream's dense user index; users in it register
            over time (``Requirements.registered``), and only registered users are counted.
        epsilon: the stream's budget ε (> 0, finite): the requirement of every user without a
            preference, and the uniform budget of BD, BA, Uniform and Sample. Default 0.6.
        window: the stream's window w (≥ 1 slots), likewise. Default 120.
        task: the histogram released each slot (``FrequencyTask(d)``, d ≥ 2; default d = 2).
        threshold_mode: publication rule; None is each mechanism's own (``sqrt_err`` for
            PBD/PBA, ``laplace_scale`` for BD/BA, A14). Set only for differential tests (§10.4).
        budget_share: this mechanism's share ``s ∈ (0, 1]`` of every user's budget when several
            mechanisms serve one population (``mechanisms.accountant``): it runs with
            ``(s·ε_i, w_i)`` for every user and ``s·ε`` as the stream default. Default 1.
    """

    population: int
    epsilon: float = 0.6
    window: int = 120
    task: FrequencyTask = field(default_factory=lambda: FrequencyTask(2))
    threshold_mode: ThresholdMode | None = None
    budget_share: float = 1.0

    def shared(self, share: float) -> PersonalizedConfig:
        """This config for a mechanism given the share ``s`` of every user's budget."""
        return dataclasses.replace(self, budget_share=share)

    def __post_init__(self) -> None:
        check_population(self.population)
        check_requirement(self.epsilon, self.window, "the stream's requirement")
        if not isinstance(self.task, FrequencyTask):
            raise ValueError(f"task must be a FrequencyTask (a histogram), got {self.task!r}")
        check_fraction("budget_share", self.budget_share, closed=True)
        if self.threshold_mode not in (None, "sqrt_err", "laplace_scale"):
            raise ValueError(
                f"threshold_mode must be None, 'sqrt_err' or 'laplace_scale', got {self.threshold_mode!r}"
            )


@dataclass
class PersonalizedState:
    """Everything needed to continue a stream after a restart (spec §9.3).

    ``t`` counts processed slots and ``last_slot`` is the stream slot of the last step.
    ``r_last`` is the last non-null release (``0^d`` before the first; every null slot repeats
    it, so it is also ``r_{t−1}``), published at step ``l`` (stream slot ``source_slot``).
    The stream's privacy classes are the ``ledger``'s, in the order they joined (class ``c``
    keeps its index for the stream's life; the ledger's ``joined[c]`` is its first step);
    ``sizes[c]`` is the class's registered size ``n_c`` at the last step, which may only grow
    (spec §9.5), and ``requirements`` the digest of that step's class assignment. ``ledger``
    holds the per-class spend. ``absorbed``: PBA's first unspent-share step ``a_c`` per class
    (§4.3 A'1–A'4; a class joining at step ``t_c`` starts at ``a_c = t_c``), BA's shares
    ``s_l`` used by the last publication (§3.4).
    """

    mechanism: str
    d: int
    version: int = STATE_VERSION
    t: int = 0
    last_slot: int | None = None
    r_last: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    l: int = 0
    source_slot: int | None = None
    requirements: str | None = None
    sizes: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ledger: PersonalizedLedger | None = None
    absorbed: NDArray[np.int64] | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> PersonalizedState:
        # Mechanism.step copies the state every slot: copy the arrays and the ledger directly
        # instead of walking them with the generic deepcopy.
        new = object.__new__(type(self))
        new.__dict__.update(
            {
                k: v.copy() if isinstance(v, np.ndarray) else copy.deepcopy(v, memo)
                for k, v in self.__dict__.items()
            }
        )
        return new


@dataclass(frozen=True)
class PersonalizedRelease(Details):
    """The personalized facts of a release (spec §9.4): the thresholds OBS chose for the
    dissimilarity calculation (``θ_dc``, PWSM's θ1; the baselines' ε_{t,1}) and the publication
    (``θ_pub``; the baselines' ε_{t,2}), the registered users of the classes charged for each, the
    registered population (public, A2), the noisy dissimilarity, the estimated publication
    error and the slot's communication cost (PLBU's reports)."""

    family: ClassVar[str] = "personalized"
    theta_dc: float
    theta_pub: float
    users_dc: int
    users_pub: int
    registered: int
    dissimilarity: float | None
    error: float | None
    bits: int


@dataclass(frozen=True)
class PersonalizedLedgerDetails(Details):
    """Each privacy class's charge at this slot, split into the dissimilarity calculation
    (``ε_dc``) and the publication (``ε_pub``), in the order of the entry's ``classes``."""

    family: ClassVar[str] = "personalized"
    epsilon_dc: tuple[float, ...]
    epsilon_pub: tuple[float, ...]


@dataclass
class _Outcome:
    """What one slot did, gathered for its Release and LedgerEntry."""

    strategy: Strategy
    dc: NDArray[np.float64]
    pub: NDArray[np.float64]
    eps1: float = 0.0
    eps2: float = 0.0
    dis: float = math.nan
    err: float = math.nan
    bits: int = 0


# ---------------------------------------------------------------------------------------------
# Shared skeleton
# ---------------------------------------------------------------------------------------------


class PersonalizedMechanism(Mechanism[PersonalizedConfig, PersonalizedState]):
    """Shared skeleton: the curator's class histogram, the per-class ledger and the events."""

    state_version: ClassVar[int] = STATE_VERSION
    uniform: ClassVar[bool] = False
    """True when one ``(Config.epsilon, Config.window)`` protects everybody (BD, BA, …)."""
    default_threshold: ClassVar[ThresholdMode] = "sqrt_err"

    @property
    def epsilon(self) -> float:
        """The stream budget this mechanism was given: ``budget_share · ε``."""
        return self.config.epsilon * self.config.budget_share

    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("cdp",)
    conformance: ClassVar[Conformance] = Conformance(
        invalid=(("epsilon", 0.0), ("epsilon", -1.0), ("epsilon", float("nan")), ("window", 0),
                 ("window", 2.5), ("population", 0), ("task", None),
                 ("threshold_mode", "sometimes")),
    )  # fmt: skip
    model: ClassVar[Model] = "cdp"

    @property
    def privacy_cost(self) -> Guarantee:
        """w-event ε-DP for the uniform baselines (one ``(ε, w)`` for everybody), and
        (w_i, ε_i)-EPDP for the personalized mechanisms (spec §1.3): pure ε over each user's
        own window, with the stream default for users who stated no requirement."""
        scope = WindowScope(self.config.window) if self.uniform else ClassScope(self.config.window)
        return Guarantee(PureDP(self.epsilon), scope, self.model)

    @property
    def threshold_mode(self) -> ThresholdMode:
        return self.config.threshold_mode or self.default_threshold

    def initial_state(self) -> PersonalizedState:
        d = self.config.task.d
        state = PersonalizedState(mechanism=self.name, d=d, r_last=np.zeros(d))
        state.ledger = self.new_ledger()
        self.start(state)
        return state

    def new_ledger(self) -> PersonalizedLedger:
        """The stream's ledger before anybody registered: no class yet. A uniform baseline
        keeps its own window ``w`` readable (BD looks back over it whatever the classes)."""
        horizon = self.config.window if self.uniform else 1
        return PersonalizedLedger(np.zeros(0, dtype=np.int64), np.zeros(0), horizon=horizon)

    def wants_publication(self, t: int, dis: float, threshold: float) -> bool:
        """The publish/skip rule ``dis > threshold`` (spec §4.1 W6, §3.3 BD7). A test may
        replace it to force decisions (spec §10 item 2); privacy never depends on it."""
        return dis > threshold

    def threshold(self, theta: float, err: float) -> float:
        """``sqrt(err)`` (PWSM, A14) or the Laplace scale ``Δ/θ`` (Kellaris)."""
        return math.sqrt(err) if self.threshold_mode == "sqrt_err" else SENSITIVITY / theta

    # -- the step ------------------------------------------------------------------------------

    def _advance(self, state: PersonalizedState, slot: Slot) -> list[Release | LedgerEntry]:
        cfg, curator = self.config, slot.curator
        self.enter(state, slot, curator.population, cfg.population)
        hist = curator.class_histogram(cfg.epsilon, cfg.window, cfg.budget_share)
        if hist.counts.shape[1] != cfg.task.d:
            raise ValueError(
                f"slot histogram has {hist.counts.shape[1]} bins, expected d={cfg.task.d}"
            )
        hist = self._attach(state, hist)
        if hist.windows.shape[0] == 0:  # nobody registered: nothing to use, nobody to charge
            outcome = _Outcome("approximate", self._nothing(hist), self._nothing(hist))
        else:
            outcome = self.decide(state, slot, hist)
        return [self._release(state, slot, hist, outcome), self._entry(state, slot, hist, outcome)]

    def _attach(self, state: PersonalizedState, hist: ClassHistogram) -> ClassHistogram:
        """Match the slot's classes with the stream's and return the slot's histogram in the
        stream's class order (spec §9.5).

        A user registering in an existing class joins its ledger, which already holds spend
        they never incurred (conservative). A new class ``(w, ε)`` joins the ledger at this
        step with zero history (PBA: ``a_c = t``). A class that shrank or disappeared means a
        user left it or changed requirement, and their spend would not follow them: the step
        is refused before anything is charged or released. (A move hidden by a simultaneous
        registration in the old class cannot be seen without per-user state; the operator
        refuses requirement changes upstream.) A uniform baseline refuses, at the step it
        appears, a class it cannot protect.
        """
        ledger = self.ledger(state)
        m_old = ledger.classes
        order, present = _match(ledger, hist)
        sizes = np.zeros(m_old, dtype=np.int64)
        sizes[present >= 0] = hist.sizes[present[present >= 0]]
        self._refuse_shrinking(state, sizes)
        if m_old < hist.windows.shape[0]:
            taken = np.zeros(hist.windows.shape[0], dtype=bool)
            taken[present] = True
            new = np.flatnonzero(~taken)
            if self.uniform:
                self._check_uniform_protects(hist, new)
            ledger.add_classes(state.t, hist.windows[new], hist.epsilons[new])
            self.join(state, new.shape[0])
            order = np.concatenate([present, new])
        state.requirements = hist.digest
        if order is None:
            state.sizes = hist.sizes
            return hist
        state.sizes = hist.sizes[order]
        return ClassHistogram(
            hist.windows[order],
            hist.epsilons[order],
            state.sizes,
            hist.counts[order],
            hist.digest,
        )

    def _refuse_shrinking(self, state: PersonalizedState, sizes: NDArray[np.int64]) -> None:
        """A class that lost registered users: their spend would not follow them (§9.5)."""
        shrunk = np.flatnonzero(sizes < state.sizes)
        if shrunk.size:
            ledger, c = self.ledger(state), int(shrunk[0])
            raise PrivacyBudgetExceeded(
                f"{self.name}: privacy class {c} (w={int(ledger.windows[c])}, "
                f"ε={ledger.epsilons[c]:g}) shrank from {int(state.sizes[c])} to {int(sizes[c])} "
                f"registered users at step {state.t} ({shrunk.size} classes shrank): a user left "
                "or changed requirement mid-stream and their spend would not follow them "
                "(spec §1.1, §9.5); refusing the slot"
            )

    def _check_uniform_protects(self, hist: ClassHistogram, classes: NDArray[np.intp]) -> None:
        """One ``(ε, w)`` satisfies user ``i`` when ``ε ≤ ε_i`` and ``w ≥ w_i`` (spec §3)."""
        cfg = self.config
        weak = (hist.epsilons[classes] < self.epsilon) | (hist.windows[classes] > cfg.window)
        if weak.any():
            c = int(classes[np.flatnonzero(weak)[0]])
            raise PrivacyBudgetExceeded(
                f"{self.name} with (ε={self.epsilon:g}, w={cfg.window}) cannot protect the "
                f"{int(hist.sizes[c])} users requiring (ε={hist.epsilons[c]:g}, "
                f"w={int(hist.windows[c])}); a uniform baseline needs ε ≤ min ε_i and w ≥ max w_i"
            )

    def start(self, state: PersonalizedState) -> None:
        """Mechanism-specific state before the first slot."""

    def join(self, state: PersonalizedState, added: int) -> None:
        """Mechanism-specific state of ``added`` classes joining at step ``state.t`` (they are
        the ledger's last ``added`` classes)."""

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        """Run the mechanism's pseudocode for step ``state.t``; charge, publish."""
        raise NotImplementedError

    # -- helpers -------------------------------------------------------------------------------

    def ledger(self, state: PersonalizedState) -> PersonalizedLedger:
        assert state.ledger is not None
        return state.ledger

    def everyone(self, hist: ClassHistogram, eps: float) -> NDArray[np.float64]:
        """The same budget for every class (the uniform baselines)."""
        return np.full(hist.windows.shape[0], eps)

    def publish(self, state: PersonalizedState, slot: Slot, release: NDArray[np.float64]) -> None:
        state.r_last = np.asarray(release, dtype=np.float64)
        state.l = state.t
        state.source_slot = slot.index

    def laplace_release(
        self, state: PersonalizedState, slot: Slot, hist: ClassHistogram, eps: float
    ) -> None:
        """``c_t + DLap(Δ/ε)^d`` of the whole population (the Kellaris baselines): the exact
        discrete Laplace mechanism on the integer histogram (ε-DP, immune to floating-point
        attacks; spec §2.1, §9.6)."""
        noise = discrete_noise(slot.randomness("pub/noise"), eps, self.config.task.d)
        self.publish(state, slot, (hist.total + noise).astype(np.float64))

    def _release(
        self, state: PersonalizedState, slot: Slot, hist: ClassHistogram, o: _Outcome
    ) -> Release:
        details = PersonalizedRelease(
            theta_dc=o.eps1,
            theta_pub=o.eps2,
            users_dc=int(hist.sizes[o.dc > 0].sum()),
            users_pub=int(hist.sizes[o.pub > 0].sum()),
            registered=int(hist.sizes.sum()),
            dissimilarity=finite_or_none(o.dis),
            error=finite_or_none(o.err),
            bits=o.bits,
        )
        return self.release(slot, o.strategy, state.r_last, state.source_slot, details)

    def _entry(
        self, state: PersonalizedState, slot: Slot, hist: ClassHistogram, o: _Outcome
    ) -> LedgerEntry:
        """Every class's spend (the slot's ``ε_dc + ε_pub`` and its window sum, invariant C1)."""
        spent = self.ledger(state).window_spent(state.t)
        rows = zip(hist.windows.tolist(), hist.epsilons.tolist(), hist.sizes.tolist(),
                   (o.dc + o.pub).tolist(), spent.tolist(), strict=True)  # fmt: skip
        details = PersonalizedLedgerDetails(
            epsilon_dc=tuple(o.dc.tolist()), epsilon_pub=tuple(o.pub.tolist())
        )
        return self.ledger_entry(slot, tuple(ClassSpend(*row) for row in rows), details)

    def _nothing(self, hist: ClassHistogram) -> NDArray[np.float64]:
        return np.zeros(hist.windows.shape[0])


def _match(
    ledger: PersonalizedLedger, hist: ClassHistogram
) -> tuple[NDArray[np.intp] | None, NDArray[np.intp]]:
    """Where each of the ledger's classes is in the slot's histogram (−1: absent), and the
    reordering to apply (None in the usual case: the same classes in the same order)."""
    if hist.windows.shape == ledger.windows.shape and (
        np.array_equal(hist.windows, ledger.windows)
        and np.array_equal(hist.epsilons, ledger.epsilons)
    ):
        return None, np.arange(ledger.classes)
    keys = zip(hist.windows.tolist(), hist.epsilons.tolist(), strict=True)
    index = {key: k for k, key in enumerate(keys)}
    old = zip(ledger.windows.tolist(), ledger.epsilons.tolist(), strict=True)
    present = np.array([index.get(key, -1) for key in old], dtype=np.intp)
    return present, present


# ---------------------------------------------------------------------------------------------
# Baselines (spec §3)
# ---------------------------------------------------------------------------------------------


class Uniform(PersonalizedMechanism):
    """Uniform (Kellaris et al., spec §3.1): ``r_t = c_t + Lap(w·Δ/ε)^d`` every slot.

    w-event ε-DP for the stream's ``(ε, w)``: ``ε/w`` per slot sums to ε over any w slots;
    refuses users requiring ``ε_i < ε`` or ``w_i > w``.
    """

    name = "Uniform"
    uniform = True

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        eps = self.epsilon / self.config.window
        spend = self.everyone(hist, eps)
        self.ledger(state).charge(state.t, spend, "pub")
        self.laplace_release(state, slot, hist, eps)
        return _Outcome("publish", self._nothing(hist), spend, eps2=eps, err=laplace_error(eps))


class Sample(PersonalizedMechanism):
    """Sample (Kellaris et al., spec §3.2): the whole ε at slots ``t ≡ 1 (mod w)``; the slots in
    between approximate (repeat the last publication). w-event ε-DP: each window holds exactly
    one publication."""

    name = "Sample"
    uniform = True

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        cfg = self.config
        if (state.t - 1) % cfg.window != 0:
            return _Outcome("approximate", self._nothing(hist), self._nothing(hist))
        eps = self.epsilon
        spend = self.everyone(hist, eps)
        self.ledger(state).charge(state.t, spend, "pub")
        self.laplace_release(state, slot, hist, eps)
        return _Outcome("publish", self._nothing(hist), spend, eps2=eps, err=laplace_error(eps))


class BD(PersonalizedMechanism):
    """Budget Distribution (Kellaris et al., spec §3.3).

    w-event ε-DP for the stream's ``(ε, w)``: ``ε/(2w)`` per slot for the dissimilarity and, at
    a publication, half of the publication budget ``ε/2`` left in the window (so the window's
    publications stay below ``ε/2``). Publishes when ``dis > Δ/ε2``.
    """

    name = "BD"
    uniform = True
    default_threshold = "laplace_scale"

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        cfg, t, ledger = self.config, state.t, self.ledger(state)
        eps1 = self.epsilon / (2 * cfg.window)
        dc = self.everyone(hist, eps1)
        ledger.charge(t, dc, "dc")
        dis = noisy_dissimilarity(hist.total, state.r_last, eps1, slot.randomness("dc/noise"))
        # Every class is charged the stream's budgets from its join on, so the longest-standing
        # class carries the stream's publication history (the ledger keeps w slots readable).
        remaining = self.epsilon / 2 - ledger.spent(t - cfg.window + 1, t - 1, "pub").max()
        eps2 = max(remaining, 0.0) / 2
        out = _Outcome("approximate", dc, self._nothing(hist), eps1=eps1, dis=dis)
        if eps2 < MIN_SLOT_EPSILON:
            return out
        out.err = laplace_error(eps2)
        if self.wants_publication(t, dis, self.threshold(eps2, out.err)):
            out.pub = self.everyone(hist, eps2)
            ledger.charge(t, out.pub, "pub")
            self.laplace_release(state, slot, hist, eps2)
            out.strategy, out.eps2 = "publish", eps2
        return out


class BA(PersonalizedMechanism):
    """Budget Absorption (Kellaris et al., spec §3.4).

    w-event ε-DP for the stream's ``(ε, w)``: ``ε/(2w)`` per slot for the dissimilarity; a
    publication absorbs the unused shares ``ε/(2w)`` of the skipped slots before it (at most
    ``w`` shares) and nullifies as many slots after it, so a window's publications spend at
    most ``ε/2``. The shares used are kept as an integer ``s_l`` (virtual ``l = 0, s_l = 1``).
    """

    name = "BA"
    uniform = True
    default_threshold = "laplace_scale"

    def start(self, state: PersonalizedState) -> None:
        state.absorbed = np.ones(1, dtype=np.int64)

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        cfg, t, ledger = self.config, state.t, self.ledger(state)
        assert state.absorbed is not None
        eps1 = self.epsilon / (2 * cfg.window)
        dc = self.everyone(hist, eps1)
        ledger.charge(t, dc, "dc")  # charged at nullified slots too (§4.4 item 4)
        dis = noisy_dissimilarity(hist.total, state.r_last, eps1, slot.randomness("dc/noise"))
        out = _Outcome("nullified", dc, self._nothing(hist), eps1=eps1, dis=dis)
        t_n = int(state.absorbed[0]) - 1
        if t - state.l <= t_n:
            return out
        shares = min(t - state.l - t_n, cfg.window)
        eps2 = shares * (self.epsilon / (2 * cfg.window))
        out.strategy, out.err = "approximate", laplace_error(eps2)
        if self.wants_publication(t, dis, self.threshold(eps2, out.err)):
            out.pub = self.everyone(hist, eps2)
            ledger.charge(t, out.pub, "pub")
            self.laplace_release(state, slot, hist, eps2)
            state.absorbed[0] = shares
            out.strategy, out.eps2 = "publish", eps2
        return out


class PU(PersonalizedMechanism):
    """Personalized Uniform (spec §3.6): every slot, SM with each class's ``ε_c/w_c``.

    (𝐰, 𝛆)-EPDP: a member of class ``c`` is charged ``ε_c/w_c`` per slot, ``ε_c`` per window.
    """

    name = "PU"

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        spend = hist.epsilons / hist.windows
        choice = obs(spend, hist.sizes)
        assert choice is not None  # every class budget is positive
        self.ledger(state).charge(state.t, spend, "pub")
        r = sm(
            hist.counts,
            spend,
            choice.theta,
            slot.randomness("pub/sample"),
            slot.randomness("pub/noise"),
        )
        self.publish(state, slot, r)
        return _Outcome("publish", self._nothing(hist), spend, eps2=choice.theta, err=choice.error)


class PLBU(PersonalizedMechanism):
    """Personalized LDP Budget Uniform (spec §3.5, our definition A13).

    Every slot every user reports with ``ε_i/w_i``-LDP OUE (``p = 1/2``, ``q = 1/(e^{ε_i/w_i}+1)``)
    and the server sums the unbiased per-class count estimates ``(y − m_c·q_c)/(1/2 − q_c)``.
    w-event ε_i-LDP for every user ``i``: ``ε_i/w_i`` per slot, ``ε_i`` per window. The reports
    are simulated from the class histograms with OUE's exact aggregate sampler (binomials per
    class and bin), which has the distribution of the per-user reports.
    """

    name = "PLBU"
    model = "ldp"
    """Each report is ε_i/w_i-LDP; its clients are simulated from the curator's class histograms
    (an exact aggregate sampler), so it runs in the ``cdp`` trust mode."""

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        d = self.config.task.d
        spend = hist.epsilons / hist.windows
        self.ledger(state).charge(state.t, spend, "pub")
        oue, rng = OUE(d), slot.randomness("pub/client")
        estimate = np.zeros(d)
        # Every registered user is asked and answers (one holding no current value sends OUE's
        # encoding of no item), so the report counts are the public class sizes, never the
        # true number of users who sent data.
        for c in range(hist.windows.shape[0]):  # one aggregate draw per class, not per user
            eps, m = float(spend[c]), int(hist.sizes[c])
            support = oue.sample_support(hist.counts[c], eps, rng, reports=m)
            estimate += oue.estimate(support, eps, m) * m
        self.publish(state, slot, estimate)
        bits = int(hist.sizes.sum()) * oue.report_bits(float(spend[0]))
        return _Outcome("publish", self._nothing(hist), spend, eps2=float(spend.max()), bits=bits)


# ---------------------------------------------------------------------------------------------
# PWSM and its instances PBD, PBA (spec §4)
# ---------------------------------------------------------------------------------------------


class PWSM(PersonalizedMechanism):
    """The Personalized Window Size Mechanism template (spec §4.1, Alg. 2).

    Each slot: PartDC budgets ``ε_c/(2w_c)`` feed DC (Alg. 3); unless the slot is nullified,
    the instance's PartNOP budgets ``𝛆^{(2)}`` go through OBS and the slot publishes
    ``SM(D_t, 𝛆^{(2)}, θ2)`` when ``dis > sqrt(err(θ2))``, else repeats ``r_{t−1}``. The ledger is
    charged PartDC every slot and PartNOP only at publications, before anything is drawn.
    """

    def publication_budgets(
        self, state: PersonalizedState, hist: ClassHistogram
    ) -> NDArray[np.float64]:
        """``𝛆_t^{(2)}`` per class for step ``state.t`` (a slot that is not nullified)."""
        raise NotImplementedError

    def nullified(self, state: PersonalizedState) -> bool:
        """Whether step ``state.t`` is a forced null (borrowed by an earlier publication)."""
        return False

    def published(
        self, state: PersonalizedState, hist: ClassHistogram, pub: NDArray[np.float64]
    ) -> None:
        """Bookkeeping after a publication at step ``state.t`` with budgets ``pub``."""

    def decide(self, state: PersonalizedState, slot: Slot, hist: ClassHistogram) -> _Outcome:
        t, ledger = state.t, self.ledger(state)
        dc = hist.epsilons / (2 * hist.windows)
        ledger.charge(t, dc, "dc")
        dis, theta1 = dissimilarity_calculation(
            hist.counts,
            dc,
            hist.sizes,
            state.r_last,
            slot.randomness("dc/sample"),
            slot.randomness("dc/noise"),
        )
        out = _Outcome("nullified", dc, self._nothing(hist), eps1=theta1, dis=dis)
        if self.nullified(state):
            return out
        pub = self.publication_budgets(state, hist)
        pub = np.where(pub < MIN_SLOT_EPSILON, 0.0, pub)  # a vanishing remainder is not spent
        out.strategy = "approximate"
        choice = obs(pub, hist.sizes)
        if choice is None:  # nothing left to publish with (float underflow of ε_rm)
            return out
        out.err = choice.error
        if self.wants_publication(t, dis, self.threshold(choice.theta, choice.error)):
            ledger.charge(t, pub, "pub")
            r = sm(
                hist.counts,
                pub,
                choice.theta,
                slot.randomness("pub/sample"),
                slot.randomness("pub/noise"),
            )
            self.publish(state, slot, r)
            self.published(state, hist, pub)
            out.strategy, out.pub, out.eps2 = "publish", pub, choice.theta
        return out


class PBD(PWSM):
    """Personalized Budget Distribution (spec §4.2, Alg. 4).

    (𝐰, 𝛆)-EPDP (Thm 4.6): PartDC charges ``ε_c/(2w_c)`` every slot (exactly ``ε_c/2`` per
    window); a publication spends half of what remains of the class's publication half-budget
    over its own window, ``ε^{(2)}_{c,t} = (ε_c/2 − Σ_{k=t−w_c+1}^{t−1} E2_c[k])/2`` (look-back of
    ``w_c − 1`` slots, A15), so PartNOP stays below ``ε_c/2`` per window. Allocations at skipped
    slots are discarded, not charged.
    """

    name = "PBD"

    def publication_budgets(
        self, state: PersonalizedState, hist: ClassHistogram
    ) -> NDArray[np.float64]:
        remaining = hist.epsilons / 2 - self.ledger(state).lookback(state.t, "pub")
        out: NDArray[np.float64] = np.maximum(remaining, 0.0) / 2
        return out


class PBA(PWSM):
    """Personalized Budget Absorption (spec §4.3, Alg. 5, integer form A'1–A'4).

    (𝐰, 𝛆)-EPDP (Thm 4.6): PartDC charges ``ε_c/(2w_c)`` every slot, nullified ones included;
    each class earns one share ``ε_c/(2w_c)`` of publication budget per slot. ``a_c`` is the
    first slot whose share is unspent (virtual start ``a_c = 1``, A16; a class joining at step
    ``t_c`` starts at ``a_c = t_c``, spec §9.5). A slot is nullified while ``t < max_c a_c``
    (the max bound); otherwise a publication uses ``min(t − a_c + 1, w_c)`` shares and sets
    ``a_c ← t + shares_c``, borrowing the next slots.
    """

    name = "PBA"

    def start(self, state: PersonalizedState) -> None:
        state.absorbed = np.zeros(0, dtype=np.int64)

    def join(self, state: PersonalizedState, added: int) -> None:
        assert state.absorbed is not None
        joined = np.full(added, state.t, dtype=np.int64)  # a_c = t_c: no share spent yet
        state.absorbed = np.concatenate([state.absorbed, joined])

    def shares(self, state: PersonalizedState, hist: ClassHistogram) -> NDArray[np.int64]:
        assert state.absorbed is not None
        out: NDArray[np.int64] = np.minimum(state.t - state.absorbed + 1, hist.windows)
        return out

    def nullified(self, state: PersonalizedState) -> bool:
        assert state.absorbed is not None
        return state.t < int(state.absorbed.max())

    def publication_budgets(
        self, state: PersonalizedState, hist: ClassHistogram
    ) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.shares(state, hist) * (hist.epsilons / (2 * hist.windows))
        return out

    def published(
        self, state: PersonalizedState, hist: ClassHistogram, pub: NDArray[np.float64]
    ) -> None:
        state.absorbed = state.t + self.shares(state, hist)


MECHANISMS: Final[dict[str, type[PersonalizedMechanism]]] = {
    m.name: m for m in (BD, BA, Uniform, Sample, PLBU, PU, PBD, PBA)
}


# ---------------------------------------------------------------------------------------------
# The evaluation's population (spec §6.3)
# ---------------------------------------------------------------------------------------------

EPSILON_GRID: Final = (0.2, 0.4, 0.6, 0.8, 1.0)  # Table 3; default 0.6
WINDOW_GRID: Final = (40, 80, 120, 160, 200)  # Table 3; default 120
USER_TYPES: Final = 10  # A26


def requirement_arrays(
    users: int,
    epsilon: float,
    window: int,
    seed: int,
    *,
    epsilons: Sequence[float] = EPSILON_GRID,
    windows: Sequence[int] = WINDOW_GRID,
    types: int = USER_TYPES,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Every user's ``(ε_i, w_i)`` for a static setting ``(ε, w)`` (spec §6.3, A26).

    Users are split into ``types`` contiguous blocks of ``ceil(n/types)``; each type draws its
    budget uniformly from the grid values ``≥ ε`` and its window from the grid values ``≤ w``,
    so BD/BA with ``(ε, w)`` protect every user at least as strongly as they asked.
    """
    budgets = [e for e in epsilons if e >= epsilon]
    wins = [w for w in windows if w <= window]
    if not budgets or not wins:
        raise ValueError(
            f"the synthetic population draws each user's ε_i from {list(epsilons)} at or above "
            f"ε and w_i from {list(windows)} at or below w: ε={epsilon}, w={window} fits none; "
            f"choose --window of at least {min(windows)} and --epsilon of at most "
            f"{max(epsilons)} (or run a file with --registrations)"
        )
    rng = np.random.default_rng([seed, 0x52455153])
    type_eps = rng.choice(np.array(budgets, dtype=np.float64), size=types)
    type_win = rng.choice(np.array(wins, dtype=np.int64), size=types)
    block = math.ceil(users / types)
    kind = np.arange(users) // block
    return type_eps[kind], type_win[kind]
