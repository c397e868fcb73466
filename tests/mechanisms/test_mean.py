"""Mean estimation: SR, PM, HM and MeanTask (spec ldp-ids §2.7, §3.11; §7 items 1–2).

Every randomiser's output law is a mixture of point masses and uniform segments, written out
here from the spec. Its exact moments give the closed-form variances (checked against the
spec's formulas) and the standard errors of the Monte Carlo checks: the sample mean has variance
``σ²/N`` and the sample variance ``(μ₄ − σ⁴(N−3)/(N−1))/N``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privstream.mechanisms.mean import (
    HM,
    HM_SWITCH,
    MEAN_REPORT_BITS,
    hm_worst_variance,
    pm_perturb,
    pm_scale,
    sr_perturb,
    sr_scale,
)
from privstream.mechanisms.tasks import MeanTask

Z = 4.0
N = 100_000
XS = [-1.0, -0.3, 0.0, 0.8, 1.0]
EPSILONS = [0.3, 1.0, 2.0]

Component = tuple[float, float, float]  # (weight, a, b): uniform on [a, b], a point mass if a == b


def sr_law(x: float, eps: float) -> list[Component]:
    e = math.exp(eps)
    cs = (e + 1) / (e - 1)
    plus = 0.5 + x * (e - 1) / (2 * (e + 1))
    return [(plus, cs, cs), (1 - plus, -cs, -cs)]


def pm_law(x: float, eps: float) -> list[Component]:
    h = math.exp(eps / 2)
    c = (h + 1) / (h - 1)
    left = x * (c + 1) / 2 - (c - 1) / 2
    right = left + c - 1
    out = 1 / (h + 1)  # mass outside [ℓ, r], spread uniformly over [−C, ℓ) ∪ (r, C]
    return [
        (h / (h + 1), left, right),
        (out * (left + c) / (c + 1), -c, left),
        (out * (c - right) / (c + 1), right, c),
    ]


def hm_law(x: float, eps: float) -> list[Component]:
    if eps <= HM_SWITCH:
        return sr_law(x, eps)
    w_pm = 1 - math.exp(-eps / 2)
    return [(w_pm * w, a, b) for w, a, b in pm_law(x, eps)] + [
        ((1 - w_pm) * w, a, b) for w, a, b in sr_law(x, eps)
    ]


def raw_moment(law: list[Component], k: int) -> float:
    total = 0.0
    for w, a, b in law:
        total += w * (a**k if a == b else (b ** (k + 1) - a ** (k + 1)) / ((k + 1) * (b - a)))
    return total


def moments(law: list[Component]) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of a law."""
    m1, m2, m3, m4 = (raw_moment(law, k) for k in (1, 2, 3, 4))
    var = m2 - m1**2
    mu4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
    return m1, var, mu4


def sr_var(x: float, eps: float) -> float:
    return sr_scale(eps) ** 2 - x**2


def pm_var(x: float, eps: float) -> float:
    h = math.exp(eps / 2)
    return x**2 / (h - 1) + (h + 3) / (3 * (h - 1) ** 2)


def check_sample(sample: np.ndarray, law: list[Component], closed_form_var: float) -> None:
    mean, var, mu4 = moments(law)
    n = sample.shape[0]
    assert var == pytest.approx(closed_form_var, rel=1e-9)  # the written-out law is the spec's
    assert abs(float(sample.mean()) - mean) < Z * math.sqrt(var / n)
    var_sd = math.sqrt((mu4 - var**2 * (n - 3) / (n - 1)) / n)
    assert abs(float(sample.var(ddof=1)) - var) < Z * var_sd + 1e-12


# -- the laws written out above are unbiased with the spec's variances -------------------------


@pytest.mark.parametrize("eps", [*EPSILONS, 0.61, 0.62, 4.0])
@pytest.mark.parametrize("x", XS)
def test_written_out_laws_match_spec(x: float, eps: float) -> None:
    for law, var in ((sr_law(x, eps), sr_var(x, eps)), (pm_law(x, eps), pm_var(x, eps))):
        assert sum(w for w, _, _ in law) == pytest.approx(1.0, rel=1e-12)
        mean, v, _ = moments(law)
        assert mean == pytest.approx(x, abs=1e-9)
        assert v == pytest.approx(var, rel=1e-9)
    # HM's exact mixture variance does not depend on x above the switch and is Var* (A11).
    _, v_hm, _ = moments(hm_law(x, eps))
    if eps > HM_SWITCH:
        assert v_hm == pytest.approx(hm_worst_variance(eps, "exact"), rel=1e-9)
    else:
        assert v_hm == pytest.approx(sr_var(x, eps), rel=1e-9)
        assert hm_worst_variance(eps) >= v_hm


