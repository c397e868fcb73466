"""Exact integer noise for every central-DP mechanism (spec personalized-w-event §2.1, §9.6).

Guarantee. Every sampler here draws *exactly* from its stated distribution, using only
``Generator.integers`` (uniform integers) and exact integer or rational arithmetic: no
floating-point number ever influences an output. This is the defence of spec §9.6 against the
floating-point attack on textbook Laplace sampling (Mironov 2012), where ``count + Lap(b)``
computed on doubles releases values that are unreachable from a neighbouring count and so
reveals the count. The algorithms are those of Canonne, Kamath and Steinke 2020, "The Discrete
Gaussian for Differential Privacy" (CKS 2020):

* Algorithm 1, :func:`bernoulli_exp`: ``Bernoulli(exp(−γ))`` for rational ``γ ≥ 0``;
* Algorithm 2, :func:`discrete_laplace`: ``P(x) ∝ exp(−|x|/b)`` on ℤ for rational ``b``;
* Algorithm 3, :func:`discrete_gaussian`: ``P(x) ∝ exp(−x²/(2σ²))`` on ℤ for rational ``σ²``.

The ε-DP release is :func:`discrete_laplace_mechanism`: ``counts + DLap(b)^d`` with ``b`` the
smallest multiple of ``2⁻²⁰`` that is ``≥ Δ/ε`` (:func:`public_scale`). For integer queries of
L1 sensitivity ``Δ`` this is ``ε'``-DP with ``ε' = Δ/b ≤ ε``, pointwise: for neighbouring counts
``c, c'`` and *every* released vector ``v``, ``P(v | c)/P(v | c') ≤ exp(Δ/b)``. Releases are
integers, so rounding or any other post-processing keeps the guarantee.

Vectorisation: all pending samples advance together in rounds (one ``integers`` call per round
over a mask of the samples still running), never in a Python loop per sample. Which samples run
in a round depends on earlier draws, so the *timing* of a call depends on the noise (as CKS 2020
note for their samplers); the released values depend on nothing but the drawn integers. Inside
``Bernoulli(exp(−1))`` the draws of ``Bernoulli(1/k)`` for ``k = 2…5`` are the mixed-radix digits
of one uniform integer in ``[0, 5!)`` (independent and uniform, so the distribution is unchanged).

Callers pass a ``numpy.random.Generator`` (in production the keyed AES-CTR generator, design
§6), so a replayed slot draws identical noise; nothing here seeds or keeps a generator. The same
generator state gives identical draws; draws for different ``size`` need not share a prefix.

Integer ranges: ``Bernoulli(γ/k)`` is ``integers(0, den·k) < num`` while ``den·k < 2⁶²``;
beyond, it is the product of independent ``Bernoulli(1/k)`` and ``Bernoulli(num/den)``, the
latter comparing a uniform with ``num/den`` digit by digit in base ``2⁶²`` (Python integers),
so no draw ever overflows or is refused because of earlier draws. Scales are at most
:data:`MAX_SCALE` with numerators at most :data:`MAX_NUMERATOR`.

:func:`laplace_scale` and :func:`laplace_variance` remain the papers' error model (``2b²``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

MAX_SCALE = 2**40
"""Largest noise scale :func:`public_scale` accepts."""
MAX_NUMERATOR = 2**52
"""Largest numerator ``s`` (and denominator) of a scale ``s/t``: then ``X = U + s·V`` of CKS
Alg. 2 stays below ``2⁶²`` unless ``V ≥ 1023`` (probability ``e⁻¹⁰²³``; OverflowError then)."""
MAX_DENOMINATOR_BITS = 52

_INT_LIMIT = 2**62  # every int64 quantity and uniform range stays below this
_WORD = 2**62  # digit base of the exact comparison of a uniform with a big rational
_NEVER = np.iinfo(np.int64).max  # "no limit" for the run of Bernoulli(exp(−1)) successes
_MAX_COUNT = 2**53  # largest |count| discrete_laplace_mechanism accepts

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """``b = Δ/ε``, the scale that makes a query of L1 sensitivity ``Δ`` ε-DP."""
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be a positive finite number, got {sensitivity!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    return sensitivity / epsilon


def laplace_variance(scale: float) -> float:
    """Variance ``2b²`` of one ``Lap(b)`` draw (spec §2.1, Eq. 2 with ``b = 1/ε``)."""
    return 2.0 * scale * scale


def discrete_laplace_variance(scale: float | Fraction) -> float:
    """Variance ``2e^{−1/b}/(1 − e^{−1/b})²`` of one ``DLap(b)`` draw (``≤ 2b²``, ``→ 2b²``)."""
    b = float(scale)
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return 2.0 * math.exp(-1.0 / b) / math.expm1(-1.0 / b) ** 2


def discrete_gaussian_variance(sigma2: float | Fraction) -> float:
    """Variance of the discrete Gaussian ``P(x) ∝ exp(−x²/(2σ²))``, summed numerically over
    ``|x| ≤ 12σ + 10`` (the dropped terms are below ``e⁻⁷²`` of the kept ones; for tests)."""
    s2 = float(sigma2)
    if not (math.isfinite(s2) and s2 > 0):
        raise ValueError(f"sigma2 must be a positive finite number, got {sigma2!r}")
    x = np.arange(1, math.ceil(12.0 * math.sqrt(s2)) + 10, dtype=np.float64)
    w = np.exp(-(x * x) / (2.0 * s2))
    return float(2.0 * np.sum(x * x * w) / (1.0 + 2.0 * np.sum(w)))


def public_scale(scale: float | Fraction, *, denominator_bits: int = 20) -> Fraction:
    """The smallest rational ``s/t ≥ scale`` with ``t = 2**denominator_bits``.

    Rounding up only adds noise, so a scale chosen as ``Δ/ε`` still gives ε-DP. A ``Fraction``
    whose denominator is a power of two ``≤ t`` comes back unchanged. Refused (``ValueError``):
    non-positive or non-finite scales, scales above :data:`MAX_SCALE`, and scales whose
    numerator ``s`` would exceed :data:`MAX_NUMERATOR` (``scale·t > 2⁵²``).
    """
    if (
        isinstance(denominator_bits, bool)
        or not isinstance(denominator_bits, int)
        or not 0 <= denominator_bits <= MAX_DENOMINATOR_BITS
    ):
        raise ValueError(
            f"denominator_bits must be an int in [0, {MAX_DENOMINATOR_BITS}], got {denominator_bits!r}"
        )
    exact = _exact_positive(scale, "scale")
    if exact > MAX_SCALE:
        raise ValueError(f"scale {scale!r} exceeds the maximum scale {MAX_SCALE}")
    t = 2**denominator_bits
    s = -((-exact.numerator * t) // exact.denominator)  # ceil(scale·t), exactly
    if s > MAX_NUMERATOR:
        raise ValueError(
            f"scale {scale!r} needs numerator {s} over 2**{denominator_bits}, above the limit "
            f"{MAX_NUMERATOR}; use fewer denominator_bits"
        )
    return Fraction(s, t)


def _exact_positive(value: float | Fraction, name: str) -> Fraction:
    """``value`` as an exact positive ``Fraction`` (floats convert exactly), else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if isinstance(value, (Fraction, int)):
        exact = Fraction(value)
    else:
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        exact = Fraction(x)
    if exact <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return exact


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be an int >= 0, got {size!r}")
    return int(size)


