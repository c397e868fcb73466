"""User shards of one stream (issue 26, ``operators.user_shards``): the per-user work of a
central-DP stream on ``k`` Bytewax keys, the mechanisms on one decision key.

The releases, ledger entries and dead letters must be the one-key operator's, byte for byte,
for every shard count — over several partitions, personal requirements in several classes,
carried values, late, duplicate, unregistered and out-of-domain rows and a forged marker —
and what crosses from a shard to the decision must hold no user id and no value.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.jsonl import to_json
from privstream.families.registry import LDP_IDS, PERSONALIZED, family
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.client import CountedClients, SimulatedClientPort
from privstream.mechanisms.dpi import DpiConfig
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.ldp_ids import LBU, LdpIdsConfig
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.seeding import NoiseKey, SlotRandomness
from privstream.mechanisms.stages import shard_of
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators import ingest
from privstream.operators.family import family_mechanisms
from privstream.operators.ports import DeviceReports
from privstream.operators.registration import Preferences
from privstream.operators.shard_slots import HOLD_ROWS, ShardLogic, ShardPlan
from privstream.operators.sharded import check_shardable
from privstream.operators.slotting import SlottingConfig, make_plan
from privstream.operators.user_shards import ShardCut, ShardPiece, ShardSlots
from privstream.schema.events import STREAM_HALTED, EventBatch, concat, marker_tag, mergeable

KEY = NoiseKey.from_text("3f9a1c7e5b2d8f406a1e9c3b7d5f2a8e1c6b9d4f7a2e5c8b3d6f9a1c4e7b2d5f")
N, D, PARTITIONS, SLOTS = 300, 4, 3, 12
USERS = [f"u{i}" for i in range(N)]
TABLE = Preferences(
    by_user={u: (1.0 if i % 3 else 2.0, 4 if i % 2 else 6) for i, u in enumerate(USERS)},
    share=0.5,
)
CLOCK = SlottingConfig(clock="markers", partitions=PARTITIONS)
LDP_BUDGET = ("LBU", "LBD", "LBA", "LB-DSAT", "LB-RescueDP")
"""The LDP-IDS mechanisms that ask every user every slot (budget division)."""
Outputs = dict[str, list[Any]]


def _marker(t: int, partition: int, tag: str | None = None) -> EventBatch:
    empty = np.zeros(0, dtype=np.int64)
    tag = marker_tag(KEY.clock_key(), "s", t) if tag is None else tag
    return EventBatch("s", empty, np.zeros(0, dtype=object), np.zeros(0), None, t,
                      partition=partition, marker_tag=tag)  # fmt: skip


def hostile_input() -> list[EventBatch]:
    """Twelve slots over three partitions: 70 % of the users report each slot, each batch
    repeats a user (duplicate) and names a stranger (unregistered); slot 5 has a value out of
    the domain, slot 7 a late pair; a forged marker comes last."""
    rng = np.random.default_rng(1)
    items = []
    for t in range(1, SLOTS + 1):
        for p in range(PARTITIONS):
            users = [u for i, u in enumerate(USERS) if i % PARTITIONS == p and rng.random() < 0.7]
            users += ["stranger", users[0]]
            values = rng.integers(0, D, len(users)).astype(float)
            if t == 5 and p == 1:
                values[0] = 99.0
            items.append(EventBatch("s", np.full(len(users), t), np.array(users, dtype=object),
                                    values, partition=p))  # fmt: skip
            if t == 7 and p == 2:
                late = np.array(users[:2], dtype=object)
                items.append(EventBatch("s", np.full(2, 3), late, np.zeros(2), partition=p))
        items += [_marker(t, p) for p in range(PARTITIONS)]
    return [*items, _marker(SLOTS + 1, 0, tag="00" * 16)]


def keyed(source: Any, shards: int | None) -> Any:
    """Stream ``s``'s batches keyed by stream (``shards`` None) or cut into user shards."""
    if shards is None:
        return op.key_on("key", source, lambda b: b.stream)
    return op.flat_map("key", source, ShardCut({"s": shards}))


