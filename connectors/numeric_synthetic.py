"""Synthetic numeric streams standing in for the CGM paper's datasets (spec cgm §6.5).

The CGM evaluation (correlated Gaussian mechanism with differential clipping) uses two real
datasets, Kaggle web traffic and Beijing taxi trajectories, plus a mechanism-only check. When
the real data is not at hand these seeded, deterministic generators replace them:

* ``sine`` (S0): ``x_{k,i} = A·sin(2π(i + φ_k)/P)`` with a uniform phase per user. ``A`` and
  ``P`` keep every step ``|Δ| ≤ 2πA/P ≤ C̃`` and ``|x| ≤ 1/2``, so differential clipping never
  bites and the mechanism's error is pure noise.
* ``webtraffic`` (S1): daily page views, log-uniform base level × shared yearly/weekly trend ×
  per-user log-AR(1) × occasional two-day spikes; users who ever exceed ``D = 20000`` are dropped,
  as the paper drops pages above 20000 views.
* ``taxi`` (S2): random-waypoint taxis in the unit square, simulated every 10 s; a taxi's value in
  a 30-minute slot is the fraction of the slot it spends in the central square
  ``[0.45, 0.55]²``.

Every value is computed once, at construction, into a ``slots × users`` array that depends only
on the seed and the parameters. The streams expose what the benchmark harness needs of a slot
source (``name``, ``users``, ``slots``, ``values``, ``truth``, ``numeric``, ``d``, ``bounds``).
They are raw data: the privacy guarantee comes from the mechanism that consumes them, never from
here, and nothing here logs a value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Final

import numpy as np
from numpy.typing import NDArray

NUMERIC_DATASETS: Final = ("sine", "webtraffic", "taxi")

WEB_DOMAIN: Final = 20000.0  # D of spec cgm §6.1: pages above 20000 daily views are dropped
TAXI_SLOTS_PER_DAY: Final = 48  # 30-minute slots
TAXI_DT: Final = 10.0  # simulation step, seconds
TAXI_REGION: Final = (0.45, 0.55)  # the query square [0.45, 0.55]², each axis


class NumericStream:
    """A fixed ``slots × users`` matrix of raw numeric values over the public domain ``bounds``,
    read slot by slot (slots are 1-based). The truth of a slot is the population mean."""

    numeric: Final = True
    d: Final = 1

    def __init__(self, name: str, matrix: NDArray[np.float64], bounds: tuple[float, float]):
        matrix.setflags(write=False)
        self._name = name
        self._matrix = matrix
        self._bounds = bounds

    @property
    def name(self) -> str:
        return self._name

    @property
    def users(self) -> int:
        """``n``: the users actually present (after any filtering)."""
        return int(self._matrix.shape[1])

    @property
    def slots(self) -> int:
        return int(self._matrix.shape[0])

    @property
    def bounds(self) -> tuple[float, float]:
        """The public domain ``[lo, hi]`` every value lies in; ``D = hi − lo``."""
        return self._bounds

    @property
    def matrix(self) -> NDArray[np.float64]:
        """All values, read-only, row ``i − 1`` holding slot ``i``."""
        return self._matrix

    def values(self, slot: int) -> NDArray[np.float64]:
        """Every user's raw value at ``slot`` (1-based), shape ``(users,)``."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot must lie in 1..{self.slots}, got {slot}")
        row: NDArray[np.float64] = self._matrix[slot - 1]
        return row

    def truth(self, slot: int) -> NDArray[np.float64]:
        """The true statistic: the population mean of the raw values at ``slot``, shape ``(1,)``."""
        return np.array([float(np.mean(self.values(slot)))])

    def __iter__(self) -> Iterator[NDArray[np.float64]]:
        for slot in range(1, self.slots + 1):
            yield self.values(slot)


def _check_sizes(users: int, slots: int) -> None:
    if users < 1 or slots < 1:
        raise ValueError(f"users and slots must be >= 1, got users={users}, slots={slots}")


