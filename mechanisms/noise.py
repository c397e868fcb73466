"""Laplace noise shared by every central-DP mechanism (spec personalized-w-event §2.1).

``LapMech(v, ε, Δ) = v + Lap(Δ/ε)^d``: each coordinate gets an independent Laplace draw of
scale ``b = Δ/ε`` (density ``exp(−|z|/b)/(2b)``, variance ``2b²``), which makes the release of a
query with L1 sensitivity ``Δ`` ε-DP. Callers pass a ``numpy.random.Generator`` obtained from
``SlotRandomness`` (design §6), so a replayed slot draws the same noise; nothing here seeds or
keeps a generator of its own.

The draws are NumPy's inverse-CDF doubles. A production deployment that must resist the
floating-point attacks on textbook Laplace sampling (spec §9.6) needs a snapping or discrete
sampler behind this same interface; no mechanism calls ``Generator.laplace`` directly.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray


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


def laplace(rng: np.random.Generator, scale: float, size: int) -> NDArray[np.float64]:
    """``size`` i.i.d. draws of ``Lap(scale)``, i.e. ``Lap(b)^size`` with ``b = scale``."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"Laplace scale must be a positive finite number, got {scale!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size!r}")
    return rng.laplace(0.0, scale, size)


def laplace_mechanism(
    values: ArrayLike, sensitivity: float, epsilon: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``values + Lap(Δ/ε)^d``: the ε-DP Laplace mechanism on a ``d``-vector of L1 sensitivity
    ``Δ`` (spec §2.1)."""
    v = np.asarray(values, dtype=np.float64)
    return v + laplace(rng, laplace_scale(sensitivity, epsilon), v.size).reshape(v.shape)
