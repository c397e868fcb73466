"""Privacy invariants of the LDP-IDS mechanisms (spec ldp-ids §1.6 and §7 items 3–6).

The mechanisms are driven slot by slot through a ``RecordingPort`` that wraps the simulated
clients and records every ``collect`` (which users, which ε, which purpose). The per-user
privacy accounting is recomputed from those records, independently of the ledgers, and
compared with Thm 4.1 (budget division) and Thm 5.2 (population division). Publish/approximate
decisions are scripted by replacing ``dissimilarity`` with ``±inf`` from a drawn sequence.
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from privstream.families.registry import LDP_IDS
from privstream.mechanisms.client import ABSENT, Aggregate, SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.ldp_ids import (
    AbsorptionInit,
    LdpIdsConfig,
    LdpIdsLedger,
    LdpIdsMechanism,
    LdpIdsRelease,
    LdpIdsState,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

TOL = 1e-12  # spec §1.6 invariant 1
TASK = FrequencyTask(2)
BETAS = [0.3, 0.5, 0.7]
EXAMPLES = 100


@dataclass
class Call:
    purpose: str
    users: NDArray[np.int64]
    eps: float


class RecordingPort:
    """A ClientPort that records every request before passing it to the simulated clients."""

    def __init__(self, inner: SimulatedClientPort) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    @property
    def population(self) -> int:
        return self.inner.population

    def eligible(self) -> NDArray[np.bool_]:
        return self.inner.eligible()

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        ids = (
            np.flatnonzero(self.inner.eligible())
            if users is None
            else np.array(users, dtype=np.int64)
        )
        self.calls.append(Call(purpose, ids, eps))
        return self.inner.collect(users, eps, purpose)


@dataclass
class StepRecord:
    t: int
    release: Release
    entry: LedgerEntry
    calls: list[Call] = field(default_factory=list)

    @property
    def rel(self) -> LdpIdsRelease:
        """The release's LDP-IDS details."""
        assert isinstance(self.release.details, LdpIdsRelease)
        return self.release.details

    @property
    def led(self) -> LdpIdsLedger:
        """The ledger entry's LDP-IDS details."""
        assert isinstance(self.entry.details, LdpIdsLedger)
        return self.entry.details

    def eps_spent(self, user: int | None = None) -> float:
        return sum(c.eps for c in self.calls if user is None or user in c.users)

    def users(self, purpose: str) -> NDArray[np.int64]:
        found = [c.users for c in self.calls if c.purpose == purpose]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def script(decisions: Iterable[bool]) -> Callable[[LdpIdsState, Aggregate, float], float]:
    """A ``dissimilarity`` that publishes (+inf) or approximates (−inf) as scripted."""
    it = iter(decisions)

    def dissimilarity(state: LdpIdsState, agg: Aggregate, eps: float) -> float:
        return math.inf if next(it) else -math.inf

    return dissimilarity


def all_present(n: int) -> Callable[[int], NDArray[np.int64]]:
    values = np.arange(n, dtype=np.int64) % 2
    return lambda t: values


def drive(
    mech: LdpIdsMechanism,
    T: int,
    values: Callable[[int], NDArray[np.int64]],
    seed: int = 1,
    state: LdpIdsState | None = None,
) -> list[StepRecord]:
    state = mech.initial_state() if state is None else state
    records = []
    for t in range(1, T + 1):
        r = SlotRandomness(seed, "s", t)
        port = RecordingPort(SimulatedClientPort(values(t), mech.config.task, r))
        state, events = mech.step(state, Slot("s", t, port, r))
        release, entry, *_ = events
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        assert (release.slot, entry.slot) == (t, t)
        records.append(StepRecord(t, release, entry, port.calls))
    return records


def build(name: str, cfg: LdpIdsConfig) -> LdpIdsMechanism:
    mech = LDP_IDS.build(name, cfg)
    assert isinstance(mech, LdpIdsMechanism)
    return mech


