"""User shards of one stream (issue 26): the cut of its batches and what crosses to its decision.

A stream configured with ``shards = k`` (on the ``markers`` clock, whose trust mode's port
follows from counts: ``Ports.shard_refusal``; central DP, or a closed LDP population asking
every user every slot) does its
per-user work — ingest, de-duplication, the registration lookup, carrying values forward and
counting each closed slot's values — on ``k`` user shards, keyed ``<stream>/shard-<i>``; only
each closed slot's counts per requirement group reach the stream's decision stage
(``operators.shard_decision``), which adds them up and steps the mechanisms.

``ShardCut`` runs where the batches are parsed: it cuts each batch of a sharded stream into one
piece per shard holding rows (a user's shard is ``mechanisms.stages.shard_of``: BLAKE2b of the
id, the same in every process) and sends an end-of-slot marker to every shard, so every shard's
clock sees the same markers in each partition's order.

Guarantee: a user's rows all reach one shard, in their partition's order; what leaves a shard
is integer counts per (slot, requirement group, bin) — no user id, no value, no row — and
integer sums do not depend on how the users were split, so the releases are byte-identical
for every shard count and process count (``tests/operators/test_user_shards.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.stages import shard_of
from privstream.operators.registration import Preferences
from privstream.schema.events import EventBatch

SHARD_MARK: Final = "/shard-"
"""Between a stream's name and its shard's number in the shard's key."""
MAX_SHARDS: Final = 256
"""The most shards a stream may have (each holds the state of its users and of every open
slot's counts)."""
CACHED_USERS: Final = 1 << 20
"""User ids whose shard a cut remembers (then it forgets them all and starts again)."""


_KNOWN: Final[dict[int, dict[Any, int]]] = {}
"""Per shard count, the users whose shard this process has hashed (``shards_of``)."""


def shards_of(users: list[Any], k: int) -> NDArray[np.int64]:
    """Each user's shard among ``k`` (ids hashed as text), remembered for the process: the
    cut and the shard tables hash a user once between them."""
    known = _KNOWN.setdefault(k, {})
    if len(known) > CACHED_USERS:
        known.clear()
    out = np.fromiter(map(known.get, users, itertools.repeat(-1)), dtype=np.int64,
                      count=len(users))  # fmt: skip
    for i in np.flatnonzero(out < 0).tolist():  # first seen by this process
        out[i] = known[users[i]] = shard_of(str(users[i]), k)
    return out


def shard_key(stream: str, shard: int) -> str:
    """The Bytewax key of ``stream``'s shard ``shard``."""
    return f"{stream}{SHARD_MARK}{shard}"


@dataclass(frozen=True)
class ShardPiece:
    """The rows of one batch that belong to shard ``shard`` of ``shards`` (a marker: none)."""

    shard: int
    shards: int
    batch: EventBatch


@dataclass(frozen=True)
class ShardSlots:
    """What shard ``shard`` of ``shards`` hands its stream's decision when it closes slots
    ``start..target`` (every shard closes the same ones: the clock is the markers').

    ``counts[t − start, g, j]``: its registered users of requirement ``groups[g]`` (a row
    ``(ε_i, w_i)``, ``requirement_pairs``) whose current value at slot ``t`` is bin ``j``. ``lowest``: the oldest slot it held reports for before
    the close (None: none), from which the decision finds the stream's first slot as the
    one-shard operator does (``SlotClock.first_slot``)."""

    stream: str
    shard: int
    shards: int
    start: int
    target: int
    lowest: int | None
    groups: NDArray[np.float64]
    counts: NDArray[np.int64]
    enrolled: int = 0
    """How many of its users hold a seat (a count, public like every report count: the
    population gauge)."""


@dataclass(frozen=True)
class ShardHalt:
    """Shard ``shard`` of ``stream`` failed (``reason``: an exception's type and place): the
    decision halts every mechanism of the stream, as the one-shard operator does."""

    stream: str
    shard: int
    reason: str


class ShardCut:
    """Cuts the batches of sharded streams (``shards``: stream → k) into shard pieces keyed by
    ``shard_key``; every other stream's batch goes on whole, keyed by its stream's name."""

    def __init__(self, shards: Mapping[str, int]) -> None:
        self.shards = dict(shards)

    def __call__(self, batch: EventBatch) -> list[tuple[str, Any]]:
        k = self.shards.get(batch.stream)
        if k is None:
            return [(batch.stream, batch)]
        return [(shard_key(batch.stream, p.shard), p) for p in self.cut(batch, k)]

    def cut(self, batch: EventBatch, k: int) -> list[ShardPiece]:
        """One piece per shard that has rows of ``batch``, in shard order; a marker (with its
        tag) goes to every shard, with the rows or alone."""
        marker = batch.complete_through is not None
        if len(batch) == 0:
            return [ShardPiece(i, k, batch) for i in range(k)] if marker else []
        which = shards_of(batch.users.tolist(), k)
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(k + 1))
        pieces = []
        for i in range(k):
            rows = order[bounds[i] : bounds[i + 1]]
            if rows.size == 0 and not marker:
                continue
            raw = None if batch.raw is None else [batch.raw[j] for j in rows.tolist()]
            pieces.append(
                ShardPiece(i, k, batch.select(rows, raw, batch.complete_through, batch.marker_tag))
            )
        return pieces


def requirement_pairs(
    state_epsilons: NDArray[np.float64] | None, state_windows: NDArray[np.int64] | None, n: int
) -> NDArray[np.float64]:
    """Each registered user's requirement as a row ``(ε_i, w_i)`` (−1 / 0 where they stated
    none: the stream default). Users with one row resolve to one class under any default,
    so counts per row add up to the class histograms (``mechanisms.client.GroupedCurator``)."""
    eps = np.full(n, -1.0) if state_epsilons is None else np.nan_to_num(state_epsilons, nan=-1.0)
    win = np.zeros(n) if state_windows is None else state_windows.astype(np.float64)
    return np.stack([eps[:n], win[:n]], axis=1)


def shard_tables(prefs: Preferences, shards: int) -> list[Preferences]:
    """Each shard's registration: its users, in the table's order."""
    tables: list[dict[str, tuple[float, int]]] = [{} for _ in range(shards)]
    which = shards_of(list(prefs.by_user), shards).tolist()
    for (user, requirement), shard in zip(prefs.by_user.items(), which, strict=True):
        tables[shard][user] = requirement
    return [prefs.part(t) for t in tables]
