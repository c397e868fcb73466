"""One slot of a stream through the stages before its server, engine-free (the bench harness
and the conformance checks; the dataflow runs the same steps through ``operators.stages``).

It builds the slot's event batch (``schema.events``), so it lives above the engine-free core,
which never imports the event schema (design §2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privstream.mechanisms.client import absent_mask
from privstream.mechanisms.stages import Stage, StageStates, run_chain
from privstream.schema.events import EventBatch


def chain_slot(
    stages: Sequence[Stage], stream: str, slot: int, values: Any, states: StageStates
) -> Any:
    """One slot's ``values`` (one per user index, absent: NaN or -1) through ``stages`` as one
    event batch (``run_chain``), engine-free: the values the server receives, in a copy (the
    absent users stay absent). Without stages, ``values`` themselves."""
    if not stages:
        return values
    present = np.flatnonzero(~absent_mask(values))
    rows = np.asarray(values[present], dtype=np.float64)
    batch = EventBatch(stream, np.full(present.shape[0], slot, dtype=np.int64), present, rows)
    (received,) = run_chain(stages, [batch], states)
    out = values.copy()
    out[np.asarray(received.users, dtype=np.int64)] = received.values
    return out
