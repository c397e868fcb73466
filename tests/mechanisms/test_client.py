"""SimulatedClientPort: the privacy boundary of the ldp-simulated mode (spec §6.2, design §4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from privstream.mechanisms.client import ABSENT, SimulatedClientPort, absent_mask
from privstream.mechanisms.oracles import GRR, OUE
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask, MeanTask

Z = 4.0


def port(
    values: NDArray[np.int64] | NDArray[np.float64],
    task: FrequencyTask | MeanTask,
    slot: int = 1,
    path: str = "aggregate",
    secret: int = 99,
    stream: str = "stream",
) -> SimulatedClientPort:
    randomness = SlotRandomness(secret, stream, slot)
    return SimulatedClientPort(values, task, randomness, path=path)  # type: ignore[arg-type]


def chi2_same_distribution(
    a: NDArray[np.float64], b: NDArray[np.float64], min_count: int = 20
) -> float:
    """p-value of a chi-square homogeneity test of two discrete samples (sparse values merged)."""
    values = np.union1d(a, b)
    rows: list[list[int]] = []
    acc = [0, 0]
    for v in values:
        acc = [acc[0] + int(np.count_nonzero(a == v)), acc[1] + int(np.count_nonzero(b == v))]
        if sum(acc) >= min_count:
            rows.append(acc)
            acc = [0, 0]
    rows[-1] = [rows[-1][0] + acc[0], rows[-1][1] + acc[1]]
    assert len(rows) >= 5
    return float(stats.chi2_contingency(np.array(rows).T)[1])


# -- both paths agree in distribution over many slots --------------------------------------------


@pytest.mark.parametrize(("d", "eps", "oracle"), [(5, 1.0, "GRR"), (20, 1.0, "OUE")])
def test_paths_agree_in_distribution(d: int, eps: float, oracle: str) -> None:
    task = FrequencyTask(d)
    values = np.arange(60) % (d - 2)  # the last two values hold no user
    values[::7] = ABSENT  # and some users are absent
    users = np.flatnonzero(values != ABSENT)[::2]
    slots = 3000
    est = {path: np.empty((slots, d)) for path in ("aggregate", "per-user")}
    for path, out in est.items():
        for t in range(1, slots + 1):
            agg = port(values, task, t, path).collect(users, eps, "m2")
            assert agg.oracle == oracle and agg.reports == users.shape[0]
            out[t - 1] = agg.estimate
    m = users.shape[0]
    c = np.bincount(values[users], minlength=d) / m
    var = GRR(d).variance if oracle == "GRR" else OUE(d).variance
    e = math.exp(eps)
    per_coord = (
        (d - 2 + e) / (m * (e - 1) ** 2) + c * (d - 2) / (m * (e - 1))
        if oracle == "GRR"
        else 4 * e / (m * (e - 1) ** 2) + c / m
    )
    assert float(per_coord.mean()) == pytest.approx(var(eps, m), rel=1e-12)
    for out in est.values():
        assert np.all(np.abs(out.mean(axis=0) - c) < Z * np.sqrt(per_coord / slots))
        # per-coordinate variance, relative sd sqrt(2/(R-1)) each; Bonferroni over d coordinates
        z = stats.norm.isf(0.5e-4 / d)
        assert np.all(
            np.abs(out.var(axis=0, ddof=1) / per_coord - 1) < z * math.sqrt(2 / (slots - 1))
        )
    for k in (0, 1, d - 1):
        a, b = np.round(est["aggregate"][:, k], 9), np.round(est["per-user"][:, k], 9)
        assert chi2_same_distribution(a, b) > 1e-3


# -- eligibility, counts, bits ------------------------------------------------------------------


def test_collect_all_uses_only_eligible_users_int_values() -> None:
    values = np.array([0] * 60 + [ABSENT] * 40 + [1] * 100)
    p = port(values, FrequencyTask(2))
    assert p.population == 200
    assert np.array_equal(p.eligible(), values != ABSENT)
    # At ε = 20 GRR flips a report w.p. 2e-9: the estimate is the eligible users' histogram.
    for path in ("aggregate", "per-user"):
        agg = port(values, FrequencyTask(2), path=path).collect(None, 20.0, "m1")
        assert agg.reports == 160 and agg.report_bits == 160 and agg.oracle == "GRR"
        assert agg.estimate == pytest.approx(np.array([60 / 160, 100 / 160]), abs=1e-6)


def test_collect_all_uses_only_eligible_users_float_values() -> None:
    values = np.array([0.0] * 30 + [np.nan] * 50 + [2.0] * 20 + [1.0] * 50)
    task = FrequencyTask(3)
    p = port(values, task, path="per-user")
    assert np.array_equal(p.eligible(), ~np.isnan(values))
    agg = p.collect(None, 25.0, "m1")
    assert agg.reports == 100
    assert agg.estimate == pytest.approx(np.array([0.3, 0.5, 0.2]), abs=1e-6)
    agg = port(values, task).collect(None, 25.0, "m1")
    assert agg.estimate == pytest.approx(np.array([0.3, 0.5, 0.2]), abs=1e-6)


def test_mean_task_collect_uses_only_eligible_users() -> None:
    values = np.array([10.0] * 40 + [np.nan] * 60 + [0.0] * 10 + [4.0] * 50)
    task = MeanTask(lower=0.0, upper=10.0)
    agg = port(values, task).collect(None, 40.0, "m2")
    # At ε = 40 HM is PM w.p. 1 − e^{-20}, whose report lies within (C − 1) ≈ 4e-9 of x.
    assert agg.reports == 100 and agg.oracle == "HM" and agg.report_bits == 64 * 100
    assert agg.estimate == pytest.approx(np.array([(400 + 200) / 100]), abs=1e-6)
    assert np.array_equal(absent_mask(values), np.isnan(values))
    assert np.array_equal(absent_mask(np.array([3, -1, 0])), np.array([False, True, False]))


@pytest.mark.parametrize(
    ("d", "eps", "oracle", "bits"),
    [
        (2, 1.0, "GRR", 1),
        (5, 1.0, "GRR", 3),
        (9, 3.0, "GRR", 4),
        (20, 1.0, "OUE", 20),
        (77, 1.0, "OUE", 77),
    ],
)
def test_reports_and_bits(d: int, eps: float, oracle: str, bits: int) -> None:
    values = np.arange(500) % d
    values[:13] = ABSENT
    for path in ("aggregate", "per-user"):
        p = port(values, FrequencyTask(d), path=path)
        agg = p.collect(np.arange(100, 300), eps, "m2")
        assert (agg.reports, agg.report_bits, agg.oracle) == (200, 200 * bits, oracle)
        agg = p.collect(None, eps, "m1")
        assert (agg.reports, agg.report_bits) == (487, 487 * bits)
        agg = p.collect(np.array([], dtype=np.int64), eps, "x")
        assert (agg.reports, agg.report_bits) == (0, 0)
        assert np.array_equal(agg.estimate, np.zeros(d))


def test_collecting_an_absent_user_raises() -> None:
    values = np.array([0, 1, ABSENT, 1])
    with pytest.raises(ValueError, match="without a current value"):
        port(values, FrequencyTask(2)).collect(np.array([0, 2]), 1.0, "m2")
    with pytest.raises(ValueError, match="without a current value"):
        port(np.array([0.5, np.nan]), MeanTask(0.0, 1.0)).collect(np.array([1]), 1.0, "m2")


def test_invalid_path_rejected() -> None:
    with pytest.raises(ValueError, match="path"):
        port(np.array([0, 1]), FrequencyTask(2), path="fast")


# -- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["aggregate", "per-user"])
@pytest.mark.parametrize(
    "task", [FrequencyTask(5), FrequencyTask(30), MeanTask(0.0, 4.0)], ids=repr
)
def test_same_randomness_same_aggregate(path: str, task: FrequencyTask | MeanTask) -> None:
    rng = np.random.default_rng(3)
    values = (
        rng.integers(0, 4, size=400) if task.kind == "frequency" else rng.uniform(0, 5, size=400)
    )
    users = np.sort(rng.choice(400, size=150, replace=False))
    a = port(values, task, 7, path).collect(users, 0.8, "m1")
    b = port(values.copy(), task, 7, path).collect(users.copy(), 0.8, "m1")
    assert np.array_equal(a.estimate, b.estimate)
    assert (a.reports, a.report_bits, a.oracle) == (b.reports, b.report_bits, b.oracle)
    # Asking twice in one slot for one purpose replays the same reports (replay safety) ...
    p = port(values, task, 7, path)
    assert np.array_equal(
        p.collect(users, 0.8, "m1").estimate, p.collect(users, 0.8, "m1").estimate
    )
    # ... while another purpose, slot, stream or secret draws different reports.
    others = [
        port(values, task, 7, path).collect(users, 0.8, "m2"),
        port(values, task, 8, path).collect(users, 0.8, "m1"),
        port(values, task, 7, path, stream="other").collect(users, 0.8, "m1"),
        port(values, task, 7, path, secret=100).collect(users, 0.8, "m1"),
    ]
    for other in others:
        assert not np.array_equal(other.estimate, a.estimate)
