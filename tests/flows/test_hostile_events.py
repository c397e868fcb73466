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

from privstream.families.registry import LDP_IDS
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.family import family_mechanisms
from privstream.operators.metrics import INTERNAL
from privstream.operators.slotting import SlottingConfig
from privstream.schema.events import EventBatch, marker_tag
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


# -- issue 27 item 4: stale events in the stream's first poll, on every clock ---------------------

PARTS = 4
KEY = NoiseKey.coerce(3)


def rows(t: int, partition: int = 0, parts: int = 1, tagged: int | None = None) -> EventBatch:
    """Slot ``t``'s reports of the users of ``partition`` (user ``i`` on ``i mod parts``),
    with a marker through ``tagged`` signed with the clock key when given."""
    rng = np.random.default_rng(t)
    values = (rng.random(N) < 0.5).astype(float)
    users = np.arange(partition, N, parts)
    tag = None if tagged is None else marker_tag(KEY.clock_key(), "s", tagged)
    return EventBatch(
        "s", np.full(users.size, t), users, values[users], None, tagged, partition=partition,
        marker_tag=tag,
    )  # fmt: skip


def poll(*batches: EventBatch) -> EventBatch:
    """One poll of one partition holding ``batches`` in order (the last one's marker)."""
    first, last = batches[0], batches[-1]
    return EventBatch(
        "s", np.concatenate([b.slots for b in batches]),
        np.concatenate([b.users for b in batches]), np.concatenate([b.values for b in batches]),
        None, last.complete_through, partition=first.partition, marker_tag=last.marker_tag,
    )  # fmt: skip


def run_clock(items: list[Any], clock: str, partitions: int = 1, gap: int = GAP) -> Outputs:
    """The operator under ``clock`` (``gap`` 0: the clock's default gap limit)."""
    config = LdpIdsConfig(epsilon=1.0, window=4, population=N)
    slotting = SlottingConfig(
        max_slot_gap=gap,
        close_on_eof=False,
        partitions=partitions,
        clock=clock,  # type: ignore[arg-type]
    )

    def operator(keyed: Any) -> Any:
        return family_mechanisms(
            "mech", keyed, family=LDP_IDS, mechanism="LBU", config=config, secret=KEY,
            slotting=slotting,
        )  # fmt: skip

    return run_operator(items, operator)


def late_letters(out: Outputs) -> list[Any]:
    return [d for d in out["dead_letters"] if d.reason == "late_event"]


def test_stale_events_in_the_same_poll_as_the_first_events_are_late_data_clock() -> None:
    """One poll: slots 1000 and 1001, then stale slots 10–12 (the data clock, one partition).
    Before: the stale rows were buffered and the first close stepped from slot 10 (991 extra
    releases, no dead letter). Now each row is judged against its partition's watermark in the
    partition's own order, so the stale rows are ``late_event`` whatever the poll sizes."""
    first = [rows(t) for t in range(1000, 1004)]
    clean = run_clock(first, "data")
    stale = [rows(t) for t in (10, 11, 12)]
    hostile = run_clock([poll(first[0], first[1], *stale), first[2], first[3]], "data")
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001]
    assert hostile["releases"] == clean["releases"]
    dead = hostile["dead_letters"]
    assert len(dead) == 3 * N and {d.reason for d in dead} == {"late_event"}
    assert "watermark" in dead[0].detail


def four_partitions(t: int, tagged: bool = False) -> list[EventBatch]:
    return [rows(t, p, PARTS, t if tagged else None) for p in range(PARTS)]


def test_stale_events_first_on_one_partition_of_four_do_not_move_the_start_data_clock() -> None:
    """Partition 0 delivers stale slots 10–12 before its share of slot 1000; the other three
    start at 1000. Before: the first close started at slot 10 (991 extra releases, no dead
    letter). Now the stream starts where every partition has started (the largest of the
    partitions' first slots), and what was buffered before it becomes ``late_event``."""
    first = [b for t in range(1000, 1004) for b in four_partitions(t)]
    clean = run_clock(first, "data", PARTS, gap=0)
    stale = [rows(t, 0, PARTS) for t in (10, 11, 12)]
    hostile = run_clock([*stale, *first], "data", PARTS, gap=0)
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001]
    assert hostile["releases"] == clean["releases"]
    dead = late_letters(hostile)
    assert len(dead) == len(hostile["dead_letters"]) == 3 * N // PARTS
    assert "before the stream's first slot 1000" in dead[0].detail


def signed(t: int, partition: int = 0) -> EventBatch:
    """An empty batch carrying the marker through ``t`` signed with the clock key."""
    empty = np.zeros(0, dtype=np.int64)
    tag = marker_tag(KEY.clock_key(), "s", t)
    return EventBatch("s", empty, empty, np.zeros(0), None, t, partition=partition, marker_tag=tag)


def test_stale_events_in_the_first_poll_are_counted_markers_clock() -> None:
    """The markers clock, one partition: one poll holds slot 1000's events, stale slots
    990–992 and the signed marker through 1000. The first marker already capped the first
    advance (no extra release), but dropped the stale reports silently; they are now
    ``late_event`` dead letters."""
    first = [rows(t, tagged=t) for t in range(1000, 1003)]
    clean = run_clock(first, "markers")
    stale = [rows(t) for t in (990, 991, 992)]
    hostile = run_clock([poll(rows(1000), *stale, signed(1000)), *first[1:]], "markers")
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001, 1002]
    assert hostile["releases"] == clean["releases"]
    dead = hostile["dead_letters"]
    assert len(dead) == 3 * N and {d.reason for d in dead} == {"late_event"}
    assert "before the stream's first slot 1000" in dead[0].detail


def test_stale_events_first_on_one_partition_of_four_are_counted_markers_clock() -> None:
    """The markers clock, four partitions: partition 0 delivers stale slots 990–992 first."""
    first = [b for t in range(1000, 1003) for b in four_partitions(t, tagged=True)]
    clean = run_clock(first, "markers", PARTS)
    stale = [rows(t, 0, PARTS) for t in (990, 991, 992)]
    hostile = run_clock([*stale, *first], "markers", PARTS)
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001, 1002]
    assert hostile["releases"] == clean["releases"]
    dead = hostile["dead_letters"]
    assert len(dead) == 3 * N // PARTS and {d.reason for d in dead} == {"late_event"}


def test_a_clock_started_before_the_producers_makes_far_stale_events_late() -> None:
    """Far older stale events (slots 10–12) written before the stream's first events and
    before any marker make the first slot's honest events ``far_future_slot`` (the gap counts
    from the oldest buffered slot until the first marker: what events alone buffer stays
    bounded). With the clock started first (a signed marker on every partition before the
    producers write, as docs/kafka.md says), they are ``late_event`` and nothing changes."""
    start = [signed(999, p) for p in range(PARTS)]
    first = [b for t in range(1000, 1003) for b in four_partitions(t, tagged=True)]
    clean = run_clock([*start, *first], "markers", PARTS)
    stale = [rows(t, 0, PARTS) for t in (10, 11, 12)]
    hostile = run_clock([*start, *stale, *first], "markers", PARTS)
    assert [r["slot"] for r in clean["releases"]] == [1000, 1001, 1002]
    assert hostile["releases"] == clean["releases"]
    dead = hostile["dead_letters"]
    assert len(dead) == 3 * N // PARTS and {d.reason for d in dead} == {"late_event"}
