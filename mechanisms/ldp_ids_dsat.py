"""LB-DSAT and LP-DSAT: DSAT_w's adaptive sampling adapted to LDP (spec ``ldp-ids.md`` §3.8,
Alg. 4 for LP; LB inferred; gaps A18–A21).

Each slot runs the dissimilarity step M1 of LBD/LPD (spec §3.0) and publishes when the
de-biased dissimilarity reaches a threshold ``T̃``; a PID controller moves ``T̃`` so that the
publication rate over the window tracks ``C/w``. At most ``C`` publications fall in any window.

**Guarantee: w-event ε-LDP for every user** (spec §1.3), by the same arguments as LBD/LPD:

* LB-DSAT (budget division, Thm 4.1): M1 charges every user ``βε/w`` at each slot it runs and a
  publication ``(1−β)ε/C``; a publication is allowed only while fewer than C publications lie in
  the Kellaris window ``t−w+1 … t``, so any ``w`` consecutive slots spend at most
  ``w·βε/w + C·(1−β)ε/C = ε``. ``BudgetLedger`` refuses anything more before release.
* LP-DSAT (population division, Thm 5.2): M1 asks ``g1 = ⌊⌊βn⌋/w⌋`` fresh users (A18, not the
  printed ``⌊n1/C⌋``, which overdraws the pool) and a publication ``g2 = ⌊n2/C⌋`` users, each
  reporting once with ε; ``PopulationLedger`` refuses a user who reported within ``w`` slots.

The distance test ``dis ≥ T̃`` is post-processing of M1's reports, whose full cost is charged
at every slot M1 runs: no sparse-vector argument over a sliding window is assumed. ``T̃``
moves only with public counts (publications in the window), so it is public too.

Faults of the public central-DP port avoided here (``docs/families/ldp-ids.md``): its window
summed slots ``t−w … t−2`` (one outside the window, missing ``t−1``); ours is ``t−w+1 … t``;
and its rate divided two integers, so the threshold only ratcheted down; ours is a real ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from privstream.mechanisms.client import Aggregate
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.control import Pid
from privstream.mechanisms.ldp_ids import (
    LdpIdsConfig,
    LdpIdsMechanism,
    LdpIdsState,
    TwoRounds,
    _Outcome,
)
from privstream.mechanisms.rounds import Request


@dataclass
class DsatControl:
    """DSAT's controller state (spec §3.13): the threshold ``T̃``, the last π PID errors, the
    steps of the publications still inside the window, and the last PID output and rate."""

    threshold: float
    errors: tuple[float, ...] = ()
    published: tuple[int, ...] = ()
    feedback: float | None = None
    rate: float | None = None


def publication_rate(count: int, t: int, window: int) -> float:
    """The publication rate of spec §3.8 line 5 (A19): publications in the last ``w−1`` steps
    over ``max(1, min(t−1, w−1))`` — a real ratio, never an integer division."""
    return count / max(1, min(t - 1, window - 1))


class Dsat(TwoRounds):
    """The control logic both DSAT variants share; the subclasses size M1 and M2."""

    def __init__(self, config: LdpIdsConfig) -> None:
        super().__init__(config)
        g = config.pid_gains
        self.pid = Pid(g[0], g[1], g[2], config.pid_span)

    @property
    def C(self) -> int:
        """Publications allowed per window: ``publications`` or ``⌈w/5⌉`` (spec §3.8)."""
        cfg = self.config
        return cfg.publications or max(1, math.ceil(cfg.window / 5))

    @property
    def sigma(self) -> float:
        """The rate tolerance σ (default ``0.1·C/w``)."""
        cfg = self.config
        return cfg.rate_tolerance or 0.1 * self.C / cfg.window

    def initial_state(self) -> LdpIdsState:
        state = super().initial_state()
        state.controller = DsatControl(self.config.initial_threshold or self.publication_error())
        return state

    def publication_error(self) -> float:
        """The default initial threshold T: the error of one publication (spec §3.8)."""
        raise NotImplementedError

    def may_publish(self, state: LdpIdsState) -> tuple[bool, float]:
        """Whether a publication's resource is left in the window, and how much is left."""
        raise NotImplementedError

    def m1_epsilon(self) -> float:
        """The budget a dissimilarity report was made with."""
        raise NotImplementedError

    def publication_request(self, state: LdpIdsState, slot: Slot) -> Request:
        """The M2 request of a publication, charged."""
        raise NotImplementedError

    def recent(self, ctl: DsatControl, t: int) -> tuple[int, ...]:
        """The publications at steps ``t−w+1 … t−1``."""
        return tuple(s for s in ctl.published if s > t - self.config.window)

    def dissimilarity_request(self, state: LdpIdsState, slot: Slot) -> Request | None:
        """M1, unless no publication is left in the window: then the slot approximates
        without M1 (spec §3.8 line 2, A21)."""
        if not self.may_publish(state)[0]:
            return None
        return super().dissimilarity_request(state, slot)

    def skipped(self, state: LdpIdsState) -> _Outcome:
        """A slot without M1. Unlike the literal Alg. 4 the controller still steps: at the
        slots where M1 runs fewer than C publications lie in the last ``w−1`` slots, so the
        rate there is at most ``(C−1)/(w−1) < C/w`` and a controller that stepped only there
        would lower ``T̃`` for ever once ``t > w`` — the ratchet of the public port's integer
        division by another route. The step reads public counts only."""
        ctl: DsatControl = state.controller
        self.steer(ctl, state.t)
        return _Outcome(
            "approximate",
            err=ctl.threshold,
            remaining=self.may_publish(state)[1],
            control=self.control(ctl, ctl.feedback, ctl.rate),
        )

    def steer(self, ctl: DsatControl, t: int) -> None:
        """Spec §3.8 lines 4–8: the rate, the PID output ``u_t`` and the moved threshold,
        ``u_t`` and the ``[0, 2]`` clamp scaled by ``threshold_scale`` (A20)."""
        cfg, target = self.config, self.C / self.config.window
        rate = publication_rate(len(self.recent(ctl, t)), t, cfg.window)
        error = abs(abs(rate - target) - self.sigma) / self.sigma
        u, ctl.errors = self.pid.output(ctl.errors, error)
        u *= cfg.threshold_scale
        if rate - target < 0:
            ctl.threshold = max(0.0, ctl.threshold - u)
        else:
            ctl.threshold = min(2.0 * cfg.threshold_scale, ctl.threshold + u)
        ctl.feedback, ctl.rate = u, rate

    @staticmethod
    def control(ctl: DsatControl, u: float | None, rate: float | None) -> dict[str, float | None]:
        return {"threshold": ctl.threshold, "feedback": u, "rate": rate}

    def publication_plan(
        self, state: LdpIdsState, slot: Slot, c1: Aggregate
    ) -> tuple[_Outcome, Request | None]:
        """Spec §3.8 lines 3–9: ``dis`` from M1, the controller's step, then publish when
        ``dis ≥ T̃`` (not the strict ``>`` of LBD/LPD)."""
        ctl: DsatControl = state.controller
        t, eps1 = state.t, self.m1_epsilon()
        dis = self.dissimilarity(state, c1, eps1)
        self.steer(ctl, t)
        out = _Outcome(
            "approximate",
            eps1=eps1,
            users1=c1.reports,
            dis=dis,
            err=ctl.threshold,
            remaining=self.may_publish(state)[1],
            bits=self.bits(c1, instructed=self.division == "population"),
            control=self.control(ctl, ctl.feedback, ctl.rate),
        )
        ctl.published = self.recent(ctl, t)
        if dis >= ctl.threshold or self.first_forced(state):
            ctl.published = (*ctl.published, t)
            return out, self.publication_request(state, slot)
        return out, None


