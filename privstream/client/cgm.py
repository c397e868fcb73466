"""CGM's device side: one step of a user's noise chain (spec cgm §4.3–§4.7), standard library only.

The device keeps, per stream and lag phase, its chain ``(steps, v, x'_{i−1}, x*_{i−1}, slot)``
(secret: it reveals the clipped value) and answers a request's public step (``σ̃₁``, the grid,
``C``, the lag, the domain) with ``x*_i = g·(R(T_i/g) + Z) + r_i·x*_{i−1}``, ``T_i = x'_i −
r_i·x'_{i−1}``: range (or ball) clip, the differential clip to ``C`` around the previous clipped
value, the schedule ``r_i, V_i, v_i`` from the chain's ``v_{i−1}``, unbiased random rounding to
the public grid ``g = D/K`` and exact discrete Gaussian noise of variance ``s(s+1)`` steps²,
``s = ⌈(V_i·K + 2√d)·σ̃₁⌉``. It is the device side of the server's simulated
``privstream.mechanisms.cgm.CgmProtocol``: same arithmetic, same distribution
(tests/client/test_cgm_device.py). Each report is a Gaussian mechanism of ratio ``1/σ̃₁`` on its
normalised surrogate, so a stream's reports compose as ``μ² = Σ 1/σ̃₁²`` (spec §4.5, §8.4).

The discrete Gaussian is Canonne, Kamath & Steinke (2020) Alg. 1–3 in integers and fractions only,
drawing ``randbelow`` from a :class:`~privstream.client.randomizers.Randomness` (the draw order
is in tests/client/vectors/README.md); no float enters the sampling path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from privstream.client.ledger import GaussianLedger, GaussianPolicy, Refusal, Slotted
from privstream.client.randomizers import Randomness, SystemRandomness, uniform
from privstream.client.store import FileStore, StoreError

LEVELS = 128  # gap-aware noise levels: powers of 2^(1/128), as the server's
SAMPLER_LIMIT = 2**20  # largest noise std in grid steps (the server's exact sampler's range)


# -- the exact discrete Gaussian (CKS 2020), integers only -------------------------------------


def bernoulli_exp_le1(num: int, den: int, rng: Randomness) -> bool:
    """``Bernoulli(exp(−num/den))`` for ``0 ≤ num ≤ den`` (CKS Alg. 1): ``k = 1, 2, …`` draw
    ``A = [randbelow(den·k) < num]`` (no draw when ``num = den·k``, surely 1) and stop at the
    first ``A = 0`` with ``[k odd]``. ``num = 0`` returns True without a draw."""
    k = 1
    while num:
        if not (num == den * k or rng.randbelow(den * k) < num):
            return k % 2 == 1
        k += 1
    return True


def bernoulli_exp(num: int, den: int, rng: Randomness) -> bool:
    """``Bernoulli(exp(−γ))``, ``γ = num/den ≥ 0``: ``⌊γ⌋`` draws of ``Bernoulli(e^{−1})`` must
    all succeed, then one of ``Bernoulli(exp(−(γ − ⌊γ⌋)))``."""
    whole, frac = divmod(num, den)
    for _ in range(whole):
        if not bernoulli_exp_le1(1, 1, rng):
            return False
    return bernoulli_exp_le1(frac, den, rng)


def discrete_laplace(t: int, rng: Randomness) -> int:
    """One draw of ``P(x) ∝ e^{−|x|/t}`` on ℤ for an integer scale ``t ≥ 1`` (CKS Alg. 2):
    ``U = randbelow(t)`` kept w.p. ``e^{−U/t}``, ``V`` the successes of ``Bernoulli(e^{−1})``
    before the first failure, ``Y = U + t·V``, a sign ``randbelow(2)``; "−0" is rejected."""
    while True:
        u = rng.randbelow(t)
        if not bernoulli_exp_le1(u, t, rng):
            continue
        v = 0
        while bernoulli_exp_le1(1, 1, rng):
            v += 1
        y, negative = u + t * v, rng.randbelow(2) == 1
        if not (negative and y == 0):
            return -y if negative else y


def discrete_gaussian(p: int, q: int, rng: Randomness) -> int:
    """One draw of ``P(x) ∝ exp(−x²/(2σ²))`` on ℤ for the rational ``σ² = p/q`` (CKS Alg. 3):
    ``Y ~ DLap(t)``, ``t = ⌊σ⌋ + 1``, accepted w.p. ``exp(−(|Y|·q·t − p)²/(2·p·q·t²))``."""
    if p < 1 or q < 1:
        raise ValueError(f"σ² must be a positive fraction, got {p}/{q}")
    t = math.isqrt(p // q) + 1
    den = 2 * p * q * t * t
    while True:
        y = discrete_laplace(t, rng)
        if bernoulli_exp((abs(y) * q * t - p) ** 2, den, rng):
            return y


# -- the public step and the device's chain -----------------------------------------------------


class CgmParams(Protocol):
    """The public parameters of one step (= privstream.schema.protocol.CgmStep)."""

    @property
    def sigma1(self) -> float: ...
    @property
    def grid_bits(self) -> int: ...
    @property
    def lag(self) -> int: ...
    @property
    def bound(self) -> float: ...
    @property
    def reuse(self) -> bool: ...
    @property
    def gap_aware(self) -> bool: ...
    @property
    def lower(self) -> float | None: ...
    @property
    def upper(self) -> float | None: ...
    @property
    def center(self) -> tuple[float, ...] | None: ...
    @property
    def radius(self) -> float | None: ...


@dataclass
class Chain:
    """One lag phase of a stream: reports made, ``v`` of the last one, the last clipped value
    ``x'`` and report ``x*``, and the slot of the last report (−1: none)."""

    steps: int = 0
    v: float = 1.0
    clipped: list[float] = field(default_factory=list)
    reported: list[float] = field(default_factory=list)
    last_slot: int = -1

    def to_state(self) -> dict[str, Any]:
        return {"steps": self.steps, "v": self.v, "clipped": self.clipped,
                "reported": self.reported, "last_slot": self.last_slot}  # fmt: skip

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> Chain:
        """Rebuild from :meth:`to_state`; ``ValueError`` on a malformed field."""
        chain = cls(int(s["steps"]), float(s["v"]), [float(x) for x in s["clipped"]],
                    [float(x) for x in s["reported"]], int(s["last_slot"]))  # fmt: skip
        values = [chain.v, *chain.clipped, *chain.reported]
        if chain.steps < 0 or not 0 < chain.v <= 1 or not all(map(math.isfinite, values)):
            raise ValueError("malformed CGM chain")
        return chain


