"""A three-stage toy as a real Bytewax dataflow (design §13, issue 19 item 3): devices
randomise a bit with randomized response (randomizer keyed by user shard), a shuffler batches
one epoch's reports and permutes them, dropping the senders (keyed by epoch), and an aggregator
de-biases and releases a count per slot (keyed by stream). Each stage is a ``Stage``
declaration wired by ``operators.stages.build_stages``.

Randomized response with ``p = e^ε/(1+e^ε)``, ``q = 1 − p``: a user with bit ``x`` reports ``x``
with probability ``p``. The de-biased count of ``n`` reports with sum ``S`` is
``(S − n q)/(p − q)``; it is unbiased with variance ``n p (1 − p)/(p − q)²`` (every report's
variance is ``p q`` whatever its bit), which sets the tolerances below.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.mechanisms.stages import (
    CURATOR,
    DEVICES,
    SHUFFLER,
    Stage,
    StageKey,
    by_stream,
    check_chain,
    shard_of,
)
from privstream.operators.stages import build_stages

SEED, EPS, USERS, SHARDS, SLOTS, SLOTS_PER_EPOCH = 5, 1.0, 240, 4, 6, 2
STREAMS = ("heart", "steps")
P = math.exp(EPS) / (1 + math.exp(EPS))
Q = 1 - P
EPOCHS = SLOTS // SLOTS_PER_EPOCH


# -- batch types ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bit:
    """A device's private bit of one stream at one slot (never leaves the device)."""

    stream: str
    user: str
    slot: int
    value: int


@dataclass(frozen=True)
class EpochEnd:
    """The slot clock: every shard's devices are done with ``epoch``."""

    epoch: int
    shard: int


@dataclass(frozen=True)
class Report:
    """A randomised bit on its way to the shuffler; ``sender`` is the network envelope."""

    sender: str
    stream: str
    slot: int
    epoch: int
    bit: int


@dataclass(frozen=True)
class ShardClosed:
    """A shard announces how many reports it sent in ``epoch``."""

    epoch: int
    shard: int
    reports: int


@dataclass(frozen=True)
class ShuffledBatch:
    """One stream's reports of one epoch in a random order, without senders."""

    stream: str
    epoch: int
    slots: tuple[int, ...]
    bits: tuple[int, ...]


@dataclass(frozen=True)
class CountRelease:
    stream: str
    slot: int
    estimate: float
    reports: int


# -- stages --------------------------------------------------------------------------------------


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


@dataclass
class RandomizerState:
    sent: dict[int, int] = field(default_factory=dict)


def randomize(state: RandomizerState, record: Bit | EpochEnd) -> tuple[RandomizerState, list[Any]]:
    """ε-LDP randomized response on the device; the shard's marker carries its report count."""
    if isinstance(record, EpochEnd):
        return state, [ShardClosed(record.epoch, record.shard, state.sent.pop(record.epoch, 0))]
    keep = _rng(SEED, "rr", record.stream, record.user, record.slot).random() < P
    epoch = record.slot // SLOTS_PER_EPOCH
    state.sent[epoch] = state.sent.get(epoch, 0) + 1
    bit = record.value if keep else 1 - record.value
    return state, [Report(record.user, record.stream, record.slot, epoch, bit)]


@dataclass
class ShufflerState:
    reports: list[Report] = field(default_factory=list)
    closed: dict[int, int] = field(default_factory=dict)


def shuffle(
    state: ShufflerState, record: Report | ShardClosed
) -> tuple[ShufflerState | None, list[ShuffledBatch]]:
    """Hold an epoch's reports until every shard closed it and all its reports arrived; then
    emit one permuted batch per stream without senders and end the epoch's state."""
    if isinstance(record, ShardClosed):
        state.closed[record.shard] = record.reports
    else:
        state.reports.append(record)
    if len(state.closed) < SHARDS or sum(state.closed.values()) != len(state.reports):
        return state, []
    epoch = state.reports[0].epoch if state.reports else -1
    out = []
    for stream in sorted({r.stream for r in state.reports}):
        mine = [r for r in state.reports if r.stream == stream]
        order = _rng(SEED, "shuffle", epoch, stream).permutation(len(mine))
        picked = [mine[i] for i in order]
        out.append(
            ShuffledBatch(
                stream, epoch, tuple(r.slot for r in picked), tuple(r.bit for r in picked)
            )
        )
    return None, out


@dataclass
class AggregatorState:
    released: list[int] = field(default_factory=list)


def aggregate(
    state: AggregatorState, batch: ShuffledBatch
) -> tuple[AggregatorState, list[CountRelease]]:
    """The de-biased count ``(S − n q)/(p − q)`` of every slot in the batch."""
    slots, bits = np.array(batch.slots), np.array(batch.bits)
    out = []
    for slot in sorted(set(batch.slots)):
        mine = bits[slots == slot]
        n = int(mine.size)
        out.append(CountRelease(batch.stream, slot, (float(mine.sum()) - n * Q) / (P - Q), n))
        state.released.append(slot)
    return state, out


def user_shard(record: Bit | EpochEnd) -> str:
    shard = record.shard if isinstance(record, EpochEnd) else shard_of(record.user, SHARDS)
    return f"shard-{shard}"


def stages(created: dict[str, int]) -> list[Stage]:
    """The three stages; ``created`` counts the states each stage's factory made."""

    def counted(name: str, factory: Any) -> Any:
        def make() -> Any:
            created[name] += 1
            return factory()

        return make

    return [
        Stage("randomize", "device", StageKey("user shard", user_shard), DEVICES,
              "Bit | EpochEnd", "Report | ShardClosed", counted("randomize", RandomizerState),
              randomize),
        Stage("shuffle", "shuffler", StageKey("epoch", lambda r: f"epoch-{r.epoch}"), SHUFFLER,
              "Report | ShardClosed", ShuffledBatch, counted("shuffle", ShufflerState), shuffle),
        Stage("aggregate", "server", by_stream(), CURATOR, ShuffledBatch, CountRelease,
              counted("aggregate", AggregatorState), aggregate),
    ]  # fmt: skip


