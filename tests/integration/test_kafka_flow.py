"""The LDP-IDS flow against a real Kafka-protocol broker (design §10 item 6): end to end, topics,
bad input, SIGTERM and SIGKILL with recovery, step-id stability."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from privstream.connectors.broker import free_port
from privstream.connectors.kafka import (
    DEAD_LETTER_REASON_HEADER,
    KafkaSettings,
    existing_topics,
    wait_for_messages,
)
from privstream.flows.io import KafkaIO
from privstream.flows.ldp_ids import build
from privstream.schema.events import REASONS

from .conftest import (
    PRIVSTREAM,
    Topics,
    cli_env,
    read_all,
    read_json,
    run_cli,
    same_incarnation,
    write_secret,
)

EPSILON, WINDOW = 1.0, 5


def produce_lines(settings: KafkaSettings, topic: str, lines: list[bytes]) -> None:
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    for line in lines:
        producer.produce(topic, line, b"sin")
    assert producer.flush(30) == 0


def event(user: int | str, slot: int, value: Any, stream: str = "sin") -> bytes:
    return json.dumps({"stream": stream, "user": f"u{user}", "slot": slot, "value": value}).encode()


def marker(slot: int, stream: str = "sin") -> bytes:
    return json.dumps({"stream": stream, "end_of_slot": slot}).encode()


def good_events(users: int, slots: int) -> list[bytes]:
    """Every user at every slot with value ``(user + slot) % 2``, a marker after each slot."""
    lines: list[bytes] = []
    for t in range(1, slots + 1):
        lines += [event(u, t, (u * t + u // 3) % 2) for u in range(users)]
        lines.append(marker(t))
    return lines


def run_flags(
    topics: Topics, kafka: KafkaSettings, users: int, slots: int, mech: str, secret: Path
) -> list[str]:
    """A production run: keyed by ``secret``; several mechanisms split ε equally."""
    split = ["--budget-split", "equal"] if "," in mech else []
    return [
        "run", "ldp-ids", "--mechanism", mech, "--users", str(users), "--epsilon", str(EPSILON),
        "--window", str(WINDOW), "--seed", "7", "--slots", str(slots), "--no-progress",
        "--secret-file", str(secret), *split, *topics.run_flags(kafka),
    ]  # fmt: skip


def by_id(messages: list[Any]) -> dict[str, list[bytes]]:
    """Release payloads by their Kafka key (the release id)."""
    out: dict[str, list[bytes]] = defaultdict(list)
    for m in messages:
        out[m.key().decode()].append(m.value())
    return out


# -- end to end --------------------------------------------------------------------------------


def test_kafka_flow_equals_the_file_flow_on_the_same_events(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    users, slots = 400, 12
    lines = good_events(users, slots)
    produce_lines(kafka, topics.events, lines)
    kafka_store = tmp_path / "kafka-store"
    done = run_cli(*run_flags(topics, kafka, users, slots, "LBU,LPA", secret_file),
                   "--recovery-dir", str(kafka_store))  # fmt: skip
    assert "slot 12 released" in done.stderr

    releases = read_json(kafka, topics.releases, 2 * slots)
    assert len(releases) == 2 * slots
    keys = by_id(wait_for_messages(kafka, topics.releases, lambda got: len(got) >= 2 * slots))
    assert sorted(keys) == sorted(f"sin/{m}/{t}" for m in ("LBU", "LPA") for t in range(1, 13))
    assert all(
        r["guarantee"]["epsilon"] == EPSILON / 2 and not r["insecure_seed"] for r in releases
    )
    ledger = read_json(kafka, topics.ledger, 2 * slots)
    assert {(e["mechanism"], e["slot"]) for e in ledger} == {
        (m, t) for m in ("LBU", "LPA") for t in range(1, 13)
    }
    # the population accountant: both mechanisms together stay within ε
    assert all(e["population_budget"] == EPSILON for e in ledger)
    assert all(0 < e["population_spent"] <= EPSILON * (1 + 1e-9) for e in ledger)

    # The same events from a file through the file source give byte-identical releases.
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "releases.jsonl"
    run_cli(
        "run", "ldp-ids", "--mechanism", "LBU,LPA", "--users", str(users), "--epsilon", "1.0",
        "--window", str(WINDOW), "--seed", "7", "--dataset", f"file:{path}", "--stream", "sin",
        "--out", str(out), "--no-progress", "--secret-file", str(secret_file),
        "--budget-split", "equal", "--recovery-dir",
        str(same_incarnation(kafka_store, tmp_path / "file-store")),  # the same noise
    )  # fmt: skip
    from_file = sorted(out.read_bytes().splitlines())
    assert from_file == sorted(v for vs in keys.values() for v in vs)


def test_a_missing_topic_is_an_error_not_created(
    kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    done = subprocess.run(
        [*PRIVSTREAM, "run", "ldp-ids", "--users", "10", "--bootstrap", kafka.bootstrap,
         "--input-topic", "no-such-topic", "--output-topic", topics.releases, "--slots", "1",
         "--secret-file", str(secret_file)],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert "'no-such-topic'" in done.stderr and "privstream topics create" in done.stderr
    assert "no-such-topic" not in existing_topics(kafka)


def test_topics_create_is_idempotent(kafka: KafkaSettings) -> None:
    flags = ["topics", "create", "--bootstrap", kafka.bootstrap, "--input-topic", "idem-events",
             "--output-topic", "idem-releases", "--partitions", "2"]  # fmt: skip
    assert run_cli(*flags).stdout.split() == [
        "idem-events:",
        "created",
        "idem-releases:",
        "created",
    ]
    assert run_cli(*flags).stdout.split() == ["idem-events:", "exists", "idem-releases:", "exists"]
    assert existing_topics(kafka)["idem-events"] == 2


def test_produce_writes_the_synthetic_stream(kafka: KafkaSettings, topics: Topics) -> None:
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--users", "50", "--slots", "3", "--no-progress",
    )  # fmt: skip
    got = read_json(kafka, topics.events, 153)
    assert len(got) == 153
    assert [g["end_of_slot"] for g in got if "end_of_slot" in g] == [1, 2, 3]
    events = [g for g in got if "user" in g]
    assert Counter(g["slot"] for g in events) == {1: 50, 2: 50, 3: 50}
    assert {g["user"] for g in events} == {f"u{i}" for i in range(50)}


def test_produce_never_creates_its_topic(kafka: KafkaSettings) -> None:
    """Tansu creates a topic on any metadata request naming it: ``produce`` checks the full
    topic list first and its producer cannot auto-create."""
    missing = f"nowhere-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [*PRIVSTREAM, "produce", "--bootstrap", kafka.bootstrap, "--topic", missing,
         "--users", "5", "--slots", "1", "--no-progress"],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 2 and "do not exist" in done.stderr
    topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics
    assert missing not in topics


# -- bad input ---------------------------------------------------------------------------------

MAX_BYTES = 2048


def bad_events(users: int) -> list[tuple[int, bytes, str]]:
    """(position: insert after this many good slots, line, expected reason)."""
    return [
        (1, b'{"stream": "sin", "user": "u1", "slot": 2, ', "malformed_json"),
        (1, b"\xff\xfe not utf-8", "malformed_json"),
        (1, b"", "malformed_json"),
        (2, b'{"stream": "sin", "slot": 3, "value": 1}', "missing_field"),
        (2, b'{"stream": "sin", "user": "u2", "value": 1}', "missing_field"),
        (2, b'{"stream": "sin", "user": "u2", "slot": "three", "value": 1}', "invalid_type"),
        (2, b'{"stream": "sin", "user": "u2", "slot": 3, "value": "one"}', "invalid_type"),
        (2, b'{"stream": "sin", "user": 5.5, "slot": 3, "value": 1}', "invalid_type"),
        (2, b"[1, 2, 3]", "invalid_type"),
        (3, event(3, 4, 1, stream="other"), "unknown_stream"),
        (3, event(4, 4, 7), "out_of_domain"),
        (3, event(5, 4, -1), "out_of_domain"),
        (3, event(6, -4, 1), "negative_slot"),
        (3, event(7, 4 + 50_000, 1), "far_future_slot"),
        (4, event(8, 2, 1), "late_event"),  # slot 2 closed by its marker already
        (5, b'{"stream": "sin", "user": "u9", "slot": 6, "value": 1, "pad": "'
         + b"x" * MAX_BYTES + b'"}', "oversized"),
    ]  # fmt: skip


OWNER_DECIDED = {"out_of_domain", "far_future_slot", "late_event", "duplicate_report"}
"""The reasons of ``bad_events`` decided by the stream's owner, after the parse."""