class LBDsat(Dsat):
    """LB-DSAT_w (spec §3.8, inferred): M1 with all users at ``βε/w``; a publication with all
    users at ``(1−β)ε/C`` while fewer than C publications lie in the window."""

    name = "LB-DSAT"
    division = "budget"

    def m1_epsilon(self) -> float:
        return self.config.beta * self.config.epsilon / self.config.window

    def publication_epsilon(self) -> float:
        return (1 - self.config.beta) * self.config.epsilon / self.C

    def publication_error(self) -> float:
        return self.V(self.publication_epsilon(), self.n)

    def may_publish(self, state: LdpIdsState) -> tuple[bool, float]:
        """``(1−β)ε − Σ_{i=t−w+1}^{t−1} ε_{i,2} ≥ (1−β)ε/C``, decided on the count of
        publications in the window (exact, where the budget sum would round)."""
        cfg, t, ledger = self.config, state.t, state.budget
        assert ledger is not None
        left = (1 - cfg.beta) * cfg.epsilon - ledger.spent(t - cfg.window + 1, t - 1, "m2")
        return len(self.recent(state.controller, t)) < self.C, left

    def publication_request(self, state: LdpIdsState, slot: Slot) -> Request:
        return self.ask_all(state, self.publication_epsilon(), "m2")


