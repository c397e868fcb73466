"""CGM in ``ldp-reports`` mode: the chain step runs on the devices (``privstream.client.cgm``
through ``runtime.fleet``), the server only publishes the public step and reads ``(x*, v)``.

Every CGM mechanism the family registers runs through ``experiments.reports_loop.run_reports``
and, on the same values, through the simulated clients (``SimulatedClientPort``, the server's
``CgmProtocol.respond``), both seeded.

Tolerances. Within a slot the users' noises are independent, so a release's mean ``m`` has
variance ``SE² = σ₁²·Σv/n²`` around the mean of the *clipped* values ``x̄'`` (spec §8.5; the
grid adds at most 0.5 %, tests/mechanisms/test_cgm.py), and a difference of the two modes'
independent means has variance ``SE_r² + SE_s²``. Each z below is so standardised and approximately
N(0, 1) (n ≥ 1300 reports of a discrete Gaussian); ``Z_MAX = 4.5`` bounds each of the ≤ 200 z's
of this file at two-sided 6.8e-6, family-wise ≤ 1.4e-3 by Bonferroni (seeds fixed: the outcome is
deterministic, the bound says a correct implementation passes with that margin). Clipping is
deterministic, so both modes clip every value alike: ``x̄'`` is read from the simulated devices.
With dropout the mean is over a random subset of ``m`` of ``N`` users: it adds the sampling
variance ``S²(1/m − 1/N)`` (``S²`` the values' population variance, without-replacement
sampling given ``m``).
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.client.cgm import Chain
from privstream.connectors.numeric_synthetic import SineStream
from privstream.experiments.reports_loop import ReportsRun, run_reports
from privstream.families.cgm import FAMILY
from privstream.mechanisms.cgm import CgmLedger, CgmMechanism, CgmProtocol, CgmRelease
from privstream.mechanisms.cgm_math import agm_mu, cgm_schedule
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.guarantees import GaussianDP
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import BallTask, EstimationTask, MeanTask
from privstream.runtime.fleet import EXPECTED_REASONS, LIES, Fleet, FleetConfig, device_id
from privstream.schema.protocol import CgmStep, OracleSpec, decode_request

MECHANISMS = tuple(sorted(FAMILY.mechanisms))  # every CGM mechanism the family registers
EPS, DELTA, L = 8.0, 1e-5, 8  # the server's (ε, δ) over a stream of L reports
N, T = 2000, 8
Z_MAX = 4.5
SEED, DEVICE_SEED, SECRET = 2021, 17, 7
CLIPPED = MeanTask(-0.3, 0.3)


def build(name: str, n: int, task: EstimationTask, **options: Any) -> CgmMechanism:
    config = FAMILY.make_config(epsilon=EPS, window=L, population=n, task=task, delta=DELTA,
                                **options)  # fmt: skip
    mech = FAMILY.build(name, config)
    assert isinstance(mech, CgmMechanism)
    return mech


@dataclass
class Simulated:
    """The simulated run's releases and ledger entries, and per slot the mean of the clipped
    values ``x̄'`` (read from the simulated devices' state)."""

    releases: list[Release]
    entries: list[LedgerEntry]
    clipped: list[NDArray[np.float64]]


def simulate(mech: CgmMechanism, values: Any, slots: int) -> Simulated:
    """Step ``mech`` over ``values(t)`` through the simulated clients, as the operator does."""
    state, clients = mech.initial_state(), mech.client_state()
    out = Simulated([], [], [])
    for t in range(1, slots + 1):
        randomness = SlotRandomness(SEED, "s", t, mech.name)
        port = SimulatedClientPort(values(t), mech.config.task, randomness, client_state=clients)
        state, events = mech.step(state, Slot("s", t, port, randomness))
        clients = port.client_state_after if port.client_state_after is not None else clients
        out.releases.append(next(e for e in events if isinstance(e, Release)))
        out.entries.append(next(e for e in events if isinstance(e, LedgerEntry)))
        out.clipped.append(clients.clipped[:, t % mech.config.lag].mean(axis=0))
    return out


def devices(n: int, **knobs: Any) -> FleetConfig:
    """``n`` devices whose CGM μ is the server's μ*(ε, δ) unless ``mu`` is given."""
    return FleetConfig(n, EPS, delta=DELTA, **knobs)


