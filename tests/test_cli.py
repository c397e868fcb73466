"""The command line is a contract: flags and output fields exactly as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privstream.cli import main

RELEASE_FIELDS = {
    "release_id", "stream", "mechanism", "slot", "strategy", "estimate", "epsilon", "window",
    "epsilon_m1", "epsilon_m2", "users_m1", "users_m2",
}  # fmt: skip


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_ldp_ids_writes_one_release_per_slot(tmp_path: Path) -> None:
    out = tmp_path / "releases.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LPA", "--dataset", "sin", "--users", "5000", "--slots", "60",
            "--epsilon", "1", "--window", "20", "--seed", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    releases = read(out)
    assert [r["slot"] for r in releases] == list(range(1, 61))
    for r in releases:
        assert r.keys() >= RELEASE_FIELDS
        assert r["strategy"] in ("publish", "approximate", "nullified")
        assert r["epsilon"] == 1.0 and r["window"] == 20 and len(r["estimate"]) == 2  # type: ignore[arg-type]
        assert r["epsilon_m1"] == 1.0  # LPA's M1 users report with the full ε
        assert r["users_m1"] == 5000 // 2 // 20
    assert main(argv) == 0 and read(out) == releases, "same seed, same releases"


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_run_on_a_users_own_file(tmp_path: Path, suffix: str) -> None:
    records = [(f"user{u}", t, (u * t) % 3) for t in range(1, 11) for u in range(200)]
    src = tmp_path / f"events.{suffix}"
    if suffix == "csv":
        src.write_text("user,slot,value\n" + "".join(f"{u},{t},{v}\n" for u, t, v in records))
    else:
        src.write_text(
            "".join(json.dumps({"user": u, "slot": t, "value": v}) + "\n" for u, t, v in records)
        )
    out, dead = tmp_path / "r.jsonl", tmp_path / "dead.jsonl"
    argv = ["run", "ldp-ids", "--mechanism", "LBU,LPU", "--dataset", f"file:{src}", "--users", "200",
            "--domain", "3", "--window", "5", "--out", str(out), "--dead-letter-out", str(dead), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    releases = read(out)
    assert sorted((r["mechanism"], r["slot"]) for r in releases) == sorted(
        (m, t) for m in ("LBU", "LPU") for t in range(1, 11)
    )
    assert all(r["stream"] == "file" and len(r["estimate"]) == 3 for r in releases)  # type: ignore[arg-type]
    assert dead.read_text() == ""


def test_bad_arguments_are_rejected_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "ldp-ids", "--epsilon", "-1"])
    assert "positive" in capsys.readouterr().err
    assert main(["run", "ldp-ids", "--mechanism", "XYZ", "--no-progress"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err
    assert main(["run", "ldp-ids", "--dataset", "file:/nonexistent.csv", "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_ldp_ids_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "ldp-ids", "--dataset", "sin", "--users", "4000", "--slots", "40", "--epsilon", "1",
            "--window", "20", "--mechanisms", "LBU,LPA", "--seeds", "2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["seeds"] == 2 and result["params"]["users"] == 4000
    assert set(result["results"]) == {"LBU", "LPA"}
    for row in result["results"].values():
        assert set(row) == {"mre", "mae", "bits_per_user", "publications", "seconds"}
    assert result["results"]["LBU"]["bits_per_user"] == 1.0
    table = capsys.readouterr().out
    assert "LBU" in table and "LPA" in table


def test_bench_on_a_file_dataset(tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    src.write_text("".join(f"u{u},{t},{(u + t) % 3}\n" for t in range(1, 21) for u in range(300)))
    out = tmp_path / "out.json"
    argv = ["bench", "ldp-ids", "--dataset", f"file:{src}", "--users", "300", "--window", "5",
            "--mechanisms", "LPU", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["slots"] == 20
    assert result["results"]["LPU"]["bits_per_user"] == pytest.approx((2 + 1) / 5)


def test_run_personalized_writes_releases_and_class_ledgers(tmp_path: Path) -> None:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    argv = ["run", "personalized", "--mechanism", "PBD,BA", "--dataset", "log", "--users", "2000",
            "--slots", "150", "--epsilon", "0.6", "--window", "40", "--out", str(out),
            "--ledger-out", str(ledger), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["mechanism"], r["slot"]) for r in releases) == sorted(
        (m, t) for m in ("PBD", "BA") for t in range(1, 151)
    )
    entry = json.loads(ledger.read_text().splitlines()[-1])
    # spec §6.3: types draw ε_i from {0.6, ..., 1.0} and w_i from {40}, the grid values ≤ w
    assert {c["window"] for c in entry["classes"]} == {40}
    assert all(c["epsilon"] >= 0.6 for c in entry["classes"])
    assert sum(c["users"] for c in entry["classes"]) == 2000


def test_bench_personalized_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "personalized", "--dataset", "tlns", "--users", "1000", "--slots", "400",
            "--mechanisms", "BD,PBD", "--seeds", "2", "--json", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["params"]["seeds"] == 2 and result["params"]["dataset"] == "tlns"
    assert set(result["results"]) == {"BD", "PBD"}
    for row in result["results"].values():
        assert {"amre", "ln_amre", "ajsd", "publications", "seconds"} <= set(row)
        assert row["amre"] > 0 and 0 <= row["ajsd"] <= 1
    assert "PBD" in capsys.readouterr().out
