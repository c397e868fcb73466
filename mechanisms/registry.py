"""Every mechanism privstream ships, by family, for the CLI and the conformance suite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from privstream.mechanisms import ldp_ids, personalized
from privstream.mechanisms.contract import Mechanism

TrustMode = Literal["cdp", "ldp-simulated"]


@dataclass(frozen=True)
class Registered:
    """A mechanism and how to build it with the paper's defaults for a given population.

    ``trust`` is the trust mode whose port its slots carry (design §4): ``ldp-simulated`` slots
    hold a ``SimulatedClientPort``, ``cdp`` slots a ``SimulatedCurator``.
    """

    family: str
    name: str
    example: Callable[[int], Mechanism[Any, Any]]
    trust: TrustMode = "ldp-simulated"


def _ldp_ids(name: str) -> Registered:
    def example(population: int) -> Mechanism[Any, Any]:
        return ldp_ids.build(
            name, ldp_ids.LdpIdsConfig(epsilon=1.0, window=5, population=population)
        )

    return Registered("ldp-ids", name, example)


def _personalized(name: str) -> Registered:
    def example(population: int) -> Mechanism[Any, Any]:
        return personalized.build(
            name, personalized.PersonalizedConfig(population=population, epsilon=1.0, window=5)
        )

    return Registered("personalized", name, example, trust="cdp")


REGISTRY: tuple[Registered, ...] = (
    *(_ldp_ids(name) for name in ldp_ids.MECHANISMS),
    *(_personalized(name) for name in personalized.MECHANISMS),
)
