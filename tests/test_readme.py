"""The README's composition example runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README lost its example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    releases = namespace["releases"]
    assert isinstance(releases, list) and [r.slot for r in releases] == list(range(1, 41))


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def _documented(section: str) -> set[str]:
    return set(re.findall(r"^\| `(privstream_[a-z_]+)` \|", section, re.M))


def test_readme_documents_every_exported_metric() -> None:
    """The public table lists exactly the default registry's ``privstream_`` metrics (the
    allow-list ``PUBLIC_METRICS``); the "Internal metrics" table exactly ``INTERNAL``'s."""
    from prometheus_client import REGISTRY

    from privstream.operators.metrics import INTERNAL, PUBLIC_METRICS, exposed_name

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
            "privstream_internal_step_seconds",
        }
    )
    for phrase in ("true event counts", "--internal-metrics-port", "same access as the input"):
        assert phrase in " ".join(internal.split()), phrase
