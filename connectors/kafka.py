"""Kafka in and out (design §5, §6, §9): settings, topics, the event source and the sinks.

* ``KafkaSettings`` — bootstrap servers and client properties (SASL/SSL pass through) from
  flags and the environment (``PRIVSTREAM_BOOTSTRAP``, ``PRIVSTREAM_KAFKA_<PROPERTY>``).
* ``create_topics`` (idempotent) and ``require_topics``: a missing topic is a clear error, never
  auto-created (some brokers, Tansu among them, create a topic on a metadata request for it,
  so existence is checked against the full topic list).
* ``KafkaEventSource`` — a Bytewax partitioned source on ``confluent-kafka``: one Bytewax
  partition per Kafka partition, resumable from the offset in its snapshot, emitting a whole
  poll as one ``RawBatch`` so parsing is batched (design §8). Bytewax's own ``KafkaSource``
  emits one Python object per message and cannot be stopped from inside the flow; this one
  polls a ``StopSignal``. Each partition's consumer is watched (``kafka_health``): a topic
  that disappears mid-run stops the run with ``TopicMissing``. A snapshot also holds the
  topic's id, so a resume on a topic that was deleted and re-created (whose offsets point at
  other messages) is refused with ``InputTopicChanged`` instead of idling or skipping; an
  offset the broker no longer has stops the run the same way (``auto.offset.reset=error``).
* The messages of the outputs (``connectors.kafka_sink`` writes them): releases keyed by
  ``release_id``, ledger entries keyed the same way, and dead letters carrying the original
  bytes (a prefix when they are large) — or, for one decided by a stream's owner, the parsed
  fields — plus machine-readable headers that point at the original.

No client of a flow can create a topic: consumers and producers run with
``allow.auto.create.topics=false`` (Tansu honours it; without it a producer's metadata request
creates the topic, with 4 partitions and no compaction).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import numpy as np
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from numpy.typing import NDArray
from prometheus_client import Gauge

from privstream.connectors.control import StopSignal
from privstream.connectors.json_events import parse_json_batch, parse_json_lines
from privstream.connectors.jsonl import to_json
from privstream.connectors.kafka_health import (
    CONSUMER_LAG,
    DEFAULT_STALL_SECONDS,
    FAULTS,
    SOURCE,
    ClientHealth,
    Probe,
    cluster_name,
    raise_if_failed,
    topic_exists,
)
from privstream.connectors.kafka_health import TopicMissing as TopicMissing  # re-exported
from privstream.connectors.kafka_log import KAFKA_LOG
from privstream.schema.events import (
    MALFORMED,
    MAX_EVENT_BYTES,
    DeadLetter,
    EventBatch,
    line_text,
)
from privstream.schema.keys import release_id

log = logging.getLogger(__name__)
STATUS_LOG: Final = logging.getLogger("privstream.status")
"""What an operator is told at INFO even without ``-v`` (the CLI sets this logger to INFO)."""

ENV_BOOTSTRAP: Final = "PRIVSTREAM_BOOTSTRAP"
ENV_PROPERTY_PREFIX: Final = "PRIVSTREAM_KAFKA_"
_SECRET_WORDS: Final = ("password", "secret", "key", "token")

CONSUMER_DEFAULTS: Final[Mapping[str, str]] = {
    "fetch.wait.max.ms": "10",
    "fetch.queue.backoff.ms": "10",
}
"""What every input consumer sets unless the flow's client properties do.

