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
the users at a slot; ingest (``operators.ingest``), registration (``operators.registration``) and
the snapshotted state (``operators.stream_state``) are their own modules. This one closes slots,
steps the mechanisms, composes their spend and emits the slot's outputs.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from bytewax import operators as op
from bytewax.dataflow import Stream, operator
from bytewax.operators import KeyedStream, StatefulBatchLogic
from numpy.typing import NDArray

from privstream.mechanisms.accountant import (
    BudgetSplit,
    ClassKey,
    PopulationAccountant,
    check_shares,
)
from privstream.mechanisms.accounting import UnsupportedCharge
from privstream.mechanisms.client import ClientPath
from privstream.mechanisms.contract import Halt, LedgerEntry, Mechanism, Release, Slot
from privstream.mechanisms.errors import IncompatibleState, PrivacyBudgetExceeded
from privstream.mechanisms.seeding import EnrolmentOrder, NoiseKey, SlotRandomness
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.ingest import Ingest
from privstream.operators.metrics import BOARD, MARKERS_IGNORED, STEP_SECONDS
from privstream.operators.ports import Ports, TrustedCurator, ports_for
from privstream.operators.reasons import Output
from privstream.operators.registration import Preferences
from privstream.operators.stream_state import (
    STREAM_STATE_VERSION,
    StreamState,
    Tally,
    check_binding,
    failure,
)
from privstream.operators.watermark import PartitionWatermarks
from privstream.schema.events import (
    FAR_FUTURE,
    LATE,
    STREAM_HALTED,
    UNAUTHENTICATED_MARKER,
    DeadLetter,
    EventBatch,
    marker_authentic,
)

log = logging.getLogger(__name__)

MissingPolicy = Literal["carry_forward", "absent"]
ClockMode = Literal["data", "markers"]
DATA_SLOT_GAP = 10_000
MARKERS_SLOT_GAP = 64
"""Slots an event may run ahead of the authenticated clock: an honest producer writes a slot's
events shortly before its marker, and every open slot buffers ``n × d`` floats."""


