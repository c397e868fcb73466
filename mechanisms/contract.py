"""The mechanism contract every family implements (design §3).

A mechanism is built from a validated frozen ``Config``; it creates a picklable, versioned
``State`` and advances it one slot at a time with a pure ``step(state, slot)``, returning the
typed events of that slot. It declares its ``privacy_cost`` so ledgers and tests can compare
what it charges with what its theorem allows.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Final, Generic, Literal, TypeVar, cast

from privstream.mechanisms.accounting import Charge, charges_for
from privstream.mechanisms.client import ClientPort, CuratorPort, ReportPort
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.guarantees import Guarantee
from privstream.mechanisms.rounds import Answers, Finished, Requests, answer_at_once
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.stages import Stage, server_stage
from privstream.mechanisms.trust import TrustMode
from privstream.schema.keys import release_id

Strategy = Literal["publish", "approximate", "nullified"]
Division = str
"""A division's name: ``budget``, ``population``, ``user`` or a family's own declared one
(``accounting.DivisionSpec``, ``Family.divisions``)."""


@dataclass(frozen=True)
class Slot:
    """One timestamp of one stream: its index, its users (behind the privacy boundary) and the
    seeded randomness for it.

    ``port`` is the trust mode's view of the users (design §4): a ``ClientPort`` for the LDP
    modes, a ``CuratorPort`` for ``cdp``. Mechanisms read it through ``client`` or ``curator``,
    which refuse the other mode's port.
    """

    stream: str
    index: int
    port: ClientPort | CuratorPort | ReportPort
    randomness: SlotRandomness

    @property
    def client(self) -> ClientPort:
        """The LDP clients of this slot; a trusted curator's port is refused."""
        if _is_curator(self.port):
            raise TypeError(
                f"slot {self.index} of stream {self.stream!r} carries a trusted curator (cdp); "
                "this mechanism needs LDP clients (a ClientPort)"
            )
        return cast(ClientPort, self.port)

    @property
    def curator(self) -> CuratorPort:
        """The trusted curator of this slot (``cdp``); an LDP client port is refused."""
        if not _is_curator(self.port):
            raise TypeError(
                f"slot {self.index} of stream {self.stream!r} carries LDP clients; "
                "this mechanism needs a trusted curator (a CuratorPort, trust mode cdp)"
            )
        return cast(CuratorPort, self.port)

    @property
    def reports(self) -> ReportPort:
        """The devices' reports of this slot (``ldp-reports``: a device stage randomised
        them); any other port is refused."""
        if not isinstance(self.port, ReportPort):
            raise TypeError(
                f"slot {self.index} of stream {self.stream!r} carries no device reports; "
                "this mechanism needs trust mode ldp-reports behind a device stage"
            )
        return self.port


def _is_curator(port: object) -> bool:
    """The ports differ in their request method; checking it is much cheaper than
    ``isinstance`` against a runtime-checkable protocol, and this runs every slot."""
    return callable(getattr(port, "class_histogram", None))


SCHEMA_VERSION: Final = 3
"""Version of the release and ledger envelopes (``schema`` in every output record). 2: one
envelope for every family, the guarantee as data and a typed per-family ``details`` object.
3: measure-neutral names (``SCHEMA_RENAMES``; docs/accounting.md)."""

SCHEMA_RENAMES: Final[dict[str, str]] = {
    "population_epsilon": "population_budget",
    "population_window_spent": "population_spent",
}
"""Ledger-entry keys renamed by schema 3 (old -> new); ``CLASS_RENAMES`` inside ``classes``."""

CLASS_RENAMES: Final[dict[str, str]] = {"window": "scope", "epsilon": "budget",
                                        "window_spent": "spent"}  # fmt: skip
"""Keys of each ``classes`` item renamed by schema 3 (old -> new)."""


def restore_renamed(obj: object, state: dict[str, Any], renames: dict[str, str]) -> None:
    """``__setstate__`` of an envelope pickled before schema 3 (a recovery store's tallies hold
    the last ledger entry): its old field names take their new ones, so such a store resumes
    with every number as it was."""
    for key, value in state.items():
        object.__setattr__(obj, renames.get(key, key), value)


