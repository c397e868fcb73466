"""The README's composition example and its file and synthetic command lines run as written;
the README stays short, its links and the docs pages' resolve, and the pages that took over its
sections (docs/cli.md, docs/operations.md) are checked as the README was."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from privstream.mechanisms.seeding import SecretError

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_readme_is_short() -> None:
    """A newcomer reads it in five minutes: at most 250 lines, the composition example near
    the top (before the command line, the families and the privacy summary)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    example = text.index("```python")
    assert example < text.index("## Run and audit") < text.index("## Mechanism families")
    assert len(text[:example].splitlines()) <= 70


def test_readme_example_imports_from_two_modules() -> None:
    """The composition example imports from ``privstream`` and ``privstream.dataflow`` only."""
    (block, *_) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    modules = set(re.findall(r"^(?:from (\S+) import|import (\S+))", block, re.M))
    assert {a or b for a, b in modules} == {"privstream", "privstream.dataflow"}


def test_import_privstream_does_not_import_bytewax() -> None:
    """The engine-free face stays engine-free, the family lookup included; the dataflow face
    re-exports Bytewax's own objects."""
    code = (
        "import sys, privstream\n"
        "assert privstream.family('ldp-ids').name == 'ldp-ids'\n"
        "assert privstream.FrequencyTask(4).d == 4\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'bytewax'))\n"
        "import bytewax.operators, bytewax.testing, privstream.dataflow as d\n"
        "assert d.op is bytewax.operators and d.run_main is bytewax.testing.run_main\n"
        "from privstream.operators.family import family_mechanisms\n"
        "assert d.family_mechanisms is family_mechanisms\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_resolves() -> None:
    """Every relative link (``[text](target)``, the anchor dropped) of the README and the docs
    pages names an existing file or folder."""
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor in the page itself, or a URL
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_docs_index_lists_every_page() -> None:
    """docs/README.md links every page of docs/."""
    index = (DOCS / "README.md").read_text()
    linked = {(DOCS / t.split("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", index)}
    pages = {p.resolve() for p in DOCS.rglob("*.md") if p.name != "README.md"}
    assert pages <= linked, sorted(str(p) for p in pages - linked)


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README lost its example"
    return str(blocks[0])


def test_readme_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example runs with a real key from ``$PRIVSTREAM_SECRET`` (never an int seed: its
    releases are not marked insecure) and releases every slot."""
    monkeypatch.setenv("PRIVSTREAM_SECRET", secrets.token_hex(32))
    blocks = [_example()]
    assert "secret=NoiseKey.from_env()" in blocks[0]
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    releases = namespace["releases"]
    assert isinstance(releases, list) and [r.slot for r in releases] == list(range(1, 41))
    assert not any(r.insecure_seed for r in releases)


def test_readme_example_without_a_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copied without ``$PRIVSTREAM_SECRET``, the example stops before any release and says how
    to make a key."""
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)
    with pytest.raises(SecretError, match=r"\$PRIVSTREAM_SECRET is not set; make one with"):
        exec(compile(_example(), str(README), "exec"), {})


@pytest.mark.parametrize("page", ["README.md", "docs/composing.md"])
def test_composition_examples_pass_mypy_strict(tmp_path: Path, page: str) -> None:
    """The README's example and docs/composing.md's Kafka example type-check under
    ``mypy --strict`` (the split is typed, ``run_main`` has its signature), with this checkout's
    privstream."""
    (block, *_) = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    example = tmp_path / "compose_example.py"
    example.write_text(block)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MYPYPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file",
         str(ROOT / "pyproject.toml"), str(example)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found in 1 source file" in done.stdout


def _shell_lines(*pages: Path) -> list[str]:
    """The pages' shell commands, continuation lines joined, comments dropped."""
    blocks = [b for page in pages for b in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S)]
    text = "\n".join(blocks).replace("\\\n", " ")
    return [" ".join(line.split("  #")[0].split()) for line in text.splitlines() if line.strip()]


def _smaller(line: str) -> str:
    """The same command on a smaller population and stream (the options stay as written)."""
    line = re.sub(r"--users \d+", "--users 2000", line)
    line = re.sub(r"--slots \d+", "--slots 30", line)
    line = re.sub(r"users=\d+", "users=2000", line)
    line = re.sub(r"slots=\d+", "slots=30", line)
    line = re.sub(r"--population \d+", "--population 2000", line)
    return re.sub(r"(^|\) )python ", rf"\g<1>{sys.executable} ", line)


