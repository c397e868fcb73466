"""Privacy guarantees as data: a measure (how loss is counted) and a scope (over what).

In the style of OpenDP's measures, a mechanism states what it costs as a value the ledgers, the
population accountant and the conformance checks can read (design §3), instead of a free-text
model name:

- measures: pure ε-DP (``PureDP``), approximate (ε, δ)-DP (``ApproxDP``), μ-Gaussian DP
  (``GaussianDP``, Dong, Roth & Su 2019) and ρ-zero-concentrated DP (``ZCDP``, Bun & Steinke
  2016), with the standard conversions between them and their composition rules;
- scopes: the w-event window (``WindowScope``), every user's own (ε_i, w_i) (``ClassScope``,
  personalized w-event DP), the whole stream (``StreamScope``), each period of a renewed budget
  (``PeriodScope``) and a user's lifetime (``LifetimeScope``).

A ``Guarantee`` pairs them with the trust model (``ldp``: each user's reports are private on
their own; ``cdp``: the curator's outputs are). Conversions are one way where the implication
is one way: pure ε implies (ε, 0) and ε²/2-zCDP; μ-GDP implies μ²/2-zCDP and the exact (ε, δ(ε))
curve; ρ-zCDP implies (ρ + 2√(ρ·ln(1/δ)), δ)-DP for every δ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Model = Literal["ldp", "cdp"]


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    bound = ">= 0" if allow_zero else "> 0"
    if not ok:
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


# -- measures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PureDP:
    """ε-differential privacy: the privacy loss is at most ε everywhere."""

    epsilon: float
    kind: ClassVar[str] = "pure"

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon, allow_zero=True)

    def to_approx(self, delta: float = 0.0) -> ApproxDP:
        return ApproxDP(self.epsilon, delta)

    def to_zcdp(self) -> ZCDP:
        """ε-DP implies (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        return ZCDP(self.epsilon**2 / 2)

    def to_dict(self) -> dict[str, Any]:
        return {"measure": self.kind, "epsilon": self.epsilon}


@dataclass(frozen=True)
class ApproxDP:
    """(ε, δ)-differential privacy."""

    epsilon: float
    delta: float
    kind: ClassVar[str] = "approx"

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon, allow_zero=True)
        if not (isinstance(self.delta, (int, float)) and 0 <= self.delta < 1):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"measure": self.kind, "epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True)
