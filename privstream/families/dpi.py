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
from fractions import Fraction
from typing import Any, Final

import numpy as np

from privstream.connectors import dpi_synthetic
from privstream.families.spec import (
    BenchSpec,
    Family,
    MetricSpec,
    Option,
    OutputSpec,
    at_least,
    choice,
    non_negative,
    positive,
)
from privstream.families.tasks import FREQUENCY
from privstream.mechanisms import dpi, dpi_baselines
from privstream.mechanisms.accounting import AllUsers, DivisionSpec
from privstream.mechanisms.dpi import DpiLedger
from privstream.mechanisms.dpi_boosting import QUERIES
from privstream.mechanisms.dpi_series import BudgetSeries
from privstream.mechanisms.ledger import clamp_spend
from privstream.mechanisms.tasks import FrequencyTask

SERIES_KEYS: Final = ("epsilon", "mu", "zeta", "delta_q", "eta_mode", "allow_underspend")
"""The public series parameters every DPI ledger entry states (``details.series``)."""


def _series_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    p = entry["details"]["series"]
    return tuple(p[name] for name in SERIES_KEYS)


class _Series:
    """The series of each distinct public parameter tuple, built once per audit."""

    def __init__(self) -> None:
        self._of: dict[tuple[Any, ...], BudgetSeries] = {}

    def __call__(self, entry: Mapping[str, Any]) -> BudgetSeries:
        key = _series_key(entry)
        if key not in self._of:
            self._of[key] = BudgetSeries(*key)
        return self._of[key]


