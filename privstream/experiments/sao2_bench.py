"""The SaO2 reproduction bench (spec sao2 §8, §11.4–§11.5; issue 24): ``privstream bench
sao2`` and ``make bench`` section 10 (``bench/README.md`` "SaO2").

* **Offline** (``offline_compare``): ``n`` users of the spec's offline synthetic data (§8.1:
  ``s`` distinct uniform coordinates of ``[d']``, uniform signs, exactly ``s`` non-zeros, so
  ExSub runs without stubs), each mechanism's estimate of the mean residue vector, TVE and MAE
  (§8.2: ``Σ|err|`` not halved, ``max|err|``) as means over seeds, beside the analytic ExSub
  (``offline_expected_errors``). Tables 2 and 4 and the d′ / s sweeps of Figs. 3 and 5 are
  grids of it. No post-processing (the paper's Tables 2–4 and Figs. 3, 5).
* **Online** on the hierarchy (``hierarchy_compare``): each user enrolled at one level
  (``assign_levels``, exact shares of ``W``), clipped, encoded, randomised once (ExSub with
  stubs, ``d'_h = d·T_h + s``, or a streamable baseline on ``D_h = d·T_h``), estimated per
  level and rebuilt (``simulate``); TVE/MAE of the ``T`` mean queries, the prefix ranges and
  all ranges (§8.2). Used for Trajectory (Figs. 7–9), Table 3 and Fig. 10.
* **Stock** (Fig. 6, ``stock_compare``): no hierarchy — the ternary mechanisms run on each
  record's 32-day residue vector, and the mean query is the running state, the prefix sums of
  the per-day residue means (spec §8.1, A36).

Substitute data (spec §8.1; the Kaggle sets are not bundled): **Stock** → ``stock_like``, a
log-normal daily random walk per record (volatility uniform in 0.5–3 %) put through the
paper's rule (±1 when the close has moved ≥ 2 % since the last recorded change, the reference
then reset; the first ``s = 6`` non-zeros kept), 160,000 records; **Trajectory** →
``sao2_perf.trajectory_like``, a uniform start cell of the 3×4 grid and 3 moves to uniform
other cells at uniform distinct slots (the spec's ``s = 8`` reading, A26: the initial cell's
+1 and 3 changes, 7 flips), 1,044,693 users; the online synthetic sets are the spec's
(``synthetic_streams``).

Nothing here is a release: the truths and errors are evaluation numbers of a simulation, and
the streams are synthetic. Privacy is each mechanism's (ε-LDP per user over the horizon).
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.experiments import sao2_paper as paper
from privstream.experiments.sao2_perf import sao2_perf, trajectory_like
from privstream.experiments.sao2_report import claims
from privstream.mechanisms.sao2_encoding import (
    QUERY_FAMILIES,
    SaO2Estimate,
    Streams,
    all_ranges,
    analytic_errors,
    assign_levels,
    clip_stream,
    exsub_level_variances,
    level_counts,
    level_G,
    level_lengths,
    level_weights,
    num_levels,
    prefix_sums,
    query_variances,
    residues,
    simulate,
    synthetic_streams,
    true_means,
)
from privstream.mechanisms.sao2_exsub import (
    ExSub,
    distinct_ranks,
    expected_l1,
    expected_max_abs,
    exsub_params,
    offline_expected_errors,
    optimal_m,
)
from privstream.mechanisms.sao2_online_baselines import BASELINES
from privstream.mechanisms.sao2_ternary import Ternary, TernaryMechanism

FloatArray = NDArray[np.float64]
Log = Callable[[str], None]
MECHANISMS: Final = ("ExSub", *BASELINES)
"""ExSub and the ten baselines of spec §6, by the paper's names (the offline plots' set)."""
OPTIMAL: Final = ("ExSub", "Collision", "SUCCINCT", "FutureRand")
"""Tables 2 and 4's mechanisms."""
ONLINE: Final = ("ExSub", "PrivKV", "KVUE", "PCKV-GRR", "PCKV-UE", "EFMRTT", "ToPL", "DDRM")
"""The online plots' set (spec §8.3): ExSub and the streamable baselines."""
STRATEGIES: Final = ("uniform", "calibrated-paper", "optimal-prefix", "optimal-all")
"""Level weights compared in Figs. 9–10: the paper's two, and the spec's ``optimal`` (∝ √G_h)
for prefix and for all ranges (§3.5, A18–A19)."""
TRAJECTORY: Final = {"d": 12, "T": 32, "s": 8, "r": 2, "moves": 3}
STOCK: Final = {"T": 32, "s": 6}


