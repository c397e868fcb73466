"""The streamable baselines of SaO2 — PrivKV, KVUE, PCKV-GRR, PCKV-UE, EFMRTT, ToPL, DDRM (spec
sao2 §6.2) — and ``BASELINES``, the registry of all ten SaO2 baselines by name.

Each is a ``TernaryMechanism`` (``sao2_ternary``) with ``online = True``: every data-dependent
choice is made when its coordinate becomes known, at a data-independent time (a uniform
coordinate ``j*`` or slot drawn up front, then selection sampling over the non-zeros in stream
order, stubs last). The vectorised samplers here draw the same law directly: a uniform slot of
the ``s`` (``sao2_baselines``: empty slots are stubs) is a uniform non-zero with probability
``s₀/s``, as the stream-order draw is. Each estimator is unbiased; each report ε-LDP for the
user's whole ternary vector (the docstrings give the argument; the tests check it exactly on
small domains).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.sao2_baselines import (
    Collision,
    FutureRand,
    Signs,
    Succinct,
    check_batch,
    check_n,
    check_params,
    column_sums,
    grr_keep,
    keep_sign,
    pick_slot,
    select_slots,
    sign_report,
    ternary_noise,
)
from privstream.mechanisms.sao2_ternary import Ternary, TernaryMechanism


@dataclass(frozen=True)
class KeyedReports:
    """Per user one reported key (a coordinate; PCKV-GRR: or a dummy key ``≥ D``) and value."""

    key: NDArray[np.int64]
    value: Signs


def value_at(batch: Ternary, coords: NDArray[np.int64]) -> Signs:
    """Each user's ternary value ``R_j[coords[j]]``."""
    match = batch.index == coords[:, None]
    return np.asarray((batch.sign * match).sum(axis=1), dtype=np.int8)


def keyed_sums(reports: KeyedReports, D: int) -> NDArray[np.float64]:
    """``Σ value`` per real key ``< D`` (dummy keys are dropped)."""
    real = reports.key < D
    sums = np.bincount(reports.key[real], weights=reports.value[real], minlength=D)
    return np.asarray(sums[:D], dtype=np.float64)


class _SampledKey:
    """Shared frame of PrivKV and KVUE: ``j*`` uniform in ``[D]`` (data-independent; reported
    when coordinate ``j*`` is observed), ``R_{j*}`` randomised into ``y ∈ {−1, 0, 1}`` with
    ``E[y] = gain·R_{j*}``; ``R̂_i = D · Σ_{j*=i} y / (n · gain)`` (unbiased)."""

    name: str
    online: bool = True
    gain: float

    def __init__(self, D: int, s: int, eps: float) -> None:
        check_params(D, s, eps)
        self.D, self.s, self.eps = D, s, eps

    def perturb(self, values: Signs, rng: np.random.Generator) -> Signs:
        raise NotImplementedError

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> KeyedReports:
        batch = check_batch(batch, self.D, self.s)
        key = rng.integers(0, self.D, size=batch.n)
        return KeyedReports(key, self.perturb(value_at(batch, key), rng))

    def estimate(self, reports: KeyedReports, n: int) -> NDArray[np.float64]:
        check_n(n)
        return self.D * keyed_sums(reports, self.D) / (n * self.gain)


class PrivKV(_SampledKey):
    """PrivKV [51] (spec sao2 §6.2; PrivKVM with one iteration, ``ε₁ = ε₂ = ε/2``): presence of
    ``R_{j*}`` by randomized response with ``p₁ = e^{ε₁}/(e^{ε₁}+1)``; a present value's sign by
    randomized response with ``p₂``, an absent one's uniform; ``y = b·v``.
    **ε-LDP**: the presence bit costs at most ``ε₁``, and the sign of a reported value compares
    ``p₁p₂`` with ``p₁(1−p₂)`` (ratio ``e^{ε₂}``) or with ``(1−p₁)/2`` (ratio
    ``e^{ε₁}·2p₂ ≤ e^{ε₁+ε₂}``): the worst ratio is ``2e^ε/(e^{ε/2}+1)``, below ``e^ε`` (the
    split wastes a little). ``gain = p₁(2p₂ − 1)``."""

    name = "PrivKV"

    def __init__(self, D: int, s: int, eps: float) -> None:
        super().__init__(D, s, eps)
        self.p1 = self.p2 = math.exp(eps / 2) / (math.exp(eps / 2) + 1)
        self.gain = self.p1 * (2 * self.p2 - 1)

    def perturb(self, values: Signs, rng: np.random.Generator) -> Signs:
        present = values != 0
        reported = grr_keep(rng, present.astype(np.int64), 2, self.p1) == 1
        sign = np.where(
            present,
            keep_sign(rng, values, self.p2),
            ternary_noise(rng, (values.size, 1), 1.0)[:, 0],
        )
        return np.where(reported, sign, 0).astype(np.int8)