def reports(mech: CgmMechanism, source: Any, fleet: FleetConfig, slots: int) -> ReportsRun:
    task = mech.config.task
    return run_reports([mech], task, source, fleet, slots=slots, secret=SECRET,
                       device_seed=DEVICE_SEED)  # fmt: skip


def details(release: Release) -> CgmRelease:
    assert isinstance(release.details, CgmRelease)
    return release.details


def ledger(entry: Any) -> CgmLedger:
    assert isinstance(entry, LedgerEntry) and isinstance(entry.details, CgmLedger)
    return entry.details


def sigma1_raw(mech: CgmMechanism) -> float:
    return mech.sigma1 * mech.config.diameter


def v_at(mech: CgmMechanism, step: int) -> float:
    """``v`` of a chain's ``step``-th report (1 for Algorithm 1)."""
    if not mech.reuse:
        return 1.0
    c_norm = min(mech.config.bound / mech.config.diameter, 0.5)
    return float(cgm_schedule(c_norm, step).v[step])


def fleet_of(run: ReportsRun) -> Fleet:
    assert run.fleet is not None
    return run.fleet


def z_scores(rel_r: Release, rel_s: Release, clipped: NDArray[np.float64]) -> list[float]:
    """Per coordinate: each mode's mean against ``x̄'`` and the two means against each other."""
    out = []
    for j, truth in enumerate(clipped):
        m_r, m_s = rel_r.estimate[j], rel_s.estimate[j]
        se_r, se_s = details(rel_r).stderr[j], details(rel_s).stderr[j]
        out += [(m_r - truth) / se_r, (m_s - truth) / se_s, (m_r - m_s) / math.hypot(se_r, se_s)]
    return out


@functools.cache
def compared(name: str, ball: bool) -> tuple[CgmMechanism, Simulated, ReportsRun]:
    """One mechanism over the trend stream (or the 2-d ball stream) in both modes."""
    source: Any = BALL if ball else TREND
    mech = build(name, N, BALL.task if ball else CLIPPED, bound=0.1 if ball else 0.05)
    return mech, simulate(mech, source.values, T), reports(mech, source, devices(N), T)


# -- the request ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MECHANISMS)
def test_a_request_names_the_public_step_and_one_reports_budget(name: str) -> None:
    """``request_oracle``: the step's public parameters and domain (a range, or a ball's
    centre and radius), and one report's ``(ε, δ)``: ``1/σ̃₁``-GDP is ``(ε, δ)``-DP at the
    smallest such ε (bisection to far below 1e-9 relative)."""
    for task in (CLIPPED, BallTask((0.5, -1.0), 2.0)):
        mech = build(name, 10, task)
        spec, eps, delta = mech.protocol(3).request_oracle()
        domain: dict[str, Any] = (
            {"lower": -0.3, "upper": 0.3} if isinstance(task, MeanTask)
            else {"lower": None, "upper": None, "center": (0.5, -1.0), "radius": 2.0}
        )  # fmt: skip
        step = CgmStep(mech.sigma1, 14, 1, 0.05, mech.reuse, False, **domain)
        assert spec == OracleSpec("CGM", task.d, step) and delta == DELTA
        mu = 1 / mech.sigma1
        assert GaussianDP(mu).delta(eps) <= DELTA * (1 + 1e-9) < GaussianDP(mu).delta(eps * 0.999)
    with pytest.raises(ValueError, match="δ"):
        CgmProtocol(1, CLIPPED, 0.05, 2.0, 14, 1, True, False).request_oracle()


