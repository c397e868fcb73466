"""Issue 18 §2 and §4, issue 27 item 3: a second computation of a release id, and a store
resumed for another flow.

Reproduced (as it was): noise depended only on (secret, stream, slot, purpose), so the
documented remedy for a halted stream — a new recovery directory over the same input — re-
published every release id with identical noise; with one user removed from the registration
table, old − new was exactly that user's value at every slot (Uniform: 40 of 40 slots). A
store also resumed silently under a doubled population ε with halved shares and an added
stream, and under a renamed stream (composed spend 3.0 against the population's 2.0).

Fixed (``privstream.runtime.incarnation``): every store has its own random nonce, mixed into every
noise derivation; a store is bound to the population's ε, the shares, the set of streams and
the registration table, and refuses a change by name unless it is explicit (``retired``).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privstream.cli.commands import main
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import NoiseKey
from privstream.runtime.incarnation import FILE, Manifest, begin, read

USERS, SLOTS, D = 60, 40, 4
VICTIM = "u7"


@pytest.fixture(autouse=True)
def _no_ambient_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)


def _inputs(tmp_path: Path) -> tuple[Path, Path, Path, dict[int, int]]:
    """Events of USERS users over SLOTS slots, the table with everybody, the table without
    the victim, and the victim's value per slot."""
    rng = np.random.default_rng(18)
    values = rng.integers(0, D, size=(SLOTS, USERS))
    lines = [
        json.dumps({"stream": "s", "user": f"u{u}", "slot": t + 1, "value": int(values[t, u])})
        for t in range(SLOTS)
        for u in range(USERS)
    ]
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    full, without = tmp_path / "full.csv", tmp_path / "without.csv"
    rows = [f"u{u},1.0,10\n" for u in range(USERS)]
    full.write_text("user,epsilon,window\n" + "".join(rows))
    without.write_text(
        "user,epsilon,window\n" + "".join(r for r in rows if r[: len(VICTIM) + 1] != VICTIM + ",")
    )
    victim = {t + 1: int(values[t, int(VICTIM[1:])]) for t in range(SLOTS)}
    return events, full, without, victim


def _run(
    tmp_path: Path, name: str, events: Path, table: Path, key: Path, store: Path
) -> dict[int, list[float]]:
    out = tmp_path / f"{name}.jsonl"
    argv = ["run", "personalized", "--mechanism", "Uniform", "--dataset", f"file:{events}",
            "--stream", "s", "--domain", str(D), "--users", str(USERS), "--epsilon", "1",
            "--window", "10", "--preferences", str(table), "--out", str(out),
            "--recovery-dir", str(store), "--secret-file", str(key), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["slot"]: r["estimate"] for r in releases}


def _exact_slots(
    old: dict[int, list[float]], new: dict[int, list[float]], victim: dict[int, int]
) -> int:
    """How many slots old − new is exactly the victim's one-hot value."""
    exact = 0
    for t, value in victim.items():
        diff = np.subtract(old[t], new[t])
        exact += bool(np.array_equal(diff, np.eye(D)[value]))
    return exact


def _attack(tmp_path: Path) -> tuple[int, float]:
    events, full, without, victim = _inputs(tmp_path)
    key = tmp_path / "noise.key"
    key.write_text(secrets.token_hex(32))
    old = _run(tmp_path, "old", events, full, key, tmp_path / "store-a")
    new = _run(tmp_path, "new", events, without, key, tmp_path / "store-b")  # the documented remedy
    assert old.keys() == new.keys() == victim.keys()
    diffs = np.array([np.subtract(old[t], new[t]) for t in sorted(victim)])
    truth = np.array([np.eye(D)[victim[t]] for t in sorted(victim)])
    correlation = float(np.corrcoef(diffs.ravel(), truth.ravel())[0, 1])
    return _exact_slots(old, new, victim), correlation


