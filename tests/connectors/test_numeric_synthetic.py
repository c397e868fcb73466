"""The synthetic substitutes of the CGM datasets (S0 sine, S1 web traffic, S2 taxi).

The statistic bands come from the reference values of the spec's prototype (S1: about 18.4k of
20k pages kept, aggregate mean ≈ 697, largest daily aggregate move ≈ 64, about 6 % of user-days
moving by more than 500; S2: slot means 0.08–0.11, largest aggregate move ≈ 0.021), widened to
cover both the spread of this generator over seeds 0–19 and the freedom the spec leaves in the
details (sampling instant, per-leg speed). Seeds 0–19 gave, for S1: 18 292–18 468 pages kept
(the binomial spread alone is ±40), aggregate mean 681–708, largest move 62.7–67.4, share of
large moves 5.9–6.3 %; for S2: slot means 0.079–0.122 (the top one is a warm-up peak in slot 2,
before the mobility settles into its stationary mix of driving and pausing), day mean
0.090–0.093, largest move 0.012–0.028.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privstream.connectors.numeric_synthetic import (
    NumericStream,
    SineStream,
    TaxiStream,
    WebTrafficStream,
    numeric_dataset,
)
from privstream.experiments.harness import task_for
from privstream.mechanisms.tasks import MeanTask


@pytest.fixture(scope="module")
def web() -> WebTrafficStream:
    return WebTrafficStream(seed=0)


@pytest.fixture(scope="module")
def taxi() -> TaxiStream:
    return TaxiStream(seed=0)


def aggregate(stream: NumericStream) -> np.ndarray:
    return np.array([stream.truth(slot)[0] for slot in range(1, stream.slots + 1)])


def test_sine_steps_stay_within_c_tilde_and_values_within_half() -> None:
    for c_tilde in (0.01, 0.025, 0.05, 0.1):
        stream = SineStream(users=300, slots=400, seed=3, c_tilde=c_tilde)
        assert 2 * math.pi * stream.amplitude / stream.period <= c_tilde
        assert np.abs(np.diff(stream.matrix, axis=0)).max() <= c_tilde
        assert np.abs(stream.matrix).max() <= 0.5
    assert (stream.name, stream.users, stream.slots, stream.d, stream.numeric) == (
        "sine",
        300,
        400,
        1,
        True,
    )
    assert stream.bounds == (-0.5, 0.5)


def test_sine_rejects_a_period_too_short_for_c_tilde() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        SineStream(users=10, slots=10, c_tilde=0.05, amplitude=0.5, period=20)
    with pytest.raises(ValueError, match="amplitude"):
        SineStream(users=10, slots=10, amplitude=0.6)


def test_web_traffic_statistics_match_the_spec(web: WebTrafficStream) -> None:
    assert web.requested_users == 20000
    assert 17500 <= web.users <= 19300  # spec ≈ 18.4k, ±5 %
    assert web.slots == 550
    agg = aggregate(web)
    assert 650 <= agg.mean() <= 745  # spec ≈ 697
    assert 55 <= np.abs(np.diff(agg)).max() <= 75  # spec ≈ 64
    big_moves = (np.abs(np.diff(web.matrix, axis=0)) > 500).mean()
    assert 0.05 <= big_moves <= 0.07  # spec ≈ 6 %


def test_web_traffic_values_are_whole_views_inside_the_domain(web: WebTrafficStream) -> None:
    lo, hi = web.bounds
    assert (lo, hi) == (0.0, 20000.0)
    assert web.matrix.min() >= lo
    assert web.matrix.max() <= hi
    assert np.array_equal(web.matrix, np.round(web.matrix))
    assert web.values(7).shape == (web.users,)
    assert web.values(7).dtype == np.float64


def test_taxi_statistics_match_the_spec(taxi: TaxiStream) -> None:
    assert (taxi.users, taxi.slots, taxi.bounds) == (5000, 48, (0.0, 1.0))
    agg = aggregate(taxi)
    assert agg.min() >= 0.07  # spec 0.08–0.11, widened
    assert agg.max() <= 0.13  # spec 0.08–0.11, plus the warm-up peak
    assert 0.085 <= agg.mean() <= 0.10
    assert 0.010 <= np.abs(np.diff(agg)).max() <= 0.030  # spec ≈ 0.021
    assert taxi.matrix.min() >= 0.0
    assert taxi.matrix.max() <= 1.0


def test_taxi_continues_over_consecutive_days() -> None:
    one_day = TaxiStream(users=50, seed=4)
    two_days = TaxiStream(users=50, slots=96, seed=4)
    assert np.array_equal(two_days.matrix[:48], one_day.matrix)


def test_same_seed_same_values_other_seed_other_values() -> None:
    for name in ("sine", "webtraffic", "taxi"):
        first = numeric_dataset(name, users=200, slots=48, seed=1)
        again = numeric_dataset(name, users=200, slots=48, seed=1)
        other = numeric_dataset(name, users=200, slots=48, seed=2)
        assert first.name == name
        assert np.array_equal(first.matrix, again.matrix)
        assert not np.array_equal(first.matrix[:, :10], other.matrix[:, :10])


def test_truth_is_the_population_mean_and_slots_are_one_based() -> None:
    stream = numeric_dataset("webtraffic", users=300, slots=20, seed=5)
    assert stream.truth(20).shape == (1,)
    assert stream.truth(20)[0] == pytest.approx(float(stream.values(20).mean()))
    for bad in (0, 21):
        with pytest.raises(ValueError, match="slot"):
            stream.values(bad)
    assert len(list(stream)) == 20


def test_harness_reads_a_mean_task_over_the_public_domain() -> None:
    task = task_for(numeric_dataset("taxi", users=20, slots=2, seed=0))
    assert isinstance(task, MeanTask)
    assert (task.lower, task.upper) == (0.0, 1.0)


def test_factory_rejects_unknown_names_and_empty_sizes() -> None:
    with pytest.raises(ValueError, match="unknown numeric dataset"):
        numeric_dataset("kaggle", users=10, slots=10, seed=0)
    with pytest.raises(ValueError, match="users and slots"):
        numeric_dataset("sine", users=0, slots=10, seed=0)
