"""``ldp-reports`` against ``ldp-simulated`` (issue 23): the same LDP-IDS mechanism over the
same Sin stream, once with real device reports (``experiments.reports_loop.run_reports``: the
server stage and a seeded simulated fleet, every report through the device library and the
wire schema) and once with simulated clients (the bench harness's path, ``run_lockstep``),
releases the same statistics:

1. every publication is unbiased with the oracle's variance for its ε and its number of
   reports, in both modes (standardized errors, ``reports_stats``: ``|mean z| ≤ 4/√N`` and
   ``|mean z² − 1| ≤ 4√(2/N)``), per mechanism and pooled over mechanisms;
2. the runs' MAE, MRE and number of publications agree between the modes: per-seed values,
   a two-sample test at the 4σ level (``test_errors_agree``).

The seven mechanisms of the paper and the four adaptive samplers run; RescueDP publishes a
Kalman-filtered estimate (not the raw unbiased one), so it takes part in 2 only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from scipy import stats

from privstream.connectors.datasets import SlotStream
from privstream.experiments import scores
from privstream.experiments.harness import run_lockstep
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.client import slot_port
from privstream.mechanisms.contract import Release
from privstream.mechanisms.driver import Lane, Stepped, drive_slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.runtime.fleet import FleetConfig
from tests.mechanisms.reports_stats import (
    ADAPTIVE,
    EPSILON,
    PAPER,
    SIGMAS,
    TASK,
    WINDOW,
    Captured,
    build,
    captured,
    check_standard,
    sin,
    standardized,
)

USERS, SLOTS = 600, 20
REPORT_SEEDS = (1, 2, 3, 4)
SIMULATED_SEEDS = tuple(range(1, 13))  # the simulated mode is cheap: more seeds, a better spread
UNBIASED = (*PAPER, "LB-DSAT", "LP-DSAT")  # RescueDP releases a filtered estimate
SIM_OFFSET = 1000  # the simulated runs' noise seeds, apart from the reports runs'


def simulated(name: str, source: SlotStream, seed: int) -> list[Release]:
    """``name``'s releases in ``ldp-simulated`` mode: the bench harness's slot step
    (``harness._step_slot``: ``drive_slot`` over the trust mode's port, randomness
    ``SlotRandomness(seed, stream, t, scope=name)``) with every release kept, not only its
    estimate (``test_simulated_path_is_the_harness`` pins the two equal)."""
    mech = build(name, source.users)
    lane = Lane(mech, mech.initial_state(), mech.client_state())
    releases = []
    for t in range(1, source.slots + 1):
        stepped = _step(lane, name, source, t, seed)
        lane.state = stepped.state
        lane.clients = lane.clients if stepped.clients is None else stepped.clients
        releases += [e for e in stepped.events if isinstance(e, Release)]
    return releases


def _step(lane: Lane, name: str, source: SlotStream, t: int, seed: int) -> Stepped:
    values = source.values(t)

    def port_for(_name: str, randomness: SlotRandomness, clients: Any) -> Any:
        return slot_port("ldp-simulated", values, TASK, randomness, clients=clients)

    step = drive_slot(
        {name: lane}, source.name, t, port_for,
        lambda n: SlotRandomness(seed, source.name, t, scope=n),
        halt_failures=False,
    )  # fmt: skip
    return step.stepped[name]


@dataclass(frozen=True)
class Mode:
    """One mode's runs of a mechanism: the publications' ``z``, per-seed scores and (reports
    mode) every population-division request's ``(k, selection rate, accepted reports)``."""

    z: np.ndarray
    scores: dict[str, np.ndarray]
    reach: tuple[tuple[int, float, int], ...] = ()


def reach(c: Captured) -> list[tuple[int, float, int]]:
    out = []
    for r in c.run.requests:
        k = c.asked[r.id]
        if k is not None:
            out.append((k, r.select.threshold / r.select.modulus, c.accepted[r.id]))
    return out


def _mode(runs: list[tuple[list[Release], SlotStream]], reached: Sequence[Any] = ()) -> Mode:
    zs: list[np.ndarray] = []
    per_seed: dict[str, list[float]] = {"mae": [], "mre": [], "publications": []}
    for releases, source in runs:
        zs.append(standardized(releases, source))
        est = np.array([r.estimate for r in releases])
        truth = np.array([source.truth(r.slot) for r in releases])
        per_seed["mae"].append(scores.mae(est, truth))
        per_seed["mre"].append(scores.mre(est, truth, 1 / source.users))
        per_seed["publications"].append(sum(r.strategy == "publish" for r in releases))
    per_seed_scores = {k: np.asarray(v, float) for k, v in per_seed.items()}
    return Mode(np.concatenate(zs), per_seed_scores, tuple(reached))


