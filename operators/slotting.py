"""Deterministic slots over keyed event batches, and the operator that steps a mechanism.

Design §5: a slot closes on the stream's clock — never on wall-clock time — so a replay after a
crash closes the same slots with the same contents. Two clocks (``SlottingConfig.clock``):
``data`` (bounded trusted inputs) closes when the watermark (max event slot minus the allowed
lateness) passes a slot, when a batch marks it complete, or at end of input; ``markers`` (Kafka
runs, where anyone writing to the input topic is an adversary) closes only on end-of-slot
markers authenticated with the clock key, at most ``max_clock_jump`` slots per marker. Every
slot from the stream's first one on is stepped, including empty ones (the ledger must age). One
report per user per slot (first wins); everything unusable goes to the dead-letter stream with a
reason.

Users keep their last value between slots (``carry_forward``, spec §6.2) for at most
``carry_slots`` slots after the report (default ``w − 1``), unless the policy is ``absent``, in
which case only users that reported at a slot are eligible at it.

The mechanisms' declared trust mode (design §4, ``operators.ports``) decides what they see of
the users at a slot. The operator is composed of parts with one job each (docs/operator.md): the
slot clock (``operators.clock``), the windower (``operators.ingest``), the population
(``operators.registration``) and the runner (``operators.runner``, over the shared step driver
``mechanisms.driver``), over one snapshotted state (``operators.stream_state``). This module
composes them into the Bytewax logic and builds the operator.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bytewax import operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import KeyedStream, StatefulBatchLogic

from privstream.mechanisms.accountant import (
    BudgetSplit,
    check_shares,
)
from privstream.mechanisms.contract import ExtraRecord, Halt, LedgerEntry, Mechanism, Release
from privstream.mechanisms.driver import failure
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import EnrolmentOrder, NoiseKey
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.clock import DATA_SLOT_GAP as DATA_SLOT_GAP
from privstream.operators.clock import MARKERS_SLOT_GAP as MARKERS_SLOT_GAP
from privstream.operators.clock import ClockMode as ClockMode
from privstream.operators.clock import MissingPolicy as MissingPolicy
from privstream.operators.clock import SlotClock
from privstream.operators.clock import SlottingConfig as SlottingConfig
from privstream.operators.ingest import Windower
from privstream.operators.metrics import BOARD, EVENTS, MARKERS_IGNORED, STEP_SECONDS
from privstream.operators.ports import Ports, TrustedCurator, ports_for
from privstream.operators.reasons import Notes, Output
from privstream.operators.registration import Population, Preferences
from privstream.operators.runner import Runner
from privstream.operators.stream_state import (
    StreamState,
    Tally,
    check_binding,
    check_version,
    fresh_state,
)
from privstream.operators.watermark import PartitionWatermarks
from privstream.schema.events import (
    STREAM_HALTED,
    DeadLetter,
    EventBatch,
)

log = logging.getLogger(__name__)

HELD_BACK_BATCHES = 16
"""Batches of one stream, every one from input partition 0 while the slotting expects several
partitions, after which the operator warns (once per stream and process) that the other
partitions hold the stream back (``SlottedLogic._warn_partition_zero``)."""


@dataclass(frozen=True)
class SlottedPlan:
    """What every stream of one operator runs: the mechanisms with their budget shares, the
    noise key, the trust mode's ports and the binding a snapshot must match."""

    mechanisms: dict[str, Mechanism[Any, Any]]
    shares: dict[str, float]
    task: EstimationTask
    population: int
    key: NoiseKey
    config: SlottingConfig
    ports: Ports
    split: BudgetSplit
    epsilon: float
    """The population's budget per window (before the split)."""

    @property
    def carry(self) -> int:
        """Slots a value is carried after its report: ``carry_slots``, or ``w − 1`` of the
        smallest window of the mechanisms (a personalized user's own ``w_i`` lowers it)."""
        if self.config.carry_slots is not None:
            return self.config.carry_slots
        windows = [m.privacy_cost.window or 1 for m in self.mechanisms.values()]
        return min(windows) - 1

    def binding(self) -> dict[str, str]:
        """The noise key's fingerprint and every parameter a replay depends on."""
        cfg = self.config
        out = {
            "noise key": self.key.fingerprint(),
            "incarnation": self.key.incarnation_id(),
            "population": str(self.population),
            "task": repr(self.task),
            "slotting": f"lateness={cfg.lateness} missing={cfg.missing} "
            f"client_path={cfg.client_path} max_slot_gap={cfg.max_slot_gap} "
            f"clock={cfg.clock} max_clock_jump={cfg.max_clock_jump} "
            f"carry_slots={self.carry} partitions={cfg.partitions}",
            "budget split": repr(self.split),
            "population epsilon": repr(self.epsilon),
        }
        for name, mechanism in self.mechanisms.items():
            out[f"mechanism {name}"] = repr(mechanism.config)
        return out


