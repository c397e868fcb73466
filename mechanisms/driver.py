"""The one per-slot step driver: what the slotted operator, the bench harness and the
conformance checks all run for a slot (design §3-§6). Engine-free.

``drive_slot`` steps every live mechanism of a stream through one slot, each through its own
port and ``SlotRandomness``; a mechanism that fails halts alone, with its reason (a
``PrivacyBudgetExceeded`` is a privacy-invariant violation); the population accountant composes
the spend of every mechanism and refuses an overspend before anything of the slot is released
(every stepped mechanism halts then); and the outputs are stamped with the run's provenance
(``insecure_seed``, ``evaluation``) and the slot's composed population spend.

Guarantee: nothing of a slot is in ``SlotStep.events`` unless the accountant (when given) has
accepted the slot; a failure never escapes (with ``halt_failures``), it becomes a ``Halted``
whose reason names the exception's type and place, never its message (``failure``). The
driver mutates nothing it is given except the accountant, which it charges.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privstream.mechanisms.accountant import ClassKey, PopulationAccountant
from privstream.mechanisms.accounting import Charge, UnsupportedCharge
from privstream.mechanisms.client import ClientPort, CuratorPort
from privstream.mechanisms.contract import (
    Event,
    LedgerEntry,
    Mechanism,
    Slot,
    charges_in,
    outputs,
)
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.seeding import SlotRandomness

PortFor = Callable[[str, SlotRandomness, Any], ClientPort | CuratorPort]
"""The port of mechanism ``name`` at the slot, given its randomness and its devices' state."""
RandomnessFor = Callable[[str], SlotRandomness]
"""The randomness of mechanism ``name`` at the slot."""


def failure(exc: BaseException) -> str:
    """An unexpected error as its type and where it was raised, never its message: a message
    may quote the data (a user id, a value), and halt reasons reach the log and the ledger."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {Path(last.filename).name}:{last.lineno} in {last.name}"


@dataclass
class Lane:
    """One mechanism on one stream, as the driver sees it: the mechanism, its state, its
    devices' state (``Mechanism.client_state``), its share of the population budget, the one
    population class it is charged to (None: per-user requirements) and the accounting events
    of its last released step (a halted mechanism's last spend still counts in the
    composition; ``last_charges`` re-derives them from its last ledger entry)."""

    mechanism: Mechanism[Any, Any]
    state: Any
    clients: Any = None
    share: float = 1.0
    population: ClassKey | None = None
    charges: tuple[Charge, ...] = ()
    halted: bool = False


def last_charges(mechanism: Mechanism[Any, Any], entry: LedgerEntry | None) -> tuple[Charge, ...]:
    """The accounting events a mechanism emitted with its last ledger entry (none before its
    first): ``Mechanism.charges`` is deterministic in the entry, so they survive a restart."""
    return () if entry is None else mechanism.charges(entry)


@dataclass(frozen=True)
class Stamp:
    """The run's provenance every output carries (``insecure_seed``, ``evaluation``)."""

    insecure: bool = False
    evaluation: bool = False


@dataclass(frozen=True)
class Halted:
    """A mechanism the slot halted: its reason (without the ``name: `` prefix) and whether it
    is a privacy-invariant violation."""

    name: str
    reason: str
    violation: bool


@dataclass(frozen=True)
class Stepped:
    """One mechanism's step that the slot released: its new state, its devices' new state
    (None: the port asked nothing of them), its stamped outputs, the step's seconds and its
    accounting events (composed by the accountant, never an output)."""

    state: Any
    clients: Any
    events: list[Event]
    seconds: float
    charges: tuple[Charge, ...] = ()


@dataclass
class SlotStep:
    """What one slot emitted: the halts in the order they happened, then (when the slot was
    accepted) every released mechanism's step, and the composed spend ``worst``
    (``PopulationAccountant.worst``) the ledger entries were stamped with."""

    slot: int
    halts: list[Halted] = field(default_factory=list)
    stepped: dict[str, Stepped] = field(default_factory=dict)
    worst: tuple[int, float, float] | None = None