class LPDsat(Dsat):
    """LP-DSAT_w (spec §3.8, Alg. 4): M1 asks ``g1 = ⌊n1/w⌋`` users (A18), a publication
    ``g2 = ⌊n2/C⌋`` users, ``n1 = ⌊βn⌋``, ``n2 = n − n1``, all with the full ε."""

    name = "LP-DSAT"
    division = "population"

    def __init__(self, config: LdpIdsConfig) -> None:
        super().__init__(config)
        if self.g1 < 1 or self.g2 < 1:
            raise ValueError(
                f"LP-DSAT needs groups g1 = ⌊⌊βn⌋/w⌋ >= 1 and g2 = ⌊(n − ⌊βn⌋)/C⌋ >= 1; "
                f"population={config.population}, window={config.window}, beta={config.beta}, "
                f"C={self.C} give g1={self.g1}, g2={self.g2}"
            )

    @property
    def n1(self) -> int:
        return math.floor(self.config.beta * self.n)

    @property
    def g1(self) -> int:
        return self.n1 // self.config.window

    @property
    def g2(self) -> int:
        return (self.n - self.n1) // self.C

    def m1_epsilon(self) -> float:
        return self.config.epsilon

    def publication_error(self) -> float:
        return self.V(self.config.epsilon, self.g2)

    def may_publish(self, state: LdpIdsState) -> tuple[bool, float]:
        """``n_rm = n2 − Σ_{i=t−w+1}^{t−1} |U_{i,2}| ≥ g2`` (spec §3.8 lines 1–2, A21), and
        fewer than C publications in the window: with ``g2 = ⌊n2/C⌋`` rounded down, ``n2``
        alone can hold more than C groups (n2 = 15, C = 4: five groups of 3)."""
        cfg, t, pop = self.config, state.t, state.population
        assert pop is not None
        n_rm = (self.n - self.n1) - pop.used(t - cfg.window + 1, t - 1, "m2")
        fewer = len(self.recent(state.controller, t)) < self.C
        return n_rm >= self.g2 and fewer, n_rm

    def dissimilarity_request(self, state: LdpIdsState, slot: Slot) -> Request | None:
        if not self.may_publish(state)[0]:
            return None
        return self.ask_sample(state, slot, self.g1, "m1")

    def publication_request(self, state: LdpIdsState, slot: Slot) -> Request:
        return self.ask_sample(state, slot, self.g2, "m2")


MECHANISMS: Final[dict[str, type[LdpIdsMechanism]]] = {m.name: m for m in (LBDsat, LPDsat)}
"""The DSAT variants by name, merged into the LDP-IDS family's mechanisms."""