def scripted(name: str, cfg: LdpIdsConfig, decisions: list[bool]) -> LdpIdsMechanism:
    mech = build(name, cfg)
    mech.dissimilarity = script(decisions)  # type: ignore[method-assign,assignment]
    return mech


# -- independent accounting ---------------------------------------------------------------------


def check_common(records: list[StepRecord], cfg: LdpIdsConfig) -> None:
    for rec in records:
        rel, ent = rec.rel, rec.led
        assert (rel.epsilon_m1, rel.epsilon_m2, rel.users_m1, rel.users_m2) == (
            ent.epsilon_m1,
            ent.epsilon_m2,
            ent.users_m1,
            ent.users_m2,
        )
        assert rel.users_m1 == rec.users("m1").shape[0]
        assert rel.users_m2 == rec.users("m2").shape[0]
        assert (rec.release.strategy == "publish") == any(c.purpose == "m2" for c in rec.calls)
        assert len(rec.release.estimate) == cfg.task.d
        assert (
            rec.release.guarantee
            == rec.entry.guarantee
            == LDP_IDS.build(rec.release.mechanism, cfg).privacy_cost
        )
        (one,) = rec.entry.classes  # every user shares (w, ε): one class of all n users
        assert (one.scope, one.budget, one.users) == (cfg.window, cfg.epsilon, cfg.population)


def check_budget_division(records: list[StepRecord], cfg: LdpIdsConfig) -> list[float]:
    """Thm 4.1: every user's budget over any w consecutive slots is at most ε."""
    check_common(records, cfg)
    n, w = cfg.population, cfg.window
    spend: list[float] = []
    for rec in records:
        for call in rec.calls:  # budget division: every eligible user reports, none is singled out
            assert np.array_equal(call.users, np.arange(n))
            assert call.eps > 0
        spend.append(rec.eps_spent())
        assert rec.rel.epsilon_m1 + rec.rel.epsilon_m2 == pytest.approx(spend[-1], abs=1e-15)
        assert rec.entry.classes[0].charged == pytest.approx(spend[-1], abs=1e-15)
        assert rec.rel.epsilon_m1 == sum(c.eps for c in rec.calls if c.purpose == "m1")
        assert rec.rel.epsilon_m2 == sum(c.eps for c in rec.calls if c.purpose == "m2")
    for i, rec in enumerate(records):
        window = sum(spend[max(0, i - w + 1) : i + 1])
        assert window <= cfg.epsilon + TOL, (rec.t, window)
        assert rec.entry.spent == pytest.approx(window, abs=TOL)
        assert rec.entry.division == "budget"
    return spend


def check_population_division(records: list[StepRecord], cfg: LdpIdsConfig) -> dict[int, list[int]]:
    """Thm 5.2: every report uses exactly ε and a user's reports are at least w slots apart."""
    check_common(records, cfg)
    n, w = cfg.population, cfg.window
    reports: dict[int, list[int]] = defaultdict(list)
    for rec in records:
        in_slot = (
            np.concatenate([c.users for c in rec.calls])
            if rec.calls
            else np.zeros(0, dtype=np.int64)
        )
        assert np.unique(in_slot).shape == in_slot.shape, "a user reported twice in one slot"
        for call in rec.calls:
            assert call.eps == cfg.epsilon
        for u in in_slot.tolist():
            reports[u].append(rec.t)
        window_users = sum(
            r.users("m1").shape[0] + r.users("m2").shape[0]
            for r in records
            if rec.t - w < r.t <= rec.t
        )
        assert rec.led.window_users == window_users
        # a reporting user spends ε at most once per window: the class's charge and spend
        assert rec.entry.classes[0].charged == (cfg.epsilon if in_slot.size else 0.0)
        assert rec.entry.spent == (cfg.epsilon if window_users else 0.0)
        free_next = sum(
            1 for u in range(n) if not reports.get(u) or rec.t + 1 - reports[u][-1] >= w
        )
        assert rec.led.available_users == free_next
        assert rec.entry.division == "population"
    for u, slots in reports.items():
        assert all(b - a >= w for a, b in itertools.pairwise(slots)), (u, slots)
    return reports


