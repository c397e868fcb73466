"""The Makefile's install (issue 20): it picks a supported Python among several, refuses in one
line when there is none, recovers from a failed install without ``make clean``, and keeps the
demo's and the tests' installs apart. Offline and fast: ``make`` runs in a copy of the
Makefile and ``scripts/venv.sh`` with fake interpreters on a PATH of their own; the fake's
``-m venv`` makes a fake environment whose ``-m pip`` only writes what it was asked to a log."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("sh", "rm", "mkdir", "cp", "dirname", "grep", "awk", "touch", "cat")

# A fake Python of version V: `-c CODE` prints V (and fails for a venv's python with no pip when
# CODE imports pip), `-m venv DIR` makes DIR (half made and failing with $FAKE_VENV_FAILS),
# `-m pip ...` succeeds unless $FAKE_PIP_FAILS; every call is logged.
FAKE = """#!/bin/sh
here=$(dirname "$0")
echo "$0 $*" >> "$FAKE_LOG"
case "$1" in
-c)
    case "$2" in *pip*) [ -d "$here/../lib/pip" ] || exit 1 ;; esac
    echo "{version}" ;;
-m)
    case "$2" in
    venv)
        mkdir -p "$3/bin"
        [ -z "${{FAKE_VENV_FAILS:-}}" ] || exit 1
        mkdir -p "$3/lib/pip"
        cp "$0" "$3/bin/python"
        cp "$0" "$3/bin/privstream" ;;
    pip) [ -z "${{FAKE_PIP_FAILS:-}}" ] || exit 1 ;;
    esac ;;
