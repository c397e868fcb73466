"""Estimation tasks: what a stream's values are and which randomiser reports them.

A task hides the difference between the categorical task (histogram over ``d`` values, oracle
chosen by Ada, spec §2.3) and the numeric task (mean of values clipped to ``[lower, upper]``,
reported with HM in ``[−1, 1]``, spec §2.7 and §3.11) from the mechanisms: they ask only for
``select(ε)``, ``variance(ε, m)`` and ``report_bits(ε)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.mean import HM, HmVariance
from privstream.mechanisms.oracles import GRR, OLH, OUE, FrequencyOracle, Oracle, ada_threshold

OracleChoice = Literal["ada", "grr", "oue", "olh"]


class EstimationTask(ABC):
    """The statistic a mechanism releases each slot and how users report it."""

    d: int
    kind: str

    @abstractmethod
    def select(self, eps: float) -> Oracle:
        """The randomiser every report made with budget ``ε`` uses."""

    @property
    def counts_suffice(self) -> bool:
        """The aggregate of every report can be drawn from the true counts per bin alone, so
        the simulated devices need no user's value (``mechanisms.client.CountedClients``)."""
        return False

    def variance(self, eps: float, m: int) -> float:
        """d-averaged variance of one estimate from ``m`` reports, in release units."""
        return self.select(eps).variance(eps, m) * self.scale**2

    def report_bits(self, eps: float) -> int:
        return self.select(eps).report_bits(eps)

    @property
    def scale(self) -> float:
        """Factor from oracle units to release units (1 for frequencies)."""
        return 1.0

    @property
    def value_shape(self) -> int:
        """The shape of one event's value: 0 for one number, ``d`` for a list of ``d`` numbers
        (vector tasks). The parser judges every event's value against it on its own."""
        return self.d if self.kind == "vector" else 0

    @abstractmethod
    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        """Which raw values belong to the task's domain."""

    @abstractmethod
    def encode(self, values: NDArray[Any]) -> NDArray[np.float64] | NDArray[np.int64]:
        """Client side: raw values to the randomiser's input."""

    def decode(self, estimate: NDArray[np.float64]) -> NDArray[np.float64]:
        """Server side: an oracle estimate to release units."""
        return estimate


@dataclass(frozen=True)
class FrequencyTask(EstimationTask):
    """Histogram over ``{0, …, d−1}`` (spec §2). ``oracle="ada"`` is the paper's default."""

    d: int
    oracle: OracleChoice = "ada"
    kind: str = "frequency"

    def __post_init__(self) -> None:
        if not isinstance(self.d, int) or self.d < 2:
            raise ValueError(f"d (domain size) must be an integer >= 2, got {self.d!r}")
        if self.oracle not in ("ada", "grr", "oue", "olh"):
            raise ValueError(f"oracle must be one of ada, grr, oue, olh; got {self.oracle!r}")
        object.__setattr__(
            self, "_oracles", {"grr": GRR(self.d), "oue": OUE(self.d), "olh": OLH(self.d)}
        )

    def select(self, eps: float) -> FrequencyOracle:
        oracles: dict[str, FrequencyOracle] = getattr(self, "_oracles")  # noqa: B009
        if self.oracle == "ada":
            return oracles["grr"] if self.d < ada_threshold(eps) else oracles["oue"]
        return oracles[self.oracle]

    @property
    def counts_suffice(self) -> bool:
        """Every oracle this task may pick draws its reports' aggregate from the true counts of
        the reported values alone (GRR, OUE; not OLH)."""
        oracles: dict[str, FrequencyOracle] = getattr(self, "_oracles")  # noqa: B009
        picks = ("grr", "oue") if self.oracle == "ada" else (self.oracle,)
        return all(oracles[name].exact_aggregate for name in picks)

    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        v = np.asarray(values, dtype=np.float64)
        return np.asarray(np.isfinite(v) & (v == np.floor(v)) & (v >= 0) & (v < self.d), dtype=bool)

    def encode(self, values: NDArray[Any]) -> NDArray[np.int64]:
        return np.asarray(values, dtype=np.int64)


@dataclass(frozen=True)
class MeanTask(EstimationTask):
    """Mean of values clipped to ``[lower, upper]`` (spec §2.7, A13), reported with HM."""

    lower: float
    upper: float
    hm_variance: HmVariance = "exact"
    d: int = 1
    kind: str = "mean"

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.lower) and math.isfinite(self.upper) and self.upper > self.lower
        ):
            raise ValueError(
                f"mean task needs finite lower < upper, got [{self.lower}, {self.upper}]"
            )
        object.__setattr__(self, "_hm", HM(self.hm_variance))

    def select(self, eps: float) -> HM:
        hm: HM = getattr(self, "_hm")  # noqa: B009
        return hm

    @property
    def scale(self) -> float:
        return (self.upper - self.lower) / 2

    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        return np.asarray(np.isfinite(np.asarray(values, dtype=np.float64)), dtype=bool)

    def encode(self, values: NDArray[Any]) -> NDArray[np.float64]:
        clipped = np.clip(np.asarray(values, dtype=np.float64), self.lower, self.upper)
        return 2 * (clipped - self.lower) / (self.upper - self.lower) - 1

    def decode(self, estimate: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.lower + (np.asarray(estimate) + 1) * self.scale


@dataclass(frozen=True)
class BallTask(EstimationTask):
    """Mean of ``d``-dimensional values in the L2 ball of ``radius`` around ``center`` (spec cgm
    §0 normalisation, §4.7 multi-dimensional items): the domain's diameter is ``2·radius``.
    Reported through a mechanism's own client protocol (CGM), not a frequency oracle."""

    center: tuple[float, ...]
    radius: float
    d: int = 0
    kind: str = "vector"

    def __post_init__(self) -> None:
        center = tuple(float(c) for c in self.center)
        if not center or not all(math.isfinite(c) for c in center):
            raise ValueError(f"center must be a non-empty finite vector, got {self.center!r}")
        if not (
            isinstance(self.radius, (int, float)) and math.isfinite(self.radius) and self.radius > 0
        ):
            raise ValueError(f"radius must be a finite number > 0, got {self.radius!r}")
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "d", len(center))

    def select(self, eps: float) -> Oracle:
        raise ValueError("a ball task is reported through the CGM protocol, not an LDP oracle")

    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        rows = np.asarray(values, dtype=np.float64).reshape(-1, self.d)
        return np.asarray(np.isfinite(rows).all(axis=1), dtype=bool)

    def encode(self, values: NDArray[Any]) -> NDArray[np.float64]:
        return np.asarray(values, dtype=np.float64)