def unit_windows_ok(units: list[int], w: int) -> bool:
    return all(sum(units[max(0, i - w + 1) : i + 1]) <= w for i in range(len(units)))


# -- hypothesis strategies ------------------------------------------------------------------------


def min_population(name: str, beta: float, w: int) -> int:
    if name not in ("LPA", "LPD"):
        return 50
    # LPD and LPA refuse a dissimilarity group ⌊βn/w⌋ = 0 (they would never publish), and LPA's
    # unit m_u = ⌊(1−β)n/w⌋ must be >= 1 (see test_lpa_small_population_capacity)
    n = 50
    while math.floor(beta * n / w) < 1 or (name == "LPA" and math.floor((1 - beta) * n / w) < 1):
        n += 1
    return n


@st.composite
def adaptive_cases(draw: st.DrawFn, names: list[str]) -> tuple[str, LdpIdsConfig, list[bool]]:
    name = draw(st.sampled_from(names))
    eps = draw(st.floats(0.05, 8.0))
    w = draw(st.integers(1, 30))
    beta = draw(st.sampled_from(BETAS))
    n = draw(st.integers(min_population(name, beta, w), 400))
    T = draw(st.integers(1, 60))
    mode = draw(st.sampled_from(["random", "all", "none", "bursts"]))
    if mode == "random":
        decisions = draw(st.lists(st.booleans(), min_size=T, max_size=T))
    elif mode == "bursts":
        period = draw(st.integers(2, 12))
        decisions = [(t // period) % 2 == 0 for t in range(T)]
    else:
        decisions = [mode == "all"] * T
    init: AbsorptionInit = draw(st.sampled_from(["literal", "tA_eq_t"]))
    cfg = LdpIdsConfig(
        epsilon=eps, window=w, population=n, task=TASK, beta=beta, absorption_init=init
    )
    return name, cfg, decisions


# -- §7 item 4: privacy invariants with random decisions -----------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=adaptive_cases(["LBD"]))
def test_lbd_invariants(case: tuple[str, LdpIdsConfig, list[bool]]) -> None:
    name, cfg, decisions = case
    records = drive(scripted(name, cfg, decisions), len(decisions), all_present(cfg.population))
    spend = check_budget_division(records, cfg)
    eps, w, beta = cfg.epsilon, cfg.window, cfg.beta
    eps2: list[float] = []
    for rec, decision in zip(records, decisions, strict=True):
        rel = rec.rel
        assert rel.epsilon_m1 == beta * eps / w and rel.users_m1 == cfg.population
        eps_rm = (1 - beta) * eps - sum(eps2[max(0, rec.t - w) : rec.t - 1])
        assert rec.release.strategy == ("publish" if decision else "approximate")
        # the ledger sums a ring, we sum a list: equal up to rounding of a w-term sum of <= ε
        abs_tol = w * 2**-52 * eps
        assert rec.led.remaining == pytest.approx(eps_rm, rel=1e-9, abs=abs_tol)
        if decision:
            assert rel.epsilon_m2 == pytest.approx(eps_rm / 2, rel=1e-9, abs=abs_tol)
            assert rec.release.source_slot == rec.t and rel.users_m2 == cfg.population
        else:
            assert rel.epsilon_m2 == 0.0 and rel.users_m2 == 0
        eps2.append(rel.epsilon_m2)
        assert spend[rec.t - 1] == pytest.approx(rel.epsilon_m1 + rel.epsilon_m2, abs=1e-15)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=adaptive_cases(["LBA"]))
def test_lba_invariants_and_units(case: tuple[str, LdpIdsConfig, list[bool]]) -> None:
    name, cfg, decisions = case
    records = drive(scripted(name, cfg, decisions), len(decisions), all_present(cfg.population))
    check_budget_division(records, cfg)
    eps_u = (1 - cfg.beta) * cfg.epsilon / cfg.window
    units = []
    for rec in records:
        assert rec.rel.epsilon_m1 == cfg.beta * cfg.epsilon / cfg.window  # M1 at every slot (A7)
        k = rec.rel.epsilon_m2 / eps_u
        assert k == pytest.approx(round(k), abs=1e-9)
        units.append(round(k))
    check_absorption(records, units, decisions, cfg)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=adaptive_cases(["LPD"]))
