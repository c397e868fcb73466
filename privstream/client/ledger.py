"""The device's own w-event ledger: it refuses whatever would exceed the device's budget.

Per stream the device keeps the ε it was charged at each of its last ``w`` slots, the requests
it answered, the slot of its last report and, per mechanism (a request's ``purpose`` names it
before its first dot: ``LPA.m1``), the slot of its last population-division report.
:meth:`Ledger.check` refuses a request when

* the device's :class:`Policy` does not accept its oracle, division, window or per-report ε;
* it is not newer than what the device already answered (an older slot, or a (slot, round,
  purpose) already answered: a replay);
* answering would make ``Σ ε`` over the ``w`` consecutive slots ending at its slot exceed the
  policy's ε (every division), or, under population division, it comes less than ``w`` slots
  after that mechanism's last population report (at most one per ``w`` slots).

Slots only move forward, so the window ending at the request's slot is the only one that can
overflow: ``Σ ε`` over ANY ``w`` consecutive slots stays ≤ ε whatever the server asks, over
every mechanism and division of the stream together. The order is check → charge (persisted,
privstream.client.store) → send.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from privstream.client.randomizers import ORACLES

RELATIVE_TOLERANCE: Final = (
    1e-9  # float slack of a window sum, as the server's ledger (spec §9.3 M9)
)
DIVISIONS: Final = frozenset({"budget", "population"})


class Slotted(Protocol):
    """A request's identity: its stream, slot and round (what every ledger reads first)."""

    @property
    def stream(self) -> str: ...
    @property
    def slot(self) -> int: ...
    @property
    def round(self) -> int: ...

    @property
    def purpose(self) -> str: ...


class Asked(Slotted, Protocol):
    """What the ledger reads of a request (privstream.client.device.Request has more)."""

    @property
    def oracle(self) -> str: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def window(self) -> int: ...
    @property
    def division(self) -> str: ...
    @property
    def d(self) -> int: ...


@dataclass(frozen=True)
class Refusal:
    """A request the device does not answer: a reason code and a message for the operator."""

    reason: str
    message: str


@dataclass(frozen=True)
class Policy:
    """What the device accepts: ``epsilon`` over any ``window`` consecutive slots per stream."""

    epsilon: float
    window: int
    oracles: frozenset[str] = ORACLES
    divisions: frozenset[str] = DIVISIONS
    max_domain: int = 4096  # largest d the device randomises (OUE sends d bits)

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(
                f"the device's ε must be a positive finite number, got {self.epsilon!r}"
            )
        if self.window < 1:
            raise ValueError(f"the device's window w must be >= 1 slot, got {self.window!r}")
        if not self.oracles <= ORACLES or not self.divisions <= DIVISIONS:
            raise ValueError(f"policy oracles ⊆ {sorted(ORACLES)}, divisions ⊆ {sorted(DIVISIONS)}")

    def refuse(self, request: Asked) -> Refusal | None:
        """Why the policy does not accept this request, or None."""
        if request.oracle not in self.oracles:
            return Refusal(
                "oracle",
                f"oracle {request.oracle!r} not accepted (accepted: {sorted(self.oracles)})",
            )
        d = request.d
        if request.oracle != "HM" and (
            isinstance(d, bool) or not isinstance(d, int) or not 2 <= d <= self.max_domain
        ):
            return Refusal("oracle", f"domain d={d!r} not accepted (2 <= d <= {self.max_domain})")
        if request.division not in self.divisions:
            return Refusal(
                "division",
                f"division {request.division!r} not accepted (accepted: {sorted(self.divisions)})",
            )
        if request.window != self.window:
            return Refusal(
                "window", f"window {request.window!r} asked, the device keeps w={self.window}"
            )
        eps = request.epsilon
        if (
            isinstance(eps, bool)
            or not isinstance(eps, float | int)
            or not (0 < eps <= self.epsilon and math.isfinite(eps))
        ):
            return Refusal("budget", f"report ε {eps!r} not in (0, {self.epsilon}]")
        if isinstance(request.slot, bool) or not isinstance(request.slot, int) or request.slot < 0:
            return Refusal("invalid", "slot must be a non-negative integer")
        return None


def answered_key(request: Slotted) -> str:
    """How a ledger remembers an answered request within its slot: ``round/purpose``."""
    return f"{request.round}/{request.purpose}"


