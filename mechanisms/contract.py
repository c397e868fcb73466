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
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from privstream.mechanisms.client import ClientPort, CuratorPort
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import SlotRandomness

Strategy = Literal["publish", "approximate", "nullified", "skip"]
Division = Literal["budget", "population"]


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
    port: ClientPort | CuratorPort
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


def _is_curator(port: object) -> bool:
    """The ports differ in their request method; checking it is much cheaper than
    ``isinstance`` against a runtime-checkable protocol, and this runs every slot."""
    return callable(getattr(port, "class_histogram", None))


@dataclass(frozen=True)
class Release:
    """A public release ``r_t`` and the already-private facts about how it was made.

    ``epsilon_m1``/``epsilon_m2`` are the per-user budgets a reporting user spent at this slot in
    the dissimilarity and publication steps; ``users_m1``/``users_m2`` how many users reported
    in each. ``dissimilarity`` and ``error`` are the de-biased ``dis`` and the potential
    publication error ``err`` (both post-processing of LDP reports). ``bits`` is the slot's
    communication cost (reports plus instructions, spec §5.3.4).
    """

    stream: str
    mechanism: str
    slot: int
    strategy: Strategy
    estimate: tuple[float, ...]
    epsilon: float
    window: int
    epsilon_m1: float
    epsilon_m2: float
    users_m1: int
    users_m2: int
    source_slot: int | None
    dissimilarity: float | None
    error: float | None
    bits: int
    insecure_seed: bool = False
    """True when the run's noise came from a public reproducible seed: not private output."""
    evaluation: bool = False
    """True when mechanisms ran side by side with the full budget each (``--compare``): an
    evaluation, whose releases together do not have the stated guarantee."""

    @property
    def release_id(self) -> str:
        return f"{self.stream}/{self.mechanism}/{self.slot}"

    def to_dict(self) -> dict[str, Any]:
        return {"release_id": self.release_id, **asdict(self)}


@dataclass(frozen=True)
class ClassSpend:
    """One privacy class's budget after one slot (spec personalized-w-event §9.4).

    Every member of the class (``users`` registered users sharing ``(window, epsilon)``) was
    charged ``epsilon_dc + epsilon_pub`` at this slot and ``window_spent`` over the class's own
    window ending here, never above ``epsilon`` (invariant C1). Class sizes are public metadata
    (spec §1.1, A2); no user is named.
    """

    window: int
    epsilon: float
    users: int
    epsilon_dc: float
    epsilon_pub: float
    window_spent: float

    @property
    def spent_ratio(self) -> float:
        """``window_spent / ε``, at most 1 (the ``dp_class_window_spent_ratio`` gauge)."""
        return self.window_spent / self.epsilon


@dataclass(frozen=True)
class LedgerEntry:
    """The ledger after one slot: spend in the window ending at this slot and what is left.

    Budget division fills the ``epsilon_*`` fields (``window_spent`` is the per-user budget over
    the window, never above ``epsilon``); population division fills the ``users_*`` fields
    (``window_users`` reported in the window, ``available_users`` = ``|U_A|`` for the next
    slot). ``remaining`` is ``ε_rm``/absorbable budget or ``n_rm``/absorbable users.

    Personalized mechanisms (spec personalized-w-event) charge each privacy class differently:
    ``classes`` holds every class's ``ClassSpend``, and the scalar fields describe the class
    closest to its limit at this slot (largest ``window_spent/ε``). It is None for the
    families whose users all share one requirement.
    """

    stream: str
    mechanism: str
    slot: int
    division: Division
    epsilon: float
    window: int
    epsilon_m1: float
    epsilon_m2: float
    window_spent: float
    users_m1: int
    users_m2: int
    window_users: int
    available_users: int
    remaining: float
    classes: tuple[ClassSpend, ...] | None = None
    population_epsilon: float | None = None
    """The population's budget per window that all mechanisms of the stream share (for
    personalized mechanisms: ε_c of the class closest to its limit), set by the operator."""
    population_window_spent: float | None = None
    """What all mechanisms of the stream together charged that user or class over the window
    ending at this slot (the composed guarantee; at most ``population_epsilon`` unless
    ``evaluation``)."""
    insecure_seed: bool = False
    evaluation: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        return asdict(self)


@dataclass(frozen=True)
class PrivacyCost:
    """What a mechanism guarantees: w-event ε-LDP (or CDP) by budget or population division."""

    epsilon: float
    window: int
    division: Division
    model: str = "w-event ε-LDP"


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


C = TypeVar("C")
S = TypeVar("S")


class Mechanism(ABC, Generic[C, S]):
    """Base of every mechanism: ``initial_state``, pure ``step``, declared ``privacy_cost``."""

    name: ClassVar[str]
    state_version: ClassVar[int]

    def __init__(self, config: C) -> None:
        self.config = config

    @abstractmethod
    def initial_state(self) -> S:
        """State before the first slot."""

    @abstractmethod
    def _advance(self, state: S, slot: Slot) -> list[Release | LedgerEntry]:
        """Advance ``state`` in place by one slot and return its events."""

    @property
    @abstractmethod
    def privacy_cost(self) -> PrivacyCost:
        """The guarantee the ledger enforces."""

    def step(self, state: S, slot: Slot) -> tuple[S, list[Release | LedgerEntry]]:
        """Run one slot. Pure: the input state is not modified, so a failed step (for example a
        ``PrivacyBudgetExceeded``) leaves the last good state intact."""
        self.check_state(state)
        new = copy.deepcopy(state)
        events = self._advance(new, slot)
        return new, events

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