def upgrade_record(record: dict[str, Any]) -> dict[str, Any]:
    """A schema-2 release or ledger record with the schema-3 names (numbers unchanged); a
    record of another schema is returned as it is."""
    if record.get("schema") != 2:
        return record
    out = {SCHEMA_RENAMES.get(k, k): v for k, v in record.items()}
    if isinstance(out.get("classes"), list):
        out["classes"] = [
            {CLASS_RENAMES.get(k, k): v for k, v in c.items()} if isinstance(c, dict) else c
            for c in out["classes"]
        ]
    out["schema"] = SCHEMA_VERSION
    return out


@dataclass(frozen=True)
class Details:
    """What only one family reports about a release or a ledger entry (already private facts).

    A family subclasses it with typed fields; ``family`` names it in the output, so a reader
    knows which fields to expect."""

    family: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **asdict(self)}


@dataclass(frozen=True)
class Release:
    """A public release ``r_t`` of one stream, mechanism and slot: the envelope every family
    emits (README, "Output").

    ``strategy`` is one vocabulary for every family: ``publish`` (a fresh estimate),
    ``approximate`` (the last publication repeated, nothing spent on it) or ``nullified`` (the
    last publication repeated because an absorbing mechanism lent this slot's budget to it).
    ``source_slot`` is the slot whose publication ``estimate`` is (None before the first).
    ``guarantee`` is the mechanism's declared guarantee; ``details`` the family's own facts.
    """

    stream: str
    mechanism: str
    slot: int
    strategy: Strategy
    estimate: tuple[float, ...]
    source_slot: int | None
    guarantee: Guarantee
    details: Details
    insecure_seed: bool = False
    """True when the run's noise came from a public reproducible seed: not private output."""
    evaluation: bool = False
    """True when mechanisms ran side by side with the full budget each (``--compare``): an
    evaluation, whose releases together do not have the stated guarantee."""
    key: tuple[tuple[str, str], ...] = ()
    """The family's release-key parts beyond ``stream/mechanism/slot`` as ``(name, value)`` in
    its declared order (``Family.release_key``: DPI's ``query``); empty for one release per
    slot. Several releases of one slot differ here."""
    central: tuple[tuple[str, Any], ...] = ()
    """Behind a shuffler (``ldp-shuffled``): the central (ε, δ) the slot's shuffled reports
    satisfy beside the local guarantee — ``epsilon``, ``delta``, ``method``, the smallest batch
    ``n`` — as ``(name, value)``; empty (and absent from the JSON) otherwise."""

    @property
    def release_id(self) -> str:
        return release_id(self.stream, self.mechanism, self.slot, *(v for _k, v in self.key))

    def to_dict(self) -> dict[str, Any]:
        keyed = {"key": dict(self.key)} if self.key else {}
        central = {"central": dict(self.central)} if self.central else {}
        return {
            "schema": SCHEMA_VERSION,
            "release_id": self.release_id,
            "stream": self.stream,
            "mechanism": self.mechanism,
            "slot": self.slot,
            **keyed,
            "strategy": self.strategy,
            "estimate": list(self.estimate),
            "source_slot": self.source_slot,
            "guarantee": self.guarantee.to_dict(),
            "details": self.details.to_dict(),
            "insecure_seed": self.insecure_seed,
            "evaluation": self.evaluation,
            **central,
        }


@dataclass(frozen=True)
class ClassSpend:
    """One privacy class's spend after one slot, in the guarantee measure's additive unit
    (ε for pure DP, μ² for Gaussian DP, ρ for zCDP: ``guarantees.budget_of``).

    Every member of the class (``users`` users sharing the requirement ``(scope, budget)``) was
    charged at most ``charged`` at this slot and at most ``spent`` over the class's scope
    ending here (``scope`` slots: the w-event window w_c, or a user-division ledger's reports
    per budget), never above ``budget``. Families whose users share one requirement have one
    class. Class sizes are public metadata; no user is named.
    """

    scope: int
    budget: float
    users: int
    charged: float
    spent: float

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_renamed(self, state, CLASS_RENAMES)

    @property
    def spent_ratio(self) -> float:
        """``spent / budget``, at most 1 (the class gauge)."""
        return self.spent / self.budget