# -- Monte Carlo: unbiasedness, support and per-user variance ----------------------------------


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("x", XS)
def test_sr(x: float, eps: float) -> None:
    rng = np.random.default_rng(int(1000 * eps) + int(100 * x) + 7)
    out = sr_perturb(np.full(N, x), eps, rng)
    cs = sr_scale(eps)
    assert cs == pytest.approx((math.exp(eps) + 1) / (math.exp(eps) - 1), rel=1e-15)
    assert set(np.unique(out)) <= {cs, -cs}  # exactly ±C_s
    plus = 0.5 + x * (math.exp(eps) - 1) / (2 * (math.exp(eps) + 1))
    frac = float(np.mean(out == cs))
    assert abs(frac - plus) < Z * math.sqrt(max(plus * (1 - plus), 1e-300) / N) + 1e-12
    check_sample(out, sr_law(x, eps), sr_var(x, eps))


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("x", XS)
def test_pm(x: float, eps: float) -> None:
    rng = np.random.default_rng(int(1000 * eps) + int(100 * x) + 11)
    out = pm_perturb(np.full(N, x), eps, rng)
    c = pm_scale(eps)
    h = math.exp(eps / 2)
    assert c == pytest.approx((h + 1) / (h - 1), rel=1e-15)
    assert out.min() >= -c and out.max() <= c
    left = x * (c + 1) / 2 - (c - 1) / 2
    inside = float(np.mean((out >= left) & (out <= left + c - 1)))
    assert abs(inside - h / (h + 1)) < Z * math.sqrt(h / (h + 1) ** 2 / N)
    check_sample(out, pm_law(x, eps), pm_var(x, eps))


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("x", XS)
def test_hm(x: float, eps: float) -> None:
    rng = np.random.default_rng(int(1000 * eps) + int(100 * x) + 13)
    out = HM().perturb(np.full(N, x), eps, rng)
    bound = max(sr_scale(eps), pm_scale(eps))
    assert np.all(np.abs(out) <= bound)
    if eps <= HM_SWITCH:  # SR only
        assert set(np.unique(out)) <= {sr_scale(eps), -sr_scale(eps)}
    law = hm_law(x, eps)
    check_sample(out, law, moments(law)[1])


@pytest.mark.parametrize("eps", [0.7, 1.0, 2.0, 4.0])
def test_hm_variance_at_half_matches_exact_mixture(eps: float) -> None:
    """§2.7: for ε > 0.61 the x² terms cancel, so the per-user variance at x = 0.5 is Var*."""
    rng = np.random.default_rng(int(100 * eps))
    n = 200_000
    out = HM().perturb(np.full(n, 0.5), eps, rng)
    _, var, mu4 = moments(hm_law(0.5, eps))
    exact = hm_worst_variance(eps, "exact")
    assert var == pytest.approx(exact, rel=1e-9)
    sd = math.sqrt((mu4 - var**2 * (n - 3) / (n - 1)) / n)
    empirical = float(out.var(ddof=1))
    assert abs(empirical - exact) < Z * sd
    assert abs(float(out.mean()) - 0.5) < Z * math.sqrt(var / n)
    if eps >= 1.0:  # the printed Eq. 10 is measurably wrong (A11)
        assert abs(empirical - hm_worst_variance(eps, "paper")) > 10 * sd


