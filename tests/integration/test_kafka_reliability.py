"""Kafka faults an on-call audit found (docs/kafka.md, "Crash safety"): poison messages, delivery
timeouts, topics that disappear, outages nobody sees.

* (a) a 2,000,000-byte and a 999,900-byte input message become capped dead letters that point at
  the original; the run finishes with every release (it used to crash-loop on them);
* (b) the broker cut away (a ``FaultProxy`` between the flow and a broker that advertises it)
  for longer than ``message.timeout.ms``: a short outage is ridden out with every release
  delivered, a long one fails the run non-zero and a restart from the recovery store delivers
  everything — never exit 0 with a release missing (it used to drop them silently);
* (c) a topic deleted mid-run, or a broker back without its topics, stops the run non-zero with
  a message naming it, and nothing re-creates it (the producers used to re-create the release
  and ledger topics and the run idled forever);
* (d) a frozen broker: a warning on stderr within the configured time and
  ``privstream_kafka_connected`` 0, back to 1 after it thaws.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
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

from .conftest import PRIVSTREAM, Topics, cli_env, read_all, run_cli
from .prometheus import FlowProcess
from .proxy import ProxiedBroker
from .test_kafka_flow import check_output, good_events, run_flags, start_run


def produce(settings: KafkaSettings, topic: str, lines: list[bytes]) -> list[int]:
    """Write ``lines`` in order (messages up to 3 MB); their offsets."""
    producer = Producer(settings.client_config(**{"message.max.bytes": 3_000_000}))
    offsets: dict[int, int] = {}
    for i, line in enumerate(lines):

        def delivered(err: Any, msg: Any, i: int = i) -> None:
            assert err is None, err
            offsets[i] = msg.offset()

        producer.produce(topic, line, b"sin", on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    return [offsets[i] for i in range(len(lines))]


def wait_exit(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """The exit code and stderr of ``proc``; fails (killing it) when it is still running."""
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"the flow was still running after {timeout} s:\n{err[-3000:]}")
    return proc.returncode, err


def wait_for(condition: Callable[[], bool], what: str, timeout: float) -> float:
    """Poll ``condition`` every 50 ms; the seconds it took (fails naming ``what``)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedBroker]:
    with ProxiedBroker(tmp_path / "tansu.log") as running:
        yield running


# -- (a) poison messages ------------------------------------------------------------------------


