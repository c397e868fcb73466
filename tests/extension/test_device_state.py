"""The worked example's axis "per-user device state": ``example-device-state`` (a module in
``site/``, registered by entry point) is memoized randomized response: each device draws a
permanent randomized bit per value once and reports it through a fresh instantaneous flip each
slot. The memo is the client state (``Mechanism.client_state``), held by the stream, handed to
the client port only. It runs through ``privstream run`` (in process and in a subprocess), a
flow file's check, the bench harness and the conformance checks, and nothing in privstream
names it.

Tolerances: a report is 1 with probability ``a = qp + (1−q)(1−p)`` when the value is 1 (``1−a``
when 0), ``p, q`` the permanent and instantaneous keep probabilities; the de-biased fraction
over ``n`` reports has variance ``a(1−a)/(n(2a−1)²)`` over the memo's and the slot's draws.
"""

from __future__ import annotations

import importlib
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.cli import main
from privstream.families import registry
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import Slot, outputs
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension import surfaces

USERS, SLOTS, EPS, WINDOW, PERMANENT = 4000, 12, 5.0, 5, 2.0
ARGV = ["run", "example-device-state", "--users", str(USERS), "--slots", str(SLOTS),
        "--insecure-seed", "7", "--dataset", "sin", "--no-progress"]  # fmt: skip


def _site() -> Any:
    return importlib.import_module("example_device_state")


def _sd(n: int = USERS) -> float:
    return math.sqrt(_site().variance(PERMANENT, EPS / WINDOW, n))


def _check_releases(path: Path) -> None:
    releases = surfaces.lines(path)
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    assert {r["mechanism"] for r in releases} == {"MRR"}
    for release, truth in zip(releases, surfaces.sin_truth(USERS, SLOTS), strict=True):
        assert release["details"]["reports"] == USERS
        assert abs(release["estimate"][1] - truth) <= 4 * _sd(), (release["slot"], truth)


def _mechanism() -> Any:
    family = registry.family("example-device-state")
    config = family.make_config(epsilon=EPS, window=WINDOW, population=USERS,
                                task=FrequencyTask(2), permanent_epsilon=PERMANENT)  # fmt: skip
    return family.build("MRR", config)


def _values(t: int) -> NDArray[np.int64]:
    """Users flip their bit now and then, so the memo of both values fills over the slots."""
    rng = np.random.default_rng([5, t])
    return (rng.random(USERS) < 0.3 + 0.2 * math.sin(t / 2)).astype(np.int64)


def _slot(t: int, clients: Any, port: Any = None) -> tuple[Slot, SimulatedClientPort]:
    randomness = SlotRandomness(3, "s", t, scope="test")
    inner = SimulatedClientPort(_values(t), FrequencyTask(2), randomness, "per-user", clients)
    return Slot("s", t, port(inner) if port else inner, randomness), inner


def _drive(slots: int) -> tuple[Any, list[Any], list[NDArray[np.int8]]]:
    """Step MRR as the operator does: the devices' state moves on with every release."""
    mech = _mechanism()
    state, clients, events, memos = mech.initial_state(), mech.client_state(), [], []
    for t in range(1, slots + 1):
        slot, port = _slot(t, clients)
        state, out = mech.step(state, slot)
        clients = port.client_state_after
        events += outputs(out)
        memos.append(clients.permanent.copy())
    return state, events, memos


def test_the_family_keeps_a_memo_per_user_on_the_devices(external_site: dict[str, str]) -> None:
    mech = _mechanism()
    memo = mech.client_state()
    assert memo.permanent.shape == (USERS, 2) and bool((memo.permanent == -1).all())
    assert registry.family("example-device-state").local
    assert "drawn=0" in repr(memo)  # a memo prints no user's bit


def test_a_users_permanent_bits_stay_across_slots(external_site: dict[str, str]) -> None:
    _, events, memos = _drive(SLOTS)
    first = memos[0]
    drawn = first != -1
    assert drawn.sum() == USERS  # every user held a value at slot 1: one bit each
    for later in memos[1:]:
        assert np.array_equal(later[drawn], first[drawn])  # never redrawn
    last = memos[-1]
    both = int((last != -1).all(axis=1).sum())
    assert both > USERS // 4  # users who changed value got a second memoized bit
    # The memo is randomized response at ε∞: it keeps the value with p = e^ε∞/(1+e^ε∞).
    p = math.exp(PERMANENT) / (1 + math.exp(PERMANENT))
    kept = float(np.mean(first[np.arange(USERS), _values(1)] == _values(1)))
    assert abs(kept - p) <= 4 * math.sqrt(p * (1 - p) / USERS)
    # ... and each estimate is within 4 standard deviations of the variance formula.
    for t, release in enumerate([e for e in events if hasattr(e, "estimate")], start=1):
        assert abs(release.estimate[1] - float(_values(t).mean())) <= 4 * _sd(), t


