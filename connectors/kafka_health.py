"""Connectivity, progress and stall warnings of a flow's Kafka clients (docs/kafka.md,
"Crash safety").

Every Kafka client of a flow — the consumer of each source partition, the producer of each
sink — has a ``ClientHealth`` and a ``Probe``: a daemon thread that asks the broker, through the
client's own connection, whether the client's topic exists (a metadata request naming the
topic, which the clients' ``allow.auto.create.topics=false`` keeps from creating it) every
``probe_interval(stall_seconds)`` seconds. From the answers and the client's own signals (a poll
that returned data, a delivered batch, librdkafka's ``error_cb``) it keeps:

* ``privstream_kafka_connected{client}`` (public): 1 while every client of that kind reaches the
  broker, 0 while one does not (a probe unanswered within its timeout, a transport error);
* ``privstream_internal_last_progress_timestamp_seconds{client}`` (internal): the Unix time of
  the last consumed batch or delivered output batch;
* ``privstream_internal_consumer_lag{topic, partition}`` (internal): messages between a source
  partition's position and the high watermark of the broker's last fetch response (librdkafka's
  cached watermark: no extra request, and right where Tansu's ListOffsets answer is not);
* a warning on the log, at most once per ``max(stall_seconds, 60)`` seconds per client, once a
  source has heard nothing from the broker for ``stall_seconds`` (no data and no answer) or a sink
  has had messages waiting for ``stall_seconds`` without a delivery; and one when it recovers;
* a process-wide fault once a probe finds the topic gone: ``raise_if_failed`` raises it as
  ``TopicMissing`` in the flow's source and sinks, so the run stops naming the topic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from prometheus_client import Counter, Gauge

from privstream.schema.exposition import INTERNAL, INTERNAL_PREFIX, PREFIX

log = logging.getLogger(__name__)

# Public: set from probes of the broker, operational state that depends on the network only.
KAFKA_CONNECTED: Final = Gauge(
    PREFIX + "kafka_connected",
    "1 while every Kafka client of this kind (client=source: the input's consumers, "
    "client=sink: the output producers) reaches the broker; 0 while one does not.",
    ["client"],
)
# Internal: the time of the last consumed batch tells when input events arrived.
LAST_PROGRESS: Final = Gauge(
    INTERNAL_PREFIX + "last_progress_timestamp_seconds",
    "Unix time of the last consumed input batch (client=source) or delivered output batch "
    "(client=sink).",
    ["client"],
    registry=INTERNAL,
)
# Internal: how many input messages wait to be read tells how many events arrive.
CONSUMER_LAG: Final = Gauge(
    INTERNAL_PREFIX + "consumer_lag",
    "Messages between a source partition's read position and its high watermark, as the "
    "broker last reported it in a fetch response (absent until it has reported one).",
    ["topic", "partition"],
    registry=INTERNAL,
)
DEAD_LETTERS_UNDELIVERABLE: Final = Counter(
    INTERNAL_PREFIX + "dead_letters_undeliverable",
    "Dead letters that could not be written to the dead-letter topic (logged by reason).",
    registry=INTERNAL,
)

SOURCE: Final = "source"
SINK: Final = "sink"
DEFAULT_STALL_SECONDS: Final = 30.0
_MISSING: Final = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


class TopicMissing(RuntimeError):
    """A topic the flow needs does not exist (privstream never auto-creates topics)."""


def topic_gone_message(topic: str, where: str) -> str:
    """What a run that lost ``topic`` mid-run says (the CLI prints it on exit)."""
    return (
        f"Kafka topic {topic!r} does not exist any more on {where} (deleted, or the broker came "
        "back without it); privstream never re-creates topics: create it again with `privstream "
        "topics create` (or restore it) and restart with the same --recovery-dir"
    )


def cluster_name(config: Mapping[str, Any]) -> str:
    """How messages name the cluster of a client with ``config``: its bootstrap servers."""
    return str(config.get("bootstrap.servers", "the cluster"))


def probe_interval(stall_seconds: float) -> float:
    """Seconds between two probes of a client (and each probe's timeout)."""
    return max(0.2, min(5.0, stall_seconds / 3))


def topic_exists(client: Any, topic: str, timeout: float) -> bool:
    """Whether ``topic`` exists, asked through ``client`` (a Consumer, Producer or AdminClient
    configured with ``allow.auto.create.topics=false``, so the request cannot create it).
    Raises ``KafkaException`` when no broker answers within ``timeout`` s."""
    metadata = client.list_topics(topic=topic, timeout=timeout)
    found = metadata.topics.get(topic)
    if found is None:
        return False
    return found.error is None or found.error.code() not in _MISSING


class _Faults:
    """The first lost topic of this process, raised by every client that checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._message: str | None = None

    def record(self, message: str) -> None:
        with self._lock:
            if self._message is None:
                self._message = message
                log.error("%s", message)

    def clear(self) -> None:
        with self._lock:
            self._message = None

    def raise_if_failed(self) -> None:
        message = self._message
        if message is not None:
            raise TopicMissing(message)


FAULTS: Final = _Faults()


def raise_if_failed() -> None:
    """Raise ``TopicMissing`` when a probe of this process found a topic gone."""
    FAULTS.raise_if_failed()


class _Registry:
    """Every live client by kind, for the connectivity gauge (1 only if all are connected)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, set[ClientHealth]] = {SOURCE: set(), SINK: set()}

    def add(self, client: ClientHealth) -> None:
        with self._lock:
            self._clients[client.role].add(client)

    def remove(self, client: ClientHealth) -> None:
        with self._lock:
            self._clients[client.role].discard(client)
        self.publish(client.role)

    def publish(self, role: str) -> None:
        with self._lock:
            states = [c.connected for c in self._clients[role] if c.connected is not None]
        if states:
            KAFKA_CONNECTED.labels(role).set(1.0 if all(states) else 0.0)