def run(items: list[EventBatch], shards: int | None, name: str = "personalized") -> Outputs:
    """The outputs of family ``name``'s two mechanisms over ``items``: one key per stream (None)
    or ``shards`` user shards."""
    if name == "personalized":
        config: Any = PersonalizedConfig(population=N + 10, epsilon=2.0, window=6,
                                         task=FrequencyTask(D))  # fmt: skip
        names, registration = ["PBD", "PBA"], TABLE
    elif name == "dpi":  # a lifetime guarantee, every registered user at the stream's default
        config = DpiConfig(epsilon=2.0, window=1, population=N + 10, task=FrequencyTask(D),
                           pool_size=200, synopses=4)  # fmt: skip
        names = ["DPI", "DPI-uniform"]
        registration = Preferences(by_user={u: (2.0, 1) for u in USERS})
    else:  # LDP-IDS, simulated devices, a closed population: every budget-division mechanism
        config = LdpIdsConfig(population=N + 10, epsilon=1.0, window=4, task=FrequencyTask(D))
        names = list(LDP_BUDGET)
        registration = Preferences(by_user={u: (2.0, 4) for u in USERS})
    flow = Dataflow("shards")
    out = family_mechanisms(
        "p", keyed(op.input("in", flow, TestingSource(items)), shards), family=family(name), mechanism=names, config=config, secret=KEY, slotting=CLOCK,
        registration=registration, shards=shards,
        split=BudgetSplit.parse("equal", len(names)),
    )  # fmt: skip
    found: Outputs = {"releases": [], "ledger": [], "dead_letters": []}
    op.output("r", op.map("rj", out.releases, to_json), TestingSink(found["releases"]))
    op.output("l", op.map("lj", out.ledger, to_json), TestingSink(found["ledger"]))
    op.output("d", op.map("dj", out.dead_letters, repr), TestingSink(found["dead_letters"]))
    run_main(flow)
    return {kind: sorted(items) for kind, items in found.items()}


@pytest.fixture(scope="module")
def one_key() -> Outputs:
    return run(hostile_input(), None)


@pytest.mark.parametrize("shards", [1, 2, 3, 8, 256])
def test_every_shard_count_releases_what_one_key_releases(one_key: Outputs, shards: int) -> None:
    assert len(one_key["releases"]) == 2 * SLOTS
    reasons = {r.split("reason='")[1].split("'")[0] for r in one_key["dead_letters"]}
    assert reasons == {"duplicate_report", "unregistered_user", "out_of_domain", "late_event",
                       "unauthenticated_marker"}  # fmt: skip
    assert run(hostile_input(), shards) == one_key


def test_a_dpi_stream_on_shards_releases_what_it_releases_on_one_key() -> None:
    items = hostile_input()
    one = run(items, None, "dpi")
    assert len(one["releases"]) >= 2 * SLOTS
    assert run(items, 4, "dpi") == one


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_an_ldp_stream_of_a_closed_population_on_shards_releases_what_one_key_releases(
    shards: int,
) -> None:
    """The simulated devices answer from the shards' summed counts with the one-key stream's
    randomness: the same estimates, ledgers and dead letters, byte for byte."""
    items = hostile_input()
    one = run(items, None, "ldp-ids")
    assert len(one["releases"]) == len(LDP_BUDGET) * SLOTS
    assert {r.split("reason='")[1].split("'")[0] for r in one["dead_letters"]} >= {
        "duplicate_report", "unregistered_user", "out_of_domain", "late_event"}  # fmt: skip
    assert run(items, shards, "ldp-ids") == one


def test_a_cut_keeps_every_row_once_in_order_and_sends_markers_to_every_shard() -> None:
    users = np.array([f"u{i}" for i in range(50)], dtype=object)
    batch = EventBatch("s", np.arange(50), users, np.arange(50.0), [f"line{i}" for i in range(50)],
                       9, partition=2, marker_tag="ab")  # fmt: skip
    cut = ShardCut({"s": 4})
    pieces = cut(batch)
    assert [key for key, _ in pieces] == [f"s/shard-{i}" for i in range(4)]
    seen = []
    for key, piece in pieces:
        assert isinstance(piece, ShardPiece) and key == f"s/shard-{piece.shard}"
        assert piece.batch.complete_through == 9 and piece.batch.marker_tag == "ab"
        assert piece.batch.partition == 2
        rows = piece.batch.slots.tolist()
        assert rows == sorted(rows)  # the partition's order
        assert {shard_of(u, 4) for u in piece.batch.users.tolist()} <= {piece.shard}
        assert list(piece.batch.raw or []) == [f"line{r}" for r in rows]
        seen += rows
    assert sorted(seen) == list(range(50))
    other = EventBatch("t", np.arange(3), users[:3], np.zeros(3))
    assert cut(other) == [("t", other)]  # a stream without shards goes on whole
    no_marker = EventBatch("s", np.arange(1), users[:1], np.zeros(1))
    assert len(cut(no_marker)) == 1  # only the shard with rows


