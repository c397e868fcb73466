"""`make bench`: reproduction and performance benchmarks of every family (see bench/README.md).

1. Reproduction (spec ldp-ids §5.4 defaults): the seven mechanisms on Sin, n = 200,000,
   T = 800, ε = 1, w = 20, one seed — table and wall time; then Table 2 bits per user on Sin and
   Log (5 seeds) against the paper (spec §5.5.1), with MRE beside the spec author's
   cross-check (§5.5.2).
2. Performance (design §8), ratios measured in this run: the aggregate fast path against the
   per-user path of the simulated clients (LBU and LPA on Sin, n = 200,000), and warm LPA
   slots on a 1,000,000-user, d = 100 categorical population.
3. Kafka read throughput (design §8): the LDP-IDS flow on one worker against a plain
   confluent-kafka consumer, same embedded broker, topic and messages (``privstream bench
   kafka``), 2,000,100 messages, five runs of each.
4. Personalized w-event reproduction (spec personalized-w-event §6): BD, BA, PBD and PBA on
   TLNS, Sin and Log at the defaults (n = T = 10,000, ε = 0.6, w = 120, 3 seeds), AMRE and the
   reductions PBD vs BD and PBA vs BA beside the paper's 68% and 24.9%.

5. Hardened randomness (design §6): the keyed AES-CTR stream against PCG64 for the client
   draws of 10⁶ users, the exact discrete Laplace against float Laplace per draw, and one PBD
   slot over 10⁶ users (``privstream bench noise``).

6. CGM (spec cgm §6): CGM against Alg1 on the taxi-like stream (n = 5,000, T = 48, whole-stream
   budget, ε ∈ {0.25, 0.5, 1, 2}, C ∈ {0.01, 0.05, 0.1}) and the web-traffic-like stream
   (20,000 pages, T = 550, per-day budget, ε ∈ {0.25, 2}, C ∈ {200, 500, 1000}): MSE, stable
   MSE and their ratio with its standard error beside the paper's and the spec's numbers and
   the expectation given the data, and the paper's qualitative claims; then one slot of
   10⁶ users through the mechanism core against a per-user loop (``--cgm-only`` runs just this).

7. State size and snapshot cost (issue 13, ``bench/state.py``): the snapshotted state of one
   stream of 10⁶ named users for every family — bytes per user by component, copy, pickle,
   write and unpickle times — and the pause snapshots cause a real flow with a recovery store
   (``--state-only`` runs just this; ``--no-state`` skips it).

8. DPI (spec dpi §8.4, ``privstream.experiments.dpi_bench``): H1 MSE/KL per query against ε
   for DPI, DPI-paper and the baselines B1/B2 (Alg. 3 and 4), DPI-paper's weight movement
   against the spec's bound, bounded sensitivity, H2 sweeps, H7 remaining budget against the
   spec's table, H8 a timed long run at k = 10,000, H9 the privacy-loss table (when present),
   H10 scaled down, and one k = 10,000 slot of 10⁶ records (``--no-dpi`` skips it).

9. ldp-reports throughput (issue 23, ``privstream bench reports``): reports per second through
   the server stage against raw events through the slotted operator (n = 10⁴ and 10⁵; GRR, OUE,
   OLH), through a report topic into the server stage, through ``privstream gateway``, and the
   simulated fleet's devices per second (``--no-reports`` skips it, ``--reports-only`` runs just
   this).

10. SaO2 (spec sao2 §8, ``privstream.experiments.sao2_bench``): Tables 2 and 4, the d′ and s
   sweeps (Figs. 3, 5), the online comparisons on the Stock and Trajectory stand-ins
   (Figs. 6–8), Table 3's fan-outs, calibrated against uniform level weights (Figs. 9–10),
   each beside the paper's and the spec's numbers with the §8.4 claims as ratios; then the
   server's time per slot and a device's encode time at n = 10⁶, d = 12, T = 32
   (``--no-sao2`` skips it, ``--sao2-only`` runs just this).

Writes everything to bench/results/latest.json (override with --out; --cgm-only writes
bench/results/cgm.json, --state-only bench/results/state.json, --reports-only
bench/results/reports.json, --sao2-only bench/results/sao2.json) and prints a summary.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import itertools
import json
import math
import os
import platform
import pstats
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import f as f_distribution
from state import format_state, run_state  # bench/state.py, beside this script
from tqdm import tqdm

from privstream.connectors.datasets import SlotSource
from privstream.connectors.numeric_synthetic import NumericStream, numeric_dataset
from privstream.experiments import adapted as fig11
from privstream.experiments import dpi_bench, harness, sao2_bench
from privstream.experiments.kafka import bench_kafka, format_result
from privstream.experiments.noise import bench_noise, format_noise
from privstream.experiments.paper_results import (
    MECHANISM_ORDER,
    PAPER_HEADLINES,
    PAPER_TABLE2_BITS,
    SPEC_CROSSCHECK_MRE,
)
from privstream.experiments.reports_bench import bench_reports, format_reports
from privstream.experiments.sao2_report import format_result as format_sao2
from privstream.experiments.scores import Run, reductions
from privstream.families.registry import CGM, LDP_IDS, PERSONALIZED
from privstream.mechanisms.cgm import CgmClients, CgmConfig, CgmMechanism, grid_steps
from privstream.mechanisms.cgm_math import cgm_schedule, schedule_step
from privstream.mechanisms.client import ClientPath, SimulatedClientPort
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.noise import discrete_gaussian
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask, MeanTask
from privstream.runtime.runner import run_dataflow

RESULTS = Path(__file__).resolve().parent / "results"
ALL = list(MECHANISM_ORDER)
PATHS: tuple[ClientPath, ...] = ("aggregate", "per-user")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_ldp_ids(name: str, source: SlotSource, path: ClientPath) -> Run:
    """One LDP-IDS mechanism over ``source`` at ε = 1, w = 20, seed 1."""
    return harness.run_lockstep(LDP_IDS, [name], source, 1.0, 20, 1, path=path)[name]


# --- 1. reproduction ------------------------------------------------------------------------


def default_run(users: int, slots: int, progress: bool) -> dict[str, Any]:
    started = time.perf_counter()
    result = harness.bench(LDP_IDS, "sin", users, slots, 1.0, 20, ALL, seeds=1, progress=progress)
    result["wall_seconds"] = time.perf_counter() - started
    return result


def table2(
    datasets: list[str], users: int, slots: int, seeds: int, progress: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dataset in datasets:
        started = time.perf_counter()
        result = harness.bench(
            LDP_IDS, dataset, users, slots, 1.0, 20, ALL, seeds=seeds, progress=progress
        )
        paper = PAPER_TABLE2_BITS[(1.0, 20, dataset)]
        crosscheck = SPEC_CROSSCHECK_MRE.get(dataset, {})
        rows = {}
        for name, r in result["results"].items():
            rows[name] = {
                **r,
                "paper_bits_per_user": paper[name],
                "bits_rel_dev": r["bits_per_user"] / paper[name] - 1,
                "spec_crosscheck_mre": crosscheck.get(name),
            }
        out[dataset] = {
            "params": result["params"],
            "results": rows,
            "wall_seconds": time.perf_counter() - started,
        }
    return out


def format_table2(t2: dict[str, Any]) -> str:
    lines = []
    for dataset, block in t2.items():
        p = block["params"]
        lines.append(
            f"Table 2, {dataset}: n={p['users']} T={p['slots']} ε={p['epsilon']} "
            f"w={p['window']}, mean of {p['seeds']} seeds ({block['wall_seconds']:.0f} s)"
        )
        head = f"{'mech':5} {'bits sim':>9} {'paper':>8} {'dev':>7}   {'MRE sim':>8} {'§5.5.2':>7}"
        lines += [head, "-" * len(head)]
        for name, r in block["results"].items():
            cc = r["spec_crosscheck_mre"]
            lines.append(
                f"{name:5} {r['bits_per_user']:9.4f} {r['paper_bits_per_user']:8.4f} "
                f"{100 * r['bits_rel_dev']:+6.2f}%   {r['mre']:8.4f} "
                f"{'' if cc is None else f'{cc:7.3f}'}"
            )
        lines.append("")
    return "\n".join(lines)


# --- 2. performance -------------------------------------------------------------------------


def path_ratio(name: str, users: int, slots: int) -> dict[str, Any]:
    """One mechanism over the first ``slots`` slots of Sin through both client paths."""
    stream = harness.load_dataset(LDP_IDS, "sin", users, slots, seed=1)
    timing: dict[str, dict[str, float]] = {}
    for path in PATHS:
        run = run_ldp_ids(name, stream, path)
        timing[path] = {
            "ms_per_slot": 1000 * run.seconds / slots,
            "publications": run.publications,
            "mre": run.mre(),
        }
    return {
        "mechanism": name,
        "dataset": "sin",
        "users": users,
        "slots": slots,
        **timing,
        "per_user_over_aggregate": timing["per-user"]["ms_per_slot"]
        / timing["aggregate"]["ms_per_slot"],
    }


@dataclass(frozen=True)
class ZipfStream:
    """A categorical population of ``users`` users over ``d`` values: each slot, values are
    drawn iid from a Zipf(s) law over the categories whose rank order rotates by one every
    ``period`` slots (so LPA sees real changes). A pure function of (seed, slot)."""

    users: int
    d: int
    slots: int
    seed: int = 1
    s: float = 1.1
    period: int = 10
    name: str = "zipf"
    task: FrequencyTask = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", FrequencyTask(self.d))

    def _probabilities(self, slot: int) -> NDArray[np.float64]:
        weights = 1.0 / np.arange(1, self.d + 1) ** self.s
        return np.roll(weights / weights.sum(), (slot - 1) // self.period)

    def _counts(self, rng: np.random.Generator, slot: int) -> NDArray[np.int64]:
        return rng.multinomial(self.users, self._probabilities(slot))

    def values(self, slot: int) -> NDArray[np.int64]:
        rng = np.random.default_rng([self.seed, slot])
        counts = self._counts(rng, slot)
        return rng.permutation(np.repeat(np.arange(self.d, dtype=np.int64), counts))

    def truth(self, slot: int) -> NDArray[np.float64]:
        """The histogram of ``values(slot)``: its counts are the slot generator's first draw."""
        return self._counts(np.random.default_rng([self.seed, slot]), slot) / self.users