def mechanism_of(purpose: str) -> str:
    """The mechanism a purpose names: the part before its first dot (``LPA.m1`` → ``LPA``)."""
    return purpose.split(".", 1)[0]


@dataclass
class StreamLedger:
    """One stream: ε charged per slot (the last ``w`` slots), the requests answered per slot
    (``round/purpose``: several mechanisms may ask in one round), last report."""

    charges: dict[int, float] = field(default_factory=dict)
    answered: dict[int, list[str]] = field(default_factory=dict)
    last_report: int | None = None
    populations: dict[str, int] = field(default_factory=dict)
    """Each mechanism's last population-division report (its slot)."""

    def window_sum(self, slot: int, w: int) -> float:
        """``Σ ε`` charged over the ``w`` slots ending at ``slot``."""
        return math.fsum(e for s, e in self.charges.items() if slot - w < s <= slot)

    def prune(self, w: int) -> None:
        """Forget slots that no future window (slots only move forward) can contain."""
        if self.last_report is None:
            return
        keep = self.last_report - w
        self.charges = {s: e for s, e in self.charges.items() if s > keep}
        self.answered = {s: r for s, r in self.answered.items() if s > keep}


class Ledger:
    """The device's w-event ledger over all its streams (state in JSON-able form)."""

    def __init__(self, policy: Policy, streams: dict[str, StreamLedger] | None = None) -> None:
        self.policy = policy
        self.streams: dict[str, StreamLedger] = streams or {}

    def check(self, request: Asked) -> Refusal | None:
        """Why answering ``request`` would break the policy or the budget, or None."""
        refusal = self.policy.refuse(request)
        if refusal is not None:
            return refusal
        w, slot = self.policy.window, request.slot
        stream = self.streams.get(request.stream)
        if stream is None:
            return None
        last = stream.last_report
        if last is not None and slot < last:
            return Refusal("stale", f"slot {slot} is older than the last report's slot {last}")
        if answered_key(request) in stream.answered.get(slot, []):
            return Refusal("answered", f"slot {slot} round {request.round} already answered")
        previous = stream.populations.get(mechanism_of(request.purpose))
        if request.division == "population" and previous is not None and slot - previous < w:
            return Refusal(
                "window",
                f"population division: one report per {w} slots, the last at slot {previous}",
            )
        spent = stream.window_sum(slot, w)
        if spent + request.epsilon > self.policy.epsilon * (1.0 + RELATIVE_TOLERANCE):
            return Refusal(
                "exhausted",
                f"ε {spent:g} already spent in the {w} slots to {slot}, {request.epsilon:g} asked, budget {self.policy.epsilon:g}",
            )
        return None

    def charge(self, request: Asked) -> None:
        """Record the report's ε at its slot; raises ``ValueError`` if :meth:`check` refuses."""
        refusal = self.check(request)
        if refusal is not None:
            raise ValueError(f"refused ({refusal.reason}): {refusal.message}")
        stream = self.streams.setdefault(request.stream, StreamLedger())
        slot = request.slot
        stream.charges[slot] = stream.charges.get(slot, 0.0) + float(request.epsilon)
        stream.answered.setdefault(slot, []).append(answered_key(request))
        stream.last_report = slot
        if request.division == "population":
            stream.populations[mechanism_of(request.purpose)] = slot
        stream.prune(self.policy.window)

    def to_state(self) -> dict[str, Any]:
        """The ledger as JSON-able data (slots as strings, JSON's object keys)."""
        return {
            name: {
                "charges": {str(k): v for k, v in sorted(s.charges.items())},
                "answered": {str(k): v for k, v in sorted(s.answered.items())},
                "last_report": s.last_report,
                "populations": dict(sorted(s.populations.items())),
            }
            for name, s in sorted(self.streams.items())
        }

    @classmethod
    def from_state(cls, policy: Policy, state: dict[str, Any]) -> Ledger:
        """Rebuild from :meth:`to_state`; ``ValueError`` on any malformed field."""
        streams: dict[str, StreamLedger] = {}
        for name, s in state.items():
            charges = {int(k): float(v) for k, v in s["charges"].items()}
            answered = {int(k): [str(r) for r in v] for k, v in s["answered"].items()}
            last = s["last_report"]
            populations = {str(k): int(v) for k, v in s.get("populations", {}).items()}
            if not (last is None or isinstance(last, int)):
                raise ValueError(f"stream {name!r}: malformed ledger entry")
            if any(not (math.isfinite(e) and e >= 0) for e in charges.values()):
                raise ValueError(f"stream {name!r}: malformed charge")
            streams[str(name)] = StreamLedger(charges, answered, last, populations)
        return cls(policy, streams)


