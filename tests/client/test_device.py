"""The device: asks, ledger, store; crash safety; the OS CSPRNG by default; reports carry the
perturbed value only."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from privstream.client import Device, FileStore, Policy, Refusal, Report, SystemRandomness
from privstream.client.store import StoreError
from tests.client.helpers import FakeRequest, SeededRandomness

POLICY = Policy(epsilon=1.0, window=5)
ROOT = Path(__file__).resolve().parents[2]


def _device(path: Path, create: bool = True) -> Device:
    return Device("u1", FileStore(path, create=create), POLICY, SeededRandomness(3))


def test_a_report_carries_the_request_and_the_perturbed_value_only(tmp_path: Path) -> None:
    report = _device(tmp_path / "l.json").answer(FakeRequest(slot=7, round=1, oracle="OUE", d=4), 2)
    assert isinstance(report, Report)
    assert {f.name for f in dataclasses.fields(Report)} == {
        "user_id",
        "stream",
        "slot",
        "round",
        "purpose",
        "oracle",
        "epsilon",
        "payload",
    }
    assert (report.stream, report.slot, report.round, report.epsilon) == ("s", 7, 1, 0.5)
    assert (
        isinstance(report.payload, tuple)
        and len(report.payload) == 4
        and set(report.payload) <= {0, 1}
    )


def test_the_default_randomness_is_the_os_csprng(tmp_path: Path) -> None:
    device = Device("u1", FileStore(tmp_path / "l.json", create=True), POLICY)
    assert isinstance(device.randomness, SystemRandomness)
    assert isinstance(device.randomness._rng, secrets.SystemRandom)
    draws = {device.randomness.bits(64) for _ in range(8)}
    assert len(draws) == 8  # not a constant source (collision chance 2^-58)


def test_a_device_not_asked_or_with_a_failing_rule_does_not_answer_nor_charge(
    tmp_path: Path,
) -> None:
    device = _device(tmp_path / "l.json")

    class Broken(FakeRequest):
        def asks(self, user_id: str) -> bool:
            raise RuntimeError("server bug")

    assert device.answer(FakeRequest(asked=frozenset({"u2"})), 1) == Refusal(
        "not-asked", "the request does not ask this device"
    )
    refusal = device.answer(Broken(), 1)
    assert isinstance(refusal, Refusal) and refusal.reason == "invalid"
    assert device.ledger.streams == {} and not (tmp_path / "l.json").exists()


def test_a_value_outside_the_domain_is_refused_without_naming_it_and_without_charge(
    tmp_path: Path,
) -> None:
    device = _device(tmp_path / "l.json")
    refusal = device.answer(FakeRequest(d=4), 12345)
    assert (
        isinstance(refusal, Refusal)
        and refusal.reason == "invalid"
        and "12345" not in refusal.message
    )
    assert device.ledger.streams == {}


def test_the_ledger_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    assert isinstance(_device(path).answer(FakeRequest(slot=0, epsilon=0.8), 1), Report)
    again = _device(path, create=False)
    refusal = again.answer(FakeRequest(slot=1, epsilon=0.3), 1)
    assert isinstance(refusal, Refusal) and refusal.reason == "exhausted"
    assert isinstance(again.answer(FakeRequest(slot=1, epsilon=0.2), 1), Report)


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: b"{not json",
        lambda raw: raw[: len(raw) // 2],
        lambda raw: raw.replace(b'"0": 0.8', b'"0": 0.0'),  # a reset charge: checksum mismatch
        lambda raw: b"",
    ],
)
def test_a_corrupt_store_refuses_to_report_rather_than_resetting(
    tmp_path: Path, damage: object
) -> None:
    path = tmp_path / "l.json"
    assert isinstance(_device(path).answer(FakeRequest(slot=0, epsilon=0.8), 1), Report)
    raw = path.read_bytes()
    assert b'"0": 0.8' in raw
    path.write_bytes(damage(raw))  # type: ignore[operator]
    device = _device(path, create=True)
    for t in range(0, 20, 5):
        refusal = device.answer(FakeRequest(slot=t, epsilon=0.1), 1)
        assert isinstance(refusal, Refusal) and refusal.reason == "store"
    assert path.read_bytes() == damage(raw)  # type: ignore[operator]  # never overwritten


def test_a_missing_store_refuses_unless_created(tmp_path: Path) -> None:
    refusal = _device(tmp_path / "gone.json", create=False).answer(FakeRequest(), 1)
    assert (
        isinstance(refusal, Refusal) and refusal.reason == "store" and "missing" in refusal.message
    )
    with pytest.raises(StoreError, match="missing"):
        FileStore(tmp_path / "gone.json").load()


def test_a_failed_write_sends_nothing_and_keeps_the_budget_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "l.json"
    device = _device(path)
    assert isinstance(device.answer(FakeRequest(slot=0, epsilon=0.2), 1), Report)
    before = path.read_bytes()

    def fail(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    refusal = device.answer(FakeRequest(slot=1, epsilon=0.2), 1)
    assert isinstance(refusal, Refusal) and refusal.reason == "store"
    assert path.read_bytes() == before  # the old ledger, whole
    assert device.ledger.streams["s"].window_sum(1, 5) == pytest.approx(0.4)  # spent in memory
    monkeypatch.undo()
    assert isinstance(
        device.answer(FakeRequest(slot=2, epsilon=0.1), 1), Refusal
    )  # refuses until restart


CRASH = """
import os, sys
from privstream.client import Device, FileStore, Policy, Report
from tests.client.helpers import FakeRequest
device = Device("u1", FileStore(sys.argv[1], create=True), Policy(epsilon=1.0, window=5))
report = device.answer(FakeRequest(slot=0, epsilon=0.9), 1)
assert isinstance(report, Report)
os._exit(9)  # killed between charge and send: the report never leaves
"""


def test_a_kill_between_charge_and_send_leaves_the_budget_spent(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr
    assert json.loads(path.read_text())["state"]["s"]["charges"] == {"0": 0.9}
    refusal = _device(path, create=False).answer(FakeRequest(slot=1, epsilon=0.2), 1)
    assert isinstance(refusal, Refusal) and refusal.reason == "exhausted"
    assert [p.name for p in tmp_path.iterdir()] == ["l.json"]  # no temp file left behind
