"""SaO2's server stage behind a shuffler (issue 25): the aggregator, engine-free. It reads only
the shuffler's batches (``schema.shuffle.Batch``: per block the symbol counts and the manifest)
and releases, at every slot whose blocks have all arrived, ``x̂̄_t`` with its standard error and
prefix sum, exactly as the simulated ``mechanisms.sao2.Sao2Mechanism`` (E1, Algorithm 2), with
the batch size ``n`` of each block's manifest as ``n_h`` — also for the central ε_c it states
(Lemma 3.4 at ``n_h``; spec §7.1).

**Guarantee.** The devices randomise (ε per horizon, ε_life over their lifetime, enforced by
their own ledgers); the shuffler forwards counts only; this stage sees neither a device id nor a
report. Its ledger mirrors the devices' spend: ε at each horizon's start for the devices that
report, never past ε_life (it publishes no task beyond it). A block dropped below ``n_min``
leaves the slots that need it unknown: they repeat the last release (``approximate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.contract import ClassSpend, LedgerEntry, Release, Slot, Strategy
from privstream.mechanisms.sao2 import LIFETIME, Sao2Ledger, Sao2Mechanism, Sao2Release
from privstream.mechanisms.sao2_encoding import level_lengths, reconstruct_at
from privstream.mechanisms.sao2_exsub import value_estimate
from privstream.mechanisms.seeding import NoiseKey, SlotRandomness
from privstream.mechanisms.shuffle_accountant import classical_bound
from privstream.schema.shuffle import Batch, Sao2Task

ACCOUNTANT = "classical-7.1"


def tasks_for(
    mech: Sao2Mechanism, stream: str, key: NoiseKey | int, horizons: int
) -> list[Sao2Task]:
    """The public tasks of the first ``horizons`` horizons (never more than ε_life holds): the
    mechanism's parameters and a salt for the level rule drawn from the keyed randomness of the
    horizon's first slot — fixed before any report, independent of the data."""
    cfg = mech.config
    allowed = math.floor(cfg.lifetime / cfg.epsilon + 1e-9)
    out = []
    for h in range(min(horizons, allowed)):
        first = h * cfg.window + 1
        salt = SlotRandomness(key, stream, first, mech.name)("shuffled/salt").bytes(16).hex()
        out.append(Sao2Task(stream, h, first, cfg.window, cfg.r, cfg.s, cfg.task.d,
                            cfg.task.kind, float(cfg.epsilon), float(cfg.lifetime), mech.m_h,
                            tuple(float(w) for w in mech.weights), salt))  # fmt: skip
    return out


@dataclass
class ShuffledState:
    """One stream's aggregator: the batches of the horizon in progress (one per block key),
    the level means so far, the next slot to release, the prefix sum and the last release."""

    released: int = 0
    batches: dict[tuple[int, int, int], Batch] = field(default_factory=dict)
    levels: dict[int, list[NDArray[np.float64]]] = field(default_factory=dict)
    n_h: dict[int, tuple[int, ...]] = field(default_factory=dict)
    prefix: tuple[float, ...] = ()
    estimate: tuple[float, ...] = ()
    source_slot: int | None = None
    spent: float = 0.0
    """ε the reporting devices have spent (ε at each horizon start with reports)."""


@dataclass(frozen=True)
class Taken:
    """What one batch produced: the events of the slots it completed, and whether it was a
    refused one (``why``: a dead-letter reason)."""

    events: list[Release | LedgerEntry]
    why: str | None = None


