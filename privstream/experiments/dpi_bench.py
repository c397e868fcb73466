"""DPI's reproduction and performance bench (spec ``dpi.md`` §8.4 H1–H10, issue 22):
``make bench`` section 8 and ``bench/README.md`` "DPI".

Engine-free like ``experiments.harness``: every slot's population values go through the
``cdp`` port (``SimulatedCurator``, everyone registered with the stream default) and each
mechanism's pure ``step`` with ``SlotRandomness(seed, stream, t, scope=name)``, through the
shared step driver, so the releases are the family's dataflow's. Unlike the generic harness it
keeps each release's ``query`` key, so errors are computed **per query** against that query's
own truth (spec §8.2): ``y_acc`` the accumulated counts normalised, ``y_inst`` the slot's PDF
(uniform for an empty slot), both computed here from the values, never from the mechanism.

Metrics (§8.2, A25, A27): MSE (per-bin mean), SSE and KL(y‖R̃) with R̃ = max(R, 1e-12)
renormalised; averaged over the slots that answered the query, and at its last answered slot.
Nothing here is a release: the truths and errors are evaluation numbers of a benchmark.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.connectors.dpi_synthetic import DpiSynthetic
from privstream.families.registry import family
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import Release, Slot
from privstream.mechanisms.dpi_pool import SynopsisPool, shared_pool
from privstream.mechanisms.dpi_rba import Alg3State, Alg4State, draw
from privstream.mechanisms.driver import Lane, drive_slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

FloatArray = NDArray[np.float64]
KL_FLOOR: Final = 1e-12
"""§8.2: R̃ = max(R, 1e-12), renormalised, so KL(y‖R̃) is finite."""
BASELINES: Final = ("DPI-uniform", "DPI-prior")
"""B1 (uniform release, 0-DP) and B2 (α ≡ 0, the pool prior; spec §7)."""
EPSILONS: Final = (0.1, 0.5, 1.0, 2.0, 10.0)
"""H1's budgets (spec §8.3: ε ∈ [0.1, 10])."""
SPEC_REMAINING: Final = {
    (2.0, 0.05, 0.1): (1.056, 0.666, 0.510, 0.306),
    (10.0, 0.05, 0.1): (4.018, 1.803, 1.094, 0.445),
    (2.0, 0.1, 0.2): (0.846, 0.406, 0.257, 0.110),
    (10.0, 0.3, 0.5): (0.444, 0.082, 0.041, 0.015),
    (2.0, 0.5, 1.0): (0.133, 0.025, 0.012, 0.0045),
}
"""Spec §3.5: the remaining nominal budget under Algorithm 4 (budget_exact) after
100, 500, 1000 and 2700 slots, means over 5 seeds of the spec author's prototype (±~5 %)."""
SPEC_REMAINING_SLOTS: Final = (100, 500, 1000, 2700)


def dpi_family() -> Any:
    """The registered DPI family entry."""
    return family("dpi")


def available(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The mechanisms of ``names`` the DPI family has, and those it lacks (skipped, named)."""
    have = set(dpi_family().mechanisms)
    return [n for n in names if n in have], [n for n in names if n not in have]


# --- metrics --------------------------------------------------------------------------------


def errors(estimate: FloatArray, truth: FloatArray) -> tuple[float, float, float]:
    """(MSE per bin, SSE, KL(y‖R̃)) of one release ``estimate`` against its truth (§8.2)."""
    r, y = np.asarray(estimate, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    sq = (r - y) ** 2
    floor = np.maximum(r, KL_FLOOR)
    floor = floor / floor.sum()
    pos = y > 0
    kl = float(np.sum(y[pos] * np.log(y[pos] / floor[pos])))
    return float(sq.mean()), float(sq.sum()), kl


@dataclass
class QueryScores:
    """One query's errors over the slots that answered it."""

    mse: list[float] = field(default_factory=list)
    sse: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)

    def add(self, estimate: FloatArray, truth: FloatArray) -> None:
        mse, sse, kl = errors(estimate, truth)
        self.mse.append(mse)
        self.sse.append(sse)
        self.kl.append(kl)

    def summary(self) -> dict[str, float]:
        """Means over the answered slots and the last answered slot's values (A25)."""
        if not self.mse:
            return {"slots": 0}
        return {
            "slots": len(self.mse),
            "mse": float(np.mean(self.mse)),
            "sse": float(np.mean(self.sse)),
            "kl": float(np.mean(self.kl)),
            "mse_last": self.mse[-1],
            "kl_last": self.kl[-1],
        }


