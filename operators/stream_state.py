"""The snapshotted state of one stream: what a recovery restores, and what it is bound to.

``StreamState`` holds each mechanism's state, the client side's per-user state (``clients``,
design §4: dense arrays, handed only to the client port), the slotting bookkeeping, the
registration and the population accountant. ``Tally`` is each mechanism's running account
(the source of the exported gauges). A snapshot is bound (``check_binding``) to the noise key's
fingerprint and every privacy parameter, so a resume under another secret or configuration is
refused instead of re-drawing replayed slots or resetting budgets (design §6).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.accountant import PopulationAccountant
from privstream.mechanisms.contract import Event, LedgerEntry, Release
from privstream.mechanisms.driver import failure  # noqa: F401  (re-exported)
from privstream.mechanisms.errors import IncompatibleState
from privstream.operators.watermark import PartitionWatermarks
from privstream.schema.events import Held

NOT_WITHDRAWN: Final = np.iinfo(np.int64).max
"""``StreamState.withdrawn_from`` of a seat whose user is still registered."""
STREAM_STATE_VERSION: Final = 5
"""2: per-mechanism tallies; 3: users' privacy requirements; 4: binding to the noise key and
the privacy parameters, the population accountant, per-partition watermarks; 5: the release
envelope of schema 2 in the tallies, the client side's per-user state."""


@dataclass
class Tally:
    """One mechanism's running account on one stream: its release counts by strategy, its
    privacy violations and its last ledger entry and diagnostics — the source of the exported
    gauges after a restart (``operators.metrics``)."""

    publications: int = 0
    approximations: int = 0
    nullified: int = 0
    violations: int = 0
    last_slot: int = -1
    last_ledger: LedgerEntry | None = None
    last_dissimilarity: float | None = None
    last_error: float | None = None

    def record(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, LedgerEntry):
                self.last_ledger = event
                continue
            if not isinstance(event, Release):  # an extra-output record tallies nothing
                continue
            self.last_slot = event.slot
            if event.strategy == "publish":
                self.publications += 1
            elif event.strategy == "approximate":
                self.approximations += 1
            else:
                self.nullified += 1
            dissimilarity = getattr(event.details, "dissimilarity", None)
            error = getattr(event.details, "error", None)
            if dissimilarity is not None:
                self.last_dissimilarity = dissimilarity
            if error is not None:
                self.last_error = error