def recompute(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """The audit of a DPI series ledger from its public entries (slot order): at each entry the
    lifetime spend recomputed from the series itself — ``Σ ε_{i_t}`` over the entries so far,
    each ε_{i_t} the series value of its index under the entry's public parameters (the paper
    mode's charge is 4·ε_i, A10), never reset — against the budget ε. Whether each entry's
    own numbers are those values, and each index used once, is ``verify``'s."""
    out, spent, series = [], 0.0, _Series()
    for entry in entries:
        index = int(entry["details"]["series_index"])
        if index:
            spent += series(entry).nominal_charge(index)
        out.append((int(entry["slot"]), spent, float(entry["classes"][0]["budget"])))
    return out


def verify(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """What is inconsistent in a DPI series ledger (slot order), in words per slot: a series
    index used twice (the spend converges only if each element is spent once); an ε_t
    (``series_epsilon``, ``nominal_charge``, the class's ``charged``) that is not the series
    value of its index; a series whose ε is not the budget (its sum would not be bounded by
    it); series parameters or a budget other than the first entry's (the ledger never
    resets); a ``nominal_spent`` other than the class's ``spent``."""
    out: list[tuple[int, str]] = []
    first_use: dict[int, int] = {}
    series = _Series()
    bound = (
        (_series_key(entries[0]), float(entries[0]["classes"][0]["budget"])) if entries else None
    )
    for entry in entries:
        slot, d, one = int(entry["slot"]), entry["details"], entry["classes"][0]
        if (_series_key(entry), float(one["budget"])) != bound:
            out.append((slot, f"series parameters or budget {dict(d['series'])}, "
                              f"{one['budget']} differ from the first entry's {bound}"))  # fmt: skip
            continue
        if not math.isclose(float(d["series"]["epsilon"]), float(one["budget"]), rel_tol=1e-9):
            out.append((slot, f"the series' epsilon {d['series']['epsilon']!r} is not the "
                              f"budget {one['budget']!r} its sum must stay within"))  # fmt: skip
        index = int(d["series_index"])
        if index and index in first_use:
            out.append(
                (slot, f"series index {index} used twice (first at slot {first_use[index]})")
            )
        if index:
            first_use.setdefault(index, slot)
        out.extend((slot, why) for why in _values(series(entry), index, d, one))
    return out


def _values(
    series: BudgetSeries, index: int, d: Mapping[str, Any], one: Mapping[str, Any]
) -> list[str]:
    """The entry's ε_t numbers that differ from the series value of its index (0 for none)."""
    epsilon = series.epsilon_i(index) if index else 0.0
    charge = series.nominal_charge(index)
    wrong = [
        f"{name} {float(value)!r} is not the series value {want!r} of index {index}"
        for name, value, want in (("series_epsilon", d["series_epsilon"], epsilon),
                                  ("nominal_charge", d["nominal_charge"], charge),
                                  ("classes[0].charged", one["charged"], charge))
        if not math.isclose(float(value), want, rel_tol=1e-9, abs_tol=1e-300)
    ]  # fmt: skip
    if not math.isclose(float(d["nominal_spent"]), float(one["spent"]), rel_tol=1e-9):
        wrong.append(f"nominal_spent {d['nominal_spent']!r} but classes[0].spent {one['spent']!r}")
    return wrong


SERIES: Final = DivisionSpec(
    dpi.DIVISION,
    lambda _spend, _personalized: AllUsers(),
    recompute,
    summary="every user charged one element ε_t of a convergent series per slot, each element once",
    verify=verify,
)


def recompute_horizon(entries: Sequence[Mapping[str, Any]]) -> list[tuple[int, float, float]]:
    """The audit of a finite-horizon ledger (baseline B3, ``Laplace-horizon``) from its public
    entries (slot order): every entry released a noisy histogram, so each charges ``ε/T`` with
    ``T`` its public ``horizon``; the spend after ``n`` entries is ``ε·n/T``, over the budget
    from entry ``T+1`` on (a finding), whatever the entries claim."""
    out = []
    for n, entry in enumerate(entries, start=1):
        budget = float(entry["classes"][0]["budget"])
        spent = float(Fraction(budget) * n / int(entry["details"]["horizon"]))
        out.append((int(entry["slot"]), spent, budget))
    return out


HORIZON: Final = DivisionSpec(
    dpi_baselines.HORIZON_DIVISION,
    lambda _spend, _personalized: AllUsers(),
    recompute_horizon,
    summary="every user charged ε/T at each slot of a finite horizon T, then the stream stops",
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
    MetricSpec("dpi_budget_exhausted", "DPI: 1 when the last slot spent nothing because the series or the nominal account had no room left.", _exhausted),
)  # fmt: skip
"""Data-independent numbers of the series ledger (spec §10, "public-safe")."""


def _queries(text: str) -> tuple[str, ...]:
    names = tuple(q.strip() for q in text.split(",") if q.strip())
    if not names or any(q not in QUERIES for q in names) or len(set(names)) != len(names):
        raise ValueError(f"must be distinct names among {', '.join(QUERIES)}, got {text!r}")
    return names


OPTIONS: Final = (
    Option("mu", positive, 0.05, "μ: extra tolerance of the score (d ≥ λ+μ scores −1)"),
    Option("zeta", positive, 0.1, "ζ: decay-rate constant of the budget series"),
    Option("lam", non_negative, 0.2, "λ: synopsis error bound (d ≤ λ scores +1)", key="lambda"),
    Option("rba", choice("alg3", "alg4"), "alg3", "random budget allocation: alg3 (Exp rate Λ) or alg4 (index blocks)"),
    Option("rba_rate", positive, 1e8, "Λ: the rate of Algorithm 3's exponential draw", key="rba_lambda"),
    Option("queries", _queries, "acc,inst", "the public query pool: acc, inst, mean"),
    Option("synopses", at_least(1), 20, "n_A: synopses drawn and averaged per release"),
    Option("pool_size", at_least(1), 6500, "N: synopses in the public pool"),
    Option("eta_mode", choice("budget_exact", "paper_thm54"), "budget_exact", "the series: budget_exact (Σ ε_i = ε) or paper_thm54 (reproduction, 4ε)"),
    Option("sensitivity_mode", choice("unbounded", "bounded"), "unbounded", "bounded: smooth each slot's PDF with a public prior of mass --prior-mass"),
    Option("prior_mass", non_negative, 0.0, "N₀: the public prior's mass under --sensitivity-mode bounded"),
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

MECHANISMS: Final = {**dpi.MECHANISMS, **dpi_baselines.MECHANISMS}
"""DPI, its paper and α ≡ 0 modes, and the harness baselines B1 (``DPI-uniform``) and B3
(``Laplace-horizon``, horizon ``T = --window``) of spec §7."""

FAMILY: Final = Family(
    name="dpi",
    summary="DPI: user-level ε-DP over an infinite stream (trusted curator)",
    mechanisms=MECHANISMS,
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
    divisions=(SERIES, HORIZON),
    bench=BenchSpec(
        datasets=tuple(DATASETS), files=False, counts=False, score=dpi_scores,
        fields=("mse", "sse", "kl", "seconds"), mechanisms=tuple(dpi.MECHANISMS),
        users=20_000, slots=300,
    ),
)  # fmt: skip
