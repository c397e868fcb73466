"""The server stage of ``ldp-reports`` mode (issue 23): rounds of requests and reports.

The operator reads one keyed stream of report-topic messages (``ReportItem``: the input
partition and a ``schema.protocol.Report`` or round marker ``Close``) and, per stream:

1. an authenticated opening marker (``Close`` with round 0) lets slot ``t`` start;
2. it runs every mechanism's step on a ``ReportsPort`` (``mechanisms.report_port``): a step that
   needs the devices raises ``AwaitingReports``, and the round's requests go to the request
   output (one per mechanism that waits);
3. reports are checked (``schema.protocol.check_reports``: the refused ones are dead letters
   with their reason) and collected per request until the round's marker has arrived on every
   input partition;
4. the round's answers are computed, the steps run again, and once none waits the slot is
   released through the shared step driver (``mechanisms.driver``): the population
   accountant, halts and the outputs exactly as the slotted operator's.

Guarantee: each mechanism's declared one, enforced by its ledger mirror before any request is
published (a request is only planned by a step that charged it) and by every device's own
ledger; the server never holds a raw value. Rounds close on authenticated markers only, never
on wall time, so a replay after a crash (Bytewax recovery of ``StreamState``, the report topic
re-read from the snapshot's offsets) releases byte-identical output and re-publishes the same
requests (their ids are digests, so devices and the server recognise them).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bytewax import operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import KeyedStream, StatefulBatchLogic

from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import (
    ExtraRecord,
    Halt,
    LedgerEntry,
    Mechanism,
    Release,
    Slot,
)
from privstream.mechanisms.driver import Lane, drive_slot, failure
from privstream.mechanisms.report_port import Ask, AwaitingReports, ReportsPort
from privstream.mechanisms.seeding import NoiseKey, SlotRandomness
from privstream.mechanisms.shuffle_accountant import fmt_closed_bound
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD
from privstream.operators.reasons import Notes, Output
from privstream.operators.report_book import RoundBook
from privstream.operators.slotting import (
    MechanismOut,
    SlottedLogic,
    SlottedPlan,
    _pick,
    make_plan,
)
from privstream.operators.stream_state import StreamState
from privstream.schema.events import STREAM_HALTED, UNAUTHENTICATED_MARKER, DeadLetter
from privstream.schema.protocol import Close, Report, Request
from privstream.schema.report_wire import ReportColumns
from privstream.schema.shuffle import COUNTABLE, ReportBatch

log = logging.getLogger(__name__)

ReportItem = tuple[int, Report | Close | ReportColumns | ReportBatch]
"""One report-topic message of a stream (or a run of its reports decoded as columns,
``schema.report_wire.decode_poll``): its input partition and what it holds."""
MAX_OPEN_AHEAD = 64
"""The most slots an opening marker may run ahead of the slot in progress."""


@dataclass(frozen=True)
class ReportsPlan(SlottedPlan):
    """The slotted plan plus what the server stage needs: the report topic's ``partitions``
    (a round closes once each delivered its marker) and the longest ``window`` of the
    mechanisms. A snapshot is bound to the trust mode too: a store of a simulated run is
    refused here and the other way round."""

    partitions: int = 1
    window: int = 1
    shuffled: bool = False
    """Behind a shuffler (``ldp-shuffled``): the input holds the shuffler's batches and the
    forwarded markers, never a report."""

    @classmethod
    def of(cls, plan: SlottedPlan, partitions: int, shuffled: bool = False) -> ReportsPlan:
        window = max(m.privacy_cost.window or 1 for m in plan.mechanisms.values())
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
        return cls(**fields, partitions=partitions, window=window, shuffled=shuffled)

    def binding(self) -> dict[str, str]:
        mode = "ldp-shuffled" if self.shuffled else "ldp-reports"
        return super().binding() | {
            "trust": f"{mode} partitions={self.partitions}",
        }


class ReportRoundsLogic(SlottedLogic):
    """One stream's rounds (module docstring), over the slotted operator's parts: its plan,
    snapshotted ``StreamState`` (the ``RoundBook`` in ``protocol``), runner and metrics."""

    def __init__(self, step_id: str, plan: ReportsPlan, resume: StreamState | None) -> None:
        super().__init__(step_id, plan, resume)
        self.setup = plan
        self.clock_key = plan.key.clock_key()
        self.selection_key = plan.key.selection_key()

    def on_batch(self, values: list[ReportItem]) -> tuple[Iterable[Output], bool]:  # type: ignore[override]
        out: list[Output] = []
        notes = Notes()
        for partition, items in _runs(values):
            state = self._state_for(items[0].stream)
            book = self._book(state)
            if state.all_halted():
                why = "; ".join(state.halted.values())
                out.extend(_dead(STREAM_HALTED, item, why) for item in _messages(items))
                continue
            try:
                self._feed(state, book, [(partition, item) for item in items], out, notes)
            except Exception as exc:  # a broken stream halts; the process serves the others
                self._halt_all(state, book, f"report rounds failed: {failure(exc)}", out)
        self.publish(notes)
        return out, StatefulBatchLogic.RETAIN

    def _feed(
        self,
        state: StreamState,
        book: RoundBook,
        items: list[ReportItem],
        out: list[Output],
        notes: Notes,
    ) -> None:
        """Take ``items`` in order. A partition that delivered the open round's closing marker
        is held back (``RoundBook.held``) until the round closes everywhere, so each message is
        judged against the round its partition was in when it was written, however the
        partitions' polls interleave (a replay reads them far apart)."""
        queue = collections.deque(items)
        while queue:
            partition, item = queue.popleft()
            if book.open and partition in book.closed_parts:
                book.held.append((partition, item))
                continue
            if isinstance(item, ReportColumns):
                self._reports(book, item, out)
                continue
            if isinstance(item, ReportBatch):  # behind a shuffler: a request's counts
                letter = book.fill(item)
                if letter is not None:
                    out.append(("dead_letter", letter))
                continue
            if isinstance(item, Report):
                run = [item]  # one check for the partition's consecutive reports
                while queue and queue[0][0] == partition and isinstance(queue[0][1], Report):
                    run.append(queue.popleft()[1])  # type: ignore[arg-type]
                self._reports(book, run, out)
                continue
            was = (book.slot, book.round)
            self._marker(state, book, partition, item, out, notes)
            if (book.slot, book.round) != was and book.held:
                queue.extendleft(reversed(book.held))
                book.held = []

    def _state_for(self, stream: str) -> StreamState:
        """The stream's state, without the simulated clients' per-user state (CGM's noise
        chains live on the devices, never here)."""
        fresh = self.state is None
        state = super()._state_for(stream)
        if fresh:
            state.clients = {}
        return state

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        return [], StatefulBatchLogic.RETAIN  # the stream goes on: open rounds stay open

    def _book(self, state: StreamState) -> RoundBook:
        if state.protocol is None:
            state.protocol = RoundBook.fresh(self.setup.window, len(self.mechanisms), state.stream)
        book: RoundBook = state.protocol
        return book

    def _reports(
        self, book: RoundBook, reports: list[Report] | ReportColumns, out: list[Output]
    ) -> None:
        """Check consecutive reports of one partition; accept each into its request's
        collection or dead-letter it. Each is judged on itself (``check_reports``), so one call
        for the whole run gives what one call per report gives, in a fraction of the time; a
        run decoded as columns is judged in columns (``RoundBook.take``), with the same result."""
        dead = book.take(reports) if isinstance(reports, ReportColumns) else book.check(reports)
        out.extend(("dead_letter", d) for d in dead)

    def _marker(
        self,
        state: StreamState,
        book: RoundBook,
        partition: int,
        marker: Close,
        out: list[Output],
        notes: Notes,
    ) -> None:
        """An opening marker lets slots start; a closing one closes the open round once every
        partition delivered it. A stale or foreign marker closes nothing (counted)."""
        if not marker.authentic(self.clock_key):
            out.append(_dead(UNAUTHENTICATED_MARKER, marker, "round marker not authenticated"))
            return
        if marker.round == 0:
            if marker.slot <= book.opened:
                notes.ignored(state.stream, "stale")
                return
            if book.opened and marker.slot > max(book.slot, book.opened) + MAX_OPEN_AHEAD:
                notes.ignored(state.stream, "too_far_ahead")
                return
            book.opened = marker.slot
        elif (marker.slot, marker.round) == (book.slot, book.round):
            book.closed_parts.add(partition)
            if len(book.closed_parts) < self.setup.partitions:
                return
            book.close(self.plan.task, self.n)
        else:
            notes.ignored(state.stream, "stale")
            return
        self._advance(state, book, out, notes)

    def _advance(
        self, state: StreamState, book: RoundBook, out: list[Output], notes: Notes
    ) -> None:
        """Run slots forward until a round waits for reports or no opened slot is left (a
        round in flight waits for its own closing marker)."""
        while not state.all_halted() and not book.open:
            if book.idle:
                if book.slot >= book.opened:
                    return
                book.slot = book.slot + 1 if book.slot else book.opened
            asks = self._asks(state, book)
            odd = sorted({a.oracle.name for a in asks.values()} - set(COUNTABLE))
            if asks and self.setup.shuffled and odd:
                why = f"{', '.join(odd)} reports cannot go through a shuffler (counts: GRR, OUE)"
                self._halt_all(state, book, why, out)
                return
            if asks:
                requests = book.publish(
                    state.stream, asks, population=self.n, window=self.setup.window,
                    selection_key=self.selection_key,
                )  # fmt: skip
                out.extend(("request", r) for r in requests)
                return
            self._release(state, book, out, notes)

    def _lanes(self, state: StreamState) -> dict[str, Lane]:
        return self.runner.lanes(state)

    def _port(self, book: RoundBook, name: str) -> ReportsPort:
        return ReportsPort(self.n, self.plan.task, book.answers.get(name, {}))

    def _randomness(self, state: StreamState, slot: int, name: str) -> SlotRandomness:
        return SlotRandomness(self.plan.key, state.stream, slot, scope=name)

    def _asks(self, state: StreamState, book: RoundBook) -> dict[str, Ask]:
        """Each live mechanism's next request at the slot (none: every step can finish)."""
        asks: dict[str, Ask] = {}
        for name, lane in self._lanes(state).items():
            if lane.halted:
                continue
            slot = Slot(state.stream, book.slot, self._port(book, name),
                        self._randomness(state, book.slot, name))  # fmt: skip
            try:
                lane.mechanism.step(lane.state, slot)
            except AwaitingReports as waiting:
                asks[name] = waiting.ask
            except Exception:  # the driver's run below halts it with its reason
                pass
        return asks

    def _release(
        self, state: StreamState, book: RoundBook, out: list[Output], notes: Notes
    ) -> None:
        """Every step has its answers: release the slot through the shared driver."""
        slot = book.slot
        emitted = drive_slot(
            self._lanes(state), state.stream, slot,
            lambda name, _r, _c: self._port(book, name),
            lambda name: self._randomness(state, slot, name),
            accountant=state.accountant, stamp=self.runner.stamp,
        )  # fmt: skip
        state.last_closed = slot
        first = len(out)
        self.runner.apply(state, emitted, out, notes)
        out[first:] = stamp_central(out[first:], getattr(book, "shuffled", []))
        book.finish_slot(self.setup.window)
        notes.clocks.append((state.stream, slot, 1))

    def _halt_all(
        self, state: StreamState, book: RoundBook, reason: str, out: list[Output]
    ) -> None:
        for name in self.mechanisms:
            if name not in state.halted:
                self.runner.halt(state, name, book.slot, reason, False, out)


