"""The DPI family (user-level ε-DP over an infinite stream, Feng et al.): its ``FAMILY`` entry,
registered through the ``privstream.families`` entry point ``dpi`` (``pyproject.toml``).

Everything DPI needs beyond the generic template is declared here: its options (the paper's
symbols; ``--lambda`` is the field ``lam``), its synthetic datasets, its release key (one
release per sampled query), its internal audit output, its metrics, and its own division
``dpi-series`` with the audit's recomputation of a lifetime series ledger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from privstream.connectors import dpi_synthetic
from privstream.families.spec import BenchSpec, Family, MetricSpec, Option, OutputSpec
from privstream.families.tasks import FREQUENCY
from privstream.mechanisms import dpi
from privstream.mechanisms.accounting import AllUsers, DivisionSpec
from privstream.mechanisms.dpi import DpiLedger
from privstream.mechanisms.dpi_boosting import QUERIES
from privstream.mechanisms.dpi_series import BudgetSeries
from privstream.mechanisms.ledger import clamp_spend
from privstream.mechanisms.tasks import FrequencyTask


def recompute(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """The audit of a DPI series ledger from its public entries (slot order): at each entry the
    lifetime spend recomputed from the series itself — ``Σ ε_{i_t}`` over the entries so far,
    each ε_{i_t} the series value of its index under the entry's public parameters (the paper
    mode's charge is 4·ε_i, A10) — against the budget ε. A series index used twice breaks the
    argument that the spend converges, so a repeat adds the whole budget (a finding)."""
    out, spent, used = [], 0.0, set()
    series_of: dict[tuple[Any, ...], BudgetSeries] = {}
    for entry in entries:
        d, budget = entry["details"], float(entry["classes"][0]["budget"])
        index = int(d["series_index"])
        if index:
            p = d["series"]
            key = (
                p["epsilon"],
                p["mu"],
                p["zeta"],
                p["delta_q"],
                p["eta_mode"],
                p["allow_underspend"],
            )
            if key not in series_of:
                series_of[key] = BudgetSeries(*key)
            spent += series_of[key].nominal_charge(index) if float(d["nominal_charge"]) else 0.0
            spent += budget if index in used else 0.0
            used.add(index)
        out.append((int(entry["slot"]), spent, budget))
    return out


SERIES: Final = DivisionSpec(
    dpi.DIVISION,
    lambda _spend, _personalized: AllUsers(),
    recompute,
    summary="every user charged one element ε_t of a convergent series per slot, each element once",
)


def _dpi(entry: Any) -> DpiLedger | None:
    """The entry's DPI details, or None: before the first entry, and for another family's
    entry (declared gauges are read for every (stream, mechanism) of the process)."""
    details = getattr(entry, "details", None)
    return details if isinstance(details, DpiLedger) else None


def _detail(name: str) -> Any:
    def read(_tally: Any, entry: Any) -> float | None:
        details = _dpi(entry)
        return None if details is None else float(getattr(details, name))

    return read


def _spent(name: str) -> Any:
    """A lifetime spend, clamped to ε within the ledger's own float slack (``clamp_spend``:
    Σ ε_i = ε exactly in ``budget_exact`` may round a hair above ε), as the generic spend
    gauges show theirs — so a rule comparing it with ε never fires on an honest stream."""

    def read(_tally: Any, entry: Any) -> float | None:
        details = _dpi(entry)
        return None if details is None else clamp_spend(getattr(details, name), entry.budget)

    return read


def _remaining(_tally: Any, entry: Any) -> float | None:
    details = _dpi(entry)
    if details is None:
        return None
    return max(float(entry.budget) - clamp_spend(details.nominal_spent, entry.budget), 0.0)


def _exhausted(_tally: Any, entry: Any) -> float | None:
    details = _dpi(entry)
    return None if details is None else float(details.exhausted)


METRICS: Final = (
    MetricSpec("dpi_epsilon_slot", "DPI: the last slot's series element ε_t (public).", _detail("series_epsilon")),
    MetricSpec("dpi_series_index", "DPI: the last slot's series index i_t (public).", _detail("series_index")),
    MetricSpec("dpi_epsilon_spent_nominal", "DPI: the nominal lifetime spend Σ ε_t, against ε (public; never above ε).", _spent("nominal_spent")),
    MetricSpec("dpi_epsilon_spent_conservative", "DPI: the conservative lifetime account of §3.10 (public; the paper's update may exceed ε here).", _spent("conservative_spent")),
    MetricSpec("dpi_epsilon_remaining", "DPI: ε minus the nominal lifetime spend (public; never renews).", _remaining),
    MetricSpec("dpi_budget_exhausted", "DPI: 1 once the series has no element left or the nominal account is full.", _exhausted),
)  # fmt: skip
"""Data-independent numbers of the series ledger (spec §10, "public-safe")."""


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive finite number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0, got {text!r}")
    return value


def _choice(*allowed: str) -> Any:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {text!r}")
        return text

    return parse


def _queries(text: str) -> tuple[str, ...]:
    names = tuple(q.strip() for q in text.split(",") if q.strip())
    if not names or any(q not in QUERIES for q in names) or len(set(names)) != len(names):
        raise ValueError(f"must be distinct names among {', '.join(QUERIES)}, got {text!r}")
    return names


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {text!r}")
    return value


OPTIONS: Final = (
    Option("mu", _positive, 0.05, "μ: extra tolerance of the score (d ≥ λ+μ scores −1)"),
    Option("zeta", _positive, 0.1, "ζ: decay-rate constant of the budget series"),
    Option("lam", _non_negative, 0.2, "λ: synopsis error bound (d ≤ λ scores +1)", key="lambda"),
    Option("rba", _choice("alg3", "alg4"), "alg3", "random budget allocation: alg3 (Exp rate Λ) or alg4 (index blocks)"),
    Option("rba_rate", _positive, 1e8, "Λ: the rate of Algorithm 3's exponential draw", key="rba_lambda"),
    Option("queries", _queries, "acc,inst", "the public query pool: acc, inst, mean"),
    Option("synopses", _count, 20, "n_A: synopses drawn and averaged per release"),
    Option("pool_size", _count, 6500, "N: synopses in the public pool"),
    Option("eta_mode", _choice("budget_exact", "paper_thm54"), "budget_exact", "the series: budget_exact (Σ ε_i = ε) or paper_thm54 (reproduction, 4ε)"),
    Option("sensitivity_mode", _choice("unbounded", "bounded"), "unbounded", "bounded: smooth each slot's PDF with a public prior of mass --prior-mass"),
    Option("prior_mass", _non_negative, 0.0, "N₀: the public prior's mass under --sensitivity-mode bounded"),
)  # fmt: skip


def dpi_scores(run: Any) -> dict[str, float]:
    """MSE (per-bin mean, and SSE) and KL(y‖R) of the releases against the slot's distribution
    (spec §8.2; ``q_inst``'s truth: run the bench with ``--queries inst``)."""
    r, y = np.asarray(run.estimates), np.asarray(run.truth)
    err = (r - y) ** 2
    floor = np.maximum(r, 1e-12)
    floor = floor / floor.sum(axis=1, keepdims=True)
    kl = np.where(y > 0, y * np.log(np.where(y > 0, y, 1.0) / floor), 0.0).sum(axis=1)
    return {"mse": float(err.mean()), "sse": float(err.sum(axis=1).mean()),
            "kl": float(kl.mean()), "seconds": run.seconds}  # fmt: skip


DATASETS: Final = {"synthetic": dpi_synthetic.dynamic, "dynamic": dpi_synthetic.dynamic,
                   **{f"dynamic-{j}": dpi_synthetic.dynamic_set(j) for j in range(1, 11)}}  # fmt: skip

FAMILY: Final = Family(
    name="dpi",
    summary="DPI: user-level ε-DP over an infinite stream (trusted curator)",
    mechanisms=dpi.MECHANISMS,
    config=dpi.DpiConfig,
    epsilon=2.0,
    window=1,
    users=20_000,
    default="DPI",
    tasks=(FREQUENCY,),
    task=FrequencyTask(100),
    options=OPTIONS,
    datasets=DATASETS,  # type: ignore[arg-type]
    metrics=METRICS,
    release_key=("query",),
    outputs=(OutputSpec("dpi-audit", "DPI's raw per-slot statistics (users charged, largest leak): internal"),),
    divisions=(SERIES,),
    bench=BenchSpec(
        datasets=tuple(DATASETS), files=False, counts=False, score=dpi_scores,
        fields=("mse", "sse", "kl", "seconds"), mechanisms=tuple(dpi.MECHANISMS),
        users=20_000, slots=300,
    ),
)  # fmt: skip
