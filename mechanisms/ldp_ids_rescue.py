"""LB-RescueDP and LP-RescueDP: RescueDP's adaptive sampling adapted to LDP, without dynamic
grouping (spec ``ldp-ids.md`` §3.9, Alg. 5 for LP; LB inferred; gap A22).

At a sampling slot the users report and a per-bin Kalman filter corrects its prediction with
their estimate; between sampling slots the filter's prediction (the last release) is repeated.
A PID controller on the change between consecutive sampled releases sets the next sampling
interval ``I``, and each sample takes the log-decaying share ``p = min(φ·ln(I+1), p_max)`` of
what the window has left.

**Guarantee: w-event ε-LDP for every user** (spec §1.3). There is no dissimilarity step: the
schedule depends only on released values (post-processing), so every report feeds a release.

* LB-RescueDP (budget division, Thm 4.1): all users report with
  ``ε_t = min(p·ε_A, ε_max)``, ``ε_A = ε − Σ_{k=t−w+1}^{t−1} ε_k``; so ``ε_t ≤ ε_A`` and any
  ``w`` consecutive slots spend at most ε. ``BudgetLedger`` refuses anything more.
* LP-RescueDP (population division, Thm 5.2): ``n_t = min(⌊p·n_A⌋, n_max)`` users of ``U_A``
  report once with ε; ``PopulationLedger`` refuses a user who reported within ``w`` slots.

The Kalman filter is public: its process variance ``Q`` is a prior from the configuration and
its measurement variance is ``R = κ_R·V(ε_t, n_t)``, the oracle's known variance. The public
central-DP port took its process variance from the raw stream, which leaks the data; here
nothing of the stream but the released estimate enters the filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import Aggregate
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.control import Pid, kalman_correct, kalman_predict
from privstream.mechanisms.ldp_ids import (
    LdpIdsConfig,
    LdpIdsMechanism,
    LdpIdsState,
    _Outcome,
)
from privstream.mechanisms.rounds import Request

DIFFUSE: Final = 1.0
"""The filter's initial variance (spec §3.9 init): the first correction about trusts the
measurement."""


@dataclass
class RescueControl:
    """RescueDP's controller state (spec §3.13): the filter's per-bin variance ``P``, the
    interval ``I``, the next sampling step ``s``, the last π PID errors, and the last share
    and gain (for the release's ``control``)."""

    variance: NDArray[np.float64]
    interval: float = 1.0
    next_step: int = 1
    errors: tuple[float, ...] = ()
    share: float | None = None
    gain: float | None = None


class RescueDP(LdpIdsMechanism):
    """The sampling schedule and the filter both variants share; the subclasses size a
    sample (``sample_request``) from what the window has left (``available``)."""

    def __init__(self, config: LdpIdsConfig) -> None:
        super().__init__(config)
        g = config.pid_gains
        self.pid = Pid(g[0], g[1], g[2], config.pid_span)

    def initial_state(self) -> LdpIdsState:
        state = super().initial_state()
        state.controller = RescueControl(np.full(self.config.task.d, DIFFUSE))
        return state

    def available(self, state: LdpIdsState) -> float:
        """What the window has left for this slot: ``ε_A`` or ``n_A``."""
        raise NotImplementedError

    def sample_request(self, state: LdpIdsState, slot: Slot, share: float) -> Request | None:
        """The sample's request at share ``p`` (charged), or None when it would ask nobody."""
        raise NotImplementedError

    def decide(self, state: LdpIdsState, slot: Slot) -> _Outcome:
        """Spec §3.9 lines 1–8: predict; at a sampling step ask for a sample, correct the
        filter with its estimate, and set the next sampling step."""
        ctl: RescueControl = state.controller
        prior_variance = kalman_predict(ctl.variance, self.config.process_variance)
        remaining = self.available(state)
        if state.t != ctl.next_step:
            ctl.variance = prior_variance
            return self.repeat(state, remaining)
        cfg = self.config
        ctl.share = min(cfg.decay_scale * math.log(ctl.interval + 1), cfg.max_share)
        ask = self.sample_request(state, slot, ctl.share)
        agg = None if ask is None else slot.client.collect(ask.users, ask.epsilon, "m2")
        if ask is None or agg is None or agg.reports == 0:
            ctl.variance, ctl.next_step = prior_variance, state.t + 1  # line 4: no sample
            out = self.repeat(state, remaining)
            out.eps2 = 0.0 if ask is None else ask.epsilon
            return out
        return self.sample(state, slot, ask.epsilon, agg, prior_variance, remaining)

    def repeat(self, state: LdpIdsState, remaining: float) -> _Outcome:
        """An approximating slot: the release is the filter's prediction, the last release."""
        return _Outcome("approximate", remaining=remaining, control=self.control(state))

    def sample(
        self,
        state: LdpIdsState,
        slot: Slot,
        eps: float,
        agg: Aggregate,
        prior_variance: NDArray[np.float64],
        remaining: float,
    ) -> _Outcome:
        """Lines 6–8: the Kalman correction with ``R = κ_R·V(ε_t, n_t)``, the PID feedback on
        the change from the previous sampled release, and the next interval (A22)."""
        cfg, ctl, t = self.config, state.controller, state.t
        v = self.V(eps, agg.reports)
        estimate, ctl.variance, gain = kalman_correct(
            state.r_prev, prior_variance, agg.estimate, cfg.measurement_factor * v
        )
        change = float(np.mean(np.abs(estimate - state.r_prev)))
        delta, ctl.errors = self.pid.output(ctl.errors, change, dt=t - state.l)
        ratio = delta**2 / v if cfg.interval_rule == "normalized" else (delta / v) ** 2
        ctl.interval = max(1.0, ctl.interval + cfg.interval_gain * (1 - ratio))
        ctl.next_step = t + max(1, math.floor(ctl.interval + 0.5))
        ctl.gain = float(gain[0])
        state.r_prev, state.l, state.source_slot = estimate, t, slot.index
        return _Outcome(
            "publish",
            eps2=eps,
            users2=agg.reports,
            err=v,
            bits=self.bits(agg, instructed=True),
            remaining=remaining,
            control=self.control(state),
        )

    @staticmethod
    def control(state: LdpIdsState) -> dict[str, float | None]:
        ctl: RescueControl = state.controller
        return {
            "interval": ctl.interval,
            "share": ctl.share,
            "gain": ctl.gain,
            "variance": float(ctl.variance[0]),
            "next_slot": float((state.last_slot or 0) + ctl.next_step - state.t),
        }


class LBRescueDP(RescueDP):
    """LB-RescueDP (spec §3.9, inferred): all users report at a sampling slot with
    ``ε_t = min(p·ε_A, ε_max)``, ``ε_max = max_budget_share·ε`` (default ε/2)."""

    name = "LB-RescueDP"
    division = "budget"

    def available(self, state: LdpIdsState) -> float:
        cfg, t, ledger = self.config, state.t, state.budget
        assert ledger is not None
        return cfg.epsilon - ledger.spent(t - cfg.window + 1, t - 1)

    def sample_request(self, state: LdpIdsState, slot: Slot, share: float) -> Request | None:
        cfg = self.config
        eps = min(share * self.available(state), cfg.max_budget_share * cfg.epsilon)
        return self.ask_all(state, eps, "m2") if eps > 0 else None


class LPRescueDP(RescueDP):
    """LP-RescueDP (spec §3.9, Alg. 5): ``n_t = min(⌊p·n_A⌋, n_max)`` users of ``U_A``
    report with ε, ``n_A = n − Σ_{k=t−w+1}^{t−1} n_k``, ``n_max`` default ``⌊n/2⌋``."""

    name = "LP-RescueDP"
    division = "population"

    def available(self, state: LdpIdsState) -> float:
        assert state.population is not None
        return state.population.available_count(state.t)

    def sample_request(self, state: LdpIdsState, slot: Slot, share: float) -> Request | None:
        n_max = self.config.max_users or self.n // 2
        n_t = min(math.floor(share * self.available(state)), n_max)
        return self.ask_sample(state, slot, n_t, "m2") if n_t > 0 else None


MECHANISMS: Final[dict[str, type[LdpIdsMechanism]]] = {m.name: m for m in (LBRescueDP, LPRescueDP)}
"""The RescueDP variants by name, merged into the LDP-IDS family's mechanisms."""