def _shell(cwd: Path) -> dict[str, Any]:
    """``subprocess.run`` options for a documented command: bash in ``cwd``, this Python's
    ``privstream`` on the PATH, no ``PRIVSTREAM_`` variable of the caller's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVSTREAM_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {"cwd": cwd, "env": env, "shell": True, "executable": "/bin/bash"}


def test_readme_run_commands_work_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every documented ``privstream run`` on a synthetic stream of the README and docs/cli.md
    (the Kafka ones are exercised by tests/integration) and the Bytewax runner line: with the
    secret made as the README says, several mechanisms with their budget split, all succeed."""
    lines = _shell_lines(README, DOCS / "cli.md")
    keygen = next(line for line in lines if "secrets.token_hex" in line)
    runs = [
        line
        for line in lines
        # Kafka runs (topics, or a flow file's) are exercised by tests/integration
        if (
            line.startswith("privstream run ")
            and "--input-topic" not in line
            and "--config" not in line
        )
        or "bytewax.run" in line
    ]
    assert len(runs) >= 3, runs
    shell = _shell(tmp_path)
    subprocess.run(_smaller(keygen), check=True, timeout=60, **shell)
    assert len((tmp_path / "noise.key").read_text().strip()) == 64
    for line in runs:
        for old in tmp_path.glob("*.jsonl"):
            old.unlink()
        done = subprocess.run(
            _smaller(line) + (" --no-progress" if line.startswith("privstream") else ""),
            capture_output=True, text=True, timeout=300, **shell,
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr[-2000:])
        releases = [json.loads(x) for x in (tmp_path / "releases.jsonl").read_text().splitlines()]
        assert releases and not any(r["insecure_seed"] for r in releases), line


def test_readme_run_and_audit_pass_as_written(tmp_path: Path) -> None:
    """The README's one ``privstream run`` and its ``privstream audit`` of those outputs, on a
    smaller population: the run writes releases and ledger, and the audit passes (exit 0)."""
    lines = _shell_lines(README)
    keygen = next(line for line in lines if "secrets.token_hex" in line)
    (run,) = [line for line in lines if line.startswith("privstream run ")]
    (audit,) = [line for line in lines if line.startswith("privstream audit ")]
    shell = _shell(tmp_path)
    subprocess.run(_smaller(keygen), check=True, timeout=60, **shell)
    for line in (_smaller(run) + " --no-progress", _smaller(audit) + " --json report.json"):
        done = subprocess.run(line, capture_output=True, text=True, timeout=300, **shell)
        assert done.returncode == 0, (line, done.stderr[-2000:])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["counts"]["releases"] == 30
    assert report["counts"]["missing_slots"] == 0 and report["counts"]["windows_over_users"] == 0


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    cli = (DOCS / "cli.md").read_text()
    assert "make demo" in cli and "demo-out/results.json" in cli


def _documented(section: str) -> set[str]:
    return set(re.findall(r"^\| `(privstream_[a-z0-9_]+)` \|", section, re.M))


def test_operations_page_documents_every_exported_metric() -> None:
    """docs/operations.md: the public table lists exactly the default registry's
    ``privstream_`` metrics (the allow-list ``PUBLIC_METRICS``); the "Internal metrics" table
    exactly ``INTERNAL``'s."""
    from prometheus_client import REGISTRY

    import privstream.connectors.kafka_health
    import privstream.runtime.heartbeat  # noqa: F401  (defines the cluster members' progress)
    from privstream.operators.metrics import INTERNAL, PUBLIC_METRICS
    from tests.metric_names import exposed_name

    def exported(registry: Any) -> set[str]:
        return {exposed_name(m) for m in registry.collect() if m.name.startswith("privstream_")}

    text = (DOCS / "operations.md").read_text()
    metrics = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    public, internal = metrics.split("\n### Internal metrics\n", 1)
    assert len(PUBLIC_METRICS) >= 25 and _documented(public) == exported(REGISTRY)
    assert exported(REGISTRY) == PUBLIC_METRICS
    assert (
        _documented(internal)
        == exported(INTERNAL)
        == {
            "privstream_internal_events_total",
            "privstream_internal_events_rejected_total",
            "privstream_internal_late_events_total",
            "privstream_internal_markers_ignored_total",
            "privstream_internal_step_seconds",
            "privstream_internal_last_progress_timestamp_seconds",
            "privstream_internal_dead_letters_undeliverable_total",
            "privstream_internal_consumer_lag",
        }
    )
    for phrase in ("true event counts", "--internal-metrics-port", "same access as the input"):
        assert phrase in " ".join(internal.split()), phrase


def test_the_docs_stand_alone() -> None:
    """The repository is all a user gets: no page sends a reader to the developers' specs."""
    pages = [
        README,
        *sorted((README.parent / "docs").rglob("*.md")),
        README.parent / "bench" / "README.md",
        *sorted((README.parent / "deploy").rglob("*.md")),
    ]
    for page in pages:
        text = page.read_text()
        assert "../shared" not in text and "shared/specs" not in text, page
    assert (README.parent / "docs" / "architecture.md").is_file()
    assert {p.stem for p in (README.parent / "docs" / "families").glob("*.md")} >= {
        "ldp-ids",
        "personalized",
    }
