"""Kafka outputs without a broker: dead letters are capped and point at their original, the sink
delivers or fails loudly (fake producers), the health of a client is tracked and its stalls are
logged at a bounded rate."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from bytewax.connectors.kafka import KafkaSinkMessage
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import REGISTRY

from privstream.connectors import kafka, kafka_sink
from privstream.connectors.kafka import (
    DEAD_LETTER_HEADER_BYTES,
    DEAD_LETTER_MAX_PAYLOAD,
    DEAD_LETTER_PREFIX,
    KafkaSettings,
    RawBatch,
    consumer_config,
    dead_letter_message,
    parse_raw_batch,
)
from privstream.connectors.kafka_health import (
    FAULTS,
    SINK,
    SOURCE,
    ClientHealth,
    Probe,
    TopicMissing,
    raise_if_failed,
    topic_exists,
)
from privstream.connectors.kafka_sink import (
    DeferredKafkaTopicSink,
    DeliveryFailed,
    KafkaTopicSink,
    producer_config,
    report_timeout,
)
from privstream.operators.metrics import INTERNAL
from privstream.schema.events import OVERSIZED, DeadLetter

# -- dead letters -----------------------------------------------------------------------------


def headers_of(message: KafkaSinkMessage[Any, Any]) -> dict[str, str]:
    return {key: value.decode() for key, value in message.headers}


@pytest.mark.parametrize("size", [2_000_000, 999_900, DEAD_LETTER_MAX_PAYLOAD + 1])
def test_a_large_dead_letter_carries_a_prefix_its_length_and_digest(size: int) -> None:
    original = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    letter = DeadLetter(OVERSIZED, None, "cut", "event larger than 65536 bytes", original,
                        "events", 3, 1234)  # fmt: skip
    message = dead_letter_message(letter)
    assert message.value == original[:DEAD_LETTER_PREFIX]
    headers = headers_of(message)
    assert headers["privstream-original-length"] == str(size)
    assert headers["privstream-original-sha256"] == hashlib.sha256(original).hexdigest()
    assert headers["privstream-truncated"] == "true"
    assert (headers["privstream-source-topic"], headers["privstream-source-partition"],
            headers["privstream-source-offset"]) == ("events", "3", "1234")  # fmt: skip
    total = len(message.value) + sum(len(k) + len(v) for k, v in message.headers)
    assert total < 6000  # far below any broker's message size limit


def test_a_dead_letter_up_to_the_limit_is_carried_whole() -> None:
    original = b"{" + b"y" * (DEAD_LETTER_MAX_PAYLOAD - 2) + b"}"
    message = dead_letter_message(
        DeadLetter("malformed_json", "s", "…", "not valid JSON", original)
    )
    assert message.value == original
    headers = headers_of(message)
    assert headers["privstream-truncated"] == "false"
    assert headers["privstream-original-length"] == str(DEAD_LETTER_MAX_PAYLOAD)
    assert "privstream-source-offset" not in headers  # not known: not claimed


def test_every_header_value_is_capped_at_a_character_boundary() -> None:
    stream = "é" * 10_000  # 20,000 bytes; a cut at 256 bytes falls between the two of a "é"
    letter = DeadLetter("unknown_stream", stream, "{}", "d" * 10_000, None, "t" * 300, 0, 7)
    for key, value in dead_letter_message(letter).headers:
        assert len(value) <= DEAD_LETTER_HEADER_BYTES, key
        value.decode("utf-8")  # never a broken character
    headers = headers_of(dead_letter_message(letter))
    assert headers["privstream-stream"] == "é" * 128
    assert headers["privstream-detail"] == "d" * 256


# -- where a dead letter came from -------------------------------------------------------------

GOOD = b'{"stream": "s", "user": "u1", "slot": 1, "value": 1}'


def letters(items: list[Any]) -> list[tuple[str, bytes, int | None]]:
    return [(d.reason, d.payload_bytes(), d.offset) for d in items if isinstance(d, DeadLetter)]


def test_dead_letters_of_a_poll_carry_topic_partition_and_offset() -> None:
    values = [GOOD, b"{broken", GOOD, b"", b"x" * 100, b"{broken", GOOD]
    batch = RawBatch("events", 2, 40, values)
    out = parse_raw_batch(batch, streams=["s"], max_bytes=80)
    assert sorted(letters(out), key=lambda d: d[2] or 0) == [
        ("malformed_json", b"{broken", 41),
        ("malformed_json", b"", 43),
        ("oversized", b"x" * 100, 44),
        ("malformed_json", b"{broken", 45),
    ]
    assert {(d.topic, d.partition) for d in out if isinstance(d, DeadLetter)} == {("events", 2)}


def test_offsets_that_are_not_consecutive_are_used_as_given() -> None:
    batch = RawBatch("events", 0, 10, [GOOD, b"{broken", GOOD, b"oops"], offsets=[10, 13, 14, 20])
    assert letters(parse_raw_batch(batch, streams=["s"])) == [
        ("malformed_json", b"{broken", 13),
        ("malformed_json", b"oops", 20),
    ]


class Msg:
    def __init__(self, offset: int, value: bytes = GOOD) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset


class ScriptedConsumer:
    """Returns one scripted list of messages per ``consume`` call."""

    script: ClassVar[list[list[Msg]]] = []
    high: ClassVar[int] = -1  # the high watermark of the last fetch response (-1: none yet)

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def assign(self, _partitions: Any) -> None:
        pass

    def consume(self, _n: int, _timeout: float) -> list[Msg]:
        return self.script.pop(0) if self.script else []

    def get_watermark_offsets(self, _partition: Any, cached: bool = False) -> tuple[int, int]:
        assert cached, "the lag must come from the cached watermark, never a broker request"
        return 0, self.high

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ScriptedConsumer]]:
    monkeypatch.setattr(kafka, "Consumer", ScriptedConsumer)
    monkeypatch.setattr(kafka._EventPartition, "_CHUNK", 2)
    yield ScriptedConsumer
    ScriptedConsumer.script = []
    ScriptedConsumer.high = -1
    FAULTS.clear()


def poll(batch_size: int = 10) -> RawBatch:
    source = kafka.KafkaEventSource(KafkaSettings(("x:1",)), "events", batch_size=batch_size)
    part = source.build_part("kafka_in", "partition-0", None)
    try:
        (batch,) = part.next_batch()
        return batch
    finally:
        part.close()


def test_a_poll_keeps_offsets_only_when_they_are_not_consecutive(
    scripted: type[ScriptedConsumer],
) -> None:
    scripted.script = [[Msg(5), Msg(6)], [Msg(7)]]
    batch = poll()
    assert (batch.first_offset, batch.offsets, len(batch.values)) == (5, None, 3)
    scripted.script = [[Msg(5), Msg(6)], [Msg(9), Msg(10)], [Msg(12)]]  # a gap between chunks
    batch = poll()
    assert (batch.first_offset, batch.offsets) == (5, [5, 6, 9, 10, 12])
    scripted.script = [[Msg(5), Msg(8)], []]  # a gap inside a chunk
    assert poll().offsets == [5, 8]


def test_a_poll_of_large_messages_stops_at_the_byte_bound(
    scripted: type[ScriptedConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 messages of up to the broker's largest each would be gigabytes: a poll stops
    after the chunk that reaches ``POLL_BYTES``, and the next poll goes on from there."""
    monkeypatch.setattr(kafka, "POLL_BYTES", 10_000)
    big = b"x" * 3_000
    scripted.script = [[Msg(o, big), Msg(o + 1, big)] for o in range(0, 12, 2)]
    source = kafka.KafkaEventSource(KafkaSettings(("x:1",)), "events", batch_size=1_000)
    part = source.build_part("kafka_in", "partition-0", None)
    try:
        (first,) = part.next_batch()  # 2 chunks: 12,000 bytes, past the bound
        (second,) = part.next_batch()
    finally:
        part.close()
    assert (first.first_offset, len(first.values)) == (0, 4)
    assert (second.first_offset, len(second.values)) == (4, 4)
    scripted.script = [[Msg(o), Msg(o + 1)] for o in range(0, 12, 2)] + [[Msg(12)]]
    assert len(poll(batch_size=1_000).values) == 13  # small messages: the count or the wait