def large_lpa(users: int, d: int, warm: int, measured: int) -> dict[str, Any]:
    """Warm LPA steps on a ``users``-user, ``d``-category population, both client paths."""
    stream = ZipfStream(users, d, warm + measured)
    out: dict[str, Any] = {"mechanism": "LPA", "users": users, "d": d, "warmup_slots": warm}
    out["oracle"] = stream.task.select(1.0).name
    for path in PATHS:
        log(f"  LPA n={users:,} d={d} {path}: {warm} warm-up + {measured} timed slots")
        run = run_ldp_ids("LPA", stream, path)
        ms = 1000 * run.slot_seconds[warm:]
        strategies = np.array(run.strategies[warm:])
        published = strategies == "publish"
        out[path] = {
            "timed_slots": measured,
            "ms_per_slot_mean": float(ms.mean()),
            "ms_per_slot_median": float(np.median(ms)),
            "ms_per_slot_max": float(ms.max()),
            "publications": int(published.sum()),
            "ms_publish_mean": float(ms[published].mean()) if published.any() else None,
            "ms_other_mean": float(ms[~published].mean()) if (~published).any() else None,
        }
    out["per_user_over_aggregate"] = (
        out["per-user"]["ms_per_slot_mean"] / out["aggregate"]["ms_per_slot_mean"]
    )
    return out


def format_perf(perf: dict[str, Any]) -> str:
    lines = ["Client paths (same mechanism and seed; ms per slot of the mechanism step):"]
    for r in perf["paths"]:
        lines.append(
            f"  {r['mechanism']} on {r['dataset']} n={r['users']:,}, {r['slots']} slots: "
            f"aggregate {r['aggregate']['ms_per_slot']:.2f} ms "
            f"({r['aggregate']['publications']:.0f} publications), "
            f"per-user {r['per-user']['ms_per_slot']:.2f} ms "
            f"({r['per-user']['publications']:.0f}), "
            f"ratio per-user/aggregate {r['per_user_over_aggregate']:.1f}×"
        )
    big = perf["large_lpa"]
    lines.append(
        f"LPA, n={big['users']:,}, d={big['d']} ({big['oracle']}), warm slots after "
        f"{big['warmup_slots']}:"
    )
    for path in PATHS:
        r = big[path]
        pub = "" if r["ms_publish_mean"] is None else f", publish slots {r['ms_publish_mean']:.1f}"
        lines.append(
            f"  {path:9}: mean {r['ms_per_slot_mean']:.1f} ms/slot (median "
            f"{r['ms_per_slot_median']:.1f}, max {r['ms_per_slot_max']:.1f}{pub}; "
            f"{r['publications']} publications in {r['timed_slots']} slots)"
        )
    lines.append(f"  ratio per-user/aggregate {big['per_user_over_aggregate']:.1f}×")
    return "\n".join(lines)