REGISTRY: Final = _Registry()


class ClientHealth:
    """The state of one Kafka client (``role`` "source" or "sink") of ``topic``.

    ``name`` says which client in the log ("partition 0"). Every method is thread-safe: the
    client's own thread reports data and deliveries, its ``Probe`` the broker's answers.
    """

    def __init__(
        self,
        role: str,
        topic: str,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be > 0, got {stall_seconds}")
        self.role, self.topic, self.name = role, topic, name
        self.stall_seconds = stall_seconds
        self.connected: bool | None = None  # unknown until the first probe or error
        self._clock = clock
        self._lock = threading.Lock()
        self._alive_at = clock()  # the broker last answered (probe, data or delivery)
        self._progress_at = clock()  # last consumed batch or delivered output batch
        self._waiting_since: float | None = None  # sink: messages waiting since
        self._pending = 0
        self._warned_at: float | None = None
        self._stalled_since: float | None = None
        self._last_error = ""
        REGISTRY.add(self)

    @property
    def label(self) -> str:
        where = f", {self.name}" if self.name else ""
        return f"Kafka {self.role} (topic {self.topic!r}{where})"

    def _set_connected(self, connected: bool) -> None:
        with self._lock:
            changed, self.connected = self.connected != connected, connected
        if changed:
            REGISTRY.publish(self.role)

    def answered(self) -> None:
        """The broker answered a probe."""
        with self._lock:
            self._alive_at = self._clock()
            self._last_error = ""
        self._set_connected(True)

    def unreachable(self, reason: str) -> None:
        """A probe went unanswered or librdkafka reported the broker down."""
        with self._lock:
            self._last_error = reason
        self._set_connected(False)

    def progressed(self) -> None:
        """A poll returned data (source) or a batch was delivered (sink)."""
        with self._lock:
            self._alive_at = self._progress_at = self._clock()
        LAST_PROGRESS.labels(self.role).set(time.time())
        self._set_connected(True)

    def waiting(self, pending: int) -> None:
        """Sink: ``pending`` messages wait for delivery now (0: none)."""
        with self._lock:
            self._pending = max(pending, 0)
            if pending <= 0:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = self._clock()

    def stalled_for(self) -> float:
        """Seconds without progress: since a sink's waiting messages last saw a delivery, or
        since a source last heard from the broker (an idle sink is never stalled)."""
        with self._lock:
            now = self._clock()
            if self._waiting_since is not None:
                return now - max(self._waiting_since, self._progress_at)
            if self.role == SINK:
                return 0.0  # nothing to deliver: an idle sink is not stalled
            return now - self._alive_at

    def check(self) -> None:
        """Log a stall (at most once per ``max(stall_seconds, 60)`` s) or the end of one."""
        stalled, now = self.stalled_for(), self._clock()
        if stalled < self.stall_seconds:
            if self._warned_at is not None and self._stalled_since is not None:
                log.warning(
                    "%s: progressing again after %.0f s", self.label, now - self._stalled_since
                )
            self._stalled_since = self._warned_at = None
            return
        if self._stalled_since is None:
            self._stalled_since = now - stalled
        if self._warned_at is None or now - self._warned_at >= max(self.stall_seconds, 60.0):
            self._warned_at = now
            log.warning("%s: no progress for %.0f s: %s", self.label, stalled, self._symptom())

    def _symptom(self) -> str:
        with self._lock:
            pending, error = self._pending, self._last_error
        if self.role == SINK and pending:
            what = f"{pending} message(s) waiting for delivery"
        else:
            what = "no message and no answer from the broker"
        state = "unreachable" if self.connected is False else "reachable"
        return f"{what} (broker {state}" + (f"; last error: {error})" if error else ")")

    def close(self) -> None:
        REGISTRY.remove(self)


def describe(exc: BaseException) -> str:
    """A one-line reason for the log (a librdkafka error's own text when there is one)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    return f"{type(exc).__name__}: {exc}"


class Probe:
    """Asks ``exists(timeout)`` whether ``health.topic`` exists, every ``interval`` seconds
    (default ``probe_interval(health.stall_seconds)``) from a daemon thread that ``start``
    starts, and reports to ``health``; a missing topic becomes the process's fault
    (``raise_if_failed``). ``where`` names the cluster in the messages (``cluster_name``)."""

    def __init__(
        self,
        health: ClientHealth,
        exists: Callable[[float], bool],
        where: str,
        interval: float | None = None,
    ) -> None:
        self.health, self.where, self._exists = health, where, exists
        self.interval = probe_interval(health.stall_seconds) if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"privstream-probe-{health.role}", daemon=True
        )

    def start(self) -> Probe:
        """Start the thread; a later call does nothing (a client may call it with every poll)."""
        if self._thread.ident is None:
            self._thread.start()
        return self

    def probe_once(self) -> None:
        try:
            exists = self._exists(self.interval)
        except Exception as exc:  # an unanswered probe: whatever the client raised
            self.health.unreachable(describe(exc))
        else:
            self.health.answered()
            if not exists:
                self._lost()
        self.health.check()

    def require(self, timeout: float) -> None:
        """Ask once, from the caller's thread: ``TopicMissing`` (and the process's fault) when
        the broker says the topic does not exist; an unanswered question proves nothing."""
        try:
            exists = self._exists(timeout)
        except KafkaException:
            return
        if not exists:
            raise TopicMissing(self._lost())

    def _lost(self) -> str:
        """Record the topic as gone for the whole process; what is recorded."""
        message = topic_gone_message(self.health.topic, self.where)
        FAULTS.record(message)
        return message

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop the thread, if started, and wait for it (at most one probe timeout): the client
        may be closed afterwards. Unregisters ``health``."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.interval + 1.0)
        self.health.close()
