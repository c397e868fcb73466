"""Generates tests/client/vectors/randomizers.json from the device library with recorded
randomness: ``python -m tests.client.make_vectors`` (test_vectors.py checks the file is current)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from privstream.client.randomizers import RecordingRandomness, randomize
from tests.client.helpers import SeededRandomness

PATH = Path(__file__).parent / "vectors" / "randomizers.json"
SEEDS = range(4)
CASES: list[tuple[str, float, int | None, list[Any]]] = [
    ("GRR", 0.5, 2, [0, 1]),
    ("GRR", 1.0, 5, [0, 3]),
    ("GRR", 3.0, 16, [7, 15]),
    ("OUE", 0.5, 4, [0, 3]),
    ("OUE", 2.0, 8, [5]),
    ("OLH", 1.0, 10, [0, 9]),
    ("OLH", 3.0, 100, [42]),
    ("HM", 0.4, None, [-1.0, 0.25]),
    ("HM", 1.0, None, [-0.3, 0.0, 0.7]),
    ("HM", 4.0, None, [1.0, 2.5, -0.9]),
]


def generate() -> dict[str, Any]:
    """Every case × value × seed: the draws the device consumed and the report it made."""
    vectors: list[dict[str, Any]] = []
    for oracle, eps, d, values in CASES:
        for value in values:
            for seed in SEEDS:
                rng = RecordingRandomness(SeededRandomness(1000 * seed + len(vectors)))
                report = randomize(oracle, value, eps, d or 0, rng)
                vectors.append({
                    "oracle": oracle, "epsilon": eps, "d": d, "value": value,
                    "draws": [list(draw) for draw in rng.draws],
                    "report": list(report) if isinstance(report, tuple) else report,
                })  # fmt: skip
    return {"format": "privstream-client-vectors", "version": 1, "vectors": vectors}


def render() -> str:
    """The file's text: one vector per line, so a diff shows which vector changed."""
    doc = generate()
    lines = ",\n".join("  " + json.dumps(v) for v in doc["vectors"])
    return (
        f'{{"format": "{doc["format"]}", "version": {doc["version"]}, "vectors": [\n{lines}\n]}}\n'
    )


if __name__ == "__main__":
    PATH.write_text(render())