# --- 6. CGM ---------------------------------------------------------------------------------

CGM_DELTA = 1e-5
SPEC_S2_RATIO = {
    (0.25, 0.01): 0.038, (1.0, 0.01): 0.047, (2.0, 0.01): 0.077,
    (0.25, 0.05): 0.166, (1.0, 0.05): 0.186, (2.0, 0.05): 0.255,
    (0.25, 0.1): 0.344, (1.0, 0.1): 0.352, (2.0, 0.1): 0.387,
}  # fmt: skip
"""Spec cgm §6.5 (S2): the spec author's taxi-like prototype, stable (slots 25–48) CGM/Alg1."""
SPEC_S2_BASELINE = {0.25: 1.70, 1.0: 0.134, 2.0: 0.0383}
"""Spec cgm §6.5 (S2): Alg1's MSE_agg of that prototype (n = 5000)."""
SPEC_S1_RATIO = {
    (0.25, 200.0): (0.042, 0.052), (2.0, 200.0): (0.064, 0.064),
    (None, 500.0): (0.10, 0.12), (None, 1000.0): (0.199, 0.217),
}  # fmt: skip
"""Spec cgm §6.5 (S1): web-traffic-like prototype, days ≥ 50, CGM/Alg1 (None: any ε)."""
PAPER_RATIO = {("taxi", 2.0, 0.05): 0.21}
"""The paper's Beijing taxi result (spec §6.4 item 4): CGM ≈ 0.006 against Alg1 ≈ 0.028."""
SEED_STRIDE = 10_000
"""Noise seed of repetition ``k`` in the ``c``-th (ε, mechanism, C) setting: ``c·10⁴ + k``. The
same seed at another ε or C would reuse the same random stream, so settings would share their
Monte Carlo errors; distinct seeds make them independent."""


@dataclass(frozen=True)
class CgmPlan:
    """One CGM reproduction (spec cgm §6.5). ``days`` datasets are generated (data seeds
    ``1..days``, the paper's days); repetition ``k`` runs on day ``(k − 1) mod days + 1`` with
    noise seed ``k`` offset per setting (``SEED_STRIDE``). Alg1 ignores ``C``, so it runs
    ``alg1_reps`` times per ε; CGM runs ``cgm_reps[j]`` times at each ε and ``bounds[j]``.
    ``spec_from``: also score slots from this one on (the spec's S1 window, days ≥ 50)."""

    dataset: str
    users: int
    slots: int
    scope: str
    epsilons: tuple[float, ...]
    bounds: tuple[float, ...]
    days: int
    alg1_reps: int
    cgm_reps: tuple[int, ...]
    spec_from: int | None = None

    def jobs(self) -> list[tuple[str, float, int]]:
        """``(mechanism, C, repetitions)`` at every ε; Alg1 first (its C is unused)."""
        return [("Alg1", self.bounds[0], self.alg1_reps)] + [
            ("CGM", c, k) for c, k in zip(self.bounds, self.cgm_reps, strict=True)
        ]