CENTRAL_DELTA = 1e-6
"""δ of the central ε a release behind a shuffler states."""


def stamp_central(outputs: list[Output], batches: Sequence[tuple[float, int]]) -> list[Output]:
    """Behind a shuffler: each release of the slot states the central ε its shuffled reports
    satisfy beside the local guarantee — the FMT closed-form amplification (spec sao2 §7) of
    the weakest batch of the slot (the largest ε₀, the smallest n), at ``CENTRAL_DELTA``; a slot
    without batches states nothing."""
    if not batches:
        return outputs
    eps0, n = max(e for e, _ in batches), min(n for _, n in batches)
    bound = fmt_closed_bound(eps0, n, CENTRAL_DELTA)
    central = (("epsilon", float(bound.epsilon)), ("delta", CENTRAL_DELTA),
               ("method", "fmt_closed" if bound.applicable else "none: n too small"), ("n", n))  # fmt: skip
    return [(kind, dataclasses.replace(x, central=central)) if kind == "release" else (kind, x)
            for kind, x in outputs]  # fmt: skip


def _runs(values: list[ReportItem]) -> Iterator[tuple[int, list[Any]]]:
    """``values`` cut into runs: consecutive reports of one partition, and each marker and
    each run of columns alone."""
    for (partition, alone), group in itertools.groupby(
        values, key=lambda v: (v[0], not isinstance(v[1], Report))
    ):
        items = [item for _, item in group]
        if alone:
            yield from ((partition, [m]) for m in items)
        else:
            yield partition, items


