"""User-level privacy loss over slots: event-level methods against DPI (spec ``dpi.md`` §7,
Table 3 and Fig. 14; hypothesis H9).

**Baselines (event-level).** A baseline releases one count-like statistic per slot with Laplace
noise of scale ``b = 1/ε₀`` calibrated to its own event-level assumption (sensitivity 1, ε₀ = 0.5
per release). Against a user present at every slot the sensitivity is larger: ``Δ(t)``, the L1
sensitivity to that user of the ``t`` releases together, grows with the slots (Table 3: 7 after
5 slots, 67 after 50 for a median of packets). The default growth is the line through those two
points, ``Δ(t) = (4t + 1)/3`` (a parameter: any non-decreasing ``t ↦ Δ(t)``); slot ``s`` then
moves its release by ``δ_s = Δ(s) − Δ(s−1)``, so it is the Laplace mechanism with noise multiplier
``b/δ_s``. The user-level loss after ``t`` slots is the Rényi-DP of those ``t`` Laplace
mechanisms composed (Mironov 2017), converted to ``(ε, δ)``-DP, computed with the maintained
``dp-accounting`` library (``RdpAccountant``, add-or-remove neighbours, its default orders
1.1…10.9, 11…63, 128, 256, 512, 1024) at ``δ = 1e−5``. The paper gives neither the orders nor δ,
so the trend is the target, not its digits: above ε₀ within a few slots and growing without
bound (asymptotically linearly in ``t``). Basic composition, ``ε₀·Δ(t)`` (pure DP), is given
beside it.

**DPI (user-level).** DPI's loss after ``t`` slots is its nominal series spend ``Σ ε_{i_s}``: the
elements RBA drew (``mechanisms.dpi_rba``, seeded) from the series of ``mechanisms.dpi_series``
for the stream's ``DpiConfig`` at ε = 0.5, capped at ε by construction (pure ε-DP over the
lifetime; Δ_Q = 2 whatever the user sends).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from privstream.mechanisms.dpi import DpiConfig
from privstream.mechanisms.dpi_rba import Alg3State, Alg4State, RbaState, draw
from privstream.mechanisms.ledger import budget_limit

EPSILON_RELEASE: Final = 0.5
"""ε₀ of one event-level release (Table 3) and DPI's total ε in the comparison."""
DELTA: Final = 1e-5
"""δ of the (ε, δ) conversion (the paper states none)."""
TABLE_SLOTS: Final = (5, 50)
"""Table 3's columns."""
CURVE_SLOTS: Final = 3000
"""Fig. 14's horizon in slots."""

Growth = Callable[[int], float]


def table3_growth(t: int) -> float:
    """``Δ(t) = (4t + 1)/3``: user-level sensitivity after ``t`` slots, the line through Table 3's
    (5, 7) and (50, 67)."""
    return (4.0 * t + 1.0) / 3.0


@dataclass(frozen=True)
class LossPoint:
    """The loss after ``slots`` slots: the user-level sensitivity, the RDP-derived ε at ``δ``
    with the order that attains it, and basic (pure) composition ``ε₀·Δ(t)``."""

    slots: int
    sensitivity: float
    epsilon: float
    order: float
    pure_epsilon: float

    @property
    def tightest(self) -> float:
        """The smaller of the two bounds (both hold; RDP wins past a few slots)."""
        return min(self.epsilon, self.pure_epsilon)


def _accountant() -> Any:
    try:
        from dp_accounting.rdp import rdp_privacy_accountant as rdp
    except ImportError as exc:  # dev-side: the bench, not the runtime
        raise ImportError(
            "the privacy-loss comparison needs dp-accounting: pip install 'privstream[dev]'"
        ) from exc
    return rdp.RdpAccountant()