@dataclass(frozen=True)
class LedgerEntry:
    """The ledger after one slot: the envelope every family emits.

    ``classes`` holds every privacy class's spend (``ClassSpend``); the ``spent``, ``budget``
    and ``scope`` properties describe the class closest to its limit; the step emits the same
    spends as typed accounting events beside it (``Mechanism.charges``). ``division`` says
    how the ledger charges: ``budget`` charges every user alike (per-slot charges add up over a
    window), ``population`` charges disjoint users (each at most once per window), ``user``
    keeps one account per user (users join at different slots; a class's ``charged`` is what a
    reporting user paid at the slot and ``spent`` the most-charged user's spend in the
    guarantee's scope).
    ``population_budget`` and ``population_spent`` are the composed spend of all the
    stream's mechanisms (set by the operator, ``mechanisms.accountant``).
    """

    stream: str
    mechanism: str
    slot: int
    guarantee: Guarantee
    division: Division
    classes: tuple[ClassSpend, ...]
    details: Details
    population_budget: float | None = None
    """The population's budget per scope that all mechanisms of the stream share (for
    personalized mechanisms: the budget of the class closest to its limit), set by the
    operator; in the measure's additive unit."""
    population_spent: float | None = None
    """What all mechanisms of the stream together charged that user or class over the scope
    ending at this slot (the composed guarantee; at most ``population_budget`` unless
    ``evaluation``)."""
    insecure_seed: bool = False
    evaluation: bool = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_renamed(self, state, SCHEMA_RENAMES)

    @property
    def accounting_events(self) -> tuple[Charge, ...]:
        """The built-in charges of this entry's classes (``accounting.charges_for``). The
        mechanism's step emits its own (``Mechanism.charges``); this is for a reader that has
        only the entry."""
        return charges_for(self.guarantee, self.division, self.classes)

    @property
    def worst(self) -> ClassSpend | None:
        """The class closest to its limit (None while nobody is registered)."""
        if not self.classes:
            return None
        return max(self.classes, key=lambda c: c.spent / c.budget)

    @property
    def spent(self) -> float:
        """The worst class's spend over its scope (additive unit)."""
        worst = self.worst
        return 0.0 if worst is None else worst.spent

    @property
    def budget(self) -> float:
        """The worst class's budget (the guarantee's, while nobody is registered)."""
        worst = self.worst
        return self.guarantee.budget if worst is None else worst.budget

    @property
    def scope(self) -> int:
        """The worst class's scope length in slots (the guarantee's window, else 1)."""
        worst = self.worst
        if worst is not None:
            return worst.scope
        window = self.guarantee.window
        return 1 if window is None else window

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "ledger",
            "stream": self.stream,
            "mechanism": self.mechanism,
            "slot": self.slot,
            "guarantee": self.guarantee.to_dict(),
            "division": self.division,
            "classes": [asdict(c) for c in self.classes],
            "details": self.details.to_dict(),
            "population_budget": self.population_budget,
            "population_spent": self.population_spent,
            "insecure_seed": self.insecure_seed,
            "evaluation": self.evaluation,
        }


@dataclass(frozen=True)
class Halt:
    """A mechanism stopped on a stream at ``slot``: it releases nothing from this slot on.

    Written to the ledger output (``kind = "halt"``) so an auditor can tell a halted mechanism
    from lost releases. ``reason`` names the refused charge or the error, never a user or value.
    """

    stream: str
    mechanism: str
    slot: int
    reason: str
    kind: str = "halt"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


@dataclass(frozen=True)
class Gap:
    """A mechanism deliberately releases nothing for the slots ``first..last`` of a stream.

    Written to the ledger output (``kind = "gap"``) by a new incarnation that starts after slots
    an earlier one published (``privstream.runtime.republish``): the slots of its cooldown are skipped
    so that no window holds the spend of both incarnations. An auditor does not count them as
    lost; anything released inside them is a problem. ``reason`` names why, never a user.
    """

    stream: str
    mechanism: str
    first: int
    last: int
    reason: str
    kind: str = "gap"

    @property
    def slot(self) -> int:
        """The slot its record is keyed by (``stream/mechanism/first``: no entry has it)."""
        return self.first

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