def test_the_published_request_is_what_the_devices_read() -> None:
    """One budget-division request per slot naming ``CGM``; its JSON decodes to the same step."""
    mech, _, run = compared("CGM", False)
    assert len(run.requests) == T and {r.slot for r in run.requests} == set(range(1, T + 1))
    for request in run.requests:
        assert request.division == "budget" and request.purpose == "CGM.report"
        assert decode_request(request.to_json()) == request
        assert request.oracle == mech.protocol(request.slot).request_oracle()[0]


# -- the same releases as simulated ---------------------------------------------------------------


@pytest.mark.parametrize("ball", [False, True], ids=["range", "ball"])
@pytest.mark.parametrize("name", MECHANISMS)
def test_reports_mode_releases_what_the_simulated_clients_release(name: str, ball: bool) -> None:
    """Per slot: both modes publish from all ``N`` reports; both means are unbiased for the
    clipped mean and agree with each other (|z| < Z_MAX, module docstring); the standard error
    is the same in both modes and equals ``σ₁√v_t/√N`` (every chain at step t); the server's
    ledger mirror is the same; every device's own μ² ledger holds exactly its T reports."""
    mech, sim, run = compared(name, ball)
    assert run.dead_letters == [] and run.reports == N * T
    zs = []
    for t in range(1, T + 1):
        rel_r, rel_s = run.releases[t - 1], sim.releases[t - 1]
        assert rel_r.slot == t and rel_r.strategy == rel_s.strategy == "publish"
        assert details(rel_r).reports == details(rel_s).reports == N
        se = sigma1_raw(mech) * math.sqrt(v_at(mech, t) / N)
        assert details(rel_r).stderr == pytest.approx(details(rel_s).stderr, rel=1e-12)
        assert details(rel_r).stderr == pytest.approx((se,) * mech.config.task.d, rel=1e-12)
        zs += z_scores(rel_r, rel_s, sim.clipped[t - 1])
        assert ledger(run.ledger[t - 1]) == ledger(sim.entries[t - 1])
    assert max(map(abs, zs)) < Z_MAX, zs
    charge = 1 / mech.sigma1**2
    for device in fleet_of(run).cgm_devices:
        (account,) = device.ledger.streams.values()
        assert account.reports == T and account.spent == pytest.approx(T * charge, rel=1e-12)
        assert account.spent <= device.ledger.policy.mu**2


def test_the_differential_clip_moved_the_mean() -> None:
    """The comparison above is not vacuous: on the fast sine CGM's clipped mean differs from
    the raw one by far more than a standard error (the clip runs on the devices)."""
    for ball in (False, True):
        source: Any = BALL if ball else TREND
        mech, sim, run = compared("CGM", ball)
        gaps = []
        for t in range(2, T + 1):
            clipped = mech.protocol(t)._domain_clip(np.asarray(source.values(t), np.float64))
            gap = np.abs(sim.clipped[t - 1] - clipped.reshape(N, -1).mean(axis=0))
            gaps.append(float(gap.max()) / details(run.releases[t - 1]).stderr[0])
        assert max(gaps) > 2 * Z_MAX, gaps


# -- the devices' own budget ----------------------------------------------------------------------


@pytest.mark.parametrize("name", MECHANISMS)
def test_devices_refuse_beyond_their_own_mu_and_releases_still_come_out(name: str) -> None:
    """The fleet's μ admits 5 of the server's L = 8 reports (μ_dev² = 5.5·μ*²/8): slots 1–5
    publish from every device; at 6–8 every device refuses (``exhausted``), the server gets no
    row and releases the last publication again (no standard error); from slot 9 the server's
    own mirror has spent μ* and asks nobody (``refused`` = n). No device passes its μ²."""
    n, slots, allowed = 300, L + 2, 5
    source = SineStream(n, slots, seed=5)
    mech = build(name, n, MeanTask(-0.5, 0.5))
    mu_dev = agm_mu(EPS, DELTA) * math.sqrt((allowed + 0.5) / L)
    run = reports(mech, source, devices(n, mu=mu_dev), slots)
    fleet = fleet_of(run)
    assert fleet.stats.refused == Counter({"exhausted": n * (L - allowed)})
    assert fleet.stats.reports == n * allowed and len(run.requests) == L
    assert [r.strategy for r in run.releases] == ["publish"] * allowed + ["approximate"] * 5
    for release in run.releases[allowed:]:
        assert release.estimate == run.releases[allowed - 1].estimate
        assert details(release).reports == 0 and details(release).stderr == ()
    assert [details(r).refused for r in run.releases] == [0] * L + [n, n]
    assert ledger(run.ledger[-1]).mu_spent == pytest.approx(agm_mu(EPS, DELTA), rel=1e-9)
    for device in fleet.cgm_devices:
        (account,) = device.ledger.streams.values()
        assert account.reports == allowed and account.spent <= mu_dev**2