@dataclass
class CgmCell:
    """One mechanism at one (ε, C): each repetition's ``mse``, ``mse_stable`` (second half) and
    spec-window MSE, the per-slot sums of the squared error and of its square, and the sums of
    the expected per-slot noise variance and squared bias given each repetition's data."""

    slots: int
    scores: list[tuple[float, float, float]] = field(default_factory=list)
    sq: NDArray[np.float64] = field(init=False)
    sq2: NDArray[np.float64] = field(init=False)
    noise: NDArray[np.float64] = field(init=False)
    bias: NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        self.sq, self.sq2, self.noise, self.bias = (np.zeros(self.slots) for _ in range(4))

    def add(self, run: Run, expected: tuple[NDArray[np.float64], NDArray[np.float64]],
            spec_from: int) -> None:  # fmt: skip
        err = ((run.estimates - run.truth) ** 2).sum(axis=1)
        score = CGM.bench.score(run)
        self.scores.append((score["mse"], score["mse_stable"], float(err[spec_from - 1 :].mean())))
        self.sq += err
        self.sq2 += err**2
        self.noise += expected[0]
        self.bias += expected[1]

    def summary(self, spec_from: int) -> dict[str, Any]:
        k = len(self.scores)
        s = np.array(self.scores)
        mean = self.sq / k
        stable = slice(self.slots // 2, None)
        return {
            "reps": k,
            "mse": float(s[:, 0].mean()),
            "mse_stable": float(s[:, 1].mean()),
            "mse_stable_se": float(s[:, 1].std(ddof=1) / math.sqrt(k)) if k > 1 else math.nan,
            "mse_spec": float(s[:, 2].mean()),
            "mse_spec_se": float(s[:, 2].std(ddof=1) / math.sqrt(k)) if k > 1 else math.nan,
            "per_slot": mean.tolist(),
            "per_slot_se": np.sqrt(np.maximum(self.sq2 / k - mean**2, 0) / max(k - 1, 1)).tolist(),
            "expected_noise": (self.noise / k).tolist(),
            "expected_bias2": (self.bias / k).tolist(),
            "expected_stable": float((self.noise + self.bias)[stable].mean() / k),
            "expected_spec": float((self.noise + self.bias)[spec_from - 1 :].mean() / k),
        }


def cgm_expected(
    source: NumericStream, mechanism: str, epsilon: float, bound: float, scope: str
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The expected squared error of the released mean, per slot, given the data (spec cgm
    §6.3): ``(v_i·σ₁²/n, bias_i²)``. The noise term is Theorem 5.1's (spec §5.1; ``v_i = 1``
    for Alg1), leaving out the public grid's rounding (at most ``2/(V_i·K)`` more std, under
    1 % here); the bias is the mean offset of the differentially clipped values from the truth.
    Nothing random: it checks the Monte Carlo and splits its error into noise and clipping."""
    lo, hi = source.bounds
    cfg = CGM.make_config(epsilon=epsilon, window=source.slots, population=source.users,
                          task=MeanTask(lo, hi), delta=CGM_DELTA, bound=bound,
                          budget_scope=scope)  # fmt: skip
    assert isinstance(cfg, CgmConfig)
    reuse = mechanism == "CGM"
    v = cgm_schedule(bound / (hi - lo) if reuse else 0.5, source.slots).v[1:]
    noise = v * (cfg.sigma1 * (hi - lo)) ** 2 / source.users
    bias = np.zeros(source.slots)
    clip = np.clip(source.values(1), lo, hi)
    for t in range(2, source.slots + 1 if reuse else 1):
        clip = clip + np.clip(np.clip(source.values(t), lo, hi) - clip, -bound, bound)
        bias[t - 1] = (float(clip.mean()) - float(source.truth(t)[0])) ** 2
    return noise, bias


def cgm_reproduction(plan: CgmPlan, progress: bool) -> dict[str, Any]:
    """Every (ε, C) of ``plan``: CGM and Alg1 through ``harness.run_lockstep``, each day's data
    generated once and shared by its repetitions, settings and both mechanisms."""
    started = time.perf_counter()
    spec_from = plan.spec_from or plan.slots // 2 + 1
    cells: dict[tuple[str, float, float], CgmCell] = {}
    kept: list[int] = []
    total = len(plan.epsilons) * sum(k for _, _, k in plan.jobs())
    with tqdm(total=total, desc=f"cgm {plan.dataset}", unit="run", file=sys.stderr,
              disable=not progress, dynamic_ncols=True, mininterval=0.5) as bar:  # fmt: skip
        for day in range(1, plan.days + 1):
            source = numeric_dataset(plan.dataset, plan.users, plan.slots, day)
            kept.append(source.users)
            settings = itertools.product(plan.epsilons, plan.jobs())
            for cell_id, (eps, (mech, bound, count)) in enumerate(settings):
                reps = range(day, count + 1, plan.days)
                if not reps:
                    continue
                expected = cgm_expected(source, mech, eps, bound, plan.scope)
                cell = cells.setdefault((mech, eps, bound), CgmCell(plan.slots))
                for k in reps:
                    seed = SEED_STRIDE * cell_id + k  # independent noise in every cell
                    run = harness.run_lockstep(CGM, [mech], source, eps, plan.slots, seed,
                                               delta=CGM_DELTA, bound=bound,
                                               budget_scope=plan.scope)[mech]  # fmt: skip
                    cell.add(run, expected, spec_from)
                    bar.update(1)
    lo, hi = source.bounds
    summaries = {key: cell.summary(spec_from) for key, cell in cells.items()}
    params = {**dataclasses.asdict(plan), "users_kept": f"{min(kept)}–{max(kept)}",
              "delta": CGM_DELTA, "spec_from": spec_from}  # fmt: skip
    return {
        "params": params,
        "rows": cgm_rows(plan, summaries, hi - lo),
        "wall_seconds": time.perf_counter() - started,
    }


def _ratio(num: float, num_se: float, den: float, den_se: float) -> tuple[float, float]:
    """``num/den`` and its relative standard error (delta method, independent estimates)."""
    return num / den, math.hypot(num_se / num, den_se / den)


def _spec_reference(dataset: str, eps: float, bound: float) -> tuple[float, float] | None:
    if dataset == "taxi":
        value = SPEC_S2_RATIO.get((eps, bound))
        return None if value is None else (value, value)
    return SPEC_S1_RATIO.get((eps, bound)) or SPEC_S1_RATIO.get((None, bound))


def _slot_checks(cgm: dict[str, Any], alg1: dict[str, Any]) -> dict[str, Any]:
    """Spec cgm §6.4 items 1 and 3 on the per-slot means over repetitions: slot 1 equal within
    noise, and from slot 2 on CGM below Alg1 — slot by slot, below Alg1's time average (Alg1's
    expected error is the same at every slot), and in expectation. At slot 1 both errors are
    unbiased Gaussian means of the same variance, so the ratio of their mean squares over
    ``K_C`` and ``K_A`` repetitions is F(K_C, K_A)-distributed: ``slot1_p`` is its two-sided
    p-value."""
    c, a = np.array(cgm["per_slot"]), np.array(alg1["per_slot"])
    exp_c = np.add(cgm["expected_noise"], cgm["expected_bias2"])
    exp_a = np.add(alg1["expected_noise"], alg1["expected_bias2"])
    cdf = float(f_distribution.cdf(c[0] / a[0], cgm["reps"], alg1["reps"]))
    return {
        "slot1_ratio": float(c[0] / a[0]),
        "slot1_p": 2 * min(cdf, 1 - cdf),
        "later_slots": int(c.size - 1),
        "below_per_slot": int((c[1:] < a[1:]).sum()),
        "below_alg1_average": int((c[1:] < a.mean()).sum()),
        "below_expected": int((exp_c[1:] < exp_a[1:]).sum()),
    }


def _window_rse(cell: dict[str, Any], reuse: NDArray[np.float64], window: slice) -> float:
    """The relative standard deviation of one repetition's MSE over ``window`` in theory: the
    error of slot i is ``b_i + g_i`` with Gaussian ``g``, ``Var(g_i)`` the expected noise and
    ``Cov(g_i, g_j) = Var(g_j)·r_{j+1}···r_i`` for ``j ≤ i`` (spec §5.4; Alg1: ``r = 0``), so the
    variance is ``(2 tr(Σ²) + 4 bᵀΣb)/m²``. ``|b_i|`` stands for the bias (its sign is lost)."""
    var = np.asarray(cell["expected_noise"])[window]
    b = np.sqrt(np.asarray(cell["expected_bias2"])[window])
    r = reuse[window]
    cov = np.diag(var)
    if r[1:].all():
        chain = np.concatenate(([1.0], np.cumprod(r[1:])))
        lower = np.tril(chain[:, None] / chain[None, :]) * var[None, :]
        cov = lower + lower.T - cov
    spread = math.sqrt(2 * float(np.sum(cov * cov)) + 4 * float(b @ cov @ b)) / var.size
    return spread / float(np.mean(var + b * b))


def _cgm_row(plan: CgmPlan, eps: float, bound: float, cgm: dict[str, Any],
             alg1: dict[str, Any], diameter: float) -> dict[str, Any]:  # fmt: skip
    """One (ε, C) of the table: the measured ratios with their relative standard errors (from
    the repetitions' spread and, ``*_theory``, from ``_window_rse``), the expectation given the
    data, how many theoretical standard errors the ratio lies from it, and the references."""
    stable = slice(plan.slots // 2, None)
    spec = slice((plan.spec_from or plan.slots // 2 + 1) - 1, None)
    reuse = cgm_schedule(bound / diameter, plan.slots).r[1:]
    no_reuse = np.zeros(plan.slots)

    def theory(window: slice) -> float:
        return math.hypot(_window_rse(cgm, reuse, window) / math.sqrt(cgm["reps"]),
                          _window_rse(alg1, no_reuse, window) / math.sqrt(alg1["reps"]))  # fmt: skip

    ratio, rse = _ratio(cgm["mse_stable"], cgm["mse_stable_se"],
                        alg1["mse_stable"], alg1["mse_stable_se"])  # fmt: skip
    spec_ratio, spec_rse = _ratio(cgm["mse_spec"], cgm["mse_spec_se"],
                                  alg1["mse_spec"], alg1["mse_spec_se"])  # fmt: skip
    expected = cgm["expected_stable"] / alg1["expected_stable"]
    noise = np.sum(cgm["expected_noise"][stable]) / np.sum(alg1["expected_noise"][stable])
    c_norm = bound / diameter
    return {
        "epsilon": eps, "bound": bound, "cgm": cgm, "ratio": ratio, "ratio_rse": rse,
        "ratio_rse_theory": theory(stable), "ratio_spec": spec_ratio, "ratio_spec_rse": spec_rse,
        "ratio_spec_rse_theory": theory(spec), "expected_ratio": expected,
        "expected_spec_ratio": cgm["expected_spec"] / alg1["expected_spec"],
        "expected_noise_ratio": float(noise),
        "z_expected": (ratio - expected) / (expected * theory(stable)),
        "v_inf": 4 * c_norm * (1 - c_norm),
        "spec": _spec_reference(plan.dataset, eps, bound),
        "paper": PAPER_RATIO.get((plan.dataset, eps, bound)),
        "checks": _slot_checks(cgm, alg1),
    }  # fmt: skip


def cgm_rows(
    plan: CgmPlan, cells: dict[tuple[str, float, float], dict[str, Any]], diameter: float
) -> dict[str, Any]:
    """Every (ε, C) row (``_cgm_row``), Alg1's scores per ε, and per ε the best C (the lowest
    stable ratio) and whether the ratio grows with C."""
    rows, best = [], {}
    for eps in plan.epsilons:
        alg1 = cells[("Alg1", eps, plan.bounds[0])]
        for bound in plan.bounds:
            rows.append(_cgm_row(plan, eps, bound, cells[("CGM", eps, bound)], alg1, diameter))
        ratios = [r["ratio"] for r in rows if r["epsilon"] == eps]
        best[str(eps)] = {"best_bound": plan.bounds[int(np.argmin(ratios))],
                          "increasing_in_c": bool(np.all(np.diff(ratios) > 0))}  # fmt: skip
    alg1s = {str(e): cells[("Alg1", e, plan.bounds[0])] for e in plan.epsilons}
    return {"rows": rows, "alg1": alg1s, "best_c": best}


def _rse(spread: float, theory: float) -> str:
    """A relative standard error from the repetitions' spread beside the theoretical one."""
    return f"{100 * spread:3.0f}/{100 * theory:2.0f}%".rjust(8)


