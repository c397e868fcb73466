"""Device-side local randomisers GRR, OUE, OLH (spec ldp-ids §2.1, §2.2, §2.6) and HM (§2.7).

Each function is the user side of the server's oracle of the same name in
``privstream.mechanisms.oracles`` / ``privstream.mechanisms.mean``: same parameters ``(ε, d)``,
same report format (what the server's ``support`` consumes for one user), same distribution,
so each report is ε-LDP. The standard library only.

Randomness comes from a :class:`Randomness` with two integer primitives, ``randbelow(n)`` and
``bits(k)``; a uniform in ``[0, 1)`` is always ``bits(53) / 2**53`` (:func:`uniform`) and a coin
of probability ``p`` is ``uniform() < p``. A port to another language that replays the same
integer draws therefore produces the same reports (tests/client/vectors/README.md). Production
uses :class:`SystemRandomness`, the operating system's CSPRNG: nothing a server sends seeds it.
"""

from __future__ import annotations

import math
import random
import secrets
from dataclasses import dataclass, field
from typing import Final, Protocol

OLH_PRIME: Final = (1 << 31) - 1  # universal hashing modulus of OLH (as the server's)
HM_SWITCH: Final = 0.61  # HM uses SR only at or below this ε (spec §2.7)
UNIFORM_BITS: Final = 53
ORACLES: Final = frozenset({"GRR", "OUE", "OLH", "HM"})

Payload = int | tuple[int, ...] | float


class Randomness(Protocol):
    """The randomness a randomiser consumes: integer draws only."""

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``{0, …, n−1}`` (``n ≥ 1``)."""
        ...

    def bits(self, k: int) -> int:
        """A uniform integer in ``{0, …, 2^k − 1}``."""
        ...


class SystemRandomness:
    """The operating system's CSPRNG (``secrets.SystemRandom``): the production default."""

    def __init__(self) -> None:
        self._rng = secrets.SystemRandom()

    def randbelow(self, n: int) -> int:
        return self._rng.randrange(n)

    def bits(self, k: int) -> int:
        return self._rng.getrandbits(k)


class SeededRandomness:
    """A ``Randomness`` from Python's ``random.Random(seed)``: reproducible simulations and tests
    only (simulated fleets, ``experiments.reports_loop``), never a device: a real device uses
    :class:`SystemRandomness`."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._rng.randrange(n)

    def bits(self, k: int) -> int:
        return self._rng.getrandbits(k)


Draw = tuple[str, int, int]  # (op "randbelow" | "bits", argument n or k, value drawn)


@dataclass
class RecordingRandomness:
    """Wraps a source and records every draw (for test vectors)."""

    inner: Randomness
    draws: list[Draw] = field(default_factory=list)

    def randbelow(self, n: int) -> int:
        value = self.inner.randbelow(n)
        self.draws.append(("randbelow", n, value))
        return value

    def bits(self, k: int) -> int:
        value = self.inner.bits(k)
        self.draws.append(("bits", k, value))
        return value


class ReplayRandomness:
    """Replays recorded draws; raises if the randomiser asks for another draw than recorded."""

    def __init__(self, draws: list[Draw]) -> None:
        self._draws = list(draws)
        self._next = 0

    def _take(self, op: str, arg: int) -> int:
        if self._next >= len(self._draws):
            raise ValueError(f"replay exhausted: {op}({arg}) asked after {self._next} draws")
        want = self._draws[self._next]
        if (want[0], want[1]) != (op, arg):
            raise ValueError(f"draw {self._next}: {op}({arg}) asked, {want[0]}({want[1]}) recorded")
        self._next += 1
        return want[2]

    def randbelow(self, n: int) -> int:
        return self._take("randbelow", n)

    def bits(self, k: int) -> int:
        return self._take("bits", k)

    @property
    def exhausted(self) -> bool:
        """Whether every recorded draw was consumed."""
        return self._next == len(self._draws)


def uniform(rng: Randomness) -> float:
    """A uniform float in ``[0, 1)`` with 53 random bits (exactly representable)."""
    return rng.bits(UNIFORM_BITS) / (1 << UNIFORM_BITS)


def _check(eps: float, d: int) -> None:
    if not (isinstance(eps, float | int) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"report budget ε must be a positive finite number, got {eps!r}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"a frequency oracle needs a domain of d >= 2 values, got d={d}")


def _category(value: object, d: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < d:
        raise ValueError(
            f"a frequency oracle's value must be an integer in [0, {d}), got a {type(value).__name__}"
        )
    return value


def grr_pq(eps: float, d: int) -> tuple[float, float]:
    """GRR's ``(p, q) = (e^ε/(e^ε+d−1), 1/(e^ε+d−1))``."""
    e = math.exp(eps)
    return e / (e + d - 1), 1.0 / (e + d - 1)


