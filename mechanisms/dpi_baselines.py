"""DPI's harness baselines B1 and B3 (spec ``dpi.md`` §7), on DPI's contract: same ``DpiConfig``,
trust mode ``cdp``, release key ``query`` (one release per slot, the PDF of a query drawn
uniformly from the public pool with the slot's keyed randomness), lifetime ledger.

* ``DPI-uniform`` (B1, spec §7): always releases ``uniform(k)``. **Guarantee: 0-DP** — the
  release depends on nothing but public facts and the slot's randomness; it charges nothing,
  and its declared guarantee states the stream's ε only as its cap.
* ``Laplace-horizon`` (B3, spec §7): a user-level Laplace histogram over a **finite horizon**
  ``T`` (``DpiConfig.window``, ``--window T``; DPI itself ignores ``window``). At every slot the
  count histogram of the slot (one event per user per slot, the ingest's rule, so ``c_max = 1``
  and one user moves it by at most ``Δ = 2·c_max = 2`` in L1) gets exact discrete Laplace noise
  ``DLap(b)``, ``b ≥ 2T/ε`` on the public grid (``mechanisms.noise``), is clipped at 0 and
  normalised to a PDF (post-processing; uniform if all zero). **Guarantee: pure ε-DP over the
  stream's lifetime against user-level neighbours** (all of one user's records added or
  removed), trusted curator: each slot is ``Δ/b ≤ ε/T``-DP and the ledger admits at most ``T``
  slots. The ``T+1``-th charge is refused (``PrivacyBudgetExceeded``) before anything of the slot
  is read or released, so the stream halts with that reason — the point of the comparison: a
  finite-horizon mechanism must stop, DPI never has to.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Details,
    Event,
    ExtraRecord,
    Slot,
)
from privstream.mechanisms.dpi import (
    LIFETIME,
    DpiConfig,
    DpiMechanism,
    DpiState,
    UpdateMode,
    _Slot,
    cfg_query,
)
from privstream.mechanisms.dpi_boosting import Drawn
from privstream.mechanisms.dpi_rba import Draw
from privstream.mechanisms.dpi_series import ZERO_STEPS
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.noise import discrete_laplace
from privstream.mechanisms.personalized import noise_scale

HORIZON_DIVISION: Final = "dpi-horizon"
"""B3's division: every user charged ε/T at each of at most T slots."""
C_MAX: Final = 1
"""Events one user contributes to one slot's histogram (the ingest keeps a user's first)."""
SENSITIVITY: Final = 2 * C_MAX
"""L1 sensitivity of a slot's count histogram under user-level neighbours (spec §7, B3)."""
EXAMPLE_HORIZON: Final = 100
"""The conformance example's horizon T: past the 72 slots its longest check runs."""


def uniform_query(cfg: DpiConfig, slot: Slot) -> int:
    """A query index drawn uniformly from the public pool with the slot's keyed randomness
    (data-independent, so publishing it is free)."""
    return int(slot.randomness("dpi/query").integers(len(cfg.queries)))


class DPIUniform(DpiMechanism):
    """Baseline B1 (spec dpi.md §7): releases ``uniform(k)`` for a uniformly drawn query at every
    slot; 0-DP, so it draws no series element and charges nothing."""

    name = "DPI-uniform"
    update_mode: ClassVar[UpdateMode] = "none"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=DpiMechanism.conformance.invalid,
        skips={"seeding": "B1 releases the constant uniform(k): no noise for a seed to change"},
    )

    def spend(self, state: DpiState, slot: Slot, targets: list[NDArray[np.float64]]) -> _Slot:
        cfg = self.config
        drawn = Drawn(uniform_query(cfg, slot), np.full(cfg.k, 1.0 / cfg.k),
                      np.zeros(0, dtype=np.int64))  # fmt: skip
        return _Slot(Draw(0, 0.0), ZERO_STEPS, 0.0, 0.0, drawn)


def horizon_scale(epsilon: float, horizon: int) -> Fraction:
    """B3's public noise scale: the grid value ``≥ Δ·T/ε = 2T/ε``, computed exactly (the
    personalized family's ``noise_scale`` at the per-slot budget ``ε/(Δ·T)`` of a unit query)."""
    return noise_scale(Fraction(epsilon) / (SENSITIVITY * horizon))


