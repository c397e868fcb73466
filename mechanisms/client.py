"""The privacy boundary of each trust mode (design §4): what server logic may ask about users.

``ClientPort`` (``ldp-simulated``): server logic asks for reports, never for raw values.

``SimulatedClientPort`` is the ``ldp-simulated`` trust mode (design §4, spec §6.2): it holds the
population's current raw values and runs the user side of the protocol on behalf of each
selected user. Two paths produce the same distribution of support counts:

* ``"per-user"`` materialises every selected user's randomised report (the reference);
* ``"aggregate"`` draws the support counts directly from their exact distribution given the
  selected users' true value counts (multinomial/binomial draws). Oracles without an exact fast
  path (OLH, HM) fall back to the per-user path.

``CuratorPort`` (``cdp``, spec personalized-w-event §1.1, §9.2): the server is a trusted curator
that sees raw values, so the port hands the mechanism the true histogram of each privacy class.
``SimulatedCurator`` builds it from the same dense per-user value array as
``SimulatedClientPort`` plus the stream's ``Requirements`` (every registered user's
``(ε_i, w_i)``; users register over time but never change requirement, spec §1.1, §9.5). Only
what a mechanism releases is public; nothing here is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import EstimationTask

ClientPath = Literal["aggregate", "per-user"]
ABSENT = -1  # marker of a user with no current value in an integer value array


@dataclass(frozen=True)
class Aggregate:
    """What the server learns from one round of reports: an unbiased estimate and its size."""

    estimate: NDArray[np.float64]
    reports: int
    report_bits: int
    oracle: str


class ClientProtocol(Protocol):
    """The client side of a mechanism's protocol: what every asked user's device computes from
    its raw value and its own state (design §4). It runs behind the port; only the reports it
    returns reach the server."""

    def respond(
        self,
        values: NDArray[Any],
        asked: NDArray[np.bool_],
        state: Any,
        rng: np.random.Generator,
    ) -> tuple[NDArray[np.float64], Any]:
        """The ``asked`` users' reports (one row each, in user order) and the client state
        after them (a new object: the state passed in is left as it was)."""
        ...


class ClientPort(Protocol):
    """Server-side view of the users of one stream at one slot."""

    @property
    def population(self) -> int:
        """Registered population size ``n``."""
        ...

    def eligible(self) -> NDArray[np.bool_]:
        """Mask of users able to report at this slot (they hold a current value)."""
        ...

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        """Ask ``users`` (all eligible users when None) for one ε-LDP report each."""
        ...

    def respond(
        self, protocol: ClientProtocol, asked: NDArray[np.bool_], purpose: str
    ) -> NDArray[np.float64]:
        """Run ``protocol`` on the devices of the ``asked`` users; their reports, one row each."""
        ...


def absent_mask(values: NDArray[np.float64] | NDArray[np.int64]) -> NDArray[np.bool_]:
    """Users without a value: ``-1`` in integer arrays, NaN in float arrays (a vector value,
    one row per user, is absent when any coordinate is NaN)."""
    if np.issubdtype(values.dtype, np.floating):
        missing = np.isnan(values)
        return np.asarray(missing.any(axis=1) if missing.ndim == 2 else missing, dtype=bool)
    return np.asarray(values == ABSENT, dtype=bool)


@dataclass(frozen=True)
class ReportPort:
    """``ldp-reports``: the slot's reports as the devices sent them, already randomised by a
    device stage (``mechanisms.stages``) before they reached the server; NaN: no report. The
    server reads nothing else of the users."""

    reports: NDArray[np.float64]

    @property
    def population(self) -> int:
        return int(self.reports.shape[0])

    def eligible(self) -> NDArray[np.bool_]:
        """Users who reported this slot."""
        return ~absent_mask(self.reports)


class SimulatedClientPort:
    """Runs ``LocSan`` (spec Alg. 1) for the selected users with per-slot seeded randomness.

    The privacy boundary of the LDP modes (design §4): the raw ``values`` and the client side's
    per-user ``client_state`` (``Mechanism.client_state``: state a protocol's clients keep
    across slots) stay behind this port; a mechanism's server logic only receives what crosses
    it — ``eligible`` (public membership) and the ``Aggregate`` of perturbed reports."""

    def __init__(
        self,
        values: NDArray[np.float64] | NDArray[np.int64],
        task: EstimationTask,
        randomness: SlotRandomness,
        path: ClientPath = "aggregate",
        client_state: Any = None,
    ) -> None:
        if path not in ("aggregate", "per-user"):
            raise ValueError(f"client path must be 'aggregate' or 'per-user', got {path!r}")
        self._values = values
        self._task = task
        self._randomness = randomness
        self._path = path
        self._client_state = client_state
        self.client_state_after: Any = None
        """The client state after ``respond`` (None until then): the operator keeps it once
        the slot is released, so a failed step leaves the devices' state as it was."""
        self._eligible = ~absent_mask(values)
        self._everyone = bool(self._eligible.all())
        self._all_counts: NDArray[np.int64] | None = None

    @property
    def population(self) -> int:
        return int(self._values.shape[0])

    def eligible(self) -> NDArray[np.bool_]:
        return self._eligible

    def _raw(self, users: NDArray[np.int64] | None) -> NDArray[Any]:
        """Raw values of ``users`` (all eligible users when None), without copying if possible."""
        if users is not None:
            return self._values[users]
        return self._values if self._everyone else self._values[self._eligible]

    def _true_counts(self, users: NDArray[np.int64] | None) -> NDArray[np.int64]:
        if users is None and self._all_counts is not None:
            return self._all_counts
        encoded = np.asarray(self._task.encode(self._raw(users)), dtype=np.int64)
        counts = np.bincount(encoded, minlength=self._task.d)
        if users is None:
            self._all_counts = counts
        return counts

    def respond(
        self, protocol: ClientProtocol, asked: NDArray[np.bool_], purpose: str
    ) -> NDArray[np.float64]:
        if asked.shape != self._eligible.shape or np.any(asked & ~self._eligible):
            raise ValueError("respond() asked a user without a current value to report")
        rng = self._randomness(f"{purpose}/client")
        reports, self.client_state_after = protocol.respond(
            self._values, asked, self._client_state, rng
        )
        return reports

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        oracle = self._task.select(eps)
        rng = self._randomness(f"{purpose}/client")
        if users is not None and not np.all(self._eligible[users]):
            raise ValueError("collect() asked a user without a current value to report")
        m = int(self._eligible.sum()) if users is None else int(users.shape[0])
        support = None
        if self._path == "aggregate" and self._task.kind == "frequency":
            support = oracle.sample_support(self._true_counts(users), eps, rng)
        if support is None:
            reports = oracle.perturb(self._task.encode(self._raw(users)), eps, rng)
            support = oracle.support(reports, eps)
        return _aggregate(self._task, support, eps, m)