def grr(value: int, eps: float, d: int, rng: Randomness) -> int:
    """GRR: keep ``value`` w.p. ``p``, else a uniform other value ``(value + 1 + U[d−1]) mod d``."""
    _check(eps, d)
    v = _category(value, d)
    p, _ = grr_pq(eps, d)
    if uniform(rng) < p:
        return v
    return (v + 1 + rng.randbelow(d - 1)) % d


def oue_q(eps: float) -> float:
    """OUE's ``q = 1/(e^ε + 1)`` (its ``p`` is 1/2)."""
    return 1.0 / (math.exp(eps) + 1.0)


def oue(value: int, eps: float, d: int, rng: Randomness) -> tuple[int, ...]:
    """OUE: bit ``k`` is 1 w.p. 1/2 (one fair bit) if ``k = value``, else w.p. ``q``."""
    _check(eps, d)
    v = _category(value, d)
    q = oue_q(eps)
    return tuple(rng.bits(1) if k == v else int(uniform(rng) < q) for k in range(d))


def olh_g(eps: float) -> int:
    """OLH's hash range ``g = max(2, round(e^ε + 1))`` (round half to even, as the server's)."""
    return max(2, round(math.exp(eps) + 1))


def olh_hash(a: int, b: int, v: int, g: int) -> int:
    """``H(v) = ((a·v + b) mod P) mod g`` with ``P = 2^31 − 1``."""
    return ((a * v + b) % OLH_PRIME) % g


def olh(value: int, eps: float, d: int, rng: Randomness) -> tuple[int, int, int]:
    """OLH: draw ``a ∈ [1, P)``, ``b ∈ [0, P)``, then GRR over ``[g]`` of ``H(value)``; report
    ``(a, b, y)``."""
    _check(eps, d)
    v = _category(value, d)
    g = olh_g(eps)
    a = 1 + rng.randbelow(OLH_PRIME - 1)
    b = rng.randbelow(OLH_PRIME)
    hashed = olh_hash(a, b, v, g)
    p = math.exp(eps) / (math.exp(eps) + g - 1)
    if uniform(rng) < p:
        return a, b, hashed
    return a, b, (hashed + 1 + rng.randbelow(g - 1)) % g


def sr(x: float, eps: float, rng: Randomness) -> float:
    """SR: ``±C_s``, ``C_s = (e^ε+1)/(e^ε−1)``, with ``Pr[+C_s] = 1/2 + x/(2C_s)``."""
    cs = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    return cs if uniform(rng) < 0.5 + x / (2 * cs) else -cs


def pm(x: float, eps: float, rng: Randomness) -> float:
    """PM: uniform on ``[ℓ(x), r(x)]`` w.p. ``e^{ε/2}/(e^{ε/2}+1)``, else uniform on the rest of
    ``[−C, C]``; two uniforms drawn in that order (the coin, then the position)."""
    h = math.exp(eps / 2)
    c = (h + 1) / (h - 1)
    left = x * (c + 1) / 2 - (c - 1) / 2
    right = left + c - 1
    inside = uniform(rng) < h / (h + 1)
    u = uniform(rng)
    if inside:
        return left + u * (c - 1)
    v = u * (c + 1)
    left_len = left + c
    return -c + v if v < left_len else right + (v - left_len)


def hm(value: float, eps: float, rng: Randomness) -> float:
    """HM on ``[−1, 1]`` (the value is clipped): SR only when ε ≤ 0.61; else one coin
    ``uniform() < 1 − e^{−ε/2}`` picks PM, otherwise SR."""
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"report budget ε must be a positive finite number, got {eps!r}")
    if isinstance(value, bool) or not isinstance(value, float | int) or not math.isfinite(value):
        raise ValueError("HM's value must be a finite number")
    x = min(1.0, max(-1.0, float(value)))
    if eps <= HM_SWITCH:
        return sr(x, eps, rng)
    if uniform(rng) < 1 - math.exp(-eps / 2):
        return pm(x, eps, rng)
    return sr(x, eps, rng)


def randomize(oracle: str, value: object, eps: float, d: int, rng: Randomness) -> Payload:
    """One ε-LDP report of ``value`` by ``oracle`` (``d`` is ignored by HM); a value outside the
    oracle's domain is a ``ValueError`` that never names the value."""
    if oracle == "HM":
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise ValueError("HM's value must be a finite number")
        return hm(value, eps, rng)
    if oracle not in ORACLES:
        raise ValueError(f"unknown oracle {oracle!r}: the device knows {sorted(ORACLES)}")
    _check(eps, d)
    v = _category(value, d)
    if oracle == "GRR":
        return grr(v, eps, d, rng)
    return oue(v, eps, d, rng) if oracle == "OUE" else olh(v, eps, d, rng)
