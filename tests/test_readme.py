"""The README's composition example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_readme_documents_every_exported_metric() -> None:
    from prometheus_client import REGISTRY

    import privstream.operators.metrics  # noqa: F401 - registers the metrics

    # Counters are exposed with a _total suffix that the family name leaves off.
    exported = {
        m.name + ("_total" if m.type == "counter" else "")
        for m in REGISTRY.collect()
        if m.name.startswith("privstream_")
    }
    documented = set(re.findall(r"^\| `(privstream_[a-z_]+)` \|", README.read_text(), re.M))
    assert len(exported) >= 19 and documented == exported
