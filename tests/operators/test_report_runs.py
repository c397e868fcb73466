"""``ReportRoundsLogic.on_batch`` checks each run of consecutive reports of one partition with
one ``check_reports`` call: whatever the cut of the report topic into batches, the server stage
emits exactly what it emits fed one message at a time — requests, releases, ledger entries and
dead letters, in the same order. The script mixes honest reports over two partitions with every
kind of lie, late reports after one partition's marker, replays and forged markers."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from privstream.families.registry import LDP_IDS
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.metrics import BOARD
from privstream.operators.report_rounds import ReportItem, ReportRoundsLogic, ReportsPlan
from privstream.operators.slotting import make_plan
from privstream.schema.protocol import Close, Report, Request
from privstream.schema.report_wire import decode_poll

N, SLOTS, STREAM = 40, 4, "s"
KEY = NoiseKey.coerce(11)


def _logic(name: str) -> ReportRoundsLogic:
    task = FrequencyTask(3)
    config = LDP_IDS.make_config(epsilon=1.0, window=3, population=N, task=task)
    plan = make_plan("runs", [LDP_IDS.build(name, config)], task, N, KEY)
    return ReportRoundsLogic("runs", ReportsPlan.of(plan, partitions=2), None)


def _round(request: Request, rng: random.Random, old: list[Report]) -> list[ReportItem]:
    """One round's messages: the asked devices' reports over both partitions with the lies
    among them, partition 0's marker, a late report on 0 and one still in time on 1, then
    partition 1's marker."""
    asked = [f"d{i}" for i in range(N) if request.asks(f"d{i}")]
    honest = [Report.answering(request, d, rng.randrange(3)) for d in asked]
    items: list[ReportItem] = [(i % 2, r) for i, r in enumerate(honest[:-2])]
    fake = "0" * 32
    lies: list[Report] = [honest[0], Report(fake, STREAM, request.slot, request.round,
                          request.purpose, "liar", request.oracle.name, request.epsilon, 0),
                          Report.answering(request, "liar2", 7)]  # fmt: skip
    lies.append(Report(request.id, STREAM, request.slot, request.round, request.purpose,
                       "liar3", request.oracle.name, request.epsilon * 2, 1))  # fmt: skip
    not_asked = [f"x{i}" for i in range(50) if not request.asks(f"x{i}")]
    lies += [Report.answering(request, d, 0) for d in not_asked[:1]] + old[:2]
    for lie in lies:
        items.insert(rng.randrange(len(items) + 1), (rng.randrange(2), lie))
    items.insert(rng.randrange(len(items)), (1, Close(STREAM, request.slot, request.round)))
    closing = Close(STREAM, request.slot, request.round).signed(KEY.clock_key())
    items += [(0, closing), (0, honest[-2]), (1, honest[-1]), (1, closing)]
    old += honest
    return items


def _one_message(logic: ReportRoundsLogic, partition: int, item: Any) -> list[Any]:
    """The reference: ``on_batch`` fed one message at a time (one ``check_reports`` call per
    report, each held back or judged on its own)."""
    out, _ = logic.on_batch([(partition, item)])
    return list(out)


def _script(name: str) -> tuple[list[ReportItem], list[Any]]:
    """The messages of ``SLOTS`` slots, built against a reference stage fed one at a time
    (each round's reports answer the requests it published), and its outputs."""
    rng, ref, old = random.Random(5), _logic(name), []
    items: list[ReportItem] = []
    outputs: list[Any] = []

    def feed(item: ReportItem) -> list[Request]:
        items.append(item)
        out = _one_message(ref, *item)
        outputs.extend(out)
        return [r for kind, r in out if kind == "request"]

    for t in range(1, SLOTS + 1):
        pending = feed((0, Close(STREAM, t, 0).signed(KEY.clock_key())))
        while pending:
            round_items = [m for r in pending for m in _round(r, rng, old)]
            pending = []
            for item in round_items:
                pending += feed(item)
    BOARD.clear()
    return items, outputs


@pytest.mark.parametrize("name", ["LBD", "LPA"])
def test_any_cut_into_batches_emits_what_one_message_at_a_time_emits(name: str) -> None:
    items, expected = _script(name)
    kinds = [kind for kind, _ in expected]
    assert kinds.count("release") == SLOTS and kinds.count("request") >= SLOTS
    reasons = {d.reason for kind, d in expected if kind == "dead_letter"}
    assert reasons >= {"closed_round", "duplicate_report", "unknown_request", "shape_mismatch",
                       "budget_mismatch", "replayed_report", "unauthenticated_marker"}  # fmt: skip
    rng = random.Random(7)
    cuts = [[len(items)], [1] * len(items), [1, 2, 3, 5, 8, 13, 21]]
    for cut, columns in itertools.product(
        [*cuts, [rng.randrange(1, 60) for _ in range(40)]], [False, True]
    ):
        logic, out, k = _logic(name), [], 0
        for size in [*cut, len(items)]:
            batch, k = items[k : k + size], k + size
            if batch:
                out += list(logic.on_batch(_as_columns(batch) if columns else batch)[0])
        assert out == expected, (cut, columns)
    BOARD.clear()


def _as_columns(batch: list[ReportItem]) -> list[ReportItem]:
    """``batch`` as the flow's parser gives it: each partition's consecutive reports encoded
    and decoded in one poll (``decode_poll``: runs as columns), markers as they are."""
    out: list[ReportItem] = []
    for (partition, is_report), group in itertools.groupby(
        batch, key=lambda v: (v[0], isinstance(v[1], Report))
    ):
        items = [item for _, item in group]
        if not is_report:
            out += [(partition, item) for item in items]
            continue
        lines = [item.to_json().encode() for item in items if isinstance(item, Report)]
        out += [(partition, item) for _, item in decode_poll(lines)]  # type: ignore[misc]
    return out