def test_lpd_invariants(case: tuple[str, LdpIdsConfig, list[bool]]) -> None:
    name, cfg, decisions = case
    n, w, beta = cfg.population, cfg.window, cfg.beta
    records = drive(scripted(name, cfg, decisions), len(decisions), all_present(n))
    check_population_division(records, cfg)
    used2: list[int] = []
    for rec, decision in zip(records, decisions, strict=True):
        rel, strategy = rec.rel, rec.release.strategy
        assert rel.users_m1 == math.floor(beta * n / w)
        n_rm = math.floor((1 - beta) * n) - sum(used2[max(0, rec.t - w) : rec.t - 1])
        n_pp = n_rm // 2
        assert rec.led.remaining == n_rm
        if decision and n_pp >= cfg.u_min:
            assert strategy == "publish" and rel.users_m2 == n_pp and rel.epsilon_m2 == cfg.epsilon
        else:
            assert strategy == "approximate" and rel.users_m2 == 0 and rel.epsilon_m2 == 0.0
        used2.append(rel.users_m2)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=adaptive_cases(["LPA"]))
def test_lpa_invariants_and_units(case: tuple[str, LdpIdsConfig, list[bool]]) -> None:
    name, cfg, decisions = case
    n, w, beta = cfg.population, cfg.window, cfg.beta
    records = drive(scripted(name, cfg, decisions), len(decisions), all_present(n))
    check_population_division(records, cfg)
    m_u = math.floor((1 - beta) * n / w)
    assert m_u >= 1
    units = []
    for rec in records:
        assert rec.rel.users_m1 == math.floor(beta * n / w)  # M1 at every slot
        assert rec.rel.users_m2 % m_u == 0
        units.append(rec.rel.users_m2 // m_u)
    check_absorption(records, units, decisions, cfg)


def check_absorption(
    records: list[StepRecord], units: list[int], decisions: list[bool], cfg: LdpIdsConfig
) -> None:
    """§3.5/§3.7 absorption against an independent re-implementation, and §7 item 5."""
    w = cfg.window
    assert unit_windows_ok(units, w), units  # units in any w consecutive slots sum to <= w
    l, k_l = 0, (0 if cfg.absorption_init == "literal" else 1)  # last publication, its units
    first = True
    for rec, k, decision in zip(records, units, decisions, strict=True):
        t, strategy = rec.t, rec.release.strategy
        t_n = k_l - 1
        if t - l <= t_n:
            assert strategy == "nullified" and k == 0
            continue
        available = min(t - (l + t_n), w)
        if decision:
            assert strategy == "publish" and k == available
            if first:  # literal init: min(t+1, w) units; tA_eq_t: min(t, w)
                assert k == min(t + 1 if cfg.absorption_init == "literal" else t, w)
                first = False
            l, k_l = t, k
        else:
            assert strategy == "approximate" and k == 0
    # After a publication of k units come exactly k − 1 nullified slots.
    strategies = [r.release.strategy for r in records]
    for i, k in enumerate(units):
        if k:
            following = strategies[i + 1 : i + k]
            assert following == ["nullified"] * len(following)
            if i + k < len(strategies):
                assert strategies[i + k] != "nullified"


# -- §7 item 4 for the baselines --------------------------------------------------------------------


@st.composite
def baseline_cases(draw: st.DrawFn) -> tuple[str, LdpIdsConfig, int]:
    name = draw(st.sampled_from(["LBU", "LSP", "LPU"]))
    eps = draw(st.floats(0.05, 8.0))
    w = draw(st.integers(1, 30))
    n = draw(st.integers(50, 400))
    T = draw(st.integers(1, 60))
    return name, LdpIdsConfig(epsilon=eps, window=w, population=n, task=TASK), T


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=baseline_cases())
def test_baseline_invariants(case: tuple[str, LdpIdsConfig, int]) -> None:
    name, cfg, T = case
    n, w, eps = cfg.population, cfg.window, cfg.epsilon
    records = drive(build(name, cfg), T, all_present(n))
    if name == "LBU":
        check_budget_division(records, cfg)
        for rec in records:
            assert rec.release.strategy == "publish"
            assert (rec.rel.epsilon_m1, rec.rel.epsilon_m2) == (0.0, eps / w)
        return
    reports = check_population_division(records, cfg)
    if name == "LSP":
        for rec in records:
            sampling = (rec.t - 1) % w == 0
            assert rec.release.strategy == ("publish" if sampling else "approximate")
            assert rec.rel.users_m2 == (n if sampling else 0)
        assert all(slots == list(range(1, T + 1, w)) for slots in reports.values())
    else:  # LPU: w groups whose sizes differ by at most one, each reporting every w slots
        for rec in records:
            assert rec.release.strategy == "publish"
            assert rec.rel.users_m2 in (n // w, -(-n // w))
        for start in range(0, T - w + 1):
            seen = np.concatenate([records[i].users("m2") for i in range(start, start + w)])
            assert np.array_equal(np.sort(seen), np.arange(n))
        for slots in reports.values():
            assert all(b - a == w for a, b in itertools.pairwise(slots))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    case=adaptive_cases(["LBD", "LBA", "LPD", "LPA", "LSP", "LPU", "LBU"]),
    absent_seed=st.integers(0, 2**16),
)
def test_invariants_with_absent_users(
    case: tuple[str, LdpIdsConfig, list[bool]], absent_seed: int
) -> None:
    """Users come and go between slots (absent = −1); nobody absent is asked, invariants hold."""
    name, cfg, decisions = case
    n = cfg.population
    rng = np.random.default_rng(absent_seed)
    frames = [np.where(rng.random(n) < 0.2, ABSENT, rng.integers(0, 2, n)) for _ in decisions]
    mech = build(name, cfg)
    if name not in ("LBU", "LSP", "LPU"):
        mech.dissimilarity = script(decisions)  # type: ignore[method-assign,assignment]
    records = drive(mech, len(decisions), lambda t: frames[t - 1])
    for rec in records:
        for call in rec.calls:
            assert np.all(frames[rec.t - 1][call.users] != ABSENT)
    if mech.division == "budget":
        check_common(records, cfg)
        spend = [rec.eps_spent() for rec in records]
        for i in range(len(spend)):
            assert sum(spend[max(0, i - cfg.window + 1) : i + 1]) <= cfg.epsilon + TOL
    else:
        check_population_division(records, cfg)


