"""Who a stream counts: the registration of a trusted-curator stream, fixed before the data,
and the enrolment of named users of an LDP stream at the close of their first slot.

Central DP (spec personalized-w-event §1.1, A2): the registration table (``Preferences``) names
the population and each user's requirement ``(ε_i, w_i)`` before any data, so who is counted
never depends on who sent data; anybody else's events are ``unregistered_user`` dead letters
and an event stating another requirement is ``requirement_changed``. LDP (``ldp-simulated``):
a named user is enrolled when the slot of their first accepted report closes, in the keyed
order of the run's secret (``EnrolmentOrder``), so every user's dense index — and so which users
a mechanism samples — is independent of how the input partitions interleave, and no sender can
choose ids that take the seats first. An LDP stream given a registration table is a closed
population: only its users are enrolled, anybody else's events are ``unregistered_user``.

Withdrawal (issue 18 §4): a user removed from the table of a resumed store
(``privstream.runtime.incarnation.registration_plan``) keeps their seat — the ledgers, class sizes and
public counts do not change, as for a user who never reports again — but from the first slot
after the restored state's last released slot their value is blank (the carried one too) and
their events are ``withdrawn_user`` dead letters.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.guarantees import Guarantee, PeriodScope
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.seeding import EnrolmentOrder
from privstream.mechanisms.tasks import EstimationTask
from privstream.mechanisms.validation import (
    MIN_EPSILON,
    check_fraction,
    check_requirement,
    distinct_requirements,
)
from privstream.operators.reasons import CODE, Output
from privstream.operators.stream_state import NOT_WITHDRAWN, StreamState
from privstream.schema.events import (
    DUPLICATE,
    POPULATION_FULL,
    REQUIREMENT_CHANGED,
    UNREGISTERED,
    WITHDRAWN,
    DeadLetter,
    EventBatch,
    Held,
    held_line,
)

if TYPE_CHECKING:
    from privstream.operators.clock import SlottingConfig
    from privstream.operators.ports import Ports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preferences:
    """The registration of a trusted-curator stream, fixed before the data arrive (spec
    personalized-w-event §1.1, A2): users' privacy requirements by user id for named users (a
    registration table, spec §9.1: exactly these users are registered, in this order) or by
    dense index (``epsilons``/``windows`` arrays, NaN / 0 = the stream default; dense indices
    ``0..n−1`` are all registered). Who is registered is therefore public by construction;
    data of anybody else are ``unregistered_user`` dead letters.

    ``share``: the stream's share ``s`` of the population's budget (a flow file's streams). The
    mechanisms run every user at ``s·ε_i``; users still state, and are checked against, their
    own ``ε_i``."""

    by_user: dict[str, tuple[float, int]] = field(default_factory=dict)
    epsilons: NDArray[np.float64] | None = None
    windows: NDArray[np.int64] | None = None
    share: float = 1.0

    def __post_init__(self) -> None:
        """Refuse requirements outside the limits at start (never naming a user)."""
        check_fraction("share", self.share, closed=True)
        for k, (eps, win) in distinct_requirements(self.by_user.values()):
            check_requirement(eps, win, f"registration entry {k}")
            check_requirement(eps * self.share, win, f"registration entry {k} at its share")
        if self.epsilons is not None:
            for eps in np.unique(self.epsilons[~np.isnan(self.epsilons)]).tolist():
                check_requirement(eps, 1, "a registered requirement")
        if self.windows is not None:
            for win in np.unique(self.windows[self.windows != 0]).tolist():
                check_requirement(MIN_EPSILON, win, "a registered requirement")

    def part(self, by_user: dict[str, tuple[float, int]]) -> Preferences:
        """Some of this table's named users (a user shard's), at its share: entries already
        checked here are not checked again."""
        new = object.__new__(Preferences)
        for name, value in (("by_user", by_user), ("epsilons", None), ("windows", None),
                            ("share", self.share)):  # fmt: skip
            object.__setattr__(new, name, value)
        return new


class Population:
    """Who a stream counts, one part of the slotted operator: the registered table of a
    ``cdp`` stream, the enrolment of named users at the close of their first slot (an open,
    growing population up to ``n``, or a closed one), and withdrawals on a resume."""

    def __init__(
        self,
        n: int,
        task: EstimationTask,
        trust: Ports,
        order: EnrolmentOrder,
        cfg: SlottingConfig,
    ) -> None:
        self.n = n
        self.task = task
        self.trust = trust
        self.order = order
        self.cfg = cfg

    def blank(self) -> NDArray[np.float64]:
        """Every user's value unknown: NaN, one row of ``d`` per user for a vector task."""
        shape = (self.n, self.task.d) if self.task.kind == "vector" else (self.n,)
        return np.full(shape, np.nan)

    def register(self, state: StreamState, prefs: Preferences) -> None:
        """Load the registration before any data: named users of the table in its order, or
        the requirements of the dense indices."""
        if prefs.by_user:
            if len(prefs.by_user) > self.n:
                raise ValueError(
                    f"the registration table holds {len(prefs.by_user)} users but the stream's "
                    f"population is n={self.n}"
                )
            self._requirement_arrays(state)
            assert state.epsilons is not None and state.windows is not None
            for i, (user, (eps, win)) in enumerate(prefs.by_user.items()):
                state.directory[user] = i
                state.epsilons[i], state.windows[i] = eps * prefs.share, win
            state.id_kind = "named"
        elif prefs.epsilons is not None or prefs.windows is not None:
            self._requirement_arrays(state)
            assert state.epsilons is not None and state.windows is not None
            if prefs.epsilons is not None:
                state.epsilons[:] = prefs.epsilons * prefs.share
            if prefs.windows is not None:
                state.windows[:] = prefs.windows

    def hold_newcomers(
        self, state: StreamState, batch: EventBatch, rows: NDArray[np.intp], code: NDArray[np.int8]
    ) -> None:
        """Keep the rows of users not enrolled yet until their slot closes (first report of a
        user in a slot wins). Enrolling them then, in keyed order, makes every user's dense
        index — and so which users a mechanism samples — independent of how the input
        partitions interleave. In a closed population (a registration table) a user it does
        not list is ``unregistered_user`` at once, and never takes a seat."""
        newcomers = state.newcomers
        members = self.trust.members
        slots, users = batch.slots[rows].tolist(), batch.users[rows].tolist()
        values = batch.values[rows].tolist()  # plain floats: a snapshot pickles them fast
        sources = batch.row_sources.select(rows)  # a dead letter's text: made only if one is
        for k, (i, slot, user) in enumerate(zip(rows.tolist(), slots, users, strict=True)):
            if members is not None and user not in members:
                code[i] = CODE[UNREGISTERED]
                continue
            held = newcomers.get(slot)
            if held is None:
                held = newcomers[slot] = {}
            if user in held:
                code[i] = CODE[DUPLICATE]
            else:
                held[user] = (values[k], sources, k)

    def admit_newcomers(self, state: StreamState, slot: int, out: list[Output]) -> None:
        """Enrol the users first seen in ``slot``, in the keyed order of the run's secret
        (``EnrolmentOrder``: not chosen by whoever names the ids), and put their reports in the
        slot; past the population ``n`` they are ``population_full`` dead letters."""
        held = state.newcomers.pop(slot, None)
        if not held:
            return
        directory = state.directory
        target = state.open_slots.get(slot)
        if target is None:
            target = state.open_slots[slot] = self.blank()
        members = self.trust.members
        for user in self.order.sort(state.stream, self._seated(held, directory, members, target)):
            value = held[user][0]
            if members is not None and user not in members:  # held before its withdrawal
                detail = "the user was withdrawn from the stream's registration table"
                text, source = held_line(held[user], user, slot)
                out.append(("dead_letter", DeadLetter.of(WITHDRAWN, state.stream, text, detail,
                                                         source)))  # fmt: skip
                continue
            j = directory.get(user, -1)
            if j < 0 and len(directory) >= self.n:
                detail = f"the stream's population of {self.n} users is full"
                text, source = held_line(held[user], user, slot)
                letter = DeadLetter.of(POPULATION_FULL, state.stream, text, detail, source)
                out.append(("dead_letter", letter))
                continue
            if j < 0:
                j = directory[user] = len(directory)
            target[j] = value  # held first: it wins over a later report of the same slot

    @staticmethod
    def _seated(
        held: dict[str, Held],
        directory: dict[str, int],
        members: frozenset[str] | None,
        target: NDArray[np.float64],
    ) -> list[str]:
        """Put the held reports of users who took their seat in an earlier slot (and are
        still members) into ``target``, and return the others, which the keyed order seats or
        refuses: only they can change who is seated or which dead letters come out, so the
        order of the slot's outputs is the one of sorting them all (a report held in a slot
        read far ahead of its close is mostly of users seated meanwhile)."""
        rest = []
        for user, entry in held.items():
            j = directory.get(user, -1)
            if j >= 0 and (members is None or user in members):
                target[j] = entry[0]
            else:
                rest.append(user)
        return rest

    def _table_users(self) -> frozenset[str] | None:
        """The users of this run's registration table (a ``cdp`` table naming users, or an LDP
        stream's closed population); None without one (nothing can be withdrawn)."""
        members = self.trust.members
        if members is not None:
            return members
        preferences = getattr(self.trust, "preferences", None)
        if isinstance(preferences, Preferences) and preferences.by_user:
            return frozenset(preferences.by_user)
        return None

    def withdraw(self, state: StreamState, step_id: str) -> None:
        """On a resume: withdraw the seats of the restored ``state`` whose users this run's
        table no longer lists, from the first slot after its last released slot, or after the
        last slot already on the release topic when that is later (``SlottingConfig.released``:
        after a crash the slots since the snapshot are replayed, and must be recomputed with the
        user, as they were published, never as an exact difference) (a seat
        withdrawn earlier keeps its first slot). The seat, its requirement and its class stay
        (the ledgers and public counts do not change); its value is blanked at every later
        slot (``unwithdrawn``) and its events are ``withdrawn_user`` dead letters (ingest).
        Logs one line per stream with the count, never an id."""
        table = self._table_users()
        if table is None or state.id_kind == "dense" or not state.directory:
            return
        gone = [seat for user, seat in state.directory.items() if user not in table]
        if not gone:
            return
        if state.withdrawn_from is None:
            state.withdrawn_from = np.full(self.n, NOT_WITHDRAWN, dtype=np.int64)
        seats = np.asarray(gone, dtype=np.int64)
        new = seats[state.withdrawn_from[seats] == NOT_WITHDRAWN]
        if not new.size:
            return
        first = np.iinfo(np.int64).min if state.last_closed is None else state.last_closed + 1
        published = dict(self.cfg.released).get(state.stream)
        if published is not None:  # a replay recomputes published slots as they were published
            first = max(first, published + 1)
        state.withdrawn_from[new] = first
        log.warning(
            "step %s: stream %r: %d user(s) withdrawn from the registration table, from slot %s "
            "on (their seats stay; their events are withdrawn_user dead letters)",
            step_id, state.stream, new.size, "the first" if state.last_closed is None else first,
        )  # fmt: skip

    def unwithdrawn(
        self, state: StreamState, slot: int, values: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``values`` with every seat withdrawn at or before ``slot`` blank (in place: a
        carried value is blanked for good)."""
        withdrawn = state.withdrawn_from
        if withdrawn is not None:
            values[withdrawn <= slot] = np.nan
        return values

    def withdrawn_rows(
        self,
        state: StreamState,
        slots: NDArray[np.int64],
        idx: NDArray[np.int64],
        code: NDArray[np.int8],
    ) -> None:
        """Mark the accepted rows of withdrawn seats at or after their withdrawal's first
        slot as ``withdrawn_user``."""
        withdrawn = state.withdrawn_from
        if withdrawn is None:
            return
        hit = (code == 0) & (idx >= 0)
        hit[hit] = slots[hit] >= withdrawn[idx[hit]]
        code[hit] = CODE[WITHDRAWN]

    def enrolment(self, state: StreamState) -> tuple[int, int] | None:
        """How full the population of named users is: ``(enrolled, n)``, the number of users
        who ever reported, public like every report count under LDP and the registration
        table's size under central DP (docs/decisions.md); None for dense indices."""
        if state.id_kind == "named" or state.directory:
            return len(state.directory), self.n
        return None

    def registered_share(self) -> float:
        """The stream's share of a registration's budgets (``Preferences.share``; 1 without)."""
        preferences = getattr(self.trust, "preferences", None)
        return preferences.share if isinstance(preferences, Preferences) else 1.0

    def _requirement_arrays(self, state: StreamState) -> None:
        if state.epsilons is None or state.windows is None:
            state.epsilons = np.full(self.n, np.nan)
            state.windows = np.zeros(self.n, dtype=np.int64)

    def requirements(
        self,
        state: StreamState,
        batch: EventBatch,
        idx: NDArray[np.int64],
        code: NDArray[np.int8],
        share: float = 1.0,
    ) -> None:
        """Refuse rows stating another requirement than the user's registered one (the
        registration fixes it before the data arrive; a row stating none is fine). A user
        states their own ε_i; the stream holds ``share·ε_i`` (``Preferences.share``), so the
        stated value is scaled alike before the exact comparison."""
        if batch.epsilons is None or batch.windows is None:
            return
        stating = (code == 0) & (~np.isnan(batch.epsilons) | (batch.windows > 0))
        if not stating.any():
            return
        self._requirement_arrays(state)
        assert state.epsilons is not None and state.windows is not None
        rows = np.flatnonzero(stating)
        users = idx[rows]
        eps, win = batch.epsilons[rows], batch.windows[rows]
        changed = (~np.isnan(eps) & (eps * share != state.epsilons[users])) | (
            (win > 0) & (win != state.windows[users])
        )
        code[rows[changed]] = CODE[REQUIREMENT_CHANGED]


def check_closed_population(
    prefs: Preferences, epsilon: float, cost: Guarantee, population: int
) -> frozenset[str]:
    """The users of an LDP stream's registration table (a closed population), refused at start
    unless it names users (not dense indices), at most ``population`` of them, and each
    entry's requirement ``(ε_i, w_i)`` holds under the stream's one guarantee for everybody:
    ``ε`` per window of ``cost``'s scope, so ``ε · ⌈w_i / w⌉ ≤ ε_i`` (a guarantee over the
    stream's whole life: ``ε ≤ ε_i``). Errors name the entry by its number, never the user."""
    if not prefs.by_user or prefs.epsilons is not None or prefs.windows is not None:
        raise ValueError("an LDP stream's registration table must name its users (user ids)")
    if len(prefs.by_user) > population:
        raise ValueError(
            f"the registration table holds {len(prefs.by_user)} users but the stream's "
            f"population is n={population}"
        )
    scope = cost.scope
    renews = cost.window or (scope.length if isinstance(scope, PeriodScope) else None)
    for k, (eps, win) in distinct_requirements(prefs.by_user.values()):
        spent = epsilon * (1 if renews is None else math.ceil(win / renews))
        if spent > budget_limit(eps):
            raise ValueError(
                f"registration entry {k} asks (ε_i, w_i) = ({eps:g}, {win}), but this LDP "
                f"stream gives every user ε = {epsilon:g} per "
                f"{'stream' if renews is None else f'{renews} slots'}, {spent:g} over "
                f"{win} slots: raise the entry's ε_i or lower the stream's ε"
            )
    return frozenset(prefs.by_user)