def noisy_histogram(
    counts: NDArray[np.int64], epsilon: float, horizon: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """``counts + DLap(b)^k`` with ``b = horizon_scale(ε, T)``: ``(ε/T)``-DP for one slot's
    count histogram against user-level neighbours (L1 sensitivity ``2·c_max``). Not clipped."""
    noise = discrete_laplace(rng, horizon_scale(epsilon, horizon), counts.shape[0])
    return np.asarray(counts, dtype=np.int64) + noise


def horizon_spent(epsilon: float, horizon: int, slots: int) -> float:
    """``ε·slots/T``, correctly rounded (exactly ε at ``slots = T``)."""
    return float(Fraction(epsilon) * slots / horizon)


@dataclass(frozen=True)
class HorizonRelease(Details):
    """B3's public facts of a release: the query, the per-slot budget ε/T and the noise scale."""

    family: ClassVar[str] = "dpi"
    query: str
    slot_epsilon: float
    scale: float


@dataclass(frozen=True)
class HorizonLedger(Details):
    """B3's facts of a ledger entry: the horizon T, the slot's charge ε/T, the noise scale, the
    lifetime spend ``ε·t/T`` and whether the horizon is spent (the next slot is refused)."""

    family: ClassVar[str] = "dpi"
    horizon: int
    slot_epsilon: float
    scale: float
    nominal_charge: float
    nominal_spent: float
    exhausted: bool


class LaplaceHorizon(DpiMechanism):
    """Baseline B3 (spec dpi.md §7): a user-level discrete Laplace histogram at ε/T per slot
    over a finite horizon ``T = window``; pure ε-DP over its lifetime, then it must stop."""

    name = "Laplace-horizon"
    division: ClassVar[Any] = HORIZON_DIVISION
    update_mode: ClassVar[UpdateMode] = "none"
    conformance: ClassVar[Conformance] = Conformance(
        invalid=DpiMechanism.conformance.invalid, window=EXAMPLE_HORIZON
    )

    def __init__(self, config: DpiConfig) -> None:
        if config.window < 1:
            raise ValueError(
                f"{self.name} needs its horizon T as window >= 1 (--window T), got "
                f"window={config.window!r}"
            )
        super().__init__(config)

    @property
    def horizon(self) -> int:
        """T: the configured ``window`` (``--window T``)."""
        return self.config.window

    def _advance(self, state: DpiState, slot: Slot) -> list[Event]:
        cfg = self.config
        curator = slot.curator
        self.enter(state, slot, curator.population, cfg.population)
        self.check_horizon(state, slot)
        counts = np.asarray(curator.class_histogram(cfg.epsilon, cfg.window).total, dtype=np.int64)
        noisy = noisy_histogram(counts, cfg.epsilon, self.horizon, slot.randomness("dpi/laplace"))
        targets = self.targets(state, np.maximum(noisy, 0))
        q = uniform_query(cfg, slot)
        state.last[q] = targets[q]
        state.spent_nominal = horizon_spent(cfg.epsilon, self.horizon, state.t)
        state.exhausted = state.t >= self.horizon
        return self.horizon_events(state, slot, q, int(np.sum(counts)))

    def check_horizon(self, state: DpiState, slot: Slot) -> None:
        """Refuse the ``T+1``-th charge before the slot's data are read (the stream halts)."""
        if state.t > self.horizon:
            cfg = self.config
            raise PrivacyBudgetExceeded(
                f"{self.name}: its finite horizon of T = {self.horizon} slots is spent (ε = "
                f"{cfg.epsilon:g}, ε/T per slot), so slot {slot.index} cannot be charged; a "
                "finite-horizon baseline stops here (DPI does not). Start a new stream with a "
                "larger --window T to run longer"
            )

    def horizon_events(self, state: DpiState, slot: Slot, q: int, active: int) -> list[Event]:
        """The release of query ``q``, the ledger entry and the internal audit record."""
        cfg, name = self.config, cfg_query(self.config, q)
        charge = horizon_spent(cfg.epsilon, self.horizon, 1)
        scale = float(horizon_scale(cfg.epsilon, self.horizon))
        release = self.release(slot, "publish", state.last[q], slot.index,
                               HorizonRelease(name, charge, scale), key=(("query", name),))  # fmt: skip
        spend = ClassSpend(LIFETIME, cfg.epsilon, cfg.population, charge, state.spent_nominal)
        details = HorizonLedger(self.horizon, charge, scale, charge, state.spent_nominal,
                                state.exhausted)  # fmt: skip
        audit = ExtraRecord("dpi-audit", slot.stream, self.name, slot.index,
                            {"users_charged": active, "leak_max": state.spent_nominal})  # fmt: skip
        return [release, self.ledger_entry(slot, (spend,), details), audit]


MECHANISMS: Final[dict[str, type[DpiMechanism]]] = {m.name: m for m in (DPIUniform, LaplaceHorizon)}
"""The harness baselines B1 and B3 (B2, ``DPI-prior``, lives with DPI)."""