def _messages(items: list[Any]) -> Iterator[Report | Close]:
    """``items`` one message at a time (runs of columns as their reports)."""
    for item in items:
        if isinstance(item, ReportColumns):
            yield from item.reports()
        else:
            yield item


def _dead(reason: str, item: Report | Close, detail: str) -> Output:
    return ("dead_letter", DeadLetter(reason, item.stream, item.to_json(), detail))


@dataclass(frozen=True)
class ReportsOut:
    """The server stage's outputs: the mechanisms' (releases, ledger, dead letters, extra
    records) and the requests to publish."""

    releases: Stream[Release]
    ledger: Stream[LedgerEntry | Halt]
    dead_letters: Stream[DeadLetter]
    extra: Stream[ExtraRecord]
    requests: Stream[Request]

    def mechanism_out(self) -> MechanismOut:
        """The outputs every flow writes (``flows.io.outputs``)."""
        return MechanismOut(self.releases, self.ledger, self.dead_letters, self.extra)


@operator
def report_rounds(
    step_id: str,
    up: KeyedStream[ReportItem],
    *,
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    population: int,
    secret: NoiseKey | int | bytes,
    partitions: int = 1,
    split: BudgetSplit | None = None,
    epsilon: float | None = None,
    shuffled: bool = False,
) -> ReportsOut:
    """Run ``mechanisms`` in ``ldp-reports`` mode over every stream of ``up`` (keyed by
    stream): the module docstring. ``population`` is the enrolled devices ``n`` (the
    mechanisms' planning mirror), ``partitions`` the report topic's; ``shuffled``: the input
    is a shuffler's (``ReportBatch`` counts per request, and the forwarded markers)."""
    plan = ReportsPlan.of(
        make_plan(step_id, mechanisms, task, population, secret, None, None, split, epsilon),
        partitions, shuffled,
    )  # fmt: skip
    BOARD.set_run(insecure_seed=plan.key.insecure, evaluation=plan.split.evaluation)

    def builder(resume: StreamState | None) -> ReportRoundsLogic:
        return ReportRoundsLogic(step_id, plan, resume)

    tagged = op.key_rm("untag", op.stateful_batch("rounds", up, builder))  # type: ignore[arg-type]
    return ReportsOut(
        releases=op.filter_map("releases", tagged, _pick("release")),
        ledger=op.filter_map("ledger", tagged, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
        extra=op.filter_map("extra", tagged, _pick("extra")),
        requests=op.filter_map("requests", tagged, _pick("request")),
    )
