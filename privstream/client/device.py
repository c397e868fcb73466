"""The device: answers a server's request with one perturbed value, or refuses.

``Device.answer`` evaluates, in this order: is the store sound; does the request ask this
device (the request's own ``asks`` rule, evaluated locally); does the device's ledger accept it
(policy, budget over any ``w`` slots, one report per window under population division); then it
randomises the value, charges the ledger and writes the store — and only then returns the
:class:`Report`. A report carries the request's identity and the perturbed value only: no raw
value, no timestamp finer than the slot. If the store cannot be written, the charge stays spent
in memory, the device refuses from then on, and no report leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from privstream.client.ledger import Asked, Ledger, Policy, Refusal
from privstream.client.randomizers import Payload, Randomness, SystemRandomness, randomize
from privstream.client.store import FileStore, StoreError


class Request(Asked, Protocol):
    """What the device needs of a request (the full schema: privstream/schema/protocol.py):
    what its ledger reads (``ledger.Asked``), the purpose and who is asked."""

    @property
    def purpose(self) -> str: ...

    def asks(self, user_id: str) -> bool:
        """Whether the request asks this user (evaluated on the device)."""
        ...


@dataclass(frozen=True)
class Report:
    """One answer: the request it answers and the perturbed value (``payload``) only."""

    user_id: str
    stream: str
    slot: int
    round: int
    purpose: str
    oracle: str
    epsilon: float
    payload: Payload


class Device:
    """A device with its own ledger (in ``store``), policy and randomness (the OS CSPRNG by
    default; never seeded by a server)."""

    def __init__(
        self,
        user_id: str,
        store: FileStore,
        policy: Policy,
        randomness: Randomness | None = None,
    ) -> None:
        self.user_id = user_id
        self.store = store
        self.policy = policy
        self.randomness: Randomness = randomness if randomness is not None else SystemRandomness()
        self._broken: str | None = None
        self.ledger = Ledger(policy)
        try:
            self.ledger = Ledger.from_state(policy, store.load())
        except StoreError as exc:
            self._broken = str(exc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._broken = (
                f"ledger store {store.path} holds a malformed ledger ({exc}): refusing to report"
            )

    def answer(self, request: Request, value: object) -> Report | Refusal:
        """The report of ``value`` for ``request``, or why the device refuses."""
        if self._broken is not None:
            return Refusal("store", self._broken)
        try:
            asked = bool(request.asks(self.user_id))
        except Exception as exc:  # a server's rule must not take the device down
            return Refusal("invalid", f"the request's selection rule failed: {type(exc).__name__}")
        if not asked:
            return Refusal("not-asked", "the request does not ask this device")
        refusal = self.ledger.check(request)
        if refusal is not None:
            return refusal
        try:
            payload = randomize(request.oracle, value, request.epsilon, request.d, self.randomness)
        except ValueError as exc:
            return Refusal("invalid", str(exc))
        self.ledger.charge(request)
        try:
            self.store.save(self.ledger.to_state())
        except StoreError as exc:
            self._broken = str(exc)
            return Refusal("store", self._broken)
        return Report(self.user_id, request.stream, request.slot, request.round,
                      request.purpose, request.oracle, float(request.epsilon), payload)  # fmt: skip
