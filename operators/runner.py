"""The runner of the slotted operator: steps a closing slot with the shared step driver
(``mechanisms.driver``) and turns what the slot emitted into the operator's outputs.

Nothing of a slot is emitted before the population accountant accepted it; a mechanism that
fails (a ledger refusal or any other error) halts alone, with its reason in the log and a
``Halt`` record on the ledger output, and the others go on. The metrics are not written here:
the step's seconds and the composed spend go on the call's ``Notes``, and the operator shows
them after the call (``SlottedLogic.publish``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from privstream.mechanisms.accountant import ClassKey
from privstream.mechanisms.contract import ExtraRecord, Halt, Release
from privstream.mechanisms.driver import Lane, SlotStep, Stamp, drive_slot, last_charges
from privstream.mechanisms.seeding import SlotRandomness
from privstream.operators.ingest import Windower
from privstream.operators.reasons import Notes, Output
from privstream.operators.registration import Population
from privstream.operators.stream_state import StreamState

if TYPE_CHECKING:
    from privstream.operators.slotting import SlottedPlan

log = logging.getLogger(__name__)


class Runner:
    """Steps every live mechanism of a stream through a closing slot and emits its outputs."""

    def __init__(
        self, step_id: str, plan: SlottedPlan, population: Population, windower: Windower
    ) -> None:
        self.step_id = step_id
        self.plan = plan
        self.population = population
        self.windower = windower
        self.stamp = Stamp(insecure=plan.key.insecure, evaluation=plan.split.evaluation)

    def step(self, state: StreamState, slot: int, out: list[Output], notes: Notes) -> None:
        """Admit the slot's newcomers, take its values, step it (``drive_slot``), then apply
        what it emitted to ``state`` and ``out``."""
        self.population.admit_newcomers(state, slot, out)
        values = self.windower.slot_values(state, slot)
        trust = self.plan.ports

        def port(randomness: SlotRandomness, clients: Any) -> Any:
            return trust.port(state, values, randomness, clients)

        self.step_with(state, slot, port, out, notes)

    def step_with(
        self,
        state: StreamState,
        slot: int,
        port: Callable[[SlotRandomness, Any], Any],
        out: list[Output],
        notes: Notes,
    ) -> None:
        """Step the slot through ``port(randomness, devices' state)`` (a decision stage's
        port over its shards' aggregates: ``operators.user_shards``) and apply what it
        emitted."""
        state.last_closed = slot

        def port_for(name: str, randomness: SlotRandomness, clients: Any) -> Any:
            return port(randomness, clients)

        def randomness_for(name: str) -> SlotRandomness:
            return SlotRandomness(self.plan.key, state.stream, slot, scope=name)

        emitted = drive_slot(
            self.lanes(state), state.stream, slot, port_for, randomness_for,
            accountant=state.accountant, stamp=self.stamp,
        )  # fmt: skip
        self.apply(state, emitted, out, notes)

    def lanes(self, state: StreamState) -> dict[str, Lane]:
        """Each mechanism of the plan on ``state``, in the plan's order, as the driver sees it."""
        return {
            name: Lane(
                mechanism,
                state.mechanisms[name],
                state.clients.get(name),
                self.plan.shares[name],
                self.class_of(name),
                last_charges(mechanism, state.tallies[name].last_ledger),
                name in state.halted,
            )
            for name, mechanism in self.plan.mechanisms.items()
        }

    def apply(self, state: StreamState, emitted: SlotStep, out: list[Output], notes: Notes) -> None:
        """Put what the slot emitted into ``state`` and ``out``: its halts in order, then each
        released mechanism's new state, devices' state, tally and events."""
        for halted in emitted.halts:
            self.halt(state, halted.name, emitted.slot, halted.reason, halted.violation, out)
        for name, stepped in emitted.stepped.items():
            notes.steps.append((state.stream, name, stepped.seconds))
            state.mechanisms[name] = stepped.state
            if stepped.clients is not None:  # the devices' state moves on with the release
                state.clients[name] = stepped.clients
            state.tallies[name].record(stepped.events)
            for event in stepped.events:
                out.append((_kind(event), event))
        if emitted.worst is not None:
            scope, budget, spent = emitted.worst
            notes.populations.append((state.stream, budget, scope, spent))

    def halt(
        self,
        state: StreamState,
        name: str,
        slot: int,
        reason: str,
        violation: bool,
        out: list[Output],
    ) -> None:
        """Stop ``name`` on the stream from ``slot`` on: log and a ``Halt`` record on the
        ledger output (nothing of ``slot`` is released by it)."""
        state.halted[name] = f"{name}: {reason}"
        if violation:
            state.tallies[name].violations += 1
        out.append(("ledger", Halt(state.stream, name, slot, state.halted[name])))
        log.error("step %s: stream %r halted: %s", self.step_id, state.stream, state.halted[name])

    def class_of(self, name: str) -> ClassKey | None:
        """The one class of a population without per-user requirements: the declared window
        and the population's budget (None when users register their own requirements)."""
        if self.plan.ports.tracks_requirements:
            return None
        return ClassKey(self.plan.mechanisms[name].privacy_cost.window or 1, self.plan.epsilon)


def _kind(event: object) -> str:
    """The operator output an event goes to: releases, extra outputs (``ExtraRecord``, each
    routed by its output name downstream) or the ledger."""
    if isinstance(event, Release):
        return "release"
    return "extra" if isinstance(event, ExtraRecord) else "ledger"
