"""Every mechanism privstream ships, by family, for the CLI and the conformance suite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from privstream.mechanisms import ldp_ids
from privstream.mechanisms.contract import Mechanism


@dataclass(frozen=True)
class Registered:
    """A mechanism and how to build it with the paper's defaults for a given population."""

    family: str
    name: str
    example: Callable[[int], Mechanism[Any, Any]]


def _ldp_ids(name: str) -> Registered:
    def example(population: int) -> Mechanism[Any, Any]:
        return ldp_ids.build(
            name, ldp_ids.LdpIdsConfig(epsilon=1.0, window=5, population=population)
        )

    return Registered("ldp-ids", name, example)


REGISTRY: tuple[Registered, ...] = tuple(_ldp_ids(name) for name in ldp_ids.MECHANISMS)
