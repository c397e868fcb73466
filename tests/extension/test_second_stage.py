"""The worked example's axis "a second stage with another key": ``example-stages`` (a module in
``site/``, registered by entry point) randomises each user's bit on a device stage keyed by
user shard before LBU's server stage keyed by stream. It runs through ``privstream run`` (in
process and in a subprocess), a flow file's check, the bench harness and the conformance
checks, and nothing in privstream names it.

Tolerances: randomized response at ε' = ε/w keeps a bit with ``p = e^ε'/(1+e^ε')``; the
de-biased frequency of ones over ``m`` reports has variance ``p(1−p)/(m (2p−1)²)``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from privstream.cli import main
from privstream.families import registry
from privstream.mechanisms.stages import pre_server, run_chain, shard_of
from privstream.mechanisms.tasks import FrequencyTask
from privstream.schema.events import EventBatch
from tests.extension import surfaces

USERS, SLOTS, EPS, WINDOW = 2000, 12, 5.0, 5
P = math.exp(EPS / WINDOW) / (1 + math.exp(EPS / WINDOW))
SD = math.sqrt(P * (1 - P) / (USERS * (2 * P - 1) ** 2))
ARGV = ["run", "example-stages", "--users", str(USERS), "--slots", str(SLOTS),
        "--insecure-seed", "7", "--dataset", "sin", "--no-progress"]  # fmt: skip


def _check_releases(path: Path) -> None:
    releases = surfaces.lines(path)
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    assert {r["mechanism"] for r in releases} == {"RR"}
    for release, truth in zip(releases, surfaces.sin_truth(USERS, SLOTS), strict=True):
        assert abs(release["estimate"][1] - truth) <= 4 * SD, (release["slot"], truth)


def test_the_family_declares_a_device_stage_keyed_by_user_shard(external_site: dict) -> None:
    family = registry.family("example-stages")
    mech = family.build("RR", _config())
    device, server = mech.stages()
    assert (device.role, device.key.name, device.trust_domain) == ("randomizer", "user shard",
                                                                    "devices")  # fmt: skip
    assert (server.role, server.key.name) == ("curator", "stream")
    assert [s.name for s in pre_server([mech])] == ["randomize"]
    ldp = registry.family("ldp-ids")
    assert pre_server([ldp.build("LBU", _config())]) == ()  # one-stage families: no chain


def _config():  # type: ignore[no-untyped-def]
    return registry.family("example-stages").make_config(
        epsilon=EPS, window=WINDOW, population=USERS, task=FrequencyTask(2)
    )


def test_privstream_run_in_process(external_site: dict, tmp_path: Path) -> None:
    out = tmp_path / "rr.jsonl"
    assert main([*ARGV, "--out", str(out)]) == 0
    _check_releases(out)


def test_privstream_run_in_a_subprocess(external_site: dict, tmp_path: Path) -> None:
    out = tmp_path / "rr.jsonl"
    surfaces.run_subprocess(external_site, [*ARGV, "--out", str(out)])
    _check_releases(out)


def test_each_shard_keeps_its_own_state_and_no_raw_value_reaches_the_server(
    external_site: dict,
) -> None:
    mech = registry.family("example-stages").build("RR", _config())
    stages = pre_server([mech])
    users = np.array([f"user-{i}" for i in range(400)], dtype=object)
    values = (np.arange(400) % 3 == 0).astype(np.float64)
    raw = [f"user-{i},1,{v}" for i, v in enumerate(values)]
    states: dict = {}
    batches = [EventBatch("s", np.full(400, t), users, values, raw=raw, complete_through=t)
               for t in (1, 2)]  # fmt: skip
    received = run_chain(stages, batches, states)
    shards = states["randomize"]
    assert sorted(shards) == [f"shard-{k}" for k in range(4)]
    for key, state in shards.items():
        assert key == f"shard-{state.shard}"
        assert {shard_of(u, 4) for u in state.reports} == {state.shard}
        assert set(state.reports.values()) == {2}  # each of its users reported twice
    assert sum(len(s.reports) for s in shards.values()) == 400
    for sent, got in zip(batches, received, strict=True):
        assert got.raw is None  # the events' raw lines stay on the devices
        assert list(got.users) == list(sent.users) and got.complete_through == sent.complete_through
        assert set(np.unique(got.values)) <= {0.0, 1.0}
        flipped = float(np.mean(got.values != sent.values))
        assert abs(flipped - (1 - P)) <= 4 * math.sqrt(P * (1 - P) / 400)


def test_the_bench_harness_runs_the_device_stage(external_site: dict, tmp_path: Path) -> None:
    results = surfaces.bench(
        tmp_path, "example-stages", "--users", str(USERS), "--slots", str(SLOTS)
    )
    maes = [float(r["mae"]) for r in results.values() if "mae" in r]
    assert maes and all(0 < m <= 4 * SD for m in maes)  # noisy (the devices), near the truth


def test_the_conformance_checks_pass(external_site: dict) -> None:
    ran = surfaces.conformance("example-stages", ["RR"], skips=True)
    assert "one_release_per_slot" in ran and "recovery_round_trip" in ran
    assert "pinned_step_ids" in ran and "two_workers" in ran


def test_a_flow_file_with_the_family_checks(
    external_site: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = {"name": "rr", "family": "example-stages", "mechanisms": ["RR"], "domain": 2,
              "share": 1.0}  # fmt: skip
    population = {"users": 1000, "epsilon": 5.0, "window": 5}
    flow = surfaces.flow_file(tmp_path, population=population, streams=[stream])
    surfaces.assert_flow_check(capsys, flow, ["example-stages"])


def test_the_dataflow_wires_the_device_stage_and_puts_batches_back_in_order(
    external_site: dict,
) -> None:
    """``chain_events`` (what ``family_mechanisms`` wires for this family in ``privstream run``
    and in flow files) as a real Bytewax dataflow, states pickled after every step: every
    batch reaches the server whole, in its order, marker on it, randomised, without raw lines,
    and a marker-only batch does not overtake the rows before it."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main

    from privstream.operators.stages import chain_events

    mech = registry.family("example-stages").build("RR", _config())
    users = np.array([f"u{i}" for i in range(300)], dtype=object)
    sent = [EventBatch("s", np.full(300, t), users, (np.arange(300) % 2).astype(float),
                       raw=[f"u{i}" for i in range(300)]) for t in (1, 2, 3)]  # fmt: skip
    marker = EventBatch("s", np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0),
                        complete_through=2)  # fmt: skip
    flow = Dataflow("stages_test")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource([sent[0], sent[1], marker,
                                                                       sent[2]])), lambda b: b.stream)  # fmt: skip
    got: list = []
    op.output("out", chain_events(keyed, pre_server([mech]), roundtrip_state=True),
              TestingSink(got))  # fmt: skip
    run_main(flow)
    batches = [b for _k, b in got]
    assert [len(b) for b in batches] == [300, 300, 0, 300]
    assert [b.complete_through for b in batches] == [None, None, 2, None]
    for b, s in zip([batches[0], batches[1], batches[3]], sent, strict=True):
        assert b.raw is None and list(b.users) == list(s.users)
        assert list(b.slots) == list(s.slots) and set(np.unique(b.values)) <= {0.0, 1.0}
