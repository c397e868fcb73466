"""``privstream shuffler``: the shuffle model's middle party (issue 25), its own process.

It reads the devices' report topic (and the server's task topic, to learn the public tasks),
keeps the reports of every open block in its ``ShuffleBook``, and when an authenticated
end-of-slot marker has closed a block on every partition, forwards the block's ``Batch`` —
counts and manifest, no identifier — to the shuffled topic. Only it sees who sent what.

**Crash safety.** After each poll it forwards the batches the poll closed (in one Kafka
transaction where the cluster honours them), waits for their delivery, and only then saves its
own store (the book and the consumed offsets, written atomically). A crash before the save
re-reads the same messages and re-forms the same batches: byte-identical records under the same
key (``stream/horizon/level/block``), so a reader keeping one record per key — the server does —
never counts a report twice, and none is lost (``tests/integration/test_shuffler_kafka.py``
kills it at random moments).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from privstream.connectors.kafka import KafkaSettings, consumer_config, require_topics
from privstream.runtime.shuffle_book import ShuffleBook
from privstream.runtime.shuffle_reports import ReportShuffleBook
from privstream.runtime.shuffler_metrics import MALFORMED, UNAUTHENTICATED, ShufflerMetrics
from privstream.schema.events import marker_authentic
from privstream.schema.protocol import (
    CLOSE_TYPE,
    REQUEST_TYPE,
    Close,
    ProtocolError,
    decode_message,
    decode_request,
)
from privstream.schema.protocol import (
    REPORT_TYPE as REQUEST_REPORT,
)
from privstream.schema.shuffle import Sao2Report, Sao2Task

log = logging.getLogger("privstream.shuffler")
Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class ShufflerConfig:
    """The shuffler's own configuration (its trust domain: nothing here is the server's)."""

    settings: KafkaSettings
    report_topic: str
    task_topic: str
    shuffled_topic: str
    store: Path
    clock_key: bytes
    shuffler_id: str = "shuffler-1"
    dead_letter_topic: str | None = None
    policy: str = "drop"
    n_min: int | None = None
    delta: float = 1e-5
    idle_seconds: float | None = None
    transactional: bool = True

    def __post_init__(self) -> None:
        topics = {self.report_topic, self.task_topic, self.shuffled_topic}
        if len(topics) != 3 or self.dead_letter_topic in topics:
            raise ValueError("the report, task, shuffled and dead-letter topics must differ")


class ShufflerStore:
    """The shuffler's recovery store: one file holding the book and the consumed offsets,
    replaced atomically (write, fsync, rename) so a crash leaves the old or the new one."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "shuffler.state"

    def load(self) -> tuple[Books, Offsets] | None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            book, offsets = pickle.load(f)  # the shuffler's own store
        return book, offsets

    def save(self, book: Books, offsets: Offsets) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump((book, offsets), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


@dataclass
class Books:
    """The shuffler's two books: SaO2's blocks and ``ldp-reports`` rounds."""

    sao2: ShuffleBook
    rounds: ReportShuffleBook

    def has_task(self, task: str) -> bool:
        return task in self.sao2.tasks or task in self.rounds.requests


@dataclass
class Poll:
    """What one poll produced: records to forward (``Batch``, ``ReportBatch``, ``Close``) and
    dead letters (reason, raw value)."""

    batches: list[Any]
    dead: list[tuple[str, bytes]]


def take(books: Books, clock_key: bytes, topic: str, task_topic: str, partition: int,
         value: bytes, out: Poll, metrics: ShufflerMetrics) -> None:  # fmt: skip
    """One message into the books: a task or request, an authenticated marker (closing blocks
    or rounds), a report, or a dead letter with its reason. Every refusal is counted by its
    reason (``privstream_shuffler_refused_total``), forged markers and malformed messages
    included."""

    def refuse(reason: str) -> None:
        metrics.report(reason)
        out.dead.append((reason, value))

    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        refuse(MALFORMED)
        return
    kind = obj.get("type") if isinstance(obj, dict) else None
    try:
        if topic == task_topic:
            _task(books, kind, obj, value)
        elif isinstance(obj, dict) and "end_of_slot" in obj:
            if not _marker(books.sao2, clock_key, partition, obj, out):
                refuse(UNAUTHENTICATED)
        elif kind in (CLOSE_TYPE, REQUEST_REPORT):
            _judged(_round_message(books.rounds, clock_key, partition, value, out), refuse, metrics)
        else:
            _judged(books.sao2.take_report(partition, Sao2Report.from_obj(obj)), refuse, metrics)
    except ProtocolError as exc:
        refuse(exc.reason)


def _judged(why: str | None, refuse: Callable[[str], None], metrics: ShufflerMetrics) -> None:
    """A report kept (counted) or refused (counted by reason, dead-lettered)."""
    if why is None:
        metrics.report(None)
    else:
        refuse(why)


def _task(books: Books, kind: Any, obj: Any, value: bytes) -> None:
    if kind == REQUEST_TYPE:
        books.rounds.add_request(decode_request(value))
    else:
        books.sao2.add_task(Sao2Task.from_obj(obj))


def _round_message(rounds: ReportShuffleBook, clock_key: bytes, partition: int, value: bytes,
                   out: Poll) -> str | None:  # fmt: skip
    """An ``ldp-reports`` report or round marker; the refusal's reason, or None."""
    message = decode_message(value)
    if isinstance(message, Close):
        if not message.authentic(clock_key):
            return UNAUTHENTICATED
        out.batches.extend(rounds.take_marker(partition, message))
        return None
    return rounds.take_report(partition, message)


def _marker(book: ShuffleBook, clock_key: bytes, partition: int, obj: dict[str, Any],
            out: Poll) -> bool:  # fmt: skip
    """Close what an authentic marker ends; False when the marker is not authentic."""
    stream, slot = obj.get("stream"), obj.get("end_of_slot")
    if not (isinstance(stream, str) and isinstance(slot, int) and not isinstance(slot, bool)
            and marker_authentic(clock_key, stream, slot, obj.get("tag"))):  # fmt: skip
        return False
    out.batches.extend(book.take_marker(partition, stream, slot))
    return True


def record_key(record: Any) -> str:
    """A forwarded record's Kafka key: its block or request (a marker: its stream)."""
    return str(record.stream if isinstance(record, Close) else record.key)


def _unknown(books: Books, value: bytes) -> bool:
    """Whether a report names a task or request the books have not read (a cheap look)."""
    try:
        obj = json.loads(value)
        task = obj.get("task", obj.get("request"))
    except (ValueError, AttributeError, RecursionError):
        return False
    return isinstance(task, str) and not books.has_task(task)


class Shuffler:
    """The running shuffler: a consumer over the report and task topics, a producer of the
    shuffled topic, its book and store (``run`` until ``stop()`` or ``idle_seconds``)."""

    def __init__(self, config: ShufflerConfig, metrics: ShufflerMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or ShufflerMetrics()
        found = require_topics(config.settings, [config.report_topic, config.task_topic,
                                                 config.shuffled_topic])  # fmt: skip
        self.partitions = {t: found[t] for t in (config.report_topic, config.task_topic)}
        self.store = ShufflerStore(config.store)
        loaded = self.store.load()
        parts = found[config.report_topic]
        fresh = Books(ShuffleBook(config.shuffler_id, parts, config.policy, config.delta, config.n_min),
                      ReportShuffleBook(config.shuffler_id, parts, config.policy, config.delta,
                                        config.n_min))  # fmt: skip
        self.books, self.offsets = loaded if loaded is not None else (fresh, {})
        self._stopped = False
        self._tasks: Consumer

    def stop(self) -> None:
        self._stopped = True

    def run(self, on_poll: Callable[[Poll], None] | None = None) -> None:
        consumer = self._consumer(self.config.report_topic)
        self._tasks = self._consumer(self.config.task_topic)
        producer = self._producer()
        last = time.monotonic()
        try:
            while not self._stopped:
                self._drain_tasks()
                messages = consumer.consume(1000, timeout=0.5)
                if not messages:
                    if (
                        self.config.idle_seconds is not None
                        and time.monotonic() - last > self.config.idle_seconds
                    ):
                        break
                    continue
                last = time.monotonic()
                poll = self._poll(messages)
                self._forward(producer, poll)
                self.store.save(self.books, self.offsets)
                self.metrics.open_blocks(len(self.books.sao2.open) + len(self.books.rounds.reports))
                if on_poll is not None:
                    on_poll(poll)
        finally:
            consumer.close()
            self._tasks.close()

    def _consumer(self, topic: str) -> Consumer:
        count = self.partitions[topic]
        consumer = Consumer(consumer_config(self.config.settings, partitions=count))
        consumer.assign([
            TopicPartition(topic, p, self.offsets.get((topic, p), OFFSET_BEGINNING))
            for p in range(count)
        ])  # fmt: skip
        return consumer

    def _drain_tasks(self, wait: float = 0.2) -> None:
        """Read every task published so far (before the reports that may answer them): until a
        poll of ``wait`` seconds finds nothing more."""
        while messages := self._tasks.consume(100, timeout=wait):
            for m in messages:
                if m.error() is not None:
                    raise KafkaException(m.error())
                try:
                    value = m.value() or b""
                    _task(self.books, json.loads(value).get("type"), json.loads(value), value)
                except (ProtocolError, ValueError, AttributeError) as exc:
                    log.warning("task topic: a message that is no task (%s)", type(exc).__name__)
                self._consumed(m)

    def _consumed(self, m: Any) -> None:
        """Record ``m`` as consumed (the next offset to read after a restart)."""
        self.offsets[(str(m.topic()), int(m.partition()))] = int(m.offset()) + 1

    def _producer(self) -> Producer:
        extra: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}
        if self.config.transactional:
            extra["transactional.id"] = f"privstream-shuffler-{self.config.shuffler_id}"
        producer = Producer(self.config.settings.client_config(**extra))
        if self.config.transactional:
            producer.init_transactions(30)  # fences a previous incarnation's open transaction
        return producer

    def _poll(self, messages: list[Any]) -> Poll:
        poll = Poll([], [])
        for m in messages:
            if m.error() is not None:
                raise KafkaException(m.error())
            value = m.value() or b""
            if b'"type":"privstream.' in value and _unknown(self.books, value):
                self._drain_tasks(2.0)  # a device answered a task this shuffler has not read
            take(self.books, self.config.clock_key, m.topic(), self.config.task_topic,
                 m.partition(), value, poll, self.metrics)  # fmt: skip
            self._consumed(m)
        return poll

    def _forward(self, producer: Producer, poll: Poll) -> None:
        """The poll's batches (and dead letters) in one transaction, delivery confirmed."""
        if not poll.batches and not poll.dead:
            return
        if self.config.transactional:
            producer.begin_transaction()
        for record in poll.batches:
            producer.produce(self.config.shuffled_topic, key=record_key(record).encode(),
                             value=record.to_json().encode())  # fmt: skip
            if not isinstance(record, Close):
                self.metrics.batch(record)
        if self.config.dead_letter_topic:
            for reason, value in poll.dead:
                producer.produce(self.config.dead_letter_topic, key=reason.encode(), value=value)
        if self.config.transactional:
            producer.commit_transaction(60)
        elif producer.flush(60) > 0:
            raise KafkaException("the shuffled topic did not confirm a batch within 60 s")


def run_shuffler(config: ShufflerConfig, metrics: ShufflerMetrics | None = None) -> Shuffler:
    """Run a shuffler until it is stopped or idle; returns it (its book and metrics)."""
    shuffler = Shuffler(config, metrics)
    log.info("shuffler %s: reports %s → batches %s", config.shuffler_id, config.report_topic,
             config.shuffled_topic)  # fmt: skip
    shuffler.run()
    return shuffler
