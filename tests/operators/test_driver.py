"""The shared step driver (``mechanisms.driver``): halts, composition before release, stamps,
and the same releases whichever caller drives the slot."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privstream.conformance import checks
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.accountant import PopulationAccountant
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Release, outputs
from privstream.mechanisms.driver import Lane, Stamp, drive_slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

N = 400  # the conformance example population of LBU


def _lbu(epsilon: float = 1.0) -> Any:
    config = LDP_IDS.make_config(epsilon=epsilon, window=5, population=N, task=FrequencyTask(2))
    return LDP_IDS.build("LBU", config)


def _drive(lanes: dict[str, Lane], t: int, **kw: Any) -> Any:
    values = checks.population_values(t, N)

    def port_for(name: str, randomness: SlotRandomness, clients: Any) -> Any:
        task = lanes[name].mechanism.config.task
        return SimulatedClientPort(values, task, randomness, client_state=clients)

    return drive_slot(lanes, "s", t, port_for, lambda n: SlotRandomness(3, "s", t, scope=n), **kw)


def test_a_failing_mechanism_halts_alone_and_names_no_message() -> None:
    good, bad = _lbu(), _lbu()

    class Broken:
        name = "bad"
        config = bad.config

        def step(self, state: Any, slot: Any) -> Any:
            raise KeyError("user-42")

    lanes = {"good": Lane(good, good.initial_state()), "bad": Lane(Broken(), None)}  # type: ignore[arg-type]
    step = _drive(lanes, 1)
    assert [h.name for h in step.halts] == ["bad"] and not step.halts[0].violation
    assert step.halts[0].reason.startswith("failed at slot 1: KeyError at test_driver.py")
    assert "user-42" not in step.halts[0].reason
    assert list(step.stepped) == ["good"]
    with pytest.raises(KeyError):
        _drive(lanes, 1, halt_failures=False)


def test_an_overspend_is_refused_before_release_and_stamps_carry_the_spend() -> None:
    mech = _lbu()
    lane = Lane(mech, mech.initial_state(), population=(5, 1.0))
    step = _drive({"m": lane}, 1, accountant=PopulationAccountant(), stamp=Stamp(insecure=True))
    entry = next(e for e in step.stepped["m"].events if isinstance(e, LedgerEntry))
    release = next(e for e in step.stepped["m"].events if isinstance(e, Release))
    assert release.insecure_seed and entry.insecure_seed
    assert step.worst is not None and entry.population_spent == step.worst[2]
    tight = Lane(mech, mech.initial_state(), share=1.0, population=(5, 1e-3))
    refused = _drive({"m": tight}, 1, accountant=PopulationAccountant())
    assert refused.stepped == {} and [h.violation for h in refused.halts] == [True]
    assert refused.halts[0].reason.startswith("population budget refused slot 1:")


def test_the_checks_run_through_the_driver_as_a_direct_step_would() -> None:
    mech = _lbu()
    (_, _), events = checks.run(mech, checks.start(mech), range(1, 4))
    state, clients = mech.initial_state(), mech.client_state()
    direct = []
    for t in range(1, 4):
        slot = checks.make_slot(mech, t, clients=clients)
        state, out = mech.step(state, slot)
        direct.extend(outputs(out))
    assert events == direct
    assert np.isfinite(events[0].estimate).all()
