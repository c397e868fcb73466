"""The DPI bench (``privstream.experiments.dpi_bench``) at tiny sizes: per-query truths and
errors, the engine-free driver against the family's own releases, H7 against the spec's
table, and the section's record and text."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from privstream.connectors.dpi_synthetic import DpiSynthetic
from privstream.experiments import dpi_bench as b
from privstream.experiments import harness


def test_errors_are_the_spec_metrics() -> None:
    y = np.array([0.5, 0.5, 0.0, 0.0])
    r = np.array([0.25, 0.25, 0.25, 0.25])
    mse, sse, kl = b.errors(r, y)
    assert sse == pytest.approx(4 * 0.0625)
    assert mse == pytest.approx(0.0625)  # per-bin mean (A27)
    assert kl == pytest.approx(math.log(2))  # Σ_{y>0} y ln(y/R)
    # a zero in R is floored at 1e-12 and renormalised: finite, large
    _, _, kl0 = b.errors(np.array([1.0, 0.0, 0.0, 0.0]), y)
    z = 1 + 3e-12
    assert kl0 == pytest.approx(0.5 * math.log(0.5 * z) + 0.5 * math.log(0.5 * z / 1e-12))


def test_truths_accumulate_and_handle_an_empty_slot() -> None:
    acc = np.zeros(3, dtype=np.int64)
    first = b.truths(np.array([0, 0, 1, -1]), 3, acc)
    assert np.allclose(first["inst"], [2 / 3, 1 / 3, 0])
    second = b.truths(np.array([-1, -1, -1, -1]), 3, acc)
    assert np.allclose(second["inst"], [1 / 3] * 3)  # empty slot: uniform (§3.1)
    assert np.allclose(second["acc"], [2 / 3, 1 / 3, 0])
    third = b.truths(np.array([2, 2, 2, -1]), 3, acc)
    assert np.allclose(third["acc"], [2 / 6, 1 / 6, 3 / 6])


def test_drive_scores_each_release_against_its_own_query() -> None:
    source = DpiSynthetic(2_000, 12, 3, k=10)
    traces = b.drive(["DPI", "DPI-paper", "DPI-prior"], source, 2.0, 7)
    for trace in traces.values():
        answered = sum(len(s.mse) for s in trace.scores.values())
        assert answered == 12 and set(trace.scores) <= {"acc", "inst"}
        assert len(trace.seconds) == 12
    # the same releases as the generic harness (same seed, stream and scope), each scored
    # against the truth of the query its key named
    runs = harness.run_lockstep(b.dpi_family(), ["DPI-paper"], source, 2.0, 1, 7)
    trace, est = traces["DPI-paper"], runs["DPI-paper"].estimates
    acc, seen = np.zeros(10, dtype=np.int64), {"acc": 0, "inst": 0}
    for t, q in enumerate(trace.queries, start=1):
        truth = b.truths(source.values(t), 10, acc)
        assert b.errors(est[t - 1], truth[q])[0] == pytest.approx(trace.scores[q].mse[seen[q]])
        seen[q] += 1
    assert seen["acc"] > 0 and seen["inst"] > 0


def test_weight_movement_only_for_the_paper_mode_and_within_the_bound() -> None:
    source = DpiSynthetic(2_000, 30, 1, k=10)
    traces = b.drive(["DPI", "DPI-paper"], source, 2.0, 1, rba="alg4", pool_size=200)
    assert b.weight_movement(traces["DPI"].state) is None
    moved = b.weight_movement(traces["DPI-paper"].state)
    assert moved is not None
    bound = 0.05 * 2.0 / (4 * 2.0)  # με/(4Δ_Q), spec §9 / I3
    assert 0 < moved["log_ratio"] <= bound
    assert moved["max_rel_dev"] <= math.expm1(bound)


def test_h7_matches_the_spec_table_for_algorithm_4() -> None:
    # spec §3.5: 0.666 after 500 slots at (2, 0.05, 0.1), ±~5 % over 5 seeds
    left = b.remaining_budget(2.0, 0.05, 0.1, "alg4", (500,), 5)[0]
    assert left == pytest.approx(0.666, rel=0.05)
    # Algorithm 3 spends ≈ t/Λ: 500 slots at Λ = 1e8 leave ε − ~5e-6
    left3 = b.remaining_budget(2.0, 0.05, 0.1, "alg3", (500,), 2)[0]
    assert 0 < 2.0 - left3 < 1e-4


def test_available_skips_a_mechanism_the_family_lacks() -> None:
    have, missing = b.available(["DPI", "No-Such-DPI"])
    assert have == ["DPI"] and missing == ["No-Such-DPI"]


def test_a_tiny_section_is_json_and_formats() -> None:
    plan = b.Plan(users=2_000, slots=6, seeds=1, sweep_slots=4, sweep_seeds=1, h7_seeds=1,
                  h8_users=13_000, h8_budget_s=0.0, h8_max_slots=3, h10_users=13_000,
                  h10_slots=2, perf_users=13_000)  # fmt: skip
    result = b.run(plan, log=lambda _m: None)
    json.dumps(result)  # plain numbers only
    assert set(result["h1"]) == {"alg3", "alg4"}
    assert set(result["h1"]["alg3"]) == {str(e) for e in b.EPSILONS}
    assert result["h8"]["slots"] == 10  # at least the probe's slots
    assert len(result["h10"]) == 2 * len(b.H10_SETS) * len(b.H10_EPSILONS)
    perf = result["performance"]
    assert perf["records"] > 0 and perf["pool_bytes"] > 0
    assert all(m["state_bytes"] > 0 for m in perf["mechanisms"].values())
    text = b.format_result(result)
    for part in ("H1", "H2", "H7", "H8", "H9", "H10", "performance", "DPI-prior"):
        assert part in text
