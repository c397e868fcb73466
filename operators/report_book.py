"""What the ``ldp-reports`` server stage keeps of a stream's rounds between calls (issue 23).

``RoundBook`` lives in ``StreamState.protocol`` (snapshotted with the mechanisms' states): the
slot in progress and its open round, the requests it published, the reports accepted for them
(``schema.protocol.check_reports``), the answers of the slot's closed rounds, which input
partitions have closed the open round, and the population mirror (how many devices reported
under population division in each recent slot). Engine-free: ``operators.report_rounds`` wires
it into Bytewax.

Guarantee: a report counts for a round only if it precedes that round's marker on its own
partition, and a round's answer is computed from its accepted reports in device-id order, so a
replay of the report topic after a crash rebuilds exactly the same answers, requests and
releases. Nothing here holds a raw value: reports are perturbed, and the ids the book keeps
(``SeenReports``) are the devices' pseudonyms of the open rounds only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privstream.mechanisms.report_port import Answer, Ask, wire_array
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.report_columns import DeviceSeen, Tally, take_columns
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import (
    SHAPE_MISMATCH,
    UNKNOWN_REQUEST,
    Report,
    Request,
    Selection,
    check_reports,
    derive_salt,
    sample_rule,
)
from privstream.schema.report_wire import ReportColumns
from privstream.schema.shuffle import ReportBatch

ROUNDS_PER_SLOT = 4
"""The most rounds one mechanism asks in a slot (LDP-IDS: two); sizes the rate limit."""


@dataclass(frozen=True)
class Published:
    """One request of the open round: the mechanism (lane) it serves and its purpose there."""

    lane: str
    purpose: str
    request: Request


@dataclass
class RoundBook:
    """One stream's rounds (module docstring). ``slot`` is the slot in progress (0: none yet),
    ``round`` its open round (0: none open, the slot is finished or not started), ``opened``
    the newest slot an opening marker allowed to start."""

    seen: DeviceSeen
    slot: int = 0
    round: int = 0
    opened: int = 0
    answers: dict[str, dict[str, Answer]] = field(default_factory=dict)
    open: dict[str, Published] = field(default_factory=dict)
    collected: dict[str, Tally] = field(default_factory=dict)
    """Each open request's accepted reports, as its oracle's sufficient statistic."""
    closed_parts: set[int] = field(default_factory=set)
    held: list[tuple[int, Any]] = field(default_factory=list)
    """Messages of partitions that already closed the open round, in arrival order."""
    used: dict[str, dict[int, int]] = field(default_factory=dict)
    missing: int = 0
    """Reports a budget-division request asked for and never got (offline or refusing
    devices), summed over the stream's life: a count, never who."""
    shuffled: list[tuple[float, int]] = field(default_factory=list)
    """Behind a shuffler: the slot's batches as (the request's ε, the batch size n)."""

    @classmethod
    def fresh(cls, window: int, lanes: int, stream: str = "") -> RoundBook:
        per_window = ROUNDS_PER_SLOT * max(lanes, 1) * window
        return cls(DeviceSeen(window, per_window, stream=stream))

    @property
    def idle(self) -> bool:
        """No round is open: the book waits for a slot to open."""
        return self.round == 0

    def open_requests(self) -> dict[str, Request]:
        return {rid: p.request for rid, p in self.open.items()}

    def publish(
        self,
        stream: str,
        asks: Mapping[str, Ask],
        *,
        population: int,
        window: int,
        selection_key: bytes,
    ) -> list[Request]:
        """Open the next round of the slot with one request per lane's ``Ask``."""
        self.round += 1
        self.open, self.collected, self.closed_parts = {}, {}, set()
        out = []
        for lane, ask in asks.items():
            purpose = f"{lane}.{ask.purpose}"
            select, division = Selection(), "budget"
            if ask.k is not None:
                salt = derive_salt(selection_key, stream, self.slot, self.round, purpose)
                available = max(ask.k, population - self.used_in_window(lane, window))
                select, division = sample_rule(salt, ask.k, available), "population"
            request = Request(stream, self.slot, self.round, purpose, ask.oracle, ask.epsilon,
                              window, division, select, ask.delta)  # fmt: skip
            self.open[request.id] = Published(lane, ask.purpose, request)
            self.collected[request.id] = Tally(ask.oracle)
            out.append(request)
        return out

    def used_in_window(self, lane: str, window: int) -> int:
        """Devices that reported to ``lane``'s population-division requests in the window
        ending at this slot (the ``w − 1`` slots before it and this slot's closed rounds, e.g.
        LPD's M1 before its M2): they cannot report again in this window (their own ledgers
        refuse), so the selection rate is ``k`` over the others."""
        low = self.slot - window + 1
        return sum(n for s, n in self.used.get(lane, {}).items() if low <= s <= self.slot)

    def check(self, reports: list[Report]) -> list[DeadLetter]:
        """Judge ``reports`` one by one (``check_reports``); collect the accepted ones."""
        accepted, dead = check_reports(reports, self.open_requests(), self.seen)
        for rid in dict.fromkeys(r.request for r in accepted):
            mine = [r for r in accepted if r.request == rid]
            rows = self.seen.rows([r.device for r in mine])
            tally = self.collected[rid]
            tally.add(rows, wire_array(tally.spec, [r.value for r in mine]))
        return dead

    def take(self, run: ReportColumns) -> list[DeadLetter]:
        """Judge a run of reports as ``check`` would, in columns (``take_columns``)."""
        if not self.open or run.stream != self.seen.stream:  # every one refused: name why
            return self.check(run.reports())
        return take_columns(run, self.open_requests(), self.seen, self.collected)

    def fill(self, batch: ReportBatch) -> DeadLetter | None:
        """A shuffler's batch for an open request of this round: its counts are the request's
        accepted reports (``n`` of them; none when dropped below ``n_min``). A batch for no open
        request, or a second, different one, is a dead letter."""
        published = self.open.get(batch.request)
        if published is None or (batch.slot, batch.round) != (self.slot, self.round):
            return DeadLetter(
                UNKNOWN_REQUEST, batch.stream, batch.to_json(), "no such open request"
            )
        spec = published.request.oracle
        counts = (
            np.zeros(spec.d, np.int64)
            if batch.counts is None
            else np.asarray(batch.counts, np.int64)
        )
        tally = self.collected[batch.request]
        if counts.shape != (spec.d,) or batch.oracle != spec.name:
            return DeadLetter(
                SHAPE_MISMATCH, batch.stream, batch.to_json(), "counts do not fit the request"
            )
        if len(tally):
            same = tally.counts is not None and np.array_equal(tally.counts, counts)
            return (
                None if same else DeadLetter("conflicting_batch", batch.stream, batch.to_json(), "")
            )
        tally.m = batch.n if batch.counts is not None else 0
        tally.counts = counts
        self.shuffled = [*getattr(self, "shuffled", []), (published.request.epsilon, batch.n)]
        return None

    def close(self, task: EstimationTask, population: int) -> None:
        """Close the open round: each request's answer from its accepted reports."""
        for rid, published in self.open.items():
            request, reports = published.request, self.collected[rid]
            answer = reports.answer(request, task, self.seen.names)
            self.answers.setdefault(published.lane, {})[published.purpose] = answer
            self.seen.close(request)
            if request.division == "budget":
                self.missing += max(0, population - len(reports))
            else:
                lane_used = self.used.setdefault(published.lane, {})
                lane_used[self.slot] = lane_used.get(self.slot, 0) + len(reports)
        self.open, self.collected, self.closed_parts = {}, {}, set()

    def finish_slot(self, window: int) -> None:
        """The slot is released: forget its answers and the population mirror's old slots."""
        self.round, self.answers, self.shuffled = 0, {}, []
        for lane_used in self.used.values():
            for old in [s for s in lane_used if s <= self.slot - window]:
                del lane_used[old]
