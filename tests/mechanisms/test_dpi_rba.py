"""DPI's Random Budget Allocation (``mechanisms.dpi_rba``): Algorithms 3 and 4, spec dpi §3.4–3.5."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.mechanisms.dpi_rba import (
    EXHAUSTED,
    Alg3State,
    Alg4State,
    draw,
    nearest_unused,
)
from privstream.mechanisms.dpi_series import BudgetSeries

SERIES = BudgetSeries(2.0, 0.05, 0.1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rate=st.sampled_from([1e2, 1e4, 1e8]),
    slots=st.integers(1, 400),
)
def test_alg3_indices_unique(seed: int, rate: float, slots: int) -> None:
    state = Alg3State(SERIES, rate=rate)
    rng = np.random.default_rng(seed)
    draws = [draw(state, rng) for _ in range(slots)]
    indices = [d.series_index for d in draws]
    assert len(set(indices)) == slots  # I5
    assert state.n_used == slots
    assert all(d.epsilon == SERIES.epsilon_i(d.series_index) for d in draws)
    assert all(state.is_used(i) for i in indices)
    assert math.fsum(d.epsilon for d in draws) < SERIES.epsilon


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), slots=st.integers(1, 3000))
def test_alg4_indices_unique(seed: int, slots: int) -> None:
    state = Alg4State(SERIES, blocks=((1, 50), (50, 120), (120, None)))
    rng = np.random.default_rng(seed)
    indices = [draw(state, rng).series_index for _ in range(slots)]
    assert len(set(indices)) == slots and min(indices) >= 1


def test_alg3_nearest_unused_in_value_ties_to_larger() -> None:
    state = Alg3State(SERIES)
    assert nearest_unused(state, SERIES.epsilon_i(10)) == 10  # exact hit: ε_10 is not > ε_10
    midpoint = (SERIES.epsilon_i(10) + SERIES.epsilon_i(11)) / 2
    above = SERIES.epsilon_i(10) - midpoint
    below = midpoint - SERIES.epsilon_i(11)
    assert nearest_unused(state, midpoint) == (11 if below <= above else 10)
    for i in (9, 10, 11, 12):
        state.mark_used(i)
    assert state.starts == [9] and state.ends == [12]
    e = SERIES.epsilon_i
    assert e(8) - e(10) > e(10) - e(13)  # ε_13 is nearer to ε_10 than ε_8 is
    assert nearest_unused(state, e(10)) == 13
    assert e(8) - e(9) < e(9) - e(13)
    assert nearest_unused(state, e(9)) == 8
    assert nearest_unused(state, SERIES.epsilon_i(12)) == 13
    assert nearest_unused(state, 5.0) == 1  # above ε_1: the largest value left
    state.mark_used(1)
    assert nearest_unused(state, 5.0) == 2


def test_alg3_spends_about_t_over_lambda() -> None:
    """2,700 slots at Λ = 1e8 spend ≈ Gamma(t, Λ): mean t/Λ = 2.7e-5, sd √t/Λ (spec §3.4)."""
    t, rate = 2700, 1e8
    state = Alg3State(SERIES, rate=rate)
    rng = np.random.default_rng(2024)
    spend = math.fsum(draw(state, rng).epsilon for _ in range(t))
    sd = math.sqrt(t) / rate
    assert abs(spend - t / rate) <= 4 * sd
    assert abs(spend - 2.74e-5) <= 4 * sd  # the spec's measurement
    # each ε_t is the series value nearest the exponential draw: spend ≈ Σ S to 1e-3 relative
    s = np.random.default_rng(2024).exponential(scale=1 / rate, size=t)
    assert spend == pytest.approx(math.fsum(s), rel=1e-3)
    assert SERIES.epsilon - spend > 1.99997


# Spec §3.5: remaining nominal budget after n slots, means over 5 seeds (budget_exact, default blocks).
ALG4_TABLE = {
    (2.0, 0.05, 0.1): ["1.056", "0.666", "0.510", "0.306", "0.0133"],
    (10.0, 0.05, 0.1): ["4.018", "1.803", "1.094", "0.445", "0.0133"],
    (2.0, 0.1, 0.2): ["0.846", "0.406", "0.257", "0.110", "0.0033"],
    (10.0, 0.3, 0.5): ["0.444", "0.082", "0.041", "0.015", "0.0004"],
    (2.0, 0.5, 1.0): ["0.133", "0.025", "0.012", "0.0045", "0.0001"],
}
ALG4_SLOTS = [100, 500, 1000, 2700, 30000]


@pytest.mark.parametrize("params", list(ALG4_TABLE))
def test_alg4_remaining_budget_table(params: tuple[float, float, float]) -> None:
    """Mean over seeds 0–4 within 4 standard errors (from the 5 seeds) + the printed precision."""
    series = BudgetSeries(*params)
    remaining = []
    for seed in range(5):
        state, rng = Alg4State(series), np.random.default_rng(seed)
        spent = np.cumsum([draw(state, rng).epsilon for _ in range(ALG4_SLOTS[-1])])
        remaining.append([series.epsilon - spent[n - 1] for n in ALG4_SLOTS])
    values = np.array(remaining)
    mean, se = values.mean(axis=0), values.std(axis=0, ddof=1) / math.sqrt(5)
    for column, printed in enumerate(ALG4_TABLE[params]):
        decimals = len(printed.partition(".")[2])
        tolerance = 4 * se[column] + 0.5 * 10.0**-decimals
        assert abs(mean[column] - float(printed)) <= tolerance, (ALG4_SLOTS[column], mean[column])
    assert np.all(values > 0)


def test_alg4_finite_blocks_exhaust() -> None:
    state = Alg4State(SERIES, blocks=((1, 4), (10, 12)))
    rng = np.random.default_rng(0)
    draws = [draw(state, rng) for _ in range(5)]
    assert sorted(d.series_index for d in draws) == [1, 2, 3, 10, 11]
    assert not any(d.exhausted for d in draws)
    before = rng.bit_generator.state
    assert draw(state, rng) == EXHAUSTED
    assert EXHAUSTED.exhausted and EXHAUSTED.epsilon == 0.0
    assert rng.bit_generator.state == before  # no randomness consumed once exhausted
    assert SERIES.step_sizes(EXHAUSTED.series_index) == (0.0, 0.0, 0.0, 0.0)


def test_alg4_fifo_order_within_blocks() -> None:
    state = Alg4State(SERIES)
    rng = np.random.default_rng(3)
    indices = [draw(state, rng).series_index for _ in range(3000)]
    for start, end in state.blocks:
        in_block = [i for i in indices if i >= start and (end is None or i < end)]
        assert in_block == list(range(start, start + len(in_block)))
    counts = [sum(1 for i in indices if s <= i and (e is None or i < e)) for s, e in state.blocks]
    sd = math.sqrt(3000 * (1 / 3) * (2 / 3))  # uniform among 3 non-empty blocks
    assert all(abs(c - 1000) <= 4 * sd for c in counts)


@pytest.mark.parametrize(
    ("blocks", "match"),
    [
        ((), "at least one block"),
        (((0, 5),), "start at ≥ 1"),
        (((1, 5), (4, 9)), "disjoint"),
        (((1, None), (5, 9)), "only the last"),
        (((1, 1),), "is empty"),
    ],
)
def test_alg4_invalid_blocks(blocks: tuple[tuple[int, int | None], ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Alg4State(SERIES, blocks=blocks)


def test_alg3_invalid_rate() -> None:
    with pytest.raises(ValueError, match="rba_lambda"):
        Alg3State(SERIES, rate=0.0)


@pytest.mark.parametrize("make", [lambda: Alg3State(SERIES, rate=1e4), lambda: Alg4State(SERIES)])
def test_pickle_mid_stream_continues_identically(make: object) -> None:
    state = make()  # type: ignore[operator]
    rng = np.random.default_rng(11)
    for _ in range(300):
        draw(state, rng)
    state_copy = pickle.loads(pickle.dumps(state))
    rng_copy = np.random.default_rng(0)
    rng_copy.bit_generator.state = rng.bit_generator.state
    original = [draw(state, rng) for _ in range(300)]
    resumed = [draw(state_copy, rng_copy) for _ in range(300)]
    assert original == resumed
    assert state == state_copy
