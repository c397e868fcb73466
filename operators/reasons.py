"""The dead-letter reasons of the slotted operator as small integer codes, so a batch's rows
are classified in one NumPy array (0 = accepted), the operator's tagged output type, and the
notes a call leaves for the metrics board."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from privstream.schema.events import (
    DUPLICATE,
    FAR_FUTURE,
    LATE,
    OUT_OF_DOMAIN,
    POPULATION_FULL,
    REQUIREMENT_CHANGED,
    UNREGISTERED,
    USER_ID_KIND,
    WITHDRAWN,
)

Output = tuple[str, Any]  # ("release" | "ledger" | "extra" | "dead_letter", event)
REASON: Final = (
    "", USER_ID_KIND, OUT_OF_DOMAIN, LATE, FAR_FUTURE, POPULATION_FULL, REQUIREMENT_CHANGED,
    DUPLICATE, UNREGISTERED, WITHDRAWN,
)  # fmt: skip
CODE: Final = {reason: code for code, reason in enumerate(REASON)}


@dataclass
class Notes:
    """What one call of the slotted operator did that the metrics show, recorded as it happens
    and put on the metrics board after the call (``SlottedLogic.publish``): nothing is written
    to the process-global board mid-step. Counts and public clock facts only, never a value or a
    user id."""

    markers: list[tuple[str, str]] = field(default_factory=list)
    """(stream, why) of every end-of-slot marker that closed nothing."""
    events: list[tuple[str, int]] = field(default_factory=list)
    """(stream, accepted rows) per batch."""
    steps: list[tuple[str, str, float]] = field(default_factory=list)
    """(stream, mechanism, seconds) per mechanism step."""
    clocks: list[tuple[str, int | None, int]] = field(default_factory=list)
    """(stream, last closed slot, slots closed at once) per close."""
    populations: list[tuple[str, float, int, float]] = field(default_factory=list)
    """(stream, ε_c, w_c, composed spend) of the worst class after each accepted slot."""

    def ignored(self, stream: str, why: str) -> None:
        self.markers.append((stream, why))