# --- the engine-free driver -----------------------------------------------------------------


@dataclass
class Trace:
    """What one mechanism did over a run: per-query scores, step seconds, final state."""

    scores: dict[str, QueryScores] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    state: Any = None


def build_lanes(
    names: Sequence[str], source: Any, epsilon: float, **options: Any,
) -> dict[str, Lane]:  # fmt: skip
    """One lane per mechanism, built from the family's config of ``options``."""
    fam = dpi_family()
    config = fam.make_config(epsilon=epsilon, window=1, population=source.users,
                             task=FrequencyTask(source.d), **options)  # fmt: skip
    lanes = {}
    for name in names:
        mech = fam.build(name, config)  # mechanisms of one pool descriptor share it
        lanes[name] = Lane(mech, mech.initial_state(), mech.client_state())
    return lanes


def truths(values: NDArray[np.int64], k: int, accumulated: NDArray[np.int64]) -> dict[str, Any]:
    """The slot's true answers: ``acc`` (accumulated counts normalised; ``accumulated`` is
    advanced in place), ``inst`` (the slot's PDF), uniform when empty (§3.1)."""
    counts = np.bincount(values[values >= 0], minlength=k)
    accumulated += counts

    def pdf(h: NDArray[np.int64]) -> FloatArray:
        total = float(h.sum())
        return np.full(k, 1.0 / k) if total <= 0 else h / total

    return {"acc": pdf(accumulated), "inst": pdf(counts)}


def _curator(values: NDArray[np.int64], task: FrequencyTask,
             requirements: Requirements) -> Callable[[str, Any, Any], SimulatedCurator]:  # fmt: skip
    """The ``cdp`` port of every mechanism at one slot (everyone registered)."""
    return lambda _name, _randomness, _clients: SimulatedCurator(values, task, requirements)


def drive(
    names: Sequence[str], source: Any, epsilon: float, seed: int, *,
    slots: int | None = None,
    **options: Any,
) -> dict[str, Trace]:  # fmt: skip
    """Run ``names`` in lockstep over ``source`` (its first ``slots`` slots) and score every
    release against the truth of the query its ``key`` names."""
    lanes = build_lanes(names, source, epsilon, **options)
    traces = {name: Trace() for name in names}
    k, stream = source.d, source.name
    accumulated = np.zeros(k, dtype=np.int64)
    requirements = Requirements(population=source.users)
    task = FrequencyTask(k)
    for t in range(1, (slots or source.slots) + 1):
        values = source.values(t)
        truth = truths(values, k, accumulated)
        step = drive_slot(
            lanes, stream, t,
            _curator(values, task, requirements),
            lambda name: SlotRandomness(seed, stream, t, scope=name),  # noqa: B023
            halt_failures=False,
        )  # fmt: skip
        for name, stepped in step.stepped.items():
            lanes[name].state = stepped.state
            release = next(e for e in stepped.events if isinstance(e, Release))
            query = dict(release.key).get("query", "inst")
            trace = traces[name]
            trace.scores.setdefault(query, QueryScores()).add(np.asarray(release.estimate),
                                                              truth[query])  # fmt: skip
            trace.queries.append(query)
            trace.seconds.append(stepped.seconds)
    for name, lane in lanes.items():
        traces[name].state = lane.state
    return traces