def _bernoulli_ratio(rng: np.random.Generator, num: NDArray[Any], den: int) -> BoolArray:
    """Exact ``Bernoulli(num/den)`` per entry, ``0 ≤ num ≤ den``, for any positive int ``den``.

    Below ``2⁶²`` this is ``integers(0, den) < num``. Above, a uniform ``U ∈ [0, 1)`` is drawn
    lazily as base-``2⁶²`` digits and compared with the expansion of ``num/den`` (Python
    integers): the first differing digit decides ``U < num/den``; a tie (probability ``2⁻⁶²``)
    draws the next digit.
    """
    m = num.shape[0]
    if den <= _INT_LIMIT:
        return rng.integers(0, den, size=m) < num.astype(np.int64, copy=False)
    out = np.zeros(m, dtype=np.bool_)
    rem = num.astype(object)
    active = np.arange(m)
    while active.size:
        scaled = rem[active] * _WORD
        digit = (scaled // den).astype(np.int64)  # in [0, 2⁶²]
        rem[active] = scaled % den
        w = rng.integers(0, _WORD, size=active.size)
        decided = w != digit
        out[active[decided]] = w[decided] < digit[decided]
        active = active[~decided]
    return out


def _bernoulli_over_k(rng: np.random.Generator, num: NDArray[Any], den: int, k: int) -> BoolArray:
    """Exact ``Bernoulli(num/(den·k))``: ``integers(0, den·k) < num`` while ``den·k < 2⁶²``,
    else the product of independent ``Bernoulli(1/k)`` and ``Bernoulli(num/den)`` (no overflow)."""
    if den * k < _INT_LIMIT:
        return rng.integers(0, den * k, size=num.shape[0]) < num.astype(np.int64, copy=False)
    out: BoolArray = rng.integers(0, k, size=num.shape[0]) == 0
    hit = np.flatnonzero(out)
    out[hit] = _bernoulli_ratio(rng, num[hit], den)
    return out


def _bernoulli_exp_le1(rng: np.random.Generator, num: NDArray[Any], den: int) -> BoolArray:
    """``Bernoulli(exp(−num/den))`` per entry for ``0 ≤ num ≤ den`` (CKS Alg. 1, ``γ ≤ 1``).

    Loop ``k = 1, 2, …``: draw ``A ~ Bernoulli(γ/k)``; stop at the first ``A = 0`` and return
    ``[k odd]``. All running samples share ``k``, so a round is one ``integers`` call. ``γ = 0``
    stops at ``k = 1`` without a draw (``A = 0`` surely).
    """
    out = np.ones(num.shape[0], dtype=np.bool_)
    active = np.flatnonzero(num)
    k = 1
    while active.size:
        a = _bernoulli_over_k(rng, num[active], den, k)
        out[active[~a]] = k % 2 == 1
        active = active[a]
        k += 1
    return out


def _exp1_digit_table() -> NDArray[np.uint8]:
    """Outcome of the γ = 1 loop of CKS Alg. 1 for each ``R ∈ [0, 5!)``: the mixed-radix digits
    ``d_k = ⌊R/(k−1)!⌋ mod k`` (``k = 2…5``) of a uniform ``R`` are independent and uniform on
    ``[0, k)``, so ``d_k = 0`` is ``Bernoulli(1/k)``. The loop stops at the first ``d_k ≠ 0``
    with result ``[k odd]`` (0 = False, 1 = True); ``R = 0`` passes ``k = 5`` (code 2)."""
    table = np.full(_EXP1_RADIX, 2, dtype=np.uint8)
    for r in range(1, _EXP1_RADIX):
        k, place = 2, 1
        while (r // place) % k == 0:
            place, k = place * k, k + 1
        table[r] = k % 2
    return table


_EXP1_RADIX = 120  # 5!: the Bernoulli(1/k) of k = 2…5 from one byte-sized uniform
_EXP1_TABLE = _exp1_digit_table()


def _bernoulli_exp1(rng: np.random.Generator, m: int) -> BoolArray:
    """``m`` draws of ``Bernoulli(exp(−1))``: CKS Alg. 1 at ``γ = 1``, where ``Bernoulli(γ/k)``
    is ``Bernoulli(1/k)`` and ``k = 1`` needs no draw (``Bernoulli(1)``). The draws for
    ``k = 2…5`` come from one uniform byte (:func:`_exp1_digit_table`); the rare samples that
    pass ``k = 5`` (probability 1/120) continue the loop with ``integers(0, k) == 0``."""
    code = _EXP1_TABLE[rng.integers(0, _EXP1_RADIX, size=m, dtype=np.uint8)]
    out: BoolArray = code == 1
    active = np.flatnonzero(code == 2)
    k = 6
    while active.size:
        a = rng.integers(0, k, size=active.size) == 0
        out[active[~a]] = k % 2 == 1
        active = active[a]
        k += 1
    return out


def _exp1_run(rng: np.random.Generator, limit: IntArray) -> IntArray:
    """Per entry, the number of ``Bernoulli(exp(−1))`` successes before the first failure,
    stopping early once it reaches ``limit``."""
    count = np.zeros(limit.shape[0], dtype=np.int64)
    active = np.flatnonzero(limit > 0)
    while active.size:
        active = active[_bernoulli_exp1(rng, active.size)]
        count[active] += 1
        active = active[count[active] < limit[active]]
    return count


def _bernoulli_exp_split(
    rng: np.random.Generator, whole: IntArray, frac: NDArray[Any], den: int
) -> BoolArray:
    """``Bernoulli(exp(−(whole + frac/den)))`` per entry, ``0 ≤ frac < den`` (CKS Alg. 1):
    ``whole`` independent ``Bernoulli(exp(−1))`` must all succeed, then one
    ``Bernoulli(exp(−frac/den))``."""
    out = np.zeros(whole.shape[0], dtype=np.bool_)
    alive = np.flatnonzero(_exp1_run(rng, whole) == whole)
    out[alive] = _bernoulli_exp_le1(rng, frac[alive], den)
    return out


def bernoulli_exp(
    rng: np.random.Generator, gamma_num: NDArray[np.int64], gamma_den: int
) -> BoolArray:
    """Exact, independent ``Bernoulli(exp(−γ))`` for each ``γ = gamma_num[i]/gamma_den ≥ 0``
    (CKS 2020 Alg. 1), same shape as ``gamma_num``.

    ``γ ≤ 1`` runs the loop ``k = 1, 2, …`` with ``Bernoulli(γ/k)`` drawn as
    ``integers(0, den·k) < num`` (or, once ``den·k`` would reach ``2⁶²``, as an exact product
    that cannot overflow); ``γ > 1`` is ``⌊γ⌋`` draws of ``Bernoulli(exp(−1))`` times one of
    ``Bernoulli(exp(−(γ − ⌊γ⌋)))``.
    """
    num = np.asarray(gamma_num)
    if num.dtype.kind not in "iu":
        raise ValueError(f"gamma_num must be an integer array, got dtype {num.dtype}")
    if isinstance(gamma_den, bool) or not isinstance(gamma_den, (int, np.integer)) or gamma_den < 1:
        raise ValueError(f"gamma_den must be an int >= 1, got {gamma_den!r}")
    if num.size and (num.min() < 0 or num.max() > _NEVER):
        raise ValueError("gamma_num must be in [0, 2**63 - 1]")
    den = int(gamma_den)
    flat = num.astype(np.int64).ravel()
    whole = flat // den if den <= _NEVER else np.zeros_like(flat)
    frac = flat % den if den <= _NEVER else flat
    return _bernoulli_exp_split(rng, whole, frac, den).reshape(num.shape)


def _scale_parts(scale: float | Fraction) -> tuple[int, int]:
    """Numerator and denominator of an exact scale, within the limits of :func:`public_scale`."""
    exact = _exact_positive(scale, "scale")
    if exact > MAX_SCALE or exact.numerator > MAX_NUMERATOR or exact.denominator > MAX_NUMERATOR:
        raise ValueError(
            f"scale {scale!r} exceeds the limits (scale <= {MAX_SCALE}, numerator and "
            f"denominator <= {MAX_NUMERATOR}); pass it through public_scale"
        )
    return exact.numerator, exact.denominator


def _dlap_round(rng: np.random.Generator, s: int, t: int, m: int) -> IntArray:
    """One round of CKS Alg. 2 on ``m`` candidates; returns the accepted draws of ``DLap(s/t)``."""
    u = rng.integers(0, s, size=m)
    u = u[_bernoulli_exp_le1(rng, u, s)]  # U uniform on [0, s), kept w.p. exp(−U/s)
    v = _exp1_run(rng, np.full(u.shape[0], _NEVER, dtype=np.int64))
    if v.size and int(v.max()) > (_INT_LIMIT - s) // s:  # probability < e^{−1023}
        raise OverflowError("discrete Laplace draw beyond int64 range")
    y = (u + s * v) // t  # X = U + s·V ~ ⌊s·Exp(1)⌋, Y = ⌊X/t⌋
    negative = rng.integers(0, 2, size=y.shape[0], dtype=np.bool_)
    keep = ~(negative & (y == 0))  # reject "−0" so that 0 is not counted twice
    z: IntArray = np.where(negative, -y, y)[keep]
    return z


def discrete_laplace(rng: np.random.Generator, scale: Fraction, size: int) -> IntArray:
    """``size`` i.i.d. draws with ``P(x) = (1−e^{−1/b})/(1+e^{−1/b})·e^{−|x|/b}`` on ℤ, for
    the exact rational ``b = scale = s/t`` (CKS 2020 Alg. 2).

    Each round draws a batch of candidates, sized from the acceptance rate (≈ 0.63·(1 −
    (1 − e^{−1/b})/2), a float used only to choose the batch size), and keeps the first accepted
    ones in draw order.
    """
    s, t = _scale_parts(scale)
    n = _check_size(size)
    accept = 0.63 * (1.0 - 0.5 * -math.expm1(-t / s))
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        z = _dlap_round(rng, s, t, math.ceil(1.1 * need / accept) + 4)
        take = min(need, z.shape[0])
        out[filled : filled + take] = z[:take]
        filled += take
    return out


def _integer_counts(counts: ArrayLike) -> IntArray:
    """``counts`` as int64, refusing non-integer values and ``|count| > 2⁵³``."""
    c = np.asarray(counts)
    if c.dtype.kind == "f":
        if not (np.all(np.isfinite(c)) and np.all(c == np.floor(c))):
            raise ValueError("counts must be integers; got non-integer values")
    elif c.dtype.kind not in "iu":
        raise ValueError(f"counts must be integers, got dtype {c.dtype}")
    if c.size and (c.max() > _MAX_COUNT or c.min() < -_MAX_COUNT):
        raise ValueError(f"counts must be within ±{_MAX_COUNT}")
    return c.astype(np.int64)


def discrete_laplace_mechanism(
    counts: ArrayLike, sensitivity: int, epsilon: float, rng: np.random.Generator
) -> IntArray:
    """``counts + DLap(b)^d`` with ``b = public_scale(Δ/ε)`` (``Δ/ε`` computed exactly): the
    ε-DP discrete Laplace mechanism for an integer query of L1 sensitivity ``Δ`` (the rounding up
    of ``b`` gives ``ε' = Δ/b ≤ ε``). Same shape as ``counts``; int64 releases.

    ``counts`` must hold integers (an integer dtype, or floats with integral values); anything
    else is refused, since the guarantee is for integer queries.
    """
    if (
        isinstance(sensitivity, bool)
        or not isinstance(sensitivity, (int, np.integer))
        or sensitivity < 1
    ):
        raise ValueError(f"sensitivity must be an int >= 1, got {sensitivity!r}")
    laplace_scale(float(sensitivity), epsilon)  # validates epsilon, same message
    scale = public_scale(Fraction(int(sensitivity)) / Fraction(epsilon))
    c = _integer_counts(counts)
    return c + discrete_laplace(rng, scale, c.size).reshape(c.shape)


def _dgauss_exponent(y: IntArray, p: int, q: int, t: int) -> tuple[IntArray, NDArray[Any], int]:
    """``γ = (|Y| − σ²/t)²/(2σ²) = (|Y|·q·t − p)²/(2·p·q·t²)`` for ``σ² = p/q``, split as
    ``(⌊γ⌋, numerator of the fraction, denominator)``, with the common factor ``g² =
    gcd(p, qt)²`` taken out first: in int64 when the reduced terms fit in 2⁶² (always when
    ``σ² = s(s+1)``, whose ``t = s + 1`` divides it), else in Python integers (object arrays),
    so the split is exact for every rational ``σ²``."""
    den = 2 * p * q * t * t
    g = math.gcd(p, q * t)  # γ = (|Y|·a − b)²/(2pqt²/g²), a = qt/g, b = p/g: smaller integers
    a, b, small = q * t // g, p // g, den // (g * g)
    top = (int(np.abs(y).max()) if y.size else 0) * a + b
    if den % (g * g) == 0 and top * top < _INT_LIMIT and small < _INT_LIMIT:
        num = (np.abs(y) * a - b) ** 2
        return num // small, num % small, small
    big = (np.abs(y).astype(object) * (q * t) - p) ** 2
    whole = big // den
    if whole.size and int(whole.max()) > _NEVER:  # |Y| > 2³¹·σ: probability < e^{−2³¹}
        raise OverflowError("discrete Gaussian candidate beyond int64 range")
    frac = big % den
    return whole.astype(np.int64), frac.astype(np.int64) if den < _INT_LIMIT else frac, den


def _dgauss_round(rng: np.random.Generator, p: int, q: int, m: int) -> IntArray:
    """One round of CKS Alg. 3 for ``σ² = p/q`` on ``m`` candidates; returns accepted draws."""
    t = math.isqrt(p // q) + 1  # ⌊σ⌋ + 1
    y = discrete_laplace(rng, Fraction(t), m)
    whole, frac, den = _dgauss_exponent(y, p, q, t)
    return y[_bernoulli_exp_split(rng, whole, frac, den)]


def discrete_gaussian(rng: np.random.Generator, sigma2: Fraction, size: int) -> IntArray:
    """``size`` i.i.d. draws with ``P(x) ∝ exp(−x²/(2σ²))`` on ℤ for rational ``σ² = sigma2``
    (CKS 2020 Alg. 3): ``Y ~ DLap(⌊σ⌋ + 1)`` accepted with probability
    ``exp(−(|Y| − σ²/t)²/(2σ²))``.

    Vectorised in rounds like :func:`discrete_laplace` (batches sized for the acceptance rate,
    above 0.45 for every ``σ²``); the acceptance exponent is exact for any rational ``σ²`` (a
    float converts exactly): int64 when it fits, Python integers (object arrays) otherwise.
    """
    exact = _exact_positive(sigma2, "sigma2")
    if exact > MAX_SCALE:
        raise ValueError(f"sigma2 {sigma2!r} exceeds the maximum {MAX_SCALE}")
    n = _check_size(size)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        z = _dgauss_round(rng, exact.numerator, exact.denominator, math.ceil(need / 0.4) + 4)
        take = min(need, z.shape[0])
        out[filled : filled + take] = z[:take]
        filled += take
    return out