def test_the_consumer_lag_is_the_high_watermark_past_the_read_position(
    scripted: type[ScriptedConsumer],
) -> None:
    """Internal gauge: messages the broker holds beyond what the partition has read, once the
    broker reported a high watermark (absent before)."""
    from privstream.connectors.kafka_health import CONSUMER_LAG
    from privstream.schema.exposition import INTERNAL

    def lag() -> float | None:
        return INTERNAL.get_sample_value(
            "privstream_internal_consumer_lag", {"topic": "events", "partition": "0"}
        )

    CONSUMER_LAG.clear()
    scripted.script = [[Msg(5), Msg(6)], [Msg(7)]]
    poll()
    assert lag() is None  # no watermark reported yet: no guess
    scripted.high = 20
    scripted.script = [[Msg(5), Msg(6)], [Msg(7)]]
    poll()
    assert lag() == 20 - 8  # read through offset 7; offsets 8..19 wait
    scripted.high = 3  # a stale watermark behind the position is no negative lag
    scripted.script = [[Msg(5)]]
    poll()
    assert lag() == 0


def test_the_source_stops_with_the_fault_a_probe_found(scripted: type[ScriptedConsumer]) -> None:
    FAULTS.record("Kafka topic 'ledger' does not exist any more on x:1")
    with pytest.raises(TopicMissing, match="'ledger' does not exist"):
        poll()


