"""Shared test helpers for the device library: a seeded randomness source and a request."""

from __future__ import annotations

import random
from dataclasses import dataclass


class SeededRandomness:
    """A reproducible :class:`privstream.client.randomizers.Randomness` (tests only; devices use
    the OS CSPRNG)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._rng.randrange(n)

    def bits(self, k: int) -> int:
        return self._rng.getrandbits(k)


@dataclass(frozen=True)
class FakeRequest:
    """A request with the fields privstream.client.device.Request names; ``asked`` lists the
    users it asks (None: everyone)."""

    stream: str = "s"
    slot: int = 0
    round: int = 0
    purpose: str = "publication"
    oracle: str = "GRR"
    d: int = 4
    epsilon: float = 0.5
    window: int = 5
    division: str = "budget"
    asked: frozenset[str] | None = None

    def asks(self, user_id: str) -> bool:
        return self.asked is None or user_id in self.asked
