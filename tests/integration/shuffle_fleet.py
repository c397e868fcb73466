"""A stand-in fleet for the shuffler's Kafka tests: the simulated SaO2 devices of
``mechanisms.sao2_client`` (the law the device library equals), each following the task's
public level rule, written as one report per device per block end of its level (empty when
ExSub emits nothing), spread over the report topic's partitions by device, and each slot closed
by a signed end-of-slot marker on every partition (the clock's job)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
from confluent_kafka import Producer

from privstream.connectors.kafka import KafkaSettings
from privstream.mechanisms.sao2_client import Sao2Protocol
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.schema.events import marker_tag
from privstream.schema.shuffle import Sao2Report, Sao2Task


def device(i: int) -> str:
    return f"dev-{i:05d}"


def slot_reports(
    task: Sao2Task, values: np.ndarray, seed: int
) -> Iterator[tuple[int, list[Sao2Report]]]:
    """Per slot of the task's horizon: every report due at it (``values``: ``(T, n)``)."""
    n = values.shape[1]
    levels = np.array([task.level_of(device(i)) for i in range(n)], dtype=np.int64)
    rng, state = np.random.default_rng(seed), None
    for tau in range(1, task.T + 1):
        proto = Sao2Protocol(tau, task.T, task.r, task.s, task.epsilon, BinaryTask(task.d, task.kind),  # type: ignore[arg-type]
                             task.m, levels if tau == 1 else None)  # fmt: skip
        state, emitted = proto.emit(values[tau - 1], np.ones(n, dtype=bool), state, rng)
        reports = []
        for e in emitted:
            symbols: dict[int, list[tuple[int, int]]] = {}
            for u, c, s in zip(e.user.tolist(), e.coord.tolist(), e.sign.tolist(), strict=True):
                symbols.setdefault(u, []).append((c, s))
            for u in np.flatnonzero(levels == e.level).tolist():
                reports.append(Sao2Report(task.id, task.stream, task.horizon, e.level, e.block,
                                          device(u), tuple(sorted(symbols.get(u, ())))))  # fmt: skip
        yield task.first_slot + tau - 1, reports


def marker(key: bytes, stream: str, slot: int) -> bytes:
    return json.dumps({"stream": stream, "end_of_slot": slot,
                       "tag": marker_tag(key, stream, slot)}).encode()  # fmt: skip


def write_horizon(settings: KafkaSettings, topic: str, partitions: int, key: bytes,
                  task: Sao2Task, values: np.ndarray, seed: int, pause: float = 0.0) -> int:  # fmt: skip
    """Write a horizon's reports and markers (``pause`` seconds after each slot); the number of
    reports written."""
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    written = 0
    for slot, reports in slot_reports(task, values, seed):
        for r in reports:
            part = int(r.device.rsplit("-", 1)[1]) % partitions
            producer.produce(topic, r.to_json().encode(), partition=part)
            written += 1
        for p in range(partitions):
            producer.produce(topic, marker(key, task.stream, slot), partition=p)
        if pause:
            assert producer.flush(60) == 0
            time.sleep(pause)
    assert producer.flush(60) == 0
    return written