@dataclass(frozen=True)
class ExtraRecord:
    """One record of a family's declared extra output (``Family.outputs``: an ``OutputSpec``
    named ``output``, e.g. DPI's internal ``audit``), emitted by a step among its events.

    The driver stamps it like a release (``insecure_seed``, ``evaluation``); the operator passes
    it on its ``extra`` stream and a flow writes it only where the operator routed that output
    (``--<output>-out``, ``<output>_topic``): an output is never merged into the releases.
    ``payload`` is the family's own JSON-ready facts (an internal output may hold facts that
    are not public; never a raw value or user id)."""

    output: str
    stream: str
    mechanism: str
    slot: int
    payload: dict[str, Any]
    insecure_seed: bool = False
    evaluation: bool = False

    @property
    def release_id(self) -> str:
        return release_id(self.stream, self.mechanism, self.slot)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "output": self.output,
            "release_id": self.release_id,
            "stream": self.stream,
            "mechanism": self.mechanism,
            "slot": self.slot,
            "payload": self.payload,
            "insecure_seed": self.insecure_seed,
            "evaluation": self.evaluation,
        }


Event = Release | LedgerEntry | ExtraRecord
"""An output of a step: what the operator routes (releases, ledger entries, extra records)."""
StepEvent = Event | Charge
"""What a step emits: its outputs and its accounting events (``mechanisms.accounting``); the
charges go to the accountant only, never to an output or a tally."""


def outputs(events: Sequence[StepEvent]) -> list[Event]:
    """A step's outputs, without its accounting events."""
    return [e for e in events if not isinstance(e, Charge)]


def charges_in(events: Sequence[StepEvent]) -> tuple[Charge, ...]:
    """A step's accounting events, in the order emitted."""
    return tuple(e for e in events if isinstance(e, Charge))


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class Conformance:
    """What a mechanism tells the conformance checks (``privstream.conformance.checks``) about itself:
    config changes its validation must refuse (field, bad value), checks that do not apply to
    it with the reason, the size of the example population and run, and the example config's
    ``window`` (a finite-horizon mechanism needs one past the slots its checks run)."""

    invalid: tuple[tuple[str, Any], ...] = ()
    skips: dict[str, str] = field(default_factory=dict)
    population: int = 400
    slots: int = 24
    window: int = 5


C = TypeVar("C")
S = TypeVar("S")


