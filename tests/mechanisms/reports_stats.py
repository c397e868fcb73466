"""What the ``ldp-reports`` tests share (``test_reports_equivalence``, ``operators/
test_report_rounds``): LDP-IDS mechanisms over the binary Sin stream, an in-process run of
server and fleet that keeps what it fed the server, a replay of that transcript, and the
standardized errors of published releases with their 4σ checks.

**The standardized error of a publication** (derivation used by every z-test). The stream is
binary (``d = 2``), so the task's oracle is GRR with ``p = e^ε/(e^ε+1)``, ``q = 1 − p``, and
the release's bin-0 estimate from the ``m`` reports of a reporting set ``R`` is
``ĉ = (C/m − q)/(p − q)``, ``C`` the reports saying 0. Given ``R`` (true bin-0 share ``f_R``)
each report says 0 with probability ``f_R·p + (1−f_R)·q`` and variance ``pq`` whatever its
value (``p(1−p) = q(1−q) = pq`` when ``d = 2``), so ``E[ĉ | R] = f_R`` and
``Var(ĉ | R) = pq/(m(p−q)²) = e^ε/(m(e^ε−1)²)``: exactly ``task.variance(ε, m)`` (GRR's
``d``-averaged formula has no ``f`` term at ``d = 2``). ``R`` is a uniformly random ``m``-subset
of the ``n`` users given ``m`` (dropout, hash selection, LPU's groups and LPD/LPA's samples
never look at values), so ``f_R`` is hypergeometric around the population's ``f``:
``Var f_R = f(1−f)(n−m)/(m(n−1))``, zero when everybody reports. Hence

    z = (ĉ − f) / sqrt(task.variance(ε, m) + f(1−f)(n−m)/(m(n−1)))

has mean 0 and variance 1. The bins are not used separately: GRR's two estimates sum to 1, so
bin 1's error is bin 0's negated (one bin carries all the information).

Published releases give independent ``z`` (each publication's reports are fresh noise; the
decision to publish reads only the M1 reports, independent of the M2 reports, and the Sin
stream draws every slot's population afresh). Over ``N`` of them ``mean z`` has standard
deviation ``1/√N``, and ``mean z²`` has mean 1 and standard deviation ``√((2 + κ)/N)`` with
``κ`` the excess kurtosis of ``z``: for a sum of ``m`` Bernoulli reports
``κ = (1 − 6pq)/(m·pq) < 0`` whenever ``pq > 1/6`` (every ε < 1.76, all of ours), the
hypergeometric term adding ``O(1/m)``; so ``2/N`` bounds the variance. The checks:
``|mean z| ≤ 4/√N`` and ``|mean z² − 1| ≤ 4·√(2/N)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import numpy as np
from numpy.typing import NDArray

from privstream.connectors.datasets import SlotStream, synthetic_dataset
from privstream.experiments import reports_loop
from privstream.experiments.reports_loop import ReportsRun, run_reports
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Mechanism, Release
from privstream.mechanisms.report_port import Ask
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.reasons import Output
from privstream.operators.report_book import RoundBook
from privstream.operators.report_rounds import ReportItem, ReportRoundsLogic, ReportsPlan
from privstream.operators.stream_state import StreamState
from privstream.runtime.fleet import Fleet, FleetConfig
from privstream.schema.protocol import Request

EPSILON, WINDOW = 1.0, 5
TASK = FrequencyTask(2)
SIGMAS = 4.0
PAPER = ("LBU", "LPU", "LSP", "LBD", "LBA", "LPD", "LPA")
ADAPTIVE = ("LB-DSAT", "LP-DSAT", "LB-RescueDP", "LP-RescueDP")
BUDGET_DIVISION = ("LBU", "LBD", "LBA")


def build(name: str, users: int, share: float = 1.0) -> Mechanism[Any, Any]:
    """LDP-IDS mechanism ``name`` for ``users`` devices, ε = 1, w = 5, with ``share`` of ε."""
    cfg = LDP_IDS.make_config(epsilon=EPSILON, window=WINDOW, population=users, task=TASK)
    return LDP_IDS.build(name, cfg.shared(share))


def sin(users: int, slots: int, seed: int) -> SlotStream:
    return synthetic_dataset("sin", users, slots, seed)


@dataclass
class Captured:
    """A ``run_reports`` run with what it hid: its server logic (the stream's ``RoundBook``
    is ``logic.state.protocol``), its fleet (``fleet.stats``), every batch the server got and,
    per request, what its ask planned and how many reports its round accepted."""

    run: ReportsRun
    logic: ReportRoundsLogic
    fleet: Fleet
    batches: list[list[ReportItem]] = field(default_factory=list)
    asked: dict[str, int | None] = field(default_factory=dict)
    """Each request's ``Ask.k`` (None: budget division, every device)."""
    accepted: dict[str, int] = field(default_factory=dict)
    """Each request's accepted reports when its round closed."""

    @property
    def plan(self) -> ReportsPlan:
        return self.logic.setup


