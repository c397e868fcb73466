"""Flow tests with Bytewax's testing source and sink (design §10 item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from privstream.connectors.json_events import parse_json_lines
from privstream.connectors.jsonl import to_json
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.slotting import SlottingConfig
from privstream.schema.events import EventBatch

N, T, W = 300, 30, 5


def slot_batch(stream: str, t: int, n: int = N, seed: int = 0) -> EventBatch:
    rng = np.random.default_rng([seed, t, len(stream)])
    values = (rng.random(n) < 0.2 + 0.1 * np.sin(t / 4)).astype(np.float64)
    return EventBatch(stream, np.full(n, t), np.arange(n), values, complete_through=t)


def two_streams(t_max: int = T) -> list[EventBatch]:
    return [slot_batch(s, t) for t in range(1, t_max + 1) for s in ("a", "b")]


def flow_over(
    items: list[Any], mechanism: str = "LPA", slotting: SlottingConfig | None = None
) -> tuple[Dataflow, dict[str, list[Any]]]:
    flow = Dataflow("test_ldp_ids")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(items)), lambda b: b.stream)
    out = family_mechanisms(
        "ldp_ids", keyed, family=LDP_IDS, mechanism=mechanism,
        config=LdpIdsConfig(1.0, W, N, task=FrequencyTask(2)), secret=5, slotting=slotting,
    )  # fmt: skip
    sinks: dict[str, list[Any]] = {"releases": [], "ledger": [], "dead_letters": []}
    op.output("r", op.map("r_json", out.releases, to_json), TestingSink(sinks["releases"]))
    op.output("l", op.map("l_json", out.ledger, to_json), TestingSink(sinks["ledger"]))
    op.output("d", out.dead_letters, TestingSink(sinks["dead_letters"]))
    return flow, sinks


def by_id(lines: list[str]) -> dict[str, str]:
    return {json.loads(line)["release_id"]: line for line in lines}


@pytest.mark.parametrize("mechanism", ["LBU", "LSP", "LPU", "LBD", "LBA", "LPD", "LPA"])
def test_every_slot_of_every_stream_is_released_once(mechanism: str) -> None:
    flow, out = flow_over(two_streams(), mechanism)
    run_main(flow)
    ids = [json.loads(line)["release_id"] for line in out["releases"]]
    assert sorted(ids) == sorted(f"{s}/{mechanism}/{t}" for s in "ab" for t in range(1, T + 1))
    assert len(out["ledger"]) == 2 * T and out["dead_letters"] == []
    # an int secret is a public seed: every output says it is not private
    assert all(json.loads(line)["insecure_seed"] for line in out["releases"] + out["ledger"])


def test_recovery_round_trip_is_byte_identical(tmp_path: Path) -> None:
    clean_flow, clean = flow_over(two_streams())
    run_main(clean_flow)

    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(str(tmp_path))
    items: list[Any] = two_streams()
    items.insert(37, TestingSource.ABORT())  # abort mid-stream, after some epochs closed
    flow, first = flow_over(items)
    run_main(flow, epoch_interval=__import__("datetime").timedelta(0), recovery_config=recovery)
    assert 0 < len(first["releases"]) < 2 * T
    flow2, second = flow_over(items)
    run_main(flow2, epoch_interval=__import__("datetime").timedelta(0), recovery_config=recovery)

    expected = by_id(clean["releases"])
    replayed = by_id(first["releases"]) | by_id(second["releases"])
    assert replayed.keys() == expected.keys(), "every slot released after the resume"
    for part in (first["releases"], second["releases"]):
        for line in part:
            assert line == expected[json.loads(line)["release_id"]], "replayed release differs"


def test_two_workers_release_the_same_as_one() -> None:
    one_flow, one = flow_over(two_streams())
    run_main(one_flow)
    two_flow, two = flow_over(two_streams())
    cluster_main(two_flow, [], 0, worker_count_per_proc=2)
    assert sorted(two["releases"]) == sorted(one["releases"])
    assert sorted(two["ledger"]) == sorted(one["ledger"])


def test_empty_slots_advance_the_ledger() -> None:
    items = [slot_batch("a", t) for t in (1, 2, 3)] + [slot_batch("a", 9)]
    flow, out = flow_over(items, "LPU")
    run_main(flow)
    releases = [json.loads(line) for line in out["releases"]]
    assert [r["slot"] for r in releases] == list(range(1, 10))
    # carry-forward for w − 1 = 4 slots after slot 3: slots 4–7 still have users and LPU's
    # groups keep rotating; at slot 8 the values of slot 3 are no longer carried
    users = [r["details"]["users_m2"] for r in releases]
    assert users[:7] == [N // W] * 7 and users[7] == 0 and users[8] == N // W


def jsonl(events: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(e) for e in events]


def test_bad_events_go_to_dead_letters_and_do_not_change_releases() -> None:
    rng = np.random.default_rng(3)
    good = [
        {"stream": "s", "user": f"u{u}", "slot": t, "value": int(rng.random() < 0.3)}
        for t in range(1, 16) for u in range(N)
    ]  # fmt: skip
    bad_lines = [
        "{not json",
        json.dumps({"stream": "s", "slot": 3, "value": 1}),  # missing user
        json.dumps({"stream": "s", "user": "u1", "slot": "x", "value": 1}),  # mistyped slot
        json.dumps({"stream": "s", "user": "u1", "slot": -4, "value": 1}),  # negative slot
        json.dumps({"stream": "s", "user": "u1", "slot": 4, "value": 7}),  # out of domain (d=2)
        json.dumps(
            {"stream": "s", "user": "u1", "slot": 3, "value": 1}
        ),  # duplicate: u1 reported at open slot 3
        json.dumps({"stream": "s", "user": "u2", "slot": 1, "value": 0}),  # late: slot 1 released
        json.dumps({"stream": "s", "user": "u2", "slot": 10**9, "value": 0}),  # far future
        "x" * 70_000,  # oversized
    ]
    good_lines = jsonl(good)

    def run(lines: list[str]) -> dict[str, list[Any]]:
        chunks = [lines[i : i + 250] for i in range(0, len(lines), 250)]
        items = [
            item
            for chunk in chunks
            for item in parse_json_lines(chunk)
            if isinstance(item, EventBatch)
        ]
        parse_dead = [
            item
            for chunk in chunks
            for item in parse_json_lines(chunk)
            if not isinstance(item, EventBatch)
        ]
        flow, out = flow_over(items, slotting=SlottingConfig(lateness=0))
        run_main(flow)
        out["dead_letters"] = parse_dead + out["dead_letters"]
        return out

    clean = run(good_lines)
    mixed_lines = good_lines[: 3 * N] + bad_lines + good_lines[3 * N :]
    mixed = run(mixed_lines)
    assert mixed["releases"] == clean["releases"]
    reasons = sorted(d.reason for d in mixed["dead_letters"])
    assert reasons == sorted(
        ["malformed_json", "missing_field", "invalid_type", "negative_slot", "out_of_domain",
         "duplicate_report", "late_event", "far_future_slot", "oversized"]
    )  # fmt: skip
    assert clean["dead_letters"] == []


class _BreaksAtSlot3(__import__("privstream.mechanisms.ldp_ids", fromlist=["LBU"]).LBU):  # type: ignore[misc]
    """LBU whose ledger is asked for ten times the budget at slot 3."""

    def decide(self, state: Any, slot: Any) -> Any:
        if state.t == 3:
            state.budget.charge(state.t, 10 * self.config.epsilon, "m2")
        return super().decide(state, slot)


def test_a_violated_invariant_halts_only_that_stream_before_release() -> None:
    from privstream.mechanisms.contract import Release
    from privstream.operators.slotting import slotted_mechanism

    config = LdpIdsConfig(1.0, W, N, task=FrequencyTask(2))
    flow = Dataflow("halting")
    keyed = op.key_on(
        "by_stream", op.input("in", flow, TestingSource(two_streams(6))), lambda b: b.stream
    )
    out = slotted_mechanism(
        "m", keyed, mechanisms=[_BreaksAtSlot3(config)], task=config.task, population=N, secret=1
    )
    releases: list[Release] = []
    dead: list[Any] = []
    op.output("r", out.releases, TestingSink(releases))
    op.output("d", out.dead_letters, TestingSink(dead))
    run_main(flow)
    assert sorted((r.stream, r.slot) for r in releases) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert {d.reason for d in dead} == {"stream_halted"}
    assert len(dead) == 2 * 3 * N  # slots 4..6 of both streams


def test_resuming_from_an_incompatible_snapshot_fails_loudly() -> None:
    from privstream.mechanisms.errors import IncompatibleState
    from privstream.mechanisms.seeding import NoiseKey
    from privstream.operators.slotting import SlottedLogic, SlottedPlan, make_plan
    from privstream.operators.stream_state import StreamState

    config = LdpIdsConfig(1.0, W, N, task=FrequencyTask(2))
    mech = LDP_IDS.build("LPA", config)

    def plan(key: NoiseKey, mechanism: Any = mech) -> SlottedPlan:
        return make_plan("step", [mechanism], config.task, N, key, SlottingConfig())

    key = NoiseKey.from_text("3f9a0c5e7b2d48e1a6c4f0b9d2e7a153")
    bound = plan(key).binding()

    def state(mechanisms: dict[str, Any], **kw: Any) -> StreamState:
        return StreamState("a", mechanisms, np.full(N, np.nan), binding=dict(bound), **kw)

    def resume(state: StreamState, key: NoiseKey = key, mechanism: Any = mech) -> None:
        SlottedLogic("step", plan(key, mechanism), state)

    resume(state({"LPA": mech.initial_state()}))  # compatible
    with pytest.raises(IncompatibleState, match="version"):
        resume(state({"LPA": mech.initial_state()}, version=0))
    with pytest.raises(IncompatibleState, match="LBD"):
        resume(state({"LBD": LDP_IDS.build("LBD", config).initial_state()}))
    stale = mech.initial_state()
    stale.version = 99
    with pytest.raises(IncompatibleState, match="version"):
        resume(state({"LPA": stale}))
    # the snapshot is bound to the noise key (by fingerprint, never the key) and the parameters
    other_key = NoiseKey.from_text("c81d6e02f94b37a5e0d9b2c6a17f845e")
    with pytest.raises(IncompatibleState, match="another secret") as refused:
        resume(state({"LPA": mech.initial_state()}), key=other_key)
    assert "3f9a0c5e7b2d48e1a6c4f0b9d2e7a153" not in str(refused.value)
    with pytest.raises(IncompatibleState, match="another secret"):
        resume(state({"LPA": mech.initial_state()}), key=NoiseKey.insecure_seed(1))
    wider = LDP_IDS.build("LPA", LdpIdsConfig(2.0, W, N, task=FrequencyTask(2)))
    with pytest.raises(IncompatibleState, match=r"epsilon=2\.0"):
        resume(state({"LPA": wider.initial_state()}), mechanism=wider)


def test_a_halted_mechanism_does_not_stop_its_neighbours() -> None:
    from privstream.mechanisms.accountant import BudgetSplit
    from privstream.mechanisms.contract import Release
    from privstream.operators.slotting import slotted_mechanism

    # two mechanisms over one population split its budget (each runs with ε/2)
    config = LdpIdsConfig(0.5, W, N, task=FrequencyTask(2))
    flow = Dataflow("halting_one")
    keyed = op.key_on(
        "by_stream", op.input("in", flow, TestingSource(two_streams(6))), lambda b: b.stream
    )
    mechanisms = [_BreaksAtSlot3(config), LDP_IDS.build("LPD", config)]
    out = slotted_mechanism(
        "m", keyed, mechanisms=mechanisms, task=config.task, population=N, secret=1,
        split=BudgetSplit.parse("equal", 2),
    )  # fmt: skip
    releases: list[Release] = []
    dead: list[Any] = []
    op.output("r", out.releases, TestingSink(releases))
    op.output("d", out.dead_letters, TestingSink(dead))
    run_main(flow)
    assert sorted(r.slot for r in releases if r.mechanism == "LBU") == [1, 1, 2, 2]
    assert sorted(r.slot for r in releases if r.mechanism == "LPD") == sorted(list(range(1, 7)) * 2)
    assert dead == []


def test_the_ready_flow_runs_under_bytewax_run_from_the_checkout(tmp_path: Path) -> None:
    import os
    import secrets
    import subprocess
    import sys

    out = tmp_path / "r.jsonl"
    spec = f"privstream.flows.ldp_ids:build(dataset='log', mechanisms='LBA,LPD', users=3000, slots=30, out='{out}', budget_split='equal')"
    checkout = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PRIVSTREAM_SECRET": secrets.token_hex(32)}
    subprocess.run(
        [sys.executable, "-m", "bytewax.run", spec], cwd=checkout, check=True, timeout=120, env=env
    )
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    ids = sorted(r["release_id"] for r in releases)
    assert ids == sorted(f"log/{m}/{t}" for m in ("LBA", "LPD") for t in range(1, 31))
    # the secret came from the environment, and the two mechanisms split ε = 1
    assert all(r["guarantee"]["epsilon"] == 0.5 and not r["insecure_seed"] for r in releases)
    assert not any(r["evaluation"] for r in releases)


def test_the_ready_flow_refuses_to_run_without_a_secret_or_a_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from privstream.flows.ldp_ids import build
    from privstream.mechanisms.seeding import SecretError

    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)
    with pytest.raises(SecretError, match="secret"):
        build(dataset="log", mechanisms="LPA", users=100, slots=3)
    with pytest.raises(ValueError, match="--budget-split"):
        build(dataset="log", mechanisms="LBA,LPD", users=100, slots=3, insecure_seed=1)