class Guarded:
    """A client port that answers only ``population``, ``eligible`` and ``respond`` (the
    device protocol runs behind it) and records what crossed it; any other attribute is
    refused and recorded in ``read``."""

    def __init__(self, inner: SimulatedClientPort) -> None:
        self._inner = inner
        self.responses: list[NDArray[np.float64]] = []
        self.read: list[str] = []

    @property
    def population(self) -> int:
        return self._inner.population

    def eligible(self) -> NDArray[np.bool_]:
        return self._inner.eligible()

    def respond(self, protocol: Any, asked: NDArray[np.bool_], purpose: str) -> Any:
        reports = self._inner.respond(protocol, asked, purpose)
        self.responses.append(reports)
        return reports

    def __getattr__(self, name: str) -> Any:
        self.read.append(name)
        raise AttributeError(name)


def test_the_server_never_reads_a_raw_value_or_the_memo(external_site: dict[str, str]) -> None:
    mech = _mechanism()
    guards: list[Guarded] = []

    def guard(inner: SimulatedClientPort) -> Guarded:
        guards.append(Guarded(inner))
        return guards[-1]

    state, clients = mech.initial_state(), mech.client_state()
    for t in (1, 2, 3):
        slot, inner = _slot(t, clients, port=guard)
        state, _ = mech.step(state, slot)
        clients = inner.client_state_after
    for g in guards:
        assert set(g.read) <= {"class_histogram"}  # only ``Slot``'s probe of the port's kind
        (reports,) = g.responses
        assert set(np.unique(reports)) <= {0.0, 1.0} and reports.shape == (USERS, 1)
    # The server's state holds no per-user array (no value, report or memo entry).
    inside = _walk(state)
    assert all(a.size < USERS for a in inside if isinstance(a, np.ndarray))
    assert not any(isinstance(x, _site().Memo) for x in inside)
    assert pickle.loads(pickle.dumps(state)) is not None


def _walk(obj: Any) -> list[Any]:
    if hasattr(obj, "__dict__"):
        return [x for v in vars(obj).values() for x in [v, *_walk(v)]]
    return []


def test_privstream_run_in_process(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "mrr.jsonl"
    assert main([*ARGV, "--out", str(out)]) == 0
    _check_releases(out)


def test_privstream_run_in_a_subprocess(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "mrr.jsonl"
    surfaces.run_subprocess(external_site, [*ARGV, "--out", str(out)])
    _check_releases(out)


def _flow(path: Path, permanent_epsilon: float) -> Path:
    stream = {"name": "memo", "family": "example-device-state", "mechanisms": ["MRR"],
              "domain": 2, "permanent_epsilon": permanent_epsilon, "share": 1.0}  # fmt: skip
    population = {"users": 1000, "epsilon": 5.0, "window": 5}
    return surfaces.flow_file(path, population=population, streams=[stream])


def test_a_flow_file_with_the_family_checks(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _flow(tmp_path / "good.toml", 1.5), _flow(tmp_path / "bad.toml", 0)
    surfaces.assert_flow_check(capsys, good, ["example-device-state"], bad, "permanent_epsilon")


def test_the_bench_harness_moves_the_memo_on(external_site: dict[str, str], tmp_path: Path) -> None:
    results = surfaces.bench(tmp_path, "example-device-state", "--users", str(USERS), "--slots",
                    str(SLOTS), "--seeds", "2")  # fmt: skip
    (mae,) = {r["mae"] for r in results.values()}
    # mean |N(0, σ²)| = σ√(2/π); the memo's error is shared by a run's slots, so 2 seeds
    # give few independent draws: a loose band around it.
    assert 0.2 * _sd() * math.sqrt(2 / math.pi) < mae < 3 * _sd()


def test_the_conformance_checks_pass(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-device-state", ["MRR"])
    assert {"pickle_restore", "purity_and_replay", "recovery_round_trip", "two_workers"} <= set(ran)