def captured(
    names: Sequence[str], source: SlotStream, fleet: FleetConfig, *, slots: int, seed: int
) -> Captured:
    """``run_reports`` of ``names`` (an equal budget split when several) over ``source``, the
    server's secret and the devices' randomness from ``seed``."""
    seen: dict[str, Any] = {"batches": []}
    asked: dict[str, int | None] = {}
    accepted: dict[str, int] = {}

    class Logic(ReportRoundsLogic):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            seen["logic"] = self

        def on_batch(self, values: list[ReportItem]) -> tuple[Iterable[Output], bool]:  # type: ignore[override]
            seen["batches"].append(list(values))
            return super().on_batch(values)

    class Devices(Fleet):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            seen["fleet"] = self

    def publish(book: RoundBook, stream: str, asks: Mapping[str, Ask], **kw: Any) -> list[Request]:
        requests = publish_of(book, stream, asks, **kw)
        asked.update({r.id: a.k for r, a in zip(requests, asks.values(), strict=True)})
        return requests

    def close(book: RoundBook, *args: Any) -> None:
        accepted.update({rid: len(reports) for rid, reports in book.collected.items()})
        close_of(book, *args)

    publish_of, close_of = RoundBook.publish, RoundBook.close
    split = BudgetSplit.parse("equal", len(names)) if len(names) > 1 else None
    mechanisms = [build(name, fleet.users, 1 / len(names)) for name in names]
    with patch.object(reports_loop, "ReportRoundsLogic", Logic), \
            patch.object(reports_loop, "Fleet", Devices), \
            patch.object(RoundBook, "publish", publish), patch.object(RoundBook, "close", close):  # fmt: skip
        run = run_reports(mechanisms, TASK, source, fleet, slots=slots, secret=seed,
                          device_seed=seed, split=split)  # fmt: skip
    return Captured(run, seen["logic"], seen["fleet"], seen["batches"], asked, accepted)


def replay(
    plan: ReportsPlan, batches: Iterable[list[ReportItem]], resume: StreamState | None = None
) -> tuple[ReportRoundsLogic, list[Output]]:
    """A fresh server stage (or one resumed from ``resume``) fed ``batches``; its outputs."""
    logic, out = ReportRoundsLogic("reports", plan, resume), []
    for batch in batches:
        emitted, _ = logic.on_batch(batch)
        out += list(emitted)
    return logic, out


def canonical(outputs: Iterable[Output], kind: str) -> list[str]:
    """The ``kind`` outputs as canonical JSON (byte-level comparison)."""
    return [json.dumps(e.to_dict(), sort_keys=True) for k, e in outputs if k == kind]


def request_ids(outputs: Iterable[Output]) -> list[str]:
    return [e.id for k, e in outputs if k == "request"]


def standardized(releases: Iterable[Release], source: SlotStream) -> NDArray[np.float64]:
    """``z`` of every published release's bin-0 estimate (module docstring)."""
    n, z = source.users, []
    for r in releases:
        if r.strategy != "publish":
            continue
        eps, m = r.details.epsilon_m2, r.details.users_m2  # type: ignore[attr-defined]
        f = float(source.truth(r.slot)[0])
        var = TASK.variance(eps, m) + f * (1 - f) * (n - m) / (m * (n - 1))
        z.append((r.estimate[0] - f) / math.sqrt(var))
    return np.asarray(z)


def check_standard(z: NDArray[np.float64], what: str) -> tuple[float, float]:
    """The 4σ checks of ``mean z`` and ``mean z²`` (module docstring); the two means."""
    n = len(z)
    assert n >= 10, f"{what}: only {n} publications"
    mean, square = float(z.mean()), float(np.mean(z**2))
    assert abs(mean) <= SIGMAS / math.sqrt(n), f"{what}: mean z {mean:.3f} over {n}"
    assert abs(square - 1) <= SIGMAS * math.sqrt(2 / n), f"{what}: mean z² {square:.3f} over {n}"
    return mean, square