def test_no_client_of_a_flow_may_create_a_topic() -> None:
    settings = KafkaSettings(("x:1",), {"allow.auto.create.topics": "true", "acks": "1"})
    assert consumer_config(settings)["allow.auto.create.topics"] == "false"
    config = producer_config(settings)
    assert config["allow.auto.create.topics"] == "false"
    assert (config["enable.idempotence"], config["acks"]) == ("true", "all")


def test_the_report_wait_follows_message_timeout() -> None:
    assert report_timeout({}) == 300.0 + kafka_sink.REPORT_MARGIN_S
    assert report_timeout({"message.timeout.ms": "1500"}) == 1.5 + kafka_sink.REPORT_MARGIN_S
    assert report_timeout({"delivery.timeout.ms": 2000}) == 2.0 + kafka_sink.REPORT_MARGIN_S


# -- the sink -----------------------------------------------------------------------------------

DELIVER, SILENT = "deliver", "silent"


class FakeCluster:
    """What the fake producers talk to: the topics that exist, and per produced message (in
    order) its outcome — delivered, a failed report (an error code), refused at once (a
    ``KafkaException``/``BufferError`` to raise) or never reported."""

    def __init__(self, *outcomes: Any, topics: tuple[str, ...] = ("out",)) -> None:
        self.outcomes = list(outcomes)
        self.topics = set(topics)
        self.delivered: list[bytes] = []
        self.producers: list[FakeProducer] = []

    def producer(self, config: dict[str, Any]) -> FakeProducer:
        producer = FakeProducer(self, config)
        self.producers.append(producer)
        return producer


class FakeProducer:
    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self.cluster, self.config = cluster, config
        self.queue: list[tuple[Any, bytes, Any]] = []
        self.purged = False

    def produce(self, topic: str, value: bytes, key: Any, headers: Any, on_delivery: Any) -> None:
        outcome = self.cluster.outcomes.pop(0) if self.cluster.outcomes else DELIVER
        if isinstance(outcome, BaseException):
            raise outcome
        self.queue.append((outcome, value, on_delivery))

    def poll(self, timeout: float) -> int:
        queue, self.queue = [q for q in self.queue if q[0] != SILENT], []
        if not queue:
            time.sleep(min(timeout, 0.01))
        for outcome, value, on_delivery in queue:
            if outcome == DELIVER:
                self.cluster.delivered.append(value)
                on_delivery(None, SimpleNamespace(value=lambda v=value: v))
            else:
                on_delivery(KafkaError(outcome), None)
        return len(queue)

    def get_watermark_offsets(self, _partition: Any, cached: bool = False) -> tuple[int, int]:
        assert cached, "the lag must come from the cached watermark, never a broker request"
        return 0, self.high

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        missing = None if topic in self.cluster.topics else KafkaError(3)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=missing)})

    def purge(self) -> None:
        self.purged = True

    def flush(self, timeout: float = -1) -> int:
        self.poll(max(timeout, 0.0))
        return len(self.queue)


@pytest.fixture
def no_faults() -> Iterator[None]:
    FAULTS.clear()
    yield
    FAULTS.clear()


def sink(cluster: FakeCluster, **options: Any) -> Any:
    settings = KafkaSettings(("x:1",), {"message.timeout.ms": "0"})
    return KafkaTopicSink(
        settings, "out", backoff=0.0, make_producer=cluster.producer, **options
    ).build("out", 0, 1)


def msg(i: int, reason: str = "malformed_json") -> KafkaSinkMessage[bytes, bytes]:
    value = b"secret-payload-%d" % i
    return KafkaSinkMessage(b"k%d" % i, value, headers=[("privstream-reason", reason.encode())])


def undeliverable() -> float:
    value = INTERNAL.get_sample_value("privstream_internal_dead_letters_undeliverable_total")
    return value or 0.0


