"""Feedback control for adaptive samplers: a PID controller and a per-bin Kalman filter
(spec ``ldp-ids.md`` §3.8–§3.9; DSAT_w and RescueDP adapted to LDP).

Both are post-processing. Their inputs are public numbers (publication counts, the public
configuration) and earlier releases; the only measurement a Kalman correction takes is an
LDP estimate that was just released through the filter. So whatever they decide costs no
budget beyond the reports they are fed, and nothing here may read a raw value: the process
variance ``Q`` is a public prior from the configuration and the measurement variance ``R`` is
the frequency oracle's known variance ``V(ε, m)`` — never a statistic of the raw stream (the
public ``streamdp-benchmark`` port takes ``Q`` from the raw data, which leaks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Pid:
    """A PID controller ``θ = (K_p, K_i, K_d, π)`` (spec §3.8 line 7, §3.9 line 7).

    ``output(history, error, dt)`` is ``K_p·e + K_i·(1/π)·Σ(last π errors, this one
    included) + K_d·(e − e_prev)/dt``; errors before the first one count as zero (the literal
    ``1/π`` normalisation), and the derivative term is zero at the first error.
    """

    kp: float
    ki: float
    kd: float
    span: int

    def __post_init__(self) -> None:
        gains = (self.kp, self.ki, self.kd)
        if not all(np.isfinite(g) and g >= 0 for g in gains):
            raise ValueError(f"PID gains (K_p, K_i, K_d) must be finite and >= 0, got {gains}")
        if not isinstance(self.span, int) or self.span < 1:
            raise ValueError(f"the PID integral span π must be an integer >= 1, got {self.span!r}")

    def output(
        self, history: Sequence[float], error: float, dt: float = 1.0
    ) -> tuple[float, tuple[float, ...]]:
        """The control output for ``error`` and the history to keep (the last π errors)."""
        kept = (*history, float(error))[-self.span :]
        integral = sum(kept) / self.span
        derivative = (error - history[-1]) / dt if history else 0.0
        return self.kp * error + self.ki * integral + self.kd * derivative, kept


def kalman_predict(variance: NDArray[np.float64], process: float) -> NDArray[np.float64]:
    """The prior variance ``P⁻ = P + Q`` of a random-walk model (the state itself is carried:
    the prediction of the next value is the current estimate)."""
    return variance + process


def kalman_correct(
    prior: NDArray[np.float64],
    prior_variance: NDArray[np.float64],
    measurement: NDArray[np.float64],
    noise: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per-bin correction with measurement variance ``R = noise``: the gain
    ``K = P⁻/(P⁻ + R)``, the posterior ``x̂ = x̃ + K(z − x̃)`` and ``P = (1 − K)P⁻``."""
    gain = prior_variance / (prior_variance + noise)
    posterior = prior + gain * (measurement - prior)
    return posterior, (1.0 - gain) * prior_variance, gain