@dataclass(frozen=True)
class SlottingConfig:
    """How events become slots.

    Attributes:
        lateness: slots a slot stays open after a later slot is seen (``≥ 0``; default 1).
        max_slot_gap: the largest jump ahead of the newest slot (``data`` clock) or of the last
            closed slot (``markers`` clock) an event may make; further events are
            ``far_future_slot`` dead letters (guards against a corrupt slot forcing millions of
            empty steps, and bounds the buffered open slots). 0 (default) takes the clock's
            default: 10,000 for ``data``, ``MARKERS_SLOT_GAP`` (64) for ``markers``.
        missing: ``carry_forward`` (default) or ``absent`` (spec §6.2).
        client_path: ``aggregate`` (fast path, default) or ``per-user`` (design §4).
        close_on_eof: release the still-open slots when a bounded input ends (default True;
            never with the ``markers`` clock, which only markers advance).
        partitions: input partitions feeding the streams (``≥ 1``; default 1). With several, a
            slot closes only once every partition has passed it (``operators.watermark``).
        clock: what closes slots. ``data`` (default; bounded trusted inputs: files, synthetic,
            in-process): the events' own slots (newest − lateness) and any end-of-slot marker.
            ``markers`` (Kafka runs): only end-of-slot markers authenticated with the clock key
            (``NoiseKey.clock_key``); events never advance the clock, an unauthenticated marker
            is an ``unauthenticated_marker`` dead letter.
        max_clock_jump: with the ``markers`` clock, the most slots one marker may advance a
            partition's clock (``≥ 1``; default 1: ``privstream clock`` and ``produce`` write
            one marker per slot); a marker jumping further is a ``far_future_slot`` dead letter
            and closes nothing.
        carry_slots: with ``carry_forward``, how many slots after the slot it was reported in a
            value is still read (``≥ 0``); after that the user is absent until they report
            again. None (default): ``w − 1`` of the user's window (the smallest window of the
            stream's mechanisms, or the user's own ``w_i``), so one report feeds at most ``w``
            consecutive slots — at most ε over its lifetime.
        released: each stream's last slot already on the release topic when this run started
            (read only when a resume withdraws users): a withdrawal starts after it, so the
            replay of published slots after a crash recomputes them as they were published
            (not part of the binding).
        grow_partitions: accept a resume whose input topic has more partitions than the
            recovery store was written for (``--grow-partitions``, ``kafka.grow_partitions``):
            the new partitions start at each stream's clock (its last released slot), so
            nothing released reopens and every budget is kept. Without it such a resume is
            refused, naming this option; fewer partitions are always refused. Not part of the
            binding: the grown count is recorded in the store at the resume.
    """

    lateness: int = 1
    max_slot_gap: int = 0
    missing: MissingPolicy = "carry_forward"
    client_path: ClientPath = "aggregate"
    close_on_eof: bool = True
    partitions: int = 1
    clock: ClockMode = "data"
    max_clock_jump: int = 1
    carry_slots: int | None = None
    grow_partitions: bool = False
    released: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.clock not in ("data", "markers"):
            raise ValueError(f"clock must be 'data' or 'markers', got {self.clock!r}")
        if self.max_slot_gap == 0:
            default = DATA_SLOT_GAP if self.clock == "data" else MARKERS_SLOT_GAP
            object.__setattr__(self, "max_slot_gap", default)
        if not isinstance(self.lateness, int) or self.lateness < 0:
            raise ValueError(f"lateness must be an integer >= 0, got {self.lateness!r}")
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if not isinstance(self.max_slot_gap, int) or self.max_slot_gap < 1:
            raise ValueError(f"max_slot_gap must be an integer >= 1, got {self.max_slot_gap!r}")
        if not isinstance(self.max_clock_jump, int) or self.max_clock_jump < 1:
            raise ValueError(f"max_clock_jump must be an integer >= 1, got {self.max_clock_jump!r}")
        if self.carry_slots is not None and (
            not isinstance(self.carry_slots, int) or self.carry_slots < 0
        ):
            raise ValueError(f"carry_slots must be an integer >= 0, got {self.carry_slots!r}")
        if self.missing not in ("carry_forward", "absent"):
            raise ValueError(f"missing must be 'carry_forward' or 'absent', got {self.missing!r}")
        if self.client_path not in ("aggregate", "per-user"):
            raise ValueError(
                f"client_path must be 'aggregate' or 'per-user', got {self.client_path!r}"
            )


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