def test_file_stores_keep_each_devices_mu_across_fleets(tmp_path: Path) -> None:
    """With ``store_dir`` each device's chains and μ² ledger live in ``cgm/sim-<i>.json``: after
    its μ admitted 3 reports (the 4th ``exhausted``), a restarted fleet finds them: a restarted
    server asking slots 1–2 again is refused (``stale``: slots only move forward) and the spend
    stays 3 reports."""
    n, allowed = 30, 3
    mech = build("CGM", n, MeanTask(-0.5, 0.5))
    mu_dev = agm_mu(EPS, DELTA) * math.sqrt((allowed + 0.5) / L)
    config = devices(n, mu=mu_dev, store_dir=tmp_path)
    first = reports(mech, SineStream(n, 4, seed=6), config, 4)
    assert fleet_of(first).stats.refused == Counter({"exhausted": n})
    assert len(list((tmp_path / "cgm").glob("sim-*.json"))) == n
    again = reports(mech, SineStream(n, 4, seed=6), config, 2)
    assert fleet_of(again).stats.refused == Counter({"stale": 2 * n})
    assert [details(r).reports for r in again.releases] == [0, 0]
    for device in fleet_of(again).cgm_devices:
        (account,) = device.ledger.streams.values()
        assert account.reports == allowed and account.spent <= mu_dev**2


@pytest.mark.parametrize("name", MECHANISMS)
def test_the_standard_error_counts_the_reports_that_came_back(name: str) -> None:
    """With dropout 0.3 a slot's release is the mean of the ``m`` reports that came back (``m``
    ≈ 0.7·N: 1050 ± 17.7, asserted within ±150), the counts add up to the fleet's reports, and
    the standard error uses ``m``: ``σ₁/√m`` for Algorithm 1; for CGM ``(SE·m/σ₁)² = Σv`` lies
    in ``[m·v_t, m]`` (a device with missed slots is at an earlier step, larger ``v``). The
    means are unbiased (this sine is never clipped: ``x' = x``) with the sampling variance
    added (module docstring)."""
    slots = 5
    source = SineStream(N, slots, seed=9)
    mech = build(name, N, MeanTask(-0.5, 0.5))
    run = reports(mech, source, devices(N, dropout=0.3, seed=4), slots)
    counts = [details(r).reports for r in run.releases]
    assert all(0.6 * N < m < 0.8 * N for m in counts)
    assert sum(counts) == fleet_of(run).stats.reports == N * slots - fleet_of(run).stats.dropped
    zs = []
    for t, (release, m) in enumerate(zip(run.releases, counts, strict=True), 1):
        (se,) = details(release).stderr
        v_sum = (se * m / sigma1_raw(mech)) ** 2
        if mech.reuse:
            assert m * v_at(mech, t) * (1 - 1e-12) <= v_sum <= m * (1 + 1e-12)
        else:
            assert v_sum == pytest.approx(m, rel=1e-12)
        values = source.values(t)
        sampling = float(values.var()) * (1 / m - 1 / N)
        zs.append((release.estimate[0] - float(values.mean())) / math.sqrt(se**2 + sampling))
    assert max(map(abs, zs)) < Z_MAX, zs