def drive_slot(
    lanes: Mapping[str, Lane],
    stream: str,
    slot: int,
    port_for: PortFor,
    randomness_for: RandomnessFor,
    *,
    accountant: PopulationAccountant | None = None,
    stamp: Stamp = Stamp(),
    halt_failures: bool = True,
) -> SlotStep:
    """Step every lane not halted through ``slot``, compose their spend, then stamp.

    ``halt_failures`` False (the harness, the checks): an exception propagates instead of
    halting. Without ``accountant`` nothing is composed and no population spend is stamped."""
    out = SlotStep(slot)
    stepped: dict[str, Stepped] = {}
    for name, lane in lanes.items():
        if lane.halted:
            continue
        result = _step_one(name, lane, stream, slot, port_for, randomness_for, halt_failures)
        if isinstance(result, Halted):
            out.halts.append(result)
        else:
            stepped[name] = result
    if accountant is not None:
        refused = _compose(accountant, lanes, stepped, slot)
        if refused is not None:
            out.halts.extend(Halted(name, refused, True) for name in stepped)
            return out
        out.worst = accountant.worst()
    for name, step in stepped.items():
        events = [stamp_event(e, stamp, out.worst) for e in step.events]
        out.stepped[name] = dataclasses.replace(step, events=events)
    return out


def _step_one(
    name: str,
    lane: Lane,
    stream: str,
    slot: int,
    port_for: PortFor,
    randomness_for: RandomnessFor,
    halt_failures: bool,
) -> Stepped | Halted:
    """Step one mechanism with the port of its trust mode; a failure halts it alone."""
    randomness = randomness_for(name)
    port = port_for(name, randomness, lane.clients)
    started = time.perf_counter()
    try:
        state, events = lane.mechanism.step(lane.state, Slot(stream, slot, port, randomness))
    except PrivacyBudgetExceeded as exc:
        if not halt_failures:
            raise
        return Halted(name, f"privacy invariant violated at slot {slot}: {exc}", True)
    except Exception as exc:  # one mechanism's failure never takes the process down
        if not halt_failures:
            raise
        return Halted(name, f"failed at slot {slot}: {failure(exc)}", False)
    seconds = time.perf_counter() - started
    clients = getattr(port, "client_state_after", None)
    return Stepped(state, clients, outputs(events), seconds, charges_in(events))


def _compose(
    accountant: PopulationAccountant,
    lanes: Mapping[str, Lane],
    stepped: Mapping[str, Stepped],
    slot: int,
) -> str | None:
    """Charge the population accountant with every mechanism's accounting events (a halted
    mechanism's last ones still count); the refusal's reason on an overspend, or on charges the
    accountant does not support or cannot compose (``mechanisms.accounting``), else None."""
    try:
        accountant.charge_events(slot, spends(lanes, stepped))
    except (PrivacyBudgetExceeded, UnsupportedCharge) as exc:
        return f"population budget refused slot {slot}: {exc}"
    return None


def spends(
    lanes: Mapping[str, Lane], stepped: Mapping[str, Stepped]
) -> Sequence[tuple[Sequence[Charge], float, ClassKey | None]]:
    """Each mechanism's accounting events at the slot with its budget share and population
    class: the ones its step emitted, else (halted, or a step without charges) the lane's last
    ones, in the lanes' order."""
    out = []
    for name, lane in lanes.items():
        charges = stepped[name].charges if name in stepped else ()
        charges = charges or lane.charges
        if charges:
            out.append((charges, lane.share, lane.population))
    return out


def stamp_event(event: Event, stamp: Stamp, worst: tuple[int, float, float] | None) -> Event:
    """Mark the run's provenance on an output (a release, a ledger entry or an extra-output
    record alike); a ledger entry gets the composed spend ``worst`` of the slot
    (``PopulationAccountant.worst``)."""
    flags: dict[str, Any] = {}
    if stamp.insecure:
        flags["insecure_seed"] = True
    if stamp.evaluation:
        flags["evaluation"] = True
    if isinstance(event, LedgerEntry) and worst is not None:
        flags["population_budget"], flags["population_spent"] = worst[1], worst[2]
    return dataclasses.replace(event, **flags) if flags else event
