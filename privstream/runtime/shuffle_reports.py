"""The shuffler's book for ``ldp-reports`` rounds (issue 25: any LDP family behind the
shuffler): GRR and OUE reports of LDP-IDS, batched per request.

The server publishes a ``Request`` per (stream, slot, round, purpose) on its request topic (the
shuffler's task topic); devices report to the report topic; the round clock writes ``Close``
markers there. The shuffler judges each report as the server would (``protocol.verdict``: its
request, the selection rule, oracle, budget and shape) and keeps one value per device. When a
round's closing marker has arrived on every partition it forwards, per request of the round, a
``ReportBatch`` — the counts and the manifest — and then the marker itself; opening markers are
forwarded as they come (once per slot). So the server's round logic runs unchanged on counts,
and no device id, value or arrival order reaches it.

Deterministic like ``shuffle_book``: a report counts only before its round's marker on its own
partition, and a device's conflicting copies are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from privstream.mechanisms.sao2 import min_batch
from privstream.runtime.shuffle_book import Kept, applied
from privstream.schema.protocol import Close, Report, Request, SeenReports, verdict
from privstream.schema.shuffle import COUNTABLE, ReportBatch, report_counts


@dataclass
class ReportShuffleBook:
    """Requests, open rounds' reports and each partition's round clock (pickled with the
    shuffler's store)."""

    shuffler: str
    partitions: int
    policy: str = "drop"
    delta: float = 1e-5
    n_min: int | None = None
    requests: dict[str, Request] = field(default_factory=dict)
    reports: dict[str, Kept] = field(default_factory=dict)
    closed: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(stream, partition) → the last (slot, round) whose closing marker it delivered."""
    done: dict[str, tuple[int, int]] = field(default_factory=dict)
    """stream → the last (slot, round) forwarded (closed on every partition)."""
    opened: dict[str, int] = field(default_factory=dict)
    seen: SeenReports = field(default_factory=lambda: SeenReports(1, 1 << 30))

    def add_request(self, request: Request) -> None:
        self.requests[request.id] = request

    def minimum(self, request: Request) -> int:
        return self.n_min if self.n_min is not None else min_batch(request.epsilon, self.delta)

    def take_report(self, partition: int, report: Report) -> str | None:
        """Keep ``report`` for its request, or say why not (a dead-letter reason)."""
        request = self.requests.get(report.request)
        if request is not None and request.oracle.name not in COUNTABLE:
            return "not_countable"
        where = (report.slot, report.round)
        if where <= self.closed.get((report.stream, partition), (0, 0)) or where <= self.done.get(
            report.stream, (0, 0)
        ):
            return "late_report"
        why = verdict(report, self._open(report.stream), self.seen)
        if why is not None:
            return why.reason
        return self.reports.setdefault(report.request, Kept()).keep(report.device, report.value)

    def _open(self, stream: str) -> dict[str, Request]:
        done = self.done.get(stream, (0, 0))
        return {rid: r for rid, r in self.requests.items()
                if r.stream == stream and (r.slot, r.round) > done}  # fmt: skip

    def take_marker(self, partition: int, marker: Close) -> list[Any]:
        """An authenticated round marker (checked by the caller): what to forward — an
        opening marker once per slot; after a round closed on every partition, its requests'
        batches and then the closing marker."""
        if marker.round == 0:
            if marker.slot <= self.opened.get(marker.stream, 0):
                return []
            self.opened[marker.stream] = marker.slot
            return [marker]
        key, where = (marker.stream, partition), (marker.slot, marker.round)
        self.closed[key] = max(self.closed.get(key, (0, 0)), where)
        through = min(self.closed.get((marker.stream, p), (0, 0)) for p in range(self.partitions))
        if through < where or where <= self.done.get(marker.stream, (0, 0)):
            return []
        self.done[marker.stream] = where
        self.seen.closed[marker.stream] = where
        batches: list[Any] = [self._batch(r) for r in sorted(self.requests.values(), key=lambda r: r.id)
                              if (r.stream, r.slot, r.round) == (marker.stream, *where)]  # fmt: skip
        return [*batches, marker]

    def _batch(self, request: Request) -> ReportBatch:
        found = self.reports.pop(request.id, Kept())
        del self.requests[request.id]
        values = [v for _device, v in found.accepted()]
        n, n_min = len(values), self.minimum(request)
        policy = applied(n, n_min, self.policy)
        counts = (
            report_counts(request.oracle.name, request.oracle.d, values)
            if policy != "drop"
            else None
        )
        return ReportBatch(request.id, request.stream, request.slot, request.round,
                           request.oracle.name, n, n_min, policy, counts, self.shuffler)  # fmt: skip
