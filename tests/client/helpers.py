"""Shared test helpers for the device library: a seeded randomness source and a request."""

from __future__ import annotations

from dataclasses import dataclass

from privstream.experiments.reports_loop import SeededRandomness

__all__ = ["FakeRequest", "SeededRandomness"]


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