``fetch.wait.max.ms``: the broker answers a fetch within 10 ms, so a slot's events arrive in a
few large polls instead of many small ones. ``fetch.queue.backoff.ms``: once a partition's
pre-fetch queue reaches ``consumer_buffers``' bounds, librdkafka waits this long before it
checks again whether to fetch. Its default, 1000 ms, stalled a flow reading a backlog for up
to a second each time a poll emptied the queue: the 8-stream file's runs were idle 30 % of the
time at one process and about half at two, where each worker then waited for the other's
stream owner in bursts a second apart (``bench/README.md`` §3, *Fetch backoff*)."""
CONSUMER_MEMORY: Final = 128 * 2**20
"""What one process's consumers may buffer ahead of the flow, all input partitions together
(each partition has its own consumer, whose pre-fetch queue and fetches get an equal share)."""
MIN_SHARE: Final = 4 * 2**20  # a partition's share never goes below this (> 32 partitions)
QUEUED_MESSAGE_BYTES: Final = 512  # librdkafka's per-message overhead plus a small event


def consumer_buffers(partitions: int) -> dict[str, str]:
    """librdkafka's buffers for one of ``partitions`` consumers, bounded by memory.

    ``queued.min.messages=1000000`` per partition let a backlog on 8 partitions grow the
    process to 2,145 MiB (over the StatefulSet's 2 Gi): librdkafka pre-fetches until *both*
    the message count and ``queued.max.messages.kbytes`` (payload only, 64 MiB by default) are
    reached, and small messages cost several times their payload. Each partition gets
    ``CONSUMER_MEMORY / partitions``: half for the queue (by bytes, and by count at
    ``QUEUED_MESSAGE_BYTES`` each), a quarter for a fetch in flight; ``fetch.max.bytes`` stays
    at least 2 MiB (librdkafka needs it above ``message.max.bytes``)."""
    share = max(CONSUMER_MEMORY // max(partitions, 1), MIN_SHARE)
    return {
        "queued.max.messages.kbytes": str(share // 2 // 1024),
        "queued.min.messages": str(share // 2 // QUEUED_MESSAGE_BYTES),
        "fetch.max.bytes": str(max(min(50 * 2**20, share // 4), 2 * 2**20)),
        "max.partition.fetch.bytes": str(max(min(10 * 2**20, share // 4), 2**20)),
    }


POLL_BYTES: Final = 16 * 2**20
"""Most bytes of message values a poll takes: it stops after the chunk that reaches them. With
large messages a poll ends before ``POLL_MESSAGES``, so it holds at most this much and one
chunk more (a chunk is at most what librdkafka has queued: ``consumer_buffers``), however large
the messages, instead of 20,000 of up to the broker's largest message each."""
POLL_MESSAGES: Final = 20_000
"""Most messages a Kafka source takes per poll (one ``RawBatch``) by default. A backlog is read
in polls of this size; a live stream's polls are what arrived within 10 ms. At 5,000, a hot
stream on 8 user shards spent 1.21× its one-process CPU per message at two processes: every
poll is cut into a piece per shard, and each piece that crosses to the other process costs the
engine a fixed amount besides its rows. With four times fewer, larger pieces it spent 1.12×
(``bench/README.md`` §3)."""


RELEASE_TOPIC_CONFIG: Final[Mapping[str, str]] = {"cleanup.policy": "compact"}
"""Releases and ledger entries are keyed by release id: compaction keeps one copy of each."""


def consumer_config(
    settings: KafkaSettings, *, tail: bool = True, partitions: int = 1
) -> dict[str, Any]:
    """What every partition of a ``KafkaEventSource`` of ``partitions`` partitions consumes
    with (and what a benchmark's raw consumer must use to compare like with like): no consumer
    group commits (offsets live in the snapshots), no topic creation, ``CONSUMER_DEFAULTS`` and
    the memory-bounded buffers of ``consumer_buffers`` unless overridden."""
    config = settings.client_config(
        **{
            "group.id": "privstream",  # required by the client; offsets live in snapshots
            "enable.auto.commit": "false",
            "enable.partition.eof": str(not tail).lower(),
            "allow.auto.create.topics": "false",  # never create the input topic
            "auto.offset.reset": "error",  # an offset the broker lacks: stop, never skip
        }
    )
    for key, value in {**CONSUMER_DEFAULTS, **consumer_buffers(partitions)}.items():
        config.setdefault(key, value)
    return config


@dataclass(frozen=True)
class KafkaSettings:
    """Where the cluster is and how to talk to it.

    ``properties`` are librdkafka client properties passed to every consumer, producer and
    admin client (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...).
    """

    brokers: tuple[str, ...]
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.brokers or not all(self.brokers):
            raise ValueError(
                "bootstrap servers must be given (--bootstrap or PRIVSTREAM_BOOTSTRAP)"
            )

    @classmethod
    def from_options(
        cls,
        bootstrap: str | None,
        properties: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> KafkaSettings:
        """Flags first, then the environment: ``PRIVSTREAM_BOOTSTRAP=host:port,...`` and
        ``PRIVSTREAM_KAFKA_SASL_MECHANISM=PLAIN`` → ``sasl.mechanism=PLAIN``; ``properties``
        are ``key=value`` strings and win over the environment."""
        env = os.environ if environ is None else environ
        servers = bootstrap or env.get(ENV_BOOTSTRAP, "")
        props = {
            key[len(ENV_PROPERTY_PREFIX) :].lower().replace("_", "."): value
            for key, value in env.items()
            if key.startswith(ENV_PROPERTY_PREFIX)
        }
        for item in properties:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"Kafka client property must be KEY=VALUE, got {item!r}")
            props[key.strip()] = value
        return cls(tuple(s.strip() for s in servers.split(",") if s.strip()), props)

    @property
    def bootstrap(self) -> str:
        return ",".join(self.brokers)

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """Configuration for a ``confluent-kafka`` client: servers, properties, then ``extra``
        (the properties win over privstream's defaults, never over ``extra``); librdkafka's log lines
        go through the rate-limited ``KAFKA_LOG``."""
        return {"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG, **self.properties,
                **extra}  # fmt: skip

    def __repr__(self) -> str:  # never print credentials
        shown = {
            k: ("***" if any(word in k for word in _SECRET_WORDS) else v)
            for k, v in self.properties.items()
        }
        return f"KafkaSettings(brokers={self.brokers!r}, properties={shown!r})"


def _admin(settings: KafkaSettings) -> AdminClient:
    return AdminClient(settings.client_config())


def existing_topics(settings: KafkaSettings, timeout: float = 10.0) -> dict[str, int]:
    """Topic name → partition count, from the full topic list (no auto-creation)."""
    try:
        metadata = _admin(settings).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ConnectionError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from exc
    return {name: len(t.partitions or {}) for name, t in metadata.topics.items() if not t.error}


def topic_id(settings: KafkaSettings, topic: str, timeout: float = 10.0) -> str | None:
    """The id the broker gave ``topic`` when it was created (a re-created topic gets another),
    or None when the broker does not tell (older brokers)."""
    admin = _admin(settings)  # alive until the answer: a collected client aborts its requests
    try:
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)
        found = futures[topic].result(timeout)
    except Exception:  # no DescribeTopics on this broker: nothing to compare
        return None
    value = getattr(found, "topic_id", None)
    return None if value is None else str(value)