def test_what_crosses_to_the_decision_holds_no_user_and_no_value() -> None:
    plan = ShardPlan(make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, CLOCK, TABLE,
                               BudgetSplit.parse("equal", 2)), 2)  # fmt: skip
    logic = ShardLogic("p", plan, None)
    batch = next(b for b in hostile_input() if len(b) and b.partition == 0)
    mine = ShardCut({"s": 2}).cut(batch, 2)
    out: list[Any] = []
    for t in (1, 2):
        for p in range(PARTITIONS):
            out += logic.on_batch([*(m for m in mine if t == 1 and p == 0), *ShardCut({"s": 2})
                                   .cut(_marker(t, p), 2)[:1]])[0]  # fmt: skip
    shares = [item for kind, item in out if kind == "share"]
    assert shares and all(isinstance(s, ShardSlots) for s in shares)
    wire = pickle.dumps(shares)
    assert not any(u.encode() in wire for u in ("u0", "u3", "u6", "stranger"))
    assert all(s.counts.dtype == np.int64 for s in shares)


def _personalized() -> list[Any]:
    config = PersonalizedConfig(population=N + 10, epsilon=2.0, window=6, task=FrequencyTask(D))
    return PERSONALIZED.build_shared(["PBD", "PBA"], config, (0.5, 0.5))


def test_a_store_of_another_shard_count_is_refused() -> None:
    split = BudgetSplit.parse("equal", 2)
    plan = make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, CLOCK, TABLE, split)
    logic = ShardLogic("p", ShardPlan(plan, 2), None)
    logic.on_batch([ShardCut({"s": 2}).cut(_marker(1, 0), 2)[1]])
    with pytest.raises(IncompatibleState, match="user shards: stored 2, now 4"):
        ShardLogic("p", ShardPlan(plan, 4), logic.snapshot())


def test_the_counted_devices_answer_every_user_or_nobody() -> None:
    """``CountedClients`` answers a budget-division request as the one-key devices' aggregate
    path does (same counts, same randomness: the same estimate) and refuses a request that
    names its users or runs a protocol on the devices: it holds no seat to name."""
    task, eps = FrequencyTask(D), 1.0
    values = np.array([0, 1, 1, 3, -1, 2, 1], dtype=np.int64)
    randomness = SlotRandomness(KEY, "s", 4, scope="LBU")
    one = SimulatedClientPort(values, task, randomness).collect(None, eps, "m2")
    counts = np.bincount(values[values >= 0], minlength=D)
    counted = CountedClients(counts, values.shape[0], task, randomness)
    answer = counted.collect(None, eps, "m2")
    assert answer.estimate.tobytes() == one.estimate.tobytes()
    assert (answer.reports, answer.report_bits, answer.oracle) == (6, 12, "GRR")
    assert int(counted.eligible().sum()) == 6 and counted.population == 7
    with pytest.raises(ValueError, match="asks every eligible user only"):
        counted.collect(np.array([0, 1]), eps, "m2")
    with pytest.raises(ValueError, match="runs no protocol"):
        counted.respond(None, counted.eligible(), "report")  # type: ignore[arg-type]


class _KeepsDeviceState(LBU):
    """LBU with a state on each device (as CGM's and SaO2's clients keep)."""

    def client_state(self) -> Any:
        return {}


def test_only_streams_whose_ports_follow_from_counts_shard() -> None:
    """Each refusal names its reason: an open LDP population, population division, an oracle
    without an exact aggregate, the per-user client path, devices keeping state, an
    ldp-reports server, the data clock, a bad shard count."""
    split = BudgetSplit.parse("equal", 2)
    closed = Preferences(by_user={u: (2.0, 6) for u in USERS})

    def ldp(names: list[str], task: FrequencyTask | None = None, **clock: Any) -> Any:
        task = task or FrequencyTask(D)
        config = LdpIdsConfig(population=N, epsilon=2.0, window=6, task=task)
        built = LDP_IDS.build_shared(names, config, split.shares)
        return built, task, SlottingConfig(clock="markers", partitions=PARTITIONS, **clock)

    cases = [
        (ldp(["LBU", "LBD"]), None, "open LDP population"),
        (ldp(["LBU", "LPD"]), closed, "LPD divides the population"),
        (ldp(["LBU", "LBA"], FrequencyTask(D, oracle="olh")), closed, "exact aggregate"),
        (ldp(["LBU", "LBA"], client_path="per-user"), closed, "aggregate client path"),
    ]
    for (mechanisms, task, clock), table, why in cases:
        plan = make_plan("p", mechanisms, task, N, KEY, clock, table, split)
        with pytest.raises(ValueError, match=why):
            check_shardable(plan, 2, "s")
    ok, task, clock = ldp(["LBU", "LBA"])
    check_shardable(make_plan("p", ok, task, N, KEY, clock, closed, split), 2, "s")
    keeping = [_KeepsDeviceState(ok[0].config), ok[1]]
    plan = make_plan("p", keeping, task, N, KEY, clock, closed, split)
    with pytest.raises(ValueError, match="keeps state on each device"):
        check_shardable(plan, 2, "s")
    assert "requests the decision publishes" in str(DeviceReports().shard_refusal([]))
    data = SlottingConfig(clock="data", partitions=PARTITIONS)
    plan = make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, data, TABLE, split)
    with pytest.raises(ValueError, match="markers clock"):
        check_shardable(plan, 2, "s")
    marked = make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, CLOCK, TABLE, split)
    for bad in (0, 257, True):
        with pytest.raises(ValueError, match="shards must be"):
            check_shardable(marked, bad, "s")  # type: ignore[arg-type]


