"""The shuffler's book (``runtime.shuffle_book``), engine- and Kafka-free: a block closes only
when every partition delivered its end-of-slot marker; its batch is the reports' counts and
manifest, with no identifier; late, wrong-level, unknown and conflicting reports are refused;
a batch below ``n_min`` is dropped (or forwarded and named); and the batches do not depend on
how the partitions interleave."""

from __future__ import annotations

import itertools
import random

import pytest

from privstream.runtime.shuffle_book import ShuffleBook
from privstream.schema.shuffle import Batch, Sao2Report, Sao2Task

TASK = Sao2Task("cells", 0, 1, 4, 2, 3, 5, "onehot", 1.0, 2.0, (4, 3, 2), (0.4, 0.3, 0.3),
                "ab" * 16)  # fmt: skip
DEVICES = [f"dev-{i}" for i in range(60)]


def report(device: str, block: int, symbols: tuple[tuple[int, int], ...] = ((1, 1),)) -> Sao2Report:
    return Sao2Report(TASK.id, "cells", 0, TASK.level_of(device), block, device, symbols)


def book(partitions: int = 2, **kw: object) -> ShuffleBook:
    b = ShuffleBook("s-1", partitions, n_min=kw.pop("n_min", 1), **kw)  # type: ignore[arg-type]
    b.add_task(TASK)
    return b


def level0(devices: list[str]) -> list[str]:
    return [d for d in devices if TASK.level_of(d) == 0]


def test_a_block_closes_when_every_partition_delivered_its_marker() -> None:
    b = book()
    mine = level0(DEVICES)
    for i, d in enumerate(mine):
        assert b.take_report(i % 2, report(d, 1, ((i % 5, 1 if i % 3 else -1),))) is None
    assert b.take_marker(0, "cells", 1) == []  # partition 1 has not closed slot 1
    (batch,) = b.take_marker(1, "cells", 1)  # only level 0's block 1 ends at slot 1
    assert (batch.level, batch.block, batch.slot, batch.n, batch.policy) == (
        0,
        1,
        1,
        len(mine),
        "forward",
    )
    plus = [sum(1 for i in range(len(mine)) if i % 5 == c and i % 3) for c in range(5)]
    minus = [sum(1 for i in range(len(mine)) if i % 5 == c and not i % 3) for c in range(5)]
    assert list(batch.plus or ()) == plus and list(batch.minus or ()) == minus
    assert not any(d in batch.to_json() for d in DEVICES)


def test_slot_2_closes_levels_0_and_1_and_an_empty_block_has_a_manifest() -> None:
    """No report for a block still gives its manifest (n = 0 < n_min: the policy applies)."""
    for policy, counts in (("drop", None), ("below_min", (0,) * 5)):
        b = book(partitions=1, policy=policy)
        closed = [x for slot in (1, 2) for x in b.take_marker(0, "cells", slot)]
        assert [(x.level, x.block, x.slot, x.n) for x in closed] == [
            (0, 1, 1, 0),
            (0, 2, 2, 0),
            (1, 1, 2, 0),
        ]
        assert all(x.policy == policy and x.plus == counts for x in closed)


def test_late_unknown_wrong_level_and_conflicting_reports_are_refused() -> None:
    b = book()
    d0, d1 = level0(DEVICES)[:2]
    b.take_marker(0, "cells", 1)
    assert b.take_report(0, report(d0, 1)) == "late_report"  # its partition closed slot 1
    assert b.take_report(1, report(d0, 1)) is None  # partition 1 has not
    wrong = Sao2Report(TASK.id, "cells", 0, 2, 1, d1, ())
    assert b.take_report(1, wrong) == "wrong_level"
    other = Sao2Report("0" * 32, "cells", 0, 0, 1, d1, ())
    assert b.take_report(1, other) == "unknown_task"
    assert b.take_report(1, report(d1, 1, ((2, 1),))) is None
    assert b.take_report(1, report(d1, 1, ((2, 1),))) is None  # an identical copy counts once
    assert b.take_report(1, report(d1, 1, ((3, 1),))) == "duplicate_report"
    (batch,) = b.take_marker(1, "cells", 1)
    assert batch.n == 1 and batch.plus == (0, 1, 0, 0, 0)  # d1 conflicted: left out; d0 counted


@pytest.mark.parametrize("policy", ["drop", "below_min"])
def test_a_batch_below_n_min_is_dropped_or_named(policy: str) -> None:
    b = book(partitions=1, n_min=1000, policy=policy)
    for d in level0(DEVICES):
        b.take_report(0, report(d, 1))
    (batch,) = b.take_marker(0, "cells", 1)
    assert batch.policy == policy and batch.n_min == 1000
    if policy == "drop":
        assert batch.plus is None and batch.minus is None
    else:
        assert batch.plus is not None and sum(batch.plus) == batch.n


def test_the_default_n_min_is_the_specs() -> None:
    b = ShuffleBook("s", 1)
    assert b.minimum(TASK) == 562  # ⌈16 e log(4/1e-5)⌉ at ε = 1, δ = 1e-5 (spec §10.4)


def test_batches_do_not_depend_on_how_partitions_interleave() -> None:
    rng = random.Random(3)
    per_partition: list[list[object]] = [[], []]
    for d in DEVICES:
        level = TASK.level_of(d)
        for block in range(1, TASK.lengths[level] + 1):
            sym = ((rng.randrange(5), rng.choice((1, -1))),)
            per_partition[rng.randrange(2)].append(report(d, block, sym))
    for p in (0, 1):
        per_partition[p].extend(("marker", s) for s in range(1, 5))

    def run(order: list[int]) -> list[Batch]:
        b, queues, out = book(), [list(q) for q in per_partition], []
        for p in order:
            item = queues[p].pop(0)
            if isinstance(item, tuple):
                out += b.take_marker(p, "cells", item[1])
            else:
                assert b.take_report(p, item) is None  # type: ignore[arg-type]
        return out

    orders = []
    for seed in range(5):
        order = [0] * len(per_partition[0]) + [1] * len(per_partition[1])
        random.Random(seed).shuffle(order)
        orders.append(order)
    first = run(orders[0])
    assert len(first) == sum(TASK.lengths)  # every block of every level, once
    assert sum(x.n for x in first) == sum(1 for _ in itertools.chain(*per_partition)) - 8
    for order in orders[1:]:
        assert run(order) == first