class InputTopicChanged(TopicMissing):
    """The input topic is not the one the recovery store read: it was deleted and re-created
    (another topic id), or the broker lost offsets the store points at."""


def topic_changed_message(topic: str, stored: str, now: str) -> str:
    """What a resume on a re-created input topic says (the CLI prints it)."""
    return (
        f"Kafka topic {topic!r} was deleted and re-created since the recovery store was written "
        f"(topic id {stored}, now {now}): the stored offsets point at other messages, so "
        "resuming would idle or silently skip events. Restore the original topic, or go on "
        "with the new one read from its beginning with --input-topic-recreated "
        "(kafka.input_topic_recreated = true): its events for released slots become "
        "late_event dead letters and every budget is kept"
    )


def require_topics(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """Partition counts of ``topics``; ``TopicMissing`` naming every missing one."""
    wanted = [t for t in topics if t]
    known = existing_topics(settings)
    missing = [t for t in wanted if t not in known]
    if missing:
        raise TopicMissing(
            f"Kafka topic(s) {', '.join(repr(t) for t in missing)} do not exist on "
            f"{settings.bootstrap}; create them with `privstream topics create` "
            "(privstream never auto-creates topics)"
        )
    return {t: known[t] for t in wanted}


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create: partitions, replication factor and topic config."""

    name: str
    partitions: int = 1
    replication: int = 1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("topic name must not be empty")
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        if self.replication < 1:
            raise ValueError(f"replication must be >= 1, got {self.replication}")


def create_topics(
    settings: KafkaSettings, specs: Sequence[TopicSpec], timeout: float = 30.0
) -> dict[str, str]:
    """Create the topics that do not exist yet: name → ``"created"`` or ``"exists"``.

    Idempotent: an existing topic is left as it is (its partitions and config are not changed).
    """
    admin = _admin(settings)
    result: dict[str, str] = {}
    todo = []
    known = existing_topics(settings)
    for spec in specs:
        if spec.name in known:
            result[spec.name] = "exists"
        else:
            todo.append(
                NewTopic(spec.name, spec.partitions, spec.replication, config=dict(spec.config))
            )
    if todo:
        for name, future in admin.create_topics(todo, request_timeout=timeout).items():
            try:
                future.result(timeout)
                result[name] = "created"
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise RuntimeError(f"cannot create Kafka topic {name!r}: {exc}") from exc
                result[name] = "exists"
    return result


@dataclass(frozen=True)
class RawBatch:
    """One poll of one Kafka partition: message values in offset order.

    ``offsets`` holds every message's offset when they are not consecutive from
    ``first_offset`` (a compacted topic, transaction markers), None when they are."""

    topic: str
    partition: int
    first_offset: int
    values: list[bytes]
    offsets: list[int] | None = None

    def offset(self, i: int) -> int:
        """The offset of ``values[i]``."""
        return self.first_offset + i if self.offsets is None else self.offsets[i]


@dataclass
class _Poll:
    """Where the messages of one ``next_batch`` came from."""

    first: int | None = None
    offsets: list[int] | None = None  # only once they stop being consecutive
    size: int = 0  # bytes of the values taken


class CaughtUp:
    """Says once per source, at INFO on ``STATUS_LOG``, when every partition it reads in this
    process has read all there was (no message for ``IDLE`` s after a fetch response): the
    flow is waiting for input. Shared by a source's partitions; a partition that reads again
    is not idle, but the line is never repeated."""

    IDLE: Final = 1.0

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._idle: dict[int, bool] = {}
        self._said = False

    def reading(self, partition: int) -> None:
        self._idle[partition] = False

    def idle(self, partition: int) -> None:
        self._idle[partition] = True
        if not self._said and all(self._idle.values()):
            self._said = True
            STATUS_LOG.info(
                "caught up: read every message of input topic %r (%d partition(s)); waiting "
                "for input (Ctrl-C or SIGTERM stops the run)", self.topic, len(self._idle),
            )  # fmt: skip


class _EventPartition(StatefulSourcePartition[RawBatch, tuple[str, int, str | None]]):
    """One Kafka partition, read from the offset of the last snapshot.

    Its consumer is probed from a thread (``kafka_health.Probe``, started with the first poll)
    for connectivity and the topic's existence; ``next_batch`` raises ``TopicMissing`` once a
    probe of this process found a topic of the flow gone."""

    _IDLE: Final = timedelta(milliseconds=50)
    _CHUNK: Final = 500  # below the collector's young-generation threshold (700 objects)

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        partition: int,
        offset: int,
        batch_size: int,
        stop: StopSignal | None,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        topic_id: str | None = None,
        caught_up: CaughtUp | None = None,
    ) -> None:
        consumer = self._consumer = Consumer(config)
        consumer.assign([TopicPartition(topic, partition, offset)])
        self._topic = topic
        self._topic_id = topic_id
        self._partition = partition
        self._offset = offset
        self._batch_size = batch_size
        self._stop = stop
        self._eof = False
        self._awake: datetime | None = None
        self._watermark_of = TopicPartition(topic, partition)
        self._lag: Gauge | None = None  # created with the broker's first watermark
        self._caught_up = caught_up
        self._last_read = time.monotonic()
        if caught_up is not None:
            caught_up.reading(partition)
        health = ClientHealth(SOURCE, topic, stall_seconds, f"partition {partition}")
        self._probe = Probe(  # started by the worker's first poll
            health, lambda timeout: topic_exists(consumer, topic, timeout), cluster_name(config)
        )

    def next_batch(self) -> list[RawBatch]:
        """Up to ``batch_size`` messages (and about ``POLL_BYTES``) that arrive within 10 ms,
        as one ``RawBatch``.

        They are taken from librdkafka in chunks of ``_CHUNK``, each dropped before the next is
        taken: every message is a GC-tracked object, and a whole poll of them alive at once
        outlives the collector's young generations, which then runs full collections every
        other poll (a fifth of a flow's CPU time in ``privstream bench kafka``).
        """
        if self._eof or (self._stop is not None and self._stop.is_set()):
            raise StopIteration
        self._probe.start()
        raise_if_failed()
        values: list[bytes] = []
        poll = _Poll()
        deadline = time.monotonic() + 0.01
        while len(values) < self._batch_size and poll.size < POLL_BYTES and not self._eof:
            want = min(self._CHUNK, self._batch_size - len(values))
            got = len(values)
            timeout = max(deadline - time.monotonic(), 0.0)
            self._take(self._consumer.consume(want, timeout), values, poll)
            if len(values) - got < want:  # the wait is over or the partition ended
                break
        self._awake = None if values else datetime.now(UTC) + self._IDLE
        fetched = self._report_lag()
        self._note_progress(bool(values), fetched)
        if poll.first is None:
            return []
        self._probe.health.progressed()
        return [RawBatch(self._topic, self._partition, poll.first, values, poll.offsets)]

    def _take(self, messages: list[Any], values: list[bytes], poll: _Poll) -> None:
        """Append the values of ``messages`` to ``values``, and where they came from to ``poll``.

        Per message only ``error()`` and ``value()`` are read, each by ``map`` over the
        method of the messages' class (no Python-level loop: half the cost per message); offsets
        are read at the ends of the run of good messages, and one by one only once they are not
        consecutive."""
        if not messages:
            return
        before = len(values)
        kind = type(messages[0])  # one class per consume call
        good = self._good(messages) if any(map(kind.error, messages)) else len(messages)
        taken = list(map(kind.value, messages[:good]))
        if not all(taken):  # a tombstone's value is None: an empty message
            taken = [value or b"" for value in taken]
        values += taken
        poll.size += sum(map(len, taken))
        if good:
            start, end = messages[0].offset(), messages[good - 1].offset()
            assert start is not None and end is not None
            if poll.first is None:
                poll.first = start
            if poll.offsets is None and (end - start != good - 1 or start != poll.first + before):
                poll.offsets = list(range(poll.first, poll.first + before))
            if poll.offsets is not None:
                poll.offsets.extend(m.offset() for m in messages[:good])
            self._offset = end + 1

    def _good(self, messages: list[Any]) -> int:
        """How many messages come before the first error: the end of the partition (which
        ends it), or a failure, which is raised."""
        for k, message in enumerate(messages):
            error = message.error()
            if error is None:
                continue
            if error.code() == KafkaError._PARTITION_EOF:
                self._eof = True
                return k
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                raise InputTopicChanged(
                    f"Kafka topic {self._topic!r} partition {self._partition} has no message at "
                    f"offset {self._offset}, where this run goes on: the topic was re-created or "
                    "truncated, or retention deleted events before they were read. privstream "
                    "never skips input: restore the topic, or resume on a re-created one with "
                    f"--input-topic-recreated ({error})"
                )
            raise RuntimeError(
                f"error consuming Kafka topic {self._topic!r} partition {self._partition}: {error}"
            )
        return len(messages)

    def _report_lag(self) -> bool:
        """``privstream_internal_consumer_lag`` from the high watermark of the last fetch
        response (cached by librdkafka: no request), once the broker has reported one; True
        once it has."""
        _low, high = self._consumer.get_watermark_offsets(self._watermark_of, cached=True)
        if high < 0:
            return False
        if self._lag is None:
            self._lag = CONSUMER_LAG.labels(topic=self._topic, partition=str(self._partition))
        self._lag.set(max(high - self._offset, 0))
        return True

    def _note_progress(self, read: bool, fetched: bool) -> None:
        """Tell ``CaughtUp`` whether this partition read something, or has been idle for
        ``CaughtUp.IDLE`` s since a fetch response."""
        if self._caught_up is None:
            return
        now = time.monotonic()
        if read:
            self._last_read = now
            self._caught_up.reading(self._partition)
        elif fetched and now - self._last_read >= CaughtUp.IDLE:
            self._caught_up.idle(self._partition)

    def next_awake(self) -> datetime | None:
        return self._awake

    def snapshot(self) -> tuple[str, int, str | None]:
        return (self._topic, self._offset, self._topic_id)

    def close(self) -> None:
        self._probe.stop()  # before the consumer goes: the probe uses it
        self._consumer.close()


SourceState = tuple[Any, ...]
"""A partition's snapshot: ``(topic, offset, topic id)`` (``(topic, offset)`` before ids)."""


class KafkaEventSource(FixedPartitionedSource[RawBatch, SourceState]):
    """Every partition of ``topic`` from its beginning (or from the recovered offsets).

    Args:
        settings: cluster and client properties.
        topic: the event topic; it must exist (``TopicMissing`` otherwise).
        tail: keep waiting for new messages at the end of a partition (default); with False a
            partition ends at its end (relies on the broker's high watermark).
        batch_size: most messages per poll (one ``RawBatch``).
        stop: ends every partition when set (clean shutdown, ``--slots``).
        stall_seconds: warn once a partition has heard nothing from the broker this long.
        recreated: the topic may have been re-created since the snapshots were taken: a
            partition whose snapshot names another topic id is read from its beginning
            (refused with ``InputTopicChanged`` otherwise).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        tail: bool = True,
        batch_size: int = POLL_MESSAGES,
        stop: StopSignal | None = None,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        recreated: bool = False,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.recreated = recreated
        self._id: tuple[str | None] | None = None
        self.tail = tail
        self.batch_size = batch_size
        self.stop = stop
        self.stall_seconds = stall_seconds
        self.partitions = 1  # until list_parts has counted them
        self.caught_up = CaughtUp(topic) if tail else None

    def list_parts(self) -> list[str]:
        partitions = require_topics(self.settings, [self.topic])[self.topic]
        FAULTS.clear()  # the flow starts: whatever an earlier flow of this process lost
        self.partitions = partitions  # the consumers share CONSUMER_MEMORY
        return [f"partition-{i}" for i in range(partitions)]

    def topic_id(self) -> str | None:
        """The input topic's id now (asked once per source)."""
        if self._id is None:
            self._id = (topic_id(self.settings, self.topic),)
        return self._id[0]

    def _resume_offset(self, resume_state: SourceState | None) -> int:
        """Where a partition goes on: its snapshot's offset, or its beginning for a fresh
        store or — with ``recreated`` — a topic re-created since the snapshot (another id)."""
        if resume_state is None:
            return OFFSET_BEGINNING
        stored = resume_state[2] if len(resume_state) > 2 else None
        now = self.topic_id()
        if stored is None or now is None or stored == now:
            return int(resume_state[1])
        if not self.recreated:
            raise InputTopicChanged(topic_changed_message(self.topic, stored, now))
        log.warning("input topic %r was re-created (topic id %s, now %s): reading it from its "
                    "beginning", self.topic, stored, now)  # fmt: skip
        return OFFSET_BEGINNING

    def build_part(
        self, step_id: str, for_part: str, resume_state: SourceState | None
    ) -> _EventPartition:
        # Part keys name the partition only and snapshots hold (topic, offset), so a recovery
        # store written for another topic is recognised instead of silently resumed.
        if resume_state is not None and resume_state[0] != self.topic:
            raise RuntimeError(
                f"step {step_id!r}: the recovery store holds offsets of Kafka topic "
                f"{resume_state[0]!r}, but the flow reads {self.topic!r}; its ledgers belong to "
                "that other input, so use a new recovery directory"
            )
        index = int(for_part.removeprefix("partition-"))
        config = consumer_config(self.settings, tail=self.tail, partitions=self.partitions)
        offset = self._resume_offset(resume_state)
        return _EventPartition(
            config, self.topic, index, offset, self.batch_size, self.stop, self.stall_seconds,
            self.topic_id(), self.caught_up,
        )  # fmt: skip


def parse_raw_batch(
    batch: RawBatch,
    *,
    streams: Iterable[str] | None = None,
    default_stream: str | None = None,
    max_bytes: int = MAX_EVENT_BYTES,
    shapes: Mapping[str, int] | None = None,
    keep_bytes: bool = False,
) -> list[EventBatch | DeadLetter]:
    """Parse a poll's messages; an empty message (or tombstone) is a ``malformed_json`` dead
    letter rather than silently skipped. Every ``EventBatch`` carries the poll's topic and
    partition and each row's offset and length; every dead letter the topic, partition and
    offset of its message. Each message is judged on its own (its stream's value shape from
    ``shapes``), whatever else the poll holds; only message values are read (keys and headers
    are not).

    The batches hold columns, not the messages' bytes (``keep_bytes``: they do, for a step of
    the same process that still makes dead letters of whole rows), so what crosses to the
    process owning a stream is its columns: a dead letter decided there carries where its
    message is and its parsed fields (``EventBatch.row_line``), and the bytes stay on the
    input topic. Dead letters decided here carry the bytes."""
    values = batch.values
    fast = parse_json_batch(values, streams=streams, max_bytes=max_bytes, shapes=shapes)
    if fast is not None:  # the usual poll: no blank message (those fail the fast path)
        return _from_poll(fast, batch, None, keep_bytes)
    empty = [i for i, v in enumerate(values) if not line_text(v).strip()]  # as the parser sees
    skip = set(empty)
    kept = [i for i in range(len(values)) if i not in skip]
    parsed = parse_json_lines(
        [values[i] for i in kept],
        streams=streams,
        default_stream=default_stream,
        max_bytes=max_bytes,
        shapes=shapes,
    )
    dead = [DeadLetter(MALFORMED, None, values[i].decode("utf-8", "replace"), "empty message",
                       values[i] or None, batch.topic, batch.partition, batch.offset(i))
            for i in empty]  # fmt: skip
    located = _located(parsed, batch, kept)
    return _from_poll(located, batch, np.asarray(kept, dtype=np.int64), keep_bytes) + list(dead)


def _located(
    parsed: list[EventBatch | DeadLetter], batch: RawBatch, kept: Sequence[int]
) -> list[EventBatch | DeadLetter]:
    """Stamp every dead letter of ``parsed`` with the coordinates of its message.

    The parser gives at most one dead letter per message, in message order, carrying that
    message's exact bytes, and the same bytes always meet the same fate: so each dead letter is
    the next message (of ``kept``, indices into ``batch.values``) with its bytes."""
    out: list[EventBatch | DeadLetter] = []
    values, j = batch.values, 0
    for item in parsed:
        if isinstance(item, DeadLetter):
            raw, k = item.payload_bytes(), j
            while k < len(kept) and values[kept[k]] != raw:
                k += 1
            if k < len(kept):
                offset = batch.offset(kept[k])
                item = replace(item, topic=batch.topic, partition=batch.partition, offset=offset)
                j = k + 1
        out.append(item)
    return out


def _from_poll(
    parsed: list[EventBatch | DeadLetter],
    batch: RawBatch,
    kept: NDArray[np.int64] | None,
    keep_bytes: bool,
) -> list[EventBatch | DeadLetter]:
    """Stamp the poll's topic and partition on the parsed batches (the parser knows neither),
    and each row's offset and length (``kept``: the messages the parser read, None: all);
    their bytes only with ``keep_bytes``."""
    values, sizes = batch.values, None
    offsets = None if batch.offsets is None else np.asarray(batch.offsets, dtype=np.int64)
    out: list[EventBatch | DeadLetter] = []
    for item in parsed:
        if isinstance(item, EventBatch):
            assert item.lines is not None  # (the parsers number every row's line)
            index = item.lines if kept is None else kept[item.lines]
            lengths = item.lengths  # (the fast path measured them)
            if lengths is None:
                if sizes is None:
                    sizes = np.fromiter(map(len, values), dtype=np.int32, count=len(values))
                lengths = sizes[index]
            item = replace(
                item, partition=batch.partition, topic=batch.topic, lines=None,
                offsets=batch.first_offset + index if offsets is None else offsets[index],
                lengths=lengths, raw=item.raw if keep_bytes else None,
            )  # fmt: skip
        out.append(item)
    return out


class SlotRecord(Protocol):
    """A release, ledger entry or halt record: one stream, mechanism and slot."""

    @property
    def stream(self) -> str: ...

    @property
    def mechanism(self) -> str: ...

    @property
    def slot(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


def record_message(record: SlotRecord) -> KafkaSinkMessage[bytes, bytes]:
    """A release, ledger entry, halt or extra-output record keyed by its release id
    (``stream/mechanism/slot``, with a release's key parts where its family declares some:
    ``schema.keys.release_id``), its value canonical JSON."""
    parts = (value for _name, value in getattr(record, "key", ()))
    key = release_id(record.stream, record.mechanism, record.slot, *parts)
    return KafkaSinkMessage(key.encode(), to_json(record).encode())


DEAD_LETTER_REASON_HEADER: Final = "privstream-reason"
DEAD_LETTER_DETAIL_HEADER: Final = "privstream-detail"
DEAD_LETTER_STREAM_HEADER: Final = "privstream-stream"
DEAD_LETTER_LENGTH_HEADER: Final = "privstream-original-length"
DEAD_LETTER_SHA256_HEADER: Final = "privstream-original-sha256"
DEAD_LETTER_TRUNCATED_HEADER: Final = "privstream-truncated"
DEAD_LETTER_TOPIC_HEADER: Final = "privstream-source-topic"
DEAD_LETTER_PARTITION_HEADER: Final = "privstream-source-partition"
DEAD_LETTER_OFFSET_HEADER: Final = "privstream-source-offset"
DEAD_LETTER_PAYLOAD_HEADER: Final = "privstream-payload"
"""Only on a dead letter whose value is the input's parsed fields (``PAYLOAD_FIELDS``), not its
bytes: one decided by a stream's owner after the batch crossed to it (issue 26)."""
PAYLOAD_FIELDS: Final = b"fields"
DEAD_LETTER_MAX_PAYLOAD: Final = MAX_EVENT_BYTES
"""A dead letter carries its input whole up to this many bytes (64 KiB) ..."""
DEAD_LETTER_PREFIX: Final = 4096
"""... and a longer input as its first 4 KiB (the headers say where the whole one is)."""
DEAD_LETTER_HEADER_BYTES: Final = 256
"""Every header value is cut to this many bytes (at a UTF-8 character boundary)."""


def _header(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) <= DEAD_LETTER_HEADER_BYTES:
        return data
    return data[:DEAD_LETTER_HEADER_BYTES].decode("utf-8", "ignore").encode("utf-8")


def dead_letter_message(letter: DeadLetter) -> KafkaSinkMessage[bytes | None, bytes]:
    """A dead letter as a message that any broker accepts, whatever the input was.

    The value is the input's bytes — whole up to ``DEAD_LETTER_MAX_PAYLOAD``, else its first
    ``DEAD_LETTER_PREFIX`` bytes — so the message stays below 70 KiB. Headers (each value at
    most ``DEAD_LETTER_HEADER_BYTES``): reason, detail, stream (when known), the input's
    length and SHA-256, whether the value is cut, and the input's source topic, partition and
    offset when the parser knew them.

    A ``located`` letter (decided by a stream's owner, away from the input's bytes) has the
    input's parsed fields as its value (JSON; cut the same way) and ``privstream-payload:
    fields``; its length header is the input's, it has no SHA-256 header (the bytes stayed on
    the input topic, at the source headers' topic, partition and offset).
    """
    payload = letter.payload_bytes()
    cut = len(payload) > DEAD_LETTER_MAX_PAYLOAD
    headers = [
        (DEAD_LETTER_REASON_HEADER, _header(letter.reason)),
        (DEAD_LETTER_DETAIL_HEADER, _header(letter.detail)),
    ]
    if letter.stream is not None:
        headers.append((DEAD_LETTER_STREAM_HEADER, _header(letter.stream)))
    if letter.located:
        headers += [
            (DEAD_LETTER_PAYLOAD_HEADER, PAYLOAD_FIELDS),
            (DEAD_LETTER_LENGTH_HEADER, str(letter.original_length).encode()),
        ]
    else:
        headers += [
            (DEAD_LETTER_LENGTH_HEADER, str(len(payload)).encode()),
            (DEAD_LETTER_SHA256_HEADER, hashlib.sha256(payload).hexdigest().encode()),
        ]
    headers.append((DEAD_LETTER_TRUNCATED_HEADER, b"true" if cut else b"false"))
    if letter.topic is not None:
        headers += [
            (DEAD_LETTER_TOPIC_HEADER, _header(letter.topic)),
            (DEAD_LETTER_PARTITION_HEADER, str(letter.partition).encode()),
            (DEAD_LETTER_OFFSET_HEADER, str(letter.offset).encode()),
        ]
    return KafkaSinkMessage(None, payload[:DEAD_LETTER_PREFIX] if cut else payload, headers=headers)


def wait_for_messages(
    settings: KafkaSettings,
    topic: str,
    predicate: Callable[[list[Any]], bool],
    timeout: float = 60.0,
) -> list[Any]:
    """Read ``topic`` from the beginning until ``predicate(messages)`` holds (tests, demo).

    Returns confluent-kafka ``Message`` objects; ``TimeoutError`` when it never holds.
    """
    partitions = require_topics(settings, [topic])[topic]
    consumer = Consumer(
        settings.client_config(**{"group.id": "privstream-reader", "enable.auto.commit": "false"})
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while not predicate(messages):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(messages)} messages on {topic!r} after {timeout} s")
            for message in consumer.consume(10_000, 0.2):
                if message.error() is None:
                    messages.append(message)
    finally:
        consumer.close()
    return messages


def read_until_idle(
    settings: KafkaSettings, topics: Sequence[str], idle_seconds: float = 2.0
) -> Iterator[list[Any]]:
    """Every partition of ``topics`` from its beginning, in batches of confluent-kafka
    ``Message`` objects, until no message has arrived for ``idle_seconds`` (the tools' one
    reader: ``privstream audit`` and ``privstream consume``).

    No consumer group: the partitions are assigned (a group consumer waits for a rebalance, about
    23 s on the embedded broker), and the end of a topic is not asked of the broker (Tansu 0.6's
    high watermarks are wrong). A missing topic is ``TopicMissing`` (never created); a retriable
    error is skipped, any other is ``ConnectionError``. Closing the generator (``break``)
    closes the consumer."""
    partitions = require_topics(settings, topics)
    consumer = Consumer(consumer_config(settings, tail=True))  # no partition-EOF events
    consumer.assign(
        [TopicPartition(t, p, OFFSET_BEGINNING) for t, n in partitions.items() for p in range(n)]
    )
    quiet_since = time.monotonic()
    try:
        while time.monotonic() - quiet_since < idle_seconds:
            messages = consumer.consume(10_000, min(0.5, idle_seconds))
            if messages:
                quiet_since = time.monotonic()
            yield [m for m in messages if _readable(m)]
    finally:
        consumer.close()


def _readable(message: Any) -> bool:
    """False for a retriable error (skipped); ``ConnectionError`` for any other."""
    error = message.error()
    if error is None:
        return True
    if not error.retriable():
        raise ConnectionError(f"cannot read topic {message.topic()!r}: {error.str()}")
    return False
