"""The trust mode's port of every slot (design §4): what a mechanism sees of the users.

The mechanisms declare the trust modes they support (``Mechanism.trust_modes``); ``ports_for``
picks the mode they share and builds its ``Ports``: ``SimulatedClients`` (``ldp-simulated``:
privstream's client code behind a ``ClientPort``) or ``TrustedCurator`` (``cdp``: the registered
users' values and requirements behind a ``CuratorPort``). ``ldp-reports`` (devices perturb
their own values, in a device stage before the server: ``mechanisms.stages``) gets
``DeviceReports``: the slot's reports as they arrived (``ReportPort``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import (
    ClientPath,
    ClientPort,
    CountedClients,
    CuratorPort,
    GroupedCurator,
    ReportPort,
    Requirements,
    SimulatedClientPort,
    SimulatedCurator,
)
from privstream.mechanisms.contract import Mechanism
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import EstimationTask
from privstream.mechanisms.trust import TrustMode
from privstream.operators.registration import Preferences
from privstream.operators.stream_state import StreamState
from privstream.operators.user_shards import requirement_pairs


class Ports:
    """Builds the port of one trust mode (``mechanisms.trust``) for every slot of a stream.

    ``fixed_population``: the registered users are given at start (``cdp``), so who sent data
    never changes who is counted; otherwise users enrol on their first accepted event.
    """

    mode: ClassVar[TrustMode]
    tracks_requirements: ClassVar[bool] = False
    fixed_population: ClassVar[bool] = False
    members: frozenset[str] | None = None
    """A closed population of an LDP stream (its registration table's users): only they
    enrol; None: anybody, up to n users."""

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> ClientPort | CuratorPort | ReportPort:
        raise NotImplementedError

    # User shards (``operators.user_shards``): a port over counts summed across shards.

    @property
    def table(self) -> Preferences | None:
        """The registration table naming the stream's users, which user shards split."""
        return None

    def shard_refusal(self, mechanisms: Sequence[Mechanism[Any, Any]]) -> str | None:
        """Why splitting this stream's users over shards would change a release (None: it
        would not): the port must be computable from counts per registered requirement and
        bin, the only thing a shard hands on."""
        return f"user shards are not built for {self.mode} streams"

    def part(self, table: Preferences) -> Ports:
        """These ports over ``table``, a part of the registration (one shard's users)."""
        raise NotImplementedError

    def grouped(
        self,
        state: StreamState,
        groups: Sequence[tuple[float, float]],
        counts: NDArray[np.int64],
        randomness: SlotRandomness,
    ) -> ClientPort | CuratorPort:
        """The slot's port over ``counts[g, j]``: the users of requirement ``groups[g]``
        (``user_shards.requirement_pairs``) holding bin ``j``, summed over the shards."""
        raise NotImplementedError


@dataclass(frozen=True)
class SimulatedClients(Ports):
    """``ldp-simulated``: privstream's client code answers on behalf of each asked user, with
    the mechanism's client-side per-user state behind the port. ``members``: the users of a
    registration table (a closed population), or None (open: anybody enrols, up to n)."""

    mode: ClassVar[TrustMode] = "ldp-simulated"
    task: EstimationTask
    path: ClientPath = "aggregate"
    registration: Preferences | None = field(default=None, hash=False, compare=False)
    """The registration table of a closed population (its dict does not hash)."""
    members: frozenset[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.registration is not None:
            object.__setattr__(self, "members", frozenset(self.registration.by_user))

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> ClientPort:
        return SimulatedClientPort(values, self.task, randomness, self.path, client_state)

    @property
    def table(self) -> Preferences | None:
        return self.registration

    def shard_refusal(self, mechanisms: Sequence[Mechanism[Any, Any]]) -> str | None:
        """Shards hand on counts, so the devices' answers must follow from counts: a closed
        population (an open one seats a slot's newcomers in one keyed order over all of
        them), every user asked every slot (population division picks its reporters after the
        slot's first round: a way back from the decision to the shards), an oracle with an
        exact aggregate on the aggregate path, and no state on the devices."""
        if self.registration is None:
            return ("an open LDP population seats each slot's newcomers in one keyed order over "
                    "all of them: give the stream a registration table (a closed population)")  # fmt: skip
        picking = sorted(m.name for m in mechanisms if m.division != "budget")
        if picking:
            verb = "divides" if len(picking) == 1 else "divide"
            return (f"{', '.join(picking)} {verb} the population: the mechanism draws each "
                    "slot's reporters over every seat (LPD, LPA: after the slot's first "
                    "round), which the shards would need back, and a dataflow is acyclic")  # fmt: skip
        if self.path != "aggregate" or not self.task.counts_suffice:
            return ("the simulated devices must answer from counts: the aggregate client path "
                    "and an oracle with an exact aggregate (GRR, OUE or ada)")  # fmt: skip
        keeping = sorted(m.name for m in mechanisms if m.client_state() is not None)
        if keeping:
            verb = "keeps" if len(keeping) == 1 else "keep"
            return f"{', '.join(keeping)} {verb} state on each device across slots"
        return None

    def part(self, table: Preferences) -> SimulatedClients:
        return SimulatedClients(self.task, self.path, table)

    def grouped(
        self,
        state: StreamState,
        groups: Sequence[tuple[float, float]],
        counts: NDArray[np.int64],
        randomness: SlotRandomness,
    ) -> ClientPort:
        """Every group reports alike under LDP: the devices over the bins' totals."""
        totals = counts.sum(axis=0, dtype=np.int64)
        return CountedClients(totals, int(state.current.shape[0]), self.task, randomness)


class TrustedCurator(Ports):
    """``cdp``: the curator sees the registered users' values and requirements; the mechanism
    samples and adds noise. The population is the registration (``Preferences``), fixed at
    start; the ``Requirements`` are built once per stream."""

    mode: ClassVar[TrustMode] = "cdp"
    tracks_requirements = True
    fixed_population = True

    def __init__(self, task: EstimationTask, preferences: Preferences | None = None) -> None:
        self.task = task
        self.preferences = preferences or Preferences()
        self._cache: dict[str, tuple[tuple[int, str | None], Requirements]] = {}
        self._firsts: dict[str, dict[tuple[float, float], int]] = {}

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> CuratorPort:
        return SimulatedCurator(values, self.task, self.requirements(state))

    @property
    def table(self) -> Preferences | None:
        return self.preferences if self.preferences.by_user else None

    def shard_refusal(self, mechanisms: Sequence[Mechanism[Any, Any]]) -> str | None:
        """A curator's port is its class histograms, sums over users: shardable once a
        registration table names the users to split."""
        if not self.preferences.by_user:
            return "user shards need a registration table naming the stream's users"
        return None

    def part(self, table: Preferences) -> TrustedCurator:
        return TrustedCurator(self.task, table)

    def grouped(
        self,
        state: StreamState,
        groups: Sequence[tuple[float, float]],
        counts: NDArray[np.int64],
        randomness: SlotRandomness,
    ) -> CuratorPort:
        """The curator over each group's counts, every group resolved through its first
        registered user (the registration is fixed: once per stream)."""
        found = self._representatives(state)
        first = np.asarray([found[g] for g in groups], dtype=np.intp)
        return GroupedCurator(counts, first, self.requirements(state))

    def _representatives(self, state: StreamState) -> dict[tuple[float, float], int]:
        cached = self._firsts.get(state.stream)
        if cached is None:
            n = len(state.directory)
            pairs = requirement_pairs(state.epsilons, state.windows, n)
            rows, first = np.unique(pairs, axis=0, return_index=True)
            cached = self._firsts[state.stream] = {
                (float(r[0]), float(r[1])): int(i)
                for r, i in zip(rows.tolist(), first.tolist(), strict=True)
            }
        return cached

    def requirements(self, state: StreamState) -> Requirements:
        """The registered users' requirements of ``state``'s stream (built once per stream
        and registration)."""
        key = (len(state.directory), state.id_kind)
        cached = self._cache.get(state.stream)
        if cached is None or cached[0] != key:
            requirements = Requirements(
                state.epsilons,
                state.windows,
                population=state.current.shape[0],
                registered=state.registered(),
            )
            cached = self._cache[state.stream] = (key, requirements)
        return cached[1]


@dataclass(frozen=True)
class DeviceReports(Ports):
    """``ldp-reports``: the values that reach the server are the devices' reports (a device
    stage randomised them); the port hands them over as they are."""

    mode: ClassVar[TrustMode] = "ldp-reports"

    def shard_refusal(self, mechanisms: Sequence[Mechanism[Any, Any]]) -> str | None:
        return ("an ldp-reports server's shards would have to check each report against the "
                "requests the decision publishes every round: a way back from the decision "
                "to the shards that an acyclic dataflow does not have")  # fmt: skip

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> ReportPort:
        return ReportPort(values)


def ports_for(
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    path: ClientPath = "aggregate",
    registration: Preferences | None = None,
) -> Ports:
    """The ports of the trust mode every one of ``mechanisms`` supports (the first such mode
    of the first mechanism's declaration). A registration is the population of a ``cdp``
    stream, and the closed population (its users only) of an ``ldp-simulated`` one, whose
    entries ``family_mechanisms`` checks against the stream's guarantee
    (``registration.check_closed_population``)."""
    shared = [
        mode for mode in mechanisms[0].trust_modes if all(mode in m.trust_modes for m in mechanisms)
    ]
    if not shared:
        names = {m.name: m.trust_modes for m in mechanisms}
        raise ValueError(f"the mechanisms share no trust mode: {names}")
    mode = shared[0]
    if mode == "cdp":
        return TrustedCurator(task, registration)
    if mode == "ldp-simulated":
        if registration is not None and not registration.by_user:
            raise ValueError("an LDP stream's registration table must name its users (user ids)")
        return SimulatedClients(task, path, registration)
    if registration is not None:
        raise ValueError(f"a registration table is for cdp and ldp-simulated; these run {mode}")
    return DeviceReports()