class KVUE(_SampledKey):
    """KVUE [32] (spec sao2 §6.2): three-ary generalised randomized response on ``R_{j*}``: kept
    with ``p = e^ε/(e^ε+2)``, each other value with ``q = 1/(e^ε+2)``. **ε-LDP** (``p/q = e^ε``
    for the reported coordinate; ``j*`` is data-independent). ``gain = p − q``."""

    name = "KVUE"

    def __init__(self, D: int, s: int, eps: float) -> None:
        super().__init__(D, s, eps)
        self.p = math.exp(eps) / (math.exp(eps) + 2)
        self.q = 1 / (math.exp(eps) + 2)
        self.gain = self.p - self.q

    def perturb(self, values: Signs, rng: np.random.Generator) -> Signs:
        return (grr_keep(rng, values.astype(np.int64) + 1, 3, self.p) - 1).astype(np.int8)


class _PaddedPick:
    """Shared frame of PCKV [22]: padding-and-sampling with ``ℓ = s`` — a uniform slot of the
    ``s`` (a real non-zero ``(k, v = R_k)`` with probability ``s₀/s``, else a uniform dummy key
    ``D..D+ℓ−1`` with a uniform sign) — then a perturbation with value gain ``a(2p − 1)``;
    ``R̂_i = ℓ (c₊_i − c₋_i) / (n a (2p − 1))`` (unbiased: ``P[pick = i] = 1/ℓ``)."""

    name: str
    online: bool = True
    a: float
    p: float

    def __init__(self, D: int, s: int, eps: float) -> None:
        check_params(D, s, eps)
        self.D, self.s, self.eps, self.ell = D, s, eps, s

    def pick(self, batch: Ternary, rng: np.random.Generator) -> tuple[NDArray[np.int64], Signs]:
        """The sampled key (dummy keys ``≥ D``) and value of each user."""
        key, sign = pick_slot(rng, batch)
        dummy = key < 0
        key = np.where(dummy, self.D + rng.integers(0, self.ell, size=batch.n), key)
        noise = ternary_noise(rng, (batch.n, 1), 1.0)[:, 0]
        return key, np.where(dummy, noise, sign).astype(np.int8)

    def scale(self, n: int) -> float:
        check_n(n)
        return self.ell / (n * self.a * (2 * self.p - 1))


class PCKVGRR(_PaddedPick):
    """PCKV-GRR [22] (spec sao2 §6.2): with probability
    ``a = (ℓ(e^ε−1)+2)/(ℓ(e^ε−1)+2(D+ℓ))`` the sampled key is kept and its value kept with
    ``p = (ℓ(e^ε−1)+1)/(ℓ(e^ε−1)+2)``, else a uniform other key of the ``D+ℓ`` with a uniform
    sign. **ε-LDP** over the sampling (PCKV's padding amplification): a key-value pair is
    reported with probability ``g = (1−a)/(2(D+ℓ−1))`` unless it is picked (probability at most
    ``1/ℓ``), so at most ``ap/ℓ + (1−1/ℓ)g = e^ε·g`` and at least ``g``."""

    name = "PCKV-GRR"

    def __init__(self, D: int, s: int, eps: float) -> None:
        super().__init__(D, s, eps)
        grow = self.ell * math.expm1(eps)
        self.a = (grow + 2) / (grow + 2 * (D + self.ell))
        self.p = (grow + 1) / (grow + 2)

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> KeyedReports:
        batch = check_batch(batch, self.D, self.s)
        key, value = self.pick(batch, rng)
        kept = rng.random(batch.n) < self.a
        other = grr_keep(rng, key, self.D + self.ell, 0.0)
        noise = ternary_noise(rng, (batch.n, 1), 1.0)[:, 0]
        value = np.where(kept, keep_sign(rng, value, self.p), noise).astype(np.int8)
        return KeyedReports(np.where(kept, key, other), value)

    def estimate(self, reports: KeyedReports, n: int) -> NDArray[np.float64]:
        return keyed_sums(reports, self.D) * self.scale(n)


