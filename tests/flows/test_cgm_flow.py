"""The CGM family through the ready flow (spec cgm §8): numeric values per slot, every enrolled
user reporting at every slot until the budget is spent, the Gaussian-DP spend in the metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bytewax.testing import run_main
from prometheus_client import REGISTRY

from privstream.flows.dataflow import build
from privstream.mechanisms.cgm_math import agm_mu


def run_cgm(tmp_path: Path, **kwargs: object) -> tuple[list[dict], list[dict]]:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    settings = dict(dataset="taxi", users=1500, slots=12, epsilon=2.0, window=10,
                    insecure_seed=3, out=str(out), ledger_out=str(ledger))  # fmt: skip
    settings.update(kwargs)
    out.touch()
    ledger.touch()
    run_main(build("cgm", **settings))  # type: ignore[arg-type]
    read = lambda p: [json.loads(line) for line in p.read_text().splitlines()]  # noqa: E731
    return read(out), read(ledger)


def test_every_slot_releases_a_mean_until_the_budget_is_spent(tmp_path: Path) -> None:
    releases, ledger = run_cgm(tmp_path, mechanisms="CGM")
    assert [r["slot"] for r in releases] == list(range(1, 13))
    reports = [r["details"]["reports"] for r in releases]
    assert reports[:10] == [1500] * 10 and reports[10:] == [0, 0]  # l = 10 reports each
    assert [r["strategy"] for r in releases[10:]] == ["approximate"] * 2
    assert [r["details"]["refused"] for r in releases[10:]] == [1500, 1500]
    mu_star = agm_mu(2.0, 1e-5)
    assert ledger[9]["details"]["mu_spent"] == pytest.approx(mu_star, rel=1e-12)
    assert ledger[9]["details"]["epsilon_spent"] == pytest.approx(2.0, rel=1e-6)
    assert ledger[-1]["guarantee"] == {"measure": "gaussian", "mu": mu_star, "scope": "stream",
                                       "model": "ldp"}  # fmt: skip
    labels = {"stream": "taxi", "mechanism": "CGM"}
    assert REGISTRY.get_sample_value("privstream_mu_spent", labels) == pytest.approx(mu_star)
    assert REGISTRY.get_sample_value("privstream_epsilon_spent", labels) == pytest.approx(2.0)


def test_a_budget_split_composes_in_gaussian_dp(tmp_path: Path) -> None:
    _, ledger = run_cgm(tmp_path, mechanisms="CGM,Alg1", budget_split="equal")
    mu = {e["mechanism"]: e["guarantee"]["mu"] for e in ledger}
    mu_star = agm_mu(2.0, 1e-5)
    assert mu["CGM"] == pytest.approx(mu_star / 2**0.5) and mu["Alg1"] == mu["CGM"]
    last = ledger[-1]
    assert last["population_budget"] == pytest.approx(mu_star**2)  # μ² adds: √(μ²/2 + μ²/2)
    assert last["population_spent"] == pytest.approx(mu_star**2, rel=1e-9)


def test_per_timestamp_budgets_renew_and_the_chain_goes_on(tmp_path: Path) -> None:
    releases, ledger = run_cgm(tmp_path, mechanisms="CGM", budget_scope="timestamp")
    assert all(r["details"]["reports"] == 1500 for r in releases)
    mus = [e["details"]["mu_spent"] for e in ledger]
    assert mus == pytest.approx([agm_mu(2.0, 1e-5)] * len(releases), rel=1e-12)
    errors = [r["details"]["stderr"][0] for r in releases]
    assert errors[0] > errors[3] > errors[-1]  # v falls along the chain: smaller error


def test_a_histogram_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="release means"):
        run_cgm(tmp_path, dataset="sin")


def test_vector_values_flow_from_json_lists(tmp_path: Path) -> None:
    """Events whose value is a list are d-dimensional items (spec §4.7): the L2 ball's domain,
    one mean per coordinate; an event of another shape is a dead letter."""
    rng = np.random.default_rng(5)
    lines = [
        json.dumps({"stream": "pos", "user": f"u{u}", "slot": t,
                    "value": [0.1 + rng.normal(0, 0.02), -0.1 + rng.normal(0, 0.02), 0.0]})
        for t in range(1, 9) for u in range(800)
    ]  # fmt: skip
    lines.insert(900, json.dumps({"stream": "pos", "user": "odd", "slot": 2, "value": 0.5}))
    path = tmp_path / "vectors.jsonl"
    path.write_text("\n".join(lines) + "\n")
    letters = tmp_path / "dead.jsonl"
    releases, _ = run_cgm(tmp_path, dataset=f"file:{path}", ball=((0.0, 0.0, 0.0), 0.5),
                          users=1000, slots=8, window=8, mechanisms="Alg1",
                          dead_letter_out=str(letters))  # fmt: skip
    assert [r["slot"] for r in releases] == list(range(1, 9))
    assert all(len(r["estimate"]) == 3 and len(r["details"]["stderr"]) == 3 for r in releases)
    last = releases[-1]
    stderr = last["details"]["stderr"][0]
    for got, true in zip(last["estimate"], (0.1, -0.1, 0.0), strict=True):
        assert abs(got - true) < 5 * stderr
    dead = [json.loads(line) for line in letters.read_text().splitlines()]
    assert [d["reason"] for d in dead] == ["invalid_type"]