def padded(size: int) -> bytes:
    """A JSON-looking event of exactly ``size`` bytes."""
    head, tail = b'{"stream": "sin", "user": "u1", "slot": 2, "value": 1, "pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_huge_input_messages_become_capped_dead_letters_and_the_run_completes(
    kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    users, slots = 40, 4
    good = good_events(users, slots)
    huge = [padded(2_000_000), padded(999_900)]
    offsets = produce(kafka, topics.events, good[: users + 1] + huge + good[users + 1 :])
    done = subprocess.run(
        [*PRIVSTREAM, *run_flags(topics, kafka, users, slots, "LBU", secret_file)],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"slot {slots} released" in done.stderr
    check_output(kafka, topics.releases, users, slots, ["LBU"])

    letters = read_all(kafka, topics.dlq)
    assert len(letters) == 2
    for letter, original, offset in zip(letters, huge, offsets[users + 1 : users + 3], strict=True):
        headers = {k: v.decode() for k, v in letter.headers()}
        assert headers[DEAD_LETTER_REASON_HEADER] == "oversized"
        assert letter.value() == original[:4096]  # a prefix, not the 2 MB
        assert headers["privstream-original-length"] == str(len(original))
        assert headers["privstream-original-sha256"] == hashlib.sha256(original).hexdigest()
        assert headers["privstream-truncated"] == "true"
        assert headers["privstream-source-topic"] == topics.events
        assert headers["privstream-source-partition"] == "0"
        assert headers["privstream-source-offset"] == str(offset)
        assert all(len(v.encode()) <= 256 for v in headers.values())
    # the original is where the headers say, byte for byte
    source = wait_for_messages(kafka, topics.events, lambda got: len(got) > offsets[users + 2])
    assert source[offsets[users + 1]].value() == huge[0]


# -- (b) delivery fails for a while ------------------------------------------------------------

TIMEOUTS = [
    "--kafka-config", "message.timeout.ms=1500", "--kafka-config", "reconnect.backoff.ms=50",
    "--kafka-config", "reconnect.backoff.max.ms=200", "--kafka-config", "socket.timeout.ms=1500",
    # the consumer holds the whole input (480,000 small events), so the flow keeps releasing
    # through the outage and the sink has deliveries to fail: the memory-bounded default
    # (consumer_buffers) pre-fetches less, and a flow that has drained its buffer just waits
    "--kafka-config", "queued.min.messages=1000000",
    "--kafka-config", "queued.max.messages.kbytes=262144",
]  # fmt: skip
USERS, SLOTS = 3000, 160


def expected_ids() -> set[str]:
    return {f"sin/LBU/{t}" for t in range(1, SLOTS + 1)}


def released(settings: KafkaSettings, topic: str) -> set[str]:
    """The release ids on ``topic`` now."""
    return {m.key().decode() for m in read_all(settings, topic)}


def start_flow(proxied: ProxiedBroker, tmp_path: Path, secret: Path) -> tuple[Any, ...]:
    """Events of ``SLOTS`` slots on a fresh topic, and a flow with a recovery store reading
    them through the proxy; (settings, topics, flags, process)."""
    settings = KafkaSettings((proxied.bootstrap,))
    topics = Topics(settings)
    run_cli("produce", "--bootstrap", settings.bootstrap, "--topic", topics.events,
            "--users", str(USERS), "--slots", str(SLOTS), "--no-progress")  # fmt: skip
    flags = [*run_flags(topics, settings, USERS, SLOTS, "LBU", secret), *TIMEOUTS]
    proc = start_run(flags, tmp_path / "rec")
    wait_for_messages(settings, topics.releases, lambda got: len(got) >= 10, timeout=120)
    assert proc.poll() is None, "the flow finished before the outage"
    return settings, topics, flags, proc


def test_a_short_outage_delays_releases_but_loses_none(
    proxied: ProxiedBroker, tmp_path: Path, secret_file: Path
) -> None:
    assert proxied.proxy is not None
    settings, topics, _flags, proc = start_flow(proxied, tmp_path, secret_file)
    proxied.proxy.cut()
    time.sleep(2.5)  # the outage itself: longer than message.timeout.ms (1.5 s)
    proxied.proxy.resume()
    code, err = wait_exit(proc, 120)
    assert code == 0, err[-3000:]
    assert released(settings, topics.releases) == expected_ids()
    assert "retrying" in err  # the timed-out batch was sent again
    check_output(settings, topics.releases, USERS, SLOTS, ["LBU"])


def test_a_long_outage_fails_the_run_and_a_restart_delivers_everything(
    proxied: ProxiedBroker, tmp_path: Path, secret_file: Path
) -> None:
    assert proxied.proxy is not None
    settings, topics, flags, proc = start_flow(proxied, tmp_path, secret_file)
    proxied.proxy.cut()
    code, err = wait_exit(proc, 90)  # the sink gives up: it never acknowledges a lost release
    proxied.proxy.resume()
    assert code != 0, "exit 0 although the broker was unreachable: releases may be missing"
    outputs = f"({topics.releases}|{topics.ledger})"  # whichever sink was writing at the cut
    assert re.search(rf"could not deliver \d+ message\(s\) to Kafka topic '{outputs}'", err)
    assert released(settings, topics.releases) < expected_ids(), "no outage was tested"

    again = start_run(flags, tmp_path / "rec")
    code, err = wait_exit(again, 120)
    assert code == 0, err[-3000:]
    check_output(settings, topics.releases, USERS, SLOTS, ["LBU"])


# -- (c) a topic disappears --------------------------------------------------------------------


def unbounded(flags: list[str]) -> list[str]:
    """``flags`` without ``--slots``: the flow tails its input until stopped."""
    at = flags.index("--slots")
    return flags[:at] + flags[at + 2 :]


def start_tailing(
    kafka: KafkaSettings, topics: Topics, users: int, slots: int, secret: Path
) -> subprocess.Popen[str]:
    """Write ``slots`` slots of events and start a flow that tails them until stopped."""
    produce(kafka, topics.events, good_events(users, slots))
    flags = unbounded(run_flags(topics, kafka, users, slots, "LBU", secret))
    return subprocess.Popen(
        [*PRIVSTREAM, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(),
    )  # fmt: skip


def delete_topic(kafka: KafkaSettings, topic: str) -> None:
    admin = AdminClient(kafka.client_config())  # kept alive until the deletion is done
    for future in admin.delete_topics([topic]).values():
        future.result(10)


@pytest.mark.parametrize("role", ["ledger", "releases"])
def test_a_sink_topic_deleted_mid_run_stops_the_run_naming_it(
    role: str, kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    users, slots = 50, 6
    proc = start_tailing(kafka, topics, users, slots, secret_file)
    wait_for_messages(kafka, topics.releases, lambda got: len(got) >= slots, timeout=60)
    victim = topics.ledger if role == "ledger" else topics.releases
    delete_topic(kafka, victim)
    produce(kafka, topics.events, good_events(users, slots + 2)[-(users + 1) * 2 :])
    code, err = wait_exit(proc, 30)
    assert code != 0
    assert f"'{victim}'" in err and "does not exist" in err
    time.sleep(1.0)  # anything still trying to re-create it would have done so by now
    assert victim not in existing_topics(kafka)


def test_the_input_topic_deleted_mid_run_stops_the_run_and_is_not_recreated(
    kafka: KafkaSettings, topics: Topics, secret_file: Path
) -> None:
    """On Tansu, librdkafka's consumer may crash (SIGSEGV in its metadata cache, on Tansu's
    answer for the deleted topic) before the source's own check names the topic; either way the
    run ends non-zero, nothing re-creates the topic, and the restart names it."""
    users, slots = 50, 4
    proc = start_tailing(kafka, topics, users, slots, secret_file)
    wait_for_messages(kafka, topics.releases, lambda got: len(got) >= slots - 1, timeout=60)
    delete_topic(kafka, topics.events)
    code, err = wait_exit(proc, 30)
    assert code != 0
    if code > 0:  # the source's own check won the race
        assert f"'{topics.events}'" in err and "does not exist" in err
    time.sleep(1.0)
    assert topics.events not in existing_topics(kafka)
    restart = subprocess.run(proc.args, capture_output=True, text=True, timeout=60, env=cli_env())
    assert restart.returncode == 2
    assert f"'{topics.events}'" in restart.stderr and "do not exist" in restart.stderr
    assert topics.events not in existing_topics(kafka)


def test_a_broker_back_without_its_topics_stops_the_run_and_creates_nothing(
    proxied: ProxiedBroker, secret_file: Path
) -> None:
    """The broker restarts empty (Tansu in memory): the producers must not re-create the
    release and ledger topics (with 4 partitions and no compaction) and idle on."""
    settings = KafkaSettings((proxied.bootstrap,))
    topics = Topics(settings)
    produce(settings, topics.events, good_events(50, 4))
    flags = unbounded(run_flags(topics, settings, 50, 4, "LBU", secret_file))
    proc = subprocess.Popen(
        [*PRIVSTREAM, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(),
    )  # fmt: skip
    wait_for_messages(settings, topics.releases, lambda got: len(got) >= 3, timeout=60)
    proxied.restart()
    code, err = wait_exit(proc, 30)
    assert code == 2, err[-3000:]  # refused: restarting will not bring the topic back
    assert re.search(
        r"privstream: error: Kafka topic '[a-z]+-[0-9a-f]+' does not exist any more", err
    )
    time.sleep(1.0)  # anything still trying to re-create a topic would have done so by now
    assert existing_topics(settings) == {}


# -- (d) outages are visible --------------------------------------------------------------------

CONNECTED = re.compile(r'^privstream_kafka_connected\{client="(source|sink)"\} (\S+)$', re.M)


def connected(text: str) -> dict[str, float]:
    return {client: float(value) for client, value in CONNECTED.findall(text)}


def test_a_frozen_broker_is_logged_and_exported_then_recovers(
    proxied: ProxiedBroker, tmp_path: Path, secret_file: Path
) -> None:
    assert proxied.proxy is not None
    stall = 2.0
    settings = KafkaSettings((proxied.bootstrap,))
    topics = Topics(settings)
    produce(settings, topics.events, good_events(30, 3))
    flags = unbounded(run_flags(topics, settings, 30, 3, "LBU", secret_file))
    command = [*PRIVSTREAM, *flags, "--stall-warning-seconds", str(stall), *TIMEOUTS]
    with FlowProcess(command, free_port(), tmp_path, cli_env()) as flow:
        flow.wait_metrics(
            lambda text: connected(text) == {"source": 1.0, "sink": 1.0}, "both connected", 60
        )
        assert "no progress" not in flow.output()[1]
        proxied.proxy.freeze()
        took = wait_for(lambda: "no progress" in flow.output()[1], "a stall warning", 3 * stall)
        warning = next(line for line in flow.output()[1].splitlines() if "no progress" in line)
        assert "WARNING" in warning and topics.events in warning
        assert took <= 2 * stall + 1.0, took
        flow.wait_metrics(lambda text: connected(text)["source"] == 0.0, "source at 0", 10)
        proxied.proxy.resume()
        flow.wait_metrics(
            lambda text: connected(text) == {"source": 1.0, "sink": 1.0}, "reconnected", 30
        )
        assert flow.terminate() == 0
    warnings = [line for line in flow.output()[1].splitlines() if "no progress" in line]
    assert 1 <= len(warnings) <= 3, warnings  # rate-limited, not one per poll