def test_a_batch_returns_once_every_message_is_delivered(no_faults: None) -> None:
    cluster = FakeCluster()
    part = sink(cluster)
    part.write_batch([msg(i) for i in range(5)])
    assert cluster.delivered == [b"secret-payload-%d" % i for i in range(5)]
    assert len(cluster.producers) == 1
    part.close()


def test_failed_messages_are_retried_with_a_fresh_producer(
    no_faults: None, caplog: pytest.LogCaptureFixture
) -> None:
    timed_out = KafkaError._MSG_TIMED_OUT
    cluster = FakeCluster(DELIVER, timed_out, timed_out, KafkaError.PRODUCER_FENCED, DELIVER)
    part = sink(cluster, retries=3)
    with caplog.at_level(logging.WARNING):
        part.write_batch([msg(0), msg(1), msg(2)])
    # attempt 1: 0 delivered, 1 and 2 timed out; attempt 2: 1 fenced, 2 delivered; attempt 3: 1
    assert sorted(cluster.delivered) == [b"secret-payload-%d" % i for i in range(3)]
    assert len(cluster.producers) == 3 and cluster.producers[0].purged
    assert "retrying 2 message(s)" in caplog.text and "retrying 1 message(s)" in caplog.text
    part.close()


def test_a_release_that_cannot_be_delivered_fails_the_batch(no_faults: None) -> None:
    cluster = FakeCluster(*[KafkaError._MSG_TIMED_OUT] * 4)
    part = sink(cluster, retries=3)
    failed = r"could not deliver 1 message\(s\) to Kafka topic 'out' after 4 attempt"
    with pytest.raises(DeliveryFailed, match=failed):
        part.write_batch([msg(0)])
    assert cluster.delivered == [] and len(cluster.producers) == 4
    part.close()


def test_a_message_without_a_report_counts_as_failed(
    no_faults: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_sink, "REPORT_MARGIN_S", 0.1)
    cluster = FakeCluster(SILENT, SILENT)
    part = sink(cluster, retries=1)
    with pytest.raises(DeliveryFailed, match="_TIMED_OUT"):
        part.write_batch([msg(0)])
    part.close()


def test_a_permanent_error_is_not_retried(no_faults: None) -> None:
    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    cluster = FakeCluster(too_large)
    part = sink(cluster, retries=3)
    with pytest.raises(DeliveryFailed, match=r"after 1 attempt.*MSG_SIZE_TOO_LARGE"):
        part.write_batch([msg(0)])
    assert len(cluster.producers) == 1
    part.close()


def test_dead_letters_that_cannot_be_written_are_logged_and_counted_not_raised(
    no_faults: None, caplog: pytest.LogCaptureFixture
) -> None:
    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    cluster = FakeCluster(too_large, DELIVER, KafkaError._MSG_TIMED_OUT, KafkaError._MSG_TIMED_OUT)
    part = sink(cluster, retries=1, best_effort=True)
    before = undeliverable()
    with caplog.at_level(logging.ERROR):
        part.write_batch([msg(0, "oversized"), msg(1), msg(2, "late_event")])
    assert cluster.delivered == [b"secret-payload-1"]
    assert undeliverable() == before + 2
    assert "1 dead letter(s) (1 oversized) could not be written" in caplog.text  # at once
    assert "1 dead letter(s) (1 late_event) could not be written" in caplog.text  # after retry
    assert "MSG_SIZE_TOO_LARGE" in caplog.text and "_MSG_TIMED_OUT" in caplog.text
    assert "secret-payload" not in caplog.text  # never the payload
    part.write_batch([msg(3)])  # and the sink goes on
    assert cluster.delivered[-1] == b"secret-payload-3"
    part.close()


def test_a_full_queue_is_waited_out(no_faults: None) -> None:
    cluster = FakeCluster(BufferError(), BufferError(), DELIVER)
    part = sink(cluster)
    part.write_batch([msg(0)])
    assert cluster.delivered == [b"secret-payload-0"]
    part.close()


def test_a_topic_that_is_gone_is_an_error_naming_it(no_faults: None) -> None:
    cluster = FakeCluster(topics=("out",))
    part = sink(cluster)
    part.write_batch([msg(0)])
    cluster.topics.clear()  # deleted; the broker still takes the next message (Tansu does)
    with pytest.raises(TopicMissing, match="'out' does not exist any more"):
        part.write_batch([msg(1)])
    with pytest.raises(TopicMissing):  # the whole process knows: every client stops
        raise_if_failed()
    part.close()


# -- health ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def connected_gauge(role: str) -> float | None:
    return REGISTRY.get_sample_value("privstream_kafka_connected", {"client": role})


