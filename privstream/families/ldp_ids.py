"""The LDP-IDS family (w-event ε-LDP, Ren et al.): its ``FAMILY`` entry, registered through the
``privstream.families`` entry point ``ldp-ids`` (``pyproject.toml``)."""

from __future__ import annotations

from typing import Final

from privstream.experiments import scores as utility
from privstream.families.spec import BenchSpec, Family, MetricSpec, Option, open_fraction
from privstream.families.tasks import FREQUENCY, MEAN
from privstream.mechanisms import ldp_ids

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

FAMILY: Final = Family(
    name="ldp-ids",
    summary="LDP-IDS mechanisms (w-event ε-LDP)",
    mechanisms=ldp_ids.MECHANISMS,
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=20,
    users=200_000,
    default="LPA",
    tasks=(FREQUENCY, MEAN),
    options=(Option("beta", open_fraction, 0.5, "share β of the dissimilarity step"),),
    metrics=METRICS,
    bench=BenchSpec(
        datasets=("lns", "sin", "log", "lns-con", "sin-con", "log-con"),
        files=True,
        counts=False,
        score=utility.ldp_ids_scores,
        fields=("mre", "mae", "bits_per_user", "publications", "seconds"),
        mechanisms=tuple(ldp_ids.MECHANISMS),
        users=200_000,
        slots=800,
    ),
)
