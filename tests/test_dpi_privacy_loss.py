"""The user-level privacy loss of event-level methods against DPI (spec dpi.md §7, Table 3 and
Fig. 14, H9): ``privstream.experiments.dpi_privacy_loss`` with ``dp-accounting``.

The baseline's RDP-derived ε is checked against the textbook bound computed here from Mironov
2017 (Prop. 6: the Laplace mechanism's RDP, composed by addition, converted with
``ε = min_α RDP(α) + log(1/δ)/(α−1)``); the library's conversion is at least as tight. Numbers
are pinned at the library's precision for δ = 1e−5 and its default orders.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privstream.experiments.dpi_privacy_loss import (
    DELTA,
    baseline_loss,
    dpi_loss,
    format_privacy_loss,
    privacy_loss,
    privacy_loss_curve,
    table3_growth,
)

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def _laplace_rdp(alpha: float, lam: float) -> float:
    """Mironov 2017 Prop. 6: RDP of order α of the Laplace mechanism with b/Δ = λ."""
    rest = (alpha - 1) / (2 * alpha - 1) * math.exp(-(2 * alpha - 1) / lam)  # b/a·α/(2α−1)
    return ((alpha - 1) / lam + math.log(alpha / (2 * alpha - 1) + rest)) / (alpha - 1)


def _textbook(t: int, eps0: float = 0.5) -> float:
    steps = [table3_growth(1)] + [table3_growth(s) - table3_growth(s - 1) for s in range(2, t + 1)]
    return min(
        sum(_laplace_rdp(a, (1 / eps0) / d) for d in steps) + math.log(1 / DELTA) / (a - 1)
        for a in ORDERS
    )


def test_table3_sensitivities_are_7_after_5_slots_and_67_after_50() -> None:
    assert [table3_growth(t) for t in (5, 50)] == [7.0, 67.0]


def test_table3_analogue_pins_and_trend() -> None:
    result = privacy_loss()
    five, fifty = result["rows"]
    assert (five["slots"], fifty["slots"]) == (5, 50) and result["delta"] == DELTA
    assert five["epsilon"] == pytest.approx(3.5001, abs=5e-4)
    assert fifty["epsilon"] == pytest.approx(25.7352, abs=5e-4)
    assert (five["pure_epsilon"], fifty["pure_epsilon"]) == (3.5, 33.5)
    assert (five["tightest"], fifty["tightest"]) == (3.5, fifty["epsilon"])  # min of the two
    assert five["epsilon"] <= _textbook(5) + 1e-9 and fifty["epsilon"] <= _textbook(50) + 1e-9
    assert fifty["epsilon"] > five["epsilon"] > 0.5  # above ε = 0.5 quickly, and growing
    assert result["dpi_sensitivity"] == 2.0
    assert five["dpi_spent"] == pytest.approx(2.27194247e-08, rel=1e-6)
    assert fifty["dpi_spent"] == pytest.approx(5.56909333e-07, rel=1e-6)
    text = format_privacy_loss(result)
    assert "δ = 1e-05" in text and "3.5001" in text and "25.7352" in text


def test_fig14_baseline_grows_without_bound_and_dpi_stays_under_epsilon() -> None:
    rows = privacy_loss_curve(3000)["rows"]
    base = np.array([r["epsilon"] for r in rows])
    spent = np.array([r["dpi_spent"] for r in rows])
    assert len(rows) == 3000 and base[0] > 0.5  # one release already passes ε = 0.5
    assert bool(np.all(np.diff(base) > 0)) and base[-1] > 600
    assert base[2999] - base[1999] > 0.8 * (base[1999] - base[999])  # ~ linear, no ceiling
    assert bool(np.all(np.diff(spent) >= 0)) and spent.max() <= 0.5


def test_a_user_of_one_slot_costs_one_release_however_long_the_stream() -> None:
    one, later = baseline_loss([1, 50], growth=lambda t: 1.0)
    assert later.epsilon == one.epsilon and one.pure_epsilon == 0.5
    assert one.epsilon <= _laplace_rdp(1024, 2.0) + math.log(1 / DELTA) / 1023 + 1e-9


def test_a_shrinking_sensitivity_is_refused() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        baseline_loss([3], growth=lambda t: 5.0 - t)


def test_dpi_spend_never_passes_epsilon_even_with_a_fast_series() -> None:
    spent = dpi_loss([10, 1000, 5000], epsilon=0.5, seed=3, zeta=10.0, rba="alg4")
    assert spent == sorted(spent) and spent[-1] <= 0.5