def _ref(value: tuple[float, float] | float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, tuple):
        lo, hi = value
        return f"{lo:.3g}" if lo == hi else f"{lo:.3g}–{hi:.3g}"
    return f"{value:.3g}"


def format_cgm(result: dict[str, Any]) -> str:
    """The reproduction table of one dataset, then the qualitative checks."""
    p, block = result["params"], result["rows"]
    spec_window = p["dataset"] == "webtraffic"
    lines = [
        f"CGM vs Alg1 on {p['dataset']}: n = {p['users']} requested ({p['users_kept']} kept), "
        f"T = {p['slots']}, budget per {p['scope']}, δ = {p['delta']:g}; {p['days']} data "
        f"seeds; stable = slots {p['slots'] // 2 + 1}–{p['slots']}; {result['wall_seconds']:.0f} s",
        f"{'ε':>5} {'C':>6} {'reps':>7} {'mse CGM':>9} {'mse Alg1':>9} {'stab CGM':>9} "
        f"{'stab Alg1':>9} {'ratio':>6} {'±rse/th':>8}"
        + (f" {'d≥' + str(p['spec_from']):>6} {'±rse/th':>8}" if spec_window else "")
        + f" | {'expect':>6} {'z':>5} {'noise':>6} {'4C̃(1−C̃)':>8} {'spec':>11} {'paper':>5}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in block["rows"]:
        c, a = r["cgm"], block["alg1"][str(r["epsilon"])]
        lines.append(
            f"{r['epsilon']:5g} {r['bound']:6g} {c['reps']:>3}/{a['reps']:<3} {c['mse']:9.4g} "
            f"{a['mse']:9.4g} {c['mse_stable']:9.4g} {a['mse_stable']:9.4g} {r['ratio']:6.3f} "
            f"{_rse(r['ratio_rse'], r['ratio_rse_theory'])}"
            + (
                f" {r['ratio_spec']:6.3f} {_rse(r['ratio_spec_rse'], r['ratio_spec_rse_theory'])}"
                if spec_window
                else ""
            )
            + f" | {r['expected_ratio']:6.3f} {r['z_expected']:+5.1f} "
            f"{r['expected_noise_ratio']:6.3f} {r['v_inf']:8.4f} "
            f"{_ref(r['spec']):>11} {_ref(r['paper']):>5}"
        )
    if p["dataset"] == "taxi":
        lines.append("Alg1 MSE_agg, all slots, against spec S2: " + ", ".join(
            f"ε={e}: {block['alg1'][str(e)]['mse']:.4g} ({_ref(SPEC_S2_BASELINE.get(e))})"
            for e in p["epsilons"]
        ))  # fmt: skip
    lines += ["", "checks on the per-slot means over repetitions (spec §6.4 items 1, 3, 5):",
              f"{'ε':>5} {'C':>6}  slot 1 CGM/Alg1 (p)   slots ≥ 2 with CGM < Alg1: "
              "per slot | < Alg1 time-average | expected"]  # fmt: skip
    for r in block["rows"]:
        k = r["checks"]
        n = k["later_slots"]
        lines.append(
            f"{r['epsilon']:5g} {r['bound']:6g}  {k['slot1_ratio']:6.3f} ({k['slot1_p']:5.3f})"
            f"{'':>10}{k['below_per_slot']:>4}/{n} | {k['below_alg1_average']:>4}/{n} | "
            f"{k['below_expected']:>4}/{n}"
        )
    lines.append("best C (lowest stable ratio) per ε: " + "; ".join(
        f"ε={e}: C={b['best_bound']:g}" + ("" if b["increasing_in_c"] else " (not monotone in C)")
        for e, b in block["best_c"].items()
    ))  # fmt: skip
    return "\n".join(lines)


PROFILE_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "range + differential clip": (("cgm_math.py", "range_clip"), ("cgm_math.py", "diff_clip")),
    "schedule r, V, v": (("cgm.py", "_schedule"),),
    "discrete Gaussian draws": (("noise.py", "discrete_gaussian"),),
    "grid snap and V levels": (("cgm.py", "_perturb"),),
    "device state copy": (("cgm.py", "copy"),),
    "server state deepcopy": (("copy.py", "deepcopy"),),
    "aggregation + ledger": (("cgm.py", "_release"), ("cgm.py", "_entry")),
    "port (absent mask)": (("client.py", "absent_mask"),),
}
"""Functions whose cumulative time makes up each part of one CGM step (the draws are also
inside the grid snap: that part is reported net of them)."""