def _aggregate(task: EstimationTask, support: NDArray[np.float64], eps: float, m: int) -> Aggregate:
    """The server's estimate from the support counts of ``m`` reports made with ``eps``."""
    oracle = task.select(eps)
    estimate = task.decode(oracle.estimate(support, eps, m))
    return Aggregate(estimate, m, m * oracle.report_bits(eps), oracle.name)


class CountedClients:
    """The simulated devices of one slot over the counts of their current values, summed over
    a stream's user shards (``operators.user_shards``): ``counts[j]`` users hold bin ``j``.

    Every eligible user reporting once with ``ε`` (budget division) is answered as
    ``SimulatedClientPort``'s aggregate path answers it: the support counts drawn from their
    exact distribution given these counts, with the same randomness (``{purpose}/client``), so
    the same numbers whatever the number of shards. The seats are not kept: ``eligible`` has
    the right number of users, not the right ones, and a request naming users (population
    division) or a protocol run on the devices (``respond``) is refused. Nothing per user
    crosses this port. Guarantee: each report is ε-LDP, as on ``SimulatedClientPort``.
    """

    def __init__(
        self,
        counts: NDArray[np.int64],
        population: int,
        task: EstimationTask,
        randomness: SlotRandomness,
    ) -> None:
        if counts.shape != (task.d,):
            raise ValueError(f"counts of shape {counts.shape} for a task of d={task.d}")
        self._counts = counts
        self._population = population
        self._task = task
        self._randomness = randomness
        self._eligible = np.zeros(population, dtype=bool)
        self._eligible[: int(counts.sum())] = True

    @property
    def population(self) -> int:
        return self._population

    def eligible(self) -> NDArray[np.bool_]:
        """As many eligible users as hold a value (the seats are not kept: see the class)."""
        return self._eligible

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        if users is not None:
            raise ValueError(
                "a stream on user shards asks every eligible user only (budget division); "
                "this mechanism named its reporting users"
            )
        support = self._task.select(eps).sample_support(
            self._counts, eps, self._randomness(f"{purpose}/client")
        )
        if support is None:
            raise ValueError(f"{self._task.select(eps).name} has no aggregate path")
        return _aggregate(self._task, support, eps, int(self._counts.sum()))

    def respond(
        self, protocol: ClientProtocol, asked: NDArray[np.bool_], purpose: str
    ) -> NDArray[np.float64]:
        raise ValueError("a stream on user shards runs no protocol on its devices")