esac
"""


class Checkout:
    """A copy of what ``make`` reads, fake interpreters and the log of their calls."""

    def __init__(self, root: Path) -> None:
        self.root = root / "checkout"
        (self.root / "scripts").mkdir(parents=True)
        for name in ("Makefile", "pyproject.toml", "scripts/venv.sh"):
            shutil.copy(ROOT / name, self.root / name)
        self.bin = root / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
        self.log = root / "calls.log"
        self.log.touch()

    def python(self, name: str, version: str) -> None:
        """Put a fake ``name`` of ``version`` on the PATH."""
        path = self.bin / name
        path.write_text(FAKE.format(version=version))
        path.chmod(0o755)

    def make(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``make args`` in the copy; the log holds only this call's interpreter calls."""
        self.log.write_text("")
        environ = {"PATH": str(self.bin), "HOME": str(self.root), "FAKE_LOG": str(self.log)}
        return subprocess.run(
            [shutil.which("make") or "/usr/bin/make", "--no-print-directory", *args],
            cwd=self.root, env={**environ, **env}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def calls(self) -> list[str]:
        """The logged calls, paths relative to the copy and the fake bin folder."""
        lines = self.log.read_text().splitlines()
        return [line.replace(f"{self.bin}/", "").replace(f"{self.root}/", "") for line in lines]

    def venv_made_by(self) -> list[str]:
        return [call.split()[0] for call in self.calls() if " -m venv " in call]

    def installs(self) -> list[str]:
        return [call.split()[-1] for call in self.calls() if " -m pip install" in call
                and "--upgrade pip" not in call]  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    return Checkout(tmp_path)


def test_the_newest_supported_python_is_picked(checkout: Checkout) -> None:
    checkout.python("python3", "3.13")
    checkout.python("python3.11", "3.11")
    checkout.python("python3.12", "3.12")
    done = checkout.make("demo")
    assert done.returncode == 0, done.stderr
    assert checkout.venv_made_by() == ["python3.12"]
    assert "make: creating .venv with python3.12 (3.12)" in done.stderr
    assert checkout.installs() == [".[demo]"]
    assert ".venv/bin/privstream demo --out demo-out" in checkout.calls()


def test_demo_ldp_installs_the_demo_extra_and_runs_the_real_ldp_demo(checkout: Checkout) -> None:
    checkout.python("python3.12", "3.12")
    done = checkout.make("demo-ldp")
    assert done.returncode == 0, done.stderr
    assert checkout.installs() == [".[demo]"]
    assert ".venv/bin/privstream demo-ldp --out demo-ldp-out" in checkout.calls()
    assert checkout.make("demo").returncode == 0 and checkout.installs() == []  # one stamp
    help_line = next(line for line in checkout.make("help").stdout.splitlines()
                     if "demo-ldp" in line)  # fmt: skip
    assert "HTTP gateway" in help_line


def test_python3_is_used_when_it_is_supported(checkout: Checkout) -> None:
    checkout.python("python3", "3.11")
    assert checkout.make("demo").returncode == 0
    assert checkout.venv_made_by() == ["python3"]


def test_python_names_the_interpreter(checkout: Checkout) -> None:
    checkout.python("python3.12", "3.12")
    checkout.python("python3.11", "3.11")
    assert checkout.make("demo", PYTHON="python3.11").returncode == 0
    assert checkout.venv_made_by() == ["python3.11"]


@pytest.mark.parametrize(
    ("pythons", "env", "found"),
    [
        ({"python3": "3.13"}, {},
         "found python3.12: not found, python3.11: not found, python3: 3.13"),
        ({"python3": "3.10", "python3.12": "3.12"}, {"PYTHON": "python3"}, "found python3: 3.10"),
        ({}, {"PYTHON": "/nowhere/python3.12"}, "found /nowhere/python3.12: not found"),
    ],
)  # fmt: skip
def test_no_supported_python_is_one_line_naming_what_was_found(
    checkout: Checkout, pythons: dict[str, str], env: dict[str, str], found: str
) -> None:
    for name, version in pythons.items():
        checkout.python(name, version)
    done = checkout.make("test", **env)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    assert ours == [
        "make: privstream needs Python 3.11 or 3.12 (Bytewax 0.21.1 has no wheels for others); "
        f"{found}: install python3.12 or python3.11, or name one with "
        "make PYTHON=/path/to/python3.12"
    ]
    assert not (checkout.root / ".venv").exists()


def test_a_failed_venv_is_removed_and_the_next_make_recovers(checkout: Checkout) -> None:
    checkout.python("python3.12", "3.12")
    assert checkout.make("demo", FAKE_VENV_FAILS="1").returncode != 0
    assert not (checkout.root / ".venv").exists()
    done = checkout.make("demo")
    assert done.returncode == 0, done.stderr
    assert checkout.installs() == [".[demo]"]


@pytest.mark.parametrize("made_by", ["half", "3.13"])
def test_a_venv_left_broken_or_made_by_another_python_is_rebuilt(
    checkout: Checkout, made_by: str
) -> None:
    """A .venv without pip (an interrupted ``python -m venv``) or of Python 3.13, even with its
    stamps, is rebuilt by the next ``make demo``: no ``make clean`` needed."""
    checkout.python("python3.12", "3.12")
    venv = checkout.root / ".venv"
    (venv / "bin").mkdir(parents=True)
    if made_by == "3.13":
        checkout.python("python3.13", "3.13")
        (venv / "lib" / "pip").mkdir(parents=True)
        shutil.copy(checkout.bin / "python3.13", venv / "bin" / "python")
    (venv / ".installed-demo").touch()
    (venv / ".installed-dev").touch()
    done = checkout.make("demo")
    assert done.returncode == 0, done.stderr
    assert "is not a usable Python 3.11/3.12 environment" in done.stderr
    assert checkout.venv_made_by() == ["python3.12"]
    assert checkout.installs() == [".[demo]"]
    assert not (venv / ".installed-dev").exists()  # the rebuilt one has only the demo installed


def test_a_failed_install_is_retried_in_the_same_venv(checkout: Checkout) -> None:
    checkout.python("python3.12", "3.12")
    assert checkout.make("demo", FAKE_PIP_FAILS="1").returncode != 0
    assert not (checkout.root / ".venv").exists()  # pip's upgrade failed: nothing half made
    assert checkout.make("demo").returncode == 0
    (checkout.root / ".venv" / ".installed-demo").unlink()
    # the environment is fine, the install failed: only the install is repeated
    done = checkout.make("demo")
    assert done.returncode == 0, done.stderr
    assert checkout.venv_made_by() == [] and checkout.installs() == [".[demo]"]


def test_demo_then_test_installs_dev_and_test_then_demo_installs_nothing(
    checkout: Checkout,
) -> None:
    checkout.python("python3.12", "3.12")
    assert checkout.make("demo").returncode == 0
    assert checkout.installs() == [".[demo]"]
    assert checkout.make("demo").returncode == 0
    assert checkout.installs() == []
    assert checkout.make("test").returncode == 0
    assert checkout.installs() == [".[dev]"]
    assert checkout.make("demo").returncode == 0
    assert checkout.installs() == []


def test_test_first_then_demo_installs_once(checkout: Checkout) -> None:
    checkout.python("python3.12", "3.12")
    assert checkout.make("test").returncode == 0
    assert checkout.venv_made_by() == ["python3.12"] and checkout.installs() == [".[dev]"]
    assert checkout.make("demo").returncode == 0
    assert checkout.venv_made_by() == [] and checkout.installs() == []
    os.utime(checkout.root / "pyproject.toml", (1e10, 1e10))  # a changed pyproject reinstalls
    assert checkout.make("demo").returncode == 0
    assert checkout.installs() == [".[demo]"]


def test_test_fast_leaves_out_what_needs_a_broker_prometheus_a_container_or_time(
    checkout: Checkout,
) -> None:
    checkout.python("python3.12", "3.12")
    dry = checkout.make("-n", "test-fast")
    assert dry.returncode == 0, dry.stderr
    assert (
        ".venv/bin/python -m pytest -n 2 --timeout 900 --ignore=tests/integration "
        "--ignore=tests/deploy -m 'not slow'"
    ) in dry.stdout
    assert checkout.venv_made_by() == []  # -n makes nothing


def test_help_says_what_test_fast_leaves_out_and_how_long_it_takes(checkout: Checkout) -> None:
    done = checkout.make("help")
    line = next(line for line in done.stdout.splitlines() if "test-fast" in line)
    assert "no broker, Prometheus, container or slow tests" in line
    assert line.endswith("slow tests): 2 to 4 minutes on two cores")