class SlottedLogic(Ingest, StatefulBatchLogic[EventBatch, Output, StreamState]):
    def __init__(self, step_id: str, plan: SlottedPlan, resume: StreamState | None) -> None:
        self.step_id = step_id
        self.plan = plan
        self.trust = plan.ports
        self.mechanisms = plan.mechanisms
        self.task = plan.task
        self.n = plan.population
        self.cfg = plan.config
        self.binding = plan.binding()
        self.order = EnrolmentOrder.of(plan.key)
        self.clock_key = plan.key.clock_key()
        if resume is not None:
            if (
                resume.version != STREAM_STATE_VERSION
                or resume.mechanisms.keys() != self.mechanisms.keys()
            ):
                raise IncompatibleState(
                    f"step {step_id!r}: snapshot of stream {resume.stream!r} has slotting version "
                    f"{resume.version} for mechanisms {sorted(resume.mechanisms)}; this code runs "
                    f"version {STREAM_STATE_VERSION} of {sorted(self.mechanisms)}"
                )
            self._grow_partitions(resume)
            check_binding(step_id, resume, self.binding)
            for name, mechanism in self.mechanisms.items():
                mechanism.check_state(resume.mechanisms[name])
            self._withdraw(resume, step_id)
        self.state: StreamState | None = resume
        if resume is not None:
            for name in self.mechanisms:
                resume.tallies.setdefault(name, Tally())
                self._show_account(resume, name)

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
        for batch in values:
            state = self._state_for(batch.stream)
            marks = self._watermarks(state, batch.partition)
            if state.all_halted():
                out.extend(self._reject_all(batch, STREAM_HALTED, "; ".join(state.halted.values())))
                continue
            try:
                self._take(state, batch, marks, out)
            except Exception as exc:  # a broken stream halts; the process serves the others
                reason = f"slotting failed: {failure(exc)}"
                slot = -1 if state.last_closed is None else state.last_closed + 1
                for name in self.mechanisms:
                    if name not in state.halted:
                        self._halt(state, name, slot, reason, False, out)
                out.extend(self._reject_all(batch, STREAM_HALTED, reason))
        return out, StatefulBatchLogic.RETAIN

    def _take(
        self, state: StreamState, batch: EventBatch, marks: PartitionWatermarks, out: list[Output]
    ) -> None:
        """Ingest one batch and release every slot it lets close."""
        out.extend(("dead_letter", d) for d in self._ingest(state, batch))
        marker = self._marker(state, batch, marks, out)
        if marker is not None:
            marks.mark(batch.partition, marker)
        markers = self.cfg.clock == "markers"
        if self.cfg.partitions > 1 or markers:  # a slot closes once every partition passed it
            target = marks.closable(self.cfg.lateness, data=not markers)
            if target is not None:
                self._close_through(state, target, out)
            return
        if state.max_seen is not None:  # one partition: its order is the stream's order
            self._close_through(state, state.max_seen - self.cfg.lateness - 1, out)
        if marker is not None:
            self._close_through(state, marker, out)

    def _marker(
        self, state: StreamState, batch: EventBatch, marks: PartitionWatermarks, out: list[Output]
    ) -> int | None:
        """The batch's end-of-slot marker if it may close slots: markers obey the events' gap
        limit (a far-future one is a ``far_future_slot`` dead letter: it would step millions of
        empty slots), and one for an already released slot or before any event is counted.
        With the ``markers`` clock, ``_clock_marker`` decides instead."""
        t = batch.complete_through
        if t is None:
            return None
        if self.cfg.clock == "markers":
            return self._clock_marker(state, batch, t, marks.marks[batch.partition], out)
        if state.max_seen is None:
            MARKERS_IGNORED.labels(state.stream, "before_any_event").inc()
            return None
        if t > state.max_seen + self.cfg.max_slot_gap:
            MARKERS_IGNORED.labels(state.stream, "far_future").inc()
            detail = (
                f"end-of-slot marker more than {self.cfg.max_slot_gap} slots ahead of the stream"
            )
            out.append(("dead_letter", _marker_letter(FAR_FUTURE, state.stream, t, detail)))
            return None
        if state.last_closed is not None and t <= state.last_closed:
            MARKERS_IGNORED.labels(state.stream, "already_released").inc()
        return t

    def _clock_marker(
        self,
        state: StreamState,
        batch: EventBatch,
        t: int,
        previous: int | None,
        out: list[Output],
    ) -> int | None:
        """A marker of the ``markers`` clock, if it may advance its partition's clock.

        Guarantee: only a marker whose tag the clock key verifies counts (else an
        ``unauthenticated_marker`` dead letter), and it advances the partition's clock by at
        most ``max_clock_jump`` slots (else a ``far_future_slot`` dead letter); either closes
        nothing. So the slots closed are bounded by the authenticated markers written, whatever
        anyone else writes to the input topic."""
        stream = state.stream
        if not marker_authentic(self.clock_key, stream, t, batch.marker_tag):
            MARKERS_IGNORED.labels(stream, "unauthenticated").inc()
            detail = "end-of-slot marker without a valid tag of the clock key: it closes nothing"
            out.append(("dead_letter", _marker_letter(UNAUTHENTICATED_MARKER, stream, t, detail)))
            return None
        if previous is None:
            previous = state.last_closed
        if previous is not None and t <= previous:
            MARKERS_IGNORED.labels(stream, "already_released").inc()
            return None
        if previous is not None and t - previous > self.cfg.max_clock_jump:
            MARKERS_IGNORED.labels(stream, "far_future").inc()
            detail = (
                f"end-of-slot marker advances the clock by {t - previous} slots (from {previous}),"
                f" more than max_clock_jump={self.cfg.max_clock_jump}: it closes nothing"
            )
            out.append(("dead_letter", _marker_letter(FAR_FUTURE, stream, t, detail)))
            return None
        return t

    def _watermarks(self, state: StreamState, partition: int) -> PartitionWatermarks:
        """The stream's progress per input partition (made by its first batch; a snapshot of
        another partition count is refused at start by the binding)."""
        marks = state.watermarks
        if marks is None:
            marks = state.watermarks = PartitionWatermarks(self.cfg.partitions)
        marks.check(partition)
        return marks

    def on_eof(self) -> tuple[Iterable[Output], bool]:
        out: list[Output] = []
        state = self.state
        if (
            self.cfg.close_on_eof
            and self.cfg.clock == "data"  # the markers clock: only markers close slots
            and state is not None
            and not state.all_halted()
            and state.max_seen is not None
        ):
            self._close_through(state, state.max_seen, out)
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> StreamState:
        assert self.state is not None, "snapshot before the first event"
        return copy.deepcopy(self.state)

    def _state_for(self, stream: str) -> StreamState:
        if self.state is None:
            self.state = StreamState(
                stream=stream,
                mechanisms={name: m.initial_state() for name, m in self.mechanisms.items()},
                current=self._blank(),
                tallies={name: Tally() for name in self.mechanisms},
                clients={name: m.client_state() for name, m in self.mechanisms.items()},
                binding=dict(self.binding),
                accountant=PopulationAccountant(evaluation=self.plan.split.evaluation),
            )
            if isinstance(self.trust, TrustedCurator):
                self._register(self.state, self.trust.preferences)
            for name in self.mechanisms:
                self._show_account(self.state, name)
        return self.state

    def _show_account(self, state: StreamState, name: str) -> None:
        """Show the ledger of ``name`` (and how full the population is) on the metrics
        endpoint."""
        self._show_enrolment(state)
        BOARD.update(
            state.stream,
            name,
            self.mechanisms[name].privacy_cost,
            self.n,
            state.tallies[name],
            name in state.halted,
        )

    # -- closing slots -------------------------------------------------------------------------

    def _close_through(self, state: StreamState, target: int, out: list[Output]) -> None:
        """Release every slot up to ``target`` that is not released yet, in order.

        The first release starts at ``_first_slot``; reports buffered for older slots (which
        only an event sender chose) become ``late_event`` dead letters, so stale events can
        neither move the start back nor vanish uncounted."""
        if state.last_closed is None:
            start = self._first_slot(state, target)
            if start is None or start > target:
                return
            out.extend(("dead_letter", d) for d in self._drop_before(state, start))
        else:
            start = state.last_closed + 1
        for slot in range(start, target + 1):
            if state.all_halted():
                break
            self._step(state, slot, out)
        if target >= start:
            BOARD.update_clock(state.stream, state.last_closed, target - start + 1)

    def _first_slot(self, state: StreamState, target: int) -> int | None:
        """The stream's first slot, decided by its first close through ``target`` (None while
        nothing is buffered): the oldest slot buffered, but with the ``markers`` clock at most
        ``max_clock_jump`` slots before the first authenticated marker's ``target``, and with
        the ``data`` clock not before the largest of the partitions' first slots
        (``PartitionWatermarks.start``: a function of each partition's own order)."""
        buffered = state.open_slots.keys() | state.newcomers.keys()
        if not buffered:
            return None
        start = min(buffered)
        if self.cfg.clock == "markers":
            return max(start, target - self.cfg.max_clock_jump + 1)
        first = state.watermarks.start() if state.watermarks is not None else None
        return start if first is None else max(start, first)

    def _drop_before(self, state: StreamState, start: int) -> list[DeadLetter]:
        """The reports buffered for slots before ``start`` (the stream's first slot), removed
        and turned into ``late_event`` dead letters (one per report, as its event would have
        been had it come after the start was known)."""
        detail = (
            f"slot before the stream's first slot {start} (set by its first close: the first "
            "authenticated marker, or the partitions' first slots with the data clock)"
        )
        names: dict[int, str] | None = None
        letters: list[DeadLetter] = []
        for slot in sorted(s for s in state.open_slots if s < start):
            values = state.open_slots.pop(slot)
            users = np.flatnonzero(~np.isnan(values.reshape(self.n, -1)).any(axis=1))
            if names is None and state.id_kind != "dense":
                names = {i: u for u, i in state.directory.items()}
            for j in users.tolist():
                user: Any = j if names is None else names.get(j, j)
                value = values[j]
                text = json.dumps(
                    {"stream": state.stream, "user": user, "slot": slot,
                     "value": value.tolist() if value.ndim else float(value)}
                )  # fmt: skip
                letters.append(DeadLetter(LATE, state.stream, text, detail))
        for slot in sorted(s for s in state.newcomers if s < start):
            for _value, text, original in state.newcomers.pop(slot).values():
                letters.append(DeadLetter(LATE, state.stream, text, detail, original))
        return letters

    def _step(self, state: StreamState, slot: int, out: list[Output]) -> None:
        """Step every live mechanism through ``slot``, compose their spend, then release.

        Nothing of the slot is emitted before the population accountant accepted it; a
        mechanism that fails (a ledger refusal or any other error) halts alone, with its reason
        in the log and the ``halted`` metric, and the others go on.
        """
        self._admit_newcomers(state, slot, out)
        values = self._slot_values(state, slot)
        state.last_closed = slot
        stepped: dict[str, tuple[Any, list[Release | LedgerEntry]]] = {}
        devices: dict[str, Any] = {}
        for name in self.mechanisms:
            if name in state.halted:
                continue
            result = self._step_one(state, name, slot, values, out)
            if result is not None:
                stepped[name], devices[name] = result
        if not self._compose(state, slot, stepped, out):
            return
        worst = state.accountant.worst()
        for name, (new_state, events) in stepped.items():
            stamped = [self._stamp(event, worst) for event in events]
            state.mechanisms[name] = new_state
            if devices[name] is not None:  # the devices' state moves on with the release
                state.clients[name] = devices[name]
            state.tallies[name].record(stamped)
            self._show_account(state, name)
            for event in stamped:
                out.append(("release", event) if isinstance(event, Release) else ("ledger", event))
        if worst is not None:
            scope, budget, spent = worst
            measure = next(iter(self.mechanisms.values())).privacy_cost.measure.kind
            BOARD.update_population(state.stream, budget, scope, spent, len(self.mechanisms),
                                    measure)  # fmt: skip

    def _step_one(
        self, state: StreamState, name: str, slot: int, values: NDArray[Any], out: list[Output]
    ) -> tuple[tuple[Any, list[Release | LedgerEntry]], Any] | None:
        """Step mechanism ``name`` through ``slot`` with the port of its trust mode: its new
        state and events, and the client state its port's devices ended with (None when it
        asked nothing of them); None when it failed and was halted."""
        randomness = SlotRandomness(self.plan.key, state.stream, slot, scope=name)
        port = self.trust.port(state, values, randomness, state.clients.get(name))
        started = time.perf_counter()
        try:
            result = self.mechanisms[name].step(
                state.mechanisms[name], Slot(state.stream, slot, port, randomness)
            )
        except PrivacyBudgetExceeded as exc:
            self._halt(state, name, slot, f"privacy invariant violated at slot {slot}: {exc}",
                       True, out)  # fmt: skip
            return None
        except Exception as exc:  # one mechanism's failure never takes the process down
            self._halt(state, name, slot, f"failed at slot {slot}: {failure(exc)}", False, out)
            return None
        STEP_SECONDS.labels(state.stream, name).observe(time.perf_counter() - started)
        return result, getattr(port, "client_state_after", None)

    def _slot_values(self, state: StreamState, slot: int) -> NDArray[np.float64]:
        """Users' values at ``slot``: its reports, over the carried-forward ones by default.

        A value is carried at most ``carry`` slots after the slot it was reported in (default
        ``w − 1``: it feeds at most ``w`` consecutive slots, one window); after that its user is
        absent until they report again. A withdrawn user is absent from their withdrawal on."""
        reported = state.open_slots.pop(slot, None)
        if self.cfg.missing == "absent":
            return self._unwithdrawn(state, slot, reported if reported is not None else
                                     self._blank())  # fmt: skip
        values = state.current
        if state.reported_at is None:
            state.reported_at = np.full(self.n, np.iinfo(np.int64).min // 2, dtype=np.int64)
        if reported is not None:
            fresh = ~np.isnan(reported.reshape(self.n, -1)).any(axis=1)
            values[fresh] = reported[fresh]
            state.reported_at[fresh] = slot
        values[state.reported_at < slot - self._carry(state)] = np.nan
        return self._unwithdrawn(state, slot, values)

    def _carry(self, state: StreamState) -> int | NDArray[np.int64]:
        """Slots each user's value is carried: the plan's ``carry``, or with registered
        personal windows ``w_i − 1`` where lower (the default, ``carry_slots`` None)."""
        carry = self.plan.carry
        windows = state.windows
        if self.cfg.carry_slots is not None or windows is None:
            return carry
        return np.where(windows > 0, np.minimum(windows - 1, carry), carry)

    def _halt(
        self,
        state: StreamState,
        name: str,
        slot: int,
        reason: str,
        violation: bool,
        out: list[Output],
    ) -> None:
        """Stop ``name`` on the stream from ``slot`` on: log, metric and a ``Halt`` record on
        the ledger output (nothing of ``slot`` is released by it)."""
        state.halted[name] = f"{name}: {reason}"
        if violation:
            state.tallies[name].violations += 1
        self._show_account(state, name)
        out.append(("ledger", Halt(state.stream, name, slot, state.halted[name])))
        log.error("step %s: stream %r halted: %s", self.step_id, state.stream, state.halted[name])

    def _compose(
        self,
        state: StreamState,
        slot: int,
        stepped: dict[str, tuple[Any, list[Release | LedgerEntry]]],
        out: list[Output],
    ) -> bool:
        """Charge the population accountant with every mechanism's accounting events (a halted
        mechanism's last ones still count); on an overspend, or charges the accountant does not
        support or cannot compose, halt them all before release."""
        charges = []
        for name in self.mechanisms:
            events = stepped[name][1] if name in stepped else ()
            entry = next((e for e in events if isinstance(e, LedgerEntry)), None)
            entry = entry or state.tallies[name].last_ledger
            if entry is not None:
                charges.append(
                    (entry.accounting_events, self.plan.shares[name], self._population(name))
                )
        try:
            state.accountant.charge_events(slot, charges)
        except (PrivacyBudgetExceeded, UnsupportedCharge) as exc:
            for name in stepped:
                reason = f"population budget refused slot {slot}: {exc}"
                self._halt(state, name, slot, reason, True, out)
            return False
        return True

    def _population(self, name: str) -> ClassKey | None:
        """The one class of a population without per-user requirements: the declared window
        and the population's budget (None when users register their own requirements)."""
        if self.trust.tracks_requirements:
            return None
        return ClassKey(self.mechanisms[name].privacy_cost.window or 1, self.plan.epsilon)

    def _stamp(
        self, event: Release | LedgerEntry, worst: tuple[int, float, float] | None
    ) -> Release | LedgerEntry:
        """Mark the run's provenance on every output; ledger entries get the composed spend
        ``worst`` of the slot (``PopulationAccountant.worst``)."""
        flags: dict[str, Any] = {}
        if self.plan.key.insecure:
            flags["insecure_seed"] = True
        if self.plan.split.evaluation:
            flags["evaluation"] = True
        if isinstance(event, LedgerEntry) and worst is not None:
            flags["population_budget"], flags["population_spent"] = worst[1], worst[2]
        return dataclasses.replace(event, **flags) if flags else event


def _marker_letter(reason: str, stream: str, t: int, detail: str) -> DeadLetter:
    """The dead letter of a refused end-of-slot marker (its tag, if any, is not kept)."""
    text = json.dumps({"stream": stream, "end_of_slot": t}, separators=(",", ":"))
    return DeadLetter(reason, stream, text, detail)


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
    )