def fields(line: bytes) -> bytes:
    """An event's parsed fields, as an owner-decided dead letter carries them."""
    event = json.loads(line)
    parsed = {k: event[k] for k in ("stream", "user", "slot")} | {"value": float(event["value"])}
    return json.dumps(parsed).encode()


def with_bad(users: int, slots: int) -> tuple[list[bytes], list[tuple[bytes, str]]]:
    good = good_events(users, slots)
    per_slot = users + 1
    lines: list[bytes] = []
    bad = bad_events(users)
    expected: list[tuple[bytes, str]] = []
    for t in range(slots):
        lines += good[t * per_slot : (t + 1) * per_slot]
        for after, line, reason in bad:
            if after == t + 1:
                lines.append(line)
                expected.append((line, reason))
        if t == 4:  # a duplicate report of u10 in slot 6, before slot 6's own events
            dup = event(10, 6, 1)
            lines.append(dup)
            expected.append((event(10, 6, (10 * 6 + 10 // 3) % 2), "duplicate_report"))
    return lines, expected


def test_bad_input_goes_to_the_dead_letter_topic_and_changes_no_release(
    kafka: KafkaSettings, broker: Any, secret_file: Path, tmp_path: Path
) -> None:
    users, slots = 60, 8
    clean, dirty = Topics(kafka), Topics(kafka)
    produce_lines(kafka, clean.events, good_events(users, slots))
    lines, expected = with_bad(users, slots)
    produce_lines(kafka, dirty.events, lines)
    limit = ["--max-event-bytes", str(MAX_BYTES)]
    clean_store, dirty_store = tmp_path / "clean-store", tmp_path / "dirty-store"
    run_cli(*run_flags(clean, kafka, users, slots, "LBA,LPD", secret_file), *limit,
            "--recovery-dir", str(clean_store))  # fmt: skip
    same_incarnation(clean_store, dirty_store)  # the same noise
    done = run_cli(*run_flags(dirty, kafka, users, slots, "LBA,LPD", secret_file), *limit,
                   "--recovery-dir", str(dirty_store))  # fmt: skip

    want = by_id(wait_for_messages(kafka, clean.releases, lambda got: len(got) >= 2 * slots))
    got = by_id(wait_for_messages(kafka, dirty.releases, lambda got: len(got) >= 2 * slots))
    assert got == want  # byte-identical releases for the valid events

    letters = read_all(kafka, dirty.dlq)
    seen = Counter(
        (m.value() or b"", dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode()) for m in letters
    )
    assert all(reason in REASONS for _, reason in seen)
    # rejections the stream's owner decides carry the parsed fields and where the message is
    # (issue 26: its bytes stay on the input topic); the parser's carry the bytes
    assert seen == Counter(
        (fields(line) if reason in OWNER_DECIDED else line, reason) for line, reason in expected
    )
    inputs = {(m.partition(), m.offset()): m.value() for m in read_all(kafka, dirty.events)}
    located = [m for m in letters if dict(m.headers()).get("privstream-payload") == b"fields"]
    assert len(located) == sum(reason in OWNER_DECIDED for _, reason in expected) == 5
    for m in located:
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["privstream-source-topic"] == dirty.events
        assert "privstream-original-sha256" not in headers
        original = inputs[(int(headers["privstream-source-partition"]),
                           int(headers["privstream-source-offset"]))]  # fmt: skip
        assert headers["privstream-original-length"] == str(len(original))
        assert m.value() == fields(original) and original not in m.value()
    assert read_all(kafka, clean.dlq, settle=0.5) == []
    # the run's summary: the same rejections by reason, counts only, and where they went
    by_reason = Counter(reason for _, reason in expected)
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(by_reason.items()))
    assert done.stderr.splitlines()[-1] == (
        f"accepted {users * slots} events; {sum(by_reason.values())} events rejected "
        f"({reasons}); dead letters in {dirty.dlq}"
    )


# -- stopping, crashing, resuming -------------------------------------------------------------


def start_run(flags: list[str], recovery: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PRIVSTREAM, *flags, "--recovery-dir", str(recovery), "--snapshot-interval", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip


def wait_releases(kafka: KafkaSettings, topic: str, count: int, proc: subprocess.Popen[str]) -> int:
    """Wait until ``count`` releases are on ``topic`` while ``proc`` is still running."""
    got = wait_for_messages(kafka, topic, lambda got: len(got) >= count, timeout=120)
    assert proc.poll() is None, "the flow finished before it could be interrupted"
    return len(got)


def check_output(
    kafka: KafkaSettings, topic: str, users: int, slots: int, mechs: list[str]
) -> dict[str, bytes]:
    """Every slot released; duplicates byte-identical; the ledger invariants over every window."""
    expected = {f"sin/{m}/{t}" for m in mechs for t in range(1, slots + 1)}
    messages = wait_for_messages(
        kafka, topic, lambda got: {m.key().decode() for m in got} >= expected, timeout=120
    )
    releases = by_id(messages)
    assert set(releases) == expected
    for rid, payloads in releases.items():
        assert len(set(payloads)) == 1, f"{rid} released twice with different payloads"
    unique = {rid: payloads[0] for rid, payloads in releases.items()}
    for m in mechs:
        rows = [json.loads(unique[f"sin/{m}/{t}"]) for t in range(1, slots + 1)]
        share = EPSILON / len(mechs)  # the mechanisms split ε equally
        assert {r["guarantee"]["epsilon"] for r in rows} == {share}
        for start in range(slots - WINDOW + 1):
            window = [r["details"] for r in rows[start : start + WINDOW]]
            if m.startswith("LB"):  # budget division: a user's spend over any w slots
                assert sum(d["epsilon_m1"] + d["epsilon_m2"] for d in window) <= share + 1e-9
            else:  # population division: distinct reporters over any w slots
                assert sum(d["users_m1"] + d["users_m2"] for d in window) <= users
    return unique


def test_sigterm_stops_cleanly_and_a_restart_continues(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    users, slots = 3000, 200
    run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events,
            "--users", str(users), "--slots", str(slots), "--no-progress")  # fmt: skip
    flags = run_flags(topics, kafka, users, slots, "LBU,LPA", secret_file)
    unbounded = flags[: flags.index("--slots")] + flags[flags.index("--slots") + 2 :]
    proc = start_run(unbounded, tmp_path / "rec")
    before = wait_releases(kafka, topics.releases, 40, proc)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "received SIGTERM" in err and "Traceback" not in err
    assert before < 2 * slots

    again = start_run(flags, tmp_path / "rec")
    _out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    check_output(kafka, topics.releases, users, slots, ["LBU", "LPA"])


def test_sigkill_mid_run_then_restart_releases_every_slot_once_in_effect(
    kafka: KafkaSettings, tmp_path: Path, secret_file: Path
) -> None:
    users, slots, mechs = 5000, 240, ["LBU", "LPA"]
    crashed, reference = Topics(kafka), Topics(kafka)
    for t in (crashed, reference):
        run_cli("produce", "--bootstrap", kafka.bootstrap, "--topic", t.events,
                "--users", str(users), "--slots", str(slots), "--no-progress")  # fmt: skip

    flags = run_flags(crashed, kafka, users, slots, ",".join(mechs), secret_file)
    proc = start_run(flags, tmp_path / "rec")
    before = wait_releases(kafka, crashed.releases, 60, proc)
    proc.kill()  # SIGKILL: no snapshot, no flush, no goodbye
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert before < len(mechs) * slots

    again = start_run(flags, tmp_path / "rec")
    _out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    recovered = check_output(kafka, crashed.releases, users, slots, mechs)

    # Replays are byte-identical, so the crashed run equals an uninterrupted one of the same
    # incarnation (the store's nonce: a run without it draws fresh noise).
    ref_store = same_incarnation(tmp_path / "rec", tmp_path / "ref-rec")
    ref_flags = run_flags(reference, kafka, users, slots, ",".join(mechs), secret_file)
    run_cli(*ref_flags, "--recovery-dir", str(ref_store))
    assert recovered == check_output(kafka, reference.releases, users, slots, mechs)


def test_a_new_store_starts_after_the_release_topic(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    """Issue 18 §2: a new store (the remedy for a halted stream) re-published every release id
    of the input; now it reads the release topic, skips the published slots as
    ``already_published`` dead letters and says so, and draws its own noise; the w − 1 slots
    after them are its cooldown (``incarnation_cooldown``, tests/integration/
    test_incarnation_cooldown.py)."""
    users = 400
    produce_lines(kafka, topics.events, good_events(users, 20))
    first = run_flags(topics, kafka, users, 20, "LPA", secret_file)
    run_cli(*first, "--recovery-dir", str(tmp_path / "store-a"))
    lines = []
    for t in range(21, 31):
        lines += [event(u, t, (u * t) % 2) for u in range(users)] + [marker(t)]
    produce_lines(kafka, topics.events, lines)
    second = run_flags(topics, kafka, users, 30, "LPA", secret_file)
    done = run_cli(*second, "--recovery-dir", str(tmp_path / "store-b"))
    assert "stream sin: slots <= 20 were published by an earlier incarnation; starting at 21" in (
        done.stderr
    )
    releases = by_id(read_all(kafka, topics.releases))
    cooldown = range(21, 21 + WINDOW - 1)
    assert set(releases) == {f"sin/LPA/{t}" for t in range(1, 31) if t not in cooldown}
    assert all(len(payloads) == 1 for payloads in releases.values()), "an id published twice"
    letters = read_all(kafka, topics.dlq)
    reasons = [dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode() for m in letters]
    assert reasons.count("already_published") == 20 * users
    assert reasons.count("incarnation_cooldown") == len(cooldown) * users


# -- step ids ------------------------------------------------------------------------------------

PERSISTED = ("input", "stateful_batch", "output")


def persisted_step_ids(flow: Any) -> list[str]:
    """Step ids whose state the recovery store keys (inputs, stateful operators, sinks)."""
    found: list[str] = []

    def walk(step: Any) -> None:
        for sub in step.substeps:
            if type(sub).__name__ in PERSISTED:
                found.append(sub.step_id)
            walk(sub)

    walk(flow)
    return found


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("synthetic", ["synthetic", "ldp_ids.mechanism.slots", "releases_out.file"]),
        ("file", ["file", "ldp_ids.mechanism.slots", "releases_out.file", "ledger_out.file",
                  "dead_letters_out.file"]),
        ("kafka", ["kafka_in", "ldp_ids.mechanism.slots", "releases_out.kafka",
                   "ledger_out.kafka", "dead_letters_out.kafka"]),
    ],
)  # fmt: skip
def test_persisted_step_ids_are_stable(kind: str, expected: list[str], tmp_path: Path) -> None:
    """Renaming one of these orphans its state in existing recovery stores: change them only
    with a migration."""
    key = secrets.token_hex(32)
    if kind == "synthetic":
        flow = build(dataset="sin", users=1000, slots=2, out=str(tmp_path / "r"), secret=key)
    elif kind == "file":
        path = tmp_path / "e.jsonl"
        path.write_text("")
        flow = build(dataset=f"file:{path}", users=1000, out=str(tmp_path / "r"),
                     ledger_out=str(tmp_path / "l"), dead_letter_out=str(tmp_path / "d"),
                     secret=key)  # fmt: skip
    else:
        io = KafkaIO(KafkaSettings(("127.0.0.1:1",)), "e", "r", "d", "l")
        flow = build(dataset="sin", users=1000, kafka=io, secret=key)
    assert persisted_step_ids(flow) == [f"privstream_ldp_ids.{s}" for s in expected]


def test_flow_rejects_a_recovery_store_of_another_topic(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    produce_lines(kafka, topics.events, good_events(20, 2))
    rec = ["--recovery-dir", str(tmp_path / "rec")]
    run_cli(*run_flags(topics, kafka, 20, 2, "LBU", secret_file), *rec)
    other = Topics(kafka)
    produce_lines(kafka, other.events, good_events(20, 2))
    done = subprocess.run(
        [*PRIVSTREAM, *run_flags(other, kafka, 20, 2, "LBU", secret_file), *rec],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert done.returncode != 0
    assert "use a new recovery directory" in done.stderr


def test_flow_rejects_a_recovery_store_of_another_secret_or_budget(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path, secret_file: Path
) -> None:
    """A store is bound to the noise key (by fingerprint) and the privacy parameters: resuming
    it with another would release replayed slots with other noise or reset budgets."""
    produce_lines(kafka, topics.events, good_events(20, 2))
    produce_lines(kafka, topics.events, [event(u, 3, u % 2) for u in range(20)] + [marker(3)])
    rec = ["--recovery-dir", str(tmp_path / "rec")]
    run_cli(*run_flags(topics, kafka, 20, 2, "LBU", secret_file), *rec)
    same = run_flags(topics, kafka, 20, 3, "LBU", secret_file)
    other_key = write_secret(tmp_path / "other.key")
    for changed, why in [
        (run_flags(topics, kafka, 20, 3, "LBU", other_key), "another secret"),
        ([*same, "--epsilon", "2"], "the population's epsilon changed from 1 to 2"),
    ]:
        done = subprocess.run(
            [*PRIVSTREAM, *changed, *rec], capture_output=True, text=True, timeout=120,
            env=cli_env(),
        )  # fmt: skip
        assert done.returncode != 0
        assert why in done.stderr, done.stderr[-3000:]
        assert "new recovery directory" in done.stderr
        for key in (secret_file, other_key):
            assert key.read_text().strip() not in done.stderr
    # the same secret and configuration resume where the store left off
    assert "slot 3 released" in run_cli(*same, *rec).stderr


def test_broker_command_serves_until_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*PRIVSTREAM, "broker", "--port", str(port)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == f"PRIVSTREAM_BOOTSTRAP=127.0.0.1:{port}"
    settings = KafkaSettings.from_options(
        None, environ={"PRIVSTREAM_BOOTSTRAP": line.split("=")[1]}
    )
    assert existing_topics(settings) == {}
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "embedded broker stopped" in err


def test_settings_come_from_flags_and_environment_and_hide_secrets() -> None:
    env = {
        "PRIVSTREAM_BOOTSTRAP": "a:1,b:2",
        "PRIVSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PRIVSTREAM_KAFKA_SASL_PASSWORD": "hunter2",
    }
    settings = KafkaSettings.from_options(None, ["sasl.mechanism=PLAIN"], environ=env)
    assert settings.brokers == ("a:1", "b:2")
    assert settings.client_config()["security.protocol"] == "SASL_SSL"
    assert settings.client_config()["sasl.mechanism"] == "PLAIN"
    assert "hunter2" not in repr(settings)
    assert KafkaSettings.from_options("c:3", environ=env).brokers == ("c:3",)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        KafkaSettings.from_options("c:3", ["oops"], environ={})
    with pytest.raises(ValueError, match="bootstrap"):
        KafkaSettings.from_options(None, environ={})