# ---------------------------------------------------------------------------------------------
# Trusted curator (cdp)
# ---------------------------------------------------------------------------------------------

NO_WINDOW = 0  # marker of a user without a window preference in a ``Requirements`` array
NO_CLASS = -1  # ``PrivacyClasses.members`` entry of a user who is not registered


@dataclass(frozen=True)
class PrivacyClasses:
    """The distinct requirements of a registered population (spec §9.3).

    Class ``c`` holds the ``sizes[c]`` registered users whose resolved requirement is
    ``(windows[c], epsilons[c])``; classes are sorted by window, then budget, and every class
    has at least one member. ``members[i]`` is user ``i``'s class, ``NO_CLASS`` (−1) for a
    user who is not registered. ``digest`` fingerprints the assignment (no ids, no values).
    A population nobody has registered in yet has no classes (``count == 0``).
    """

    windows: NDArray[np.int64]
    epsilons: NDArray[np.float64]
    sizes: NDArray[np.int64]
    members: NDArray[np.intp]
    digest: str

    @property
    def count(self) -> int:
        """``m``, the number of classes."""
        return int(self.windows.shape[0])

    @property
    def registered(self) -> int:
        """How many users are registered (``Σ_c n_c``)."""
        return int(self.sizes.sum())


def _factorize(a: NDArray[Any]) -> tuple[NDArray[Any], NDArray[np.intp]]:
    """Sorted distinct values of ``a`` and each element's index among them."""
    values = np.unique(a)
    return values, np.asarray(np.searchsorted(values, a), dtype=np.intp)