def test_a_silent_broker_is_warned_about_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    health = ClientHealth(SOURCE, "events", stall_seconds=30, name="partition 0", clock=clock)
    try:
        health.answered()
        assert connected_gauge(SOURCE) == 1.0
        with caplog.at_level(logging.WARNING):
            for _ in range(200):  # 200 s of probes every second, the broker silent
                clock.now += 1
                health.unreachable("Local: Broker transport failure")
                health.check()
        assert connected_gauge(SOURCE) == 0.0
        stalls = [r.getMessage() for r in caplog.records if "no progress" in r.getMessage()]
        assert len(stalls) == 3  # at 30 s, then every 60 s: 90 s, 150 s
        assert stalls[0].startswith("Kafka source (topic 'events', partition 0): no progress")
        assert "broker unreachable; last error: Local: Broker transport failure" in stalls[0]
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            health.answered()
            health.check()
        assert "progressing again after 200 s" in caplog.text
        assert connected_gauge(SOURCE) == 1.0
    finally:
        health.close()


def test_a_sink_stalls_only_with_messages_waiting() -> None:
    clock = Clock()
    health = ClientHealth(SINK, "out", stall_seconds=10, clock=clock)
    try:
        clock.now += 100
        assert health.stalled_for() == 0.0  # idle: nothing to deliver
        health.waiting(3)
        clock.now += 12
        assert health.stalled_for() == 12.0
        health.progressed()  # a delivery
        clock.now += 4
        assert health.stalled_for() == 4.0
        health.waiting(0)
        assert health.stalled_for() == 0.0
    finally:
        health.close()


def test_a_probe_that_finds_the_topic_gone_stops_the_process(no_faults: None) -> None:
    cluster = FakeCluster(topics=())
    producer = cluster.producer({})
    health = ClientHealth(SINK, "out", stall_seconds=3)
    probe = Probe(health, lambda t: topic_exists(producer, "out", t), "x:1", 1.0)
    probe.probe_once()
    probe.stop()
    with pytest.raises(TopicMissing, match="'out' does not exist any more on x:1"):
        raise_if_failed()


def test_an_unanswered_probe_is_a_disconnection() -> None:
    health = ClientHealth(SINK, "out", stall_seconds=3)

    def unanswered(_timeout: float) -> bool:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata"))

    probe = Probe(health, unanswered, "x:1", 1.0)
    probe.probe_once()
    assert health.connected is False and connected_gauge(SINK) == 0.0
    probe.stop()


def deferred(cluster: FakeCluster, **options: Any) -> Any:
    settings = KafkaSettings(("x:1",), {"message.timeout.ms": "0"})
    topic_sink = KafkaTopicSink(settings, "out", backoff=0.0, make_producer=cluster.producer,
                                **options)  # fmt: skip
    return DeferredKafkaTopicSink(topic_sink).build_part("out", DeferredKafkaTopicSink.PART, None)


def test_a_deferred_batch_returns_at_once_and_the_epoch_waits_for_delivery(
    no_faults: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releases and ledger entries wait for their delivery reports at the epoch's snapshot,
    not per batch (issue 26): a batch whose reports never come returns, and the epoch's
    snapshot then fails, so the epoch is not recorded as done and a restart replays it."""
    monkeypatch.setattr(kafka_sink, "REPORT_MARGIN_S", 0.1)
    cluster = FakeCluster(SILENT)
    part = deferred(cluster, retries=0)
    started = time.monotonic()
    part.write_batch([msg(0)])
    part.write_batch([msg(1), msg(2)])
    assert time.monotonic() - started < 0.05  # no wait for the silent report
    assert cluster.delivered == [b"secret-payload-1", b"secret-payload-2"]
    with pytest.raises(DeliveryFailed, match="could not deliver 1 message"):
        part.snapshot()


def test_a_deferred_epoch_retries_what_failed_before_its_snapshot_returns(no_faults: None) -> None:
    cluster = FakeCluster(DELIVER, KafkaError._MSG_TIMED_OUT, DELIVER, DELIVER)
    part = deferred(cluster, retries=2)
    part.write_batch([msg(0), msg(1)])
    part.write_batch([msg(2)])
    assert part.snapshot() is None
    assert sorted(cluster.delivered) == [b"secret-payload-%d" % i for i in range(3)]
    assert len(cluster.producers) == 2 and cluster.producers[0].purged
    part.write_batch([msg(3)])
    part.close()  # the last epoch's messages are delivered at close too
    assert b"secret-payload-3" in cluster.delivered
