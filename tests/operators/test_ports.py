"""Trust modes drive the ports (design §4): the operator builds the port of the mode the
mechanisms declare, and the client side's per-user state stays behind the client port."""

from __future__ import annotations

import pickle
from typing import Any, ClassVar

import numpy as np
import pytest

from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.ldp_ids import LBU
from privstream.mechanisms.tasks import FrequencyTask
from privstream.mechanisms.trust import TrustMode
from privstream.operators.ports import DeviceReports, SimulatedClients, TrustedCurator, ports_for
from privstream.operators.registration import Preferences
from privstream.operators.slotting import SlottedLogic, make_plan

TASK = FrequencyTask(2)


def ldp(name: str = "LBU") -> Any:
    return LDP_IDS.build(name, LDP_IDS.make_config(epsilon=1.0, window=5, population=50, task=TASK))


def cdp(name: str = "PBD") -> Any:
    config = PERSONALIZED.make_config(epsilon=1.0, window=5, population=50, task=TASK)
    return PERSONALIZED.build(name, config)


def test_the_declared_trust_mode_picks_the_port() -> None:
    assert isinstance(ports_for([ldp()], TASK), SimulatedClients)
    assert isinstance(ports_for([cdp()], TASK, registration=Preferences()), TrustedCurator)


def test_mechanisms_without_a_shared_mode_or_a_misplaced_registration_are_refused() -> None:
    with pytest.raises(ValueError, match="share no trust mode"):
        ports_for([ldp(), cdp()], TASK)
    with pytest.raises(ValueError, match="registration table must name its users"):
        ports_for([ldp()], TASK, registration=Preferences())


class ReportsOnly(LBU):
    """A mechanism whose clients perturb on their devices (spec ldp-ids §3.1)."""

    trust_modes: ClassVar[tuple[TrustMode, ...]] = ("ldp-reports",)


def test_device_reports_get_the_reports_port_and_no_registration_table() -> None:
    """``ldp-reports``: the devices perturbed before the server (a stage before it), so the
    server's port reads their reports as they are and never re-randomises them."""
    assert isinstance(ports_for([ReportsOnly(ldp().config)], TASK), DeviceReports)
    with pytest.raises(ValueError, match="registration table is for cdp and ldp-simulated"):
        ports_for([ReportsOnly(ldp().config)], TASK, registration=Preferences(by_user={}))


class Counting(LBU):
    """LBU with client-side state: how often each user was asked (spec ldp-ids §3.1)."""

    def client_state(self) -> Any:
        return np.zeros(self.config.population, dtype=np.int64)


def test_client_state_lives_in_the_stream_state_and_only_the_port_holds_it() -> None:
    mech = Counting(ldp().config)
    plan = make_plan("t", [mech], TASK, 50, 7)
    logic = SlottedLogic("t", plan, None)
    state = logic._state_for("s")
    chain = state.clients["LBU"]
    assert isinstance(chain, np.ndarray) and chain.shape == (50,)
    port = plan.ports.port(state, np.zeros(50), None, chain)  # type: ignore[arg-type]
    assert isinstance(port, SimulatedClientPort)
    assert port._client_state is chain  # behind the port, not on the Slot
    assert not hasattr(port, "client_state")
    restored = pickle.loads(pickle.dumps(logic.snapshot()))
    assert np.array_equal(restored.clients["LBU"], chain)