def test_lpa_small_population_capacity() -> None:
    """§1.6 item 3: LPA never asks U_A for more users than it holds. With (1−β)n < w the spec's
    unit ⌊(1−β)n/w⌋ is 0; the implementation bumps it to 1, so M1 (w·⌊βn/w⌋ users per window)
    and M2 (up to w·1 users) overdraw n. A valid config must either be refused up front or run
    safely; it must not stop the stream with a capacity violation for some decision sequence."""
    cfg = LdpIdsConfig(epsilon=1.0, window=30, population=50, task=TASK, beta=0.7)
    try:
        mech = build("LPA", cfg)
    except ValueError:
        return
    mech.dissimilarity = script([True] * 90)  # type: ignore[method-assign,assignment]
    records = drive(mech, 90, all_present(cfg.population))
    check_population_division(records, cfg)


# -- §7 item 5: first publication with literal initialisation ------------------------------------


@pytest.mark.parametrize("name", ["LBA", "LPA"])
@pytest.mark.parametrize(
    ("w", "first"), [(1, 1), (4, 1), (4, 2), (4, 3), (4, 6), (10, 1), (10, 9), (10, 10)]
)
def test_first_publication_absorbs_min_t_plus_1_w(name: str, w: int, first: int) -> None:
    n = 40 * w
    cfg = LdpIdsConfig(epsilon=1.0, window=w, population=n, task=TASK)
    T = first + 2 * w
    decisions = [t >= first for t in range(1, T + 1)]
    records = drive(scripted(name, cfg, decisions), T, all_present(n))
    k = min(first + 1, w)
    strategies = [r.release.strategy for r in records]
    assert strategies[: first - 1] == ["approximate"] * (first - 1)
    assert strategies[first - 1] == "publish"
    if name == "LBA":
        assert records[first - 1].rel.epsilon_m2 == pytest.approx(k * 0.5 / w, rel=1e-12)
    else:
        assert records[first - 1].rel.users_m2 == k * math.floor(0.5 * n / w)
    assert strategies[first : first + k - 1] == ["nullified"] * (k - 1)
    assert strategies[first + k - 1] == "publish"  # one unit has accrued since the nullified run


