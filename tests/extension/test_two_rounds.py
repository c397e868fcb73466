"""The worked example's axis "a mechanism with two rounds per slot": ``example-rounds`` (a
module in ``site/``, registered by entry point) asks a probe sample every slot and, when the
probe saw a change, a second disjoint sample in the same slot, through the round contract
(``Rounds``: ``plan``/``absorb``). Driven round by round with its state pickled between rounds
it equals the one-shot step; it runs through ``privstream run`` (in process and in a
subprocess), a flow file's check, the bench harness and the conformance checks, and nothing
in privstream names it.

Tolerances: a published estimate is the refine sample's ``k₂ = ⌊n/w⌋ − ⌊n/(2w)⌋`` ε-LDP
reports, variance ``V(ε, k₂)`` (``FrequencyTask(2).variance``); the ``steps`` dataset holds its
truth between its steps, so a repeated release keeps its publication's error. A steady slot
refines when the probe moves more than 3 standard deviations of its difference from the last
release (a false alarm has probability ≈ 0.27 %).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privstream.cli import main
from privstream.families import registry
from privstream.mechanisms.client import ClientPath, SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Release, Rounds, Slot, outputs
from privstream.mechanisms.rounds import Finished, Requests, answer
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension import surfaces
from tests.mechanisms.round_driving import Recording, by_rounds, one_shot

USERS, SLOTS, EPS, WINDOW = 20000, 24, 1.0, 5
PER_SLOT = USERS // WINDOW  # k₁ + k₂
K1, K2 = PER_SLOT // 2, PER_SLOT - PER_SLOT // 2
SD = math.sqrt(FrequencyTask(2).variance(EPS, K2))
CHANGES = [1, 7, 13, 19]  # the first slot, and every step of ``steps`` (period 6)
ARGV = ["run", "example-rounds", "--users", str(USERS), "--slots", str(SLOTS), "--epsilon",
        str(EPS), "--window", str(WINDOW), "--insecure-seed", "7", "--dataset", "steps",
        "--no-progress"]  # fmt: skip


def _site() -> Any:
    return importlib.import_module("example_rounds")


def _data() -> Any:
    return _site().Steps(USERS, SLOTS, 1, None)


def _mechanism() -> Any:
    family = registry.family("example-rounds")
    config = family.make_config(epsilon=EPS, window=WINDOW, population=USERS,
                                task=FrequencyTask(2))  # fmt: skip
    return family.build("PRB", config)


def _slot(t: int, path: ClientPath = "aggregate", port: Any = None) -> Slot:
    randomness = SlotRandomness(11, "s", t, scope="test")
    port = port or SimulatedClientPort(_data().values(t), FrequencyTask(2), randomness, path)
    return Slot("s", t, port, randomness)


@pytest.mark.parametrize("path", ["aggregate", "per-user"])
def test_round_by_round_with_pickled_state_equals_one_shot(
    external_site: dict[str, str], path: ClientPath
) -> None:
    mech = _mechanism()
    assert isinstance(mech, Rounds)
    expected = one_shot(mech, lambda t: _slot(t, path), SLOTS)
    got, rounds = by_rounds(mech, lambda t: _slot(t, path), SLOTS)
    assert got == expected and len(got) == 2 * SLOTS
    # Two rounds exactly at the first slot and at each step of the data; one otherwise.
    assert [t for t, r in enumerate(rounds, start=1) if r == 2] == CHANGES
    assert set(rounds) == {1, 2}


def test_the_second_round_asks_a_disjoint_sample_after_a_change(
    external_site: dict[str, str],
) -> None:
    mech = _mechanism()
    state = mech.initial_state()
    port = Recording(_slot(1).port)  # type: ignore[arg-type]
    slot = _slot(1, port=port)
    first = mech.plan(state, slot)
    assert isinstance(first, Requests) and first.round == 1
    mech.absorb(state, slot, answer(slot.client, first))
    second = mech.plan(state, slot)
    assert isinstance(second, Requests) and second.round == 2
    mech.absorb(state, slot, answer(slot.client, second))
    done = mech.plan(state, slot)
    assert isinstance(done, Finished)
    probe, refine = port.asked["probe"], port.asked["refine"]
    assert probe is not None and refine is not None
    assert probe.size == K1 and refine.size == K2
    assert np.intersect1d(probe, refine).size == 0  # disjoint samples
    with pytest.raises(ValueError, match="no round in flight"):
        mech.absorb(state, slot, {})


def test_the_ledger_entry_accounts_for_both_rounds_and_the_estimates_hold(
    external_site: dict[str, str],
) -> None:
    mech, data = _mechanism(), _data()
    state, events = mech.initial_state(), []
    for t in range(1, SLOTS + 1):
        state, out = mech.step(state, _slot(t))
        events += outputs(out)
    releases = [e for e in events if isinstance(e, Release)]
    entries = [e for e in events if isinstance(e, LedgerEntry)]
    k1, k2 = K1, K2
    for t, (release, entry) in enumerate(zip(releases, entries, strict=True), start=1):
        two = t in CHANGES
        d: Any = entry.details
        assert (d.rounds, d.probe_users, d.refine_users) == ((2, k1, k2) if two else (1, k1, 0))
        assert (d.epsilon_probe, d.epsilon_refine) == (EPS, EPS if two else 0.0)
        # both rounds' users, charged once each in the window ending here
        assert d.window_users == _used(t - WINDOW + 1, t)
        assert d.available_users == USERS - _used(t - WINDOW + 2, t)
        (spend,) = entry.classes
        assert (spend.charged, spend.spent, spend.budget) == (EPS, EPS, EPS)
        assert release.strategy == ("publish" if two else "approximate")
        assert getattr(release.details, "rounds", None) == d.rounds
        source = release.source_slot
        assert source == max(s for s in CHANGES if s <= t)
        assert abs(release.estimate[1] - float(data.truth(t)[1])) <= 4 * SD, t


def _used(lo: int, hi: int) -> int:
    """Users the ledger charged at slots ``lo..hi``: k₁ every slot, k₂ at every change."""
    slots = range(max(lo, 1), hi + 1)
    return sum(K1 + (K2 if s in CHANGES else 0) for s in slots)


def _check_releases(path: Path) -> None:
    releases = surfaces.lines(path)
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    data = _data()
    for r in releases:
        assert r["mechanism"] == "PRB" and r["details"]["rounds"] in (1, 2)
        assert abs(r["estimate"][1] - float(data.truth(r["slot"])[1])) <= 4 * SD, r["slot"]
    assert [r["slot"] for r in releases if r["details"]["rounds"] == 2] == CHANGES


def test_privstream_run_in_process(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "prb.jsonl"
    assert main([*ARGV, "--out", str(out)]) == 0
    _check_releases(out)


def test_privstream_run_in_a_subprocess(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "prb.jsonl"
    surfaces.run_subprocess(external_site, [*ARGV, "--out", str(out)])
    _check_releases(out)


def _flow(path: Path, users: int) -> Path:
    stream = {"name": "probe", "family": "example-rounds", "mechanisms": ["PRB"], "domain": 2,
              "z": 2.5, "share": 1.0}  # fmt: skip
    population = {"users": users, "epsilon": 1.0, "window": 5}
    return surfaces.flow_file(path, population=population, streams=[stream])


def test_a_flow_file_with_the_family_checks(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _flow(tmp_path / "good.toml", 1000), _flow(tmp_path / "bad.toml", 6)
    surfaces.assert_flow_check(capsys, good, ["example-rounds"], bad, "refine users")


def test_the_bench_harness_runs_both_rounds(external_site: dict[str, str], tmp_path: Path) -> None:
    results = surfaces.bench(tmp_path, "example-rounds", "--users", str(USERS), "--slots", str(SLOTS),
                    "--window", str(WINDOW), "--seeds", "2")  # fmt: skip
    result = results["PRB"]
    # a publication per change; at most one false alarm in the 2 × 20 steady slots
    assert len(CHANGES) <= result["refined"] <= len(CHANGES) + 0.5
    # mean |N(0, σ²)| = σ√(2/π) ≈ 0.8σ over 2 seeds × 4 publications: a band around it.
    assert 0.3 * SD < result["mae"] < 2 * SD


def test_the_conformance_checks_pass(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-rounds", ["PRB"])
    assert {"declared_cost", "pickle_restore", "recovery_round_trip", "two_workers"} <= set(ran)
