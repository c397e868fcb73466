"""A family from another distribution with an EXTRA OUTPUT and RELEASE-KEY PARTS (DPI's shape:
one release per query per slot, and an internal audit stream beside the releases).

Its mechanisms are LDP-IDS's LBU and LPU over a histogram of ``d`` categories (2 for the
synthetic binary datasets, 3 with ``--domain 3``); each slot's histogram is released as ``d``
records, one per query ``cat-0`` … ``cat-{d-1}`` (the frequency of that category; release id
``stream/mechanism/slot/cat-i``), and one record of the internal output ``audit`` says what
the slot did (its strategy and how many queries it answered: facts already in the releases,
nothing of a user). Guarantee: LBU's and LPU's w-event ε-LDP (the queries of a slot are the
categories of one privatised histogram). It declares both in this module; nothing in
privstream names it.
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


def query(i: int) -> str:
    """The key part of category ``i``'s query."""
    return f"cat-{i}"


def per_query(events: Sequence[Event]) -> list[Event]:
    """Split each histogram release into one release per query (its category's frequency, key
    ``query``) and add the slot's ``audit`` record."""
    out: list[Event] = []
    for event in events:
        if not isinstance(event, Release):
            out.append(event)
            continue
        for i, value in enumerate(event.estimate):
            out.append(Release(
                stream=event.stream, mechanism=event.mechanism, slot=event.slot,
                strategy=event.strategy, estimate=(value,),
                source_slot=event.source_slot, guarantee=event.guarantee, details=event.details,
                key=(("query", query(i)),),
            ))  # fmt: skip
        out.append(ExtraRecord(
            "audit", event.stream, event.mechanism, event.slot,
            {"strategy": event.strategy, "queries": len(event.estimate)},
        ))  # fmt: skip
    return out


class LBUQ(ldp_ids.LBU):
    """LBU (spec §3.1), released per query."""

    name = "LBUQ"

    def _advance(self, state: Any, slot: Slot) -> list[Event]:
        return per_query(super()._advance(state, slot))


class LPUQ(ldp_ids.LPU):
    """LPU (spec §3.3), released per query."""

    name = "LPUQ"

    def _advance(self, state: Any, slot: Slot) -> list[Event]:
        return per_query(super()._advance(state, slot))


def _score(run: Any) -> dict[str, float]:
    """Mean absolute error of the first query's release (``cat-0``: the harness scores a
    slot's first release) against category 0's truth."""
    estimates, truth = np.asarray(run.estimates), np.asarray(run.truth)
    return {"mae": float(np.abs(estimates[:, 0] - truth[:, 0]).mean())}


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