@dataclass
class StreamState:
    """Snapshot of one stream: each mechanism's state plus the shared slotting bookkeeping.

    ``halted`` maps a mechanism whose ledger refused a charge to the reason; it releases nothing
    more. When every mechanism of the stream is halted, its events become dead letters.
    ``tallies`` are each mechanism's release counts and last ledger entry, the source of the
    exported gauges (``operators.metrics``). ``epsilons``/``windows`` are the registered users'
    requirements (NaN / 0: the stream default), kept only by a trusted-curator stream.
    ``watermarks`` is the progress of each input partition (set by the first batch).
    ``binding`` names what the state belongs to — the noise key's fingerprint (never the key)
    and every privacy parameter — so a resume with another secret or configuration is refused
    (design §6). ``accountant`` composes the mechanisms' spend over the stream's population.
    ``newcomers`` holds, per open slot, the reports of named users who are not registered yet
    (``ldp-simulated``): they register when the slot closes, in user-id order; each report is
    held with its batch's ``RowSources`` and row, from which its dead-letter text is made only
    if it becomes one (``events.held_line``; a state of an earlier version holds the text and
    source). ``clients``
    holds each mechanism's client-side per-user state (``Mechanism.client_state``), which only
    the client port sees.
    """

    stream: str
    mechanisms: dict[str, Any]
    current: NDArray[np.float64]
    version: int = STREAM_STATE_VERSION
    open_slots: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    directory: dict[str, int] = field(default_factory=dict)
    id_kind: str | None = None
    max_seen: int | None = None
    last_closed: int | None = None
    halted: dict[str, str] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None
    watermarks: PartitionWatermarks | None = None
    binding: dict[str, str] = field(default_factory=dict)
    accountant: PopulationAccountant = field(default_factory=PopulationAccountant)
    newcomers: dict[int, dict[str, Held]] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    reported_at: NDArray[np.int64] | None = None
    """Per user, the slot their carried value was reported in (``carry_slots`` bound)."""
    protocol: Any = None
    """The trust mode's server-side protocol state: in ``ldp-reports`` the stream's rounds
    (``operators.report_book.RoundBook``); None in the other modes."""
    withdrawn_from: NDArray[np.int64] | None = None
    """Per seat, the first slot at which its user is withdrawn from the registration table
    (``NOT_WITHDRAWN`` for the others; None while nobody is): from it on the seat's value is
    blank and its events are ``withdrawn_user`` dead letters (``operators.registration``)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> StreamState:
        """The copy a snapshot takes (``SlottedLogic.snapshot``): everything deep, except the
        named users' ``directory``, copied flat, and the ``newcomers``, copied one dict per
        slot: user ids, indices and held reports (``events.Held``) are never changed in place,
        only added or removed. A generic deep copy walks 10⁶ directory entries for a second,
        and 10⁶ held reports for 4 s, at every snapshot (bench/README.md, "State size and
        snapshot cost")."""
        new = object.__new__(type(self))
        new.__dict__.update(
            {
                key: _FLAT_COPY.get(key, copy.deepcopy)(value, memo)
                for key, value in self.__dict__.items()
            }
        )
        return new

    def registered(self) -> NDArray[np.bool_] | None:
        """Mask of registered users (None: all ``n``, as with dense user indices)."""
        if self.id_kind == "dense":
            return None
        return np.arange(self.current.shape[0]) < len(self.directory)

    def all_halted(self) -> bool:
        return len(self.halted) == len(self.mechanisms)


_FLAT_COPY: Final[dict[str, Callable[[Any, dict[int, Any]], Any]]] = {
    "directory": lambda directory, _: dict(directory),
    "newcomers": lambda newcomers, _: {slot: dict(held) for slot, held in newcomers.items()},
}
"""The parts of a ``StreamState`` whose entries are immutable, and how a snapshot copies them."""


def check_binding(step_id: str, resume: StreamState, expected: dict[str, str]) -> None:
    """Refuse a snapshot written under another secret or other privacy parameters (design §6):
    resuming it would release the replayed slots with other noise, or reset budgets."""
    found = resume.binding
    differ = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
    if not differ:
        return
    lines = [
        "another secret (its fingerprint differs)"
        if key == "noise key"
        else f"{key}: stored {found.get(key, '(none)')}, now {expected.get(key, '(none)')}"
        + (
            " (another incarnation: this store's nonce file was replaced)"
            if key == "incarnation"
            else ""
        )
        for key in differ
    ]
    raise IncompatibleState(
        f"step {step_id!r}: the recovery store of stream {resume.stream!r} was written with "
        + "; ".join(lines)
        + ". Resume with the same secret and configuration, or start a new recovery directory "
        "(a new store starts every budget afresh: only do that for a new stream)."
    )


def fresh_state(
    stream: str,
    mechanisms: dict[str, Any],
    current: NDArray[np.float64],
    binding: dict[str, str],
    evaluation: bool,
) -> StreamState:
    """A stream's first state: each mechanism's initial and devices' state, empty tallies,
    ``binding`` and a population accountant (``evaluation``: the split is an evaluation)."""
    return StreamState(
        stream=stream,
        mechanisms={name: m.initial_state() for name, m in mechanisms.items()},
        current=current,
        tallies={name: Tally() for name in mechanisms},
        clients={name: m.client_state() for name, m in mechanisms.items()},
        binding=dict(binding),
        accountant=PopulationAccountant(evaluation=evaluation),
    )


def check_version(step_id: str, resume: StreamState, mechanisms: dict[str, Any]) -> None:
    """Refuse a snapshot of another state version or of other mechanisms."""
    if resume.version != STREAM_STATE_VERSION or resume.mechanisms.keys() != mechanisms.keys():
        raise IncompatibleState(
            f"step {step_id!r}: snapshot of stream {resume.stream!r} has slotting version "
            f"{resume.version} for mechanisms {sorted(resume.mechanisms)}; this code runs "
            f"version {STREAM_STATE_VERSION} of {sorted(mechanisms)}"
        )
