"""The CGM family (correlated Gaussian noise for numeric streams, (ε, δ)-LDP): its ``FAMILY``
entry, registered through the ``privstream.families`` entry point ``cgm``."""

from __future__ import annotations

from typing import Any, Final

from privstream.experiments import scores as utility
from privstream.families.spec import (
    BenchSpec,
    Family,
    MetricSpec,
    Option,
    choice,
    non_negative,
    open_fraction,
)
from privstream.families.tasks import BALL, MEAN
from privstream.mechanisms import cgm
from privstream.mechanisms.tasks import MeanTask


def _detail(name: str) -> Any:
    """A reader of the last ledger entry's Gaussian-DP detail ``name`` (None before one)."""
    return lambda tally, entry: getattr(entry.details, name, None) if entry is not None else None


METRICS: Final = (
    MetricSpec(
        "mu_spent",
        "Gaussian-DP families: μ the most-charged user has spent in the budget's scope.",
        _detail("mu_spent"),
    ),
    MetricSpec(
        "epsilon_spent",
        "Gaussian-DP families: that spend as ε at the family's configured δ.",
        _detail("epsilon_spent"),
    ),
)
"""The spend in μ and in ε at the configured δ (public: the ledger's own account)."""

FAMILY: Final = Family(
    name="cgm",
    summary="CGM: correlated Gaussian noise for numeric streams ((ε, δ)-LDP)",
    mechanisms=cgm.MECHANISMS,
    config=cgm.CgmConfig,
    epsilon=1.0,
    window=48,
    users=5000,
    default="CGM",
    tasks=(MEAN, BALL),
    window_default="slots",
    oracle_reports=False,
    delta_option="delta",
    task=MeanTask(0.0, 1.0),
    options=(
        Option("delta", open_fraction, 1e-5, "δ of the (ε, δ) budget"),
        Option("bound", non_negative, 0.05, "C: the most a user's value moves per slot (raw units)"),
        Option("budget_scope", choice("stream", "timestamp"), "stream", "stream (one budget for l = --window reports) or timestamp (per slot)"),
        Option("lag", int, 1, "j: the values repeat with this period; one noise chain per phase"),
    ),
    metrics=METRICS,
    bench=BenchSpec(
        datasets=("taxi", "webtraffic", "sine"),
        files=False,
        counts=False,
        score=utility.cgm_scores,
        fields=("mse", "mse_stable", "publications", "seconds"),
        mechanisms=tuple(cgm.MECHANISMS),
        users=5000,
        slots=48,
    ),
)  # fmt: skip
