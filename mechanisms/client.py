"""The privacy boundary: server logic asks a ``ClientPort`` for reports, never for raw values.

``SimulatedClientPort`` is the ``ldp-simulated`` trust mode (design §4, spec §6.2): it holds the
population's current raw values and runs the user side of the protocol on behalf of each
selected user. Two paths produce the same distribution of support counts:

* ``"per-user"`` materialises every selected user's randomised report (the reference);
* ``"aggregate"`` draws the support counts directly from their exact distribution given the
  selected users' true value counts (multinomial/binomial draws). Oracles without an exact fast
  path (OLH, HM) fall back to the per-user path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

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


def absent_mask(values: NDArray[np.float64] | NDArray[np.int64]) -> NDArray[np.bool_]:
    """Users without a value: ``-1`` in integer arrays, NaN in float arrays."""
    if np.issubdtype(values.dtype, np.floating):
        return np.asarray(np.isnan(values), dtype=bool)
    return np.asarray(values == ABSENT, dtype=bool)


class SimulatedClientPort:
    """Runs ``LocSan`` (spec Alg. 1) for the selected users with per-slot seeded randomness."""

    def __init__(
        self,
        values: NDArray[np.float64] | NDArray[np.int64],
        task: EstimationTask,
        randomness: SlotRandomness,
        path: ClientPath = "aggregate",
    ) -> None:
        if path not in ("aggregate", "per-user"):
            raise ValueError(f"client path must be 'aggregate' or 'per-user', got {path!r}")
        self._values = values
        self._task = task
        self._randomness = randomness
        self._path = path
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
        estimate = self._task.decode(oracle.estimate(support, eps, m))
        return Aggregate(estimate, m, m * oracle.report_bits(eps), oracle.name)