class SlottedLogic(StatefulBatchLogic[EventBatch, Output, StreamState]):
    """The slotted operator's logic of one stream, composed of parts with one job each (in
    the style of Bytewax's windowing operators): the slot clock (``SlotClock``), the
    population (``Population``), the windower (``Windower``) and the runner (``Runner``, the
    shared step driver). They share one state, ``StreamState``, snapshotted as one frozen
    copy; no part holds state of its own between calls."""

    def __init__(self, step_id: str, plan: SlottedPlan, resume: StreamState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        self.trust = plan.ports
        self.mechanisms = plan.mechanisms
        self.n = plan.population
        self.cfg = plan.config
        self.binding = plan.binding()
        self.clock = SlotClock(plan.config, plan.key.clock_key())
        self.population = Population(
            plan.population, plan.task, plan.ports, EnrolmentOrder.of(plan.key), plan.config
        )
        self.windower = Windower(plan.config, plan.task, self.population, plan.carry)
        self.runner = Runner(step_id, plan, self.population, self.windower)
        if resume is not None:
            check_version(step_id, resume, self.mechanisms)
            self._grow_partitions(resume)
            check_binding(step_id, resume, self.binding)
            for name, mechanism in self.mechanisms.items():
                mechanism.check_state(resume.mechanisms[name])
            self.population.withdraw(resume, step_id)
        self.state: StreamState | None = resume
        self.zero_batches = 0  # batches while partition 0 alone delivered (not snapshotted)
        if resume is not None:
            for name in self.mechanisms:
                resume.tallies.setdefault(name, Tally())
            self._show_accounts(resume)

    def _grow_partitions(self, resume: StreamState) -> None:
        """Take a larger input partition count than ``resume`` was written for, if allowed.

        Guarantee: the stream's state — ledgers, accountant, released slots — is kept; only its
        watermarks gain the new partitions, which start at the stream's last released slot
        (``PartitionWatermarks.grow``), so an event of a new partition for a released slot is
        ``late_event``. A smaller count, or a larger one without ``grow_partitions``, is
        refused with what changed and what to do."""
        stored, now = _partitions_in(resume.binding.get("slotting", "")), self.cfg.partitions
        if stored is None or stored == now:
            return
        where = f"step {self.step_id!r}: the recovery store of stream {resume.stream!r}"
        if stored > now:
            raise IncompatibleState(
                f"{where} was written for {stored} input partitions, but the input topic has "
                f"{now}: Kafka never removes partitions, so the topic was re-created or another "
                "topic is read. Point the flow at the original topic (or restore it)."
            )
        if not self.cfg.grow_partitions:
            raise IncompatibleState(
                f"{where} was written for {stored} input partitions, but the input topic has "
                f"{now} now (partitions were added). To go on with every budget kept, resume "
                "once with --grow-partitions (kafka.grow_partitions = true in a flow file): the "
                "new partitions start at the stream's last released slot."
            )
        resume.binding["slotting"] = resume.binding["slotting"].replace(
            f"partitions={stored}", f"partitions={now}"
        )
        if resume.watermarks is not None:
            resume.watermarks.grow(now, resume.last_closed)
        log.warning(
            "step %s: stream %r grows from %d to %d input partitions at slot %s (recorded in the "
            "recovery store)", self.step_id, resume.stream, stored, now, resume.last_closed,
        )  # fmt: skip

    # -- Bytewax callbacks ---------------------------------------------------------------------

    def on_batch(self, values: list[EventBatch]) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        notes = Notes()
        for batch in values:
            state = self._state_for(batch.stream)
            marks = self.clock.watermarks(state, batch.partition)
            if state.all_halted():
                detail = "; ".join(state.halted.values())
                out.extend(self.windower.reject_all(batch, STREAM_HALTED, detail))
                continue
            try:
                self._take(state, batch, marks, out, notes)
                self._warn_partition_zero(state, marks)
            except Exception as exc:  # a broken stream halts; the process serves the others
                reason = f"slotting failed: {failure(exc)}"
                slot = -1 if state.last_closed is None else state.last_closed + 1
                for name in self.mechanisms:
                    if name not in state.halted:
                        self.runner.halt(state, name, slot, reason, False, out)
                out.extend(self.windower.reject_all(batch, STREAM_HALTED, reason))
        self.publish(notes)
        return out, StatefulBatchLogic.RETAIN

    def _take(
        self,
        state: StreamState,
        batch: EventBatch,
        marks: PartitionWatermarks,
        out: list[Output],
        notes: Notes,
    ) -> None:
        """Ingest one batch and release every slot it lets close."""
        out.extend(("dead_letter", d) for d in self.windower.ingest(state, batch, notes))
        for target in self.clock.targets(state, batch, marks, out, notes):
            self._close_through(state, target, out, notes)

    def _warn_partition_zero(self, state: StreamState, marks: PartitionWatermarks) -> None:
        """Warn once when ``HELD_BACK_BATCHES`` batches of a stream that has released nothing
        all came from partition 0 while the slotting expects several: no slot can close until
        every partition delivered. Either the source does not stamp the Kafka partition on its
        batches (Bytewax's own ``KafkaSource``: every batch says partition 0, and the
        per-partition watermarks are lost), or the producers write the stream to partition 0
        only. With one partition configured the two cannot be told apart (docs/composing.md)."""
        if self.zero_batches < 0 or state.last_closed is not None:
            return
        if not marks.only_first_delivered():
            self.zero_batches = 0
            return
        self.zero_batches += 1
        if self.zero_batches < HELD_BACK_BATCHES:
            return
        self.zero_batches = -1  # warned
        log.warning(
            "step %s: stream %r: %d batches, every one from input partition 0, while the "
            "slotting expects %d partitions, so no slot can close until every partition "
            "delivered. A source that does not stamp the Kafka partition (Bytewax's own "
            "KafkaSource) loses the per-partition watermarks: read the topic with "
            "privstream.dataflow.KafkaEventSource and parse_raw_batch (docs/composing.md). "
            "Otherwise the producers write this stream to partition 0 only: spread it over "
            "every partition (privstream produce --spread).",
            self.step_id, state.stream, HELD_BACK_BATCHES, self.cfg.partitions,
        )  # fmt: skip

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        notes = Notes()
        state = self.state
        if (
            self.cfg.close_on_eof
            and self.cfg.clock == "data"  # the markers clock: only markers close slots
            and state is not None
            and not state.all_halted()
            and state.max_seen is not None
        ):
            self._close_through(state, state.max_seen, out, notes)
        self.publish(notes)
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> StreamState:
        assert self.state is not None, "snapshot before the first event"
        return copy.deepcopy(self.state)

    def _state_for(self, stream: str) -> StreamState:
        if self.state is None:
            self.state = fresh_state(stream, self.mechanisms, self.population.blank(),
                                     self.binding, self.plan.split.evaluation)  # fmt: skip
            if isinstance(self.trust, TrustedCurator):
                self.population.register(self.state, self.trust.preferences)
            self._show_accounts(self.state)
        return self.state

    # -- the metrics, derived from what a call emitted -----------------------------------------

    def publish(self, notes: Notes) -> None:
        """Put what a call did (``notes``) and the stream's accounts on the metrics board."""
        show_notes(notes, self.mechanisms)
        if self.state is not None:
            self._show_accounts(self.state)

    def _show_accounts(self, state: StreamState) -> None:
        show_accounts(state, self.population.enrolment(state), self.mechanisms, self.n)

    # -- closing slots -------------------------------------------------------------------------

    def _close_through(
        self, state: StreamState, target: int, out: list[Output], notes: Notes
    ) -> None:
        """Release every slot up to ``target`` that is not released yet, in order.

        The first release starts at ``SlotClock.first_slot``; reports buffered for older
        slots (which only an event sender chose) become ``late_event`` dead letters, so stale
        events can neither move the start back nor vanish uncounted."""
        if state.last_closed is None:
            start = self.clock.first_slot(state, target)
            if start is None or start > target:
                return
            out.extend(("dead_letter", d) for d in self.windower.drop_before(state, start))
        else:
            start = state.last_closed + 1
        for slot in range(start, target + 1):
            if state.all_halted():
                break
            self.runner.step(state, slot, out, notes)
        if target >= start:
            notes.clocks.append((state.stream, state.last_closed, target - start + 1))


def show_notes(notes: Notes, mechanisms: dict[str, Mechanism[Any, Any]]) -> None:
    """Put what one call did (``notes``) on the metrics board."""
    for stream, why in notes.markers:
        MARKERS_IGNORED.labels(stream, why).inc()
    for stream, accepted in notes.events:
        EVENTS.labels(stream).inc(accepted)
    for stream, name, seconds in notes.steps:
        STEP_SECONDS.labels(stream, name).observe(seconds)
    if notes.populations:
        measure = next(iter(mechanisms.values())).privacy_cost.measure.kind
        for stream, budget, scope, spent in notes.populations:
            BOARD.update_population(stream, budget, scope, spent, len(mechanisms), measure)
    for stream, last_closed, advance in notes.clocks:
        BOARD.update_clock(stream, last_closed, advance)


def show_accounts(
    state: StreamState,
    enrolment: tuple[int, int] | None,
    mechanisms: dict[str, Mechanism[Any, Any]],
    n: int,
) -> None:
    """Show every mechanism's ledger on ``state`` and how full the population is
    (``enrolment``: enrolled users and n, as ``Population.enrolment`` gives them)."""
    if enrolment is not None:
        BOARD.update_enrolment(state.stream, *enrolment)
    for name, mechanism in mechanisms.items():
        BOARD.update(state.stream, name, mechanism.privacy_cost, n,
                     state.tallies[name], name in state.halted,
                     division=mechanism.division)  # fmt: skip


def _partitions_in(slotting: str) -> int | None:
    """The partition count in a stored binding's ``slotting`` line (None: not recorded)."""
    for part in slotting.split():
        if part.startswith("partitions="):
            return int(part.removeprefix("partitions="))
    return None


@dataclass(frozen=True)
class MechanismOut:
    """The three outputs of a mechanism operator."""

    releases: Stream[Release]
    """Public releases, one per stream per slot."""

    ledger: Stream[LedgerEntry | Halt]
    """Ledger entries (privacy spend), one per stream, mechanism and slot, and a ``Halt``
    record where a mechanism stopped."""

    dead_letters: Stream[DeadLetter]
    """Inputs the operator could not use, each with its reason."""

    extra: Stream[ExtraRecord] | None = None
    """Records of the families' declared extra outputs (``Family.outputs``), every output
    name on one stream (``ExtraRecord.output`` says which); a flow routes each name only where
    the operator gave it a sink. None: an operator assembled without one (no output)."""


def _pick(kind: str) -> Any:
    def pick(item: Output) -> Any:
        return item[1] if item[0] == kind else None

    return pick


def make_plan(
    step_id: str,
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    population: int,
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    registration: Preferences | None = None,
    split: BudgetSplit | None = None,
    epsilon: float | None = None,
) -> SlottedPlan:
    """Validate what every stream of one operator runs (see ``slotted_mechanism``) and bind it
    to the trust mode's ports the mechanisms declare."""
    cfg = slotting or SlottingConfig()
    names = [m.name for m in mechanisms]
    if not names or len(set(names)) != len(names):
        raise ValueError(
            f"step {step_id!r}: mechanisms must be non-empty and distinct, got {names}"
        )
    split = split or BudgetSplit.parse(None, len(names))
    if len(split.shares) != len(names):
        raise ValueError(f"step {step_id!r}: {len(split.shares)} budget shares for {names}")
    costs = [(m.name, m.privacy_cost) for m in mechanisms]
    if epsilon is None:
        epsilon = costs[0][1].budget / split.shares[0]
    check_shares(costs, split, epsilon)
    return SlottedPlan(
        mechanisms={m.name: m for m in mechanisms},
        shares=dict(zip(names, split.shares, strict=True)),
        task=task,
        population=population,
        key=NoiseKey.coerce(secret),
        config=cfg,
        ports=ports_for(mechanisms, task, cfg.client_path, registration),
        split=split,
        epsilon=epsilon,
    )


@operator
def slotted_mechanism(
    step_id: str,
    up: KeyedStream[EventBatch],
    *,
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    population: int,
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    registration: Preferences | None = None,
    split: BudgetSplit | None = None,
    epsilon: float | None = None,
) -> MechanismOut:
    """Run ``mechanisms`` over every stream of ``up`` (keyed by stream name), slot by slot.

    The mechanisms share one slotting of the input (events are parsed, deduplicated and
    buffered once) and each keeps its own ledger; the population accountant composes their
    spend per stream and refuses an overspend before release (``mechanisms.accountant``).
    ``split`` gives each mechanism's share of the population budget ``epsilon`` (default: the
    first mechanism's ε over its share), in order; every mechanism must have been built with
    its share (refused otherwise). One mechanism needs no split, several must say how they
    split — or that they are an evaluation. A stream's state lives in one Bytewax state
    (recovered from snapshots, bound to the noise key's fingerprint and every privacy
    parameter); randomness derives from ``secret`` (a ``NoiseKey``; an int is an insecure seed
    and marks every output), the stream and the slot (design §6), so a replayed slot releases
    byte-identical output. A failing mechanism halts on that stream before anything of the
    offending slot is released; once all are halted, the stream's events become
    ``stream_halted`` dead letters. The trust mode is the one the mechanisms declare
    (``operators.ports``); ``registration`` is the registration table of a ``cdp`` stream.
    """
    plan = make_plan(step_id, mechanisms, task, population, secret, slotting, registration,
                     split, epsilon)  # fmt: skip
    BOARD.set_run(insecure_seed=plan.key.insecure, evaluation=plan.split.evaluation)

    def builder(resume: StreamState | None) -> SlottedLogic:
        return SlottedLogic(step_id, plan, resume)

    tagged = op.key_rm("untag", op.stateful_batch("slots", up, builder))
    return MechanismOut(
        releases=op.filter_map("releases", tagged, _pick("release")),
        ledger=op.filter_map("ledger", tagged, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
        extra=op.filter_map("extra", tagged, _pick("extra")),
    )