# -- lying devices --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MECHANISMS)
def test_lying_devices_are_dead_letters_with_their_reasons(name: str) -> None:
    """The last ``len(LIES)`` devices lie with CGM reports built on their own noise chains:
    each lie's dead letters carry its expected reasons (``shape``: a ``v`` beyond (0, 1]);
    ``not-asked`` sends nothing to a request that asks everyone. The duplicate's and the
    flood's first copies are well-formed reports and count: ``honest + 2`` rows a slot."""
    n, slots = 40, 4
    honest = n - len(LIES)
    mech = build(name, n, MeanTask(-0.5, 0.5))
    run = reports(mech, SineStream(n, slots, seed=2), devices(n, liars=len(LIES)), slots)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for letter in run.dead_letters:
        reasons[json.loads(letter.payload)["device"]][letter.reason] += 1
    for j, lie in enumerate(LIES):
        got = reasons.pop(device_id(honest + j), Counter())
        if lie == "not-asked":
            assert not got
        else:
            assert got and set(got) <= set(EXPECTED_REASONS[lie]), (lie, got)
    assert not reasons  # no honest device's report was refused
    assert [details(r).reports for r in run.releases] == [honest + 2] * slots
    liars = fleet_of(run).liar_chains
    assert {k[0] for k in liars} == {device_id(honest + j) for j, lie in enumerate(LIES)
                                     if lie != "not-asked"}  # fmt: skip
    assert all(isinstance(c, Chain) and c.steps == slots for c in liars.values())


# -- the fleet's CGM policy -----------------------------------------------------------------------


def test_the_fleet_cgm_policy_is_the_servers_mu() -> None:
    """Each device's μ: ``mu`` when given, else μ*(ε, δ) (spec §2.5: 1/3.7306316348 at ε = 1,
    δ = 1e-5; 0.2367043807 at δ = 1e-6), the μ of a server's CGM config of that (ε, δ)."""
    assert FleetConfig(5).cgm_mu == pytest.approx(1 / 3.7306316348, rel=1e-9)
    assert FleetConfig(5, delta=1e-6).cgm_mu == pytest.approx(0.2367043807, rel=1e-9)
    assert FleetConfig(5, mu=0.5).cgm_mu == 0.5
    assert FleetConfig(5, EPS, delta=DELTA).cgm_mu == build("CGM", 5, CLIPPED).config.mu_budget


@pytest.mark.parametrize(
    ("knob", "flag"),
    [({"delta": 0.0}, "--delta"), ({"delta": 1.0}, "--delta"), ({"mu": 0.0}, "--mu"),
     ({"mu": math.inf}, "--mu"), ({"mu": math.nan}, "--mu")],
)  # fmt: skip
def test_a_refused_cgm_policy_names_its_flag(knob: dict[str, float], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        FleetConfig(5, **knob)  # type: ignore[arg-type]


# -- the streams: a shared trend faster than C (the clip's bias does not average out) ----------


class TrendStream:
    """``N`` users at ``φ_k + 0.3·sin(2πt/8)``, ``φ_k ~ U(−0.25, 0.25)``: steps up to 0.24 > C =
    0.05 (the differential clip bites), values up to ±0.55 beyond [−0.3, 0.3] (so does the range
    clip)."""

    users, slots, name = N, T, "trend"

    def values(self, slot: int) -> NDArray[np.float64]:
        offsets = np.random.default_rng(11).uniform(-0.25, 0.25, N)
        return offsets + 0.3 * math.sin(2 * math.pi * slot / 8)


class BallStream:
    """``N`` users circling ``(0, 1)`` at radius 0.9–1.3 (the unit ball clips some), phases
    within one radian, 0.3 rad a slot (steps ≥ 0.27 > C = 0.1)."""

    task = BallTask((0.0, 1.0), 1.0)
    users, slots, name = N, T, "ball"

    def values(self, slot: int) -> NDArray[np.float64]:
        rng = np.random.default_rng(12)
        phase, radius = rng.uniform(0, 1, N), rng.uniform(0.9, 1.3, N)
        angle = phase + 0.3 * slot
        return np.column_stack([radius * np.cos(angle), 1.0 + radius * np.sin(angle)])


TREND, BALL = TrendStream(), BallStream()
