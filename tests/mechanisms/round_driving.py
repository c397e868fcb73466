"""Driving a mechanism with request/report rounds (``mechanisms.rounds``) two ways, for the
tests that compare them: the one-shot ``step`` of every slot, and round by round with the
state pickled between every ``plan`` and ``absorb``; and a client port that records which
users each request reached."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.mechanisms.client import Aggregate, SimulatedClientPort
from privstream.mechanisms.contract import Slot, outputs
from privstream.mechanisms.rounds import Finished, answer


def one_shot(mech: Any, slot_at: Callable[[int], Slot], slots: int) -> list[str]:
    """Every event of ``step`` at slots ``1..slots``, as sorted JSON."""
    state, out = mech.initial_state(), []
    for t in range(1, slots + 1):
        state, events = mech.step(state, slot_at(t))
        out += [json.dumps(e.to_dict(), sort_keys=True) for e in outputs(events)]
    return out


def by_rounds(mech: Any, slot_at: Callable[[int], Slot], slots: int) -> tuple[list[str], list[int]]:
    """Every slot round by round: the state crosses a pickle between every plan and absorb,
    and a fresh port (``slot_at(t)``) answers each round (the devices keep nothing between
    rounds). The events as ``one_shot`` gives them, and each slot's number of rounds."""
    blob, out, rounds = pickle.dumps(mech.initial_state()), [], []
    for t in range(1, slots + 1):
        for r in range(3):
            state = pickle.loads(blob)
            planned = mech.plan(state, slot_at(t))
            blob = pickle.dumps(state)
            if isinstance(planned, Finished):
                out += [json.dumps(e.to_dict(), sort_keys=True) for e in planned.events]
                rounds.append(r)
                break
            answers = pickle.loads(pickle.dumps(answer(slot_at(t).client, planned)))
            state = pickle.loads(blob)
            mech.absorb(state, slot_at(t), answers)
            blob = pickle.dumps(state)
        else:
            raise AssertionError(f"slot {t} did not finish in two rounds")
    return out, rounds


class Recording:
    """A client port that records which users each request reached."""

    def __init__(self, inner: SimulatedClientPort) -> None:
        self.inner = inner
        self.asked: dict[str, NDArray[np.int64] | None] = {}

    @property
    def population(self) -> int:
        return self.inner.population

    def eligible(self) -> NDArray[np.bool_]:
        return self.inner.eligible()

    def collect(self, users: NDArray[np.int64] | None, eps: float, purpose: str) -> Aggregate:
        self.asked[purpose] = None if users is None else users.copy()
        return self.inner.collect(users, eps, purpose)