def diameter(step: CgmParams) -> float:
    """``D``: ``upper − lower``, or ``2R`` for a ball."""
    if step.radius is not None:
        return 2.0 * float(step.radius)
    return float(step.upper) - float(step.lower)  # type: ignore[arg-type]


def grid_steps(sigma1: float, grid_bits: int, d: int) -> float:
    """``K = 2^grid_bits`` unless the noise std in steps could pass ``2^20``: the largest power
    of two that keeps it there (= the server's ``mechanisms.cgm.grid_steps``)."""
    room = SAMPLER_LIMIT / sigma1 - 2 * math.sqrt(d)
    if room <= 0:
        raise ValueError(f"σ̃₁ = {sigma1:.6g} is too large for the exact Gaussian sampler")
    return 2.0 ** min(grid_bits, math.floor(math.log2(room)))


def _pull_within(x: list[float], anchor: list[float], radius: float) -> list[float]:
    """``x`` moved onto the L2 sphere of ``radius`` around ``anchor`` if it lies outside; a row
    so far away that the norm overflows moves in the scaled space (as the server's)."""
    u = [a - b for a, b in zip(x, anchor, strict=True)]
    norm = math.sqrt(math.fsum(c * c for c in u))
    huge = not math.isfinite(norm)
    if huge:
        scale = max(abs(c) for c in [*x, *anchor])
        u = [a / scale - b / scale for a, b in zip(x, anchor, strict=True)]
        norm = math.hypot(*u)
    if not huge and norm <= radius:
        return list(x)
    return [a + c * (radius / norm) for a, c in zip(anchor, u, strict=True)]