def _perf_state(mech: CgmMechanism, done: int, clipped: NDArray[np.float64]) -> tuple[Any, Any]:
    """The server's and the devices' state after every user made ``done`` reports whose last
    clipped value (and, for timing purposes, report) is ``clipped``."""
    cfg, n = mech.config, mech.config.population
    v = float(cgm_schedule(cfg.bound / cfg.diameter, done).v[done])
    state = dataclasses.replace(mech.initial_state(), t=done, last_slot=done,
                                charged=np.full(n, done), lifetime=np.full(n, done))  # fmt: skip
    column = clipped.reshape(n, 1, 1)
    clients = CgmClients(np.full((n, 1), done), np.full((n, 1), v), column.copy(),
                         column.copy(), np.full((n, 1), done))  # fmt: skip
    return state, clients


def _core_step(mech: CgmMechanism, states: tuple[Any, Any], values: NDArray[np.float64],
               index: int) -> None:  # fmt: skip
    """One ``CGM.step`` at slot ``index`` through a ``SimulatedClientPort`` (as the harness)."""
    randomness = SlotRandomness(1, "perf", index, scope=mech.name)
    port = SimulatedClientPort(values, mech.config.task, randomness, "aggregate", states[1])
    mech.step(states[0], Slot("perf", index, port, randomness))


def _noise_std_steps(cfg: CgmConfig, V: float) -> tuple[float, int]:
    """The public grid's steps per diameter ``K`` and the integer ``s`` of the exact discrete
    Gaussian (variance parameter ``s(s + 1)`` steps²) a report at sensitivity ``V`` draws, as
    ``CgmProtocol._perturb`` does for d = 1."""
    steps = grid_steps(cfg.sigma1, cfg.grid_bits)
    return steps, math.ceil((V * steps + 2) * cfg.sigma1)


def _loop_slot(cfg: CgmConfig, values: NDArray[np.float64], clipped: NDArray[np.float64],
               done: int) -> float:  # fmt: skip
    """Seconds of the per-user reference for users who made ``done`` reports: for each in turn
    the range clip, the differential clip, the schedule step, the randomised snap to the grid,
    one exact discrete Gaussian draw and the report; then the mean and its standard error."""
    assert isinstance(cfg.task, MeanTask)
    lo, hi, c_raw = cfg.task.lower, cfg.task.upper, cfg.bound
    v_prev = float(cgm_schedule(c_raw / (hi - lo), done).v[done])
    rng = SlotRandomness(1, "perf", done + 1, scope="loop")("report/client")
    reports, total_v = np.empty(values.size), 0.0
    started = time.perf_counter()
    for k in range(values.size):
        x = min(max(float(values[k]), lo), hi)
        prev = float(clipped[k])
        x = prev + min(max(x - prev, -c_raw), c_raw)
        r, V, v = schedule_step(v_prev, c_raw / (hi - lo))
        steps, sigma = _noise_std_steps(cfg, V)
        scaled = (x - r * prev) * steps / (hi - lo)
        snapped = math.floor(scaled) + (rng.random() < scaled - math.floor(scaled))
        z = int(discrete_gaussian(rng, Fraction(sigma * (sigma + 1)), 1)[0])
        reports[k] = (snapped + z) * (hi - lo) / steps + r * prev
        total_v += v
    _ = (reports.mean(), cfg.sigma1 * (hi - lo) * math.sqrt(total_v) / values.size)
    return time.perf_counter() - started


def _profile(mech: CgmMechanism, states: tuple[Any, Any], values: NDArray[np.float64],
             index: int) -> dict[str, float]:  # fmt: skip
    """Milliseconds of each ``PROFILE_PARTS`` part of one step under cProfile."""
    profiler = cProfile.Profile()
    profiler.runcall(_core_step, mech, states, values, index)
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    cumulative: dict[tuple[str, str], float] = {}
    for (path, _, func), row in stats.items():
        key = (Path(path).name, func)
        cumulative[key] = cumulative.get(key, 0.0) + 1000 * row[3]
    parts = {
        name: sum(cumulative.get(f, 0.0) for f in funcs) for name, funcs in PROFILE_PARTS.items()
    }
    parts["grid snap and V levels"] -= parts["discrete Gaussian draws"]
    parts["total (profiled)"] = cumulative.get((Path(__file__).name, "_core_step"), 0.0)
    return parts


