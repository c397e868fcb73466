"""A server step as a resumable sequence of request/report rounds (design §13, issue 19 item 3).

A mechanism that asks its devices more than once per slot (LBD, LBA, LPD, LPA: the
dissimilarity, then the publication) implements

* ``plan(state, slot) -> Requests | Finished``: what it asks the devices next (``Requests``:
  which users report, with which budget, for which purpose), or the slot's releases and ledger
  entries once it needs nothing more (``Finished``);
* ``absorb(state, slot, answers)``: takes the devices' answers to the last round into
  ``state``.

**Guarantee.** Between two rounds everything the step needs lives in the mechanism's state (a
plain picklable object, ``RoundProgress`` holding the round in progress), so a snapshot taken
between rounds resumes the slot exactly where it stopped. The randomness a round draws is named
by the request's ``purpose`` (``m1/client``, ``m2/sample``...), never by the order of the
draws, so answering the rounds at once (``ldp-simulated``: ``answer_at_once``), one by one
through Kafka topics (``ldp-reports``), or after a restart gives the same numbers.

A request kind the port does not know is refused with its name (``UnknownRequest``); answers
that do not match the round's requests are refused naming the missing or unexpected purpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import Aggregate, ClientPort

REPORT: Final = "report"
"""The one request kind of this version: the asked users each send one ε-LDP report of their
current value (``ClientPort.collect``); the answer is the round's ``Aggregate``."""

MAX_ROUNDS: Final = 16
"""More rounds than any mechanism plans in one slot: a planner that never finishes is a bug."""


class UnknownRequest(ValueError):
    """A round asked for something the devices (the port) cannot answer."""


@dataclass(frozen=True)
class Request:
    """What one round asks the devices: every user in ``users`` (every eligible user when None)
    reports once with budget ``epsilon``. ``purpose`` names the request in the answers and the
    randomness the devices draw for it (``{purpose}/client``)."""

    purpose: str
    epsilon: float
    users: NDArray[np.int64] | None = None
    kind: str = REPORT

    def __repr__(self) -> str:  # user indices are not for logs
        asked = "all eligible" if self.users is None else f"{int(self.users.shape[0])} users"
        return f"Request({self.kind} {self.purpose!r}, ε={self.epsilon:g}, {asked})"


@dataclass(frozen=True)
class Requests:
    """One round of requests (``round`` counts from 1 within the slot)."""

    round: int
    asks: tuple[Request, ...]

    def __post_init__(self) -> None:
        purposes = [a.purpose for a in self.asks]
        if not purposes or len(set(purposes)) != len(purposes):
            raise ValueError(f"round {self.round} needs distinct request purposes, got {purposes}")


@dataclass(frozen=True)
class Finished:
    """The slot is done: its events (releases, ledger entries), in emission order."""

    events: tuple[Any, ...]


Answers = Mapping[str, Aggregate]
"""A round's answers, one ``Aggregate`` per request purpose."""


@dataclass
class RoundProgress:
    """The round a slot's step is in, kept in the mechanism's state between rounds (picklable).

    ``round`` is the last round planned; ``asked`` its request purposes; ``answers`` what came
    back for them (empty until ``absorb``); ``outcome`` what the mechanism decided so far."""

    round: int = 0
    asked: tuple[str, ...] = ()
    answers: dict[str, Aggregate] = field(default_factory=dict)
    outcome: Any = None

    def ask(self, requests: Requests) -> Requests:
        """Record ``requests`` as the round in flight and return them."""
        self.round, self.asked, self.answers = (
            requests.round,
            tuple(a.purpose for a in requests.asks),
            {},
        )
        return requests

    def take(self, answers: Answers) -> None:
        """Accept the answers of the round in flight; refuse missing or unexpected ones."""
        missing = [p for p in self.asked if p not in answers]
        extra = [p for p in answers if p not in self.asked]
        if missing or extra:
            raise ValueError(
                f"round {self.round} asked {list(self.asked)}; answers miss {missing} "
                f"and hold unexpected {extra}"
            )
        self.answers = dict(answers)

    def answer(self, purpose: str) -> Aggregate:
        """The answer to ``purpose`` of the last round; a round not yet answered is refused."""
        if purpose not in self.answers:
            raise ValueError(
                f"round {self.round} ({list(self.asked)}) is not answered yet: absorb its "
                "answers before planning the next round"
            )
        return self.answers[purpose]


class RoundPlanner(Protocol):
    """A mechanism whose step is a sequence of rounds."""

    def plan(self, state: Any, slot: Any) -> Requests | Finished: ...

    def absorb(self, state: Any, slot: Any, answers: Answers) -> None: ...


def answer(port: ClientPort, requests: Requests) -> dict[str, Aggregate]:
    """The simulated devices' answers to one round: each request's users (and only they)
    report through ``port``. An unknown request kind is refused naming it."""
    out: dict[str, Aggregate] = {}
    for ask in requests.asks:
        if ask.kind != REPORT:
            raise UnknownRequest(
                f"round {requests.round} asks {ask.kind!r} ({ask.purpose!r}); the devices "
                f"answer only {[REPORT]}"
            )
        out[ask.purpose] = port.collect(ask.users, ask.epsilon, purpose=ask.purpose)
    return out


def answer_at_once(planner: RoundPlanner, state: Any, slot: Any, port: ClientPort) -> list[Any]:
    """Run every round of one slot with ``port`` answering each at once (``ldp-simulated``);
    the slot's events. ``state`` is advanced in place."""
    for _ in range(MAX_ROUNDS):
        planned = planner.plan(state, slot)
        if isinstance(planned, Finished):
            return list(planned.events)
        planner.absorb(state, slot, answer(port, planned))
    raise RuntimeError(f"the step planned more than {MAX_ROUNDS} rounds in one slot")