def test_hm_clips_out_of_range_inputs() -> None:
    rng = np.random.default_rng(5)
    eps = 1.0
    out = HM().perturb(np.array([3.0, -7.0] * (N // 2)), eps, rng)
    hi, lo = out[0::2], out[1::2]
    sd = math.sqrt(hm_worst_variance(eps) / (N // 2))
    assert abs(float(hi.mean()) - 1.0) < Z * sd
    assert abs(float(lo.mean()) + 1.0) < Z * sd
    assert np.all(np.abs(out) <= max(sr_scale(eps), pm_scale(eps)))


# -- Var* test vectors (§2.7 table) ----------------------------------------------------------

HM_TABLE = [
    # ε, exact, paper
    (0.1, 400.6668, 400.6668),
    (0.5, 16.6708, 16.6708),
    (0.61, 11.4226, 11.4226),
    (1.0, 4.2890, 5.0735),
    (2.0, 1.0423, 0.8717),
    (4.0, 0.2190, 0.1571),
]


@pytest.mark.parametrize(("eps", "exact", "paper"), HM_TABLE)
def test_hm_worst_variance_vectors(eps: float, exact: float, paper: float) -> None:
    # Printed to 4 decimals: 5e-5 absolute (and < 1.3e-7 relative for the 400.6668 entry).
    assert hm_worst_variance(eps, "exact") == pytest.approx(exact, abs=5e-5)
    assert hm_worst_variance(eps, "paper") == pytest.approx(paper, abs=5e-5)
    assert hm_worst_variance(eps) == hm_worst_variance(eps, "exact")


def test_hm_worst_variance_continuity_at_switch() -> None:
    # §2.7: from ε = 0.61 to 0.62 the exact form goes 11.42 -> 11.06, the printed one jumps to 16.20.
    assert hm_worst_variance(0.62, "exact") == pytest.approx(11.06, abs=5e-3)
    assert hm_worst_variance(0.62, "paper") == pytest.approx(16.20, abs=5e-3)
    below = hm_worst_variance(0.61)
    assert below == pytest.approx(sr_scale(0.61) ** 2, rel=1e-15)
    # Just above the switch the exact mixture is continuous; the printed form is not.
    assert hm_worst_variance(0.61 + 1e-9, "exact") == pytest.approx(below, abs=2e-3)
    assert hm_worst_variance(0.61 + 1e-9, "paper") - below > 5.0


def test_hm_oracle_interface() -> None:
    for form in ("exact", "paper"):
        hm = HM(form)
        assert hm.d == 1 and hm.name == "HM"
        assert hm.variance(1.0, 250) == pytest.approx(hm_worst_variance(1.0, form) / 250, rel=1e-15)
        assert hm.variance(1.0, 0) == math.inf
        assert hm.report_bits(1.0) == MEAN_REPORT_BITS == 64
    hm = HM()
    reports = np.array([0.5, -1.5, 2.0, 3.0])
    assert hm.support(reports, 1.0) == pytest.approx(np.array([4.0]))
    assert hm.estimate(hm.support(reports, 1.0), 1.0, 4) == pytest.approx(np.array([1.0]))
    assert np.array_equal(hm.estimate(np.array([0.0]), 1.0, 0), np.zeros(1))
    with pytest.raises(ValueError, match="hm_variance"):
        HM("printed")  # type: ignore[arg-type]


# -- MeanTask: domain mapping (A13) --------------------------------------------------------------


def test_mean_task_encode_decode_and_clipping() -> None:
    task = MeanTask(lower=2.0, upper=10.0)
    assert task.d == 1 and task.kind == "mean" and task.scale == 4.0
    enc = task.encode(np.array([2.0, 10.0, 6.0, -100.0, 1e9, 3.0]))
    assert enc == pytest.approx(np.array([-1.0, 1.0, 0.0, -1.0, 1.0, -0.75]), abs=1e-15)
    assert task.decode(np.array([-1.0, 0.0, 1.0, 0.25])) == pytest.approx(
        np.array([2.0, 6.0, 10.0, 7.0])
    )
    assert task.select(1.0).name == "HM"
    assert task.variance(1.0, 100) == pytest.approx(hm_worst_variance(1.0) / 100 * 16.0, rel=1e-15)
    assert task.report_bits(1.0) == 64
    assert list(task.in_domain(np.array([0.0, -5.0, np.nan, np.inf, 1e12]))) == [
        True,
        True,
        False,
        False,
        True,
    ]
    paper = MeanTask(lower=0.0, upper=1.0, hm_variance="paper")
    assert paper.variance(2.0, 10) == pytest.approx(
        hm_worst_variance(2.0, "paper") / 10 / 4, rel=1e-15
    )


@settings(max_examples=200, deadline=None)
@given(
    lower=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
    v=st.lists(st.floats(-1e7, 1e7), min_size=1, max_size=20),
)
def test_mean_task_round_trip_is_clipping(lower: float, width: float, v: list[float]) -> None:
    upper = lower + width
    task = MeanTask(lower=lower, upper=upper)
    values = np.array(v)
    enc = task.encode(values)
    assert np.all((enc >= -1) & (enc <= 1))
    back = task.decode(enc)
    assert back == pytest.approx(
        np.clip(values, lower, upper), abs=1e-9 * max(1.0, abs(lower), abs(upper))
    )


@pytest.mark.parametrize(
    ("lower", "upper"), [(1.0, 1.0), (2.0, 1.0), (-math.inf, 1.0), (0.0, math.nan)]
)
def test_mean_task_rejects_bad_bounds(lower: float, upper: float) -> None:
    with pytest.raises(ValueError, match="lower"):
        MeanTask(lower=lower, upper=upper)


def test_mean_task_end_to_end_unbiased_for_clipped_mean() -> None:
    rng = np.random.default_rng(17)
    task = MeanTask(lower=0.0, upper=8.0)
    eps = 1.0
    values = rng.uniform(0.0, 10.0, size=N)
    target = float(np.clip(values, 0.0, 8.0).mean())
    hm = task.select(eps)
    est = task.decode(
        hm.estimate(hm.support(hm.perturb(task.encode(values), eps, rng), eps), eps, N)
    )
    assert est.shape == (1,)
    assert abs(float(est[0]) - target) < Z * math.sqrt(task.variance(eps, N))
