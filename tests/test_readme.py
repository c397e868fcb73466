"""The README's composition example and its file and synthetic command lines run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README lost its example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    releases = namespace["releases"]
    assert isinstance(releases, list) and [r.slot for r in releases] == list(range(1, 41))


def _shell_lines() -> list[str]:
    """The README's shell commands, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    return [" ".join(line.split("  #")[0].split()) for line in text.splitlines() if line.strip()]


def _smaller(line: str) -> str:
    """The same command on a smaller population and stream (the options stay as written)."""
    line = re.sub(r"--users \d+", "--users 2000", line)
    line = re.sub(r"--slots \d+", "--slots 30", line)
    line = re.sub(r"users=\d+", "users=2000", line)
    line = re.sub(r"slots=\d+", "slots=30", line)
    return re.sub(r"(^|\) )python ", rf"\g<1>{sys.executable} ", line)


def test_readme_run_commands_work_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every documented ``privstream run`` on a synthetic stream (the Kafka ones are exercised
    by tests/integration) and the Bytewax runner line: with the secret made as the README says,
    several mechanisms with their budget split, all succeed."""
    lines = _shell_lines()
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVSTREAM_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    shell = {"cwd": tmp_path, "env": env, "shell": True, "executable": "/bin/bash"}
    subprocess.run(_smaller(keygen), check=True, timeout=60, **shell)  # type: ignore[call-overload]
    assert len((tmp_path / "noise.key").read_text().strip()) == 64
    for line in runs:
        for old in tmp_path.glob("*.jsonl"):
            old.unlink()
        done = subprocess.run(
            _smaller(line) + (" --no-progress" if line.startswith("privstream") else ""),
            capture_output=True, text=True, timeout=300, **shell,  # type: ignore[call-overload]
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr[-2000:])
        releases = [json.loads(x) for x in (tmp_path / "releases.jsonl").read_text().splitlines()]
        assert releases and not any(r["insecure_seed"] for r in releases), line


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def _documented(section: str) -> set[str]:
    return set(re.findall(r"^\| `(privstream_[a-z_]+)` \|", section, re.M))


def test_readme_documents_every_exported_metric() -> None:
    """The public table lists exactly the default registry's ``privstream_`` metrics (the
    allow-list ``PUBLIC_METRICS``); the "Internal metrics" table exactly ``INTERNAL``'s."""
    from prometheus_client import REGISTRY

    import privstream.connectors.kafka_health
    import privstream.runtime.heartbeat  # noqa: F401  (defines the cluster members' progress)
    from privstream.operators.metrics import INTERNAL, PUBLIC_METRICS
    from tests.metric_names import exposed_name

    def exported(registry: Any) -> set[str]:
        return {exposed_name(m) for m in registry.collect() if m.name.startswith("privstream_")}

    text = README.read_text()
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
