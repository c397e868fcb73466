"""The personalized family as Bytewax flows: every mechanism over keyed streams, recovery round
trips, per-class ledger invariants, users' requirements fixed by the registration table."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.json_events import parse_json_lines
from privstream.connectors.jsonl import to_json
from privstream.connectors.registrations import load_preferences
from privstream.families.registry import PERSONALIZED
from privstream.flows.personalized import build
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.personalized import MECHANISMS, PersonalizedConfig
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.schema.events import EventBatch

N, T, W, EPS = 400, 40, 8, 1.0
# Four user types, each at least as lenient as the stream's (ε, w) = (1, 8), so the uniform
# baselines (which protect everyone with (ε, w)) may serve them too (spec §6.3).
TYPE_EPS = np.array([1.0, 2.0, 1.5, 4.0])
TYPE_WIN = np.array([8, 4, 8, 2])


def prefs() -> Preferences:
    kind = np.arange(N) % 4
    return Preferences(epsilons=TYPE_EPS[kind], windows=TYPE_WIN[kind])


def slot_batch(stream: str, t: int) -> EventBatch:
    rng = np.random.default_rng([t, len(stream)])
    values = (rng.random(N) < 0.3 + 0.2 * np.sin(t / 5)).astype(np.float64)
    return EventBatch(stream, np.full(N, t), np.arange(N), values, complete_through=t)


def streams(t_max: int = T) -> list[Any]:
    return [slot_batch(s, t) for t in range(1, t_max + 1) for s in ("a", "b")]


def flow_over(items: list[Any], mechanism: str) -> tuple[Dataflow, dict[str, list[Any]]]:
    flow = Dataflow("test_personalized")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(items)), lambda b: b.stream)
    config = PersonalizedConfig(population=N, epsilon=EPS, window=W)
    out = family_mechanisms(
        "personalized",
        keyed,
        family=PERSONALIZED,
        mechanism=mechanism,
        config=config,
        secret=11,
        registration=prefs(),
    )
    sinks: dict[str, list[Any]] = {"releases": [], "ledger": [], "dead_letters": []}
    op.output("r", op.map("r_json", out.releases, to_json), TestingSink(sinks["releases"]))
    op.output("l", op.map("l_json", out.ledger, to_json), TestingSink(sinks["ledger"]))
    op.output("d", out.dead_letters, TestingSink(sinks["dead_letters"]))
    return flow, sinks


def by_id(lines: list[str]) -> dict[str, str]:
    return {json.loads(line)["release_id"]: line for line in lines}


def check_class_windows(ledger_lines: list[str]) -> int:
    """Every class's spend over every window of its own w_c stays within ε_c, recomputed from
    the per-slot charges in the ledger entries; returns how many class windows were checked."""
    charges: dict[tuple[str, str, int, float], dict[int, float]] = defaultdict(dict)
    for line in ledger_lines:
        entry = json.loads(line)
        split = zip(entry["details"]["epsilon_dc"], entry["details"]["epsilon_pub"], strict=True)
        for c, (dc, pub) in zip(entry["classes"], split, strict=True):
            assert c["charged"] == dc + pub  # the split into DC and publication adds up
            key = (entry["stream"], entry["mechanism"], c["scope"], c["budget"])
            charges[key][entry["slot"]] = c["charged"]
    checked = 0
    for (_s, _m, w, eps), by_slot in charges.items():
        for end in by_slot:
            spent = sum(by_slot.get(t, 0.0) for t in range(end - w + 1, end + 1))
            assert spent <= eps * (1 + 1e-9), (w, eps, end, spent)
            checked += 1
    return checked


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_every_mechanism_releases_every_slot_within_every_class_budget(mechanism: str) -> None:
    flow, out = flow_over(streams(), mechanism)
    run_main(flow)
    ids = sorted(json.loads(line)["release_id"] for line in out["releases"])
    assert ids == sorted(f"{s}/{mechanism}/{t}" for s in "ab" for t in range(1, T + 1))
    classes = {(c["scope"], c["budget"]) for c in json.loads(out["ledger"][0])["classes"]}
    assert classes == set(zip(TYPE_WIN.tolist(), TYPE_EPS.tolist(), strict=True))
    assert check_class_windows(out["ledger"]) >= 2 * T * 4


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_recovery_round_trip_is_byte_identical(mechanism: str, tmp_path: Path) -> None:
    clean_flow, clean = flow_over(streams(), mechanism)
    run_main(clean_flow)

    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(str(tmp_path))
    items: list[Any] = streams()
    items.insert(37, TestingSource.ABORT())
    flow, first = flow_over(items, mechanism)
    run_main(flow, epoch_interval=timedelta(0), recovery_config=recovery)
    assert 0 < len(first["releases"]) < 2 * T
    flow2, second = flow_over(items, mechanism)
    run_main(flow2, epoch_interval=timedelta(0), recovery_config=recovery)
    assert by_id(first["releases"]) | by_id(second["releases"]) == by_id(clean["releases"])


def event(user: str, t: int, value: int, **req: Any) -> str:
    return json.dumps({"stream": "s", "user": user, "slot": t, "value": value, **req})


def test_requirements_are_registered_before_the_data_and_cannot_change() -> None:
    # the registration table fixes who is counted and with which requirement, before any data
    table = {f"u{u}": (2.0, 4) if u < 20 else (1.0, 6) for u in range(60)}
    lines = []
    for t in range(1, 13):
        for u in range(60):
            stated = {"epsilon": 2.0, "window": 4} if u < 20 else {}
            lines.append(event(f"u{u}", t, (u + t) % 2, **stated))
        lines.append(json.dumps({"stream": "s", "end_of_slot": t}))
    lines.insert(200, event("u5", 4, 1, epsilon=0.5, window=4))  # u5 registered (2.0, 4)
    lines.insert(300, event("u30", 6, 1, window=2))  # u30 registered (1.0, 6)
    # an unregistered user stating a requirement does not register by sending data
    lines.insert(400, event("u77", 7, 1, epsilon=2.0, window=4))
    flow = Dataflow("req")
    parsed = op.flat_map_batch(
        "parse", op.input("in", flow, TestingSource(lines, 50)), parse_json_lines
    )
    keyed = op.key_on(
        "k", op.filter("ok", parsed, lambda x: isinstance(x, EventBatch)), lambda b: b.stream
    )
    out = family_mechanisms(
        "p", keyed, family=PERSONALIZED, mechanism="PBD",
        config=PersonalizedConfig(population=60, epsilon=1.0, window=6), secret=3,
        registration=Preferences(by_user=table),
    )  # fmt: skip
    ledger: list[Any] = []
    dead: list[Any] = []
    op.output("l", out.ledger, TestingSink(ledger))
    op.output("d", out.dead_letters, TestingSink(dead))
    run_main(flow)
    assert [(d.reason, json.loads(d.payload)["user"]) for d in dead] == [
        ("requirement_changed", "u5"),
        ("requirement_changed", "u30"),
        ("unregistered_user", "u77"),
    ]
    classes = {(c.scope, c.budget, c.users) for c in ledger[-1].classes}
    assert classes == {(4, 2.0, 20), (6, 1.0, 40)}
    assert all(entry.insecure_seed for entry in ledger)  # secret=3 is a public seed


def test_who_is_counted_does_not_depend_on_who_sent_data() -> None:
    # the same registration with and without the data of some users: the same classes are
    # counted and charged (silent registered users are still members of their class)
    table = {f"u{u}": (2.0, 4) if u < 10 else (1.0, 6) for u in range(30)}

    def classes(senders: range) -> set[tuple[int, float, int]]:
        lines = [event(f"u{u}", t, (u + t) % 2) for t in range(1, 7) for u in senders] + [
            json.dumps({"stream": "s", "end_of_slot": 6})
        ]
        flow = Dataflow("who")
        parsed = op.flat_map_batch(
            "parse", op.input("in", flow, TestingSource(lines, 50)), parse_json_lines
        )
        keyed = op.key_on(
            "k", op.filter("ok", parsed, lambda x: isinstance(x, EventBatch)), lambda b: b.stream
        )
        config = PersonalizedConfig(population=30, epsilon=1.0, window=6)
        out = family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism="PBD", config=config, secret=3,
            registration=Preferences(by_user=table),
        )  # fmt: skip
        ledger: list[Any] = []
        op.output("l", out.ledger, TestingSink(ledger))
        run_main(flow)
        return {(c.scope, c.budget, c.users) for c in ledger[-1].classes}

    assert classes(range(30)) == classes(range(5, 25)) == {(4, 2.0, 10), (6, 1.0, 20)}


def test_the_ready_flow_takes_a_registration_table(tmp_path: Path) -> None:
    table = tmp_path / "prefs.csv"
    table.write_text(
        "user,epsilon,window\nu1,3.0,5\nu2,3.0,5\n"
        + "".join(f"u{u},1.0,6\n" for u in (0, *range(3, 10)))
    )
    events = tmp_path / "events.jsonl"
    events.write_text(
        "\n".join(event(f"u{u}", t, (u * t) % 2) for t in range(1, 9) for u in range(10))
        + "\n"
        + event("u10", 8, 1)  # not registered (slot 8: a slot-3 event after slot 8 is late)
        + "\n"
    )
    out, ledger, dead = tmp_path / "r.jsonl", tmp_path / "l.jsonl", tmp_path / "d.jsonl"
    flow = build(
        dataset=f"file:{events}", mechanisms="PBA", users=10, epsilon=1.0, window=6,
        stream="s", out=str(out), ledger_out=str(ledger), dead_letter_out=str(dead),
        preferences=load_preferences(table), secret="8c1f4e6a92b3d5704ef1a2c9b68d3e57",
    )  # fmt: skip
    run_main(flow)
    last = json.loads(ledger.read_text().splitlines()[-1])
    assert {(c["scope"], c["budget"], c["users"]) for c in last["classes"]} == {
        (5, 3.0, 2),
        (6, 1.0, 8),
    }
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(releases) == 8
    assert not any(r["insecure_seed"] or r["evaluation"] for r in releases)
    # central DP releases carry exact discrete Laplace noise: whole counts
    assert all(float(x).is_integer() for r in releases for x in r["estimate"])
    assert [json.loads(line)["reason"] for line in dead.read_text().splitlines()] == [
        "unregistered_user"
    ]


def test_file_input_needs_a_registration_table(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(event("u1", 1, 1) + "\n")
    with pytest.raises(ValueError, match="registration table"):
        build(dataset=f"file:{events}", mechanisms="PBA", users=10, insecure_seed=1)


def test_preferences_tables_are_validated(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text('{"user": "a", "epsilon": 0.5, "window": 3}\n\n')
    assert load_preferences(good) == {"a": (0.5, 3)}
    for text, problem in [
        ("u,0,3\n", "epsilon > 0"),
        ("u,1.0,0\n", "window >= 1"),
        ("u,1.0\n", "expected user, epsilon, window"),
        ("u,1.0,3\nu,2.0,3\n", "listed twice"),
    ]:
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(ValueError, match=problem):
            load_preferences(bad)


def test_a_user_stricter_than_the_stream_halts_a_uniform_baseline_before_any_release() -> None:
    flow = Dataflow("strict")
    strict = Preferences(epsilons=np.full(N, 0.5), windows=np.full(N, W))
    keyed = op.key_on("k", op.input("in", flow, TestingSource(streams(5))), lambda b: b.stream)
    config = PersonalizedConfig(population=N, epsilon=EPS, window=W)
    out = family_mechanisms(
        "p", keyed, family=PERSONALIZED, mechanism="BD,PBD", config=config, secret=1,
        registration=strict, split=BudgetSplit.parse("equal", 2),
    )  # fmt: skip
    releases: list[Any] = []
    op.output("r", out.releases, TestingSink(releases))
    run_main(flow)
    assert {r.mechanism for r in releases} == {"PBD"}  # BD refused at slot 1, PBD serves them
    assert len(releases) == 2 * 5
    assert {r.guarantee.budget for r in releases} == {EPS / 2}  # PBD runs with its share


def test_class_gauges_are_exported() -> None:
    from prometheus_client import REGISTRY, generate_latest

    flow, _out = flow_over(streams(10), "PBA")
    run_main(flow)
    text = generate_latest(REGISTRY).decode()
    spent = [
        line
        for line in text.splitlines()
        if line.startswith("privstream_class_budget_spent{")
        and 'mechanism="PBA",stream="a"' in line
    ]
    assert {line.split('class="')[1].split('"')[0] for line in spent} == {
        "w8_e1", "w4_e2", "w8_e1.5", "w2_e4",
    }  # fmt: skip
    for line in spent:
        assert 0 < float(line.rsplit(" ", 1)[1]) <= 4.0
    assert (
        'privstream_class_users{class="w2_e4",measure="pure",mechanism="PBA",stream="a"} 100.0'
        in text
    )
