"""privstream's Kafka sink: every output message is delivered, or the run fails
(docs/kafka.md, "Crash safety"; Bytewax's ``KafkaSink`` never looks at delivery reports, so a
timed-out release was dropped while the epoch was acknowledged).

``KafkaTopicSink`` is a Bytewax ``DynamicSink`` on a ``confluent-kafka`` ``Producer`` with
``enable.idempotence=true``, ``acks=all`` and ``allow.auto.create.topics=false``. Every
``write_batch`` produces its messages and polls until each one's delivery report has arrived
(bounded by ``message.timeout.ms`` plus a margin); ``DeferredKafkaTopicSink`` (what
``kafka_output`` uses for releases, ledger entries and requests) sends at once and waits for
the epoch's reports in its ``snapshot``, so that an epoch is recorded only once delivered. Failed or unreported messages are produced
again after a backoff (``retries`` times, doubling from ``backoff`` seconds; errors no retry can
fix, such as ``MSG_SIZE_TOO_LARGE``, are not retried). A retry uses a fresh producer: after a
timeout the idempotent producer bumps its epoch, and a broker may fence it for good (Tansu
answers ``PRODUCER_FENCED`` to every later message of that producer). Then:

* **strict** (releases, ledger entries): what still failed raises ``DeliveryFailed``, so the
  Bytewax epoch fails and a restart from the recovery store replays it — nothing is ever
  acknowledged undelivered (duplicates are possible: consumers drop them by key);
* **best effort** (dead letters): what still failed is logged with its reason and the Kafka
  error (never its payload) and counted in
  ``privstream_internal_dead_letters_undeliverable_total``; the flow goes on.

A topic that is gone raises ``TopicMissing`` in both modes: after an attempt that failed with an
unknown topic, after every delivered batch (some brokers, Tansu among them, accept messages for
a topic deleted a moment ago), and from the process-wide fault a probe found
(``kafka_health``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.dataflow import Stream, operator
from bytewax.outputs import (
    DynamicSink,
    FixedPartitionedSink,
    StatefulSinkPartition,
    StatelessSinkPartition,
)
from confluent_kafka import KafkaError, KafkaException, Producer

from privstream.connectors.kafka import DEAD_LETTER_REASON_HEADER, KafkaSettings
from privstream.connectors.kafka_health import (
    DEAD_LETTERS_UNDELIVERABLE,
    DEFAULT_STALL_SECONDS,
    SINK,
    ClientHealth,
    Probe,
    cluster_name,
    raise_if_failed,
    topic_exists,
)

log = logging.getLogger(__name__)

Message = KafkaSinkMessage[Any, Any]
ProducerFactory = Callable[[dict[str, Any]], Any]

DEFAULT_MESSAGE_TIMEOUT_MS: Final = 300_000  # librdkafka's message.timeout.ms
REPORT_MARGIN_S: Final = 5.0  # beyond message.timeout.ms, before a missing report is a failure
# Errors that a retry cannot fix: the message itself, or the permission to write it.
PERMANENT: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._INVALID_ARG,
    }
)
_DOWN: Final = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE)
_NO_TOPIC: Final = (
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
)
CHECK_TIMEOUT_S: Final = 2.0  # an inline existence check; unanswered, it proves nothing


class DeliveryFailed(RuntimeError):
    """Releases or ledger entries could not be delivered: the epoch must not be acknowledged."""


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """The sink's producer: the cluster's properties, then what the sink's guarantees need
    (these win over the properties)."""
    return settings.client_config(
        **{
            "enable.idempotence": "true",
            "acks": "all",
            "allow.auto.create.topics": "false",
        }
    )


def report_timeout(config: dict[str, Any]) -> float:
    """Seconds to wait for a batch's delivery reports: librdkafka reports every message within
    ``message.timeout.ms`` (alias ``delivery.timeout.ms``) of producing it; plus a margin."""
    ms = config.get("message.timeout.ms", config.get("delivery.timeout.ms"))
    return float(ms if ms is not None else DEFAULT_MESSAGE_TIMEOUT_MS) / 1000 + REPORT_MARGIN_S


class _Attempt:
    """The delivery reports of one attempt: which messages failed, how many arrived."""

    def __init__(self, size: int = 0) -> None:
        self.pending = set(range(size))
        self.failed: dict[int, KafkaError] = {}
        self.delivered = 0
        self.size = size

    def add(self) -> int:
        """The index of one more message, awaiting its report."""
        index, self.size = self.size, self.size + 1
        self.pending.add(index)
        return index

    def report(self, index: int, err: KafkaError | None, _msg: Any) -> None:
        if index not in self.pending:
            return  # a late report of a message already given up on
        self.pending.discard(index)
        if err is None:
            self.delivered += 1
        else:
            self.failed[index] = err

    def refuse(self, index: int, err: KafkaError) -> None:
        self.report(index, err, None)


@dataclass
class Sent:
    """Messages handed to librdkafka since the last wait, and their delivery reports."""

    messages: list[Message] = field(default_factory=list)
    attempt: _Attempt = field(default_factory=_Attempt)


def _permanent(err: KafkaError) -> bool:
    return err.code() in PERMANENT


class _SinkPartition(StatelessSinkPartition[Message]):
    """One worker's producer for one topic; see the module docstring for the guarantees."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        *,
        best_effort: bool,
        retries: int,
        backoff: float,
        stall_seconds: float,
        make_producer: ProducerFactory = Producer,
    ) -> None:
        self._config = {**config, "error_cb": self._on_error}
        self._make_producer = make_producer
        self._producer = make_producer(self._config)
        self._topic = topic
        self._best_effort = best_effort
        self._retries = retries
        self._backoff = backoff
        self._wait = report_timeout(config)
        self.health = ClientHealth(SINK, topic, stall_seconds)
        self._probe = Probe(self.health, self._exists, cluster_name(config)).start()

    def _exists(self, timeout: float) -> bool:
        return topic_exists(self._producer, self._topic, timeout)  # the producer of the moment

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb`` (served by ``poll``): connectivity and fatal errors (the
        next retry replaces a producer that had one)."""
        if err.fatal():
            log.error("Kafka producer for topic %r: fatal error: %s", self._topic, err.str())
        elif err.code() in _DOWN:
            self.health.unreachable(err.str())

    def write_batch(self, items: list[Message]) -> None:
        """Deliver ``items``: return once every one is delivered (best effort: or given up on,
        logged and counted); raise ``DeliveryFailed`` or ``TopicMissing`` otherwise."""
        raise_if_failed()
        if items:
            self.deliver(list(items))

    def send(self, items: Sequence[Message], sent: Sent) -> None:
        """Hand ``items`` to librdkafka without waiting for their reports, which ``sent``
        collects; ``deliver(sent.messages, sent.attempt)`` waits for them
        (``DeferredKafkaTopicSink``)."""
        raise_if_failed()
        for message in items:
            self._produce(sent.attempt, sent.attempt.add(), message)
            sent.messages.append(message)
        self._producer.poll(0)  # serve the reports that have arrived

    def deliver(self, todo: list[Message], started: _Attempt | None = None) -> None:
        """Deliver ``todo``, retrying what fails (module docstring); ``started``: its first
        attempt is under way (``send``), only its reports are awaited."""
        if not todo:
            return
        self.health.waiting(len(todo))
        try:
            for attempt in range(self._retries + 1):
                if attempt:
                    self._pause(attempt, todo)
                    raise_if_failed()
                if attempt == 0 and started is not None:
                    failed = self._await(started, todo)
                else:
                    failed = self._attempt(todo)
                if not failed:
                    break
                if any(err.code() in _NO_TOPIC for _m, err in failed):
                    self._probe.require(CHECK_TIMEOUT_S)
                last = attempt == self._retries
                todo = [m for m, err in failed if not (last or _permanent(err))]
                dropped = [(m, err) for m, err in failed if last or _permanent(err)]
                if dropped:
                    self._give_up(dropped, attempt + 1)
                if not todo:
                    break
                self.health.waiting(len(todo))
        finally:
            self.health.waiting(0)
        self._probe.require(CHECK_TIMEOUT_S)

    def _pause(self, attempt: int, todo: Sequence[Message]) -> None:
        delay = self._backoff * 2 ** (attempt - 1)
        log.warning(
            "Kafka topic %r: retrying %d message(s) in %.1f s (attempt %d of %d)",
            self._topic, len(todo), delay, attempt + 1, self._retries + 1,
        )  # fmt: skip
        time.sleep(delay)  # a backoff, not a synchronisation: nothing to wait for but time
        old, self._producer = self._producer, self._make_producer(self._config)
        with contextlib.suppress(KafkaException):  # what it holds is sent again by the new one
            old.purge()

    def _attempt(self, messages: Sequence[Message]) -> list[tuple[Message, KafkaError]]:
        """Produce ``messages`` and wait for their reports; the failed ones with their error
        (a message without a report in time fails with ``_TIMED_OUT``)."""
        attempt = _Attempt(len(messages))
        for index, message in enumerate(messages):
            self._produce(attempt, index, message)
        return self._await(attempt, messages)

    def _await(
        self, attempt: _Attempt, messages: Sequence[Message]
    ) -> list[tuple[Message, KafkaError]]:
        """Wait for ``attempt``'s reports; the failed messages with their error."""
        deadline, delivered = time.monotonic() + self._wait, 0
        while attempt.pending and (left := deadline - time.monotonic()) > 0:
            self._producer.flush(min(left, 0.1))  # sends at once (no linger.ms), serves reports
            if attempt.delivered > delivered:
                delivered = attempt.delivered
                self.health.progressed()
        for index in sorted(attempt.pending):
            attempt.refuse(index, KafkaError(KafkaError._TIMED_OUT, "no delivery report"))
        return [(messages[i], err) for i, err in sorted(attempt.failed.items())]

    def _produce(self, attempt: _Attempt, index: int, message: Message) -> None:
        """Hand one message to librdkafka (waiting while its queue is full); a message it
        refuses at once (too large, unknown topic) fails with librdkafka's error; one it cannot
        queue within the report wait fails with ``_QUEUE_FULL``."""
        deadline = time.monotonic() + self._wait
        while True:
            try:
                self._producer.produce(
                    message.topic or self._topic,
                    value=message.value,
                    key=message.key,
                    headers=message.headers,
                    on_delivery=functools.partial(attempt.report, index),
                )
                return
            except BufferError:
                if time.monotonic() > deadline:
                    attempt.refuse(index, KafkaError(KafkaError._QUEUE_FULL))
                    return
                self._producer.poll(0.1)
            except KafkaException as exc:
                attempt.refuse(index, exc.args[0])
                return

    def _give_up(self, dropped: list[tuple[Message, KafkaError]], attempts: int) -> None:
        errors = Counter(f"{err.name()} ({err.str()})" for _m, err in dropped)
        why = "; ".join(f"{n} × {text}" for text, n in errors.most_common())
        if not self._best_effort:
            raise DeliveryFailed(
                f"could not deliver {len(dropped)} message(s) to Kafka topic {self._topic!r} "
                f"after {attempts} attempt(s): {why}. Nothing of this epoch is acknowledged: "
                "restart with the same --recovery-dir once the cause is fixed to resend it"
            )
        reasons = Counter(_reason(m) for m, _err in dropped)
        DEAD_LETTERS_UNDELIVERABLE.inc(len(dropped))
        log.error(
            "%d dead letter(s) (%s) could not be written to Kafka topic %r: %s",
            len(dropped), ", ".join(f"{n} {r}" for r, n in reasons.most_common()),
            self._topic, why,
        )  # fmt: skip

    def close(self) -> None:
        self._probe.stop()
        self._producer.flush(self._wait)
        # Drop the client now: its delivery callbacks refer back to this sink, so the cycle would
        # wait for the garbage collector, and the client would go on connecting (and logging)
        # after the run, e.g. to a broker the demo has already stopped.
        self._producer = None


