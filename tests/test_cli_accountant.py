"""``privstream accountant shuffle``: every bound by name, in text and JSON, the numbers of spec
sao2 §7.4, clear refusals, and the example of docs/accountant.md as the command prints it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from privstream.cli.commands import main
from privstream.mechanisms.shuffle_accountant import METHODS, ShuffleSetting, shuffle_bounds

FIG2 = ["--epsilon0", "1", "--delta", "1e-5", "--d-prime", "1000", "--s", "20"]
DOC = Path(__file__).resolve().parent.parent / "docs" / "accountant.md"


def shuffle(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["accountant", "shuffle", *args]) == 0
    return capsys.readouterr().out


def rows(text: str) -> dict[str, str]:
    """``name -> epsilon_c column`` of the table."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in METHODS:
            found[parts[0]] = parts[1]
    return found


def test_the_text_names_every_bound_with_the_spec_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = shuffle(capsys, *FIG2, "--n", "1000", "--m", "2")
    assert rows(out) == {
        "fmt_closed": "0.5320", "classical": "0.3679", "online": "0.3142",
        "numerical": "0.1540", "numerical_online": "0.1395",
    }  # fmt: skip
    assert "Phi = 248.6, Phi' = 321.6, Phi'/Phi = 1.294, p_cc = 0.146132" in out
    assert "a release states classical = 0.3679" in out


def test_json_holds_the_reports_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    out = json.loads(shuffle(capsys, *FIG2, "--n", "5000", "--m", "2", "--json"))
    report = shuffle_bounds(ShuffleSetting(1.0, 1e-5, 5000, 1000, 20, 2))
    assert out == json.loads(json.dumps(report.as_dict()))
    assert set(out["bounds"]) == set(METHODS) and out["stated"] == "classical"
    assert out["phi"] == pytest.approx(1572.6, abs=0.05)
    assert out["phi_online"] == pytest.approx(1937.9, abs=0.05)
    assert out["bounds"]["classical"]["epsilon"] == pytest.approx(0.1279, abs=0.5e-4)
    assert out["bounds"]["online"]["epsilon"] == pytest.approx(0.1143, abs=0.5e-4)
    assert out["bounds"]["numerical"]["epsilon"] == pytest.approx(0.0637, abs=0.5e-4)
    assert out["bounds"]["numerical_online"]["epsilon"] == pytest.approx(0.0576, abs=0.5e-4)
    assert all(b["applicable"] for b in out["bounds"].values())


def test_online_is_not_applicable_unless_m_is_2(capsys: pytest.CaptureFixture[str]) -> None:
    out = shuffle(capsys, *FIG2, "--n", "5000", "--m", "8")
    assert rows(out)["online"] == "n/a" and rows(out)["numerical_online"] == "n/a"
    assert "not applicable (Lemma 6.1 covers m = 2 only, got m = 8); classical" in out
    assert rows(out)["classical"] == "0.1279"
    data = json.loads(shuffle(capsys, *FIG2, "--n", "5000", "--m", "8", "--json"))
    assert data["bounds"]["online"]["applicable"] is False
    assert data["bounds"]["online"]["epsilon"] == data["bounds"]["classical"]["epsilon"]
    assert data["phi_online"] is None and data["p_cc"] is None


def test_without_exsub_parameters_only_the_classical_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = shuffle(capsys, "--epsilon0", "0.5", "--delta", "1e-6", "--n", "100000")
    assert "Phi' = -" in out and "needs d', s and m" in out
    assert rows(out)["online"] == "n/a"
    assert float(rows(out)["numerical"]) < float(rows(out)["classical"])
    small = shuffle(capsys, "--epsilon0", "1", "--delta", "1e-5", "--n", "100")
    assert rows(small)["classical"] == "n/a"
    assert "a release states epsilon0 = 1: classical gives no amplification" in small


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epsilon0", "0", "--delta", "1e-5", "--n", "1000"], "must be a positive number"),
        (["--epsilon0", "-1", "--delta", "1e-5", "--n", "1000"], "must be a positive number"),
        (["--epsilon0", "1", "--delta", "0", "--n", "1000"], "strictly between 0 and 1"),
        (["--epsilon0", "1", "--delta", "1.5", "--n", "1000"], "strictly between 0 and 1"),
        (["--epsilon0", "1", "--delta", "1e-5", "--n", "1"], "integer >= 2"),
        ([*FIG2, "--n", "1000", "--m", "0"], "integer >= 1"),
        (["--epsilon0", "1", "--delta", "1e-5"], "required: --n"),
    ],
)
def test_bad_flags_are_refused_by_name(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["accountant", "shuffle", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--d-prime", "10", "--s", "20"], "need 1 <= s <= d', got s = 20, d' = 10"),
        (["--d-prime", "10", "--s", "2", "--m", "11"], "need 1 <= m <= d', got m = 11"),
        (["--d-prime", "10"], "d_prime and s go together"),
        (["--epsilon0", "inf"], "epsilon0 must be a finite number"),
    ],
)
def test_bad_combinations_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--epsilon0": "1", "--delta": "1e-5", "--n": "1000"}
    flags = [x for k, v in base.items() if k not in args for x in (k, v)]
    assert main(["accountant", "shuffle", *flags, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"privstream: error: {message}")
    assert captured.err.count("\n") == 1  # one line, no traceback


def test_the_docs_example_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(
        r"```\n\$ privstream (accountant shuffle [^\n]+)\n(.*?)```", DOC.read_text(), re.S
    )
    assert block is not None, "docs/accountant.md lost its example"
    assert shuffle(capsys, *block.group(1).split()[2:]) == block.group(2)
