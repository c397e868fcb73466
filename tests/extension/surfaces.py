"""The surfaces every family of the worked example (``site/``) runs through, one helper each:
``privstream`` in a subprocess with the external site's environment, a flow file's check, the
bench harness and the conformance checks. Each helper asserts what every test of a surface
asserts (the command succeeded, a check did not skip); the tests assert their numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from privstream.cli import main
from privstream.connectors.datasets import synthetic_dataset
from privstream.families import registry

CLI = "import sys; from privstream.cli import main; sys.exit(main())"
"""``privstream``'s entry function as a ``python -c`` program."""

KAFKA = {"bootstrap": "localhost:9092", "input_topic": "events", "output_topic": "releases"}
"""The ``[kafka]`` table of a flow file that is only checked (nothing connects to it)."""


def run_subprocess(env: Mapping[str, str], argv: Sequence[str]) -> None:
    """``privstream argv`` in a process of its own with ``env`` (the ``external_site``
    fixture's: the site on ``PYTHONPATH``, so the process discovers its families itself);
    fails with the end of its stderr unless it exits 0."""
    done = subprocess.run([sys.executable, "-c", CLI, *argv], env=dict(env),
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``--out``, ``--ledger-out``), in order."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _table(header: str, keys: Mapping[str, Any]) -> str:
    return "\n".join([header, *(f"{k} = {_toml(v)}" for k, v in keys.items())]) + "\n"


def flow_file(
    path: Path,
    *,
    population: Mapping[str, Any],
    streams: Sequence[Mapping[str, Any]],
    kafka: Mapping[str, Any] = KAFKA,
) -> Path:
    """Write a flow file: ``[kafka]``, ``[population]`` and one ``[[streams]]`` table per
    mapping, each key in the order given (``path``: the file, or a folder to hold
    ``flow.toml``)."""
    if path.is_dir():
        path = path / "flow.toml"
    tables = [_table("[kafka]", kafka), _table("[population]", population)]
    path.write_text("\n".join([*tables, *(_table("[[streams]]", s) for s in streams)]))
    return path


def config_check(flow: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``privstream config check flow``: its exit code, stdout and stderr."""
    code = main(["config", "check", str(flow)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_flow_check(
    capsys: pytest.CaptureFixture[str],
    good: Path,
    shows: Sequence[str],
    bad: Path | None = None,
    refuses: str = "",
) -> None:
    """``config check`` passes ``good`` (exit 0) and its summary shows every text of ``shows``;
    it refuses ``bad`` (exit 2) with ``refuses`` in the error."""
    code, out, _ = config_check(good, capsys)
    assert code == 0 and all(text in out for text in shows), out
    if bad is not None:
        code, _, err = config_check(bad, capsys)
        assert code == 2 and refuses in err, err


def sin_truth(users: int, slots: int) -> list[float]:
    """The fraction of ones of the ``sin`` dataset (seed 1) at slots ``1..slots``."""
    data = synthetic_dataset("sin", users, slots, 1)
    return [float(data.truth(t)[1]) for t in range(1, slots + 1)]


def bench(tmp_path: Path, family: str, *argv: str) -> dict[str, Any]:
    """``privstream bench family argv --json``: the results by mechanism (``{MECH: {field:
    mean}}``); fails unless it exits 0."""
    out = tmp_path / "bench.json"
    assert main(["bench", family, *argv, "--json", str(out)]) == 0
    results: dict[str, Any] = json.loads(out.read_text())["results"]
    return results


def conformance(
    family: str,
    mechanisms: Sequence[str] | None = None,
    *,
    flows: bool = True,
    skips: bool = False,
) -> list[str]:
    """Run the conformance checks of ``family``'s ``mechanisms`` (default: all of them); the
    names of those that ran, in order. ``skips``: a check may skip (with its reason);
    otherwise every check must run."""
    from privstream.conformance.checks import yield_checks

    registered = registry.family(family)
    ran = []
    for name in mechanisms or list(registered.mechanisms):
        for check in yield_checks(registry.Registered(registered, name), flows=flows):
            if check.skip is not None:
                assert skips, (check.name, check.skip)
                continue
            check()
            ran.append(check.name)
    return ran