def baseline_loss(
    slots: Sequence[int],
    epsilon_release: float = EPSILON_RELEASE,
    delta: float = DELTA,
    growth: Growth = table3_growth,
) -> list[LossPoint]:
    """An event-level Laplace baseline's user-level loss after each of ``slots`` (increasing):
    the RDP of slot ``s``'s Laplace mechanism (multiplier ``(1/ε₀)/δ_s``) composed over slots
    ``1..t`` and converted to ε at ``delta``."""
    from dp_accounting import dp_event

    wanted = sorted(set(slots))
    accountant, scale, previous, out = _accountant(), 1.0 / epsilon_release, 0.0, []
    for s in range(1, wanted[-1] + 1 if wanted else 1):
        sensitivity = growth(s)
        step = sensitivity - previous
        if step < 0:
            raise ValueError(f"growth must not decrease: Δ({s}) = {sensitivity} < {previous}")
        if step > 0:
            accountant.compose(dp_event.LaplaceDpEvent(noise_multiplier=scale / step))
        previous = sensitivity
        if s in wanted:
            eps, order = accountant.get_epsilon_and_optimal_order(delta)
            out.append(LossPoint(s, sensitivity, float(eps), float(order),
                                 epsilon_release * sensitivity))  # fmt: skip
    return out


def dpi_loss(
    slots: Sequence[int], epsilon: float = EPSILON_RELEASE, seed: int = 0, **options: Any
) -> list[float]:
    """DPI's nominal lifetime spend after each of ``slots``: RBA's draws (``seed``) from the
    series of ``DpiConfig(epsilon, **options)``; an element that would pass ε is not spent."""
    cfg = DpiConfig(epsilon=epsilon, window=1, population=1, **options)
    series = cfg.series()
    state: RbaState = (Alg3State(series, cfg.rba_rate) if cfg.rba == "alg3"
                       else Alg4State(series))  # fmt: skip
    rng, spent, wanted, out = np.random.default_rng(seed), 0.0, set(slots), []
    for t in range(1, max(wanted, default=0) + 1):
        element = draw(state, rng)
        charge = 0.0 if element.exhausted else series.nominal_charge(element.series_index)
        if spent + charge <= budget_limit(epsilon):
            spent += charge
        if t in wanted:
            out.append(spent)
    return out


def privacy_loss(
    slots: Sequence[int] = TABLE_SLOTS,
    epsilon: float = EPSILON_RELEASE,
    delta: float = DELTA,
    growth: Growth = table3_growth,
    seed: int = 0,
) -> dict[str, Any]:
    """Table 3's analogue (and, over ``range(1, 3001)``, Fig. 14's curves): per slot count, the
    event-level baseline's sensitivity and user-level loss, and DPI's (Δ_Q, spend ≤ ε)."""
    points = baseline_loss(slots, epsilon, delta, growth)
    spend = dpi_loss([p.slots for p in points], epsilon, seed)
    return {
        "epsilon": epsilon,
        "delta": delta,
        "orders": "dp-accounting RdpAccountant defaults (1.1..10.9 by 0.1, 11..63, 128..1024)",
        "dpi_sensitivity": DpiConfig(epsilon=epsilon, window=1, population=1).delta_q,
        "rows": [{"slots": p.slots, "sensitivity": p.sensitivity, "epsilon": p.epsilon,
                  "order": p.order, "pure_epsilon": p.pure_epsilon, "tightest": p.tightest,
                  "dpi_spent": d}
                 for p, d in zip(points, spend, strict=True)],
    }  # fmt: skip


def privacy_loss_curve(slots: int = CURVE_SLOTS, **kw: Any) -> dict[str, Any]:
    """Fig. 14's curves: ``privacy_loss`` at every slot ``1..slots``."""
    return privacy_loss(range(1, slots + 1), **kw)


def format_privacy_loss(result: dict[str, Any]) -> str:
    """The table as text: one row per slot count, the baseline's and DPI's columns."""
    lines = [
        f"User-level privacy loss (Table 3 / Fig. 14 analogue): event-level Laplace at "
        f"ε₀ = {result['epsilon']:g} per release vs DPI at ε = {result['epsilon']:g}; "
        f"RDP → (ε, δ = {result['delta']:g}), orders: {result['orders']}",
        f"{'slots':>7} {'Δ user':>8} {'ε (RDP)':>10} {'order':>6} {'ε₀·Δ':>9} {'ε (min)':>9} "
        f"{'DPI Δ_Q':>8} {'DPI ε spent':>12}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['slots']:>7} {r['sensitivity']:>8.3g} {r['epsilon']:>10.4f} {r['order']:>6.3g} "
            f"{r['pure_epsilon']:>9.4g} {r['tightest']:>9.4f} {result['dpi_sensitivity']:>8.3g} {r['dpi_spent']:>12.4g}"
        )
    return "\n".join(lines)