def test_a_new_store_without_incarnations_published_the_withdrawn_users_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack as it was: without an incarnation both stores draw the same noise."""
    monkeypatch.setattr(NoiseKey, "with_incarnation", lambda self, nonce: self)
    exact, correlation = _attack(tmp_path)
    assert exact == SLOTS  # 40 of 40 slots: the user's whole value history
    assert correlation == pytest.approx(1.0)


def test_a_new_store_draws_fresh_noise(tmp_path: Path) -> None:
    """Each store its own nonce: old − new is the user's value plus the difference of two
    independent discrete Laplace draws (scale w/ε = 10 per count), never exact."""
    exact, correlation = _attack(tmp_path)
    assert exact == 0
    # one-hot signal of 1 against noise of standard deviation ≈ 10·√2·√2 = 20 per coordinate:
    # the correlation of 160 coordinates is about 0.04 ± 0.08; far from 1
    assert abs(correlation) < 0.4
    nonces = {read(tmp_path / s).nonce for s in ("store-a", "store-b")}  # type: ignore[union-attr]
    assert len(nonces) == 2


def test_a_resume_replays_its_own_incarnation(tmp_path: Path) -> None:
    """The same store resumed gives the same nonce; a store with snapshots but no nonce file is
    refused; a run without a store gets a fresh incarnation each time."""
    key = NoiseKey.from_text(secrets.token_hex(32))
    manifest = Manifest(1.0, 10, {"s": 1.0})
    first = begin(key, tmp_path / "store", manifest)
    again = begin(key, tmp_path / "store", manifest)
    assert first.key.incarnation == again.key.incarnation and len(first.key.incarnation) == 16
    assert first.id == again.id and first.id != first.key.incarnation.hex()  # public id: a digest
    assert begin(key, None, manifest).id != begin(key, None, manifest).id
    insecure = begin(NoiseKey.insecure_seed(3), None, manifest)
    assert insecure.id == "public" and insecure.key.incarnation == b""  # reproducible


def test_a_store_with_snapshots_but_no_nonce_is_refused(tmp_path: Path) -> None:
    events, full, _without, _victim = _inputs(tmp_path)
    key = tmp_path / "noise.key"
    key.write_text(secrets.token_hex(32))
    store = tmp_path / "store"
    _run(tmp_path, "first", events, full, key, store)
    (store / FILE).unlink()
    with pytest.raises(IncompatibleState, match="holds snapshots but no incarnation"):
        begin(NoiseKey.from_text(key.read_text()), store, Manifest(1.0, 10, {"s": 1.0}))


def test_a_withdrawal_from_the_registration_table_is_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 18 §4: a withdrawn user was still counted on resume; the store now records the
    withdrawal (a keyed digest, never the id; its effect: tests/attacks/test_withdrawal.py)
    and the log counts it."""
    events, full, without, _victim = _inputs(tmp_path)
    key = tmp_path / "noise.key"
    key.write_text(secrets.token_hex(32))
    store = tmp_path / "store"
    _run(tmp_path, "first", events, full, key, store)
    caplog.clear()
    _run(tmp_path, "first", events, without, key, store)
    err = caplog.text
    assert "1 user(s) withdrawn from the registration table" in err
    assert VICTIM not in err  # never names a user
    stored = read(store)
    assert stored is not None and len(stored.manifest.withdrawn) == 1


def test_a_secure_output_is_not_overwritten_by_a_new_incarnation(
    tmp_path: Path, capsys: Any
) -> None:
    events, full, _without, _victim = _inputs(tmp_path)
    key = tmp_path / "noise.key"
    key.write_text(secrets.token_hex(32))
    _run(tmp_path, "same", events, full, key, tmp_path / "store-a")
    argv = ["run", "personalized", "--mechanism", "Uniform", "--dataset", f"file:{events}",
            "--stream", "s", "--domain", str(D), "--users", str(USERS), "--epsilon", "1",
            "--window", "10", "--preferences", str(full), "--out", str(tmp_path / "same.jsonl"),
            "--recovery-dir", str(tmp_path / "store-b"), "--secret-file", str(key),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "already holds releases of an earlier run" in capsys.readouterr().err
    assert main([*argv, "--overwrite-output"]) == 0