def _reason(message: Message) -> str:
    for key, value in message.headers or ():
        if key == DEAD_LETTER_REASON_HEADER:
            return bytes(value).decode("utf-8", "replace")
    return "unknown reason"


class KafkaTopicSink(DynamicSink[Message]):
    """Write ``KafkaSinkMessage`` items to ``topic``, delivered or failed loudly.

    Args:
        settings: cluster and client properties (``message.timeout.ms`` bounds each attempt).
        topic: the topic; it must exist (the sink never creates it).
        best_effort: log and count what cannot be delivered instead of raising (dead letters).
        retries: attempts after the first for failed or unreported messages.
        backoff: seconds before the first retry, doubling with each.
        stall_seconds: warn once messages have waited this long without a delivery.
        make_producer: the producer class (tests pass a fake).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        best_effort: bool = False,
        retries: int = 3,
        backoff: float = 0.5,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        make_producer: ProducerFactory = Producer,
    ) -> None:
        if retries < 0 or backoff < 0:
            raise ValueError("retries and backoff must be >= 0")
        self.settings, self.topic = settings, topic
        self.best_effort, self.retries, self.backoff = best_effort, retries, backoff
        self.stall_seconds = stall_seconds
        self.make_producer = make_producer

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _SinkPartition:
        return _SinkPartition(
            producer_config(self.settings),
            self.topic,
            best_effort=self.best_effort,
            retries=self.retries,
            backoff=self.backoff,
            stall_seconds=self.stall_seconds,
            make_producer=self.make_producer,
        )


_EPOCH_FAILURE: Callable[[Exception], None] | None = None


def on_epoch_failure(handler: Callable[[Exception], None] | None) -> None:
    """Call ``handler`` with what failed an epoch's delivery (``DeliveryFailed``,
    ``TopicMissing``) before it is raised: Bytewax 0.21 aborts on an exception from a snapshot,
    so a runner that wants its own exit code and message ends the process here
    (``runtime.runner``)."""
    global _EPOCH_FAILURE
    _EPOCH_FAILURE = handler


class _DeferredPartition(StatefulSinkPartition[Message, None]):
    """A ``_SinkPartition`` that waits for delivery at the epoch's end, not per batch: its
    ``snapshot`` returns only once everything written in the epoch is delivered (or raises
    ``DeliveryFailed``), so an epoch is never recorded as done with a release undelivered,
    and a restart replays it."""

    def __init__(self, sink: _SinkPartition) -> None:
        self._sink = sink
        self._sent = Sent()

    def write_batch(self, values: list[Message]) -> None:
        self._sink.send(values, self._sent)

    def snapshot(self) -> None:
        """Return once the epoch's messages are delivered. A failure is logged, handed to the
        ``on_epoch_failure`` handler, then raised: Bytewax 0.21 cannot fail a snapshot cleanly
        (it aborts the process with a panic), and either way the epoch is never recorded."""
        sent, self._sent = self._sent, Sent()
        try:
            self._sink.deliver(sent.messages, sent.attempt)
        except Exception as exc:
            log.critical("stopping before this epoch is recorded as done: %s", exc)
            if _EPOCH_FAILURE is not None:
                _EPOCH_FAILURE(exc)
            raise

    def close(self) -> None:
        self.snapshot()
        self._sink.close()


class DeferredKafkaTopicSink(FixedPartitionedSink[Message, None]):
    """``KafkaTopicSink``'s guarantees with the wait for delivery reports moved from every
    batch to the end of each epoch (issue 26: the release sink's per-batch wait was 0.18–0.20 s
    of a 3.3 s benchmark run). Items are ``(key, message)``; one partition, on one worker,
    writes them all (a release per slot and mechanism: the exchange is small)."""

    PART: Final = "0"

    def __init__(self, sink: KafkaTopicSink) -> None:
        self.sink = sink

    def list_parts(self) -> list[str]:
        return [self.PART]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _DeferredPartition:
        return _DeferredPartition(self.sink.build(step_id, 0, 1))


@operator
def kafka_output(
    step_id: str,
    up: Stream[Any],
    settings: KafkaSettings,
    topic: str,
    to_message: Callable[[Any], Message],
    *,
    best_effort: bool = False,
    stall_seconds: float = DEFAULT_STALL_SECONDS,
) -> None:
    """Write every item of ``up`` to ``topic`` through a ``KafkaTopicSink`` (at-least-once:
    delivered before the epoch is acknowledged, waiting for the reports at the epoch's end;
    ``best_effort`` for dead letters, each batch delivered or given up on before the next)."""
    messages = op.map("to_message", up, to_message)
    sink = KafkaTopicSink(settings, topic, best_effort=best_effort, stall_seconds=stall_seconds)
    if best_effort:
        op.output("kafka", messages, sink)
        return
    keyed = op.key_on("to_part", messages, lambda _m: DeferredKafkaTopicSink.PART)
    op.output("kafka", keyed, DeferredKafkaTopicSink(sink))