@functools.cache
def modes(name: str) -> dict[str, Mode]:
    """``name`` in both modes over the datasets of seeds ``s``: the reports runs (server
    secret and devices from a seed of their own per mechanism: the devices' seeded randomness
    shared by two mechanisms would correlate their errors, and the pooled test needs them
    independent) and the simulated runs (noise ``SIM_OFFSET + s``, its scope the mechanism)."""
    fleet = FleetConfig(USERS, EPSILON, WINDOW)
    reports, reached = [], []
    own = 100 * (1 + [*PAPER, *ADAPTIVE].index(name))
    for s in REPORT_SEEDS:
        source = sin(USERS, SLOTS, s)
        run = captured([name], source, fleet, slots=SLOTS, seed=own + s)
        reports.append((run.run.releases, source))
        reached += reach(run)
    sims = []
    for s in SIMULATED_SEEDS:
        source = sin(USERS, SLOTS, s)
        sims.append((simulated(name, source, SIM_OFFSET + s), source))
    return {"reports": _mode(reports, reached), "simulated": _mode(sims)}


@pytest.mark.parametrize("name", [*PAPER, *ADAPTIVE])
def test_simulated_path_is_the_harness(name: str) -> None:
    """The simulated releases here are the bench's: ``run_lockstep``'s estimates, bit for bit."""
    source = sin(USERS, SLOTS, 1)
    bench = run_lockstep(LDP_IDS, [name], source, EPSILON, WINDOW, SIM_OFFSET + 1)[name]
    mine = np.array([r.estimate for r in simulated(name, source, SIM_OFFSET + 1)])
    assert mine.tobytes() == bench.estimates.tobytes()
    assert bench.publications == sum(r.strategy == "publish" for r in
                                     simulated(name, source, SIM_OFFSET + 1))  # fmt: skip


@pytest.mark.parametrize("mode", ["reports", "simulated"])
@pytest.mark.parametrize("name", UNBIASED)
def test_publications_are_unbiased_with_the_oracles_variance(name: str, mode: str) -> None:
    check_standard(modes(name)[mode].z, f"{name} {mode}")


@pytest.mark.parametrize("mode", ["reports", "simulated"])
def test_publications_pooled_over_mechanisms(mode: str) -> None:
    """All mechanisms' publications together (independent runs): N in the hundreds, so the
    bounds are tight (about ±0.25 on the mean, ±0.35 on the mean square)."""
    z = np.concatenate([modes(name)[mode].z for name in UNBIASED])
    assert len(z) >= 250
    check_standard(z, f"pooled {mode}")


def critical(df: int) -> float:
    """The two-sided 4σ level (tail ``2·Φ(−4) ≈ 6.3·10⁻⁵``) of Student's t with ``df``
    degrees of freedom: the spread is estimated from the seeds."""
    return float(stats.t.isf(stats.norm.sf(SIGMAS), df))


@pytest.mark.parametrize("name", [*PAPER, *ADAPTIVE])
def test_errors_agree(name: str) -> None:
    """Per-seed MAE, MRE and publications of the two modes: under "same distribution" the
    seeds are independent draws of one law, so ``t = (x̄_r − x̄_s)/(s·√(1/S_r + 1/S_s))``
    with the pooled standard deviation ``s`` is Student's t with ``S_r + S_s − 2`` degrees of
    freedom; ``|t|`` must stay under its 4σ level (``critical``)."""
    both = modes(name)
    for metric in ("mae", "mre", "publications"):
        r, s = both["reports"].scores[metric], both["simulated"].scores[metric]
        df = len(r) + len(s) - 2
        pooled = math.sqrt(((len(r) - 1) * r.var(ddof=1) + (len(s) - 1) * s.var(ddof=1)) / df)
        if pooled == 0:  # a data-independent schedule (LBU, LPU, LSP's publications)
            assert r.mean() == s.mean(), metric
            continue
        t = (r.mean() - s.mean()) / (pooled * math.sqrt(1 / len(r) + 1 / len(s)))
        assert abs(t) <= critical(df), f"{name} {metric}: reports {r.mean():.4g}, " \
            f"simulated {s.mean():.4g}, t = {t:.2f}"  # fmt: skip


@pytest.mark.parametrize("name", ["LPU", "LSP", "LPD", "LPA", "LP-DSAT", "LP-RescueDP"])
def test_population_division_reaches_its_planned_users(name: str) -> None:
    """A population-division request for ``k`` users asks each device at the rate
    ``k/available`` (``schema.protocol.sample_rule``), ``available`` the devices that did not
    report in the window yet (this slot's earlier rounds included: LPD's M1 reporters cannot
    answer its M2). The devices able to answer are then exactly ``available`` (no dropout), so
    a round's accepted reports are Binomial(available, k/available): mean ``k``, variance
    ``k·(1 − rate)``. Over all requests of the runs ``Σ(m − k)`` must stay within 4σ."""
    reached = modes(name)["reports"].reach
    assert len(reached) >= 10
    excess = sum(m - k for k, _rate, m in reached)
    sd = math.sqrt(sum(k * (1 - rate) for k, rate, _m in reached))
    assert abs(excess) <= SIGMAS * sd if sd else excess == 0, (excess, sd)
