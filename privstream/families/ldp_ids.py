"""The LDP-IDS family (w-event ε-LDP, Ren et al.): its ``FAMILY`` entry, registered through the
``privstream.families`` entry point ``ldp-ids`` (``pyproject.toml``)."""

from __future__ import annotations

from typing import Final

from privstream.experiments import scores as utility
from privstream.families.spec import (
    BenchSpec,
    Family,
    MetricSpec,
    Option,
    choice,
    non_negative,
    open_fraction,
    positive,
)
from privstream.families.tasks import FREQUENCY, MEAN
from privstream.mechanisms import ldp_ids, ldp_ids_dsat, ldp_ids_rescue

METRICS: Final = (
    MetricSpec(
        "dissimilarity",
        "Last de-biased dissimilarity estimate (private).",
        lambda tally, entry: tally.last_dissimilarity,
    ),
    MetricSpec(
        "publication_error",
        "Last potential publication error (public).",
        lambda tally, entry: tally.last_error,
    ),
)
"""LBD/LBA/LPD/LPA's decision inputs: both are computed from perturbed reports only."""

MECHANISMS: Final = {**ldp_ids.MECHANISMS, **ldp_ids_dsat.MECHANISMS, **ldp_ids_rescue.MECHANISMS}
"""The paper's seven mechanisms and its adapted stream algorithms (DSAT_w, RescueDP)."""


def _publications(text: str) -> int:
    """DSAT's C; 0 (the default) stands for ``⌈w/5⌉``."""
    value = int(text)
    if value < 0:
        raise ValueError(f"publications must be >= 1 (0: ⌈w/5⌉), got {value}")
    return value


OPTIONS: Final = (
    Option("beta", open_fraction, 0.5, "share β of the dissimilarity step"),
    Option("publications", _publications, 0, "DSAT's C, publications per window (0: ⌈w/5⌉)"),
    Option("threshold_scale", positive, 1.0, "DSAT: scale of the PID step and of the [0, 2] threshold clamp"),
    Option("process_variance", non_negative, 0.0025**2, "RescueDP: the Kalman filter's process variance Q (a public prior)"),
    Option("interval_rule", choice("normalized", "literal"), "normalized", "RescueDP's interval update: normalized (δ²/V) or literal ((δ/V)²)"),
)  # fmt: skip

FAMILY: Final = Family(
    name="ldp-ids",
    summary="LDP-IDS mechanisms (w-event ε-LDP)",
    mechanisms=MECHANISMS,
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=20,
    users=200_000,
    default="LPA",
    tasks=(FREQUENCY, MEAN),
    options=OPTIONS,
    metrics=METRICS,
    bench=BenchSpec(
        datasets=("lns", "sin", "log", "lns-con", "sin-con", "log-con"),
        files=True,
        counts=False,
        score=utility.ldp_ids_scores,
        fields=("mre", "mae", "bits_per_user", "publications", "seconds"),
        mechanisms=tuple(MECHANISMS),
        users=200_000,
        slots=800,
    ),
)