class GaussianDP:
    """μ-Gaussian differential privacy: distinguishing neighbours is no easier than telling
    N(0, 1) from N(μ, 1)."""

    mu: float
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        _positive("mu", self.mu, allow_zero=True)

    def delta(self, epsilon: float) -> float:
        """The exact δ(ε) of μ-GDP (Dong, Roth & Su 2019, Cor. 2.13):
        ``Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)``."""
        if self.mu == 0:
            return 0.0
        a, b = -epsilon / self.mu + self.mu / 2, -epsilon / self.mu - self.mu / 2
        # e^ε·Φ(b) in log space (e^ε alone overflows past ε ≈ 709); where Φ(b) underflows the
        # term is dropped, which can only overstate δ (a conservative account)
        tail = _normal_cdf(b)
        second = math.exp(epsilon + math.log(tail)) if tail > 0 else 0.0
        return max(0.0, _normal_cdf(a) - second)

    def epsilon(self, delta: float) -> float:
        """The smallest ε with ``δ(ε) ≤ delta`` (bisection; δ(ε) decreases in ε)."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        if self.delta(0.0) <= delta:
            return 0.0
        low, high = 0.0, 1.0
        while self.delta(high) > delta:
            low, high = high, high * 2
        for _ in range(200):
            mid = (low + high) / 2
            low, high = (mid, high) if self.delta(mid) > delta else (low, mid)
        return high

    def to_approx(self, delta: float) -> ApproxDP:
        return ApproxDP(self.epsilon(delta), delta)

    def to_zcdp(self) -> ZCDP:
        """μ-GDP implies (μ²/2)-zCDP (both are the Gaussian mechanism's exact profile)."""
        return ZCDP(self.mu**2 / 2)

    def to_dict(self) -> dict[str, Any]:
        return {"measure": self.kind, "mu": self.mu}


@dataclass(frozen=True)
class ZCDP:
    """ρ-zero-concentrated differential privacy."""

    rho: float
    kind: ClassVar[str] = "zcdp"

    def __post_init__(self) -> None:
        _positive("rho", self.rho, allow_zero=True)

    def to_approx(self, delta: float) -> ApproxDP:
        """ρ-zCDP implies (ρ + 2√(ρ·ln(1/δ)), δ)-DP (Bun & Steinke 2016, Prop. 1.3)."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        return ApproxDP(self.rho + 2 * math.sqrt(self.rho * math.log(1 / delta)), delta)

    def to_dict(self) -> dict[str, Any]:
        return {"measure": self.kind, "rho": self.rho}


Measure = PureDP | ApproxDP | GaussianDP | ZCDP


def compose(measures: list[Measure]) -> Measure:
    """Sequential composition of measures of one kind: ε and (ε, δ) add (basic composition),
    μ adds in squares (GDP is exactly closed under composition), ρ adds."""
    if not measures:
        raise ValueError("nothing to compose")
    kinds = {m.kind for m in measures}
    if len(kinds) > 1:
        raise ValueError(f"cannot compose measures of kinds {sorted(kinds)}: convert them first")
    first = measures[0]
    if isinstance(first, PureDP):
        return PureDP(sum(m.epsilon for m in measures if isinstance(m, PureDP)))
    if isinstance(first, ApproxDP):
        approx = [m for m in measures if isinstance(m, ApproxDP)]
        return ApproxDP(sum(m.epsilon for m in approx), min(sum(m.delta for m in approx), 1.0))
    if isinstance(first, GaussianDP):
        return GaussianDP(math.sqrt(sum(m.mu**2 for m in measures if isinstance(m, GaussianDP))))
    return ZCDP(sum(m.rho for m in measures if isinstance(m, ZCDP)))


def budget_of(measure: Measure) -> float:
    """The one number the ledgers and the accountant add up for a measure: ε (pure and the ε of
    (ε, δ)), μ² (Gaussian DP composes in squares) or ρ (zCDP); a family's own measure
    declares its additive number as ``budget``."""
    if isinstance(measure, (PureDP, ApproxDP)):
        return measure.epsilon
    if isinstance(measure, GaussianDP):
        return measure.mu**2
    if isinstance(measure, ZCDP):
        return measure.rho
    return float(measure.budget)


# -- scopes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Windowed:
    window: int
    kind: ClassVar[str]

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.kind, "window": self.window}


@dataclass(frozen=True)
class WindowScope(_Windowed):
    """w-event privacy: the guarantee holds over any ``window`` consecutive slots."""

    kind: ClassVar[str] = "window"


@dataclass(frozen=True)
class ClassScope(_Windowed):
    """Personalized w-event privacy: user ``i`` gets their own (ε_i, w_i); the measure's budget
    and ``window`` are the stream default of users who stated none."""

    kind: ClassVar[str] = "class"


@dataclass(frozen=True)
class StreamScope:
    """The guarantee covers the whole stream (every slot the user ever takes part in)."""

    kind: ClassVar[str] = "stream"

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.kind}


@dataclass(frozen=True)
class PeriodScope:
    """The budget renews every ``length`` slots; the guarantee holds within each period."""

    length: int
    kind: ClassVar[str] = "period"

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.kind, "length": self.length}


@dataclass(frozen=True)
class LifetimeScope:
    """The guarantee covers everything a user reports over their lifetime in the stream."""

    kind: ClassVar[str] = "lifetime"

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.kind}


Scope = WindowScope | ClassScope | StreamScope | PeriodScope | LifetimeScope


@dataclass(frozen=True)
class Guarantee:
    """What a mechanism promises every user: ``measure`` over ``scope`` under ``model``."""

    measure: Measure
    scope: Scope
    model: Model

    def __post_init__(self) -> None:
        if self.model not in ("ldp", "cdp"):
            raise ValueError(f"model must be 'ldp' or 'cdp', got {self.model!r}")

    @property
    def budget(self) -> float:
        """The measure's additive budget (``budget_of``)."""
        return budget_of(self.measure)

    @property
    def window(self) -> int | None:
        """The window of a w-event or per-class scope (None for the others)."""
        return self.scope.window if isinstance(self.scope, (WindowScope, ClassScope)) else None

    def scaled(self, share: float) -> Guarantee:
        """The guarantee of a mechanism given the share ``s`` of this budget."""
        m = self.measure
        scaled: Measure
        if isinstance(m, PureDP):
            scaled = PureDP(m.epsilon * share)
        elif isinstance(m, ApproxDP):
            scaled = ApproxDP(m.epsilon * share, m.delta * share)
        elif isinstance(m, GaussianDP):
            scaled = GaussianDP(m.mu * math.sqrt(share))
        elif isinstance(m, ZCDP):
            scaled = ZCDP(m.rho * share)
        else:  # a family's own measure scales itself
            scaled = m.scaled(share)
        return Guarantee(scaled, self.scope, self.model)

    def to_dict(self) -> dict[str, Any]:
        return {**self.measure.to_dict(), **self.scope.to_dict(), "model": self.model}