# -- §7 item 6: LBD budget sequence under forced publications ------------------------------------


def lbd_reference(eps: float, w: int, T: int, beta: Fraction = Fraction(1, 2)) -> list[Fraction]:
    e2, out = (1 - beta) * Fraction(eps), list[Fraction]()
    for t in range(1, T + 1):
        out.append((e2 - sum(out[max(0, t - w) : t - 1])) / 2)
    return out


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("w", [1, 2, 3, 5, 20, 40])
def test_lbd_budget_sequence_forced_publications(w: int, eps: float) -> None:
    T = 3 * w + 2
    cfg = LdpIdsConfig(epsilon=eps, window=w, population=200, task=TASK, beta=0.5)
    records = drive(scripted("LBD", cfg, [True] * T), T, all_present(200))
    check_budget_division(records, cfg)
    got = [r.rel.epsilon_m2 for r in records]
    assert all(r.release.strategy == "publish" for r in records)
    assert all(r.rel.epsilon_m1 == eps / (2 * w) for r in records)
    # ε_rm is ε/2 minus a window sum: allow the rounding of a w-term sum of values <= ε.
    abs_tol = w * 2**-52 * eps
    for t in range(1, w + 1):  # ε/4, ε/8, ε/16, … while nothing is recycled
        assert got[t - 1] == pytest.approx(eps / 2 ** (t + 1), rel=1e-12, abs=abs_tol)
    # Recycling starts at t = w + 1: slot 1's ε/4 leaves the window.
    assert got[w] == pytest.approx(eps / 8 + eps / 2 ** (w + 2), rel=1e-12, abs=abs_tol)
    assert got[w] != pytest.approx(eps / 2 ** (w + 2), rel=1e-3)
    ref = lbd_reference(eps, w, T)
    assert got == pytest.approx([float(x) for x in ref], rel=1e-12, abs=abs_tol)


def test_lbd_long_run_of_publications_does_not_crash() -> None:
    """Random decisions may publish every slot of a long window (§7 item 4): ε_pp halves each
    time, reaching ε/2^61 at w = 60. V(ε_pp, n) must stay computable (exp(ε)−1 underflows to 0
    for ε < 1.1e-16 — see test_oracles::test_variance_finite_for_tiny_budget)."""
    w, T = 60, 125
    cfg = LdpIdsConfig(epsilon=1.0, window=w, population=100, task=TASK)
    records = drive(scripted("LBD", cfg, [True] * T), T, all_present(100))
    check_budget_division(records, cfg)


