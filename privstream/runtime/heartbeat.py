"""Liveness of a cluster member, and why it stopped: files in the launcher's directory.

A Bytewax cluster advances only while every member does, so one frozen member (SIGSTOP, a
deadlocked call, a paging host) stalls all of them while the others still look healthy (their
Kafka clients connected, their metrics served). Every member of a launcher's cluster therefore
runs ``HeartbeatSource``: an input on every worker that touches ``member-I.alive`` each second
from the worker's own loop, so the file ages exactly when that member's dataflow stops running.
The launcher (``privstream.runtime.cluster``) reads the ages; every member exposes them as the public
gauge ``privstream_cluster_member_progress_age_seconds{member}`` (``ProgressCollector``): the age
of a file depends on scheduling only, never on the data.

A member that fails writes ``member-I.reason`` (its exit status and one line saying why) before
it exits, so the launcher can name the member that failed first and its own reason rather than
the "lost the cluster" of the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from bytewax.inputs import DynamicSource, StatelessSourcePartition
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from privstream.connectors.control import StopSignal

BEAT: Final = 1.0  # seconds between touches
PROGRESS_AGE: Final = "privstream_cluster_member_progress_age_seconds"


def alive_file(directory: str | Path, member: int) -> Path:
    return Path(directory) / f"member-{member}.alive"


def reason_file(directory: str | Path, member: int) -> Path:
    return Path(directory) / f"member-{member}.reason"


def beat(path: Path) -> None:
    """Set ``path``'s modification time to now (creating it)."""
    path.touch()


def age(path: Path, since: float, now: float | None = None) -> float:
    """Seconds since ``path`` was last touched (or since ``since``, a wall-clock time, if it
    never was: a member still starting)."""
    now = time.time() if now is None else now
    try:
        last = path.stat().st_mtime
    except FileNotFoundError:
        last = since
    return max(now - max(last, since), 0.0)


class _Beating(StatelessSourcePartition[None]):
    def __init__(self, path: Path, stop: StopSignal) -> None:
        self._path = path
        self._stop = stop
        self._awake = datetime.now(UTC)

    def next_batch(self) -> list[None]:
        if self._stop.is_set():
            raise StopIteration
        beat(self._path)
        self._awake = datetime.now(UTC) + timedelta(seconds=BEAT)
        return []

    def next_awake(self) -> datetime | None:
        return self._awake


class HeartbeatSource(DynamicSource[None]):
    """Touches ``path`` from every worker's loop once a second; emits nothing; ends with the
    flow's stop signal (SIGTERM, ``--slots``).

    Its ``stop.is_set()`` each second also evaluates the signal's conditions on every worker,
    so the member whose worker holds the release progress creates the ``--slots`` stop file even
    when it reads no input partition (only Kafka's ``next_batch`` checked it: a cluster with
    fewer partitions than processes never stopped)."""

    def __init__(self, path: Path, stop: StopSignal) -> None:
        self.path = path
        self.stop = stop

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Beating:
        return _Beating(self.path, self.stop)


class ProgressCollector(Collector):
    """``privstream_cluster_member_progress_age_seconds{member}`` of every member of the
    cluster whose launcher directory ``configure`` set (no sample outside a launcher's
    cluster). Registered in the public registry on import."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.members = 0
        self.since = 0.0

    def configure(self, directory: str | Path, members: int, since: float) -> None:
        self.directory, self.members, self.since = Path(directory), members, since

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            PROGRESS_AGE,
            "Seconds since each member of this cluster last ran its dataflow loop (a frozen "
            "member stalls the whole cluster).",
            labels=["member"],
        )
        now = time.time()
        for member in range(self.members if self.directory is not None else 0):
            assert self.directory is not None
            family.add_metric(
                [str(member)], age(alive_file(self.directory, member), self.since, now)
            )
        yield family


PROGRESS = ProgressCollector()
REGISTRY.register(PROGRESS)


def write_reason(directory: str | Path, member: int, code: int, reason: str) -> None:
    """Record why ``member`` is exiting with ``code`` (one line), atomically."""
    target = reason_file(directory, member)
    staging = target.with_suffix(f".tmp{os.getpid()}")
    staging.write_text(f"{code}\n{' '.join(reason.split())}\n")
    os.replace(staging, target)


def read_reason(directory: str | Path, member: int) -> tuple[int, str] | None:
    """``(exit status, reason)`` a member recorded, if it did."""
    try:
        code, reason = reason_file(directory, member).read_text().split("\n", 1)
        return int(code), reason.strip()
    except (FileNotFoundError, ValueError):
        return None
