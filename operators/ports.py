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
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import (
    ClientPath,
    ClientPort,
    CuratorPort,
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


@dataclass(frozen=True)
class SimulatedClients(Ports):
    """``ldp-simulated``: privstream's client code answers on behalf of each asked user, with
    the mechanism's client-side per-user state behind the port. ``members``: the users of a
    registration table (a closed population), or None (open: anybody enrols, up to n)."""

    mode: ClassVar[TrustMode] = "ldp-simulated"
    task: EstimationTask
    path: ClientPath = "aggregate"
    members: frozenset[str] | None = None

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> ClientPort:
        return SimulatedClientPort(values, self.task, randomness, self.path, client_state)


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

    def port(
        self,
        state: StreamState,
        values: NDArray[np.float64],
        randomness: SlotRandomness,
        client_state: Any = None,
    ) -> CuratorPort:
        return SimulatedCurator(values, self.task, self.requirements(state))

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
        members = None if registration is None else frozenset(registration.by_user)
        return SimulatedClients(task, path, members)
    if registration is not None:
        raise ValueError(f"a registration table is for cdp and ldp-simulated; these run {mode}")
    return DeviceReports()
