"""The client port of ``ldp-reports`` mode (issue 23): real devices answer, one round at a time.

A mechanism's step asks its users through its ``ClientPort`` (``collect`` for an oracle's
reports, ``respond`` for a protocol's rows, e.g. CGM's chain step). ``ReportsPort`` answers a
request from the reports the devices already sent for it (``answers``, by purpose); a request
it holds no answer for raises ``AwaitingReports`` naming what to ask (``Ask``). The server stage
(``operators.report_rounds``) publishes that ask as a ``schema.protocol.Request``, waits until
the round closes, adds the round's reports to ``answers`` and runs the step again from the same
state: a step is pure and its randomness is named by purpose (``mechanisms.rounds``), so each
rerun draws the same decisions and asks the same thing until every request is answered.

**Guarantee.** The server reads nothing of a user but the perturbed reports the devices chose
to send (each an ε-LDP report the device's own ledger admitted); ``eligible`` is the enrolled
population (a planning mirror: the server cannot know who holds a value). The aggregate of a
round is the oracle's unbiased estimator over the reports that arrived (``m`` = their number):
the missing-report rule of every LDP-IDS mechanism is "the round's estimate is made of the
reports that arrived; no report at all gives the oracle's ``m = 0`` value (zeros)", and a
missing report never returns a budget (the ledger mirrors charged when the request was planned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import Aggregate, ClientProtocol
from privstream.mechanisms.rounds import UnknownRequest
from privstream.mechanisms.tasks import EstimationTask
from privstream.schema.protocol import OracleSpec, Report

Answer = Aggregate | NDArray[np.float64]
"""A round's answer to one purpose: an oracle's ``Aggregate`` or a protocol's report rows."""


@dataclass(frozen=True)
class Ask:
    """What one request asks: ``k`` devices (None: every enrolled device, budget division; a
    number: a hash-selected group of about ``k``, population division) report once through
    ``oracle`` with budget ``(epsilon, delta)`` for ``purpose``."""

    purpose: str
    oracle: OracleSpec
    epsilon: float
    k: int | None = None
    delta: float = 0.0


class AwaitingReports(Exception):
    """The step needs the devices' answer to ``ask`` before it can go on."""

    def __init__(self, ask: Ask) -> None:
        super().__init__(f"awaiting the reports of {ask.purpose!r}")
        self.ask = ask


class ReportedProtocol(ClientProtocol, Protocol):
    """A client protocol real devices can run: it names its request's oracle and budget."""

    def request_oracle(self) -> tuple[OracleSpec, float, float]:
        """The oracle a request for this protocol names, with its ``(epsilon, delta)``."""
        ...


class ReportsPort:
    """``ldp-reports``' ``ClientPort`` over the answers received so far (module docstring)."""

    def __init__(
        self, population: int, task: EstimationTask, answers: Mapping[str, Answer]
    ) -> None:
        self._n = population
        self._task = task
        self._answers = answers
        self.client_state_after: Any = None

    @property
    def population(self) -> int:
        return self._n

    def eligible(self) -> NDArray[np.bool_]:
        """Every enrolled device (the server cannot know who holds a value)."""
        return np.ones(self._n, dtype=bool)

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        found = self._answers.get(purpose)
        if isinstance(found, Aggregate):
            return found
        oracle = self._task.select(eps)
        spec = OracleSpec(oracle.name, 1 if oracle.name == "HM" else self._task.d)
        k = None if users is None else int(np.asarray(users).shape[0])
        raise AwaitingReports(Ask(purpose, spec, float(eps), k))

    def respond(
        self, protocol: ClientProtocol, asked: NDArray[np.bool_], purpose: str
    ) -> NDArray[np.float64]:
        found = self._answers.get(purpose)
        if found is not None and not isinstance(found, Aggregate):
            return found
        request_oracle = getattr(protocol, "request_oracle", None)
        if request_oracle is None:
            raise UnknownRequest(
                f"{type(protocol).__name__} names no request for real devices "
                "(it has no request_oracle()): run it in ldp-simulated mode"
            )
        spec, eps, delta = request_oracle()
        k = None if bool(np.all(asked)) else int(np.count_nonzero(asked))
        raise AwaitingReports(Ask(purpose, spec, float(eps), k, float(delta)))


def aggregate(
    reports: Sequence[Report], spec: OracleSpec, eps: float, task: EstimationTask
) -> Aggregate:
    """The round's ``Aggregate`` of ``reports`` (each already checked against its request):
    the oracle's support over their wire values and its unbiased estimate for ``m`` reports."""
    values = [r.value for r in sorted(reports, key=lambda r: r.device)]  # order-free sums
    return aggregate_wire(spec, eps, task, wire_array(spec, values), len(reports))


def aggregate_wire(
    spec: OracleSpec, eps: float, task: EstimationTask, wire: Any, m: int
) -> Aggregate:
    """``aggregate`` of ``m`` reports given as the oracle's wire array (``wire_array``)."""
    return aggregate_support(spec, eps, task, task.select(eps).support(wire, eps), m)


def aggregate_support(
    spec: OracleSpec, eps: float, task: EstimationTask, support: NDArray[np.float64], m: int
) -> Aggregate:
    """``aggregate`` of ``m`` reports given as the oracle's support (its sufficient
    statistic: GRR's and OUE's counts per category)."""
    oracle = task.select(eps)
    if oracle.name != spec.name:
        raise ValueError(f"the task selects {oracle.name} at ε={eps}, the request named {spec}")
    estimate = task.decode(oracle.estimate(support, eps, m))
    return Aggregate(estimate, m, m * oracle.report_bits(eps), oracle.name)


def report_rows(reports: Sequence[Report], d: int) -> NDArray[np.float64]:
    """A protocol's report rows (CGM: ``x*`` then ``v``), in device-id order."""
    values = [r.value for r in sorted(reports, key=lambda r: r.device)]
    return _cgm_rows(values, d)


def wire_array(spec: OracleSpec, values: list[Any]) -> Any:
    """The server oracle's report array of wire values (``schema.protocol`` shapes): CGM's
    rows ``x*`` then ``v``."""
    if spec.name == "GRR":
        return np.asarray(values, dtype=np.int64)
    if spec.name == "OUE":
        bits = np.frombuffer("".join(values).encode(), dtype=np.uint8) - ord("0")
        return bits.reshape(len(values), spec.d).astype(bool)
    if spec.name == "OLH":
        return np.asarray(values, dtype=np.int64).reshape(len(values), 3)
    if spec.name == "CGM":
        return _cgm_rows(values, spec.d)
    return np.asarray(values, dtype=np.float64)


def _cgm_rows(values: list[Any], d: int) -> NDArray[np.float64]:
    rows = [[*v["x"], v["v"]] for v in values]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), d + 1)
