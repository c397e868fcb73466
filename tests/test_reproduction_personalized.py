"""Reproduction of personalized w-event privacy on the synthetic streams (spec
personalized-w-event §6, §10 items 6 and 8).

* §10 item 6 — the generators: Sin stays in [0.025, 0.125], Log rises monotonically from
  ≈ 0.125 toward 0.25, TLNS stays in [0, 1] with increments of standard deviation 0.0025.
* The harness itself (``privstream.experiments.harness`` over the ``personalized`` family, the metrics of
  ``privstream.experiments.scores``): metrics, requirements, the Bernoulli streams and the
  bench result shape.
* §6.5 at the defaults (ε = 0.6, w = 120, personalized requirements of §6.3, n = 10,000):
  PBD has less AMRE than BD and PBA less than BA on TLNS, Sin and Log (claim 3: PBD beats BD on
  every dataset; PBA is best on the synthetic ones); PLBU is worst on Sin and Log (claim 4).
  The measured reductions are printed beside the paper's headlines (68 % PBD vs BD on real
  data, 24.9 % PBA vs BA on synthetic data).

Seeds and length. The comparison averages AMRE over seeds 1–3 (each seed draws the dataset,
the users' requirements and the noise); one seed is not enough for PBA vs BA, whose gap
depends on how many users the requirement draw leaves at the strictest (0.6, 120): on Sin,
seed 3 alone gives a 0.3 % reduction while seeds 1, 2, 4 and 5 give 15–39 %. T = 1,500 slots
(12.5 windows of 120) instead of the artifact's 10,000 keeps the test near 20 s; the seed-mean
gaps measured at T = 1,500 are above 20 % for every pair.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from privstream.connectors.synthetic import (
    SyntheticStream,
    log_probabilities,
    sin_probabilities,
    tlns_probabilities,
)
from privstream.experiments import harness
from privstream.experiments.paper_results import PAPER_HEADLINES
from privstream.experiments.scores import ajsd, amre, reductions
from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.client import Requirements
from privstream.mechanisms.personalized import requirement_arrays

Z = 4.0
N, T, SEEDS = 10_000, 1_500, (1, 2, 3)
EPS, W = 0.6, 120
DATASETS = PERSONALIZED.bench.datasets  # TLNS, Sin, Log (§6.2)

# -- §10 item 6: generators -----------------------------------------------------------------------


def test_sin_range() -> None:
    p = sin_probabilities(10_000)
    assert p.min() >= 0.025 and p.max() <= 0.125
    assert p.min() < 0.0251 and p.max() > 0.1249  # the full range is reached (period ≈ 628)


def test_log_rises_monotonically_toward_a_quarter() -> None:
    p = log_probabilities(10_000)
    assert np.all(np.diff(p[:3_000]) > 0) and np.all(np.diff(p) >= 0)  # saturates in floats
    assert p[0] == pytest.approx(0.125, abs=0.001)
    assert 0.2499 < p[-1] <= 0.25


def test_tlns_stays_in_the_unit_interval_with_the_papers_step() -> None:
    """Clipped (not reflected) random walk from p_0 = 0.05 with √Q = 0.0025 (A24). Away from the
    clip the increments are the Gaussian steps: their standard deviation is 0.0025 within four
    standard errors (σ/√(2k) for k increments), and their mean is 0."""
    p = tlns_probabilities(10_000, np.random.default_rng(17))
    assert np.all((p >= 0) & (p <= 1))
    steps = np.diff(np.concatenate(([0.05], p)))
    interior = (p > 0) & (p < 1) & (np.concatenate(([0.05], p[:-1])) > 0)
    inc = steps[interior]
    assert inc.size > 5_000
    assert abs(inc.std() - 0.0025) <= Z * 0.0025 / math.sqrt(2 * inc.size)
    assert abs(inc.mean()) <= Z * 0.0025 / math.sqrt(inc.size)
    hits = tlns_probabilities(5_000, np.random.default_rng(1), p0=0.0, sqrt_q=0.05)
    assert np.any(hits == 0.0) and np.any(hits == 1.0)  # both bounds clip


def test_binary_stream_is_bernoulli_per_user() -> None:
    """§6.2: at slot t each user holds 1 with probability p_t, independently: the count of ones
    is Binomial(n, p_t) (mean within four binomial standard errors over many slots), and a slot
    regenerates identically."""
    stream = SyntheticStream("sin", 2_000, 300, seed=4, independent=True)
    ones = np.array([stream.values(t).sum() for t in range(1, 301)])
    p = stream.probabilities
    z = (ones - 2_000 * p) / np.sqrt(2_000 * p * (1 - p))
    assert abs(z.mean()) <= Z / math.sqrt(300)
    assert abs(z.var() - 1) <= Z * math.sqrt(2 / 300)
    assert np.array_equal(stream.values(7), stream.values(7))
    with pytest.raises(ValueError, match="unknown synthetic dataset"):
        SyntheticStream("taxi", 10, 10, seed=0, independent=True)


# -- the harness ----------------------------------------------------------------------------------


def test_metrics() -> None:
    r = np.array([[1.0, 3.0], [2.0, 2.0]])
    c = np.array([[0.0, 3.0], [2.0, 4.0]])
    assert amre(r, c) == pytest.approx((1 + 0 + 0 + 4) / 4)
    assert ajsd(c, c) == 0.0
    # one slot: normalise (1, 3) and (0, 3) → (1/4, 3/4), (0, 1); v = (1/8, 7/8)
    p, v = np.array([0.25, 0.75]), np.array([0.125, 0.875])
    jsd = 0.5 * np.sum(p * np.log(p / v)) + 0.5 * (1.0 * math.log(1 / 0.875))  # q = (0, 1)
    assert ajsd(r[:1], c[:1]) == pytest.approx(jsd, rel=1e-12)
    assert ajsd(np.array([[-1.0, 0.0]]), np.array([[1.0, 1.0]])) != ajsd(r, c)  # clamped
    assert math.isnan(ajsd(np.array([[-1.0, 0.0]]), np.array([[1.0, 1.0]])))  # nothing left
    assert reductions(100.0, 32.0)["amre"] == pytest.approx(0.68)
    assert reductions(math.e**8, math.e**6)["ln_amre"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="T×d"):
        amre(np.zeros((2, 2)), np.zeros((3, 2)))


def test_requirements_follow_the_grid_in_ten_contiguous_types() -> None:
    req = Requirements(*requirement_arrays(1_003, 0.4, 80, seed=9))
    classes = req.classes(0.4, 80)
    assert classes.count <= 10 and classes.sizes.sum() == 1_003
    assert set(classes.epsilons.tolist()) <= {0.4, 0.6, 0.8, 1.0}
    assert set(classes.windows.tolist()) <= {40, 80}
    members = classes.members
    blocks = [members[i : i + 101] for i in range(0, 1_003, 101)]
    assert all(np.all(b == b[0]) for b in blocks)  # ceil(1003/10) = 101 users per type
    again = Requirements(*requirement_arrays(1_003, 0.4, 80, seed=9)).classes(0.4, 80)
    assert again.digest == classes.digest


def test_bench_result_has_the_ldp_ids_shape() -> None:
    result = harness.bench(PERSONALIZED, "sin", 300, 30, 0.6, 40, ["pbd", "BD"], 2, progress=False)
    assert set(result) == {"params", "results"}
    assert list(result["results"]) == ["PBD", "BD"]
    assert all(set(r) == {"amre", "ln_amre", "ajsd", "publications", "seconds"}
               for r in result["results"].values())  # fmt: skip
    assert result["params"]["mechanisms"] == ["PBD", "BD"]
    assert result["params"]["dataset"] == "sin" and result["params"]["seeds"] == 2
    assert result["params"]["family"] == "personalized"
    ldp = harness.bench(LDP_IDS, "sin", 300, 5, 1.0, 5, ["LBU"], 1, progress=False)
    assert set(ldp) == set(result)
    assert "PBD" in harness.format_table(result)
    with pytest.raises(ValueError, match="seeds"):
        harness.bench(PERSONALIZED, "sin", 10, 10, EPS, W, ["PBD"], 0, progress=False)


def test_runs_are_reproducible_and_independent_of_companions() -> None:
    stream = SyntheticStream("log", 500, 40, seed=2, independent=True)
    req = Requirements(*requirement_arrays(500, 0.6, 20, seed=2, windows=(10, 20)))
    run = functools.partial(harness.run_lockstep, PERSONALIZED, seed=2, requirements=req)
    alone = run(["PBA"], stream, 0.6, 20)["PBA"]
    together = run(["BD", "PBA"], stream, 0.6, 20)["PBA"]
    assert np.array_equal(alone.estimates, together.estimates)
    assert alone.strategies == together.strategies


# -- §6.5 / §10 item 8 at the defaults ------------------------------------------------------------


@pytest.fixture(scope="module")
def default_runs() -> dict[str, dict[str, float]]:
    """Seed-mean AMRE of BD, BA, PBD and PBA per synthetic dataset at the defaults."""
    out: dict[str, dict[str, float]] = {}
    for dataset in DATASETS:
        sums: dict[str, float] = {}
        for seed in SEEDS:
            stream = SyntheticStream(dataset, N, T, seed=seed, independent=True)
            req = Requirements(*requirement_arrays(N, EPS, W, seed))
            runs = harness.run_lockstep(
                PERSONALIZED, ["BD", "BA", "PBD", "PBA"], stream, EPS, W, seed, requirements=req
            )
            for name, run in runs.items():
                sums[name] = sums.get(name, 0.0) + run.amre() / len(SEEDS)
        out[dataset] = sums
    return out


@pytest.mark.parametrize("dataset", DATASETS)
def test_personalized_beats_uniform_at_the_defaults(
    dataset: str, default_runs: dict[str, dict[str, float]], record_property: pytest.RecordProperty
) -> None:
    err = default_runs[dataset]
    pbd = reductions(err["BD"], err["PBD"])
    pba = reductions(err["BA"], err["PBA"])
    print(
        f"\n{dataset}: AMRE BD {err['BD']:.4g}, PBD {err['PBD']:.4g} → {pbd['amre']:.1%} less "
        f"(paper: {PAPER_HEADLINES['PBD/BD real data']:.0%} on real data); "
        f"BA {err['BA']:.4g}, PBA {err['PBA']:.4g} → {pba['amre']:.1%} less "
        f"(paper: {PAPER_HEADLINES['PBA/BA synthetic data']:.1%} on synthetic data)"
    )
    record_property(f"{dataset}_pbd_vs_bd", pbd["amre"])
    record_property(f"{dataset}_pba_vs_ba", pba["amre"])
    assert err["PBD"] < err["BD"]
    assert err["PBA"] < err["BA"]
    assert err["PBA"] < err["PBD"]  # PBA is best on the slowly changing synthetic streams


@pytest.mark.parametrize("dataset", ["sin", "log"])
def test_plbu_is_worst(dataset: str) -> None:
    """Claim 4 on Sin and Log. PLBU's OUE reports at ε_i/w_i ≈ 0.005 have a per-user variance
    near 1/(4(1/2 − q)²) ≈ 1.6·10⁵, three orders of magnitude above the CDP mechanisms' error,
    so one seed and 300 slots settle it."""
    stream = SyntheticStream(dataset, N, 300, seed=1, independent=True)
    req = Requirements(*requirement_arrays(N, EPS, W, 1))
    names = ["BD", "BA", "PBD", "PBA", "PLBU"]
    runs = harness.run_lockstep(PERSONALIZED, names, stream, EPS, W, 1, requirements=req)
    err = {name: run.amre() for name, run in runs.items()}
    assert err["PLBU"] == max(err.values())