class ShuffledAggregator:
    """The server stage of one SaO2 stream on shuffled batches (module docstring)."""

    def __init__(self, mech: Sao2Mechanism, stream: str, tasks: list[Sao2Task]) -> None:
        self.mech, self.stream = mech, stream
        self.tasks = {t.horizon: t for t in tasks}
        self.ids = {t.id: t for t in tasks}

    def initial(self) -> ShuffledState:
        d = self.mech.config.task.d
        return ShuffledState(prefix=(0.0,) * d, estimate=(0.0,) * d)

    def take(self, state: ShuffledState, batch: Batch) -> Taken:
        task = self.ids.get(batch.task)
        if task is None or (batch.stream, batch.horizon) != (task.stream, task.horizon):
            return Taken([], "unknown_task")
        if batch.slot != task.block_end(batch.level, batch.block) or batch.level >= len(task.m):
            return Taken([], "shape_mismatch")
        key = (batch.horizon, batch.level, batch.block)
        kept = state.batches.setdefault(key, batch)
        if kept != batch:
            return Taken([], "conflicting_batch")
        if kept is not batch or batch.slot <= state.released:
            return Taken([])  # a re-forwarded copy (same bytes): one record per key
        events: list[Release | LedgerEntry] = []
        while self._ready(state, state.released + 1):
            events += self._release(state, state.released + 1)
        return Taken(events)

    def _ready(self, state: ShuffledState, slot: int) -> bool:
        task = self._task_at(slot)
        return task is not None and all(
            (task.horizon, h, j) in state.batches for h, j in task.ending(slot)
        )

    def _task_at(self, slot: int) -> Sao2Task | None:
        return self.tasks.get((slot - 1) // self.mech.config.window)

    def _release(self, state: ShuffledState, slot: int) -> list[Release | LedgerEntry]:
        task = self._task_at(slot)
        assert task is not None
        cfg, tau = self.mech.config, slot - task.first_slot + 1
        levels = state.levels.setdefault(task.horizon, [
            np.full((T_h, cfg.task.d), np.nan) for T_h in level_lengths(cfg.window, cfg.r)
        ])  # fmt: skip
        n_h = list(state.n_h.get(task.horizon, (0,) * len(levels)))
        for h, j in task.ending(slot):
            batch = state.batches[(task.horizon, h, j)]
            n_h[h] = batch.n
            if batch.plus is not None and batch.minus is not None and batch.n > 0:
                levels[h][j - 1] = value_estimate(np.asarray(batch.plus), np.asarray(batch.minus),
                                                  batch.n, self.mech.params[h])  # fmt: skip
        state.n_h[task.horizon] = tuple(n_h)
        state.released = slot
        x = reconstruct_at(tau, levels, cfg.r)
        strategy: Strategy = "approximate" if np.isnan(x).any() else "publish"
        return self._events(state, task, slot, tau, x, strategy)

    def _events(self, state: ShuffledState, task: Sao2Task, slot: int, tau: int,
                x: NDArray[np.float64], strategy: Strategy) -> list[Release | LedgerEntry]:  # fmt: skip
        mech, cfg = self.mech, self.mech.config
        if strategy == "publish":
            state.estimate, state.source_slot = tuple(float(v) for v in x), slot
        state.prefix = tuple(p + e for p, e in zip(state.prefix, state.estimate, strict=True))
        n_h = state.n_h[task.horizon]
        central = tuple(classical_bound(float(cfg.epsilon), n, cfg.delta).epsilon if n
                        else float(cfg.epsilon) for n in n_h)  # fmt: skip
        se = mech.stderr(tau, n_h) if strategy == "publish" and all(n_h[h] for h, _ in
                                                                    task.ending(slot)) else None  # fmt: skip
        at = Slot(self.stream, slot, None, None)  # type: ignore[arg-type]
        release = mech.release(at, strategy, state.estimate, state.source_slot, Sao2Release(
            task.horizon, tau, se, state.prefix, n_h, mech.m_h, central, ACCOUNTANT, cfg.delta))  # fmt: skip
        charged = float(cfg.epsilon) if tau == 1 and sum(n_h) > 0 else 0.0
        state.spent += charged
        spent = state.spent
        details = Sao2Ledger(task.horizon, tau, cfg.s, cfg.r, cfg.window, cfg.epsilon,
                             cfg.lifetime, spent, sum(n_h), 0, cfg.d_primes, mech.m_h, n_h,
                             tuple(float(w) for w in mech.weights), central, ACCOUNTANT,
                             cfg.delta, se, mech.n_min, sum(1 for n in n_h if 0 < n < mech.n_min),
                             mech.subgroup_cdf, "shuffler")  # fmt: skip
        spend = ClassSpend(LIFETIME, cfg.lifetime, max(sum(n_h), 1), charged, spent)
        return [release, mech.ledger_entry(at, (spend,), details)]


def horizons_needed(slots: int, window: int) -> int:
    """Horizons that cover ``slots`` slots."""
    return max(1, -(-slots // window))