# -- the run -------------------------------------------------------------------------------------


def truth() -> dict[tuple[str, int], int]:
    """The true count of ones per (stream, slot)."""
    return {(s, t): sum(_bit(s, u, t) for u in range(USERS)) for s in STREAMS for t in range(SLOTS)}


def _bit(stream: str, user: int, slot: int) -> int:
    share = 0.2 + 0.1 * slot + (0.2 if stream == "steps" else 0.0)
    return int(_rng(SEED, "value", stream, user, slot).random() < share)


def records() -> list[Bit | EpochEnd]:
    out: list[Bit | EpochEnd] = []
    for slot in range(SLOTS):
        out += [
            Bit(s, f"user-{u:03d}", slot, _bit(s, u, slot)) for s in STREAMS for u in range(USERS)
        ]
        if slot % SLOTS_PER_EPOCH == SLOTS_PER_EPOCH - 1:
            out += [EpochEnd(slot // SLOTS_PER_EPOCH, shard) for shard in range(SHARDS)]
    return out


def run() -> dict[str, Any]:
    created: dict[str, int] = defaultdict(int)
    seen: dict[str, list[tuple[str, Any]]] = {"randomize": [], "shuffle": [], "aggregate": []}
    released: list[CountRelease] = []
    flow = Dataflow("three_stages")
    chain = build_stages(
        op.input("devices", flow, TestingSource(records())), stages(created), roundtrip_state=True
    )
    for name, keyed in chain.inputs.items():
        op.output(f"tap_{name}", keyed, TestingSink(seen[name]))
    op.output("releases", chain.result, TestingSink(released))
    run_main(flow)
    return {"created": dict(created), "seen": seen, "released": released}


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return run()


def test_each_stage_keeps_one_state_per_key(result: dict[str, Any]) -> None:
    seen = result["seen"]
    keys = {name: {k for k, _ in pairs} for name, pairs in seen.items()}
    assert keys["randomize"] == {f"shard-{i}" for i in range(SHARDS)}
    assert keys["shuffle"] == {f"epoch-{e}" for e in range(EPOCHS)}
    assert keys["aggregate"] == set(STREAMS)
    assert result["created"] == {"randomize": SHARDS, "shuffle": EPOCHS, "aggregate": len(STREAMS)}


def test_the_keys_partition_the_work(result: dict[str, Any]) -> None:
    shards_of_user: dict[str, set[str]] = defaultdict(set)
    for key, record in result["seen"]["randomize"]:
        if isinstance(record, Bit):
            shards_of_user[record.user].add(key)
    assert len(shards_of_user) == USERS
    assert all(len(keys) == 1 for keys in shards_of_user.values())
    for key, record in result["seen"]["shuffle"]:
        assert key == f"epoch-{record.epoch}"
    reports = [r for _, r in result["seen"]["shuffle"] if isinstance(r, Report)]
    assert len(reports) == USERS * SLOTS * len(STREAMS)
    for key, batch in result["seen"]["aggregate"]:
        assert key == batch.stream


def test_no_user_id_reaches_the_aggregator(result: dict[str, Any]) -> None:
    batches = [b for _, b in result["seen"]["aggregate"]]
    assert batches and all(isinstance(b, ShuffledBatch) for b in batches)
    assert len(batches) == EPOCHS * len(STREAMS)
    text = repr(batches)
    assert "user-" not in text and "sender" not in text
    # The shuffler permutes: every batch holds the epoch's reports, in an order that is not
    # the arrival order (slot by slot).
    reports = [r for _, r in result["seen"]["shuffle"] if isinstance(r, Report)]
    for b in batches:
        arrived = [(r.slot, r.bit) for r in reports if (r.stream, r.epoch) == (b.stream, b.epoch)]
        assert sorted(zip(b.slots, b.bits, strict=True)) == sorted(arrived)
        assert list(b.slots) != sorted(b.slots)


def test_the_released_counts_match_randomized_response(result: dict[str, Any]) -> None:
    released: list[CountRelease] = result["released"]
    assert sorted((r.stream, r.slot) for r in released) == sorted(truth())
    sigma = math.sqrt(USERS * P * Q) / (P - Q)  # sd of one de-biased count
    true = truth()
    errors = [r.estimate - true[(r.stream, r.slot)] for r in released]
    assert all(r.reports == USERS for r in released)
    assert max(abs(e) for e in errors) <= 4 * sigma  # 12 counts, each within 4 sd
    assert abs(sum(errors)) <= 4 * sigma * math.sqrt(len(errors))  # unbiased in sum


def test_the_flow_is_deterministic_under_a_fixed_seed(result: dict[str, Any]) -> None:
    again = run()["released"]
    assert again == result["released"]


def test_a_chain_whose_batch_types_do_not_meet_is_refused() -> None:
    chain = stages(defaultdict(int))
    with pytest.raises(
        ValueError, match=re.escape("'randomize' outputs Report | ShardClosed but the next")
    ):
        check_chain([chain[0], chain[2]])
    with pytest.raises(ValueError, match="roles are"):
        Stage("x", "observer", by_stream(), CURATOR, "A", "B", dict)
    flow = Dataflow("no_step")
    declared = Stage("devices", "device", by_stream(), DEVICES, "A", "B", dict)
    with pytest.raises(ValueError, match=re.escape("'devices' (randomizer) has no step")):
        build_stages(op.input("in", flow, TestingSource([])), [declared])
