"""The personalized w-event family (central DP, per-user ``(ε_i, w_i)``): its ``FAMILY`` entry,
registered through the ``privstream.families`` entry point ``personalized``."""

from __future__ import annotations

from typing import Final

from privstream.experiments import scores as utility
from privstream.families.spec import BenchSpec, Family
from privstream.families.tasks import FREQUENCY
from privstream.mechanisms import personalized

FAMILY: Final = Family(
    name="personalized",
    summary="personalized w-event mechanisms (central DP, per-user (ε_i, w_i))",
    mechanisms=personalized.MECHANISMS,
    config=personalized.PersonalizedConfig,
    epsilon=0.6,
    window=120,
    users=20_000,
    default="PBD",
    tasks=(FREQUENCY,),
    requirements=personalized.requirement_arrays,
    bench=BenchSpec(
        datasets=("tlns", "sin", "log"),
        files=False,
        counts=True,
        score=utility.personalized_scores,
        fields=("amre", "ln_amre", "ajsd", "publications", "seconds"),
        mechanisms=("BD", "BA", "PBD", "PBA"),
        users=10_000,
        slots=10_000,
        independent=True,
    ),
)
