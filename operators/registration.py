"""Who a stream counts: the registration of a trusted-curator stream, fixed before the data,
and the enrolment of named users of an LDP stream at the close of their first slot.

Central DP (spec personalized-w-event §1.1, A2): the registration table (``Preferences``) names
the population and each user's requirement ``(ε_i, w_i)`` before any data, so who is counted
never depends on who sent data; anybody else's events are ``unregistered_user`` dead letters
and an event stating another requirement is ``requirement_changed``. LDP (``ldp-simulated``):
a named user is enrolled when the slot of their first accepted report closes, in user-id order,
so every user's dense index — and so which users a mechanism samples — is independent of how
the input partitions interleave.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from privstream.events import (
    DUPLICATE,
    POPULATION_FULL,
    REQUIREMENT_CHANGED,
    DeadLetter,
    EventBatch,
)
from privstream.mechanisms.tasks import EstimationTask
from privstream.mechanisms.validation import MIN_EPSILON, check_fraction, check_requirement
from privstream.operators.reasons import CODE, Output
from privstream.operators.stream_state import StreamState


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
        for k, (eps, win) in enumerate(self.by_user.values(), start=1):
            check_requirement(eps, win, f"registration entry {k}")
            check_requirement(eps * self.share, win, f"registration entry {k} at its share")
        if self.epsilons is not None:
            for eps in np.unique(self.epsilons[~np.isnan(self.epsilons)]).tolist():
                check_requirement(eps, 1, "a registered requirement")
        if self.windows is not None:
            for win in np.unique(self.windows[self.windows != 0]).tolist():
                check_requirement(MIN_EPSILON, win, "a registered requirement")


class Registration:
    """The registration and enrolment steps of the slotted operator (a mixin of its logic)."""

    n: int
    task: EstimationTask

    def _blank(self) -> NDArray[np.float64]:
        """Every user's value unknown: NaN, one row of ``d`` per user for a vector task."""
        shape = (self.n, self.task.d) if self.task.kind == "vector" else (self.n,)
        return np.full(shape, np.nan)

    def _register(self, state: StreamState, prefs: Preferences) -> None:
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

    def _hold_newcomers(
        self, state: StreamState, batch: EventBatch, rows: NDArray[np.intp], code: NDArray[np.int8]
    ) -> None:
        """Keep the rows of users not enrolled yet until their slot closes (first report of a
        user in a slot wins). Enrolling them then, in user-id order, makes every user's dense
        index — and so which users a mechanism samples — independent of how the input
        partitions interleave."""
        newcomers = state.newcomers
        slots, users = batch.slots[rows].tolist(), batch.users[rows].tolist()
        for i, slot, user in zip(rows.tolist(), slots, users, strict=True):
            held = newcomers.get(slot)
            if held is None:
                held = newcomers[slot] = {}
            if user in held:
                code[i] = CODE[DUPLICATE]
            else:
                held[user] = (batch.values[i].copy(), *batch.row_line(i))

    def _admit_newcomers(self, state: StreamState, slot: int, out: list[Output]) -> None:
        """Enrol the users first seen in ``slot``, in user-id order, and put their reports
        in the slot; past the population ``n`` they are ``population_full`` dead letters."""
        held = state.newcomers.pop(slot, None)
        if not held:
            return
        directory = state.directory
        target = state.open_slots.get(slot)
        if target is None:
            target = state.open_slots[slot] = self._blank()
        for user in sorted(held):
            value, text, original = held[user]
            j = directory.get(user, -1)
            if j < 0 and len(directory) >= self.n:
                detail = f"the stream's population of {self.n} users is full"
                letter = DeadLetter(POPULATION_FULL, state.stream, text, detail, original)
                out.append(("dead_letter", letter))
                continue
            if j < 0:
                j = directory[user] = len(directory)
            target[j] = value  # held first: it wins over a later report of the same slot

    def _requirement_arrays(self, state: StreamState) -> None:
        if state.epsilons is None or state.windows is None:
            state.epsilons = np.full(self.n, np.nan)
            state.windows = np.zeros(self.n, dtype=np.int64)

    def _requirements(
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
