"""A public item dictionary: records of named items (``user, item, slot|ts``) as privstream
events over the categories ``0..k−1`` of a frequency task.

A frequency family releases a distribution over a public domain fixed before the data (DPI
spec §1.1, A15). Real records name their items (a country, a source IP, a commodity); the
dictionary, one label per line, chosen offline (for example the top-k values of a public
source), says which category each label is. Records of a label outside it are dropped and
counted, or, with ``other``, become one extra category ``k`` (then the task has ``k+1``).
Nothing here prints a label or a user: the counts are the only output besides the events.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIME_FIELDS = ("slot", "ts")


@dataclass(frozen=True)
class ItemDictionary:
    """Labels in category order; ``other``: unknown labels go to the category ``len(labels)``."""

    labels: tuple[str, ...]
    other: bool = False
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.labels) < 1:
            raise ValueError("an item dictionary needs at least one label")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("an item dictionary lists a label twice (each label is one category)")
        object.__setattr__(self, "index", {label: i for i, label in enumerate(self.labels)})

    @classmethod
    def from_file(cls, path: str | Path, other: bool = False) -> ItemDictionary:
        """One label per line (blank lines and ``#`` comments skipped), in category order."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        labels = tuple(s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#"))
        return cls(labels, other)

    @property
    def domain(self) -> int:
        """The task's number of categories (``--domain``)."""
        return len(self.labels) + (1 if self.other else 0)

    def category(self, label: Any) -> int | None:
        """The category of ``label``; None when it is unknown and there is no ``other``."""
        found = self.index.get(str(label).strip())
        if found is None and self.other:
            return len(self.labels)
        return found


@dataclass
class Encoded:
    """What ``encode`` did: events written, records dropped by reason (counts only)."""

    events: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a CSV (with a header) or JSON-lines file; a malformed JSON line is None."""
    if str(path).lower().endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f)
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            yield record if isinstance(record, dict) else {}


def encode(
    records: Iterable[dict[str, Any]],
    items: ItemDictionary,
    item_field: str = "item",
    stream: str | None = None,
) -> tuple[list[dict[str, Any]], Encoded]:
    """Each record ``{user, <item_field>, slot|ts[, stream]}`` as an event ``{stream, user,
    slot|ts, value}`` with the item's category; records without a user, an item or a time,
    or with an unknown item, are dropped and counted by reason."""
    out, tally = [], Encoded()
    for record in records:
        user, label = record.get("user"), record.get(item_field)
        time = next(((k, record[k]) for k in TIME_FIELDS if record.get(k) not in (None, "")), None)
        if user in (None, "") or label in (None, "") or time is None:
            tally.drop("missing_field")
            continue
        category = items.category(label)
        if category is None:
            tally.drop("unknown_item")
            continue
        key, value = time
        event = {"stream": stream or record.get("stream") or "items", "user": str(user),
                 key: int(value) if key == "slot" else value, "value": category}  # fmt: skip
        out.append(event)
        tally.events += 1
    return out, tally
