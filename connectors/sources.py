"""Bytewax sources of stream inputs: the synthetic population and user files of records.

Both are resumable: the synthetic source's snapshot is the next slot to emit (its values are a
pure function of ``(seed, slot)``), the file source's is the byte offset (Bytewax ``FileSource``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from privstream.connectors.datasets import SlotStream
from privstream.schema.events import EventBatch


class _SyntheticPartition(StatefulSourcePartition[EventBatch, int]):
    def __init__(self, stream: SlotStream, name: str, next_slot: int) -> None:
        self._stream = stream
        self._name = name
        self._next = next_slot
        self._users = np.arange(stream.users, dtype=np.int64)

    def next_batch(self) -> list[EventBatch]:
        if self._next > self._stream.slots:
            raise StopIteration
        slot = self._next
        raw = np.asarray(self._stream.values(slot))
        self._next += 1
        present = ~(np.isnan(raw) if raw.dtype.kind == "f" else raw == -1)  # no value: no event
        if present.ndim > 1:
            present = present.all(axis=1)
        users = self._users if present.all() else self._users[present]
        values = np.asarray(raw if present.all() else raw[present], dtype=np.float64)
        slots = np.full(users.shape[0], slot, dtype=np.int64)
        return [EventBatch(self._name, slots, users, values, complete_through=slot)]

    def next_awake(self) -> datetime | None:
        return None

    def snapshot(self) -> int:
        return self._next


class SyntheticSource(FixedPartitionedSource[EventBatch, int]):
    """Every user's value at every slot of a ``SyntheticStream``, one slot per batch that also
    marks its slot complete. Users are addressed by dense index ``0..n−1``."""

    def __init__(self, stream: SlotStream, name: str | None = None) -> None:
        self.stream = stream
        self.name = name or stream.name

    def list_parts(self) -> list[str]:
        return [f"synthetic:{self.name}"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: int | None
    ) -> _SyntheticPartition:
        return _SyntheticPartition(self.stream, self.name, resume_state or 1)


def detect_format(path: str | Path) -> str:
    """``"csv"`` for ``.csv`` files, ``"jsonl"`` otherwise."""
    return "csv" if str(path).lower().endswith(".csv") else "jsonl"


def file_source(path: str | Path, batch_size: int = 10_000) -> Any:
    """Bytewax ``FileSource`` over a CSV/JSONL file of ``(user, slot, value)`` records."""
    from bytewax.connectors.files import FileSource

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"event file {p} does not exist")
    return FileSource(p, batch_size=batch_size)