def sine_period(amplitude: float, c_tilde: float) -> int:
    """The shortest integer period ``P`` with ``2πA/P ≤ C̃``."""
    return math.ceil(2 * math.pi * amplitude / c_tilde)


class SineStream(NumericStream):
    """S0, the mechanism-only stream: ``x_{k,i} = A·sin(2π(i + φ_k)/P)``, ``φ_k ~ U[0, P)``.

    The period defaults to the shortest one whose largest possible step ``2πA/P`` stays within
    ``c_tilde``, so differential clipping at ``C̃`` never alters a value (domain ``[−½, ½]``,
    ``D = 1``)."""

    def __init__(
        self,
        users: int = 1000,
        slots: int = 200,
        seed: int = 0,
        *,
        c_tilde: float = 0.05,
        amplitude: float = 0.4,
        period: float | None = None,
    ) -> None:
        _check_sizes(users, slots)
        if not 0 < amplitude <= 0.5:
            raise ValueError(f"amplitude must lie in (0, 1/2], got {amplitude}")
        if c_tilde <= 0:
            raise ValueError(f"c_tilde must be > 0, got {c_tilde}")
        P = float(sine_period(amplitude, c_tilde)) if period is None else float(period)
        if 2 * math.pi * amplitude > c_tilde * P:
            raise ValueError(f"2πA/P = {2 * math.pi * amplitude / P:.4g} exceeds C̃ = {c_tilde}")
        self.c_tilde = c_tilde
        self.amplitude = amplitude
        self.period = P
        phases = np.random.default_rng([seed, 0x53300]).uniform(0.0, P, size=users)
        i = np.arange(1, slots + 1, dtype=np.float64)[:, None]
        matrix = amplitude * np.sin(2 * math.pi * (i + phases[None, :]) / P)
        super().__init__("sine", matrix, (-0.5, 0.5))


def web_trend(slots: int) -> NDArray[np.float64]:
    """The shared trend ``T(i) = 1 + 0.3·sin(2πi/365) + 0.1·sin(2πi/7)`` for ``i = 1..slots``."""
    i = np.arange(1, slots + 1, dtype=np.float64)
    trend: NDArray[np.float64] = (
        1 + 0.3 * np.sin(2 * math.pi * i / 365) + 0.1 * np.sin(2 * math.pi * i / 7)
    )
    return trend


