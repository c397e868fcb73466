"""Slots of a stream fed by several input partitions: their contents must not depend on how the
partitions' batches interleave (per-partition watermarks, ``operators.watermark``)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.errors import BytewaxRuntimeError
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.jsonl import to_json
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.slotting import SlottingConfig
from privstream.schema.events import EventBatch

N, T, W, P = 300, 12, 4, 3


def partition_batch(p: int, t: int, marker: bool = True) -> EventBatch:
    """Slot ``t`` of the users ``u ≡ p (mod P)``, from partition ``p``, with its marker."""
    users = np.arange(p, N, P)
    values = ((users * 7 + t * 3) % 5 < 2).astype(np.float64)
    slots = np.full(users.shape[0], t)
    return EventBatch("s", slots, users, values, complete_through=t if marker else None,
                      partition=p)  # fmt: skip


def partition_major() -> list[EventBatch]:
    """Partition 0's whole stream, then partition 1's, then partition 2's."""
    return [partition_batch(p, t) for p in range(P) for t in range(1, T + 1)]


def slot_major() -> list[EventBatch]:
    """Slot by slot, the partitions in turn (partition 2 first)."""
    return [partition_batch(p, t) for t in range(1, T + 1) for p in reversed(range(P))]


def run(
    items: list[Any], slotting: SlottingConfig, recovery: RecoveryConfig | None = None
) -> dict[str, list[Any]]:
    flow = Dataflow("test_partitions")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(items)), lambda b: b.stream)
    out = family_mechanisms(
        "ldp_ids", keyed, family=LDP_IDS, mechanism="LPA",
        config=LdpIdsConfig(1.0, W, N, task=FrequencyTask(2)), secret=11, slotting=slotting,
    )  # fmt: skip
    sinks: dict[str, list[Any]] = {"releases": [], "dead_letters": []}
    op.output("r", op.map("r_json", out.releases, to_json), TestingSink(sinks["releases"]))
    op.output("d", out.dead_letters, TestingSink(sinks["dead_letters"]))
    run_main(flow, epoch_interval=timedelta(0), recovery_config=recovery)
    return sinks


def by_id(lines: list[str]) -> dict[str, str]:
    return {json.loads(line)["release_id"]: line for line in lines}


def test_interleavings_of_three_partitions_release_the_same() -> None:
    config = SlottingConfig(partitions=P, close_on_eof=False)
    a, b = run(partition_major(), config), run(slot_major(), config)
    assert a["dead_letters"] == [] and b["dead_letters"] == []
    assert by_id(a["releases"]) == by_id(b["releases"])
    assert sorted(by_id(a["releases"])) == sorted(f"s/LPA/{t}" for t in range(1, T + 1))