# -- §7 item 3: dis de-biasing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("d", "eps", "counts", "r_prev"),
    [
        (2, 0.05, [300, 700], [0.5, 0.5]),
        (20, 0.5, [150] * 4 + [50] * 8 + [0] * 8, [0.05] * 20),
    ],
    ids=["GRR-d2", "OUE-d20"],
)
def test_dissimilarity_is_unbiased(
    d: int, eps: float, counts: list[int], r_prev: list[float]
) -> None:
    task = FrequencyTask(d)
    m = sum(counts)
    mech = build("LBD", LdpIdsConfig(epsilon=1.0, window=10, population=m, task=task))
    state = mech.initial_state()
    state.r_prev = np.array(r_prev)
    values = np.repeat(np.arange(d), counts)
    draws = 10_000
    dis = np.empty(draws)
    for i in range(draws):
        r = SlotRandomness(2024, "dis", i + 1)
        agg = SimulatedClientPort(values, task, r).collect(None, eps, "m1")
        dis[i] = mech.dissimilarity(state, agg, eps)
    c = np.array(counts) / m
    target = float(np.mean((c - np.array(r_prev)) ** 2))
    se = float(dis.std(ddof=1)) / math.sqrt(draws)
    assert abs(float(dis.mean()) - target) < 3 * se
    # The correction matters: without subtracting V the mean would be off by far more.
    assert task.variance(eps, m) > 10 * se
    assert np.any(dis < 0)  # dis keeps its sign (§3.0), it is not clipped


# -- purity, failures and determinism ----------------------------------------------------------------


def one_slot(mech: LdpIdsMechanism, t: int, seed: int = 3) -> Slot:
    r = SlotRandomness(seed, "s", t)
    return Slot("s", t, SimulatedClientPort(all_present(mech.n)(t), mech.config.task, r), r)


@pytest.mark.parametrize("name", ["LBU", "LBD", "LBA"])
def test_budget_violation_raises_and_leaves_state_unchanged(name: str) -> None:
    cfg = LdpIdsConfig(epsilon=1.0, window=4, population=100, task=TASK)
    mech = build(name, cfg)
    state = mech.initial_state()
    for t in range(1, 3):
        state, _ = mech.step(state, one_slot(mech, t))
    assert state.budget is not None
    state.budget.charge(3, 1.0 - state.budget.window_spent(3), "m2")  # the window is now full
    frozen = pickle.dumps(state)
    with pytest.raises(PrivacyBudgetExceeded):
        mech.step(state, one_slot(mech, 3))
    assert pickle.dumps(state) == frozen


@pytest.mark.parametrize("name", ["LSP", "LPD", "LPA"])
def test_capacity_violation_raises_and_leaves_state_unchanged(name: str) -> None:
    cfg = LdpIdsConfig(epsilon=1.0, window=5, population=100, task=TASK)
    mech = build(name, cfg)
    state = mech.initial_state()
    assert state.population is not None
    state.population.last_report[:] = 1  # everybody reported at slot 1: U_A is empty at slot 1..5
    frozen = pickle.dumps(state)
    if name == "LSP":  # LSP asks for |U_A| users, which is 0: it must publish nothing
        new, _ = mech.step(state, one_slot(mech, 1))
        assert new.population is not None and np.all(new.population.last_report == 1)
    else:
        with pytest.raises(PrivacyBudgetExceeded, match="available"):
            mech.step(state, one_slot(mech, 1))
    assert pickle.dumps(state) == frozen


@pytest.mark.parametrize("name", ["LBU", "LSP", "LPU", "LBD", "LBA", "LPD", "LPA"])
def test_step_is_pure_and_deterministic(name: str) -> None:
    """§1.6 item 4: same seed and input give bit-identical decisions and releases; ``step``
    never modifies its input state."""
    cfg = LdpIdsConfig(epsilon=1.0, window=5, population=300, task=TASK)
    mech = build(name, cfg)

    def run(seed: int) -> list[tuple[object, ...]]:
        state, out = mech.initial_state(), list[tuple[object, ...]]()
        for t in range(1, 16):
            frozen = pickle.dumps(state)
            slot = one_slot(mech, t, seed)
            new, events = mech.step(state, slot)
            assert pickle.dumps(state) == frozen
            again, events_again = mech.step(state, slot)
            assert events_again == events and pickle.dumps(again) == pickle.dumps(new)
            state = new
            release = events[0]
            assert isinstance(release, Release) and isinstance(release.details, LdpIdsRelease)
            dissimilarity = release.details.dissimilarity
            out.append((release.strategy, release.estimate, dissimilarity, events[1]))
        return out

    first = run(3)
    assert run(3) == first
    assert run(4) != first
