"""DPI over Kafka (embedded broker): releases keyed ``stream/DPI/slot/query``; a run stopped and
resumed from its recovery store continues its series ledger (the nominal spend goes on, no index
twice) and equals an uninterrupted run of the same incarnation byte for byte; a resume with
another ε or series parameter is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from privstream.connectors.kafka import KafkaSettings

from .conftest import PRIVSTREAM, Topics, cli_env, read_all, run_cli, same_incarnation
from .test_kafka_flow import produce_lines

USERS, K, FIRST, SLOTS = 60, 10, 3, 5
STREAM = "pages"


def events(slots: range) -> list[bytes]:
    """Every user at every slot, category ``(u·t + u) mod K``; a marker after each slot."""
    lines: list[bytes] = []
    for t in slots:
        lines += [json.dumps({"stream": STREAM, "user": f"u{u}", "slot": t,
                              "value": (u * t + u) % K}).encode() for u in range(USERS)]  # fmt: skip
        lines.append(json.dumps({"stream": STREAM, "end_of_slot": t}).encode())
    return lines


def registrations(path: Path) -> Path:
    path.write_text("user,epsilon,window\n" + "".join(f"u{u},2.0,1\n" for u in range(USERS)))
    return path


def flags(topics: Topics, kafka: KafkaSettings, tmp: Path, secret: Path, slots: int) -> list[str]:
    return [
        "run", "dpi", "--stream", STREAM, "--users", str(USERS), "--epsilon", "2",
        "--domain", str(K), "--pool-size", "300", "--synopses", "5", "--slots", str(slots),
        "--registrations", str(registrations(tmp / "reg.csv")), "--secret-file", str(secret),
        "--no-progress", *topics.run_flags(kafka),
    ]  # fmt: skip


def keyed(kafka: KafkaSettings, topic: str) -> dict[str, bytes]:
    """Every message of ``topic`` by its Kafka key; copies of one key are byte-identical."""
    out: dict[str, bytes] = {}
    for m in read_all(kafka, topic, settle=0.5):
        key = m.key().decode()
        assert out.setdefault(key, m.value()) == m.value(), f"{key} published twice, differently"
    return out


def ledger(kafka: KafkaSettings, topic: str) -> list[dict[str, Any]]:
    entries = {json.loads(v)["slot"]: json.loads(v) for v in keyed(kafka, topic).values()}
    return [entries[t] for t in sorted(entries)]


def test_dpi_resumes_its_series_and_replays_byte_identical(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    resumed, reference = Topics(kafka), Topics(kafka)
    store = tmp_path / "rec"
    produce_lines(kafka, resumed.events, events(range(1, FIRST + 1)))
    run_cli(*flags(resumed, kafka, tmp_path, secret_file, FIRST), "--recovery-dir", str(store))
    first = ledger(kafka, resumed.ledger)
    assert [e["slot"] for e in first] == list(range(1, FIRST + 1))
    produce_lines(kafka, resumed.events, events(range(FIRST + 1, SLOTS + 1)))
    run_cli(*flags(resumed, kafka, tmp_path, secret_file, SLOTS), "--recovery-dir", str(store))

    releases = keyed(kafka, resumed.releases)
    assert sorted(releases) == sorted(
        f"{STREAM}/DPI/{t}/{json.loads(v)['key']['query']}" for v in releases.values()
        for t in [json.loads(v)["slot"]]
    )  # fmt: skip
    assert sorted(json.loads(v)["slot"] for v in releases.values()) == list(range(1, SLOTS + 1))
    entries = ledger(kafka, resumed.ledger)
    assert entries[:FIRST] == first  # the stored entries are not rewritten
    indices = [e["details"]["series_index"] for e in entries]
    assert len(set(indices)) == SLOTS and 0 not in indices  # each element once, across runs
    spent = 0.0
    for e in entries:  # the nominal spend continues from where the first run left it
        spent += e["details"]["nominal_charge"]
        assert e["details"]["nominal_spent"] == e["classes"][0]["spent"]
        assert abs(e["details"]["nominal_spent"] - spent) <= 1e-12 * spent
    assert 0 < spent < 2.0

    # an uninterrupted run of the same incarnation releases the same bytes
    produce_lines(kafka, reference.events, events(range(1, SLOTS + 1)))
    ref_store = same_incarnation(store, tmp_path / "ref-rec")
    run_cli(
        *flags(reference, kafka, tmp_path, secret_file, SLOTS), "--recovery-dir", str(ref_store)
    )
    assert keyed(kafka, reference.releases) == releases


def test_a_resume_with_another_epsilon_or_series_is_refused(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    produce_lines(kafka, topics.events, events(range(1, 3)))
    rec = ["--recovery-dir", str(tmp_path / "rec")]
    run_cli(*flags(topics, kafka, tmp_path, secret_file, 1), *rec)
    same = flags(topics, kafka, tmp_path, secret_file, 2)
    for changed, why in [
        ([*same, "--epsilon", "3"], "the population's epsilon changed from 2 to 3"),
        ([*same, "--mu", "0.2"], "mu=0.2"),
        ([*same, "--zeta", "0.2"], "zeta=0.2"),
    ]:
        done = subprocess.run([*PRIVSTREAM, *changed, *rec], capture_output=True, text=True,
                              timeout=120, env=cli_env())  # fmt: skip
        assert done.returncode != 0
        assert why in done.stderr and "new recovery directory" in done.stderr, done.stderr[-2000:]
    assert "slot 2 released" in run_cli(*same, *rec).stderr
