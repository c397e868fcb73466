"""The SaO2 family (real-time private means of sparse binary streams, ε-LDP per horizon): its
``FAMILY`` entry, registered through the ``privstream.families`` entry point ``sao2``.

Everything SaO2 needs beyond the generic template is declared here: its task type (binary
vectors, ``binary = {d, kind}`` / ``--binary D[:KIND]``), its options (the paper's ``s``, ``r``,
``W``, ``m``, the lifetime budget and the δ of the stated central ε), its synthetic datasets,
its metrics (spec §10.7, the public ones), its lifetime division with the audit's checks
(``families.sao2_audit``), and its bench: the reproduction command ``privstream bench sao2``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from privstream.connectors import sao2_synthetic
from privstream.families.sao2_audit import LIFETIME
from privstream.families.spec import (
    BenchCommand,
    BenchSpec,
    Family,
    FlowTable,
    MetricSpec,
    Option,
    TaskType,
    at_least,
    choice,
    open_fraction,
)
from privstream.mechanisms.sao2 import Sao2Config, Sao2Ledger, Sao2Mechanism
from privstream.mechanisms.sao2_encoding import QUERY_FAMILIES, WEIGHT_STRATEGIES
from privstream.mechanisms.sao2_task import BINARY_KINDS, BinaryTask


def parse_binary(text: str) -> BinaryTask:
    """``D`` or ``D:KIND`` (``onehot``, the default, or ``bits``): ``--binary``."""
    d, _, kind = text.partition(":")
    try:
        return BinaryTask(int(d), kind or "onehot")  # type: ignore[arg-type]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected D or D:KIND (KIND one of {', '.join(BINARY_KINDS)}), got {text!r}: {exc}"
        ) from None


def _binary(t: FlowTable) -> BinaryTask:
    table = t.table("binary")
    table.only(("d", "kind"))
    kind = table.data.get("kind", "onehot")
    if kind not in BINARY_KINDS:
        raise table.error("kind", f"must be one of {', '.join(BINARY_KINDS)}, got {kind!r}")
    try:
        return BinaryTask(table.integer("d", 1), kind)
    except ValueError as exc:
        raise table.error("d", str(exc)) from None


BINARY: Final = TaskType(
    name="binary",
    key="binary",
    describe='binary = { d = D, kind = "onehot" | "bits" } (the mean of binary vectors)',
    parse_flow=_binary,
    classes=(BinaryTask,),
    flag="--binary",
    help="D or D:KIND: binary vectors of D bits, a category index (onehot) or a bitmask (bits)",
    parse_flag=parse_binary,
    show=lambda task: f"binary d = {task.d} ({task.kind})",
)
"""Binary vectors of ``d`` bits (``BinaryTask``): one-hot categories or bitmasks."""


def _levels(tally: Any, entry: Any) -> Sao2Ledger | None:
    details = getattr(entry, "details", None)
    return details if isinstance(details, Sao2Ledger) else None


def _per_level(name: str) -> Any:
    def read(tally: Any, entry: Any) -> Mapping[tuple[str, ...], float] | None:
        d = _levels(tally, entry)
        return None if d is None else {(str(h),): float(v) for h, v in enumerate(getattr(d, name))}

    return read


def _central(tally: Any, entry: Any) -> Mapping[tuple[str, ...], float] | None:
    d = _levels(tally, entry)
    if d is None:
        return None
    return {(str(h), d.accountant): float(e) for h, e in enumerate(d.epsilon_central)}


def _field(name: str) -> Any:
    def read(tally: Any, entry: Any) -> float | None:
        d = _levels(tally, entry)
        value = None if d is None else getattr(d, name)
        return None if value is None else float(value)

    return read


LEVEL: Final = ("stream", "mechanism", "level")
METRICS: Final = (
    MetricSpec("sao2_users_enrolled", "SaO2: users enrolled at each level of the horizon, n_h (public, data-independent).", _per_level("n_h"), labels=LEVEL),
    MetricSpec("sao2_symbols_per_user", "SaO2: ExSub symbols each user of a level emits over the horizon, m_h (public).", _per_level("m_h"), labels=LEVEL),
    MetricSpec("sao2_epsilon_local", "SaO2: ε, each enrolled user's local budget per horizon.", _field("epsilon")),
    MetricSpec("sao2_epsilon_central", "SaO2: the central ε_c a level's shuffled reports satisfy, by the named method (informational).", _central, labels=(*LEVEL, "method")),
    MetricSpec("sao2_delta", "SaO2: the δ of the stated central ε_c.", _field("delta")),
    MetricSpec("sao2_estimate_stderr", "SaO2: the analytic standard error of the last release's coordinates (public: depends on n_h and the slot only).", _field("stderr")),
    MetricSpec("sao2_budget_refusals", "SaO2: users refused at the horizon's start because their lifetime budget could not hold one more horizon.", _field("refused")),
    MetricSpec("sao2_horizon", "SaO2: the current horizon's index (0-based).", _field("horizon")),
)  # fmt: skip
"""The public metrics of spec §10.7 that a server computes (the shuffler's batch sizes and the
devices' clip and dropout counts belong to those parties: ``docs/families/sao2.md``)."""


def _m(text: str) -> tuple[int, ...]:
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or any(v < 1 for v in values):
        raise ValueError(f"must be m_0,m_1,... (integers >= 1, one per level), got {text!r}")
    return values


OPTIONS: Final = (
    Option("s", at_least(1), 8, "s: the most changes of a user's stream per horizon (clipped to it)", key="max_changes"),
    Option("r", at_least(2), 2, "r: the hierarchy's fan-out (the horizon --window should be a power of r)", key="fanout"),
    Option("weights", choice(*WEIGHT_STRATEGIES), "uniform", "the level weights W: how users are split among the levels"),
    Option("query_family", choice(*QUERY_FAMILIES), "prefix", "the queries --weights optimal weighs for"),
    Option("m", _m, None, "m_h per level, comma-separated (default: the optimal m* of each level)", key="symbols"),
    Option("horizons", at_least(1), 1, "k: the horizons a user may be enrolled in; each spends ε/k of the lifetime ε"),
    Option("delta", open_fraction, 1e-5, "δ of the central ε_c stated for the shuffled levels"),
)  # fmt: skip


def sao2_config(
    *, epsilon: float, window: int, population: int, task: Any, horizons: int = 1, **options: Any
) -> Sao2Config:
    """The config from the template's budget: the stream's ε (``share × population.epsilon``,
    ``--epsilon``) is the lifetime budget ``ε_life`` a user's guarantee states, and each of the
    ``horizons`` horizons a user may be enrolled in spends ``ε/horizons`` of it (spec §10.6)."""
    return Sao2Config(epsilon=epsilon / horizons, lifetime_epsilon=epsilon, window=window,
                      population=population, task=task, **options)  # fmt: skip


def sao2_scores(run: Any) -> dict[str, float]:
    """The error of the released mean vectors (spec §8.2): ``mae`` over slots and coordinates,
    ``tve`` the mean total-variation-like L1 error per slot (Σ_i |x̂̄_t,i − x̄_t,i|)."""
    err = np.abs(np.asarray(run.estimates) - np.asarray(run.truth))
    return {"mae": float(err.mean()), "tve": float(err.sum(axis=1).mean()),
            "publications": float(run.publications), "seconds": run.seconds}  # fmt: skip


def _with_task(make: Any) -> Any:
    """A dataset factory whose stream states its task (``BinaryTask`` of its ``d`` and kind),
    so ``--dataset sets`` needs no ``--binary``."""

    def factory(users: int, slots: int, seed: int, task: Any = None) -> Any:
        data = make(users, slots, seed, task)
        return dataclasses.replace(data, task=task or BinaryTask(data.d, data.kind))

    return factory


DATASETS: Final = {"trajectory": _with_task(sao2_synthetic.trajectory),
                   "sets": _with_task(sao2_synthetic.sets)}  # fmt: skip

FAMILY: Final = Family(
    name="sao2",
    summary="SaO2: private means of sparse binary streams (ε-LDP per horizon, shuffle-amplified)",
    mechanisms={Sao2Mechanism.name: Sao2Mechanism},
    config=sao2_config,
    epsilon=1.0,
    window=32,
    users=20_000,
    default=Sao2Mechanism.name,
    tasks=(BINARY,),
    task=BinaryTask(8),
    oracle_reports=False,
    options=OPTIONS,
    datasets=DATASETS,
    metrics=METRICS,
    divisions=(LIFETIME,),
    bench=BenchSpec(
        datasets=tuple(DATASETS), files=False, counts=False, score=sao2_scores,
        fields=("mae", "tve", "publications", "seconds"), mechanisms=(Sao2Mechanism.name,),
        users=20_000, slots=64,
        command=BenchCommand("privstream.cli.bench_sao2"),
    ),
)  # fmt: skip
