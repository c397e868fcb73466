"""One stream spread over a 3-partition topic: a run SIGKILLed mid-way and restarted from its
recovery store releases byte-identically to an undisturbed run, although the partitions' polls
interleave differently in every run (per-partition watermarks, ``operators.watermark``).

LBU asks every user, so its releases depend on the slots' contents only. Mechanisms that sample
named users by their dense index also depend on the order users register in, which still
follows the interleaving (see the xfail in ``tests/flows/test_partitioned_flow.py``)."""

from __future__ import annotations

import secrets
import signal
import subprocess
import uuid
from collections import defaultdict
from pathlib import Path

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
    existing_topics,
    wait_for_messages,
)

from .conftest import PRIVSTREAM, cli_env, read_all, run_cli, same_incarnation

PARTITIONS, USERS, SLOTS, MECHANISM = 3, 3000, 150, "LBU"


def fresh_topics(kafka: KafkaSettings) -> tuple[str, str, str]:
    """A 3-partition event topic and two release topics (crashed run, reference run)."""
    tag = uuid.uuid4().hex[:8]
    events, crashed, reference = f"events3-{tag}", f"crashed-{tag}", f"reference-{tag}"
    create_topics(
        kafka,
        [TopicSpec(events, partitions=PARTITIONS)]
        + [TopicSpec(t, config=RELEASE_TOPIC_CONFIG) for t in (crashed, reference)],
    )
    return events, crashed, reference


def run_flags(kafka: KafkaSettings, events: str, releases: str, secret: Path) -> list[str]:
    return [
        "run", "ldp-ids", "--mechanism", MECHANISM, "--users", str(USERS), "--epsilon", "1.0",
        "--window", "5", "--slots", str(SLOTS), "--no-progress", "--secret-file", str(secret),
        "--bootstrap", kafka.bootstrap, "--input-topic", events, "--output-topic", releases,
        "--clock", "data", "--trust-input-clock",  # this test writes the topic itself
    ]  # fmt: skip


def releases_by_id(kafka: KafkaSettings, topic: str) -> dict[str, list[bytes]]:
    """Every release of ``topic`` by release id (waits until every slot is there)."""
    expected = {f"sin/{MECHANISM}/{t}" for t in range(1, SLOTS + 1)}
    messages = wait_for_messages(
        kafka, topic, lambda got: {m.key().decode() for m in got} >= expected, timeout=120
    )
    out: dict[str, list[bytes]] = defaultdict(list)
    for m in messages:
        out[m.key().decode()].append(m.value())
    assert set(out) == expected
    return out


def test_a_spread_stream_survives_sigkill_with_identical_releases(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    events, crashed, reference = fresh_topics(kafka)
    assert existing_topics(kafka)[events] == PARTITIONS
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", events, "--users", str(USERS),
            "--slots", str(SLOTS), "--spread", "--no-progress")  # fmt: skip
    per_partition = spread_counts(kafka, events)
    assert per_partition == {p: (USERS // PARTITIONS + 1) * SLOTS for p in range(PARTITIONS)}
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))

    flags, log = run_flags(kafka, events, crashed, secret), tmp_path / "run.log"
    proc = start_run(flags, tmp_path / "rec", log)
    got = wait_for_messages(kafka, crashed, lambda got: len(got) >= SLOTS // 10, timeout=60)
    assert proc.poll() is None, "the flow finished before it could be interrupted"
    proc.kill()  # SIGKILL: no snapshot, no flush
    assert proc.wait(timeout=30) == -signal.SIGKILL and len(got) < SLOTS
    again = start_run(flags, tmp_path / "rec", log)
    assert again.wait(timeout=120) == 0, log.read_text()[-3000:]
    store = same_incarnation(tmp_path / "rec", tmp_path / "ref-rec")  # the same noise
    run_cli(*run_flags(kafka, events, reference, secret), "--recovery-dir", str(store))

    recovered, undisturbed = releases_by_id(kafka, crashed), releases_by_id(kafka, reference)
    for rid, payloads in recovered.items():
        assert len(set(payloads)) == 1, f"{rid} released twice with different payloads"
    assert {rid: p[0] for rid, p in recovered.items()} == {
        rid: p[0] for rid, p in undisturbed.items()
    }


def start_run(flags: list[str], recovery: Path, log: Path) -> subprocess.Popen[bytes]:
    """The flow as its own process, its output in ``log`` (a pipe nobody reads could fill up
    and stall it)."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [*PRIVSTREAM, *flags, "--recovery-dir", str(recovery), "--snapshot-interval", "0.2"],
            stdout=sink, stderr=subprocess.STDOUT, env=cli_env(),
        )  # fmt: skip


def spread_counts(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    """Messages per partition (events and markers)."""
    counts: dict[int, int] = defaultdict(int)
    for m in read_all(kafka, topic):
        counts[m.partition()] += 1
    return dict(counts)
