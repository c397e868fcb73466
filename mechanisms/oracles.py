"""Frequency oracles GRR, OUE, OLH and the adaptive choice Ada (spec ldp-ids §2.1–§2.6).

Every oracle is ε-LDP for one report: a user's report distribution changes by at most a factor
e^ε when their value changes. An oracle offers two equivalent ways to produce the server-side
support counts ``c'[k]`` for ``m`` users:

* the **per-user path** ``perturb`` + ``support``: each user's report is materialised, exactly as
  a device would send it;
* the **aggregate fast path** ``sample_support``: the support counts are drawn directly from
  their exact joint distribution given the users' true value counts (multinomials for GRR,
  binomials for OUE). ``None`` means the oracle has no exact fast path (OLH).

``estimate`` turns support counts into the unbiased frequency vector and ``variance`` is the
d-averaged variance ``V(ε, m)`` of spec §2.4 (with the 1/d correction of erratum A2), the single
function all publication decisions use.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

OLH_PRIME: Final = (1 << 31) - 1  # universal hashing modulus for OLH


def _check_budget(eps: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"report budget ε must be a positive finite number, got {eps!r}")


class Oracle(ABC):
    """An ε-LDP local randomiser (the user side) together with its unbiased estimator."""

    name: str
    d: int
    exact_aggregate: ClassVar[bool] = False
    """``sample_support`` draws the support counts from the true counts alone (no per-user
    path needed)."""

    @abstractmethod
    def variance(self, eps: float, m: int) -> float:
        """d-averaged variance ``V(ε, m)`` of the estimate from ``m`` reports (spec §2.4)."""

    @abstractmethod
    def report_bits(self, eps: float) -> int:
        """Bits a user sends for one report (spec §5.3.4)."""

    @abstractmethod
    def perturb(self, values: NDArray[Any], eps: float, rng: np.random.Generator) -> Any:
        """Per-user path: each user's randomised report of its value."""

    @abstractmethod
    def support(self, reports: Any, eps: float) -> NDArray[np.float64]:
        """Support counts ``c'[k]``: how many reports support each value."""

    def sample_support(
        self, true_counts: NDArray[np.int64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.float64] | None:
        """Aggregate fast path: support counts drawn from their exact distribution, or None."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(d={self.d})"

    @abstractmethod
    def estimate(self, support: NDArray[np.float64], eps: float, m: int) -> NDArray[np.float64]:
        """Unbiased estimate of the users' statistic from the support of ``m`` reports."""


class FrequencyOracle(Oracle):
    """An ε-LDP randomiser over the categorical domain ``{0, …, d−1}`` and its estimator."""

    def __init__(self, d: int) -> None:
        if d < 2:
            raise ValueError(f"a frequency oracle needs a domain of d >= 2 values, got d={d}")
        self.d = d

    @abstractmethod
    def pq(self, eps: float) -> tuple[float, float]:
        """Probabilities ``(p, q)`` that a report supports the true value / another value."""

    @abstractmethod
    def gap(self, eps: float) -> float:
        """``p − q``, computed with ``expm1`` so it stays positive for tiny ε."""

    def estimate(self, support: NDArray[np.float64], eps: float, m: int) -> NDArray[np.float64]:
        """Unbiased frequencies ``c̄[k] = (c'[k]/m − q)/(p − q)``; zeros when ``m = 0``."""
        if m == 0:
            return np.zeros(self.d)
        _, q = self.pq(eps)
        return (np.asarray(support, dtype=np.float64) / m - q) / self.gap(eps)


class GRR(FrequencyOracle):
    """Generalised randomised response (spec §2.1): keep the value w.p. ``p = e^ε/(e^ε+d−1)``."""

    name = "GRR"
    exact_aggregate = True

    def pq(self, eps: float) -> tuple[float, float]:
        _check_budget(eps)
        e = math.exp(eps)
        return e / (e + self.d - 1), 1.0 / (e + self.d - 1)

    def gap(self, eps: float) -> float:
        return math.expm1(eps) / (math.exp(eps) + self.d - 1)

    def variance(self, eps: float, m: int) -> float:
        em1, d = math.expm1(eps), self.d
        if m <= 0 or em1**2 == 0:
            return math.inf
        return (d - 1 + em1) / (m * em1**2) + (d - 2) / (d * m * em1)

    def report_bits(self, eps: float) -> int:
        return math.ceil(math.log2(self.d))

    def perturb(
        self, values: NDArray[np.int64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.int64]:
        p, _ = self.pq(eps)
        values = np.asarray(values, dtype=np.int64)
        keep = rng.random(values.shape[0]) < p
        # A uniform *other* value: shift by 1..d-1 modulo d.
        other = (values + rng.integers(1, self.d, size=values.shape[0])) % self.d
        return np.where(keep, values, other)

    def support(self, reports: NDArray[np.int64], eps: float) -> NDArray[np.float64]:
        return np.bincount(reports, minlength=self.d).astype(np.float64)

    def sample_support(
        self, true_counts: NDArray[np.int64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.float64]:
        p, _ = self.pq(eps)
        counts = np.asarray(true_counts, dtype=np.int64)
        kept = rng.binomial(counts, p)
        out = kept.astype(np.float64)
        others = np.full(self.d - 1, 1.0 / (self.d - 1))
        for k in np.flatnonzero(counts - kept):
            moved = rng.multinomial(int(counts[k] - kept[k]), others)
            out[np.arange(self.d) != k] += moved
        return out


class OUE(FrequencyOracle):
    """Optimised unary encoding (spec §2.2, erratum A3): 1-bits stay w.p. 1/2, 0-bits flip
    w.p. ``q = 1/(e^ε+1)``."""

    name = "OUE"
    exact_aggregate = True

    def pq(self, eps: float) -> tuple[float, float]:
        _check_budget(eps)
        return 0.5, 1.0 / (math.exp(eps) + 1.0)

    def gap(self, eps: float) -> float:
        return math.expm1(eps) / (2 * (math.exp(eps) + 1))

    def variance(self, eps: float, m: int) -> float:
        em1 = math.expm1(eps)
        if m <= 0 or em1**2 == 0:
            return math.inf
        return 4 * (em1 + 1) / (m * em1**2) + 1 / (self.d * m)

    def report_bits(self, eps: float) -> int:
        return self.d

    def perturb(
        self, values: NDArray[np.int64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.bool_]:
        p, q = self.pq(eps)
        values = np.asarray(values, dtype=np.int64)
        bits = rng.random((values.shape[0], self.d)) < q
        rows = np.arange(values.shape[0])
        bits[rows, values] = rng.random(values.shape[0]) < p
        return bits

    def support(self, reports: NDArray[np.bool_], eps: float) -> NDArray[np.float64]:
        return np.asarray(np.asarray(reports, dtype=np.int64).sum(axis=0), dtype=np.float64)

    def sample_support(
        self,
        true_counts: NDArray[np.int64],
        eps: float,
        rng: np.random.Generator,
        reports: int | None = None,
    ) -> NDArray[np.float64]:
        """Support counts of ``reports`` OUE reports (default: one per counted value); the
        reporters beyond ``true_counts.sum()`` hold no item and set each bit with ``q``."""
        p, q = self.pq(eps)
        counts = np.asarray(true_counts, dtype=np.int64)
        m = int(counts.sum()) if reports is None else reports
        if m < int(counts.sum()):
            raise ValueError(f"{m} reports cannot carry {int(counts.sum())} values")
        return np.asarray(rng.binomial(counts, p) + rng.binomial(m - counts, q), dtype=np.float64)


class OLH(FrequencyOracle):
    """Optimised local hashing (spec §2.6; optional, never used in paper reproductions).

    Each user draws a hash ``H(v) = ((a·v + b) mod P) mod g`` with ``g = round(e^ε + 1)`` and
    runs GRR over ``[g]``. There is no exact aggregate fast path, so only the per-user path exists.
    """

    name = "OLH"

    def g(self, eps: float) -> int:
        return max(2, round(math.exp(eps) + 1))

    def pq(self, eps: float) -> tuple[float, float]:
        _check_budget(eps)
        e, g = math.exp(eps), self.g(eps)
        return e / (e + g - 1), 1.0 / g

    def gap(self, eps: float) -> float:
        g = self.g(eps)
        return math.expm1(eps) * (g - 1) / (g * (math.exp(eps) + g - 1))

    def variance(self, eps: float, m: int) -> float:
        em1 = math.expm1(eps)
        if m <= 0 or em1**2 == 0:
            return math.inf
        return 4 * (em1 + 1) / (m * em1**2)

    def report_bits(self, eps: float) -> int:
        return math.ceil(math.log2(self.g(eps))) + 64  # hashed value plus the hash seed (a, b)

    def perturb(
        self, values: NDArray[np.int64], eps: float, rng: np.random.Generator
    ) -> NDArray[np.int64]:
        g = self.g(eps)
        p = math.exp(eps) / (math.exp(eps) + g - 1)
        values = np.asarray(values, dtype=np.int64)
        size = values.shape[0]
        a = rng.integers(1, OLH_PRIME, size=size)
        b = rng.integers(0, OLH_PRIME, size=size)
        hashed = ((a * values + b) % OLH_PRIME) % g
        keep = rng.random(size) < p
        y = np.where(keep, hashed, (hashed + rng.integers(1, g, size=size)) % g)
        return np.stack([a, b, y], axis=1)

    def support(self, reports: NDArray[np.int64], eps: float) -> NDArray[np.float64]:
        g = self.g(eps)
        a, b, y = reports[:, 0], reports[:, 1], reports[:, 2]
        out = np.empty(self.d)
        for k in range(self.d):
            out[k] = np.count_nonzero(((a * k + b) % OLH_PRIME) % g == y)
        return out


def ada_threshold(eps: float) -> float:
    """``d* = 3e^ε + 2``: Ada uses GRR below it and OUE at or above it (spec §2.3)."""
    return 3 * math.exp(eps) + 2