@dataclass(frozen=True)
class GaussianPolicy:
    """What the device accepts of CGM (Gaussian-DP, spec cgm §8.4): ``mu`` per stream over the
    stream's whole life. CGM's noise chain and its recursive differential clip carry a value
    into every later report, so no window renews the budget: the reports' ``μ²`` add up."""

    mu: float

    def __post_init__(self) -> None:
        if not (isinstance(self.mu, float | int) and self.mu > 0 and math.isfinite(self.mu)):
            raise ValueError(f"the device's μ must be a positive finite number, got {self.mu!r}")


@dataclass
class GaussianStream:
    """One stream's Gaussian-DP account: ``μ²`` spent, reports, the last slot, and the public
    step the chain started with (a server may not change it mid-chain)."""

    spent: float = 0.0
    reports: int = 0
    last_slot: int | None = None
    step: dict[str, Any] | None = None


class GaussianLedger:
    """The device's μ² ledger over its CGM streams: ``Σ μ²_report ≤ μ²`` per stream."""

    def __init__(self, policy: GaussianPolicy, streams: dict[str, GaussianStream] | None = None):
        self.policy = policy
        self.streams: dict[str, GaussianStream] = streams or {}

    def check(self, stream: str, slot: int, charge: float, step: dict[str, Any]) -> Refusal | None:
        """Why a report of ``charge`` μ² at ``slot`` would break the policy, or None."""
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            return Refusal("invalid", "slot must be a non-negative integer")
        if not (charge > 0 and math.isfinite(charge)):
            return Refusal("invalid", f"a report's μ² must be positive and finite, got {charge!r}")
        s = self.streams.get(stream, GaussianStream())
        if s.last_slot is not None and slot <= s.last_slot:
            return Refusal(
                "stale", f"slot {slot}: the chain already reported at slot {s.last_slot}"
            )
        if s.step is not None and s.step != step:
            return Refusal("changed", "the CGM step's public parameters differ from the chain's")
        budget = self.policy.mu**2
        if s.spent + charge > budget * (1.0 + RELATIVE_TOLERANCE):
            return Refusal(
                "exhausted",
                f"μ² {s.spent:.6g} already spent, {charge:.6g} asked, budget μ²={budget:.6g}",
            )
        return None

    def charge(self, stream: str, slot: int, charge: float, step: dict[str, Any]) -> None:
        """Record the report; raises ``ValueError`` if :meth:`check` refuses."""
        refusal = self.check(stream, slot, charge, step)
        if refusal is not None:
            raise ValueError(f"refused ({refusal.reason}): {refusal.message}")
        s = self.streams.setdefault(stream, GaussianStream())
        s.spent, s.reports, s.last_slot, s.step = s.spent + charge, s.reports + 1, slot, step

    def to_state(self) -> dict[str, Any]:
        return {name: {"spent": s.spent, "reports": s.reports, "last_slot": s.last_slot,
                       "step": s.step} for name, s in sorted(self.streams.items())}  # fmt: skip

    @classmethod
    def from_state(cls, policy: GaussianPolicy, state: dict[str, Any]) -> GaussianLedger:
        """Rebuild from :meth:`to_state`; ``ValueError`` on any malformed field."""
        streams: dict[str, GaussianStream] = {}
        for name, s in state.items():
            spent, reports, last = float(s["spent"]), int(s["reports"]), s["last_slot"]
            if not (math.isfinite(spent) and spent >= 0 and reports >= 0):
                raise ValueError(f"stream {name!r}: malformed μ² account")
            if not (last is None or isinstance(last, int)) or not isinstance(s["step"], dict):
                raise ValueError(f"stream {name!r}: malformed μ² account")
            streams[str(name)] = GaussianStream(spent, reports, last, s["step"])
        return cls(policy, streams)