class PCKVUE(_PaddedPick):
    """PCKV-UE [22] (spec sao2 §6.2, the reference code's allocation ``a = 1/2``,
    ``b = 2/(e^ε+3)``, ``p = e^ε/(e^ε+1)``): the sampled key reports ``v`` w.p. ``ap``, ``−v``
    w.p. ``a(1−p)``, 0 otherwise; every other key ``±1`` w.p. ``b/2`` each. Only the ``D`` real
    keys are sent (dropping the dummies' entries is post-processing). **ε-LDP** for every
    pick: moving the pick from ``(k, v)`` changes key ``k``'s law by at most
    ``ap/(b/2) = e^ε(e^ε+3)/(2(e^ε+1))`` and the new key's by at most
    ``(b/2)/(a(1−p)) = 2(e^ε+1)/(e^ε+3)``: a product of ``e^ε``; a sign flip costs ``p/(1−p)``."""

    name = "PCKV-UE"

    def __init__(self, D: int, s: int, eps: float) -> None:
        super().__init__(D, s, eps)
        self.a, self.b = 0.5, 2 / (math.exp(eps) + 3)
        self.p = math.exp(eps) / (math.exp(eps) + 1)

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> Signs:
        batch = check_batch(batch, self.D, self.s)
        key, value = self.pick(batch, rng)
        y = ternary_noise(rng, (batch.n, self.D), self.b)
        rows = np.nonzero(key < self.D)[0]
        sent = rng.random(rows.size) < self.a
        y[rows, key[rows]] = np.where(sent, keep_sign(rng, value[rows], self.p), 0)
        return y

    def estimate(self, reports: Signs, n: int) -> NDArray[np.float64]:
        return column_sums(reports) * self.scale(n)


class SignRR:
    """DDRM [49] (spec sao2 §6.2): a uniform ``k``-subset of the ``s`` non-zeros (stubs count;
    selection sampling in stream order online) is reported by randomized response with
    ``ε/k`` each, every other coordinate as a uniform sign; ``R̂_i = (s/k) C z_i`` with
    ``C = (e^{ε/k}+1)/(e^{ε/k}−1)`` (unbiased: ``P[selected] = k/s``). **ε-LDP**: a report's
    probability is ``2^{−D}`` times the mean over subsets of a product of ``k`` factors in
    ``[2(1−p), 2p]``, ``p/(1−p) = e^{ε/k}``. Per-user variance ``(s/k)²C² − R_i²``.

    The same class is EFMRTT [15] with ``k = 1`` (one change, full ε) and ToPL [42] with
    ``k = s`` (Duchi's ε/s mechanism on each coordinate: ``±C`` with ``P[+C] = ½ + R_i/(2C)`` is
    this law); DDRM's default ``k = s`` (spec A37) makes it coincide with ToPL.
    """

    online: bool = True

    def __init__(
        self, D: int, s: int, eps: float, k: int | None = None, name: str = "DDRM"
    ) -> None:
        check_params(D, s, eps)
        k = s if k is None else k
        if not 1 <= k <= s:
            raise ValueError(f"DDRM selects 1 <= k <= s = {s} non-zeros, got k={k}")
        self.D, self.s, self.eps, self.k, self.name = D, s, eps, k, name
        self.keep = math.exp(eps / k) / (math.exp(eps / k) + 1)
        self.C = (math.exp(eps / k) + 1) / math.expm1(eps / k)

    def randomize(self, batch: Ternary, rng: np.random.Generator) -> Signs:
        batch = check_batch(batch, self.D, self.s)
        chosen = select_slots(rng, batch.n, self.s, self.k)
        agree = rng.random((batch.n, self.s)) < self.keep
        return sign_report(rng, batch, chosen, agree)

    def estimate(self, reports: Signs, n: int) -> NDArray[np.float64]:
        check_n(n)
        return column_sums(reports) * (self.s / self.k) * self.C / n


def efmrtt(D: int, s: int, eps: float) -> SignRR:
    """EFMRTT [15] (spec sao2 §6.2, reconstruction [I]): one uniform change of the ``s``,
    randomised with the full ε; ``SignRR`` with ``k = 1``."""
    return SignRR(D, s, eps, k=1, name="EFMRTT")


def topl(D: int, s: int, eps: float) -> SignRR:
    """ToPL [42] (spec sao2 §6.2, adaptation [I]): every coordinate by Duchi's ε/s mechanism,
    the same law as DDRM with ``k = s`` (``SignRR``)."""
    return SignRR(D, s, eps, k=s, name="ToPL")


def ddrm(D: int, s: int, eps: float) -> SignRR:
    """DDRM [49] with the spec's default ``k = s`` (A37)."""
    return SignRR(D, s, eps, k=s, name="DDRM")


BASELINES: dict[str, Callable[[int, int, float], TernaryMechanism]] = {
    "Collision": Collision,
    "SUCCINCT": Succinct,
    "FutureRand": FutureRand,
    "PrivKV": PrivKV,
    "KVUE": KVUE,
    "PCKV-GRR": PCKVGRR,
    "PCKV-UE": PCKVUE,
    "EFMRTT": efmrtt,
    "ToPL": topl,
    "DDRM": ddrm,
}
"""The SaO2 baselines by the paper's name: ``BASELINES[name](D, s, eps)`` (spec sao2 §6)."""