def weight_movement(state: Any) -> dict[str, float] | None:
    """How far a ``DPI-paper`` state's P_A rows moved from uniform: the largest log-ratio
    ``max_a L_A − min_a L_A`` over rows and the largest ``|N·P_A(a) − 1|`` (relative deviation
    from uniform); None for the other modes (their priors are not log-weights)."""
    if getattr(state, "mechanism", None) != "DPI-paper":
        return None
    logs = np.asarray(state.synopsis_prior, dtype=np.float64)
    spread = float(np.max(logs.max(axis=1) - logs.min(axis=1)))
    z = np.exp(logs - logs.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    deviation = float(np.max(np.abs(p * logs.shape[1] - 1.0)))
    return {"log_ratio": spread, "max_rel_dev": deviation}


# --- experiments ----------------------------------------------------------------------------

Cell = dict[str, dict[str, dict[str, list[float]]]]
"""mechanism → query → metric → one value per seed."""


def cell(
    names: Sequence[str], make_source: Callable[[int], Any], epsilon: float, seeds: int,
    slots: int | None = None, **options: Any,
) -> tuple[Cell, dict[str, Any]]:  # fmt: skip
    """Run ``names`` on seeds ``1..seeds`` (the source of seed s from ``make_source(s)``):
    each query's mean MSE, SSE, KL and last-slot values per seed, the mean step seconds and
    each mechanism's largest weight movement (``weight_movement``) over the seeds."""
    out: Cell = {name: {} for name in names}
    extra: dict[str, Any] = {name: {"seconds": [], "weights": None} for name in names}
    for seed in range(1, seeds + 1):
        source = make_source(seed)
        for name, trace in drive(names, source, epsilon, seed, slots=slots, **options).items():
            for query, scores in trace.scores.items():
                per = out[name].setdefault(query, {})
                for metric, value in scores.summary().items():
                    per.setdefault(metric, []).append(float(value))
            extra[name]["seconds"].append(float(np.mean(trace.seconds)))
            moved = weight_movement(trace.state)
            if moved is not None:
                old = extra[name]["weights"] or {k: 0.0 for k in moved}
                extra[name]["weights"] = {k: max(old[k], v) for k, v in moved.items()}
    return out, extra


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def summarise(raw: Cell, reference: str | None = "DPI-prior") -> dict[str, Any]:
    """Per mechanism and query: mean and seed-to-seed sd of MSE and KL, and the per-seed
    difference to ``reference`` (B2) with its sd: a difference within ~2 sd/√seeds of 0 is
    no measurable effect of boosting."""
    out: dict[str, Any] = {}
    for name, queries in raw.items():
        out[name] = {}
        for query, metrics in queries.items():
            row: dict[str, float] = {}
            for metric in ("mse", "kl", "sse", "mse_last", "kl_last"):
                row[metric], row[f"{metric}_sd"] = mean_sd(metrics[metric])
            ref = raw.get(reference or "", {}).get(query) if name != reference else None
            if ref is not None:
                for metric in ("mse", "kl"):
                    diff = np.subtract(metrics[metric], ref[metric])
                    row[f"{metric}_vs_b2"], row[f"{metric}_vs_b2_sd"] = mean_sd(list(diff))
            out[name][query] = row
    return out


def synthetic(users: int, slots: int, k: int = 100) -> Callable[[int], DpiSynthetic]:
    """§6.4's dynamic stream (mean 100 capped at users/(1.25k)) for a seed."""
    return lambda seed: DpiSynthetic(users, slots, seed, k=k)


def h1(
    names: Sequence[str], users: int, slots: int, seeds: int,
    epsilons: Sequence[float] = EPSILONS, rba: str = "alg3",
) -> dict[str, Any]:  # fmt: skip
    """H1: MSE and KL per query against ε for ``names`` (DPI, DPI-paper and the baselines)."""
    out: dict[str, Any] = {}
    for eps in epsilons:
        raw, extra = cell(names, synthetic(users, slots), eps, seeds, rba=rba)
        out[str(eps)] = {"scores": summarise(raw), "extra": extra}
    return out


def weights_table(users: int, slots: int) -> list[dict[str, Any]]:
    """The spec's §9 prediction: DPI-paper's L_A rows after ``slots`` slots at ε = 2,
    μ = 0.05, for both RBA variants and both series, against the bound με/(4Δ_Q) on the
    log-ratio (×4 for paper_thm54)."""
    rows = []
    for rba in ("alg3", "alg4"):
        for mode in ("budget_exact", "paper_thm54"):
            _, extra = cell(["DPI-paper"], synthetic(users, slots), 2.0, 1, rba=rba,
                            eta_mode=mode)  # fmt: skip
            bound = 0.05 * 2.0 / (4 * 2.0) * (4 if mode == "paper_thm54" else 1)
            rows.append({"rba": rba, "eta_mode": mode, "slots": slots,
                         **extra["DPI-paper"]["weights"], "bound": bound,
                         "bound_rel_dev": math.expm1(bound)})  # fmt: skip
    return rows


BOUNDED_SETTINGS: Final = ((50.0, 0.1), (1000.0, 0.005))
"""(N₀, ζ) of the bounded runs: ζ shrinks with Δ_Q = 2/(N₀+1) so that ε = 10 stays feasible
(the series needs ε < (π²/6)·Δ_Q/(μζ), §3.3)."""


def bounded(users: int, slots: int, seeds: int) -> dict[str, Any]:
    """What ``sensitivity_mode = bounded`` (§3.11-B, a public prior of mass N₀, queries inst)
    changes against ``unbounded`` on the same inst-only query pool, at ε = 2 and 10, under
    Algorithm 4 (under Algorithm 3 every step is ~1e-9, H1)."""
    names, _ = available(["DPI", "DPI-paper", *BASELINES])
    out: dict[str, Any] = {}
    runs: list[tuple[str, dict[str, Any]]] = [("unbounded", {})]
    runs += [(f"bounded N0={n0:g} zeta={zeta:g}",
              {"sensitivity_mode": "bounded", "prior_mass": n0, "zeta": zeta})
             for n0, zeta in BOUNDED_SETTINGS]  # fmt: skip
    for eps in (2.0, 10.0):
        for label, opts in runs:
            raw, extra = cell(names, synthetic(users, slots), eps, seeds, queries=("inst",),
                              rba="alg4", **opts)  # fmt: skip
            out[f"ε={eps:g} {label}"] = {"scores": summarise(raw), "extra": extra}
    return out


def h2(users: int, slots: int, seeds: int) -> dict[str, Any]:
    """H2: one-at-a-time sweeps of λ, μ and ζ at ε = 2 around the defaults (λ 0.2, μ 0.05,
    ζ 0.1), DPI and DPI-paper beside B2 (which ignores them)."""
    sweeps = {"lam": (0.05, 0.2, 0.5, 0.7), "mu": (0.05, 0.1, 0.3), "zeta": (0.05, 0.1, 0.5)}
    out: dict[str, Any] = {}
    for param, grid in sweeps.items():
        for value in grid:
            raw, _ = cell(["DPI", "DPI-paper", "DPI-prior"], synthetic(users, slots), 2.0,
                          seeds, None, **{param: value})  # fmt: skip
            out[f"{param}={value}"] = summarise(raw)
    return out


def remaining_budget(
    epsilon: float, mu: float, zeta: float, rba: str, slots: Sequence[int], seeds: int
) -> list[float]:
    """H7: the nominal budget left after each of ``slots`` RBA draws (budget_exact), mean
    over ``seeds`` seeds (the mechanism spends exactly the drawn ε_t while ε_t fits)."""
    from privstream.mechanisms.dpi_series import BudgetSeries

    series = BudgetSeries(epsilon, mu, zeta, 2.0, "budget_exact", False)
    left = np.zeros(len(slots))
    for seed in range(1, seeds + 1):
        state = Alg3State(series) if rba == "alg3" else Alg4State(series)
        spent, marks = 0.0, dict.fromkeys(slots, 0.0)
        for t in range(1, max(slots) + 1):
            spent += draw(state, np.random.default_rng([seed, t])).epsilon
            if t in marks:
                marks[t] = spent
        left += np.array([epsilon - marks[s] for s in slots])
    return list(left / seeds)


def h7(seeds: int, slots: Sequence[int] = SPEC_REMAINING_SLOTS) -> list[dict[str, Any]]:
    """H7 for every row of the spec's §3.5 table (Algorithm 4) and for Algorithm 3."""
    rows = []
    for (eps, mu, zeta), spec in SPEC_REMAINING.items():
        for rba in ("alg4", "alg3"):
            measured = remaining_budget(eps, mu, zeta, rba, slots, seeds)
            rows.append({"epsilon": eps, "mu": mu, "zeta": zeta, "rba": rba,
                         "slots": list(slots), "remaining": measured,
                         "spec": list(spec) if rba == "alg4" else None})  # fmt: skip
    return rows


LONG_NAMES: Final = ("DPI", "DPI-paper", "DPI-prior")


def _windows(scores: QueryScores, parts: int = 4) -> dict[str, list[float]]:
    """Mean MSE and KL over ``parts`` consecutive stretches of the answered slots (stability)."""
    out: dict[str, list[float]] = {}
    for metric in ("mse", "kl"):
        chunks = np.array_split(np.asarray(getattr(scores, metric)), parts)
        out[metric] = [float(c.mean()) if c.size else float("nan") for c in chunks]
    return out


def h8(users: int, budget_s: float, max_slots: int, probe: int = 10) -> dict[str, Any]:
    """H8 at k = 10,000: time ``probe`` slots, then run as many slots as ``budget_s`` allows
    (at most ``max_slots``), report MSE/KL per quarter of the run and extrapolate the paper's
    200,000 slots from the measured seconds per slot."""
    started = time.perf_counter()
    drive(LONG_NAMES, DpiSynthetic(users, probe, 99, k=10_000), 2.0, 99)
    pool_s = time.perf_counter() - started
    started = time.perf_counter()
    drive(LONG_NAMES, DpiSynthetic(users, probe, 98, k=10_000), 2.0, 98)
    per_slot = (time.perf_counter() - started) / probe
    slots = int(max(probe, min(max_slots, budget_s // per_slot)))
    started = time.perf_counter()
    traces = drive(LONG_NAMES, DpiSynthetic(users, slots, 1, k=10_000), 2.0, 1)
    wall = time.perf_counter() - started
    out: dict[str, Any] = {"k": 10_000, "users": users, "slots": slots, "epsilon": 2.0,
                           "wall_s": wall, "wall_per_slot_s": wall / slots,
                           "first_run_incl_pool_s": pool_s, "mechanisms": {}}  # fmt: skip
    for name, trace in traces.items():
        step = float(np.mean(trace.seconds))
        out["mechanisms"][name] = {
            "step_s": step, "extrapolated_200k_h": step * 200_000 / 3600,
            "queries": {q: {**s.summary(), "quarters": _windows(s)}
                        for q, s in trace.scores.items()},
        }  # fmt: skip
    out["extrapolated_200k_all_h"] = wall / slots * 200_000 / 3600
    return out


H10_SETS: Final = (1, 5, 10)
H10_EPSILONS: Final = (0.1, 2.0, 10.0)


def h10(users: int, slots: int) -> list[dict[str, Any]]:
    """H10 scaled down: k ∈ {1,000, 10,000}, sets j ∈ ``H10_SETS`` (variance j², mean 1,000
    capped at users/(1.25k)), ε ∈ ``H10_EPSILONS``, ``slots`` slots, one seed; DPI beside B2."""
    rows: list[dict[str, Any]] = []
    for k in (1_000, 10_000):
        for j in H10_SETS:
            for eps in H10_EPSILONS:
                source = DpiSynthetic(users, slots, 1, k=k, mean=1000.0, variance=float(j * j),
                                      name=f"dynamic-{j}")  # fmt: skip
                traces = drive(["DPI", "DPI-prior"], source, eps, 1)
                rows.append({"k": k, "set": j, "epsilon": eps, **{
                    name: {q: s.summary() for q, s in trace.scores.items()}
                    for name, trace in traces.items()}})  # fmt: skip
    return rows


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def _profile(mech: Any, state: Any, slot: Callable[[], Slot]) -> list[dict[str, Any]]:
    """The functions where one step's time goes (cProfile, cumulative, top 10)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    one = slot()
    prof.enable()
    mech.step(state, one)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_, calls, _tt, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{file.rsplit('/', 1)[-1]}:{line}:{fn}", "calls": calls,
                     "cumulative_s": cum})  # fmt: skip
    return sorted(rows, key=lambda r: -r["cumulative_s"])[:12]


def performance(users: int, k: int = 10_000, repeats: int = 5) -> dict[str, Any]:
    """One slot at k categories with the default pool (N = 6,500, n_A = 20) and ~10⁶ records
    (mean 100 per category over ``users`` users): pool construction, port construction and the
    curator's histogram, then each mechanism's ``step`` (median of ``repeats``, a fresh port
    each time, so the histogram is inside), the pickled state's bytes and the pickle pause."""
    source = DpiSynthetic(users, 2, 1, k=k, mean=100.0)
    values = [source.values(1), source.values(2)]
    records = int((values[1] >= 0).sum())
    shared_pool.cache_clear()  # time the build, not an earlier section's cached pool
    started = time.perf_counter()
    pool = shared_pool(k, k, 6500, 0)  # the mechanisms below find it in the cache
    out: dict[str, Any] = {"k": k, "users": users, "records": records, "pool_size": 6500,
                           "synopses": 20, "pool_build_s": time.perf_counter() - started,
                           "pool_bytes": pool.nbytes, "mechanisms": {}}  # fmt: skip
    requirements, task = Requirements(population=users), FrequencyTask(k)
    out["port_s"] = _median_time(lambda: SimulatedCurator(values[1], task, requirements), repeats)
    out["histogram_s"] = _median_time(
        lambda: SimulatedCurator(values[1], task, requirements).class_histogram(2.0, 1), repeats
    )
    for name in LONG_NAMES:
        out["mechanisms"][name] = _perf_one(name, pool, values, users, repeats)
    dpi = dpi_family().build("DPI", _perf_config(users, k))
    warm = dpi.step(dpi.initial_state(), _perf_slot(values[0], 1, "DPI", users, k))[0]
    out["profile_DPI"] = _profile(dpi, warm, lambda: _perf_slot(values[1], 2, "DPI", users, k))
    return out


def _perf_config(users: int, k: int) -> Any:
    return dpi_family().make_config(epsilon=2.0, window=1, population=users,
                                    task=FrequencyTask(k))  # fmt: skip


def _perf_slot(values: NDArray[np.int64], t: int, name: str, users: int, k: int) -> Slot:
    port = SimulatedCurator(values, FrequencyTask(k), Requirements(population=users))
    return Slot("perf", t, port, SlotRandomness(1, "perf", t, scope=name))


def _perf_one(name: str, pool: SynopsisPool, values: list[Any], users: int,
              repeats: int) -> dict[str, Any]:  # fmt: skip
    """One mechanism's warm step time, state bytes and pickle/unpickle pauses."""
    k = pool.k
    mech = dpi_family().build(name, _perf_config(users, k))
    state = mech.step(mech.initial_state(), _perf_slot(values[0], 1, name, users, k))[0]
    step_s = _median_time(lambda: mech.step(state, _perf_slot(values[1], 2, name, users, k)),
                          repeats)  # fmt: skip
    after = mech.step(state, _perf_slot(values[1], 2, name, users, k))[0]
    blob = pickle.dumps(after, protocol=pickle.HIGHEST_PROTOCOL)
    return {
        "step_s": step_s,
        "state_bytes": len(blob),
        "pickle_s": _median_time(lambda: pickle.dumps(after, pickle.HIGHEST_PROTOCOL), repeats),
        "unpickle_s": _median_time(lambda: pickle.loads(blob), repeats),
    }


def privacy_loss() -> dict[str, Any]:
    """H9: Table 3's analogue (``experiments.dpi_privacy_loss``: event-level baselines'
    user-level loss through dp-accounting, against DPI's series spend) and its text."""
    from privstream.experiments import dpi_privacy_loss as loss

    result = loss.privacy_loss()
    return {"entry": "privacy_loss", "result": result, "text": loss.format_privacy_loss(result)}


# --- the whole section and its text ---------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The sizes of one bench run (``QUICK`` for ``--quick``, ``FULL`` for ``make bench``)."""

    users: int = 20_000
    slots: int = 300
    seeds: int = 3
    sweep_slots: int = 200
    sweep_seeds: int = 2
    h7_seeds: int = 5
    h8_users: int = 125_000
    h8_budget_s: float = 120.0
    h8_max_slots: int = 1_500
    h10_users: int = 125_000
    h10_slots: int = 30
    perf_users: int = 1_250_000


FULL: Final = Plan()
QUICK: Final = Plan(slots=40, seeds=1, sweep_slots=30, sweep_seeds=1, h7_seeds=2,
                    h8_users=25_000, h8_budget_s=5.0, h8_max_slots=20, h10_users=25_000,
                    h10_slots=3, perf_users=250_000)  # fmt: skip


def run(plan: Plan = FULL, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every DPI experiment of ``plan``; a dict of plain numbers (JSON-ready)."""
    names, missing = available(["DPI", "DPI-paper", *BASELINES])
    out: dict[str, Any] = {"plan": plan.__dict__, "mechanisms": names, "missing": missing}
    log(f"8a. H1: MSE/KL against ε, {plan.seeds} seed(s) × {plan.slots} slots, k = 100")
    out["h1"] = {rba: h1(names, plan.users, plan.slots, plan.seeds, rba=rba)
                 for rba in ("alg3", "alg4")}  # fmt: skip
    out["weights"] = weights_table(plan.users, plan.slots)
    log("8b. bounded sensitivity (queries inst, Alg. 4)")
    out["bounded"] = bounded(plan.users, plan.slots, plan.seeds)
    log("8c. H2: λ, μ, ζ sweeps at ε = 2")
    out["h2"] = h2(plan.users, plan.sweep_slots, plan.sweep_seeds)
    log("8d. H7: remaining nominal budget (spec §3.5)")
    out["h7"] = h7(plan.h7_seeds)
    log(f"8e. H8: long run at k = 10,000 (~{plan.h8_budget_s:.0f} s of slots)")
    out["h8"] = h8(plan.h8_users, plan.h8_budget_s, plan.h8_max_slots)
    out["h9"] = privacy_loss()
    log(f"8f. H10 scaled: k ∈ {{1,000, 10,000}} × sets {H10_SETS} × ε {H10_EPSILONS}")
    out["h10"] = h10(plan.h10_users, plan.h10_slots)
    log(f"8g. performance: one slot at k = 10,000, {plan.perf_users:,} users")
    out["performance"] = performance(plan.perf_users)
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def _pm(row: Mapping[str, float], metric: str) -> str:
    return f"{row[metric]:.3g}±{row[metric + '_sd']:.1g}"


def format_h1(result: Mapping[str, Any]) -> list[str]:
    lines = ["H1 (k = 100, mean ± seed sd; Δ vs B2 = mean per-seed difference ± sd)"]
    for rba, by_eps in result["h1"].items():
        lines.append(f"  rba = {rba}")
        lines.append(f"  {'ε':>5} {'mechanism':<12} {'q':<5} {'MSE':>16} {'KL':>16} "
                     f"{'ΔMSE vs B2':>18} {'ΔKL vs B2':>18}")  # fmt: skip
        for eps, cellres in by_eps.items():
            for name, queries in cellres["scores"].items():
                for q, row in sorted(queries.items()):
                    diff = (f"{_pm(row, 'mse_vs_b2'):>18} {_pm(row, 'kl_vs_b2'):>18}"
                            if "mse_vs_b2" in row else "")  # fmt: skip
                    lines.append(f"  {eps:>5} {name:<12} {q:<5} {_pm(row, 'mse'):>16} "
                                 f"{_pm(row, 'kl'):>16} {diff}")  # fmt: skip
    return lines


def format_weights(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["DPI-paper's L_A after the run (ε = 2, μ = 0.05): largest row log-ratio and "
             "largest |N·P_A − 1|, against the bound με/(4Δ_Q) (×4 for paper_thm54)"]  # fmt: skip
    for r in rows:
        lines.append(f"  {r['rba']} {r['eta_mode']:<13} {r['slots']} slots: log-ratio "
                     f"{r['log_ratio']:.3g} (bound {r['bound']:.3g}), max rel. dev. "
                     f"{r['max_rel_dev']:.3g} (bound {r['bound_rel_dev']:.3g})")  # fmt: skip
    return lines


def format_bounded(result: Mapping[str, Any]) -> list[str]:
    lines = ["sensitivity_mode bounded vs unbounded, queries inst, Alg. 4 (truth: the raw "
             "slot PDF)"]  # fmt: skip
    for key, res in result.items():
        for name, queries in res["scores"].items():
            row = queries["inst"]
            moved = res["extra"][name]["weights"]
            extra = f"  L_A log-ratio {moved['log_ratio']:.3g}" if moved else ""
            lines.append(f"  {key:<32} {name:<12} MSE {_pm(row, 'mse')}  KL {_pm(row, 'kl')}"
                         f"{extra}")  # fmt: skip
    return lines


def format_h2(result: Mapping[str, Any]) -> list[str]:
    lines = ["H2 (ε = 2; MSE / KL per query; B2 for reference)"]
    for setting, scores in result.items():
        cells = []
        for name, queries in scores.items():
            part = " ".join(f"{q}:{_g(r['mse'])}/{_g(r['kl'])}" for q, r in sorted(queries.items()))
            cells.append(f"{name} {part}")
        lines.append(f"  {setting:<10} " + " | ".join(cells))
    return lines


def format_h7(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["H7 remaining nominal budget after 100 / 500 / 1000 / 2700 slots (spec §3.5: Alg. 4)"]
    for r in rows:
        spec = " / ".join(_g(x) for x in r["spec"]) if r["spec"] else "—"
        got = " / ".join(_g(x) for x in r["remaining"])
        lines.append(f"  ε={r['epsilon']:<4} μ={r['mu']:<4} ζ={r['zeta']:<4} {r['rba']}: "
                     f"{got}   (spec {spec})")  # fmt: skip
    return lines


def format_h8(r: Mapping[str, Any]) -> list[str]:
    lines = [f"H8 k = 10,000, {r['users']:,} users, {r['slots']} slots in {r['wall_s']:.0f} s "
             f"({r['wall_per_slot_s'] * 1e3:.0f} ms/slot all mechanisms and data): 200,000 slots "
             f"would take ≈ {r['extrapolated_200k_all_h']:.1f} h"]  # fmt: skip
    for name, m in r["mechanisms"].items():
        for q, s in sorted(m["queries"].items()):
            quarters = " ".join(_g(x) for x in s["quarters"]["kl"])
            lines.append(f"  {name:<10} {q:<5} MSE {_g(s['mse'])} KL {_g(s['kl'])}; KL by "
                         f"quarter {quarters}")  # fmt: skip
        lines.append(f"  {name:<10} step {m['step_s'] * 1e3:.1f} ms → 200,000 slots ≈ "
                     f"{m['extrapolated_200k_h']:.2f} h")  # fmt: skip
    return lines


def format_h10(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["H10 scaled (one seed): MSE / KL of q_acc and q_inst, DPI | B2"]
    for r in rows:
        cells = []
        for name in ("DPI", "DPI-prior"):
            cells.append(" ".join(f"{q}:{_g(s['mse'])}/{_g(s['kl'])}"
                                  for q, s in sorted(r[name].items()) if s.get("slots")))  # fmt: skip
        lines.append(f"  k={r['k']:<6} set {r['set']:<2} ε={r['epsilon']:<4} " + " | ".join(cells))
    return lines


def format_performance(p: Mapping[str, Any]) -> list[str]:
    lines = [f"performance: one slot, k = {p['k']:,}, {p['records']:,} records of "
             f"{p['users']:,} users, N = {p['pool_size']:,}, n_A = {p['synopses']}",
             f"  pool construction {p['pool_build_s']:.2f} s ({p['pool_bytes'] / 1e6:.0f} MB, "
             "once per process, never snapshotted)",
             f"  port {p['port_s'] * 1e3:.2f} ms; curator histogram (inside the step) "
             f"{p['histogram_s'] * 1e3:.1f} ms"]  # fmt: skip
    for name, m in p["mechanisms"].items():
        flag = "meets" if m["step_s"] < 0.1 else "MISSES"
        lines.append(f"  {name:<10} step {m['step_s'] * 1e3:.1f} ms ({flag} < 100 ms); state "
                     f"{m['state_bytes']:,} B pickled; pickle {m['pickle_s'] * 1e6:.0f} µs, "
                     f"unpickle {m['unpickle_s'] * 1e6:.0f} µs")  # fmt: skip
    top = ", ".join(f"{r['function']} {r['cumulative_s'] * 1e3:.1f} ms"
                    for r in p["profile_DPI"][2:7])  # fmt: skip
    lines.append(f"  DPI step profile (cumulative): {top}")
    return lines


def format_result(result: Mapping[str, Any]) -> str:
    """The whole DPI section as text."""
    lines = [f"mechanisms: {', '.join(result['mechanisms'])}"]
    if result["missing"]:
        lines.append(f"skipped (not in this build): {', '.join(result['missing'])}")
    lines += format_h1(result) + format_weights(result["weights"])
    lines += format_bounded(result["bounded"]) + format_h2(result["h2"])
    lines += format_h7(result["h7"]) + format_h8(result["h8"])
    h9 = result["h9"]
    lines.append(f"H9 privacy loss: {h9 if isinstance(h9, str) else h9.get('text') or h9['entry']}")
    lines += format_h10(result["h10"]) + format_performance(result["performance"])
    return "\n".join(lines)
