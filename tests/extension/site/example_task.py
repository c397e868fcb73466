"""A family from another distribution with a NEW task type: the fraction of users whose value
exceeds a public threshold ``X`` (``--threshold X``, flow key ``threshold = X``).

Each user reports the bit ``[v > X]`` through an LDP frequency oracle over two categories
(GRR or OUE by Ada), so LDP-IDS's LBU and LPU estimate it unchanged: the release is the
histogram ``(1 − f, f)`` with ``f`` the fraction above ``X``. It declares its task type, its
dataset and its bench in this module; nothing in privstream names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family, FlowTable, TaskType
from privstream.mechanisms import ldp_ids
from privstream.mechanisms.oracles import FrequencyOracle
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask


@dataclass(frozen=True)
class ThresholdTask(EstimationTask):
    """The fraction of users whose value exceeds ``threshold``: a two-category histogram of the
    bit ``[v > threshold]`` (category 1: above)."""

    threshold: float
    d: int = 2
    kind: str = "frequency"

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold!r}")

    def select(self, eps: float) -> FrequencyOracle:
        return FrequencyTask(2).select(eps)

    def in_domain(self, values: NDArray[np.float64]) -> NDArray[np.bool_]:
        return np.asarray(np.isfinite(np.asarray(values, dtype=np.float64)), dtype=bool)

    def encode(self, values: NDArray[Any]) -> NDArray[np.int64]:
        return (np.asarray(values, dtype=np.float64) > self.threshold).astype(np.int64)


def parse_threshold(text: str) -> ThresholdTask:
    """``--threshold X``: the task of the fraction above ``X``."""
    return ThresholdTask(float(text))


def _threshold_flow(t: FlowTable) -> ThresholdTask:
    try:
        return ThresholdTask(t.number("threshold"))
    except ValueError as exc:
        raise t.error("threshold", str(exc)) from None


THRESHOLD: Final = TaskType(
    name="threshold",
    key="threshold",
    describe="threshold = x (the fraction of users above x)",
    parse_flow=_threshold_flow,
    classes=(ThresholdTask,),
    flag="--threshold",
    help="X: estimate the fraction of users whose value exceeds X",
    parse_flag=parse_threshold,
    show=lambda task: f"threshold {task.threshold:g}",
)


class Drifting:
    """Synthetic values in [0, 1]: user u's value at slot t is ``frac(u/n + 0.1·sin(t/5)) +``
    a small seeded jitter; its truth is the exact fraction above the task's threshold."""

    numeric = True
    d = 1
    bounds = (0.0, 1.0)

    def __init__(self, users: int, slots: int, seed: int, task: EstimationTask | None) -> None:
        self.name, self.users, self.slots, self.seed = "drift", users, slots, seed
        self.task = task if isinstance(task, ThresholdTask) else ThresholdTask(0.5)

    def values(self, slot: int) -> NDArray[np.float64]:
        jitter = np.random.default_rng((self.seed, slot)).uniform(-0.01, 0.01, self.users)
        base = np.arange(self.users) / self.users + 0.1 * math.sin(slot / 5)
        return np.clip(np.mod(base, 1.0) + jitter, 0.0, 1.0)

    def truth(self, slot: int) -> NDArray[np.float64]:
        above = float(np.mean(self.values(slot) > self.task.threshold))
        return np.array([1.0 - above, above])


def _score(run: Any) -> dict[str, float]:
    """Mean absolute error of the fraction above the threshold, and the publications."""
    error = np.abs(np.asarray(run.estimates)[:, 1] - np.asarray(run.truth)[:, 1])
    publications = sum(1 for s in run.strategies if s == "publish")
    return {"mae": float(error.mean()), "publications": float(publications)}


MECHANISMS: Final = {name: ldp_ids.MECHANISMS[name] for name in ("LBU", "LPU")}

FAMILY: Final = Family(
    name="example-task",
    summary="worked example: the fraction of users above a threshold (w-event ε-LDP)",
    mechanisms=MECHANISMS,
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=5,
    users=4000,
    default="LBU",
    task=ThresholdTask(0.5),
    tasks=(THRESHOLD,),
    datasets={"drift": Drifting},
    bench=BenchSpec(
        datasets=("drift",), files=False, counts=False, score=_score,
        fields=("mae", "publications"), mechanisms=tuple(MECHANISMS), users=4000, slots=20,
    ),
)  # fmt: skip
