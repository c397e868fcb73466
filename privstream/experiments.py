"""Experiment harness of the LDP-IDS reproduction (spec ldp-ids §5): what ``privstream bench`` runs.

The harness drives the engine-free core directly (no Bytewax): for every slot ``t = 1..T`` it
builds the slot's ``SimulatedClientPort`` over the population's values (trust mode
``ldp-simulated``, design §4) with ``SlotRandomness(seed, stream, t, scope=mechanism)`` and calls each mechanism's
pure ``step``. With the same seed and stream name it therefore releases exactly what the
``privstream.flows.ldp_ids`` dataflow releases for a synthetic dataset.

* Metrics (spec §5.3): ``mre`` (§5.3.1, primary), ``mae`` and ``mse`` (§5.3.2),
  ``bits_per_user`` (§5.3.4).
* ``run_mechanism`` / ``run_mechanisms``: one stream, one or several mechanisms in lockstep
  (each slot's values are generated once and shared), returning a ``RunResult`` per mechanism.
* ``bench_ldp_ids``: the default experiment of spec §5.4 averaged over seeds ``1..K``; seed
  ``k`` drives both the synthetic dataset and the mechanisms. ``format_table`` renders it.
* ``load_dataset``: the boundary where dataset specs (synthetic names, later ``file:PATH``)
  become slot sources.
* ``plot_releases``: true value-1 frequency against each mechanism's releases (needs the
  ``plot`` extra; matplotlib is imported lazily).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from tqdm import tqdm

from privstream.connectors.files import RecordedStream, load_records
from privstream.connectors.synthetic import DATASETS, SyntheticStream
from privstream.mechanisms.client import ClientPath, SimulatedClientPort
from privstream.mechanisms.contract import Release, Slot
from privstream.mechanisms.ldp_ids import LdpIdsConfig, build, mechanism_names
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask, MeanTask

RESULT_FIELDS = ("mre", "mae", "bits_per_user", "publications", "seconds")
MECHANISM_ORDER = ("LBU", "LSP", "LPU", "LBD", "LBA", "LPD", "LPA")

# Spec §5.5.1 (paper Table 2): time-average bits per user on the synthetic streams, keyed by
# (ε, w, dataset), then mechanism. The reproduction targets.
_TABLE2_COLUMNS = ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA")
_TABLE2_ROWS: dict[tuple[float, int, str], tuple[float, ...]] = {
    (1.0, 20, "lns"): (1.0, 1.5585, 1.3410, 0.1, 0.1, 0.0912, 0.0804),
    (1.0, 20, "sin"): (1.0, 1.5516, 1.3380, 0.1, 0.1, 0.0913, 0.0806),
    (1.0, 20, "log"): (1.0, 1.5572, 1.3284, 0.1, 0.1, 0.0915, 0.0803),
    (2.0, 20, "lns"): (1.0, 1.5500, 1.3540, 0.1, 0.1, 0.0934, 0.0825),
    (2.0, 20, "sin"): (1.0, 1.5410, 1.3580, 0.1, 0.1, 0.0933, 0.0828),
    (2.0, 20, "log"): (1.0, 1.5540, 1.3368, 0.1, 0.1, 0.0937, 0.0822),
    (2.0, 40, "lns"): (1.0, 1.5420, 1.3395, 0.05, 0.05, 0.0485, 0.0410),
    (2.0, 40, "sin"): (1.0, 1.5268, 1.3656, 0.05, 0.05, 0.0484, 0.0411),
    (2.0, 40, "log"): (1.0, 1.4832, 1.3148, 0.05, 0.05, 0.0490, 0.0414),
}
PAPER_TABLE2_BITS: dict[tuple[float, int, str], dict[str, float]] = {
    key: dict(zip(_TABLE2_COLUMNS, row, strict=True)) for key, row in _TABLE2_ROWS.items()
}

# Spec §5.5.2: the spec author's independent simulation (not paper numbers): MRE at δ = 1/n,
# both bins, mean of 5 seeds, ε = 1, w = 20, n = 200,000, T = 800. Ballpark checks only.
_CROSSCHECK_COLUMNS = ("LBU", "LBD", "LBA", "LSP", "LPU", "LPD", "LPA")
SPEC_CROSSCHECK_MRE: dict[str, dict[str, float]] = {
    "sin": dict(
        zip(_CROSSCHECK_COLUMNS, (0.304, 0.303, 0.183, 0.029, 0.065, 0.056, 0.049), strict=True)
    ),
    "log": dict(
        zip(_CROSSCHECK_COLUMNS, (0.104, 0.098, 0.062, 0.008, 0.024, 0.021, 0.018), strict=True)
    ),
}

# ---------------------------------------------------------------------------------------------
# Metrics (spec §5.3)
# ---------------------------------------------------------------------------------------------


def _pair(
    estimates: ArrayLike, truth: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r = np.asarray(estimates, dtype=np.float64)
    c = np.asarray(truth, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    if c.ndim == 1:
        c = c[:, None]
    if r.shape != c.shape or r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(
            f"estimates and truth must be non-empty T×d arrays of one shape, got {r.shape} and {c.shape}"
        )
    return r, c


def mre(estimates: ArrayLike, truth: ArrayLike, delta: float) -> float:
    """Mean relative error (spec §5.3.1, A27).

    ``MRE = (1/T) Σ_t (1/d) Σ_k |r_t[k] − c_t[k]| / max(|c_t[k]|, δ)`` over ``T×d`` arrays of
    releases ``r`` and truths ``c``. The spec's default is ``δ = 1/n`` (one user in count
    units); ``10⁻³`` is its robustness variant. For a mean (``d = 1``) the denominator is
    ``max(|c_t|, δ)``, which the absolute value covers. One-dimensional inputs are ``T×1``.
    """
    if not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be a positive finite number, got {delta!r}")
    r, c = _pair(estimates, truth)
    return float(np.mean(np.abs(r - c) / np.maximum(np.abs(c), delta)))


def mae(estimates: ArrayLike, truth: ArrayLike) -> float:
    """Mean absolute error ``(1/T) Σ_t mean_k |r_t[k] − c_t[k]|`` (spec §5.3.2)."""
    r, c = _pair(estimates, truth)
    return float(np.mean(np.abs(r - c)))


def mse(estimates: ArrayLike, truth: ArrayLike) -> float:
    """Mean squared error ``(1/T) Σ_t mean_k (r_t[k] − c_t[k])²`` (spec §5.3.2; the quantity
    of the closed forms in §4.2)."""
    r, c = _pair(estimates, truth)
    return float(np.mean((r - c) ** 2))


def bits_per_user(total_bits: int | float, users: int, slots: int) -> float:
    """Time-average communication bits per user ``(1/(n·T)) Σ_t Σ_reports (b + instr)``
    (spec §5.3.4); ``total_bits`` is the sum of the releases' ``bits``."""
    if users < 1 or slots < 1:
        raise ValueError(f"users and slots must be >= 1, got users={users}, slots={slots}")
    return float(total_bits) / (users * slots)