def domain_clip(value: object, step: CgmParams) -> list[float]:
    """The range clip (scalars) or the projection onto the ball (vectors), spec §4.6; a value
    of the wrong shape or not finite is a ``ValueError`` that never names the value."""
    items = value if isinstance(value, list | tuple) else [value]
    ok = all(isinstance(c, int | float) and not isinstance(c, bool) for c in items)
    if not ok or not all(math.isfinite(c) for c in items):  # type: ignore[arg-type]
        raise ValueError("a CGM value must be finite numbers")
    x = [float(c) for c in items]  # type: ignore[arg-type]
    if step.center is None:
        if len(x) != 1:
            raise ValueError("a CGM value over a range is one number")
        return [min(max(x[0], float(step.lower)), float(step.upper))]  # type: ignore[arg-type]
    if len(x) != len(step.center):
        raise ValueError(f"a CGM value over a ball has {len(step.center)} coordinates")
    return _pull_within(x, [float(c) for c in step.center], float(step.radius))  # type: ignore[arg-type]


def schedule(chain: Chain, step: CgmParams, slot: int) -> tuple[float, float, float, float]:
    """``(r_i, V_i, v_i)`` of the chain's next report and its clip radius (raw units), as the
    server's ``CgmProtocol._schedule``: a chain's first report is ``(0, 1, 1)``; a bound at or
    above ``1/2`` of the diameter is Algorithm 1's step and clips nothing (radius ``D``)."""
    big = diameter(step)
    if not step.reuse:
        return 0.0, 1.0, 1.0, big
    gap = max((slot - chain.last_slot) // step.lag, 1)
    c_norm = min(step.bound / big * (gap if step.gap_aware else 1), 0.5)
    radius = (c_norm if c_norm < 0.5 else 1.0) * big
    if chain.steps == 0:
        return 0.0, 1.0, 1.0, radius
    b = 1 - 2 * c_norm
    r = b / (b * b + chain.v)
    return r, 1 - r * b, chain.v / (b * b + chain.v), radius


def noise_std_steps(V: float, step: CgmParams, d: int) -> tuple[float, int]:
    """``(K, s)``: the grid's steps per diameter and the noise's integer std in steps,
    ``s = ⌈(V·K + 2√d)·σ̃₁⌉`` (rounded up to a power of ``2^(1/128)`` first when gap-aware)."""
    K = grid_steps(step.sigma1, step.grid_bits, d)
    level = V * K + 2 * math.sqrt(d)
    if step.gap_aware:
        level = 2.0 ** (math.ceil(math.log2(level) * LEVELS) / LEVELS)
    return K, math.ceil(level * step.sigma1)


def perturb(fresh: list[float], V: float, step: CgmParams, rng: Randomness) -> list[float]:
    """``g·(R(fresh/g) + Z)`` per coordinate: ``R`` rounds up w.p. the fraction (a coin
    ``uniform < frac``), ``Z`` the exact discrete Gaussian of variance ``s(s+1)``."""
    K, s = noise_std_steps(V, step, len(fresh))
    grid = diameter(step) / K
    out = []
    for value in fresh:
        scaled = value / grid
        low = math.floor(scaled)
        rounded = float(low) + float(uniform(rng) < scaled - low)
        out.append((rounded + discrete_gaussian(s * (s + 1), 1, rng)) * grid)
    return out


@dataclass(frozen=True)
class CgmReport:
    """What the device sends: ``x*`` and the public schedule value ``v_i`` (and its μ² charge)."""

    x: tuple[float, ...]
    v: float


def chain_step(
    chain: Chain, step: CgmParams, slot: int, value: object, rng: Randomness
) -> tuple[CgmReport, Chain]:
    """One report of ``value`` at ``slot`` and the chain's new state (the old one untouched).

    Guarantee: ``x*`` is the server's ``CgmProtocol.respond`` for this user and slot: the
    Gaussian release of the surrogate ``T_i/V_i`` with ratio ``1/σ̃₁`` (spec §4.5)."""
    x = domain_clip(value, step)
    d = len(x)
    if chain.steps and len(chain.clipped) != d:
        raise ValueError(f"the chain holds {len(chain.clipped)} coordinates, the step asks {d}")
    r, V, v, radius = schedule(chain, step, slot)
    prev_clip = chain.clipped or [0.0] * d
    prev_report = chain.reported or [0.0] * d
    skip = chain.steps == 0 or radius >= diameter(step) / 2
    clip = x
    if step.reuse and not skip:
        if d == 1:
            clip = [min(max(x[0], prev_clip[0] - radius), prev_clip[0] + radius)]
        else:
            clip = _pull_within(x, prev_clip, radius)
    fresh = [a - r * b for a, b in zip(clip, prev_clip, strict=True)]
    noisy = perturb(fresh, V, step, rng)
    report = [a + r * b for a, b in zip(noisy, prev_report, strict=True)]
    new = Chain(chain.steps + 1, v, clip, report, slot)
    return CgmReport(tuple(report), v), new


def report_charge(step: CgmParams) -> float:
    """μ² one report costs: ``1/σ̃₁²`` (its surrogate's Gaussian-DP ratio, spec §4.5, §8.4)."""
    return 1.0 / (step.sigma1 * step.sigma1)


def step_state(step: CgmParams) -> dict[str, Any]:
    """The step's public parameters as JSON-able data (pinned by the chain's first report)."""
    names = ("sigma1", "grid_bits", "lag", "bound", "reuse", "gap_aware", "lower", "upper",
             "radius")  # fmt: skip
    out: dict[str, Any] = {k: getattr(step, k) for k in names}
    return out | {"center": None if step.center is None else list(step.center)}


class CgmRequest(Slotted, Protocol):
    """What :class:`CgmDevice` reads of a request: its identity, rule and CGM step."""

    @property
    def purpose(self) -> str: ...
    @property
    def cgm(self) -> CgmParams: ...

    def asks(self, user_id: str) -> bool: ...


@dataclass(frozen=True)
class CgmAnswer:
    """One CGM report: the request's identity, ``x*``, ``v_i`` and the μ² charged."""

    user_id: str
    stream: str
    slot: int
    round: int
    purpose: str
    x: tuple[float, ...]
    v: float
    mu2: float


class CgmDevice:
    """A device's CGM side: its chains and μ² ledger in one store (a file of its own, written
    before a report leaves), its :class:`GaussianPolicy` and randomness (the OS CSPRNG)."""

    def __init__(self, user_id: str, store: FileStore, policy: GaussianPolicy,
                 randomness: Randomness | None = None) -> None:  # fmt: skip
        self.user_id, self.store = user_id, store
        self.randomness: Randomness = randomness or SystemRandomness()
        self.ledger = GaussianLedger(policy)
        self.chains: dict[str, dict[str, Chain]] = {}
        self._broken: str | None = None
        try:
            state = store.load()
            self.ledger = GaussianLedger.from_state(policy, state.get("ledger", {}))
            self.chains = {
                name: {k: Chain.from_state(c) for k, c in phases.items()}
                for name, phases in state.get("chains", {}).items()
            }
        except StoreError as exc:
            self._broken = str(exc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._broken = f"CGM store {store.path} is malformed ({exc}): refusing to report"

    def answer(self, request: CgmRequest, value: object) -> CgmAnswer | Refusal:
        """The report of ``value`` for ``request``, or why the device refuses (store sound →
        asked → μ² ledger → chain step → charge and persist → report)."""
        if self._broken is not None:
            return Refusal("store", self._broken)
        try:
            asked = bool(request.asks(self.user_id))
            step, params = request.cgm, step_state(request.cgm)
            charge = report_charge(step)
        except Exception as exc:  # a server's request must not take the device down
            return Refusal("invalid", f"the request could not be read: {type(exc).__name__}")
        if not asked:
            return Refusal("not-asked", "the request does not ask this device")
        refusal = self.ledger.check(request.stream, request.slot, charge, params)
        if refusal is not None:
            return refusal
        phases = self.chains.get(request.stream, {})
        phase = str(request.slot % step.lag)
        try:
            report, chain = chain_step(phases.get(phase, Chain()), step, request.slot, value,
                                       self.randomness)  # fmt: skip
        except (ValueError, TypeError, ZeroDivisionError) as exc:
            return Refusal("invalid", str(exc))
        self.ledger.charge(request.stream, request.slot, charge, params)
        self.chains[request.stream] = phases | {phase: chain}
        return self._persist(request, report, charge)

    def _persist(
        self, request: CgmRequest, report: CgmReport, charge: float
    ) -> CgmAnswer | Refusal:
        chains = {n: {k: c.to_state() for k, c in p.items()} for n, p in self.chains.items()}
        try:
            self.store.save({"ledger": self.ledger.to_state(), "chains": chains})
        except StoreError as exc:
            self._broken = str(exc)
            return Refusal("store", self._broken)
        return CgmAnswer(self.user_id, request.stream, request.slot, request.round,
                         request.purpose, report.x, report.v, charge)  # fmt: skip
