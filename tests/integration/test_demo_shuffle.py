"""``make demo-shuffle`` runs ``privstream demo-shuffle``: SaO2 behind a shuffler end to end
(embedded broker, the ``ldp-shuffled`` server stage, ``privstream shuffler`` and devices of the
device library, each party its own process). Every slot is published from forwarded batches,
the error matches the ``ldp-simulated`` run of the same data, the stated central ε_c is below
the local ε, and no output names a device or holds the noise secret.

Tolerance: each MAE averages 96 |errors| (16 slots × 6 cells) of the same variance in both
modes; with ~30 independent residues behind them its relative sd is about 0.75/√30 ≈ 14 %, so a
ratio outside [0.55, 1.8] is more than 4 sd of either MAE away from the other."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import run_cli


def test_the_shuffle_demo_runs_the_three_parties_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = run_cli("demo-shuffle", "--out", str(out), timeout=600)
    result = json.loads((out / "results.json").read_text())
    assert [r["strategy"] for r in result["rows"]] == ["publish"] * 16
    assert result["policies"] == ["forward"] and result["batches"] == 2 * (8 + 4 + 2 + 1)
    assert result["reports"] == sum(n for r in result["rows"] for n in r["n"])
    assert 0.55 < result["mae_shuffled"] / result["mae_simulated"] < 1.8
    assert result["epsilon_local"] == 1.0 and all(e < 1.0 for e in result["epsilon_central"])
    for name in ("table.txt", "results.json", "releases.jsonl", "manifests.jsonl", "cells.png"):
        assert (out / name).stat().st_size > 0, name
    assert "throughput:" in done.stdout and "reports/s" in done.stdout
    texts = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()
             and p.suffix in (".txt", ".json", ".jsonl", ".log")]  # fmt: skip
    assert not any(re.search(r"\bd\d{6}\b", t) for t in texts)  # the devices' ids
    assert not (out / "noise.key").exists() and not any(out.rglob("*.key"))