def cgm_perf(users: int, loop_users: int, steps: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """One CGM slot over ``users`` users (d = 1, the family's defaults: ε = 1, δ = 10⁻⁵,
    l = 48, C = 0.05 on [0, 1]) at each report number of ``steps`` (≥ 2: the reuse path), timed
    ``repeats`` times, against the per-user loop on the first ``loop_users`` users scaled
    linearly; plus a profile of the vectorised step."""
    config = CGM.make_config(epsilon=1.0, window=48, population=users, task=MeanTask(0.0, 1.0),
                             delta=CGM_DELTA, bound=0.05, budget_scope="stream")  # fmt: skip
    mech = CGM.build("CGM", config)
    assert isinstance(mech, CgmMechanism) and isinstance(config, CgmConfig)
    rng = np.random.default_rng(7)
    clipped = rng.uniform(0.0, 1.0, users)
    values = np.clip(clipped + rng.uniform(-0.1, 0.1, users), 0.0, 1.0)  # about half clip
    out: dict[str, Any] = {"users": users, "loop_users": loop_users, "sigma1": config.sigma1,
                           "grid_steps": _noise_std_steps(config, 1.0)[0], "steps": []}  # fmt: skip
    for step in steps:
        states = _perf_state(mech, step - 1, clipped)
        V = float(cgm_schedule(0.05, step).V[step])
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            _core_step(mech, states, values, step)
            times.append(1000 * (time.perf_counter() - started))
        loop = _loop_slot(config, values[:loop_users], clipped[:loop_users], step - 1)
        loop_ms = 1000 * loop * users / loop_users
        out["steps"].append({
            "step": step, "V": V, "dg_std_steps": _noise_std_steps(config, V)[1],
            "core_ms_median": float(np.median(times)), "core_ms_min": float(min(times)),
            "loop_seconds_subset": loop, "loop_ms_scaled": loop_ms,
            "loop_over_core": loop_ms / float(np.median(times)),
            "profile_ms": _profile(mech, states, values, step),
        })  # fmt: skip
    return out


def format_cgm_perf(perf: dict[str, Any]) -> str:
    n, m = perf["users"], perf["loop_users"]
    lines = [
        f"CGM, one slot of n = {n:,} users, d = 1 (ε = 1, δ = 1e-5, l = 48, C = 0.05, "
        f"σ̃₁ = {perf['sigma1']:.2f}, grid D/{perf['grid_steps']:.0f}); per-user loop timed on "
        f"{m:,} users and scaled linearly ×{n / m:g} to {n:,}:"
    ]
    for s in perf["steps"]:
        lines.append(
            f"  report {s['step']:>2} (V = {s['V']:.3f}, DG std {s['dg_std_steps']:,} steps): "
            f"core {s['core_ms_median']:,.0f} ms/slot (min {s['core_ms_min']:,.0f}), loop "
            f"{s['loop_ms_scaled']:,.0f} ms/slot ({s['loop_seconds_subset']:.2f} s for {m:,}), "
            f"loop/core {s['loop_over_core']:.0f}×"
        )
        prof = s["profile_ms"]
        lines.append("    profile (ms): " + ", ".join(f"{k} {v:,.0f}" for k, v in prof.items()))
    worst = max(s["core_ms_median"] for s in perf["steps"])
    ratio = min(s["loop_over_core"] for s in perf["steps"])
    lines.append(
        f"  targets: < 100 ms/slot {'met' if worst < 100 else 'NOT met'} (slowest {worst:,.0f} "
        f"ms); ≥ 100× the loop {'met' if ratio >= 100 else 'NOT met'} (lowest {ratio:.0f}×)"
        + ("" if n == 1_000_000 else f" (the targets are for 10⁶ users; this slot has {n:,})")
    )
    return "\n".join(lines)


CGM_FULL = (
    CgmPlan("taxi", 5000, 48, "stream", (0.25, 0.5, 1.0, 2.0), (0.01, 0.05, 0.1),
            days=10, alg1_reps=40, cgm_reps=(175, 92, 54)),
    CgmPlan("webtraffic", 20000, 550, "timestamp", (0.25, 2.0), (200.0, 500.0, 1000.0),
            days=10, alg1_reps=2, cgm_reps=(10, 6, 4), spec_from=50),
)  # fmt: skip
"""The spec's S2 and S1 settings (spec cgm §6.5). Repetitions per C: on the taxi-like stream
enough for a relative standard error of the stable ratio ≤ 10 % (one repetition's is 1.2, 0.85
and 0.6 for C = 0.01, 0.05, 0.1, Alg1's 0.29); on the web-traffic-like stream, where one
repetition costs 10⁷ exact draws, what the section's ten minutes allow (bench/README.md)."""
CGM_QUICK = (
    CgmPlan("taxi", 1000, 48, "stream", (0.25, 0.5, 1.0, 2.0), (0.01, 0.05, 0.1),
            days=2, alg1_reps=3, cgm_reps=(3, 3, 3)),
    CgmPlan("webtraffic", 2000, 100, "timestamp", (0.25, 2.0), (200.0, 500.0, 1000.0),
            days=2, alg1_reps=2, cgm_reps=(2, 2, 2), spec_from=50),
)  # fmt: skip


def run_cgm(quick: bool, progress: bool) -> dict[str, Any]:
    """Section 6: the CGM reproduction on both datasets, then the one-slot performance."""
    out: dict[str, Any] = {}
    for plan in CGM_QUICK if quick else CGM_FULL:
        log(f"6. CGM reproduction on {plan.dataset} ({plan.scope} budget)")
        out[plan.dataset] = cgm_reproduction(plan, progress)
        print(format_cgm(out[plan.dataset]) + "\n")
    users, loop_users, repeats = (100_000, 2_000, 2) if quick else (1_000_000, 20_000, 3)
    log(f"6. CGM performance: one slot of {users:,} users against a per-user loop")
    out["performance"] = cgm_perf(users, loop_users, (2, 24), repeats)
    print(format_cgm_perf(out["performance"]))
    return out


def run_sao2(quick: bool) -> dict[str, Any]:
    """Section 9: the SaO2 reproduction and performance (bench/README.md "SaO2")."""
    result = sao2_bench.run(sao2_bench.QUICK if quick else sao2_bench.FULL, log)
    print("\n" + format_sao2(result))
    return result


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="results file (default bench/results/latest.json; cgm.json with --cgm-only)",
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the Table 2 comparison")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small populations and few slots"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--no-kafka", action="store_true", help="skip the Kafka read-throughput benchmark"
    )
    parser.add_argument(
        "--no-personalized", action="store_true", help="skip the personalized reproduction"
    )
    parser.add_argument("--no-cgm", action="store_true", help="skip the CGM section (6)")
    parser.add_argument(
        "--cgm-only", action="store_true", help="run only the CGM section (6), to cgm.json"
    )
    parser.add_argument("--no-state", action="store_true", help="skip the state section (7)")
    parser.add_argument("--no-dpi", action="store_true", help="skip the DPI section (8)")
    parser.add_argument(
        "--state-only", action="store_true", help="run only the state section (7), to state.json"
    )
    parser.add_argument(
        "--no-reports", action="store_true", help="skip the ldp-reports section (9)"
    )
    parser.add_argument(
        "--reports-only", action="store_true",
        help="run only the ldp-reports section (9), to reports.json",
    )  # fmt: skip
    parser.add_argument("--no-sao2", action="store_true", help="skip the SaO2 section (10)")
    parser.add_argument(
        "--sao2-only", action="store_true", help="run only the SaO2 section (10), to sao2.json"
    )
    args = parser.parse_args(argv)
    progress = not args.no_progress
    if args.reports_only:
        started = time.perf_counter()
        record = {"quick": args.quick, "reports": run_reports(args.quick)}
        return write_record(args.out or RESULTS / "reports.json", record, started)
    if args.cgm_only:
        started = time.perf_counter()
        record = {"quick": args.quick, "cgm": run_cgm(args.quick, progress)}
        return write_record(args.out or RESULTS / "cgm.json", record, started)
    if args.sao2_only:
        started = time.perf_counter()
        record = {"quick": args.quick, "sao2": run_sao2(args.quick)}
        return write_record(args.out or RESULTS / "sao2.json", record, started)
    state_users = 100_000 if args.quick else 1_000_000
    if args.state_only:
        started = time.perf_counter()
        record = {"quick": args.quick, "state": run_state(state_users, args.quick)}
        print(format_state(record["state"]))
        return write_record(args.out or RESULTS / "state.json", record, started)
    if args.quick:
        users, slots, seeds, big_users, warm, timed, path_slots = 20_000, 100, 2, 50_000, 20, 5, 20
        kafka_slots, kafka_repeats = 20, 2
        pers_users, pers_slots, pers_seeds = 2_000, 1_000, 1
    else:
        users, slots, seeds = 200_000, 800, args.seeds
        big_users, warm, timed, path_slots = 1_000_000, 40, 20, 100
        kafka_slots, kafka_repeats = 100, 5
        pers_users, pers_slots, pers_seeds = 10_000, 10_000, 3

    started = time.perf_counter()
    log("1a. default reproduction: seven mechanisms on Sin, one seed")
    default = default_run(users, slots, progress)
    print(harness.format_table(default))
    print(f"wall time {default['wall_seconds']:.1f} s (data generation included)\n")

    log(f"1b. Table 2 bits per user on Sin and Log, {seeds} seeds")
    t2 = table2(["sin", "log"], users, slots, seeds, progress)
    print(format_table2(t2))

    adapted_seeds = 1 if args.quick else 3
    log(f"1c. adapted stream algorithms (Fig. 11) on LNS, Sin and Log, {adapted_seeds} seed(s)")
    adapted = {
        dataset: fig11.compare(dataset, users, slots, adapted_seeds)
        for dataset in ("lns", "sin", "log")
    }
    print(fig11.format_comparison(adapted))

    log("2. performance")
    perf = {
        "paths": [path_ratio(name, users, path_slots) for name in ("LBU", "LPA")],
        "large_lpa": large_lpa(big_users, 100, warm, timed),
    }
    print(format_perf(perf))

    kafka = None
    if not args.no_kafka:
        log(f"3. Kafka read throughput: flow vs raw consumer, {kafka_repeats} runs each")
        kafka = bench_kafka(
            settings=None,
            dataset="sin",
            users=20_000,
            slots=kafka_slots,
            mechanisms="LBU",
            repeats=kafka_repeats,
            run_flow=run_dataflow,
            progress=progress,
        )
        print("\n" + format_result(kafka))

    personalized = None
    if not args.no_personalized:
        log(f"4. personalized w-event: BD, BA, PBD, PBA, {pers_seeds} seed(s)")
        personalized = {}
        for dataset in ("tlns", "sin", "log"):
            result = harness.bench(
                PERSONALIZED, dataset, pers_users, pers_slots, PERSONALIZED.epsilon,
                PERSONALIZED.window, ["BD", "BA", "PBD", "PBA"], pers_seeds, progress=progress,
            )  # fmt: skip
            amre = {name: r["amre"] for name, r in result["results"].items()}
            result["reductions"] = {
                "PBD_vs_BD": reductions(amre["BD"], amre["PBD"]),
                "PBA_vs_BA": reductions(amre["BA"], amre["PBA"]),
                "paper": {
                    "PBD_vs_BD": PAPER_HEADLINES["PBD/BD real data"],
                    "PBA_vs_BA": PAPER_HEADLINES["PBA/BA synthetic data"],
                },
            }
            personalized[dataset] = result
            print(harness.format_table(result))
            print(f"reductions: {json.dumps(result['reductions'])}\n")

    log("5. hardened randomness: keyed AES-CTR vs PCG64, discrete vs float Laplace")
    noise = bench_noise(users=1_000_000, repeats=3 if args.quick else 7)
    print("\n" + format_noise(noise))

    cgm = None if args.no_cgm else run_cgm(args.quick, progress)

    state = None
    if not args.no_state:
        state = run_state(state_users, args.quick)
        print("\n" + format_state(state))

    dpi = None
    if not args.no_dpi:
        dpi = dpi_bench.run(dpi_bench.QUICK if args.quick else dpi_bench.FULL, log)
        print("\n" + dpi_bench.format_result(dpi))

    reports = None if args.no_reports else run_reports(args.quick, kafka=not args.no_kafka)
    sao2 = None if args.no_sao2 else run_sao2(args.quick)

    record = {
        "quick": args.quick,
        "default": default,
        "table2": t2,
        "adapted": adapted,
        "performance": perf,
        "kafka": kafka,
        "personalized": personalized,
        "noise": noise,
        "cgm": cgm,
        "state": state,
        "dpi": dpi,
        "reports": reports,
        "sao2": sao2,
    }
    return write_record(args.out or RESULTS / "latest.json", record, started)


def run_reports(quick: bool, kafka: bool = True) -> dict[str, Any]:
    """Section 9 (``privstream bench reports``): at the defaults, or ``quick`` at small sizes;
    without ``kafka``, neither the Kafka nor the gateway part (both need the broker)."""
    log("9. ldp-reports throughput: server stage, Kafka, gateway, fleet")
    if quick:
        result = bench_reports(
            None, sizes=(2_000, 10_000), slots=1, kafka_reports=10_000 if kafka else None,
            repeats=1, gateway_modes=[(500, 1), (5_000, 100)] if kafka else [],
            fleet_devices=(1_000, 100),
        )  # fmt: skip
    else:
        result = bench_reports(None, kafka_reports=100_000 if kafka else None,
                               gateway_modes=None if kafka else [])  # fmt: skip
    print("\n" + format_reports(result))
    return result


def write_record(out: Path, record: dict[str, Any], started: float) -> int:
    """Write ``record`` with the creation time, the environment and the total seconds."""
    total = time.perf_counter() - started
    record = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        **record,
        "total_seconds": total,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\ntotal {total:.0f} s; results written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
