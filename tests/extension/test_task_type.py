"""The worked example's task axis: ``example_task`` (``site/``) declares a NEW task type — the
fraction of users above a threshold, ``--threshold X`` / ``threshold = X`` — its dataset and its
bench, and runs through ``privstream run``, a flow file, the bench harness and the conformance
checks with no edit to privstream."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privstream.cli import main
from privstream.families import registry
from privstream.mechanisms.tasks import FrequencyTask
from tests.extension import surfaces

USERS, SLOTS, W, EPS, X = 4000, 10, 5, 1.0, 0.6


def _sigma() -> float:
    """LBU: all n users report with ε/w each slot; one estimate's standard deviation."""
    return math.sqrt(FrequencyTask(2).variance(EPS / W, USERS))


def _truths() -> list[float]:
    import importlib

    site = importlib.import_module("example_task")
    source = site.Drifting(USERS, SLOTS, 1, site.ThresholdTask(X))
    return [float(source.truth(t)[1]) for t in range(1, SLOTS + 1)]


def _argv(out: Path) -> list[str]:
    return ["run", "example-task", "--threshold", str(X), "--dataset", "drift", "--users",
            str(USERS), "--slots", str(SLOTS), "--epsilon", str(EPS), "--window", str(W),
            "--insecure-seed", "3", "--no-progress", "--out", str(out)]  # fmt: skip


def _check_releases(out: Path) -> None:
    releases = surfaces.lines(out)
    assert [r["slot"] for r in releases] == list(range(1, SLOTS + 1))
    truths = _truths()
    assert 0.35 < truths[0] < 0.45  # values frac(u/n + 0.1 sin(t/5)): about 0.4 lie above 0.6
    for release, truth in zip(releases, truths, strict=True):
        above = release["estimate"][1]
        assert abs(above - truth) <= 4.5 * _sigma(), (release["slot"], above, truth)
        assert math.isclose(sum(release["estimate"]), 1.0)  # the histogram (1 - f, f)


def test_the_task_type_is_declared_by_the_external_family(external_site: dict[str, str]) -> None:
    family = registry.family("example-task")
    assert [t.key for t in family.task_types] == ["threshold"]
    assert family.task_types[0].flag == "--threshold"
    assert family.takes("threshold") and not family.takes("domain")
    task = family.task_types[0].parse_flag("0.25")
    assert family.accepts(task) and not family.accepts(FrequencyTask(2))
    assert list(task.encode(np.array([0.1, 0.25, 0.3]))) == [0, 0, 1]


def test_run_parses_the_new_flag_in_process(external_site: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "releases.jsonl"
    assert main(_argv(out)) == 0
    _check_releases(out)


def test_run_parses_the_new_flag_in_a_subprocess(
    external_site: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "releases.jsonl"
    surfaces.run_subprocess(external_site, _argv(out))
    _check_releases(out)


def test_a_bad_threshold_flag_is_refused(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(tmp_path / "r.jsonl")
    argv[argv.index("--threshold") + 1] = "nan"
    with pytest.raises(SystemExit):
        main(argv)
    assert "--threshold" in capsys.readouterr().err


def _flow(tmp_path: Path, **task: Any) -> Path:
    stream = {"name": "load", "family": "example-task", "mechanisms": ["LBU"], **task,
              "share": 1.0}  # fmt: skip
    population = {"users": 1000, "epsilon": 2.0, "window": 20}
    return surfaces.flow_file(tmp_path, population=population, streams=[stream])


def test_a_flow_file_parses_the_new_key(
    external_site: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from privstream.flows.config import estimation_task, load

    flow = _flow(tmp_path, threshold=0.75)
    code, out, _ = surfaces.config_check(flow, capsys)
    assert code == 0
    assert "stream load: example-task LBU; threshold 0.75; ε = 1 × 2 = 2; w = 20" in out
    (stream,) = load(flow).streams
    assert estimation_task(stream.task) == registry.family("example-task").task_types[0].parse_flag(
        "0.75"
    )
    code, _, err = surfaces.config_check(_flow(tmp_path, domain=2), capsys)
    assert code == 2
    assert "the example-task family takes threshold = x (the fraction of users above x)" in err
    code, _, err = surfaces.config_check(_flow(tmp_path, threshold="high"), capsys)
    assert code == 2 and "threshold" in err


def test_the_bench_harness_runs_the_new_task(external_site: dict[str, str], tmp_path: Path) -> None:
    results = surfaces.bench(tmp_path, "example-task", "--users", str(USERS), "--slots", "20", "--window",
                    str(W), "--seeds", "2", "--no-progress")  # fmt: skip
    assert set(results) == {"LBU", "LPU"}
    # LBU: every slot publishes with ε/w from all n users; mean |N(0, σ²)| = σ·√(2/π).
    expected = _sigma() * math.sqrt(2 / math.pi)
    assert results["LBU"]["publications"] == 20
    assert abs(results["LBU"]["mae"] - expected) < 0.35 * expected
    # LPU: every slot n/w users with ε each, a smaller variance than LBU's at these numbers.
    assert results["LPU"]["mae"] < results["LBU"]["mae"]


def test_the_conformance_checks_run_the_new_task(external_site: dict[str, str]) -> None:
    ran = surfaces.conformance("example-task", flows=False, skips=True)
    assert len(ran) >= 2 * 5