# ---------------------------------------------------------------------------------------------
# Slot sources
# ---------------------------------------------------------------------------------------------


class SlotSource(Protocol):
    """What the harness needs from a dataset: every user's value and the truth, per 1-based slot.

    ``SyntheticStream`` is one; ``privstream.connectors.files.RecordedStream`` (a user's own
    records, in memory) is another.
    """

    @property
    def name(self) -> str: ...

    @property
    def users(self) -> int: ...

    @property
    def slots(self) -> int: ...

    def values(self, slot: int) -> NDArray[Any]: ...

    def truth(self, slot: int) -> NDArray[np.float64]: ...


def task_for(source: SlotSource) -> EstimationTask:
    """The estimation task of a source: its own ``task`` if it has one; otherwise, for sources
    describing themselves like ``SyntheticStream`` (``numeric``, ``d``, ``bounds``), a
    ``MeanTask(*bounds)`` for numeric streams (the ``-Con`` datasets, spec §5.1, A26) and a
    ``FrequencyTask(d)`` for categorical ones (Ada oracle, spec §2.3)."""
    task = getattr(source, "task", None)
    if isinstance(task, EstimationTask):
        return task
    numeric = getattr(source, "numeric", None)
    if numeric is True:
        lower, upper = source.bounds  # type: ignore[attr-defined]
        return MeanTask(float(lower), float(upper))
    if numeric is False:
        return FrequencyTask(int(source.d))  # type: ignore[attr-defined]
    raise ValueError(f"cannot tell the estimation task of {source!r}; pass task=")