class Mechanism(ABC, Generic[C, S]):
    """Base of every mechanism: ``initial_state``, pure ``step``, declared ``privacy_cost``."""

    name: ClassVar[str]
    state_version: ClassVar[int]
    trust_modes: ClassVar[tuple[TrustMode, ...]]
    """The trust modes whose ports this mechanism's slots may carry (design §4); the operator
    builds the port of the first one the run supports."""
    division: ClassVar[Division] = "budget"
    conformance: ClassVar[Conformance] = Conformance()

    def __init__(self, config: C) -> None:
        self.config = config

    @abstractmethod
    def initial_state(self) -> S:
        """State before the first slot."""

    @abstractmethod
    def _advance(self, state: S, slot: Slot) -> Sequence[Event]:
        """Advance ``state`` in place by one slot and return its events."""

    @property
    @abstractmethod
    def privacy_cost(self) -> Guarantee:
        """The guarantee the ledger enforces, as data (``mechanisms.guarantees``)."""

    def client_state(self) -> Any:
        """Per-user state the client side of this mechanism keeps across slots (LDP modes), or
        None. It lives in the stream's snapshotted state beside the mechanism's and is handed
        to the client port only: the server logic (``step``) never sees it (design §4)."""
        return None

    def stages(self) -> tuple[Stage, ...]:
        """The stages this mechanism runs (``mechanisms.stages``): one server stage keyed by
        stream whose step is ``step``. A family with devices or a shuffler of its own declares
        more."""
        return (server_stage(self.name, self.initial_state, self.step),)

    def step(self, state: S, slot: Slot) -> tuple[S, list[StepEvent]]:
        """Run one slot. Pure: the input state is not modified, so a failed step (for example a
        ``PrivacyBudgetExceeded``) leaves the last good state intact. Its events are the slot's
        outputs followed by its accounting events: the charges of each ledger entry
        (``charges``)."""
        self.check_state(state)
        new = copy.deepcopy(state)
        events: list[StepEvent] = list(self._advance(new, slot))
        for entry in [e for e in events if isinstance(e, LedgerEntry)]:
            events.extend(self.charges(entry))
        return new, events

    def enter(self, state: Any, slot: Slot, population: int, expected: int) -> None:
        """The preamble every step shares: slots come in order and hold the population the
        mechanism was built for; then the state's step counter ``t`` and ``last_slot`` advance."""
        if state.last_slot is not None and slot.index != state.last_slot + 1:
            raise ValueError(
                f"{self.name} on stream {slot.stream!r} expected slot {state.last_slot + 1}, "
                f"got {slot.index}"
            )
        if population != expected:
            raise ValueError(f"slot has {population} users, mechanism expects n={expected}")
        state.t += 1
        state.last_slot = slot.index

    def release(
        self,
        slot: Slot,
        strategy: Strategy,
        estimate: Any,
        source_slot: int | None,
        details: Details,
        key: tuple[tuple[str, str], ...] = (),
    ) -> Release:
        """The slot's release in the one envelope, with the declared guarantee (``key``: its
        release-key parts, for a family that releases several records per slot)."""
        return Release(
            stream=slot.stream,
            mechanism=self.name,
            slot=slot.index,
            strategy=strategy,
            estimate=tuple(float(x) for x in estimate),
            source_slot=source_slot,
            guarantee=self.privacy_cost,
            details=details,
            key=key,
        )

    def ledger_entry(
        self, slot: Slot, classes: tuple[ClassSpend, ...], details: Details
    ) -> LedgerEntry:
        """The slot's ledger entry in the one envelope, with the declared guarantee."""
        return LedgerEntry(
            stream=slot.stream,
            mechanism=self.name,
            slot=slot.index,
            guarantee=self.privacy_cost,
            division=self.division,
            classes=classes,
            details=details,
        )

    def charges(self, entry: LedgerEntry) -> tuple[Charge, ...]:
        """The typed accounting events the step emits for its ledger entry: one charge per
        class, in the guarantee's measure (``accounting.charges_for``). A family with another
        measure or account overrides it. Deterministic in ``entry``: the driver re-derives a
        halted mechanism's last charges from its last entry after a restart."""
        return charges_for(entry.guarantee, entry.division, entry.classes)

    def check_state(self, state: S) -> None:
        """Refuse a state written by an incompatible version of this mechanism."""
        version = getattr(state, "version", None)
        kind = getattr(state, "mechanism", None)
        if version != self.state_version or kind != self.name:
            raise IncompatibleState(
                f"{self.name} cannot continue from a state of mechanism={kind!r} version={version!r}; "
                f"this code writes version {self.state_version}. Restore with the matching "
                "privstream version or start a new recovery store (budgets would otherwise reset)."
            )

    def __repr__(self) -> str:
        return f"{self.name}({self.config!r})"


class Rounds(Mechanism[C, S]):
    """A mechanism whose step is a resumable sequence of request/report rounds
    (``mechanisms.rounds``): it implements ``plan`` and ``absorb``, and ``step`` (unchanged
    signature) runs every round of the slot with the slot's client port answering each at
    once (``ldp-simulated``). A driver that talks to real devices calls ``plan``/``absorb``
    itself and may snapshot the state between rounds."""

    @abstractmethod
    def plan(self, state: S, slot: Slot) -> Requests | Finished:
        """The next round's requests, or the slot's events once it needs nothing more."""

    @abstractmethod
    def absorb(self, state: S, slot: Slot, answers: Answers) -> None:
        """Take the answers of the round in flight into ``state``."""

    def _advance(self, state: S, slot: Slot) -> list[Release | LedgerEntry]:
        return answer_at_once(self, state, slot, slot.client)