def web_views(users: int, slots: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Daily views of ``users`` pages before the 20000 filter, ``slots × users`` (spec S1):
    ``round(base_k·T(i)·e^{z_{k,i}}·(1 + s'_{k,i}))`` with ``base_k`` log-uniform on
    ``[10, 5000]``, ``z`` a log-AR(1) (``0.9``, ``N(0, 0.2²)``, ``z_0 = 0``) and spikes
    ``s ~ U(2, 9)`` w.p. 0.002 lasting one more day at half height (``s' = max(s_i, s_{i−1}/2)``).
    """
    base = np.exp(rng.uniform(math.log(10.0), math.log(5000.0), size=users))
    trend = web_trend(slots)
    views = np.empty((slots, users))
    z = np.zeros(users)
    spike_prev = np.zeros(users)
    for row in range(slots):
        z = 0.9 * z + rng.normal(0.0, 0.2, size=users)
        spike = np.where(rng.random(users) < 0.002, rng.uniform(2.0, 9.0, size=users), 0.0)
        effective = np.maximum(spike, spike_prev / 2)
        views[row] = np.round(base * trend[row] * np.exp(z) * (1 + effective))
        spike_prev = spike
    return views


class WebTrafficStream(NumericStream):
    """S1, the Kaggle web-traffic substitute: ``requested_users`` pages over ``slots`` days,
    domain ``[0, 20000]``. Pages whose views ever exceed 20000 are dropped, so ``users`` (the
    pages kept) is below ``requested_users`` (about 92 % of them over 550 days)."""

    def __init__(self, users: int = 20000, slots: int = 550, seed: int = 0) -> None:
        _check_sizes(users, slots)
        self.requested_users = users
        views = web_views(users, slots, np.random.default_rng([seed, 0x53310]))
        kept = views.max(axis=0) <= WEB_DOMAIN
        if not kept.any():
            raise ValueError("every generated page exceeds 20000 views; raise users")
        super().__init__("webtraffic", views[:, kept], (0.0, WEB_DOMAIN))


def _waypoints(count: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """``count`` points ``~ N((½, ½), 0.15²·I)`` clipped to the unit square, shape ``(2, count)``
    (row 0 the x coordinates, row 1 the y coordinates)."""
    return np.clip(rng.normal(0.5, 0.15, size=(2, count)), 0.0, 1.0)


def _strides(count: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Distance covered in one step at a speed ``~ U(0.1, 0.4)`` units/hour."""
    return rng.uniform(0.1, 0.4, size=count) * (TAXI_DT / 3600)


def taxi_occupancy(taxis: int, slots: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Fraction of each 30-minute slot each taxi spends in ``[0.45, 0.55]²``, ``slots × taxis``.

    Random-waypoint mobility sampled every ``TAXI_DT`` seconds (spec S2): a taxi drives in a
    straight line at ``U(0.1, 0.4)`` units/hour (drawn per leg) to its waypoint, pauses there
    ``U(0, 30)`` minutes, then heads for a fresh waypoint. The slot's fraction is the share of
    its 10-second samples (taken at each step's start) that fall inside the region."""
    steps_per_slot = round(1800 / TAXI_DT)
    lo, hi = TAXI_REGION
    px, py = _waypoints(taxis, rng)
    tx, ty = _waypoints(taxis, rng)
    stride = _strides(taxis, rng)
    pause = np.zeros(taxis)
    inside = np.zeros((slots, taxis), dtype=np.int32)
    for step in range(slots * steps_per_slot):
        inside[step // steps_per_slot] += (px >= lo) & (px <= hi) & (py >= lo) & (py <= hi)
        pausing = pause > 0
        pause -= TAXI_DT * pausing
        hx, hy = tx - px, ty - py
        distance = np.hypot(hx, hy)
        share = np.where(pausing, 0.0, np.minimum(1.0, stride / np.maximum(distance, 1e-12)))
        px += hx * share
        py += hy * share
        arrived = np.flatnonzero(~pausing & (distance <= stride))
        if arrived.size:
            px[arrived], py[arrived] = tx[arrived], ty[arrived]
            tx[arrived], ty[arrived] = _waypoints(arrived.size, rng)
            stride[arrived] = _strides(arrived.size, rng)
            pause[arrived] = rng.uniform(0.0, 1800.0, size=arrived.size)
    occupancy: NDArray[np.float64] = inside / steps_per_slot
    return occupancy


class TaxiStream(NumericStream):
    """S2, the Beijing taxi substitute: ``users`` taxis, ``slots`` half-hour slots (48 = one day;
    more slots continue the same simulation over consecutive days), domain ``[0, 1]``."""

    def __init__(self, users: int = 5000, slots: int = TAXI_SLOTS_PER_DAY, seed: int = 0) -> None:
        _check_sizes(users, slots)
        occupancy = taxi_occupancy(users, slots, np.random.default_rng([seed, 0x53320]))
        super().__init__("taxi", occupancy, (0.0, 1.0))


def numeric_dataset(name: str, users: int, slots: int, seed: int) -> NumericStream:
    """The synthetic numeric stream ``name`` (one of ``NUMERIC_DATASETS``) with ``users`` users
    (pages requested, for ``webtraffic``) over ``slots`` slots, generated from ``seed``."""
    if name == "sine":
        return SineStream(users, slots, seed)
    if name == "webtraffic":
        return WebTrafficStream(users, slots, seed)
    if name == "taxi":
        return TaxiStream(users, slots, seed)
    raise ValueError(f"unknown numeric dataset {name!r}; choose from {', '.join(NUMERIC_DATASETS)}")