def load_dataset(
    spec: str,
    users: int,
    slots: int,
    seed: int,
    *,
    domain: int | None = None,
    numeric: bool = False,
) -> SyntheticStream | RecordedStream:
    """The slot source a dataset spec names.

    Synthetic names (``privstream.connectors.synthetic.DATASETS``: lns, sin, log and their
    ``-con`` variants, spec §5.1) give a ``SyntheticStream`` of ``users`` users over ``slots``
    slots generated from ``seed``. ``file:PATH`` loads a user's own CSV/JSONL records
    (``privstream.connectors.files``): ``users`` caps the population, ``domain`` is the number
    of categories (default: largest value + 1), ``numeric`` makes the task a mean; the file fixes
    the slots and ``seed`` only drives the mechanisms.
    """
    if spec.startswith("file:"):
        return load_records(spec.removeprefix("file:"), users, domain=domain, numeric=numeric)
    name = spec.lower()
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {spec!r}; use one of {', '.join(DATASETS)} or file:PATH")
    return SyntheticStream(name, users, slots, seed=seed)


# ---------------------------------------------------------------------------------------------
# Running mechanisms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One mechanism over one stream: the releases ``r_t`` (``estimates``, ``T×d``), the truth
    ``c_t``, each slot's strategy, the total communication bits (spec §5.3.4), the number of
    fresh publications and the seconds spent in the mechanism's steps (client simulation
    included, data generation excluded), in total and per slot (``slot_seconds``)."""

    mechanism: str
    stream: str
    epsilon: float
    window: int
    seed: int
    users: int
    path: ClientPath
    estimates: NDArray[np.float64] = field(repr=False)
    truth: NDArray[np.float64] = field(repr=False)
    strategies: tuple[str, ...] = field(repr=False)
    total_bits: int
    publications: int
    seconds: float
    slot_seconds: NDArray[np.float64] = field(repr=False)

    @property
    def slots(self) -> int:
        return int(self.estimates.shape[0])

    @property
    def bits_per_user(self) -> float:
        return bits_per_user(self.total_bits, self.users, self.slots)

    def mre(self, delta: float | None = None) -> float:
        """MRE with ``δ = 1/n`` unless given (spec §5.3.1)."""
        return mre(self.estimates, self.truth, 1 / self.users if delta is None else delta)

    def mae(self) -> float:
        return mae(self.estimates, self.truth)

    def mse(self) -> float:
        return mse(self.estimates, self.truth)

    def summary(self) -> dict[str, float]:
        """The per-mechanism fields of a benchmark result (``RESULT_FIELDS``)."""
        return {
            "mre": self.mre(),
            "mae": self.mae(),
            "bits_per_user": self.bits_per_user,
            "publications": float(self.publications),
            "seconds": self.seconds,
        }


def run_mechanisms(
    names: Sequence[str],
    stream: SlotSource,
    epsilon: float,
    window: int,
    seed: int,
    path: ClientPath = "aggregate",
    *,
    task: EstimationTask | None = None,
    stream_name: str | None = None,
    progress: tqdm | None = None,
    **config: Any,
) -> dict[str, RunResult]:
    """Run several LDP-IDS mechanisms over ``stream`` in lockstep, slot by slot.

    Each slot's values are fetched once and shared; every mechanism gets its own
    ``SimulatedClientPort`` (``path`` = ``"aggregate"`` fast path or ``"per-user"`` reference)
    and ``SlotRandomness(seed, stream_name, t, scope=name)``, so a mechanism's releases do not depend on
    which other mechanisms run beside it. ``stream_name`` defaults to the stream's name, as in
    the dataflow. ``config`` holds further ``LdpIdsConfig`` fields (``beta``, ``u_min``, …).
    ``progress`` is advanced by one per slot.
    """
    mechanisms = mechanism_names(names)
    task = task if task is not None else task_for(stream)
    key = stream_name if stream_name is not None else stream.name
    cfg = LdpIdsConfig(epsilon=epsilon, window=window, population=stream.users, task=task, **config)
    built = {name: build(name, cfg) for name in mechanisms}
    states = {name: mech.initial_state() for name, mech in built.items()}
    T, d = stream.slots, task.d
    estimates = {name: np.empty((T, d)) for name in mechanisms}
    strategies: dict[str, list[str]] = {name: [] for name in mechanisms}
    bits = dict.fromkeys(mechanisms, 0)
    seconds = {name: np.zeros(T) for name in mechanisms}
    truth = np.empty((T, d))
    for t in range(1, T + 1):
        values = stream.values(t)
        truth[t - 1] = stream.truth(t)
        for name, mech in built.items():
            randomness = SlotRandomness(seed, key, t, scope=name)
            started = time.perf_counter()
            client = SimulatedClientPort(values, task, randomness, path)
            states[name], events = mech.step(states[name], Slot(key, t, client, randomness))
            seconds[name][t - 1] = time.perf_counter() - started
            release = next(e for e in events if isinstance(e, Release))
            estimates[name][t - 1] = release.estimate
            strategies[name].append(release.strategy)
            bits[name] += release.bits
        if progress is not None:
            progress.update(1)
    return {
        name: RunResult(
            mechanism=name,
            stream=key,
            epsilon=float(epsilon),
            window=window,
            seed=seed,
            users=stream.users,
            path=path,
            estimates=estimates[name],
            truth=truth,
            strategies=tuple(strategies[name]),
            total_bits=bits[name],
            publications=sum(s == "publish" for s in strategies[name]),
            seconds=float(seconds[name].sum()),
            slot_seconds=seconds[name],
        )
        for name in mechanisms
    }


def run_mechanism(
    name: str,
    stream: SlotSource,
    epsilon: float,
    window: int,
    seed: int,
    path: ClientPath = "aggregate",
    **config: Any,
) -> RunResult:
    """Run one LDP-IDS mechanism over ``stream`` (see ``run_mechanisms`` for the options)."""
    return run_mechanisms([name], stream, epsilon, window, seed, path, **config)[
        name.strip().upper()
    ]


# ---------------------------------------------------------------------------------------------
# The benchmark (spec §5.4 defaults, §5.5 targets)
# ---------------------------------------------------------------------------------------------


def bench_ldp_ids(
    dataset: str,
    users: int,
    slots: int,
    epsilon: float,
    window: int,
    mechanisms: Sequence[str],
    seeds: int,
    progress: bool = True,
    *,
    path: ClientPath = "aggregate",
    domain: int | None = None,
    numeric: bool = False,
    **config: Any,
) -> dict[str, Any]:
    """Average each mechanism's metrics over seeds ``1..seeds``.

    ``domain`` and ``numeric`` describe a ``file:PATH`` dataset (see ``load_dataset``); a file
    is loaded once and its own slot count replaces ``slots``.

    Seed ``k`` generates the dataset once (``load_dataset(dataset, users, slots, k)``) and
    drives every mechanism's randomness on it. Returns
    ``{"params": {...}, "results": {MECH: {"mre", "mae", "bits_per_user", "publications",
    "seconds"}}}`` with MRE at ``δ = 1/n`` (spec §5.3.1), bits per spec §5.3.4, publications
    per run and step seconds per run. A tqdm bar on stderr counts slots.
    """
    names = mechanism_names(mechanisms)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    recorded = None
    if dataset.startswith("file:"):
        recorded = load_dataset(dataset, users, slots, 1, domain=domain, numeric=numeric)
        slots = recorded.slots
    else:
        load_dataset(dataset, users, 1, 1)  # validate the spec before any work
    sums: dict[str, dict[str, float]] = {name: dict.fromkeys(RESULT_FIELDS, 0.0) for name in names}
    with tqdm(
        total=seeds * slots,
        desc=f"{dataset} ×{len(names)}",
        unit="slot",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
        mininterval=0.5,
    ) as bar:
        for seed in range(1, seeds + 1):
            bar.set_postfix_str(f"seed {seed}/{seeds}")
            stream = recorded or load_dataset(dataset, users, slots, seed)
            runs = run_mechanisms(
                names, stream, epsilon, window, seed, path, progress=bar, **config
            )
            for name, run in runs.items():
                for k, v in run.summary().items():
                    sums[name][k] += v
    params: dict[str, Any] = {
        "dataset": dataset,
        "users": users,
        "slots": slots,
        "epsilon": epsilon,
        "window": window,
        "seeds": seeds,
        "path": path,
        "mechanisms": names,
        **config,
    }
    results = {name: {k: v / seeds for k, v in sums[name].items()} for name in names}
    return {"params": params, "results": results}


def format_table(result: Mapping[str, Any]) -> str:
    """An aligned text table of a ``bench_ldp_ids`` result: a parameter line, then one row per
    mechanism with MRE, MAE, bits/user, publications and seconds."""
    params = {k: v for k, v in result.get("params", {}).items() if k != "mechanisms"}
    header = "  ".join(f"{k}={v}" for k, v in params.items())
    columns = ("mechanism", "MRE", "MAE", "bits/user", "publications", "seconds")
    rows: list[tuple[str, ...]] = []
    for name, r in result["results"].items():
        pubs = float(r["publications"])
        rows.append(
            (
                name,
                f"{r['mre']:.4f}",
                f"{r['mae']:.5f}",
                f"{r['bits_per_user']:.4f}",
                f"{pubs:.0f}" if pubs.is_integer() else f"{pubs:.1f}",
                f"{r['seconds']:.2f}",
            )
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    rule = "-" * len(line(columns))
    return "\n".join([header, rule, line(columns), rule, *(line(row) for row in rows), rule])


# ---------------------------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------------------------


def plot_releases(
    truth: ArrayLike,
    estimates: Mapping[str, ArrayLike],
    path: str | Path,
    title: str,
    ylabel: str = "frequency of 1",
) -> Path:
    """Save a PNG comparing the true value-1 frequency (``truth``, length T) with each
    mechanism's released value-1 frequency (or any other released scalar, with ``ylabel``).

    One small-multiple panel per mechanism, titled with its MAE; shared axes whose y range is
    robust to rare outlying releases (they are clipped at the panel edge); truth in black,
    releases in colour. Renders on the Agg canvas without touching pyplot's global state.
    Needs the ``plot`` extra (matplotlib). Returns the path written.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry
    from matplotlib.lines import Line2D

    c = np.asarray(truth, dtype=np.float64)
    series = {name: np.asarray(r, dtype=np.float64) for name, r in estimates.items()}
    if c.ndim != 1 or any(r.shape != c.shape for r in series.values()):
        raise ValueError("truth and every release series must be one-dimensional of equal length")
    if not series:
        raise ValueError("plot_releases needs at least one mechanism")
    slots = np.arange(1, c.shape[0] + 1)
    stacked = np.concatenate([c, *series.values()])
    stacked = stacked[np.isfinite(stacked)]
    lo = min(float(c.min()), float(np.percentile(stacked, 0.5)))
    hi = max(float(c.max()), float(np.percentile(stacked, 99.5)))
    pad = 0.05 * (hi - lo or 1.0)

    count = len(series)
    ncols = 1 if count == 1 else 2
    nrows = math.ceil(count / ncols)
    fig = Figure(figsize=(6.5 * ncols, 2.3 * nrows + 0.8))
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    colours = colormaps["tab10"]
    for i, (name, r) in enumerate(series.items()):
        ax = axes[i // ncols][i % ncols]
        ax.plot(slots, r, color=colours(i % 10), linewidth=0.9)
        ax.plot(slots, c, color="black", linewidth=1.4)
        ax.set_title(f"{name}   (MAE {np.mean(np.abs(r - c)):.4f})", fontsize=10, loc="left")
        ax.set_ylim(lo - pad, hi + pad)
        ax.grid(True, alpha=0.3)
    for j in range(count, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("slot t")
    for row in axes:
        row[0].set_ylabel(ylabel)
    # The last visible panel of a short last row needs its own x labels.
    if count % ncols:
        axes[-2][-1].xaxis.set_tick_params(labelbottom=True)
        axes[-2][-1].set_xlabel("slot t")
    handles = [
        Line2D([], [], color="black", linewidth=1.4, label="true"),
        Line2D([], [], color="grey", linewidth=0.9, label="released (colour per mechanism)"),
    ]
    fig.legend(handles=handles, loc="upper right", ncols=2, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11, x=0.01, horizontalalignment="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