def test_a_failing_shard_halts_the_stream_and_the_rest_becomes_dead_letters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = ingest.Windower.ingest
    calls = {"n": 0}

    def flaky(self: ingest.Windower, state: Any, batch: EventBatch, notes: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 40:  # some shard, mid-stream
            raise RuntimeError("user u1 broke it")
        return original(self, state, batch, notes)

    monkeypatch.setattr(ingest.Windower, "ingest", flaky)
    out = run(hostile_input(), 3)
    halts = [line for line in out["ledger"] if '"kind":"halt"' in line]
    assert len(halts) == 2 and all("user shard" in line for line in halts)
    assert all("u1 broke" not in line for line in out["ledger"])  # the reason names no data
    assert any(STREAM_HALTED in d for d in out["dead_letters"])
    assert 0 < len(out["releases"]) < 2 * SLOTS


def _shard_outputs(pieces: list[ShardPiece], resume_after: int | None = None) -> list[Any]:
    """What one shard of two outputs for ``pieces``, resumed from a snapshot after
    ``resume_after`` pieces (None: never)."""
    split = BudgetSplit.parse("equal", 2)
    plan = ShardPlan(make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, CLOCK, TABLE,
                               split), 2)  # fmt: skip
    logic = ShardLogic("p", plan, None)
    out: list[Any] = []
    for k, piece in enumerate(pieces):
        if k == resume_after:
            logic = ShardLogic("p", plan, pickle.loads(pickle.dumps(logic.snapshot())))
        out += logic.on_batch([piece])[0]
    return [(kind, repr(item) if kind == "dead_letter" else item) for kind, item in out]


def test_rows_held_until_the_marker_survive_a_snapshot_and_count_alike() -> None:
    cut = ShardCut({"s": 2})
    pieces = [p for b in hostile_input()[:40] for p in cut.cut(b, 2) if p.shard == 1]
    straight = _shard_outputs(pieces)
    shares = [item for kind, item in straight if kind == "share"]
    assert shares and any(s.counts.sum() for s in shares)
    for cut_at in (1, 5, len(pieces) // 2):
        again = _shard_outputs(pieces, resume_after=cut_at)
        assert [k for k, _ in again] == [k for k, _ in straight]
        for (kind, a), (_, b) in zip(again, straight, strict=True):
            if kind == "share":
                assert (a.start, a.target, a.lowest) == (b.start, b.target, b.lowest)
                assert np.array_equal(a.counts, b.counts)
            else:
                assert a == b


def test_a_shard_ingests_what_it_holds_without_a_marker_past_hold_rows() -> None:
    split = BudgetSplit.parse("equal", 2)
    plan = make_plan("p", _personalized(), FrequencyTask(D), N + 10, KEY, CLOCK, TABLE, split)
    logic = ShardLogic("p", ShardPlan(plan, 1), None)
    stranger = np.array(["stranger"] * (HOLD_ROWS // 2), dtype=object)
    batch = EventBatch("s", np.ones(stranger.shape[0], dtype=np.int64), stranger,
                       np.zeros(stranger.shape[0]))  # fmt: skip
    assert logic.on_batch([ShardPiece(0, 1, batch)])[0] == []  # held
    letters = logic.on_batch([ShardPiece(0, 1, batch)])[0]  # HOLD_ROWS reached
    assert len(letters) == HOLD_ROWS and {kind for kind, _ in letters} == {"dead_letter"}


def test_concat_joins_only_like_pieces_in_order() -> None:
    users = np.array(["a", "b", "c"], dtype=object)
    one = EventBatch("s", np.arange(3), users, np.arange(3.0), ["x", "y", "z"], partition=1)
    two = EventBatch("s", np.arange(3, 5), users[:2], np.arange(2.0), ["v", "w"], partition=1)
    assert mergeable(one, two)
    joined = concat([one, two])
    assert joined.slots.tolist() == [0, 1, 2, 3, 4] and list(joined.raw or []) == list("xyzvw")
    assert joined.users.tolist() == ["a", "b", "c", "a", "b"] and joined.partition == 1
    assert not mergeable(one, dataclasses.replace(two, partition=2))
    assert not mergeable(one, dataclasses.replace(two, raw=None))
    assert not mergeable(one, dataclasses.replace(two, users=np.arange(2)))
    assert not mergeable(dataclasses.replace(one, complete_through=3), two)
