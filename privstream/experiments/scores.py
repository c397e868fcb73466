"""Utility of releases: the error metrics the papers report, and one mechanism's run to score.

Engine-free numeric code shared by the bench harness and the tests. LDP-IDS (spec ldp-ids
§5.3): ``mre`` (primary), ``mae``, ``mse`` and ``bits_per_user``. Personalized w-event (spec
personalized-w-event §6.4): ``amre`` (the per-bin squared error of released counts), ``ajsd``
and ``reductions``. A family's registry entry names which of them its bench reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _pair(
    estimates: ArrayLike, truth: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r = np.asarray(estimates, dtype=np.float64)
    c = np.asarray(truth, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    if c.ndim == 1:
        c = c[:, None]
    if r.shape != c.shape or r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(
            f"estimates and truth must be non-empty T×d arrays of one shape, got {r.shape} and {c.shape}"
        )
    return r, c


def mre(estimates: ArrayLike, truth: ArrayLike, delta: float) -> float:
    """Mean relative error (spec §5.3.1, A27).

    ``MRE = (1/T) Σ_t (1/d) Σ_k |r_t[k] − c_t[k]| / max(|c_t[k]|, δ)`` over ``T×d`` arrays of
    releases ``r`` and truths ``c``. The spec's default is ``δ = 1/n`` (one user in count
    units); ``10⁻³`` is its robustness variant. For a mean (``d = 1``) the denominator is
    ``max(|c_t|, δ)``, which the absolute value covers. One-dimensional inputs are ``T×1``.
    """
    if not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be a positive finite number, got {delta!r}")
    r, c = _pair(estimates, truth)
    return float(np.mean(np.abs(r - c) / np.maximum(np.abs(c), delta)))


def mae(estimates: ArrayLike, truth: ArrayLike) -> float:
    """Mean absolute error ``(1/T) Σ_t mean_k |r_t[k] − c_t[k]|`` (spec §5.3.2)."""
    r, c = _pair(estimates, truth)
    return float(np.mean(np.abs(r - c)))


def mse(estimates: ArrayLike, truth: ArrayLike) -> float:
    """Mean squared error ``(1/T) Σ_t mean_k (r_t[k] − c_t[k])²`` (spec §5.3.2; the quantity
    of the closed forms in §4.2)."""
    r, c = _pair(estimates, truth)
    return float(np.mean((r - c) ** 2))


def bits_per_user(total_bits: int | float, users: int, slots: int) -> float:
    """Time-average communication bits per user ``(1/(n·T)) Σ_t Σ_reports (b + instr)``
    (spec §5.3.4); ``total_bits`` is the sum of the releases' ``bits``."""
    if users < 1 or slots < 1:
        raise ValueError(f"users and slots must be >= 1, got users={users}, slots={slots}")
    return float(total_bits) / (users * slots)


def amre(estimates: ArrayLike, truth: ArrayLike) -> float:
    """``AMRE = (1/T)·Σ_τ (1/d)·‖r_τ − c_τ‖²`` (Eq. 15): despite its name the per-bin mean
    squared error of the released counts, averaged over slots (A28)."""
    r, c = _pair(estimates, truth)
    return float(np.mean((r - c) ** 2))


def ajsd(estimates: ArrayLike, truth: ArrayLike) -> float:
    """``AJSD = (1/T)·Σ_τ JSD(r_τ ‖ c_τ)`` (Eq. 16, A29): negative releases clamped to 0, both
    vectors normalised to sum 1 (slots where either sums to 0 are skipped), natural log,
    ``0·log 0 = 0``. NaN when every slot is skipped."""
    r, c = _pair(estimates, truth)
    r = np.maximum(r, 0.0)
    rs, cs = r.sum(axis=1), c.sum(axis=1)
    keep = (rs > 0) & (cs > 0)
    if not keep.any():
        return math.nan
    p = r[keep] / rs[keep, None]
    q = c[keep] / cs[keep, None]
    v = (p + q) / 2

    def kl(a: NDArray[np.float64]) -> NDArray[np.float64]:
        # where a > 0, v ≥ a/2 > 0; elsewhere the term is 0·log 0 = 0
        ratio = np.where(a > 0, a / np.where(v > 0, v, 1.0), 1.0)
        out: NDArray[np.float64] = np.sum(a * np.log(ratio), axis=1)
        return out

    return float(np.mean(0.5 * kl(p) + 0.5 * kl(q)))


def reductions(base: float, ours: float) -> dict[str, float]:
    """Spec §6.4: "X % less error" ``(base − ours)/base`` and "Y % in ln(AMRE)"
    ``(ln base − ln ours)/ln base``."""
    return {
        "amre": (base - ours) / base,
        "ln_amre": (math.log(base) - math.log(ours)) / math.log(base),
    }


@dataclass(frozen=True)
class Run:
    """One mechanism over one stream: the releases ``r_t`` (``estimates``, ``T×d``), the truth
    ``c_t`` in the same units, each slot's strategy, the total communication bits (from the
    releases' details, 0 where a family reports none), the number of fresh publications and
    the seconds spent in the mechanism's steps (client simulation included, data generation
    excluded), in total and per slot."""

    mechanism: str
    stream: str
    epsilon: float
    window: int
    seed: int
    users: int
    estimates: NDArray[np.float64] = field(repr=False)
    truth: NDArray[np.float64] = field(repr=False)
    strategies: tuple[str, ...] = field(repr=False)
    total_bits: int
    seconds: float
    slot_seconds: NDArray[np.float64] = field(repr=False)

    @property
    def slots(self) -> int:
        return int(self.estimates.shape[0])

    @property
    def publications(self) -> int:
        return sum(s == "publish" for s in self.strategies)

    @property
    def bits_per_user(self) -> float:
        return bits_per_user(self.total_bits, self.users, self.slots)

    def mre(self, delta: float | None = None) -> float:
        """MRE with ``δ = 1/n`` unless given (spec ldp-ids §5.3.1)."""
        return mre(self.estimates, self.truth, 1 / self.users if delta is None else delta)

    def mae(self) -> float:
        return mae(self.estimates, self.truth)

    def mse(self) -> float:
        return mse(self.estimates, self.truth)

    def amre(self) -> float:
        return amre(self.estimates, self.truth)

    def ajsd(self) -> float:
        return ajsd(self.estimates, self.truth)


def ldp_ids_scores(run: Run) -> dict[str, float]:
    """What the LDP-IDS bench reports per mechanism (spec ldp-ids §5.3)."""
    return {
        "mre": run.mre(),
        "mae": run.mae(),
        "bits_per_user": run.bits_per_user,
        "publications": float(run.publications),
        "seconds": run.seconds,
    }


def personalized_scores(run: Run) -> dict[str, float]:
    """What the personalized bench reports per mechanism (spec personalized-w-event §6.4);
    ``ln_amre`` is averaged over seeds by the harness like every other field."""
    err = run.amre()
    return {
        "amre": err,
        "ln_amre": math.log(err) if err > 0 else -math.inf,
        "ajsd": run.ajsd(),
        "publications": float(run.publications),
        "seconds": run.seconds,
    }


def cgm_scores(run: Run) -> dict[str, float]:
    """What the CGM bench reports per mechanism (spec cgm §6.3, A1): ``mse``, the squared error
    of the released population mean averaged over slots (MSE_agg); ``mse_stable``, the same over
    the second half of the slots (after the noise chain settles)."""
    half = run.slots // 2
    return {
        "mse": run.mse(),
        "mse_stable": mse(run.estimates[half:], run.truth[half:]),
        "publications": float(run.publications),
        "seconds": run.seconds,
    }
