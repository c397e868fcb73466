"""SaO2 over Kafka (embedded broker), as ``privstream run sao2`` runs it.

* A producer that sends only a user's changes (SaO2's devices carry their value forward, spec
  §10.2) gets byte-identical releases to one that sends every value at every slot.
* A run stopped mid-horizon and resumed from its recovery store continues the horizon and the
  lifetime ledger (each user charged ε at the starts of horizons 1 and 2, refused at horizon 3's
  with ``--epsilon 2 --horizons 2``: ε = 1 per horizon, whose releases repeat the last one) and equals an uninterrupted run byte for
  byte; ``privstream audit`` passes the topics, its SaO2 checks included.
* A resume with another ``s`` (``--max-changes``) is refused.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from privstream.connectors.kafka import KafkaSettings

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli, same_incarnation
from .test_dpi_kafka import keyed, ledger
from .test_kafka_flow import produce_lines

USERS, D, T, HORIZONS, STOP = 90, 4, 4, 3, 6
SLOTS = T * HORIZONS
STREAM = "cells"


def cell(u: int, t: int) -> int:
    """User ``u``'s cell at slot ``t``: a move every 5 slots, phased by user (≤ 2 moves, ≤ 4
    changes, per 4-slot horizon)."""
    return (u + (t + u) // 5) % D


def events(slots: range, *, changes_only: bool) -> list[bytes]:
    lines: list[bytes] = []
    for t in slots:
        for u in range(USERS):
            if changes_only and t > 1 and cell(u, t) == cell(u, t - 1):
                continue
            line = {"stream": STREAM, "user": f"u{u}", "slot": t, "value": cell(u, t)}
            lines.append(json.dumps(line).encode())
        lines.append(json.dumps({"stream": STREAM, "end_of_slot": t}).encode())
    return lines


def flags(topics: Topics, kafka: KafkaSettings, secret: Path, slots: int, s: int = 4) -> list[str]:
    return [
        "run", "sao2", "--stream", STREAM, "--users", str(USERS), "--epsilon", "2",
        "--window", str(T), "--binary", str(D), "--max-changes", str(s), "--horizons", "2",
        "--slots", str(slots), "--secret-file", str(secret), "--no-progress",
        *topics.run_flags(kafka),
    ]  # fmt: skip


def audit(kafka: KafkaSettings, topics: Topics, report: Path) -> dict[str, Any]:
    done = subprocess.run(
        [*PRIVSTREAM, "audit", "--bootstrap", kafka.bootstrap, "--release-topic", topics.releases,
         "--ledger-topic", topics.ledger, "--idle-seconds", "1", "--population", str(USERS),
         "--max-epsilon", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def test_sending_only_changes_releases_the_same_bytes(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    sparse, dense = Topics(kafka), Topics(kafka)
    produce_lines(kafka, sparse.events, events(range(1, 2 * T + 1), changes_only=True))
    produce_lines(kafka, dense.events, events(range(1, 2 * T + 1), changes_only=False))
    store = tmp_path / "sparse-rec"  # one incarnation for both runs: the same keyed noise
    run_cli(*flags(sparse, kafka, secret_file, 2 * T), "--recovery-dir", str(store))
    twin = same_incarnation(store, tmp_path / "dense-rec")
    run_cli(*flags(dense, kafka, secret_file, 2 * T), "--recovery-dir", str(twin))
    assert len(events(range(1, 2 * T + 1), changes_only=True)) < 0.5 * len(
        events(range(1, 2 * T + 1), changes_only=False)
    )
    # the release ids embed the stream, not the topic: same keys, same bytes
    assert keyed(kafka, sparse.releases) == keyed(kafka, dense.releases)
    assert len(keyed(kafka, sparse.releases)) == 2 * T


def test_sao2_resumes_mid_horizon_its_lifetime_ledger_and_passes_the_audit(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    resumed, reference = Topics(kafka), Topics(kafka)
    store = tmp_path / "rec"
    produce_lines(kafka, resumed.events, events(range(1, STOP + 1), changes_only=True))
    run_cli(*flags(resumed, kafka, secret_file, STOP), "--recovery-dir", str(store))
    first = ledger(kafka, resumed.ledger)
    assert [e["slot"] for e in first] == list(range(1, STOP + 1))
    produce_lines(kafka, resumed.events, events(range(STOP + 1, SLOTS + 1), changes_only=True))
    run_cli(*flags(resumed, kafka, secret_file, SLOTS), "--recovery-dir", str(store))

    entries = ledger(kafka, resumed.ledger)
    assert entries[:STOP] == first
    charged = [e["classes"][0]["charged"] for e in entries]
    assert charged == [1.0, 0, 0, 0, 1.0, 0, 0, 0, 0, 0, 0, 0]
    assert [e["classes"][0]["spent"] for e in entries] == [1.0] * T + [2.0] * (SLOTS - T)
    third = entries[2 * T]["details"]
    assert (third["enrolled"], third["refused"], third["n_h"]) == (0, USERS, [0, 0, 0])
    releases = {
        json.loads(v)["slot"]: json.loads(v) for v in keyed(kafka, resumed.releases).values()
    }
    assert [releases[t]["strategy"] for t in range(1, SLOTS + 1)] == (
        ["publish"] * 2 * T + ["approximate"] * T
    )
    assert releases[SLOTS]["estimate"] == releases[2 * T]["estimate"]  # nothing new is learnt
    assert all(r["details"]["horizon"] == (t - 1) // T for t, r in releases.items())

    produce_lines(kafka, reference.events, events(range(1, SLOTS + 1), changes_only=True))
    ref_store = same_incarnation(store, tmp_path / "ref-rec")
    run_cli(*flags(reference, kafka, secret_file, SLOTS), "--recovery-dir", str(ref_store))
    assert keyed(kafka, reference.releases) == keyed(kafka, resumed.releases)

    report = audit(kafka, resumed, tmp_path / "audit.json")
    assert report["counts"]["declared_mismatches"] == 0
    assert report["counts"]["windows_over_budget"] == 0


def test_a_resume_with_another_change_bound_is_refused(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    produce_lines(kafka, topics.events, events(range(1, 3), changes_only=True))
    rec = ["--recovery-dir", str(tmp_path / "rec")]
    run_cli(*flags(topics, kafka, secret_file, 1), *rec)
    changed = [*flags(topics, kafka, secret_file, 2, s=3), *rec]
    done = subprocess.run([*PRIVSTREAM, *changed], capture_output=True, text=True, timeout=120,
                          env=cli_env())  # fmt: skip
    assert done.returncode != 0
    assert "s=3" in done.stderr and "new recovery directory" in done.stderr, done.stderr[-2000:]