class Requirements:
    """Every registered user's privacy requirement ``(ε_i, w_i)`` for one stream (spec §1.1).

    ``epsilons[i]`` is user ``i``'s budget (NaN: no preference) and ``windows[i]`` their window
    (``0``: no preference); either array may be None when nobody states that preference, and
    then ``population`` gives the user count. Users without a preference get the mechanism's
    stream default (its ``Config.epsilon``/``Config.window``), resolved in ``classes``.

    ``registered`` (a boolean mask, default everyone) says which users are registered: only
    they belong to a class and count in the class sizes ``n_c``; the curator ignores the values
    of everybody else, whatever they hold, and their preference entries are never read (NaN/0
    placeholders are fine). Users register over time (spec §9.5): rebuild the object in the
    slots where somebody new registered, and keep handing the same object to every slot's
    ``SimulatedCurator`` otherwise, since the class table is computed once per default and
    memoised here (O(n) NumPy work per default). A registered user must never leave their
    class or change requirement: the mechanisms refuse a class that shrinks.

    Requirements are public metadata (spec §1.1, A2) but user ids are not: this object holds
    dense indices only.
    """

    def __init__(
        self,
        epsilons: ArrayLike | None = None,
        windows: ArrayLike | None = None,
        *,
        population: int | None = None,
        registered: ArrayLike | None = None,
    ) -> None:
        eps = None if epsilons is None else np.array(epsilons, dtype=np.float64).reshape(-1)
        win = None if windows is None else np.array(windows, dtype=np.float64).reshape(-1)
        mask = None if registered is None else np.array(registered).reshape(-1)
        sizes = {a.shape[0] for a in (eps, win, mask) if a is not None}
        if population is not None:
            sizes.add(population)
        if len(sizes) != 1:
            raise ValueError(
                "epsilons, windows, registered and population must describe one population, "
                f"got sizes {sorted(sizes)}"
            )
        n = sizes.pop()
        if n < 1:
            raise ValueError(f"population must be >= 1 users, got {n}")
        if eps is not None and not np.all(np.isnan(eps) | (np.isfinite(eps) & (eps > 0))):
            raise ValueError("epsilons must be positive finite budgets (NaN: no preference)")
        if win is not None and not np.all(
            np.isfinite(win) & (win == np.floor(win)) & ((win >= 1) | (win == NO_WINDOW))
        ):
            raise ValueError("windows must be integers >= 1 (0: no preference)")
        if mask is not None and mask.dtype != np.bool_:
            raise ValueError(f"registered must be a boolean mask, got dtype {mask.dtype}")
        self.population = int(n)
        self._epsilons = eps
        self._windows = None if win is None else win.astype(np.int64)
        self._registered = None if mask is None or bool(mask.all()) else mask
        self.registered_count = (
            self.population if self._registered is None else int(self._registered.sum())
        )
        for a in (self._epsilons, self._windows, self._registered):
            if a is not None:
                a.flags.writeable = False
        self._memo: dict[tuple[float, int], PrivacyClasses] = {}

    @property
    def registered(self) -> NDArray[np.bool_] | None:
        """The (read-only) registered mask; None when every user is registered."""
        return self._registered

    def classes(self, default_epsilon: float, default_window: int) -> PrivacyClasses:
        """The class table with every missing preference replaced by the stream default."""
        if not (math.isfinite(default_epsilon) and default_epsilon > 0) or default_window < 1:
            raise ValueError(
                f"default requirement must be ε > 0 and w >= 1, got ({default_epsilon!r}, {default_window!r})"
            )
        key = (float(default_epsilon), int(default_window))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._resolve(*key)
        return found

    def _resolve(self, default_epsilon: float, default_window: int) -> PrivacyClasses:
        n, mask = self.population, self._registered
        members = np.full(n, NO_CLASS, dtype=np.intp)
        if self.registered_count == 0:
            windows, epsilons = np.zeros(0, dtype=np.int64), np.zeros(0)
        elif self._epsilons is None and self._windows is None:
            if mask is None:
                members[:] = 0
            else:
                members[mask] = 0
            windows = np.array([default_window], dtype=np.int64)
            epsilons = np.array([default_epsilon])
        else:
            eps = self._epsilons if mask is None or self._epsilons is None else self._epsilons[mask]
            win = self._windows if mask is None or self._windows is None else self._windows[mask]
            m = self.registered_count
            eps = (
                np.full(m, default_epsilon)
                if eps is None
                else np.where(np.isnan(eps), default_epsilon, eps)
            )
            win = (
                np.full(m, default_window, dtype=np.int64)
                if win is None
                else np.where(win == NO_WINDOW, default_window, win)
            )
            # Classes sorted by (w, ε): rank each coordinate, then combine the ranks. Linear
            # after the two small sorts of distinct values, unlike a row-wise np.unique.
            wins, w_rank = _factorize(win)
            epss, e_rank = _factorize(eps)
            key = w_rank.astype(np.int64) * epss.shape[0] + e_rank
            grid = wins.shape[0] * epss.shape[0]
            if grid <= 4 * m:
                present = np.bincount(key, minlength=grid) > 0
                used = np.flatnonzero(present)
                inverse = (np.cumsum(present) - 1)[key]
            else:  # many distinct budgets: a sort of the combined keys
                used, inverse = _factorize(key)
            windows = wins[used // epss.shape[0]].astype(np.int64)
            epsilons = np.ascontiguousarray(epss[used % epss.shape[0]], dtype=np.float64)
            if mask is None:
                members[:] = inverse
            else:
                members[mask] = inverse
        registered = members if mask is None else members[mask]
        sizes = np.bincount(registered, minlength=windows.shape[0]).astype(np.int64)
        h = hashlib.blake2b(digest_size=16)
        for part in (windows, epsilons, members.astype(np.int64)):
            h.update(np.ascontiguousarray(part).tobytes())
        for a in (windows, epsilons, sizes, members):
            a.flags.writeable = False
        return PrivacyClasses(windows, epsilons, sizes, members, h.hexdigest())

    def __repr__(self) -> str:  # never print per-user requirements
        return f"Requirements(population={self.population}, registered={self.registered_count})"


@dataclass(frozen=True)
class ClassHistogram:
    """The true per-class histograms of one slot: ``counts[c, j]`` registered users of class
    ``c`` whose value is bin ``j`` (spec §9.2 ``SlotInput``). ``sizes[c]`` is the class's
    registered size ``n_c`` (public, used by OBS); ``counts`` only covers registered users with
    a current value. No registered user yet: no classes, ``counts`` of shape ``(0, d)``.

    Behind the privacy boundary: a mechanism may add noise to it, never release it.
    """

    windows: NDArray[np.int64]
    epsilons: NDArray[np.float64]
    sizes: NDArray[np.int64]
    counts: NDArray[np.int64]
    digest: str

    @property
    def total(self) -> NDArray[np.int64]:
        """The true histogram ``c_t`` of the registered population."""
        out: NDArray[np.int64] = self.counts.sum(axis=0)
        return out

    def __repr__(self) -> str:  # never print true counts
        return f"ClassHistogram(classes={self.windows.shape[0]}, d={self.counts.shape[1]})"


@runtime_checkable
class CuratorPort(Protocol):
    """Server-side view of one stream at one slot in the trusted-curator (``cdp``) mode."""

    @property
    def population(self) -> int:
        """Size ``n`` of the dense user index (registered or not)."""
        ...

    def class_histogram(
        self, default_epsilon: float, default_window: int, share: float = 1.0
    ) -> ClassHistogram:
        """The slot's true histogram per privacy class of the registered users, users without a
        preference resolved to ``(default_epsilon, default_window)``; every class budget is
        multiplied by ``share``, a mechanism's part of the population budget."""
        ...


class _MemoCurator:
    """A curator port's ``class_histogram``: each default's histogram made once
    (``_histogram``), every mechanism's share applied to a copy of its budgets."""

    def __init__(self) -> None:
        self._memo: dict[tuple[float, int], ClassHistogram] = {}

    def class_histogram(
        self, default_epsilon: float, default_window: int, share: float = 1.0
    ) -> ClassHistogram:
        key = (float(default_epsilon), int(default_window))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._histogram(*key)
        if share == 1.0:
            return found
        epsilons = found.epsilons * share
        epsilons.flags.writeable = False
        return dataclasses.replace(found, epsilons=epsilons)

    def _histogram(self, default_epsilon: float, default_window: int) -> ClassHistogram:
        raise NotImplementedError


class SimulatedCurator(_MemoCurator):
    """The trusted curator over a dense per-user value array (``-1``/NaN: no current value).

    Built per slot exactly like ``SimulatedClientPort``, with the stream's ``Requirements`` in
    place of the randomness: the curator draws nothing, the mechanism samples and adds noise.
    Values of users who are not registered are never read, not even checked.
    """

    def __init__(
        self,
        values: NDArray[np.float64] | NDArray[np.int64],
        task: EstimationTask,
        requirements: Requirements,
    ) -> None:
        if task.kind != "frequency":
            raise ValueError(
                f"the curator releases histograms; task must be a FrequencyTask, got {task!r}"
            )
        if values.shape[0] != requirements.population:
            raise ValueError(
                f"values hold {values.shape[0]} users but the requirements describe {requirements.population}"
            )
        super().__init__()
        self._values = values
        self._task = task
        self._requirements = requirements
        self._eligible = ~absent_mask(values)

    @property
    def population(self) -> int:
        return int(self._values.shape[0])

    def eligible(self) -> NDArray[np.bool_]:
        """Registered users holding a current value."""
        registered = self._requirements.registered
        return self._eligible if registered is None else self._eligible & registered

    def _histogram(self, default_epsilon: float, default_window: int) -> ClassHistogram:
        classes = self._requirements.classes(default_epsilon, default_window)
        d, m = self._task.d, classes.count
        keep = self.eligible()
        everyone = bool(keep.all())
        raw = self._values if everyone else self._values[keep]
        members = classes.members if everyone else classes.members[keep]
        bins = np.asarray(self._task.encode(raw), dtype=np.int64)
        if bins.size and (bins.min() < 0 or bins.max() >= d):
            raise ValueError(f"a current value lies outside the domain 0..{d - 1}")
        counts = np.bincount(members * d + bins, minlength=m * d).reshape(m, d)
        return ClassHistogram(
            classes.windows, classes.epsilons, classes.sizes, counts, classes.digest
        )


class GroupedCurator(_MemoCurator):
    """The trusted curator of one slot over counts per requirement group, summed over a
    stream's user shards (``operators.user_shards``): ``counts[g, j]`` registered users of
    group ``g`` (the users registered with one requirement) whose current value is bin ``j``.

    ``representatives[g]`` is the dense index of one user of group ``g``; every member of a
    group resolves to the same class under any default, so a class's histogram is the sum of
    its groups' counts: the same integers ``SimulatedCurator`` counts user by user, hence the
    same releases whatever the number of shards. Nothing per user crosses this port.
    """

    def __init__(
        self,
        counts: NDArray[np.int64],
        representatives: NDArray[np.intp],
        requirements: Requirements,
    ) -> None:
        if counts.ndim != 2 or counts.shape[0] != representatives.shape[0]:
            raise ValueError(
                f"counts of shape {counts.shape} for {representatives.shape[0]} groups"
            )
        super().__init__()
        self._counts = counts
        self._representatives = representatives
        self._requirements = requirements

    @property
    def population(self) -> int:
        return self._requirements.population

    def _histogram(self, default_epsilon: float, default_window: int) -> ClassHistogram:
        classes = self._requirements.classes(default_epsilon, default_window)
        counts = np.zeros((classes.count, self._counts.shape[1]), dtype=np.int64)
        np.add.at(counts, classes.members[self._representatives], self._counts)
        return ClassHistogram(
            classes.windows, classes.epsilons, classes.sizes, counts, classes.digest
        )


def slot_port(
    mode: str,
    values: NDArray[Any],
    task: EstimationTask,
    randomness: SlotRandomness,
    path: ClientPath = "aggregate",
    requirements: Requirements | None = None,
    clients: Any = None,
) -> ClientPort | CuratorPort | ReportPort:
    """The engine-free port of trust mode ``mode`` over one slot's ``values`` (the bench
    harness and the conformance checks): a curator of ``requirements`` (``cdp``), the devices'
    reports as given (``ldp-reports``), else privstream's simulated clients."""
    if mode == "cdp":
        return SimulatedCurator(values, task, requirements or Requirements())
    if mode == "ldp-reports":
        return ReportPort(values)
    return SimulatedClientPort(values, task, randomness, path, clients)
