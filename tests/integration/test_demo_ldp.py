"""``make demo-ldp`` runs ``privstream demo-ldp``: real local DP end to end (embedded broker,
the seven LDP-IDS mechanisms as the ``ldp-reports`` server stage, round clock, HTTP gateway,
simulated devices over HTTP). At a tiny size: every output is written, every release lies
within its oracle's tolerance of the devices' true histogram, every lie is refused at the
gateway, and no output or log names a device."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from privstream.connectors.datasets import synthetic_dataset
from privstream.mechanisms.oracles import GRR

from .conftest import run_cli

USERS, SLOTS, W, EPS, LIARS, SEED = 600, 3, 2, 4.0, 8, 1
MECHANISMS = {"LBU", "LPU", "LSP", "LBD", "LBA", "LPD", "LPA"}
POPULATION_DIVISION = {"LPU", "LPD", "LPA"}
K = 5.0  # sds: a false alarm about once in 10⁶ checks (21 releases here)


def tolerance(release: dict[str, Any], truth_1: float) -> float:
    """K sd of a published estimate of value 1's frequency, plus the liars' bias bound.

    GRR over d = 2 from m reports of budget e has the exact variance q(1−q)/(m(p−q)²)
    (``GRR.variance``; p + q = 1 makes it independent of the frequency). Population division
    asks a hash-selected group of m of the n devices, whose own frequency differs from all
    devices' f by sampling: variance f(1−f)(1 − m/n)/m (without replacement). The truth is
    all n devices' histogram while the LIARS last devices report nothing honest (two of them
    send one well-formed report): the estimate's target moves by at most LIARS/n."""
    d = release["details"]
    e, m = d["epsilon_m2"], d["users_m2"]
    assert release["strategy"] == "publish" and m > 0 and e > 0, release
    var = GRR(2).variance(e, m)
    if release["mechanism"] in POPULATION_DIVISION:
        var += truth_1 * (1 - truth_1) * (1 - m / USERS) / m
    return K * float(np.sqrt(var)) + LIARS / USERS


def test_demo_ldp_runs_real_local_dp_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo-ldp"
    done = run_cli(
        "demo-ldp", "--out", str(out), "--users", str(USERS), "--slots", str(SLOTS),
        "--window", str(W), "--epsilon", str(EPS), "--liars", str(LIARS), "--seed", str(SEED),
        "--round-seconds", "2", timeout=240,
    )  # fmt: skip
    assert "[1/6] embedded broker (Tansu)" in done.stderr
    assert f"[5/6] slot {SLOTS}/{SLOTS} released by all 7 mechanisms" in done.stderr
    for name in ("table.txt", "results.json", "releases.jsonl", "requests.jsonl", "flow.toml",
                 "logs/server.log", "logs/devices.log", "logs/gateway.log", "logs/clock.log"):  # fmt: skip
        assert (out / name).exists(), name
    assert (out / "sin.png").stat().st_size > 10_000

    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {(r["oracle"]["name"], r["oracle"]["d"]) for r in requests} == {("GRR", 2)}
    releases = [json.loads(line) for line in (out / "releases.jsonl").read_text().splitlines()]
    assert Counter(r["mechanism"] for r in releases) == dict.fromkeys(MECHANISMS, SLOTS)
    source = synthetic_dataset("sin", USERS, SLOTS, SEED)
    truth = [float(np.mean(source.values(t).astype(int) == 1)) for t in range(1, SLOTS + 1)]
    by_id = {(r["mechanism"], r["slot"]): r for r in releases}
    for r in sorted(releases, key=lambda r: r["slot"]):
        assert r["guarantee"]["epsilon"] == EPS and not r["evaluation"], r
        # an approximation repeats slot s's release: its tolerance is slot s's plus the
        # truth's change since then (before any publication, it repeats the zero vector)
        s = r["source_slot"]
        if s is None:
            assert r["strategy"] == "approximate" and r["estimate"] == [0.0, 0.0], r
            continue
        source_release = by_id[(r["mechanism"], s)]
        assert r["estimate"] == source_release["estimate"], r
        tol = tolerance(source_release, truth[s - 1]) + abs(truth[s - 1] - truth[r["slot"] - 1])
        assert abs(r["estimate"][1] - truth[r["slot"] - 1]) < tol, (r, truth, tol)

    result = json.loads((out / "results.json").read_text())
    assert set(result["results"]) == MECHANISMS
    for name, row in result["results"].items():
        assert row["requests"] >= 1 and row["reports"] > 0, (name, row)
        assert row["publications"] >= 1 and 0 <= row["mae"] < 1, (name, row)
    # every kind of lie that fits these requests is refused at the gateway, before the topic
    assert set(result["gateway"]) >= {"accepted", "unknown_request", "duplicate_report",
                                      "budget_mismatch", "oracle_mismatch", "shape_mismatch",
                                      "replayed_report"}  # fmt: skip
    assert set(result["dead_letters"]) <= {"closed_round"}  # at most a report after its round
    text = (out / "table.txt").read_text()
    assert all(name in text for name in MECHANISMS) and "gateway: accepted" in text
    for path in out.rglob("*"):  # counts only: no device id in any output or log
        if path.is_file() and path.suffix != ".png":
            assert "sim-" not in path.read_text(errors="replace"), path
