"""The bench harness of every family: what ``privstream bench <family>`` runs.

Engine-free: for every slot ``t = 1..T`` of a dataset it builds the slot's port of the family's
trust mode over the population's values (``SimulatedClientPort`` for ``ldp-simulated``,
``SimulatedCurator`` over the registration for ``cdp``; design §4) with
``SlotRandomness(seed, stream, t, scope=mechanism)``, and calls each mechanism's pure ``step``,
so with the same seed and stream name it releases exactly what the family's dataflow releases.
A family's registry entry (``families.registry``) says which datasets it takes, whether it
releases counts, and what its bench reports (``BenchSpec.score``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm

from privstream.connectors.datasets import SlotSource
from privstream.connectors.recorded import load_records
from privstream.experiments.scores import Run
from privstream.families.registry import Family
from privstream.mechanisms.client import (
    ClientPath,
    ClientPort,
    CuratorPort,
    ReportPort,
    Requirements,
    slot_port,
)
from privstream.mechanisms.contract import Release
from privstream.mechanisms.driver import Lane, drive_slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.stages import StageStates, pre_server
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask, MeanTask
from privstream.operators.chain import chain_slot


def task_for(source: SlotSource) -> EstimationTask:
    """The estimation task of a source: its own ``task``, else a ``MeanTask`` over the bounds
    of a numeric synthetic stream or a ``FrequencyTask(d)`` of a categorical one."""
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
    family: Family,
    spec: str,
    users: int,
    slots: int,
    seed: int,
    *,
    domain: int | None = None,
    numeric: bool = False,
    task: EstimationTask | None = None,
) -> SlotSource:
    """The slot source ``spec`` names for ``family``: one of its synthetic datasets (generated
    from ``seed``) or, where the family takes files, ``file:PATH`` (``users`` caps the
    population, ``domain`` is the number of categories, ``numeric`` makes the task a mean)."""
    bench = family.bench
    if spec.startswith("file:") and bench.files:
        return load_records(spec.removeprefix("file:"), users, domain=domain, numeric=numeric)
    name, sources = spec.lower(), family.sources
    if name not in sources:
        files = " or file:PATH" if bench.files else ""
        raise ValueError(
            f"unknown {family.name} dataset {spec!r}; use one of {', '.join(sources)}{files}"
        )
    source: SlotSource = sources[name](users, slots, seed, task)
    return source


def _port(
    family: Family,
    values: NDArray[Any],
    task: EstimationTask,
    randomness: SlotRandomness,
    path: ClientPath,
    requirements: Requirements | None,
    clients: Any = None,
) -> ClientPort | CuratorPort | ReportPort:
    return slot_port(family.trust, values, task, randomness, path, requirements, clients)


@dataclass
class _Trace:
    """What ``run_lockstep`` records of one mechanism, slot by slot: its estimates, strategies,
    bits sent and the seconds of each step (port included)."""

    estimates: NDArray[np.float64]
    seconds: NDArray[np.float64]
    strategies: list[str] = field(default_factory=list)
    bits: int = 0

    def record(self, t: int, release: Release, seconds: float) -> None:
        self.seconds[t - 1] = seconds
        self.estimates[t - 1] = release.estimate
        self.strategies.append(release.strategy)
        self.bits += int(getattr(release.details, "bits", 0))


def _step_slot(
    family: Family,
    lanes: Mapping[str, Lane],
    traces: Mapping[str, _Trace],
    values: NDArray[Any],
    t: int,
    *,
    key: str,
    seed: int,
    task: EstimationTask,
    path: ClientPath,
    requirements: Requirements | None,
    chains: dict[str, StageStates],
) -> None:
    """Step every mechanism of ``lanes`` once on slot ``t``'s shared ``values`` with the shared
    step driver (``mechanisms.driver``), each through its own port and
    ``SlotRandomness(seed, key, t, scope=name)``, and record its release. Each lane holds its
    mechanism's state and its devices' state (``client_state``), moved on here. A mechanism
    with stages before its server stage gets the values they hand on (``chain_slot``, their
    states in ``chains``)."""

    received = {  # each mechanism's stages before its server stage, engine-free
        name: chain_slot(pre_server([lane.mechanism]), key, t, values, chains.setdefault(name, {}))
        for name, lane in lanes.items()
    }

    def port_for(name: str, randomness: SlotRandomness, clients: Any) -> Any:
        return _port(family, received[name], task, randomness, path, requirements, clients)

    step = drive_slot(
        lanes, key, t, port_for, lambda name: SlotRandomness(seed, key, t, scope=name),
        halt_failures=False,
    )  # fmt: skip
    for name, stepped in step.stepped.items():
        lane = lanes[name]
        lane.state = stepped.state
        lane.clients = lane.clients if stepped.clients is None else stepped.clients
        release = next(e for e in stepped.events if isinstance(e, Release))
        traces[name].record(t, release, stepped.seconds)


def _runs(
    traces: Mapping[str, _Trace],
    truth: NDArray[np.float64],
    key: str,
    epsilon: float,
    window: int,
    seed: int,
    users: int,
) -> dict[str, Run]:
    """One ``Run`` per mechanism from its trace, all against the same ``truth``."""
    return {
        name: Run(
            mechanism=name,
            stream=key,
            epsilon=float(epsilon),
            window=window,
            seed=seed,
            users=users,
            estimates=trace.estimates,
            truth=truth,
            strategies=tuple(trace.strategies),
            total_bits=trace.bits,
            seconds=float(trace.seconds.sum()),
            slot_seconds=trace.seconds,
        )
        for name, trace in traces.items()
    }


def run_lockstep(
    family: Family,
    names: Sequence[str],
    source: SlotSource,
    epsilon: float,
    window: int,
    seed: int,
    *,
    path: ClientPath = "aggregate",
    task: EstimationTask | None = None,
    requirements: Requirements | None = None,
    stream_name: str | None = None,
    progress: tqdm | None = None,
    **options: Any,
) -> dict[str, Run]:
    """Run several of the family's mechanisms over ``source`` in lockstep, slot by slot.

    Each slot's values are fetched once and shared; every mechanism gets its own port and
    ``SlotRandomness(seed, stream_name, t, scope=name)``, so its releases do not depend on which
    mechanisms run beside it. ``requirements`` is a ``cdp`` family's registration (default: the
    family's synthetic assignment, ``Family.requirements``). ``options`` are the family's config
    options; ``progress`` advances by one per slot."""
    mechanisms = family.names(names)
    task = task if task is not None else task_for(source)
    key = stream_name if stream_name is not None else source.name
    config = family.make_config(
        epsilon=epsilon, window=window, population=source.users, task=task, **options
    )
    if family.needs_registration and requirements is None:  # everyone shares the default
        requirements = (
            Requirements(population=source.users)
            if family.requirements is None
            else Requirements(*family.requirements(source.users, epsilon, window, seed))
        )
    built = {name: family.build(name, config) for name in mechanisms}
    lanes = {
        name: Lane(mech, mech.initial_state(), mech.client_state()) for name, mech in built.items()
    }
    T, d = source.slots, task.d
    traces = {name: _Trace(np.empty((T, d)), np.zeros(T)) for name in mechanisms}
    truth = np.empty((T, d))
    chains: dict[str, StageStates] = {}
    scale = source.users if family.bench.counts else 1
    for t in range(1, T + 1):
        values = source.values(t)
        truth[t - 1] = source.truth(t) * scale
        _step_slot(family, lanes, traces, values, t, key=key, seed=seed, task=task,
                   path=path, requirements=requirements, chains=chains)  # fmt: skip
        if progress is not None:
            progress.update(1)
    return _runs(traces, truth, key, epsilon, window, seed, source.users)


def bench(
    family: Family,
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
    **options: Any,
) -> dict[str, Any]:
    """Average each mechanism's ``BenchSpec.score`` over seeds ``1..seeds``.

    Seed ``k`` generates the dataset (and a ``cdp`` family's registration) once and drives
    every mechanism on it; a ``file:PATH`` dataset is loaded once and fixes the slots. Returns
    ``{"params": {...}, "results": {MECH: {field: mean}}}`` with the family's ``fields``. A tqdm
    bar on stderr counts slots."""
    names = family.names(mechanisms)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    recorded = None
    if dataset.startswith("file:"):
        recorded = load_dataset(family, dataset, users, slots, 1, domain=domain, numeric=numeric)
        slots = recorded.slots
    else:
        load_dataset(family, dataset, users, 1, 1)  # validate the name before any work
    sums = {name: dict.fromkeys(family.bench.fields, 0.0) for name in names}
    with tqdm(total=seeds * slots, desc=f"{dataset} ×{len(names)}", unit="slot",
              file=sys.stderr, disable=not progress, dynamic_ncols=True,
              mininterval=0.5) as bar:  # fmt: skip
        for seed in range(1, seeds + 1):
            bar.set_postfix_str(f"seed {seed}/{seeds}")
            source = recorded or load_dataset(family, dataset, users, slots, seed)
            runs = run_lockstep(family, names, source, epsilon, window, seed, path=path,
                                progress=bar, **options)  # fmt: skip
            for name, run in runs.items():
                for k, v in family.bench.score(run).items():
                    sums[name][k] += v
    params: dict[str, Any] = {
        "family": family.name, "dataset": dataset, "users": users, "slots": slots,
        "epsilon": epsilon, "window": window, "seeds": seeds, "mechanisms": names, **options,
    }  # fmt: skip
    if not family.needs_registration:  # the client path of simulated LDP clients
        params["path"] = path
    results = {name: {k: v / seeds for k, v in sums[name].items()} for name in names}
    return {"params": params, "results": results}


def format_table(result: Mapping[str, Any]) -> str:
    """An aligned text table of a ``bench`` result: a parameter line, then one row per
    mechanism with each reported field."""
    params = {k: v for k, v in result.get("params", {}).items() if k != "mechanisms"}
    header = "  ".join(f"{k}={v}" for k, v in params.items())
    fields = list(next(iter(result["results"].values()), {}).keys())
    columns = ("mechanism", *fields)
    rows = [
        (name, *(f"{float(r[f]):.4g}" for f in fields)) for name, r in result["results"].items()
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    rule = "-" * len(line(columns))
    return "\n".join([header, rule, line(columns), rule, *(line(row) for row in rows), rule])
