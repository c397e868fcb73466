"""The round clock of ``ldp-reports`` mode (issue 23): ``privstream clock --requests``.

It writes the authenticated round markers (``schema.protocol.Close``) the server stage acts on,
to every partition of the report topic: slot ``t``'s opening marker (round 0) once real time
reaches ``origin + t · slot_seconds`` (at once with ``slot_seconds = 0``: the rounds then pace
the slots), and, for every request round it reads on the request topic, that round's closing
marker ``round_seconds`` after it first saw the round — the devices' time to answer. The
clock reads only public requests and holds only the clock key (``NoiseKey.clock_key``): it can
open and close rounds, never see a report's content or the noise secret.

Why markers and not the server's own wall clock: a round's reports are the ones before its
marker on each partition, so a replay after a crash reads the same reports and releases
byte-identical output.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from privstream.connectors.kafka import KafkaSettings, consumer_config, require_topics
from privstream.connectors.producer import _flush, _producer, _send
from privstream.schema.protocol import Close, ProtocolError, decode_request


@dataclass(frozen=True)
class RoundSchedule:
    """When the clock writes: slots ``first_slot..through`` open at ``origin + t ·
    slot_seconds``; each round closes ``round_seconds`` after its request was first read;
    the clock stops ``idle_seconds`` after its last marker once every slot is open."""

    streams: tuple[str, ...]
    first_slot: int = 1
    through: int | None = None
    slot_seconds: float = 60.0
    round_seconds: float = 10.0
    origin: float = 0.0
    idle_seconds: float = 30.0

    def __post_init__(self) -> None:
        if not self.streams:
            raise ValueError("the round clock needs at least one --stream")
        if self.first_slot < 1 or (self.through is not None and self.through < self.first_slot):
            raise ValueError(f"slots {self.first_slot}..{self.through} are empty or below 1")
        if self.slot_seconds < 0 or self.round_seconds < 0 or self.idle_seconds <= 0:
            raise ValueError("--slot-seconds and --round-seconds must be >= 0, idle > 0")


@dataclass
class ClockStats:
    """What the clock wrote: counts only."""

    opened: int = 0
    closed: int = 0
    requests: int = 0
    invalid_requests: int = 0
    due: list[tuple[float, int, Close]] = field(default_factory=list)


def run_round_clock(
    settings: KafkaSettings,
    report_topic: str,
    request_topic: str,
    clock_key: bytes,
    schedule: RoundSchedule,
    *,
    now: Callable[[], float] = time.time,
) -> ClockStats:
    """Open the schedule's slots and close every round the request topic shows (module
    docstring); returns what was written."""
    partitions = require_topics(settings, [report_topic, request_topic])
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(consumer_config(settings, tail=True))
    consumer.assign([TopicPartition(request_topic, p, OFFSET_BEGINNING)
                     for p in range(partitions[request_topic])])  # fmt: skip
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = _producer(settings, delivered)
    stats, seen, sequence = ClockStats(), set[tuple[str, int, int]](), 0
    next_open, last_write = schedule.first_slot, now()
    try:
        while True:
            t = now()
            while _may_open(schedule, next_open, t):
                for stream in schedule.streams:
                    heapq.heappush(stats.due, (t, sequence, Close(stream, next_open, 0)))
                    sequence += 1
                next_open += 1
            for message in consumer.consume(1000, 0.2):
                value = message.value() if message.error() is None else None
                if value:
                    sequence = _read(value, schedule, seen, stats, now(), sequence)
            wrote = _write_due(producer, report_topic, partitions[report_topic], clock_key,
                               stats, now())  # fmt: skip
            if wrote:
                _flush(producer, failures, "round markers")
                last_write = now()
            done = schedule.through is not None and next_open > schedule.through
            if done and not stats.due and now() - last_write >= schedule.idle_seconds:
                return stats
    finally:
        consumer.close()


def _may_open(schedule: RoundSchedule, slot: int, t: float) -> bool:
    if schedule.through is not None and slot > schedule.through:
        return False
    return schedule.slot_seconds == 0 or t >= schedule.origin + slot * schedule.slot_seconds


def _read(
    value: bytes, schedule: RoundSchedule, seen: set[Any], stats: ClockStats, t: float, seq: int
) -> int:
    """Schedule the closing marker of a request's round the first time it is read."""
    try:
        request = decode_request(value)
    except ProtocolError:
        stats.invalid_requests += 1
        return seq
    stats.requests += 1
    key = (request.stream, request.slot, request.round)
    if request.stream not in schedule.streams or key in seen:
        return seq
    seen.add(key)
    marker = Close(request.stream, request.slot, request.round)
    heapq.heappush(stats.due, (t + schedule.round_seconds, seq, marker))
    return seq + 1


def _write_due(
    producer: Any, topic: str, partitions: int, key: bytes, stats: ClockStats, t: float
) -> int:
    """Write every marker whose time has come, signed, to every partition; how many."""
    wrote = 0
    while stats.due and stats.due[0][0] <= t:
        _, _, marker = heapq.heappop(stats.due)
        value = marker.signed(key).to_json().encode()
        for partition in range(partitions):
            _send(producer, topic, value, marker.stream.encode(), partition)
        if marker.round == 0:
            stats.opened += 1
        else:
            stats.closed += 1
        wrote += 1
    return wrote
