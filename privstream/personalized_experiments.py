"""Reproduction harness of personalized w-event privacy (spec personalized-w-event §6).

Engine-free, like ``privstream.experiments``: for every slot ``t = 1..T`` it builds the slot's
``SimulatedCurator`` (trust mode ``cdp``, design §4) over the population's values and the
stream's ``Requirements``, and calls each mechanism's pure ``step`` with
``SlotRandomness(seed, stream, t, scope=mechanism)``. The curator draws nothing, so one curator
per slot serves every mechanism.

* Datasets (§6.2): the binary synthetic streams TLNS, Sin and Log — a probability sequence
  ``p_t`` from ``privstream.connectors.synthetic`` and, at each slot, every user independently
  holding 1 with probability ``p_t`` (``d = 2``). The real datasets of §6.1 (Taxi, Foursquare)
  are not shipped.
* Requirements (§6.3, A26): 10 user types in contiguous blocks, each drawing ``ε`` uniformly
  from the budget grid values ``≥ ε`` and ``w`` from the window grid values ``≤ w``; BD and BA
  run with the stream's ``(ε, w)``, the only uniform setting that satisfies everybody.
* Metrics (§6.4): ``amre`` (Eq. 15, per-bin MSE averaged over slots, A28), ``ajsd`` (Eq. 16,
  A29), step seconds; ``reductions`` gives "X % less error" and "Y % in ln(AMRE)".
* ``bench_personalized``: each mechanism's metrics averaged over seeds ``1..K`` in the JSON
  shape of ``privstream.experiments.bench_ldp_ids``: ``{"params": …, "results": {MECH: …}}``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privstream.connectors.synthetic import (
    log_probabilities,
    sin_probabilities,
    tlns_probabilities,
)
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import Release, Slot
from privstream.mechanisms.personalized import PersonalizedConfig, build, mechanism_names
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

DATASETS: Final = ("tlns", "sin", "log")
RESULT_FIELDS: Final = ("amre", "ln_amre", "ajsd", "publications", "seconds")
MECHANISM_ORDER: Final = ("BD", "BA", "PLBU", "PBD", "PBA")  # the paper's comparison set (§5.2)
EPSILON_GRID: Final = (0.2, 0.4, 0.6, 0.8, 1.0)  # Table 3; default 0.6
WINDOW_GRID: Final = (40, 80, 120, 160, 200)  # Table 3; default 120
USER_TYPES: Final = 10  # A26
DEFAULT_EPSILON: Final = 0.6
DEFAULT_WINDOW: Final = 120

# Spec §6.5: the paper's AMRE reductions (ε-sweep and w-sweep rows) and its two headlines.
PAPER_REDUCTIONS: Final[dict[tuple[str, str], dict[str, float]]] = {
    ("taxi", "PBD/BD"): {"epsilon": 0.708, "window": 0.631},
    ("foursquare", "PBD/BD"): {"epsilon": 0.696, "window": 0.684},
    ("tlns", "PBA/BA"): {"epsilon": 0.369, "window": 0.351},
    ("sin", "PBA/BA"): {"epsilon": 0.277, "window": 0.042},
    ("log", "PBA/BA"): {"epsilon": 0.289, "window": 0.166},
}
PAPER_HEADLINES: Final = {"PBD/BD real data": 0.68, "PBA/BA synthetic data": 0.249}

# ---------------------------------------------------------------------------------------------
# Streams and requirements (spec §6.2, §6.3)
# ---------------------------------------------------------------------------------------------


def probabilities(dataset: str, slots: int, seed: int) -> NDArray[np.float64]:
    """The sequence ``p_1..p_T`` of a synthetic dataset (§6.2); TLNS's walk is drawn from
    ``seed``, Sin and Log are deterministic."""
    name = dataset.lower()
    if name == "tlns":
        return tlns_probabilities(slots, np.random.default_rng([seed, 0x544C4E53]))
    if name == "sin":
        return sin_probabilities(slots)
    if name == "log":
        return log_probabilities(slots)
    raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")


@dataclass(frozen=True)
class BinaryStream:
    """A binary synthetic population: at slot ``t`` each of ``users`` users independently holds
    value 1 with probability ``p_t`` (spec §6.2). Each slot's values come from a generator
    seeded by ``(seed, slot)``, so any slot can be regenerated alone."""

    name: str
    users: int
    slots: int
    seed: int = 0
    probabilities: NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.users < 1 or self.slots < 1:
            raise ValueError(
                f"users and slots must be >= 1, got users={self.users}, slots={self.slots}"
            )
        object.__setattr__(self, "probabilities", probabilities(self.name, self.slots, self.seed))

    @property
    def d(self) -> int:
        return 2

    def values(self, slot: int) -> NDArray[np.int64]:
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        rng = np.random.default_rng([self.seed, slot, 0x5057])
        ones: NDArray[np.int64] = (rng.random(self.users) < self.probabilities[slot - 1]).astype(
            np.int64
        )
        return ones


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
        raise ValueError(f"no grid value fits (ε={epsilon}, w={window})")
    rng = np.random.default_rng([seed, 0x52455153])
    type_eps = rng.choice(np.array(budgets, dtype=np.float64), size=types)
    type_win = rng.choice(np.array(wins, dtype=np.int64), size=types)
    block = math.ceil(users / types)
    kind = np.arange(users) // block
    return type_eps[kind], type_win[kind]


def assign_requirements(
    users: int, epsilon: float, window: int, seed: int, **grids: Any
) -> Requirements:
    """``requirement_arrays`` (same arguments) as the ``Requirements`` of a fully registered
    population."""
    return Requirements(*requirement_arrays(users, epsilon, window, seed, **grids))


# ---------------------------------------------------------------------------------------------
# Metrics (spec §6.4)
# ---------------------------------------------------------------------------------------------


def _pair(
    estimates: ArrayLike, truth: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r = np.asarray(estimates, dtype=np.float64)
    c = np.asarray(truth, dtype=np.float64)
    if r.shape != c.shape or r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(
            f"estimates and truth must be non-empty T×d arrays of one shape, got {r.shape} and {c.shape}"
        )
    return r, c


def amre(estimates: ArrayLike, truth: ArrayLike) -> float:
    """``AMRE = (1/T)·Σ_τ (1/d)·‖r_τ − c_τ‖²`` (Eq. 15): despite its name the per-bin mean
    squared error of the released counts, averaged over slots (A28)."""
    r, c = _pair(estimates, truth)
    return float(np.mean((r - c) ** 2))


def ajsd(estimates: ArrayLike, truth: ArrayLike) -> float:
    """``AJSD = (1/T)·Σ_τ JSD(r_τ ‖ c_τ)`` (Eq. 16, A29): negative releases clamped to 0, both
    vectors normalised to sum 1 (slots where either sums to 0 are skipped), natural log,
    ``0·log 0 = 0``. NaN when every slot is skipped."""
    r, c = _pair(estimates, truth)
    r = np.maximum(r, 0.0)
    rs, cs = r.sum(axis=1), c.sum(axis=1)
    keep = (rs > 0) & (cs > 0)
    if not keep.any():
        return math.nan
    p = r[keep] / rs[keep, None]
    q = c[keep] / cs[keep, None]
    v = (p + q) / 2

    def kl(a: NDArray[np.float64]) -> NDArray[np.float64]:
        # where a > 0, v ≥ a/2 > 0; elsewhere the term is 0·log 0 = 0
        ratio = np.where(a > 0, a / np.where(v > 0, v, 1.0), 1.0)
        out: NDArray[np.float64] = np.sum(a * np.log(ratio), axis=1)
        return out

    return float(np.mean(0.5 * kl(p) + 0.5 * kl(q)))


def reductions(base: float, ours: float) -> dict[str, float]:
    """Spec §6.4: "X % less error" ``(base − ours)/base`` and "Y % in ln(AMRE)"
    ``(ln base − ln ours)/ln base``."""
    return {
        "amre": (base - ours) / base,
        "ln_amre": (math.log(base) - math.log(ours)) / math.log(base),
    }


# ---------------------------------------------------------------------------------------------
# Running mechanisms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PersonalizedRun:
    """One mechanism over one stream: releases ``r_t`` (``T×d``), the true counts ``c_t``, each
    slot's strategy and the seconds spent in the mechanism's steps."""

    mechanism: str
    stream: str
    epsilon: float
    window: int
    seed: int
    users: int
    estimates: NDArray[np.float64] = field(repr=False)
    truth: NDArray[np.float64] = field(repr=False)
    strategies: tuple[str, ...] = field(repr=False)
    seconds: float

    @property
    def publications(self) -> int:
        return sum(s == "publish" for s in self.strategies)

    def amre(self) -> float:
        return amre(self.estimates, self.truth)

    def ajsd(self) -> float:
        return ajsd(self.estimates, self.truth)

    def summary(self) -> dict[str, float]:
        """The per-mechanism fields of a benchmark result (``RESULT_FIELDS``)."""
        err = self.amre()
        return {
            "amre": err,
            "ln_amre": math.log(err) if err > 0 else -math.inf,
            "ajsd": self.ajsd(),
            "publications": float(self.publications),
            "seconds": self.seconds,
        }


def run_personalized(
    names: Sequence[str],
    stream: BinaryStream,
    requirements: Requirements,
    epsilon: float,
    window: int,
    seed: int,
    *,
    stream_name: str | None = None,
    **config: Any,
) -> dict[str, PersonalizedRun]:
    """Run several personalized mechanisms over ``stream`` in lockstep, slot by slot.

    ``(epsilon, window)`` is the stream default (users without a requirement) and BD/BA's
    uniform setting; ``config`` holds further ``PersonalizedConfig`` fields. Each mechanism
    draws from ``SlotRandomness(seed, stream_name, t, scope=name)``, so its releases do not
    depend on which mechanisms run beside it.
    """
    mechanisms = mechanism_names(names)
    key = stream_name if stream_name is not None else stream.name
    task = FrequencyTask(stream.d)
    cfg = PersonalizedConfig(
        population=stream.users, epsilon=epsilon, window=window, task=task, **config
    )
    built = {name: build(name, cfg) for name in mechanisms}
    states = {name: mech.initial_state() for name, mech in built.items()}
    T, d = stream.slots, stream.d
    estimates = {name: np.empty((T, d)) for name in mechanisms}
    strategies: dict[str, list[str]] = {name: [] for name in mechanisms}
    seconds = dict.fromkeys(mechanisms, 0.0)
    truth = np.empty((T, d))
    for t in range(1, T + 1):
        values = stream.values(t)
        truth[t - 1] = np.bincount(values, minlength=d)
        curator = SimulatedCurator(values, task, requirements)
        for name, mech in built.items():
            randomness = SlotRandomness(seed, key, t, scope=name)
            started = time.perf_counter()
            states[name], events = mech.step(states[name], Slot(key, t, curator, randomness))
            seconds[name] += time.perf_counter() - started
            release = next(e for e in events if isinstance(e, Release))
            estimates[name][t - 1] = release.estimate
            strategies[name].append(release.strategy)
    return {
        name: PersonalizedRun(
            mechanism=name,
            stream=key,
            epsilon=float(epsilon),
            window=window,
            seed=seed,
            users=stream.users,
            estimates=estimates[name],
            truth=truth,
            strategies=tuple(strategies[name]),
            seconds=seconds[name],
        )
        for name in mechanisms
    }


def bench_personalized(
    dataset: str,
    users: int,
    slots: int,
    mechanisms: Sequence[str],
    seeds: int,
    progress: bool = False,
    *,
    epsilon: float = DEFAULT_EPSILON,
    window: int = DEFAULT_WINDOW,
    types: int = USER_TYPES,
    **config: Any,
) -> dict[str, Any]:
    """Average each mechanism's metrics over seeds ``1..seeds`` (spec §6.4 protocol).

    Seed ``k`` generates the dataset, the users' requirements (``assign_requirements``) and
    drives every mechanism. Returns ``{"params": {...}, "results": {MECH: {"amre", "ln_amre",
    "ajsd", "publications", "seconds"}}}``; ``ln_amre`` is the mean of the per-seed ln(AMRE).
    ``progress`` prints one line per seed to stderr.
    """
    names = mechanism_names(mechanisms)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    probabilities(dataset, 1, 1)  # validate the dataset before any work
    sums: dict[str, dict[str, float]] = {name: dict.fromkeys(RESULT_FIELDS, 0.0) for name in names}
    for seed in range(1, seeds + 1):
        stream = BinaryStream(dataset.lower(), users, slots, seed)
        requirements = assign_requirements(users, epsilon, window, seed, types=types)
        runs = run_personalized(names, stream, requirements, epsilon, window, seed, **config)
        for name, run in runs.items():
            for k, v in run.summary().items():
                sums[name][k] += v
        if progress:
            print(f"{dataset} seed {seed}/{seeds} done", file=sys.stderr, flush=True)
    params: dict[str, Any] = {
        "dataset": dataset.lower(),
        "users": users,
        "slots": slots,
        "epsilon": epsilon,
        "window": window,
        "seeds": seeds,
        "types": types,
        "mechanisms": names,
        **config,
    }
    results = {name: {k: v / seeds for k, v in sums[name].items()} for name in names}
    return {"params": params, "results": results}


def compare(result: Mapping[str, Any], ours: str, base: str) -> dict[str, float]:
    """The §6.4 reductions of ``ours`` against ``base`` in a ``bench_personalized`` result."""
    r = result["results"]
    return reductions(r[base]["amre"], r[ours]["amre"])


def sweep_personalized(
    dataset: str,
    users: int,
    slots: int,
    axis: str,
    seeds: int,
    mechanisms: Sequence[str] = ("BD", "BA", "PBD", "PBA"),
    *,
    points: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One sweep of spec §6.3/§6.5: ``axis="epsilon"`` varies ε over the grid at w = 120,
    ``axis="window"`` varies w at ε = 0.6 (personalized requirements follow each point).

    Returns ``{"params", "points": [bench_personalized result per point], "reductions": {"PBD/BD":
    …, "PBA/BA": …}}`` where each reduction is averaged over the points both ways (A30): the mean
    of the per-point ratios and the ratio of the summed AMREs, plus the mean ln(AMRE) reduction.
    """
    if axis not in ("epsilon", "window"):
        raise ValueError(f"axis must be 'epsilon' or 'window', got {axis!r}")
    grid = points if points is not None else EPSILON_GRID if axis == "epsilon" else WINDOW_GRID
    results = []
    for x in grid:
        eps, win = (float(x), DEFAULT_WINDOW) if axis == "epsilon" else (DEFAULT_EPSILON, int(x))
        results.append(
            bench_personalized(dataset, users, slots, mechanisms, seeds, epsilon=eps, window=win)
        )
    pairs = [(o, b) for o, b in (("PBD", "BD"), ("PBA", "BA")) if {o, b} <= set(mechanisms)]
    summary: dict[str, dict[str, float]] = {}
    for ours, base in pairs:
        per_point = [compare(r, ours, base) for r in results]
        ours_sum = sum(r["results"][ours]["amre"] for r in results)
        base_sum = sum(r["results"][base]["amre"] for r in results)
        summary[f"{ours}/{base}"] = {
            "amre_mean_of_ratios": float(np.mean([p["amre"] for p in per_point])),
            "amre_ratio_of_means": (base_sum - ours_sum) / base_sum,
            "ln_amre_mean_of_ratios": float(np.mean([p["ln_amre"] for p in per_point])),
        }
    params = {"dataset": dataset.lower(), "users": users, "slots": slots, "axis": axis,
              "points": list(grid), "seeds": seeds}  # fmt: skip
    return {"params": params, "points": results, "reductions": summary}


def format_personalized_table(result: Mapping[str, Any]) -> str:
    """An aligned text table of a ``bench_personalized`` result."""
    params = {k: v for k, v in result.get("params", {}).items() if k != "mechanisms"}
    header = "  ".join(f"{k}={v}" for k, v in params.items())
    columns = ("mechanism", "AMRE", "ln(AMRE)", "AJSD", "publications", "seconds")
    rows = [
        (
            name,
            f"{r['amre']:.4g}",
            f"{r['ln_amre']:.3f}",
            f"{r['ajsd']:.4g}",
            f"{r['publications']:.1f}",
            f"{r['seconds']:.2f}",
        )
        for name, r in result["results"].items()
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    rule = "-" * len(line(columns))
    return "\n".join([header, rule, line(columns), rule, *(line(row) for row in rows), rule])
