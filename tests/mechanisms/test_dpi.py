"""The DPI mechanism (``mechanisms.dpi``, ``mechanisms.dpi_boosting``): spec dpi §9's invariants
I1–I10, the ``public_prior`` accounting (§3.11-A), the paper mode's two ledgers (§3.10), the
bounded sensitivity mode (§3.11-B) and configuration validation (§10).

Engine-free: every test steps a mechanism slot by slot through a ``SimulatedCurator`` over a
dense value array (−1: the user sends no event this slot), as the operator does. The family is
loaded from the registry so that its division ``dpi-series`` is declared. Runs are small
(k = 20, N = 300) except one long run of 3,000 slots. All seeds are fixed; every tolerance is a
floating-point one (the quantities compared are exact functions of the ledger), except the
Algorithm 3 spend, whose ±5 sd comes from the Gamma(t, Λ) law of a sum of t Exp(Λ) draws.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.families.registry import family
from privstream.mechanisms import dpi_boosting as boosting
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import ExtraRecord, LedgerEntry, Release, Slot
from privstream.mechanisms.dpi import (
    DPI,
    DpiConfig,
    DpiLedger,
    DpiMechanism,
    DPIPaper,
    DPIPrior,
    DpiRelease,
    DpiState,
)
from privstream.mechanisms.dpi_rba import Alg3State
from privstream.mechanisms.dpi_series import PI2_6
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

SEED = 22
N_USERS = 60
K = 20
REL = 1e-12  # floating-point slack of a quantity recomputed from the ledger
FAMILY = family("dpi")  # registers the division dpi-series

Values = Callable[[int], NDArray[np.int64]]


def config(**kw: Any) -> DpiConfig:
    """A small DPI config: k = 20, N = 300, n_A = 10, M = 64; λ = μ = 0.5 and ζ = 1 (the public
    code's profile, where the scores discriminate, spec §9), Algorithm 4 (spends fastest)."""
    base: dict[str, Any] = dict(
        epsilon=2.0, window=1, population=N_USERS, task=FrequencyTask(K), lam=0.5, mu=0.5,
        zeta=1.0, rba="alg4", pool_size=300, synopses=10, candidates=64,
    )  # fmt: skip
    base.update(kw)
    return DpiConfig(**base)


@dataclass
class Step:
    t: int
    state: DpiState
    release: Release
    entry: LedgerEntry
    audit: ExtraRecord

    @property
    def rel(self) -> DpiRelease:
        assert isinstance(self.release.details, DpiRelease)
        return self.release.details

    @property
    def led(self) -> DpiLedger:
        assert isinstance(self.entry.details, DpiLedger)
        return self.entry.details


def run(
    mech: DpiMechanism,
    values: Values,
    slots: range,
    *,
    seed: int = SEED,
    state: DpiState | None = None,
) -> Iterator[Step]:
    """Step ``mech`` over ``slots`` (``values(t)``: every user's item, −1 when absent)."""
    state = mech.initial_state() if state is None else state
    req = Requirements(population=mech.config.population)
    for t in slots:
        port = SimulatedCurator(values(t), mech.config.task, req)
        state, events = mech.step(
            state, Slot("s", t, port, SlotRandomness(seed, "s", t, mech.name))
        )
        release, entry, audit = events[:3]
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        assert isinstance(audit, ExtraRecord)
        yield Step(t, state, release, entry, audit)


def spread(t: int, n: int = N_USERS, k: int = K) -> NDArray[np.int64]:
    """Every user present, items drawn uniformly (a fixed draw per slot)."""
    return np.random.default_rng([SEED, t]).integers(0, k, n)


def concentrated(t: int, n: int = N_USERS) -> NDArray[np.int64]:
    """Every user present, all on item 0: far from the pool's near-uniform synopses."""
    return np.zeros(n, dtype=np.int64)


def empty(t: int, n: int = N_USERS) -> NDArray[np.int64]:
    """Nobody sends an event."""
    return np.full(n, -1, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# I1: the score


def test_i1_score_in_range_continuous_and_flat_below_lambda() -> None:
    lam, mu = 0.2, 0.05
    d = np.linspace(0.0, 2.0, 20_001)
    g = boosting.score(d, lam, mu)
    assert g.min() == -1.0 and g.max() == 1.0
    assert np.all(np.diff(g) <= 0)  # non-increasing in the error
    assert np.all(g[d <= lam] == 1.0)  # A7: never above 1 below λ
    assert np.all(g[d >= lam + mu] == -1.0)
    h = 1e-12
    at = boosting.score(
        np.array([lam - h, lam, lam + h, lam + mu - h, lam + mu, lam + mu + h]), lam, mu
    )
    np.testing.assert_allclose(at[:3], 1.0, atol=2 * h / mu * 1.01)
    np.testing.assert_allclose(at[3:], -1.0, atol=2 * h / mu * 1.01)
    assert boosting.score(np.array([lam + mu / 2]), lam, mu)[0] == pytest.approx(0.0, abs=1e-15)
    # Lipschitz 2/μ: one user moving d by Δ moves g by at most 2Δ/μ (spec §1.4)
    assert np.max(np.abs(np.diff(g)) / np.diff(d)) <= 2 / mu * (1 + 1e-9)


# --------------------------------------------------------------------------------------------
# I2 (Σ ε_i = ε) is tested on the series itself: tests/mechanisms/test_dpi_series.py
# (test_series_sums_to_epsilon, test_reference_table). Here only that the mechanism uses it.


def test_i2_mechanism_spends_from_the_configured_series() -> None:
    mech = DPI(config())
    assert mech.series.total == pytest.approx(2.0, rel=1e-9)
    assert (mech.series.epsilon, mech.series.mu, mech.series.zeta, mech.series.delta_q) == (
        2.0, 0.5, 1.0, 2.0,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# I3: DPI-paper's log-weights stay within 2·Σα^A of each other


def test_i3_paper_log_weight_range_bounded_by_twice_the_step_sum() -> None:
    mech = DPIPaper(config())
    steps = list(run(mech, spread, range(1, 201)))
    last = steps[-1].state
    alpha_a_by_query = np.zeros(len(mech.config.queries))
    alpha_q_total = 0.0
    for s in steps:
        q = mech.config.queries.index(s.rel.query)
        alpha_a_by_query[q] += s.led.alpha_a
        alpha_q_total += s.led.alpha_q
    np.testing.assert_allclose(last.acum_a, alpha_a_by_query, rtol=REL)
    assert last.acum_q == pytest.approx(alpha_q_total, rel=REL)
    for q in range(len(mech.config.queries)):
        row = last.synopsis_prior[q]
        spread_q = float(row.max() - row.min())
        assert 0 < spread_q <= 2 * alpha_a_by_query[q] * (1 + 1e-12)
    # L_Q moves by at most α_Q per slot, so |L_Q[q]| ≤ Σ α_Q
    assert np.all(np.abs(last.query_prior) <= alpha_q_total * (1 + 1e-12))
    # the total over all time of α^A across the rows is μ·(ε/2)/(4Δ_Q) = 0.0625 (spec §9)
    assert alpha_a_by_query.sum() <= 0.5 * 2.0 / 2 / (4 * 2.0) * (1 + 1e-9)


# --------------------------------------------------------------------------------------------
# I4, I5: a long run's nominal ledger and its series indices


@pytest.fixture(scope="module")
def long_runs() -> dict[str, list[Step]]:
    """3,000 slots of DPI at k = 4, N = 40, n_A = 4 under each RBA algorithm."""
    small = dict(task=FrequencyTask(4), pool_size=40, synopses=4, candidates=8)
    out = {}
    for rba in ("alg3", "alg4"):
        mech = DPI(config(rba=rba, **small))
        out[rba] = list(run(mech, lambda t: spread(t, k=4), range(1, 3001)))
    return out


@pytest.mark.parametrize("rba", ["alg3", "alg4"])
def test_i4_nominal_spend_never_exceeds_epsilon(long_runs: dict[str, list[Step]], rba: str) -> None:
    steps = long_runs[rba]
    spent = np.array([s.led.nominal_spent for s in steps])
    charges = [s.led.nominal_charge for s in steps]
    assert np.all(spent <= 2.0) and np.all(np.diff(spent) >= 0)
    assert spent[-1] == pytest.approx(math.fsum(charges), rel=REL)
    assert all(s.led.nominal_charge == s.led.series_epsilon for s in steps)
    assert not any(s.led.exhausted for s in steps)
    assert steps[-1].state.spent_nominal == spent[-1]
    if rba == "alg4":
        # block 1 is FIFO from index 1: what it spent is a prefix sum of the series; after
        # 3,000 slots ~1,000 of its indices are used and ε − spent is ≈ C/1000 = 0.004
        assert 0.0035 < 2.0 - spent[-1] < 0.0045
    else:
        # Algorithm 3: ε_t ≈ S ~ Exp(rate Λ = 1e8), so Σ ε_t ≈ Gamma(t, Λ): mean t/Λ, sd √t/Λ
        t, rate = len(steps), 1e8
        assert abs(spent[-1] - t / rate) <= 5 * math.sqrt(t) / rate


@pytest.mark.parametrize("rba", ["alg3", "alg4"])
def test_i5_every_series_index_at_most_once(long_runs: dict[str, list[Step]], rba: str) -> None:
    indices = [s.led.series_index for s in long_runs[rba]]
    assert len(indices) == 3000 and min(indices) >= 1
    assert len(set(indices)) == len(indices)
    assert [s.rel.series_index for s in long_runs[rba]] == indices
    if rba == "alg4":  # the first block is used in order from index 1
        first = sorted(i for i in indices if i < 10_000)
        assert first == list(range(1, len(first) + 1))


def test_i4_i9_paper_thm54_charges_four_epsilon_i_and_stops_at_epsilon() -> None:
    mech = DPIPaper(config(eta_mode="paper_thm54", epsilon=1.0))
    steps = list(run(mech, spread, range(1, 121)))
    series = mech.series
    charged = [s for s in steps if s.led.nominal_charge > 0]
    refused = [s for s in steps if s.led.nominal_charge == 0]
    assert charged and refused
    for s in charged:  # I9: exactly 4·ε_{i_t}, and α = X_i/2 on both sides
        i = s.led.series_index
        assert s.led.nominal_charge == 4.0 * series.epsilon_i(i)
        assert s.led.alpha_a == s.led.alpha_q == series.x_i(i) / 2
    spent = [s.led.nominal_spent for s in steps]
    assert max(spent) <= 1.0 * (1 + 1e-9)
    for s in steps:  # a refused element: ε_t = 0, no step, flagged in that entry only
        assert s.led.exhausted == (s.led.nominal_charge == 0)
        if s.led.exhausted:
            assert s.led.series_index == 0 and s.led.series_epsilon == 0
            assert s.led.alpha_a == s.led.alpha_q == 0.0
    # later, smaller elements that fit are still spent: the account fills up to ε, never over
    assert refused[0].t < charged[-1].t
    assert 0.99 < spent[-1] <= 1.0  # 0.99846 with this seed
    assert 4.0 * series.epsilon_i(1) > 1.0  # ε_1 alone (4·0.3325) is refused


# --------------------------------------------------------------------------------------------
# I6, I7: the pool, replay and snapshots


def test_i6_pool_identical_for_the_same_descriptor() -> None:
    a, b = DPI(config()).pool, DPIPaper(config()).pool
    assert a.fingerprint == b.fingerprint
    for name in ("indptr", "indices", "counts"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    other = DPI(config(pool_seed=1)).pool
    assert other.fingerprint != a.fingerprint
    assert any(not np.array_equal(a.synopsis(j), other.synopsis(j)) for j in range(300))


@pytest.mark.parametrize("cls", [DPI, DPIPaper, DPIPrior])
def test_i7_same_secret_same_input_same_releases_and_ledger(cls: type[DpiMechanism]) -> None:
    first = list(run(cls(config()), spread, range(1, 41)))
    again = list(run(cls(config()), spread, range(1, 41)))
    assert [s.release for s in first] == [s.release for s in again]
    assert [s.entry for s in first] == [s.entry for s in again]
    other = list(run(cls(config()), spread, range(1, 41), seed=SEED + 1))
    assert [s.rel.synopses for s in other] != [s.rel.synopses for s in first]


@pytest.mark.parametrize("cls", [DPI, DPIPaper])
def test_i7_pickled_state_continues_identically_without_the_pool(cls: type[DpiMechanism]) -> None:
    cfg = config(task=FrequencyTask(1000), pool_size=400, synopses=10, candidates=64)
    mech = cls(cfg)
    whole = list(run(mech, lambda t: spread(t, k=1000), range(1, 41)))
    blob = pickle.dumps(whole[19].state)
    resumed = list(run(cls(cfg), lambda t: spread(t, k=1000), range(21, 41),
                       state=pickle.loads(blob)))  # fmt: skip
    assert [s.release for s in resumed] == [s.release for s in whole[20:]]
    assert [s.entry for s in resumed] == [s.entry for s in whole[20:]]
    # the pool is rebuilt from its public descriptor, never snapshotted: the state's pickle
    # (two prior rows of N floats, the k-vectors, the RBA state) is far below the pool's bytes
    assert mech.pool.nbytes > 700_000
    assert len(blob) < mech.pool.nbytes / 10


# --------------------------------------------------------------------------------------------
# I8, I10: the prior baseline ignores the data; an empty slot is processed normally


def test_i8_prior_baseline_releases_do_not_depend_on_the_data() -> None:
    runs = [list(run(DPIPrior(config()), values, range(1, 31))) for values in
            (spread, concentrated, empty)]  # fmt: skip
    for other in runs[1:]:
        assert [s.release for s in other] == [s.release for s in runs[0]]
    assert all(s.led.nominal_spent == 0 and s.led.series_index == 0 for s in runs[0])
    assert all(s.led.conservative_spent == 0 for s in runs[0])


@pytest.mark.parametrize("cls", [DPI, DPIPaper])
@pytest.mark.parametrize("rba", ["alg3", "alg4"])
def test_i10_empty_slot_draws_an_element_and_releases(cls: type[DpiMechanism], rba: str) -> None:
    mech = cls(config(rba=rba))
    steps = list(run(mech, lambda t: spread(t) if t % 2 else empty(t), range(1, 11)))
    for s in steps:
        assert s.led.series_index >= 1 and s.led.series_epsilon > 0 and s.led.nominal_charge > 0
        assert len(s.release.estimate) == K and math.fsum(s.release.estimate) == pytest.approx(1.0)
    rba_state = steps[-1].state.rba
    used = (
        rba_state.n_used
        if isinstance(rba_state, Alg3State)
        else sum(
            n - start for n, (start, _) in zip(rba_state.next_index, rba_state.blocks, strict=True)
        )
    )
    assert used == 10
    # an empty slot's instantaneous truth is uniform (spec §3.1)
    uniform = np.full(K, 1 / K)
    target = mech.targets(replace(mech.initial_state(), t=1), np.zeros(K, dtype=np.int64))
    for y in target:
        np.testing.assert_array_equal(y, uniform)


# --------------------------------------------------------------------------------------------
# public_prior (DPI): accounting, the release, the prior update


def test_public_prior_step_sizes_spend_exactly_epsilon_t() -> None:
    cfg = config()
    steps = list(run(DPI(cfg), spread, range(1, 61)))
    s_g, n_a = cfg.s_g, cfg.synopses
    assert s_g == 2.0
    for s in steps:
        led = s.led
        eps_t = led.series_epsilon
        assert eps_t > 0 and led.nominal_charge == eps_t
        assert led.alpha_q == pytest.approx(0.5 * eps_t / (2 * s_g), rel=REL)
        assert led.alpha_a == pytest.approx(0.5 * eps_t / (2 * s_g * n_a), rel=REL)
        eps_q = 2 * s_g * led.alpha_q  # the query draw: one exponential mechanism
        assert eps_q + n_a * 2 * s_g * led.alpha_a == pytest.approx(eps_t, rel=REL)
        assert led.eta_a == pytest.approx(0.5 * math.tanh(led.alpha_a), rel=REL)
        assert led.conservative_charge == led.nominal_charge  # the nominal ledger is rigorous
        assert led.conservative_spent == led.nominal_spent
    assert steps[-1].led.nominal_spent == pytest.approx(
        math.fsum(s.led.series_epsilon for s in steps), rel=REL
    )


@pytest.mark.parametrize("cls", [DPI, DPIPaper, DPIPrior])
def test_release_is_the_mean_of_its_synopses(cls: type[DpiMechanism]) -> None:
    mech = cls(config())
    unit = mech.config.synopses * mech.pool.n_trials  # n_A·n_trials = 200
    for s in run(mech, concentrated, range(1, 31)):
        r = np.array(s.release.estimate)
        assert math.fsum(r) == pytest.approx(1.0, abs=1e-12) and r.min() >= 0
        np.testing.assert_allclose(r * unit, np.round(r * unit), atol=1e-9)
        assert len(s.rel.synopses) == mech.config.synopses
        np.testing.assert_array_equal(r, mech.pool.mean_of(np.array(s.rel.synopses)))
        assert s.release.key == (("query", s.rel.query),)


def test_public_prior_moves_only_towards_released_indices() -> None:
    """The priors after a slot are a function of the priors before it and of that slot's
    release alone (post-processing): recomputed exactly from the release details."""
    mech = DPI(config(prior_rate=0.1))
    before = mech.initial_state()
    for s in run(mech, concentrated, range(1, 26)):
        q = mech.config.queries.index(s.rel.query)
        rows = before.synopsis_prior.copy()
        rows[q] = boosting.move_prior(rows[q], np.array(s.rel.synopses), 0.1)
        np.testing.assert_array_equal(s.state.synopsis_prior, rows)
        np.testing.assert_array_equal(
            s.state.query_prior, boosting.move_prior(before.query_prior, np.array([q]), 0.1)
        )
        assert math.fsum(s.state.synopsis_prior[q]) == pytest.approx(1.0, abs=1e-12)
        before = s.state


def test_public_prior_state_same_when_releases_same() -> None:
    """Under Algorithm 3 (α ≈ 1e−9) two very different inputs give the same releases; the
    public part of the state (priors, last releases, RBA) is then identical, only the
    curator-side accumulators differ."""
    a = list(run(DPI(config(rba="alg3")), spread, range(1, 31)))
    b = list(run(DPI(config(rba="alg3")), concentrated, range(1, 31)))
    assert [s.release for s in a] == [s.release for s in b]
    sa, sb = a[-1].state, b[-1].state
    for name in ("query_prior", "synopsis_prior", "last"):
        np.testing.assert_array_equal(getattr(sa, name), getattr(sb, name))
    assert sa.rba == sb.rba and sa.spent_nominal == sb.spent_nominal
    assert not np.array_equal(sa.accumulated, sb.accumulated)


def test_public_prior_draw_favours_accurate_candidates() -> None:
    """The direction of the exponential mechanisms: with α = 0 the released synopses are a
    uniform draw among the public candidates, with a large α they are the best-scoring ones;
    and the query whose last release answers it worst is chosen."""
    cfg = config()
    pool = DPI(cfg).pool
    y = np.full(K, 1 / K)
    acc_wrong = [np.eye(K)[0], y]  # acc's last release is far from its truth, inst's exact
    priors = (np.full(2, 0.5), np.full((2, cfg.pool_size), 1 / cfg.pool_size))

    def draw(alphas: tuple[float, float], seed: int) -> boosting.Drawn:
        rngs = tuple(np.random.default_rng([seed, j]) for j in range(3))
        return boosting.public_prior_draw(pool, [y, y], acc_wrong, priors, alphas, (64, 10),
                                          (cfg.lam, cfg.mu), rngs)  # type: ignore[arg-type]  # fmt: skip

    def mean_score(drawn: boosting.Drawn) -> float:
        return float(boosting.score(pool.l1_errors(drawn.synopses, y), cfg.lam, cfg.mu).mean())

    candidates = np.random.default_rng([0, 1]).choice(cfg.pool_size, size=64, p=priors[1][0])
    g = boosting.score(pool.l1_errors(candidates, y), cfg.lam, cfg.mu)
    sharp = draw((200.0, 200.0), 0)  # the same candidates (generator [0, 1])
    assert sharp.query == 0  # acc, the badly answered one
    assert set(sharp.synopses.tolist()) <= set(candidates.tolist())
    assert mean_score(sharp) == pytest.approx(float(g.max()), abs=1e-12)  # best candidates only
    # α = 0: candidates uniform over the pool, draws uniform among them, so a release's mean
    # score has the pool's mean and variance ≤ v/10 + v/64 (v: the pool's score variance)
    whole = boosting.score(pool.l1_errors(np.arange(cfg.pool_size), y), cfg.lam, cfg.mu)
    flat = [mean_score(draw((0.0, 0.0), seed)) for seed in range(40)]
    sd = math.sqrt(float(whole.var()) * (1 / 10 + 1 / 64) / 40)
    assert abs(float(np.mean(flat)) - float(whole.mean())) <= 5 * sd
    assert float(g.max()) - float(whole.mean()) > 10 * sd


# --------------------------------------------------------------------------------------------
# DPI-paper: evaluation marks and the conservative account


@pytest.mark.parametrize(("cls", "marked"), [(DPI, False), (DPIPaper, True), (DPIPrior, False)])
def test_paper_outputs_are_marked_evaluation(cls: type[DpiMechanism], marked: bool) -> None:
    for s in run(cls(config()), spread, range(1, 4)):
        assert s.release.evaluation is marked and s.entry.evaluation is marked
        assert s.audit.evaluation is marked


def test_paper_conservative_account_grows_past_nominal() -> None:
    """§3.10: c_t = 2 s_g (n_A·Acum^A_{q_t}(t) + Acum^Q(t)) from the step sizes before slot t,
    recomputed from the public ledger; it keeps growing once the series is spent."""
    cfg = config()
    steps = list(run(DPIPaper(cfg), spread, range(1, 601)))
    acum_a: dict[str, float] = {q: 0.0 for q in cfg.queries}
    acum_q = 0.0
    total = 0.0
    for s in steps:
        expected = 2 * cfg.s_g * (cfg.synopses * acum_a[s.rel.query] + acum_q)
        assert s.led.conservative_charge == pytest.approx(expected, rel=1e-9, abs=0)
        assert type(s.led.conservative_charge) is float
        total += s.led.conservative_charge
        assert s.led.conservative_spent == pytest.approx(total, rel=1e-9)
        acum_a[s.rel.query] += s.led.alpha_a
        acum_q += s.led.alpha_q
    assert steps[0].led.conservative_charge == 0.0
    nominal = steps[-1].led.nominal_spent
    conservative = steps[-1].led.conservative_spent
    assert nominal <= 2.0 < conservative
    # Σ α over all time is ≤ μ(ε/2)/(4Δ_Q) = 0.0625 per side, so the late charges are at most
    # 2·2·(10·0.0625 + 0.0625) = 2.75 per slot and grow linearly once the series is spent
    assert steps[-1].led.conservative_charge <= 2.75
    late = [s.led.conservative_charge for s in steps[-100:]]
    assert min(late) > 0.5 and conservative > 200 * nominal


# --------------------------------------------------------------------------------------------
# sensitivity_mode = bounded


def bounded(**kw: Any) -> DpiConfig:
    return config(sensitivity_mode="bounded", prior_mass=99.0, queries=("inst", "mean"),
                  mu=0.05, zeta=0.1, **kw)  # fmt: skip


def test_bounded_sensitivity_and_larger_steps() -> None:
    cfg, plain = bounded(), config(mu=0.05, zeta=0.1, queries=("inst", "mean"))
    assert cfg.delta_q == pytest.approx(2 / 100) and plain.delta_q == 2.0
    assert cfg.s_g == pytest.approx(2 * 0.02 / 0.05) and plain.s_g == 2.0  # 0.8 against 2
    a = next(iter(run(DPI(cfg), spread, range(1, 2)))).led
    b = next(iter(run(DPI(plain), spread, range(1, 2)))).led
    # the same ε_t buys a 2/0.8 = 2.5 times larger step
    assert (a.alpha_a / a.series_epsilon) / (b.alpha_a / b.series_epsilon) == pytest.approx(2.5)
    assert (a.alpha_q / a.series_epsilon) / (b.alpha_q / b.series_epsilon) == pytest.approx(2.5)
    assert a.series["delta_q"] == pytest.approx(0.02)


@pytest.mark.parametrize("query", ["inst", "mean"])
def test_bounded_targets_move_by_at_most_delta_q(query: str) -> None:
    """One user's one event per slot, over every slot, moves each bounded query's answer by at
    most Δ_Q = 2/(N₀+1) in L1, even when the user is alone (the worst case)."""
    cfg = bounded()
    mech = DPI(cfg)
    q = cfg.queries.index(query)
    with_u, without = mech.initial_state(), mech.initial_state()
    for t in range(1, 6):
        with_u.t = without.t = t
        one = np.bincount([t % K], minlength=K).astype(np.int64)
        y1 = mech.targets(with_u, one)[q]
        y0 = mech.targets(without, np.zeros(K, dtype=np.int64))[q]
        assert np.abs(y1 - y0).sum() <= cfg.delta_q * (1 + 1e-12)
        assert math.fsum(y1) == pytest.approx(1.0)


def test_bounded_refuses_the_accumulated_query() -> None:
    with pytest.raises(ValueError, match="acc"):
        config(sensitivity_mode="bounded", prior_mass=99.0, queries=("acc", "inst"))
    with pytest.raises(ValueError, match="prior_mass"):
        config(sensitivity_mode="bounded", prior_mass=0.0, queries=("inst",))


# --------------------------------------------------------------------------------------------
# configuration validation (spec §10)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"mu": 0.0}, "mu"),
        ({"mu": -0.5}, "mu"),
        ({"zeta": 0.0}, "zeta"),
        ({"lam": -0.1}, "lam"),
        ({"synopses": 301}, "synopses"),
        ({"synopses": 0}, "synopses"),
        ({"queries": ("acc", "median")}, "queries"),
        ({"queries": ("acc", "acc")}, "queries"),
        ({"queries": ()}, "queries"),
        ({"rba": "alg5"}, "rba"),
        ({"query_share": 1.5}, "query_share"),
        ({"sensitivity_mode": "capped"}, "sensitivity_mode"),
    ],
)
def test_bad_configs_refused_naming_the_field(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config(**kw)


def test_infeasible_epsilon_refused_with_the_limit() -> None:
    limit = PI2_6 * 2.0 / (0.5 * 1.0)  # (π²/6)·Δ_Q/(μζ) = 6.57974
    with pytest.raises(ValueError, match=r"epsilon = 7\.0.*6\.57974") as info:
        config(epsilon=7.0)
    assert "allow_underspend" in str(info.value)
    assert f"{limit:.6g}" == "6.57974"
    under = config(epsilon=7.0, allow_underspend=True)
    assert DPI(under).series.total == pytest.approx(limit, rel=1e-12)


def test_family_registers_the_division() -> None:
    from privstream.mechanisms.accounting import division_of

    assert FAMILY.name == "dpi" and set(FAMILY.mechanisms) == {
        "DPI",
        "DPI-paper",
        "DPI-prior",
        "DPI-uniform",
        "Laplace-horizon",
    }
    assert division_of("dpi-series").name == "dpi-series"