def stderr_log(msg: str) -> None:
    """Progress on stderr, with the wall-clock time (results go to stdout and ``--json``)."""
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# -- metrics, seeds and mechanisms ------------------------------------------------------------


def tve_mae(err: NDArray[Any]) -> tuple[float, float]:
    """``(Σ|err|, max|err|)`` over every entry (spec §8.2: TVE not halved)."""
    a = np.abs(np.asarray(err, dtype=np.float64))
    return float(a.sum()), float(a.max())


def summarise(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per key the mean over runs and ``key_sd``, the sample standard deviation (0 for one run)."""
    out: dict[str, float] = {"runs": float(len(rows))}
    for key in rows[0]:
        values = np.asarray([row[key] for row in rows], dtype=np.float64)
        out[key] = float(values.mean())
        out[f"{key}_sd"] = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return out


def rng_for(seed: int, run: int, tag: str) -> np.random.Generator:
    """The generator of ``tag`` (a mechanism, or ``"data"``/``"levels"``) in run ``run`` of
    ``seed``: independent of which other mechanisms a comparison holds, and of their order."""
    return np.random.default_rng([seed, run, zlib.crc32(tag.encode())])


def check_names(names: Sequence[str], allowed: Sequence[str] = MECHANISMS) -> tuple[str, ...]:
    """``names`` if each is a known mechanism, else ``ValueError`` naming the known ones."""
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise ValueError(f"unknown mechanism(s) {unknown}; choose among {', '.join(allowed)}")
    return tuple(names)


def flat_mechanism(name: str, D: int, s: int, eps: float, *, stubs: bool) -> TernaryMechanism:
    """``name`` on ternary vectors of length ``D``: ExSub over ``d' = D + s`` with stubs
    (``stubs``, at most ``s`` non-zeros) or ``d' = D`` (exactly ``s``), a baseline on ``D``."""
    if name == "ExSub":
        return ExSub(D + s if stubs else D, s, eps)
    return BASELINES[name](D, s, eps)


def level_factory(name: str, s: int, eps: float) -> Callable[[int, int], TernaryMechanism]:
    """``simulate``'s ``mechanism(h, D_h)`` for ``name``: ExSub with stubs, ``m*`` per level."""
    return lambda h, D: flat_mechanism(name, D, s, eps, stubs=True)


# -- offline (spec §8.1 offline synthetic; Tables 2, 4; Figs. 3, 5) ---------------------------


def offline_population(n: int, d_prime: int, s: int, rng: np.random.Generator) -> Ternary:
    """Spec §8.1: each user ``s`` distinct uniform coordinates of ``[d']`` with uniform signs."""
    index = distinct_ranks(d_prime, np.full(n, s, dtype=np.int64), s, rng)
    sign = (2 * rng.integers(0, 2, size=index.shape) - 1).astype(np.int8)
    return Ternary(d_prime, index, sign)


def offline_compare(
    d_prime: int, s: int, eps: float, n: int,
    mechanisms: Sequence[str] = MECHANISMS, seeds: int = 10, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Every mechanism's TVE and MAE of the mean residue vector, mean and sd over ``seeds``
    runs, each on a fresh population shared by all mechanisms; ``analytic``: ExSub's Gaussian
    model (spec §11.4) with ``m*``. No post-processing."""
    names = check_names(mechanisms)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for run in range(seeds):
        batch = offline_population(n, d_prime, s, rng_for(seed, run, "data"))
        truth = batch.mean()
        for name in names:
            mech = flat_mechanism(name, d_prime, s, eps, stubs=False)
            est = mech.estimate(mech.randomize(batch, rng_for(seed, run, name)), n)
            tve, mae = tve_mae(est - truth)
            rows[name].append({"tve": tve, "mae": mae})
    tve, mae = offline_expected_errors(d_prime, s, eps, n)
    return {
        "d_prime": d_prime, "s": s, "eps": eps, "n": n, "seeds": seeds,
        "m": optimal_m(d_prime, s, eps),
        "results": {name: summarise(rows[name]) for name in names},
        "analytic": {"tve": tve, "mae": mae},
    }  # fmt: skip


def offline_grid(
    points: Sequence[tuple[int, int]], eps_grid: Sequence[float], n: int, seeds: int,
    mechanisms: Sequence[str], log: Log, label: str, seed: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """``offline_compare`` at every ``(d', s)`` of ``points`` and every ε."""
    cells = []
    for d_prime, s in points:
        log(f"  {label}: d' = {d_prime}, s = {s}, n = {n:,}, {seeds} seed(s)")
        cells += [offline_compare(d_prime, s, e, n, mechanisms, seeds, seed) for e in eps_grid]
    return cells


# -- Stock (Fig. 6): flat ternary vectors, running-state queries ------------------------------


def stock_like(
    n: int, T: int, s: int, rng: np.random.Generator, threshold: float = 0.02
) -> Ternary:
    """The Stock stand-in (spec §8.1): per record a log-normal daily walk of ``T`` closes
    (daily volatility uniform in [0.5 %, 3 %]) turned into ternary events by the paper's rule
    — ±1 when the close has risen/fallen by ≥ ``threshold`` since the last recorded change
    (the reference then reset to that close; day 0's close is the first reference) — keeping
    the first ``s`` non-zeros."""
    vol = rng.uniform(0.005, 0.03, size=(n, 1))
    closes = np.exp(np.cumsum(rng.standard_normal((n, T)) * vol, axis=1))
    ref, events = np.ones(n), np.zeros((n, T), dtype=np.int8)
    for t in range(T):
        move = closes[:, t] / ref - 1
        events[:, t] = (move >= threshold).astype(np.int8) - (move <= -threshold)
        ref = np.where(events[:, t] != 0, closes[:, t], ref)
    kept = np.cumsum(events != 0, axis=1) <= s
    return Ternary.from_dense(events * kept, s)


def stock_compare(
    batch: Ternary, s: int, eps: float, seeds: int,
    mechanisms: Sequence[str] = ONLINE, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Fig. 6: TVE/MAE of the ``T`` running states ``x_t = Σ_{τ≤t} R̄_τ`` (prefix sums of the
    per-day residue estimates; spec §8.1, A36), ExSub with stubs (``d' = T + s``);
    ``analytic``: ExSub's Gaussian model with each day's non-zero share."""
    names = check_names(mechanisms)
    truth = np.cumsum(batch.mean())
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for run in range(seeds):
        for name in names:
            mech = flat_mechanism(name, batch.D, s, eps, stubs=True)
            est = mech.estimate(mech.randomize(batch, rng_for(seed, run, name)), batch.n)
            tve, mae = tve_mae(np.cumsum(est) - truth)
            rows[name].append({"tve": tve, "mae": mae})
    rows_present, k = np.nonzero(batch.index >= 0)
    freq = np.bincount(batch.index[rows_present, k], minlength=batch.D) / batch.n
    p = exsub_params(batch.D + s, s, eps, optimal_m(batch.D + s, s, eps))
    var = (freq * p.V_nz + (1 - freq) * p.V_z) / batch.n
    flat = batch.D + 1  # a fan-out above T: one level, Algorithm 2 is the running sum
    tve, mae = analytic_errors(batch.D, flat, [var[:, None]], "mean")
    return {
        "eps": eps, "n": batch.n, "seeds": seeds,
        "results": {name: summarise(rows[name]) for name in names},
        "analytic": {"tve": tve, "mae": mae},
    }  # fmt: skip


# -- the hierarchy (Trajectory Figs. 7–9, Table 3, Fig. 10) ----------------------------------


@dataclass(frozen=True)
class Population:
    """Users' streams clipped to ``s`` changes and their true means ``(T, d)`` (evaluation
    only: never published)."""

    streams: Streams
    s: int
    truth: FloatArray
    _frequencies: dict[int, list[FloatArray]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, streams: Streams, s: int) -> Population:
        clipped = clip_stream(streams, s)
        return cls(clipped, s, true_means(clipped))

    def frequencies(self, r: int) -> list[FloatArray]:
        """Per level ``h``, the share of users with a non-zero level-``h`` residue at each
        ``(t', i)``, ``(T_h, d)``: the ``f`` of the analytic model (spec §4.6); kept per ``r``."""
        if r not in self._frequencies:
            out = []
            for h in range(num_levels(self.streams.T, r)):
                batch = residues(self.streams, h, r)
                rows, k = np.nonzero(batch.index >= 0)
                counts = np.bincount(batch.index[rows, k], minlength=batch.D)
                out.append((counts / batch.n).reshape(-1, self.streams.d))
            self._frequencies[r] = out
        return self._frequencies[r]


def family_key(family: str, metric: str) -> str:
    """``tve``/``mae`` for mean queries, ``prefix_tve``, ``all_mae``, … for the ranges."""
    return metric if family == "mean" else f"{family}_{metric}"


def hierarchy_errors(
    est: SaO2Estimate, truth: FloatArray, families: Sequence[str] = QUERY_FAMILIES
) -> dict[str, float]:
    """TVE and MAE of the mean queries ``x̂̄_t``, the prefix ranges ``[1, t₂]`` and all ranges
    ``[t₁, t₂]`` (spec §8.2), keyed by ``family_key``."""
    truth_prefix = prefix_sums(truth)
    out = {}
    for family in families:
        if family == "mean":
            err = est.means - truth
        elif family == "prefix":
            err = est.prefix[1:] - truth_prefix[1:]
        else:
            err = all_ranges(est.prefix) - all_ranges(truth_prefix)
        out[family_key(family, "tve")], out[family_key(family, "mae")] = tve_mae(err)
    return out


def hierarchy_compare(
    pop: Population, r: int, W: Sequence[float] | FloatArray, eps: float, seeds: int,
    mechanisms: Sequence[str] = ONLINE, seed: int = 0,
    families: Sequence[str] = QUERY_FAMILIES,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Every mechanism's errors on the hierarchy with level weights ``W``, mean and sd over
    ``seeds`` runs; each run draws the users' levels afresh (shared by the mechanisms)."""
    names = check_names(mechanisms, ONLINE)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for run in range(seeds):
        levels = assign_levels(pop.streams.n, W, rng_for(seed, run, "levels"))
        for name in names:
            rng = rng_for(seed, run, name)
            est = simulate(pop.streams, pop.s, r, levels, level_factory(name, pop.s, eps), rng)
            rows[name].append(hierarchy_errors(est, pop.truth, families))
    return {name: summarise(rows[name]) for name in names}


def hierarchy_analytic(
    freq: Sequence[FloatArray], pop: Population, r: int, eps: float,
    W: Sequence[float] | FloatArray, families: Sequence[str] = QUERY_FAMILIES,
) -> dict[str, float]:  # fmt: skip
    """ExSub's Gaussian-model errors on the hierarchy (spec §11.5): per level the variance
    ``(f·V_nz + (1−f)·V_z)/n_h`` with the data's ``f`` and ``n_h = level_counts(n, W)``. TVE of
    every family; MAE of the mean queries only (the ranges' maximum is costly and unused)."""
    st = pop.streams
    n_h = level_counts(st.n, W)
    var = exsub_level_variances(st.d, st.T, r, pop.s, eps, n_h, list(freq))
    out = {}
    for family in families:
        sd = np.sqrt(query_variances(st.T, r, var, family))
        out[family_key(family, "tve")] = expected_l1(sd)
        if family == "mean":
            out["mae"] = expected_max_abs(sd)
    return out


def strategy_weights(strategy: str, d: int, T: int, r: int, s: int, eps: float) -> FloatArray:
    """``W`` of a ``STRATEGIES`` entry (spec §3.5). ``optimal-<family>``: ``W_h ∝ √G_h`` with
    ``G_h`` from ExSub's per-coordinate variance at level ``h`` for a user density ``s/d'_h``
    (public parameters only, so the weights are data-independent)."""
    if not strategy.startswith("optimal-"):
        return level_weights(strategy, T, r)
    v = []
    for T_h in level_lengths(T, r):
        d_prime = d * T_h + s
        p = exsub_params(d_prime, s, eps, optimal_m(d_prime, s, eps))
        f = s / d_prime
        v.append(f * p.V_nz + (1 - f) * p.V_z)
    G = level_G(T, r, v, strategy.removeprefix("optimal-"), d)
    return level_weights("optimal", T, r, G)


def online_cells(
    pop: Population, r: int, eps_grid: Sequence[float], seeds: int,
    mechanisms: Sequence[str], log: Log, label: str, seed: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Figs. 7–8: ``hierarchy_compare`` with uniform ``W`` at every ε, with ExSub's analytic
    errors and the reduction against the best competitor per metric."""
    W = level_weights("uniform", pop.streams.T, r)
    freq = pop.frequencies(r)
    cells = []
    for eps in eps_grid:
        log(f"  {label}: ε = {eps}, {len(mechanisms)} mechanisms, {seeds} seed(s)")
        results = hierarchy_compare(pop, r, W, eps, seeds, mechanisms, seed)
        cells.append({"eps": eps, "results": results,
                      "analytic": hierarchy_analytic(freq, pop, r, eps, W)})  # fmt: skip
    return cells


def weights_cells(
    pop: Population, r: int, eps_grid: Sequence[float], seeds: int, log: Log, label: str,
    strategies: Sequence[str] = STRATEGIES, seed: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Figs. 9–10: ExSub's errors under each level-weight strategy, Monte Carlo and analytic."""
    st, freq, cells = pop.streams, pop.frequencies(r), []
    for eps in eps_grid:
        log(f"  {label}: ε = {eps}, {len(strategies)} weightings, {seeds} seed(s)")
        cell: dict[str, Any] = {"eps": eps, "weights": {}, "results": {}, "analytic": {}}
        for strategy in strategies:
            W = strategy_weights(strategy, st.d, st.T, r, pop.s, eps)
            cell["weights"][strategy] = [float(w) for w in W]
            cell["results"][strategy] = hierarchy_compare(
                pop, r, W, eps, seeds, ("ExSub",), seed)["ExSub"]  # fmt: skip
            cell["analytic"][strategy] = hierarchy_analytic(freq, pop, r, eps, W)
        cells.append(cell)
    return cells


def fanout_cells(
    pop: Population, fanouts: Sequence[int], eps_grid: Sequence[float], seeds: int, log: Log,
    seed: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Table 3: ExSub and DDRM on mean queries (uniform ``W``) at each fan-out ``r`` and ε."""
    cells = []
    for r in fanouts:
        W, freq = level_weights("uniform", pop.streams.T, r), pop.frequencies(r)
        log(f"  Table 3: r = {r}, {seeds} seed(s)")
        for eps in eps_grid:
            results = hierarchy_compare(pop, r, W, eps, seeds, ("ExSub", "DDRM"), seed, ("mean",))
            analytic = hierarchy_analytic(freq, pop, r, eps, W, ("mean",))
            cells.append({"r": r, "eps": eps, "results": results, "analytic": analytic})
    return cells


# -- the whole section ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The sizes of one run (``FULL`` for ``make bench``, ``QUICK`` for ``--quick``/tests).

    Seeds are Monte-Carlo runs (the paper averages 100). Per-run spreads (measured): TVE of an
    offline cell ≈ 0.75/√d' of itself; on the hierarchy 6–16 % for mean queries (the coarse
    levels' few residues feed many slots), 12–16 % for ranges, ≈ 14 % for MAE; Stock's
    running-state TVE 40–65 % (its errors accumulate). The counts trade these against time."""

    table2_users: tuple[int, ...] = (10_000, 50_000)  # the caption's n, and the spec's (A27)
    table2_seeds: int = 10
    table4_dims: tuple[int, ...] = (1024, 512)  # the caption's d', and the spec's (A28)
    table4_users: int = 50_000
    table4_seeds: int = 2
    extreme_eps: tuple[float, ...] = paper.EXTREME_EPS
    sweep_users: int = 10_000
    sweep_dims: tuple[int, ...] = (64, 128, 256, 512)
    sweep_sparsity: tuple[int, ...] = (1, 4, 16, 64)
    sweep_eps: tuple[float, ...] = paper.FIG_EPS
    sweep_seeds: int = 3
    stock_users: int = 160_000
    stock_seeds: int = 24
    trajectory_users: int = 1_044_693
    trajectory_seeds: int = 2
    online_eps: tuple[float, ...] = paper.ONLINE_EPS
    fig9_eps: tuple[float, ...] = (0.1, 0.6, 1.5)
    fig9_seeds: int = 1
    fig10_users: int = 100_000
    fig10_eps: tuple[float, ...] = (0.1, 0.6, 1.5)
    fig10_seeds: int = 4
    fanout_users: int = 50_000
    fanout_eps: tuple[float, ...] = paper.FANOUT_EPS
    fanout_seeds: int = 20
    perf_users: int = 1_000_000
    perf_device_users: int = 2_000
    seed: int = 0


FULL: Final = Plan()
QUICK: Final = Plan(
    table2_users=(5_000,), table2_seeds=2, table4_dims=(512,), table4_users=5_000,
    table4_seeds=1, extreme_eps=(1.0, 3.0), sweep_users=5_000, sweep_dims=(64, 256),
    sweep_sparsity=(4, 16), sweep_eps=(1.0,), sweep_seeds=1, stock_users=10_000,
    stock_seeds=2, trajectory_users=20_000, online_eps=(1.0,), fig9_eps=(1.0,),
    fig10_users=5_000, fig10_eps=(1.0,), fig10_seeds=1, fanout_users=5_000, fanout_eps=(1.0,),
    fanout_seeds=1, perf_users=20_000, perf_device_users=50,
)  # fmt: skip


def with_seeds(plan: Plan, seeds: int) -> Plan:
    """``plan`` with every Monte-Carlo seed count set to ``seeds``."""
    counts: dict[str, Any] = {k: seeds for k in asdict(plan) if k.endswith("_seeds")}
    return replace(plan, **counts)


def run_offline(plan: Plan, log: Log) -> dict[str, Any]:
    """Tables 2 and 4 and the sweeps of Figs. 3 and 5."""
    eps, seed = plan.extreme_eps, plan.seed
    log("9a. offline: Table 2 (d' = 128, s = 8) and Table 4 (s = 100)")
    table2 = [
        {"n": n, "d_prime": 128, "s": 8,
         "cells": offline_grid([(128, 8)], eps, n, plan.table2_seeds, OPTIMAL, log, "Table 2",
                               seed)}
        for n in plan.table2_users
    ]  # fmt: skip
    n4 = plan.table4_users
    table4 = [
        {"n": n4, "d_prime": d, "s": 100,
         "cells": offline_grid([(d, 100)], eps, n4, plan.table4_seeds, OPTIMAL, log, "Table 4",
                               seed)}
        for d in plan.table4_dims
    ]  # fmt: skip
    log("9b. offline sweeps: d' (Fig. 3) and s (Fig. 5), all eleven mechanisms")
    n, runs, grid = plan.sweep_users, plan.sweep_seeds, plan.sweep_eps
    dims = [(d, 8) for d in plan.sweep_dims]
    sparsity = [(256, s) for s in plan.sweep_sparsity]
    return {
        "table2": table2,
        "table4": table4,
        "dimension": offline_grid(dims, grid, n, runs, MECHANISMS, log, "Fig. 3", seed),
        "sparsity": offline_grid(sparsity, grid, n, runs, MECHANISMS, log, "Fig. 5", seed),
    }


def run_trajectory(plan: Plan, log: Log) -> dict[str, Any]:
    """Figs. 7–9 on the Trajectory stand-in."""
    tr, seed = TRAJECTORY, plan.seed
    log(f"9d. Trajectory stand-in: {plan.trajectory_users:,} users, d = 12, T = 32, s = 8")
    rng = rng_for(seed, 0, "trajectory")
    pop = Population.of(trajectory_like(plan.trajectory_users, tr["d"], tr["T"], tr["moves"],
                                        rng), tr["s"])  # fmt: skip
    cells = online_cells(pop, tr["r"], plan.online_eps, plan.trajectory_seeds, ONLINE, log,
                         "Figs. 7-8", seed)  # fmt: skip
    fig9 = weights_cells(pop, tr["r"], plan.fig9_eps, plan.fig9_seeds, log, "Fig. 9",
                         seed=seed)  # fmt: skip
    return {"trajectory": cells, "fig9": fig9}


def run_online(plan: Plan, log: Log) -> dict[str, Any]:
    """Stock (Fig. 6), Trajectory (Figs. 7–9), Table 3 and Fig. 10."""
    seed = plan.seed
    log(f"9c. Stock stand-in: {plan.stock_users:,} records, d = 1, T = 32, s = 6, "
        f"{plan.stock_seeds} seed(s)")  # fmt: skip
    batch = stock_like(plan.stock_users, STOCK["T"], STOCK["s"], rng_for(seed, 0, "stock"))
    stock = [stock_compare(batch, STOCK["s"], eps, plan.stock_seeds, ONLINE, seed)
             for eps in plan.online_eps]  # fmt: skip
    out = {"stock": stock, **run_trajectory(plan, log)}
    log("9e. Table 3: fan-out r on synthetic streams (d = 1, T = 128, s = 8)")
    syn = synthetic_streams(plan.fanout_users, 1, 128, 8, rng_for(seed, 0, "table3"))
    out["table3"] = fanout_cells(Population.of(syn, 8), paper.FANOUTS, plan.fanout_eps,
                                 plan.fanout_seeds, log, seed)  # fmt: skip
    log("9f. Fig. 10: level weights on synthetic streams (d = 8, T = 128, s = 20)")
    syn = synthetic_streams(plan.fig10_users, 8, 128, 20, rng_for(seed, 0, "fig10"))
    out["fig10"] = weights_cells(Population.of(syn, 20), 2, plan.fig10_eps, plan.fig10_seeds,
                                 log, "Fig. 10", seed=seed)  # fmt: skip
    return out


def run(plan: Plan = FULL, log: Log = stderr_log) -> dict[str, Any]:
    """The whole reproduction and the performance figures, then the §8.4 claims; a dict of
    plain numbers (JSON-ready)."""
    out: dict[str, Any] = {"plan": asdict(plan)}
    out.update(run_offline(plan, log))
    out.update(run_online(plan, log))
    log(f"9g. performance: n = {plan.perf_users:,}, d = 12, T = 32 (Trajectory setting)")
    out["performance"] = sao2_perf(n=plan.perf_users, device_users=plan.perf_device_users)
    out["claims"] = claims(out)
    return out
