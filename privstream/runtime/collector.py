"""The garbage collector's thresholds while a flow runs (issue 26).

CPython's cyclic collector runs a young collection every 700 container allocations (tuples,
dicts, lists, objects) beyond deallocations, and older ones after 10 of those. A streaming
worker allocates containers by the million and keeps many of them alive for a while: each
report of a user not seated yet waits in its slot as a tuple until the slot closes, and a run
that reads a backlog ahead of its slot clock holds hundreds of thousands of them. Every young
and middle collection walks what survived so far, so at the default thresholds the collector
cost about 460 ns per held report — more than holding it (350 ns; ``bench/README.md`` §3).

``streaming_collector`` raises the thresholds for the run: a young collection every 50,000
allocations, a middle one every 20 of those. Cyclic garbage then lives a little longer (at most
50,000 young containers, a few MB); nothing that is freed by reference counting — almost
everything a flow drops — changes. A process whose thresholds are already higher, or whose
collector is off, keeps its own.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final

STREAMING_THRESHOLDS: Final = (50_000, 20, 10)
"""``gc.set_threshold`` while a flow runs: young, middle and old generation."""


@contextlib.contextmanager
def streaming_collector() -> Iterator[tuple[int, int, int]]:
    """Run the ``with`` block under ``STREAMING_THRESHOLDS`` (each threshold the higher of
    it and the process's own), then give the process its thresholds back; yields the ones
    in force."""
    previous = gc.get_threshold()
    wanted = tuple(max(a, b) for a, b in zip(STREAMING_THRESHOLDS, previous, strict=True))
    gc.set_threshold(*wanted)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*previous)
