"""A family from another distribution with an EXTRA OUTPUT and RELEASE-KEY PARTS (DPI's shape:
one release per query per slot, and an internal audit stream beside the releases).

Its mechanisms are LDP-IDS's LBU and LPU over a histogram of ``d = 3`` categories; each slot's
histogram is released as three records, one per query ``cat-0``, ``cat-1``, ``cat-2`` (the
frequency of that category; release id ``stream/mechanism/slot/cat-i``), and one record of the
internal output ``audit`` says what the slot did (its strategy and how many queries it
answered: facts already in the releases, nothing of a user). It declares both in this module;
nothing in privstream names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from privstream.families.spec import BenchSpec, Family, OutputSpec
from privstream.mechanisms import ldp_ids
from privstream.mechanisms.contract import Event, ExtraRecord, Release, Slot
from privstream.mechanisms.tasks import FrequencyTask

D: Final = 3
QUERIES: Final = tuple(f"cat-{i}" for i in range(D))


def per_query(events: Sequence[Event]) -> list[Event]:
    """Split each histogram release into one release per query (its category's frequency, key
    ``query``) and add the slot's ``audit`` record."""
    out: list[Event] = []
    for event in events:
        if not isinstance(event, Release):
            out.append(event)
            continue
        for i, query in enumerate(QUERIES):
            out.append(Release(
                stream=event.stream, mechanism=event.mechanism, slot=event.slot,
                strategy=event.strategy, estimate=(event.estimate[i],),
                source_slot=event.source_slot, guarantee=event.guarantee, details=event.details,
                key=(("query", query),),
            ))  # fmt: skip
        out.append(ExtraRecord(
            "audit", event.stream, event.mechanism, event.slot,
            {"strategy": event.strategy, "queries": len(QUERIES)},
        ))  # fmt: skip
    return out


class LBUQ(ldp_ids.LBU):
    """LBU, released per query."""

    name = "LBUQ"

    def _advance(self, state: Any, slot: Slot) -> list[Event]:
        return per_query(super()._advance(state, slot))


class LPUQ(ldp_ids.LPU):
    """LPU, released per query."""

    name = "LPUQ"

    def _advance(self, state: Any, slot: Slot) -> list[Event]:
        return per_query(super()._advance(state, slot))


def _score(run: Any) -> dict[str, float]:
    """Mean absolute error over the slots' releases (one frequency per query)."""
    estimates, truth = np.asarray(run.estimates), np.asarray(run.truth)
    return {"mae": float(np.abs(estimates - truth[:, : estimates.shape[1]]).mean())}


MECHANISMS: Final = {m.name: m for m in (LBUQ, LPUQ)}

FAMILY: Final = Family(
    name="example-outputs",
    summary="worked example: one release per query per slot and an internal audit output",
    mechanisms=MECHANISMS,
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=5,
    users=4000,
    default="LBUQ",
    task=FrequencyTask(D),
    release_key=("query",),
    outputs=(OutputSpec("audit", "what each slot did, per stream and mechanism"),),
    bench=BenchSpec(
        datasets=("lns",), files=False, counts=False, score=_score, fields=("mae",),
        mechanisms=tuple(MECHANISMS), users=4000, slots=20,
    ),
)  # fmt: skip
