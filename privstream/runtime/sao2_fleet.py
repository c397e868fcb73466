"""A simulated SaO2 fleet behind a shuffler (issue 25): one device-library
``privstream.client.sao2.Sao2Device`` per user, for tests and the demo.

``Sao2Fleet(devices, seed=…)`` holds the devices (each with its own reproducible randomness,
``SeededRandomness(seed·1,000,003 + i)``, and its own lifetime ledger, in memory or one
``FileStore`` per device under ``store_dir``); ``begin(task)`` hands a horizon's task (a
``Sao2Task`` or its JSON object) to every device that is not dropped; ``push(slot, values)``
gives every device its value of the slot (an integer array, −1: no new value, the device carries
its last one forward) and returns the slot's reports as canonical JSON lines
(``schema.protocol.canonical``), what the devices write to the report topic. ``run_horizon``
runs one horizon end to end.

``dropout``: per horizon, each device independently (seeded) never receives the task: it does
not enrol, spends nothing and sends nothing in that horizon, but keeps its values. The server
still counts it in its level (the public rule names every device), so dropouts bias the
estimates (spec §10.2). Stats are counts only: no value, no device id.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.client.randomizers import Randomness, SeededRandomness
from privstream.client.sao2 import Sao2Device
from privstream.client.store import FileStore
from privstream.schema.protocol import canonical
from privstream.schema.shuffle import Sao2Task


def seeded(seed: int) -> Callable[[int], Randomness]:
    """Device ``i``'s reproducible randomness (simulations only; devices use the OS CSPRNG)."""
    return lambda i: SeededRandomness(seed * 1_000_003 + i)


@dataclass
class HorizonStats:
    """One horizon's counts: devices enrolled, dropped, refused (by reason) and reports sent."""

    horizon: int
    enrolled: int = 0
    dropped: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    reports: int = 0


class Sao2Fleet:
    """``n`` simulated SaO2 devices (module docstring)."""

    def __init__(self, devices: Sequence[str], seed: int = 0, dropout: float = 0.0,
                 randomness: Callable[[int], Randomness] | None = None,
                 store_dir: Path | None = None) -> None:  # fmt: skip
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        source = randomness if randomness is not None else seeded(seed)
        self.seed, self.dropout = seed, dropout
        self.devices = [
            Sao2Device(name, _store(store_dir, name), source(i)) for i, name in enumerate(devices)
        ]
        self.stream: str | None = None
        self.stats: list[HorizonStats] = []

    def begin(self, task: Sao2Task | Mapping[str, Any]) -> HorizonStats:
        """Hand ``task`` to every device not dropped this horizon; each enrols or refuses."""
        obj = json.loads(task.to_json()) if isinstance(task, Sao2Task) else dict(task)
        stats = HorizonStats(int(obj["horizon"]))
        rng = np.random.default_rng([self.seed, stats.horizon])
        dropped = rng.random(len(self.devices)) < self.dropout
        for device, drop in zip(self.devices, dropped.tolist(), strict=True):
            if drop:
                stats.dropped += 1
            elif device.begin(obj):
                stats.enrolled += 1
            else:
                stats.refused[device.refusal.reason if device.refusal else "unknown"] += 1
        self.stream = str(obj["stream"])
        self.stats.append(stats)
        return stats

    def push(self, slot: int, values: NDArray[Any] | Sequence[int]) -> list[str]:
        """Every device's value at ``slot`` (−1: none new); the reports of the slot, as JSON."""
        if self.stream is None:
            raise ValueError("no task yet: call begin(task) first")
        column = np.asarray(values, dtype=np.int64).tolist()
        if len(column) != len(self.devices):
            raise ValueError(f"{len(self.devices)} devices need {len(self.devices)} values")
        lines = []
        for device, value in zip(self.devices, column, strict=True):
            for report in device.push(slot, None if value < 0 else value, self.stream):
                lines.append(canonical(report))
        if self.stats:
            self.stats[-1].reports += len(lines)
        return lines


def _store(folder: Path | None, name: str) -> FileStore | None:
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    return FileStore(path, create=not path.exists())


def run_horizon(task: Sao2Task | Mapping[str, Any], devices: Sequence[str],
                values: NDArray[Any], seed: int = 0,
                dropout: float = 0.0) -> tuple[list[list[str]], HorizonStats]:  # fmt: skip
    """One horizon: ``values[τ−1, j]`` is device ``j``'s value at the horizon's slot ``τ``
    (−1: none new). Returns each slot's report lines and the horizon's counts."""
    fleet = Sao2Fleet(devices, seed=seed, dropout=dropout)
    stats = fleet.begin(task)
    first = task.first_slot if isinstance(task, Sao2Task) else int(task["first_slot"])
    lines = [fleet.push(first + k, row) for k, row in enumerate(np.asarray(values))]
    return lines, stats


def serve_over_kafka(fleet: Sao2Fleet, make_source: Callable[[Sao2Task], Any], settings: Any,
                     task_topic: str,
                     report_topic: str, slot_seconds: float, origin: float,
                     wait_seconds: float = 60.0) -> list[HorizonStats]:  # fmt: skip
    """``privstream devices --sao2-tasks``: read the server's tasks, then play every horizon on
    the wall clock — slot ``t``'s reports are written at ``origin + (t − ½)·slot_seconds``, half
    a slot before the clock's marker of ``t`` (``privstream clock --slot-seconds --origin``
    writes it at ``origin + t·slot_seconds``) — keyed by device (Kafka spreads them over the
    partitions). ``make_source(first task).values(slot)`` gives every device's value (a dataset
    of the task's ``d`` and kind). Counts only."""
    import time

    from confluent_kafka import Producer

    from privstream.connectors.kafka import read_until_idle

    deadline, tasks = time.monotonic() + wait_seconds, list[Sao2Task]()
    while not tasks and time.monotonic() < deadline:
        tasks = [Sao2Task.from_obj(json.loads(m.value())) for b in
                 read_until_idle(settings, [task_topic], 1.0) for m in b]  # fmt: skip
    if not tasks:
        raise TimeoutError(f"no SaO2 task on {task_topic} within {wait_seconds:g} s")
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    source = make_source(min(tasks, key=lambda t: t.horizon))
    for task in sorted({t.horizon: t for t in tasks}.values(), key=lambda t: t.horizon):
        fleet.begin(task)
        for slot in range(task.first_slot, task.first_slot + task.T):
            time.sleep(max(0.0, origin + (slot - 0.5) * slot_seconds - time.time()))
            for line in fleet.push(slot, source.values(slot)):
                producer.produce(report_topic, line.encode(), json.loads(line)["device"].encode())
            if producer.flush(60) > 0:
                raise ConnectionError(
                    f"the report topic {report_topic} did not confirm slot {slot}"
                )
    return fleet.stats
