"""The dead-letter reasons of the slotted operator as small integer codes, so a batch's rows
are classified in one NumPy array (0 = accepted), and the operator's tagged output type."""

from __future__ import annotations

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

Output = tuple[str, Any]  # ("release" | "ledger" | "dead_letter", event)
REASON: Final = (
    "", USER_ID_KIND, OUT_OF_DOMAIN, LATE, FAR_FUTURE, POPULATION_FULL, REQUIREMENT_CHANGED,
    DUPLICATE, UNREGISTERED, WITHDRAWN,
)  # fmt: skip
CODE: Final = {reason: code for code, reason in enumerate(REASON)}
