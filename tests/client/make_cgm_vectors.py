"""Generates tests/client/vectors/cgm.json from the device's CGM chain step with recorded
randomness: ``python -m tests.client.make_cgm_vectors`` (test_cgm_device.py checks it is current)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privstream.client.cgm import Chain, chain_step, step_state
from privstream.client.randomizers import RecordingRandomness
from tests.client.helpers import SeededRandomness

PATH = Path(__file__).parent / "vectors" / "cgm.json"


@dataclass(frozen=True)
class Step:
    """A CGM step's public parameters (the fields of privstream.schema.protocol.CgmStep)."""

    sigma1: float = 0.5
    grid_bits: int = 8
    lag: int = 1
    bound: float = 0.05
    reuse: bool = True
    gap_aware: bool = False
    lower: float | None = 0.0
    upper: float | None = 1.0
    center: tuple[float, ...] | None = None
    radius: float | None = None


CHAINS: list[tuple[str, Step, list[tuple[int, Any]]]] = [
    ("CGM scalar, differential clip active", Step(),
     [(0, 0.3), (1, 0.42), (2, 0.40), (3, -2.0), (4, 0.2)]),
    ("Algorithm 1 (no reuse)", Step(reuse=False, sigma1=1.5),
     [(0, 0.7), (1, 1.4), (2, 0.1)]),
    ("CGM lag 2, gap-aware, a missed slot", Step(lag=2, gap_aware=True, bound=0.1, lower=-1.0),
     [(0, 0.0), (1, 0.5), (2, 0.2), (5, 0.9), (6, -0.6)]),
    ("CGM over a ball (d = 2)", Step(lower=None, upper=None, center=(0.0, 1.0), radius=2.0,
                                     bound=0.2, sigma1=0.8),
     [(0, [0.5, 1.5]), (1, [3.0, 1.0]), (2, [0.6, 1.2])]),
    ("CGM with bound 0: a running average", Step(bound=0.0, sigma1=3.0),
     [(0, 0.5), (1, 0.9), (2, 0.1)]),
]  # fmt: skip


def generate() -> dict[str, Any]:
    """Every chain: per step, the draws the device consumed and the report it made."""
    out: list[dict[str, Any]] = []
    for k, (name, step, inputs) in enumerate(CHAINS):
        chains: dict[int, Chain] = {}
        steps = []
        for slot, value in inputs:
            rng = RecordingRandomness(SeededRandomness(7919 * k + slot))
            phase = slot % step.lag
            report, chains[phase] = chain_step(chains.get(phase, Chain()), step, slot, value, rng)
            steps.append({"slot": slot, "value": value, "draws": [list(d) for d in rng.draws],
                          "x": list(report.x), "v": report.v})  # fmt: skip
        out.append({"name": name, "step": step_state(step), "steps": steps})
    return {"format": "privstream-client-cgm-vectors", "version": 1, "chains": out}


def render() -> str:
    """The file's text: one chain step per line."""
    doc = generate()
    parts = []
    for chain in doc["chains"]:
        steps = ",\n".join("    " + json.dumps(s) for s in chain["steps"])
        head = json.dumps({"name": chain["name"], "step": chain["step"]})[:-1]
        parts.append(f'  {head}, "steps": [\n{steps}\n  ]}}')
    body = ",\n".join(parts)
    return f'{{"format": "{doc["format"]}", "version": {doc["version"]}, "chains": [\n{body}\n]}}\n'


if __name__ == "__main__":
    PATH.write_text(render())
