"""The checkout and the installed package are one package (design §2): no runtime ``__path__``
extension, so the checkout's folders do not import as sub-packages of themselves and every
class has one identity."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import privstream
from privstream.mechanisms import errors

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["privstream.privstream", "privstream.tests", "privstream.bench"])
def test_the_checkout_does_not_import_as_a_sub_package_of_itself(name: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_exported_errors_have_one_identity() -> None:
    assert privstream.PrivacyBudgetExceeded is errors.PrivacyBudgetExceeded


def test_an_import_from_the_checkout_sees_the_same_modules() -> None:
    code = (
        "import privstream.mechanisms.errors as e, privstream.operators.slotting as s;"
        "print(e.__file__); print(s.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    assert [Path(p).resolve() for p in out] == [
        (ROOT / "mechanisms" / "errors.py").resolve(),
        (ROOT / "operators" / "slotting.py").resolve(),
    ]


FORBIDDEN = {
    "mechanisms": ("privstream.operators", "privstream.connectors", "privstream.flows", "bytewax",
                   "privstream.schema.events", "privstream.cli.commands"),
    "connectors": ("privstream.mechanisms", "privstream.operators", "privstream.flows"),
    "operators": ("privstream.connectors", "privstream.flows"),
    "flows": ("privstream.experiments.harness", "privstream.conformance.checks", "privstream.cli.commands"),
}  # fmt: skip


def _imports(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package: str) -> None:
    """Design §2: mechanisms import nothing of ours and no Bytewax; connectors neither the core
    nor the operators; operators no connectors; flows no tools."""
    for path in sorted((ROOT / package).glob("*.py")):
        bad = {n for n in _imports(path) if n.startswith(FORBIDDEN[package])}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_event_schema_is_neutral() -> None:
    assert not {
        n
        for n in _imports(ROOT / "privstream" / "schema" / "events.py")
        if n.startswith("privstream")
    }


def test_the_device_library_uses_the_standard_library_only() -> None:
    """privstream.client runs where the server does not: no NumPy, Bytewax or Kafka client, and
    nothing of privstream outside privstream.client (issue 23)."""
    folder = ROOT / "privstream" / "client"
    paths = sorted(folder.glob("*.py"))
    assert paths
    for path in paths:
        bad = {
            n
            for n in _imports(path)
            if n.split(".")[0] not in sys.stdlib_module_names
            and not n.startswith("privstream.client")
        }
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_starting_a_flow_process_does_not_load_scipy_stats() -> None:
    """Every flow process and cluster launcher loads every family; ``scipy.stats`` (SaO2's
    shuffle accountant) was half a second of each one's start, three times at two processes
    (issue 26). It loads only when an exact shuffle bound is computed."""
    code = (
        "import sys, privstream.cli.commands, privstream.flows.streams\n"
        "from privstream.families.registry import FAMILIES\n"
        "list(FAMILIES)\n"
        "print('scipy.stats' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