def test_with_one_partition_semantics_the_interleavings_differ() -> None:
    """The bug reproduced: one watermark for the stream lets partition 0's markers close every
    slot before partitions 1 and 2 deliver, so their events become late in one order only."""
    config = SlottingConfig(close_on_eof=False)
    merged = [
        [replace(b, partition=0) for b in items] for items in (partition_major(), slot_major())
    ]
    a, b = run(merged[0], config), run(merged[1], config)
    assert by_id(a["releases"]).keys() == by_id(b["releases"]).keys()
    assert by_id(a["releases"]) != by_id(b["releases"])
    for got, kept in ((a, 0), (b, 2)):  # only the partition that came first counts
        assert {d.reason for d in got["dead_letters"]} == {"late_event"}
        late_users = {json.loads(d.payload)["user"] % P for d in got["dead_letters"]}
        assert late_users == set(range(P)) - {kept}
        assert len(got["dead_letters"]) == (P - 1) * T * (N // P)


def test_an_idle_partition_holds_the_stream_until_the_input_ends() -> None:
    busy = [partition_batch(p, t) for t in range(1, T + 1) for p in (0, 1)]
    held = run(busy, SlottingConfig(partitions=P, close_on_eof=False))
    assert held["releases"] == []  # partition 2 has passed no slot
    ended = run(busy, SlottingConfig(partitions=P))  # a bounded input closes at its end
    assert len(ended["releases"]) == T
    late_marker = [*busy, replace(partition_batch(2, 5), slots=np.zeros(0, dtype=np.int64),
                                  users=np.zeros(0, dtype=np.int64), values=np.zeros(0))]  # fmt: skip
    marked = run(late_marker, SlottingConfig(partitions=P, close_on_eof=False))
    assert sorted({json.loads(r)["slot"] for r in marked["releases"]}) == [1, 2, 3, 4, 5]


def test_lateness_follows_each_partition_own_order_not_the_batch_cuts() -> None:
    """Partition 1 sends slot 6 before slot 3 (beyond the lateness of 1): slot 3's rows are
    late whether they come in the same batch as slot 6 or in the next one, and whatever the
    other partitions did."""
    early = [partition_batch(p, t) for t in range(1, 3) for p in range(P)]
    ahead, behind = partition_batch(1, 6, marker=False), partition_batch(1, 3, marker=False)
    together = EventBatch("s", np.concatenate([ahead.slots, behind.slots]),
                          np.concatenate([ahead.users, behind.users]),
                          np.concatenate([ahead.values, behind.values]), partition=1)  # fmt: skip
    rest = [partition_batch(p, t) for t in range(3, 8) for p in (0, 2)]
    config = SlottingConfig(partitions=P, close_on_eof=False)
    results = [
        run([*early, together, *rest], config),
        run([*early, ahead, behind, *rest], config),
        run([*early, *rest, ahead, behind], config),
    ]
    for got in results:
        late = [d for d in got["dead_letters"] if d.reason == "late_event"]
        assert len(late) == len(got["dead_letters"]) == N // P
        assert {json.loads(d.payload)["slot"] for d in late} == {3}
    for got in results[:2]:  # slot 3 still open: late by partition 1's own order
        assert "input partition 1" in got["dead_letters"][0].detail
    assert by_id(results[0]["releases"]) == by_id(results[1]["releases"])
    assert by_id(results[1]["releases"]) == by_id(results[2]["releases"])


def cause(error: BaseException) -> BaseException:
    """The exception an operator raised (Bytewax wraps it in its own)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def test_a_batch_from_an_unknown_partition_is_refused() -> None:
    with pytest.raises(BytewaxRuntimeError) as info:
        run([partition_batch(0, 1), replace(partition_batch(1, 1), partition=3)],
            SlottingConfig(partitions=P))  # fmt: skip
    assert isinstance(cause(info.value), ValueError)
    assert "input partition 3" in str(cause(info.value))
    assert "configured for 3" in str(cause(info.value))


def test_resume_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(str(tmp_path))
    items: list[Any] = slot_major()
    items.insert(10, TestingSource.ABORT())
    first = run(items, SlottingConfig(partitions=P, close_on_eof=False), recovery)
    assert first["releases"]
    with pytest.raises(IncompatibleState) as info:  # refused at start: the store is bound
        run(items, SlottingConfig(partitions=4, close_on_eof=False), recovery)
    assert "written for 3 input partitions" in str(info.value) and "has 4 now" in str(info.value)
    assert "--grow-partitions" in str(info.value)
    with pytest.raises(IncompatibleState) as info:  # Kafka never removes partitions
        run(items, SlottingConfig(partitions=2, grow_partitions=True, close_on_eof=False), recovery)
    assert "written for 3 input partitions" in str(info.value) and "re-created" in str(info.value)


def marker_of(p: int, t: int) -> EventBatch:
    """An empty batch of partition ``p`` with the end-of-slot marker through ``t``."""
    empty = np.zeros(0, dtype=np.int64)
    return EventBatch("s", empty, empty, np.zeros(0), complete_through=t, partition=p)


def test_input_partitions_grow_with_every_budget_kept(tmp_path: Path) -> None:
    """Issue 27 item 5: adding input partitions had no path but a fresh store (every budget
    reset). With ``grow_partitions`` the store resumes: the new partition starts at the stream's
    last released slot (its event for a released slot is ``late_event``) and the releases are
    byte for byte those of a run that had the fourth partition from the start."""
    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(str(tmp_path))
    items: list[Any] = slot_major()
    items.insert(10, TestingSource.ABORT())
    first = run(items, SlottingConfig(partitions=P, close_on_eof=False), recovery)
    released = {json.loads(line)["slot"] for line in first["releases"]}
    assert released and max(released) < T
    grown = SlottingConfig(partitions=P + 1, grow_partitions=True, close_on_eof=False)
    stale = replace(partition_batch(0, max(released), marker=False), partition=P)
    second = run([*items[:11], stale, *_with_markers(items[11:])], grown, recovery)
    assert [d.reason for d in second["dead_letters"]] == ["late_event"] * len(stale)
    whole = run(_with_markers(slot_major()), SlottingConfig(partitions=P + 1, close_on_eof=False))
    assert by_id(first["releases"]) | by_id(second["releases"]) == by_id(whole["releases"])
    assert not by_id(first["releases"]).keys() & by_id(second["releases"]).keys()
    assert len(by_id(whole["releases"])) == T


def _with_markers(items: list[Any]) -> list[Any]:
    """``items`` with the marker of each slot also on the fourth partition (after the slot's
    last batch: partition 0 comes last in ``slot_major``)."""
    out: list[Any] = []
    for item in items:
        out.append(item)
        if isinstance(item, EventBatch) and item.partition == 0:
            out.append(marker_of(P, int(item.complete_through or 0)))
    return out


def test_named_users_register_independently_of_the_interleaving() -> None:
    """Named users get their dense index when their first slot closes, in a keyed order, so the
    users a mechanism samples by index do not depend on the interleaving either."""

    def named(items: list[EventBatch]) -> list[EventBatch]:
        return [replace(b, users=np.array([f"u{u}" for u in b.users], dtype=object)) for b in items]

    config = SlottingConfig(partitions=P, close_on_eof=False)
    a, b = run(named(partition_major()), config), run(named(slot_major()), config)
    assert by_id(a["releases"]) == by_id(b["releases"])
