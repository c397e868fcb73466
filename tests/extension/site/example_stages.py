"""A family with a second stage keyed by another key (issue 19's worked example, "a second
stage with another key"), from outside privstream's packages.

Two stages per stream: a **device** stage keyed by user shard randomises each user's bit with
randomized response at ε/w per slot (``p = e^{ε/w}/(1+e^{ε/w})``; each shard keeps its own
state: its randomness and how many reports each of its users sent), then the **server** stage
keyed by stream (LBU's logic, spec §3.1, on ``ldp-reports``) de-biases the reports and
releases the frequency of ones. Guarantee: w-event ε-LDP; every report is ε/w-LDP on its
device and no raw value (nor an event's raw line) crosses into the server's trust domain.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from privstream.families.spec import BenchSpec, Family
from privstream.mechanisms import ldp_ids
from privstream.mechanisms.client import Aggregate, ReportPort
from privstream.mechanisms.contract import Conformance, LedgerEntry, Release, Slot
from privstream.mechanisms.stages import (
    DEVICES,
    EVENTS,
    Stage,
    by_user_shard,
    server_stage,
    shard_of,
)
from privstream.mechanisms.trust import TrustMode

SHARDS = 4
DEVICE_SEED = 2024


def keep(eps: float) -> float:
    """Randomized response's probability of reporting the true bit, ``e^ε/(1+e^ε)``."""
    return math.exp(eps) / (1 + math.exp(eps))


@dataclass
class DeviceShard:
    """One user shard's devices: their randomness and the reports each user sent."""

    shard: int | None = None
    rng: np.random.Generator | None = None
    reports: Counter[str] = field(default_factory=Counter)


def randomize(eps: float, state: DeviceShard, batch: Any) -> tuple[DeviceShard, list[Any]]:
    """Randomized response on the devices of one shard: each bit is kept with probability
    ``keep(eps)``, else flipped; the raw lines stay on the devices."""
    if state.rng is None and len(batch):
        state.shard = shard_of(str(batch.users[0]), SHARDS)
        state.rng = np.random.default_rng([DEVICE_SEED, state.shard])
    if not len(batch):
        return state, [replace(batch, raw=None)]
    assert state.rng is not None
    bits = (np.asarray(batch.values, dtype=np.float64) >= 0.5).astype(np.float64)
    flip = state.rng.random(bits.shape[0]) >= keep(eps)
    state.reports.update(str(u) for u in batch.users)
    return state, [replace(batch, values=np.where(flip, 1.0 - bits, bits), raw=None)]


@dataclass(frozen=True)
class RandomizedReports:
    """The server's view of a slot's device reports, as LBU asks for them: ``collect``
    de-biases the reports of the asked users (only at the ε the devices used)."""

    port: ReportPort
    eps: float

    @property
    def population(self) -> int:
        return self.port.population

    def eligible(self) -> NDArray[np.bool_]:
        return self.port.eligible()

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        if not math.isclose(eps, self.eps):
            raise ValueError(f"the devices report at ε {self.eps}, not {eps}")
        asked = np.flatnonzero(self.eligible()) if users is None else users
        m = int(asked.shape[0])
        p = keep(self.eps)
        ones = (float(self.port.reports[asked].sum()) / m - (1 - p)) / (2 * p - 1) if m else 0.0
        return Aggregate(np.array([1.0 - ones, ones]), m, m, "randomized-response")


class RR(ldp_ids.LBU):
    """Randomized response on the devices, LBU on the server (spec §3.1): every user reports
    at ε/w each slot through a device stage keyed by user shard."""

    name = "RR"
    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-reports",)
    conformance = Conformance(
        invalid=ldp_ids.LBU.conformance.invalid,
        skips={"seeding": "the noise is drawn on the devices (the device stage), not from "
               "the server's SlotRandomness"},
    )  # fmt: skip

    @property
    def device_epsilon(self) -> float:
        return float(self.config.epsilon / self.config.window)

    def stages(self) -> tuple[Stage, ...]:
        eps = self.device_epsilon
        device = Stage("randomize", "device", by_user_shard(SHARDS), DEVICES, EVENTS, EVENTS,
                       DeviceShard, lambda state, batch: randomize(eps, state, batch))  # fmt: skip
        return (device, server_stage(self.name, self.initial_state, self.step))

    def step(self, state: Any, slot: Slot) -> tuple[Any, list[Release | LedgerEntry]]:
        port = RandomizedReports(slot.reports, self.device_epsilon)
        return super().step(state, Slot(slot.stream, slot.index, port, slot.randomness))  # type: ignore[arg-type]


def _score(run: Any) -> dict[str, float]:
    return {"mae": float(np.mean(np.abs(run.estimates[:, 1] - run.truth[:, 1])))}


FAMILY = Family(
    name="example-stages",
    summary="randomized response on the devices (keyed by user shard), LBU on the server",
    mechanisms={"RR": RR},
    config=ldp_ids.LdpIdsConfig,
    epsilon=5.0,
    window=5,
    users=2000,
    default="RR",
    bench=BenchSpec(datasets=("sin",), files=False, counts=False, score=_score,
                    fields=("mae",), mechanisms=("RR",), users=2000, slots=20),
)  # fmt: skip
