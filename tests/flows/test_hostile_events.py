"""Hostile control and stale events (reliability audit, items 4, 5 and 9).

* A far-future end-of-slot marker made the flow step empty slots at 100% CPU, ignore SIGTERM
  and stay stuck after a restart: markers now obey the events' gap limit and become
  ``far_future_slot`` dead letters.
* Events far behind the stream, arriving before its first slot closed, moved the stream's start
  back (3,000 extra releases, changed valid ones, no dead letter): events behind the watermark
  are ``late_event`` dead letters from the first batch on.
* A marker for an already released slot was ignored silently: it is counted.
* A halted mechanism writes a ``halt`` record to the ledger output (the auditor needs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privstream.events import EventBatch
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.registry import LDP_IDS
from privstream.operators.family import family_mechanisms
from privstream.operators.metrics import INTERNAL
from privstream.operators.slotting import SlottingConfig
from tests.attacks.helpers import Outputs, run_operator

N, T, GAP = 300, 12, 50


def slot(t: int, stream: str = "s", marker: bool = True) -> EventBatch:
    rng = np.random.default_rng(t)
    values = (rng.random(N) < 0.5).astype(float)
    return EventBatch(stream, np.full(N, t), np.arange(N), values, None, t if marker else None)


def marker(t: int, stream: str = "s") -> EventBatch:
    empty = np.zeros(0, dtype=np.int64)
    return EventBatch(stream, empty, empty, np.zeros(0), None, t)


def run(items: list[Any]) -> Outputs:
    config = LdpIdsConfig(epsilon=1.0, window=4, population=N)
    slotting = SlottingConfig(max_slot_gap=GAP, close_on_eof=False)
    return run_operator(
        items,
        lambda keyed: family_mechanisms(
            "mech",
            keyed,
            family=LDP_IDS,
            mechanism="LBU",
            config=config,
            secret=3,
            slotting=slotting,
        ),
    )


def ignored(reason: str) -> float:
    """The internal counter of ignored markers (it is operational, not public)."""
    got = INTERNAL.get_sample_value(
        "privstream_internal_markers_ignored_total", {"stream": "s", "reason": reason}
    )
    return got or 0.0


def test_a_far_future_marker_is_a_dead_letter_not_a_million_empty_slots() -> None:
    clean = run([slot(t) for t in range(1, T + 1)])
    before = ignored("far_future")
    items = [slot(t) for t in range(1, 6)] + [marker(5 + GAP + 1)]
    items += [slot(t) for t in range(6, T + 1)]
    hostile = run(items)
    assert hostile["releases"] == clean["releases"]  # nothing stepped beyond the data
    dead = hostile["dead_letters"]
    assert [(d.reason, d.payload) for d in dead] == [
        ("far_future_slot", f'{{"stream":"s","end_of_slot":{5 + GAP + 1}}}')
    ]
    assert ignored("far_future") == before + 1


def test_stale_events_before_the_first_release_do_not_move_the_start_back() -> None:
    """Slot 1000 opens the stream; events 990 slots behind arrive before anything closed."""
    first = [slot(t, marker=False) for t in range(1000, 1004)]
    clean = run(first)
    stale = [slot(t, marker=False) for t in (10, 11, 12)]
    hostile = run([first[0], first[1], *stale, first[2], first[3]])
    assert hostile["releases"] == clean["releases"]
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001]  # lateness 1: 1002, 1003 open
    dead = hostile["dead_letters"]
    assert len(dead) == 3 * N and {d.reason for d in dead} == {"late_event"}
    assert "watermark" in dead[0].detail


def test_a_marker_for_a_released_slot_is_counted() -> None:
    before = ignored("already_released")
    out = run([slot(t) for t in range(1, 6)] + [marker(3), marker(4)])
    assert len(out["releases"]) == 5 and out["dead_letters"] == []
    assert ignored("already_released") == before + 2


def test_a_marker_before_any_event_is_counted_and_closes_nothing() -> None:
    before = ignored("before_any_event")
    out = run([marker(7), *[slot(t) for t in range(1, 4)]])
    assert [r["slot"] for r in out["releases"]] == [1, 2, 3]
    assert ignored("before_any_event") == before + 1


def test_vector_values_for_a_histogram_stream_are_dead_letters_not_a_crash() -> None:
    """A batch of list values (vectors) sent to a stream that releases histograms: every row
    is an ``out_of_domain`` dead letter, and the stream goes on with the next good slot."""
    vectors = EventBatch("s", np.full(N, 2), np.arange(N), np.ones((N, 3)), None, 2)
    out = run([slot(1), vectors, slot(3)])
    assert [d.reason for d in out["dead_letters"]] == ["out_of_domain"] * N
    assert [r["slot"] for r in out["releases"]] == [1, 2, 3]
    assert not [e for e in out["ledger"] if e.get("kind") == "halt"]
