"""In ``ldp-reports`` mode nothing the server holds or writes carries a raw value or a CGM noise
chain: not its input (the report topic), its recovery store (the pickled ``StreamState``), its
logs, its metrics, nor any output (releases, ledger, dead letters, requests).

The devices hold canary values: every (user, slot) value is a distinct float of 12 significant
digits, never produced by any computation the server could do on reports, so its decimal text
appearing anywhere is a leak. The chain's values (each device's clipped value and previous
report, which the server must never hold) are read from the devices' stores and searched for
the same way. A control run proves the search works: the simulated mode's own client state (the
noise chains a simulated server does hold) does contain them.
"""

from __future__ import annotations

import logging
import pickle
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client import generate_latest

from privstream.connectors.jsonl import to_json
from privstream.experiments.reports_loop import ReportsRun, run_reports
from privstream.families.cgm import FAMILY as CGM
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask, MeanTask
from privstream.operators.metrics import REGISTRY
from privstream.runtime.fleet import FleetConfig

USERS, SLOTS = 60, 6


@dataclass(frozen=True)
class Canaries:
    """A numeric stream whose every value is a distinct 12-digit float in (1, 99)."""

    name: str = "canary"
    users: int = USERS
    slots: int = SLOTS
    numeric: bool = True
    d: int = 1
    bounds: tuple[float, float] = (0.0, 100.0)

    def values(self, slot: int) -> NDArray[np.float64]:
        rng = np.random.default_rng(1000 + slot)
        return np.round(1 + 98 * rng.random(self.users), 10) + 1e-10 * np.arange(self.users)

    def truth(self, slot: int) -> NDArray[np.float64]:
        return np.array([self.values(slot).mean()])

    def texts(self) -> set[str]:
        """Every raw value as the decimal texts a leak would show (repr and 10 digits)."""
        out: set[str] = set()
        for t in range(1, self.slots + 1):
            for v in self.values(t):
                out |= {repr(float(v)), f"{v:.10f}"}
        return out


def _artifacts(run: ReportsRun, caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """Everything the server holds or wrote, as text: its input, its recovery store (the
    snapshot as pickled, every object in it rendered), its logs, the metrics and its outputs."""
    assert run.server is not None
    state = pickle.loads(pickle.dumps(run.server.snapshot()))
    store = [state.__dict__, state.protocol.__dict__, state.clients, state.open_slots]
    store += [getattr(m, "__dict__", m) for m in state.mechanisms.values()]
    with np.printoptions(threshold=sys.maxsize, floatmode="unique"):
        held = repr(store)
    return {
        "input": "\n".join(run.inputs),
        "recovery store": held,
        "logs": caplog.text,
        "metrics": generate_latest(REGISTRY).decode(),
        "outputs": "\n".join(
            [
                *(to_json(e) for e in [*run.releases, *run.ledger]),
                *(d.payload for d in run.dead_letters),
                *(r.to_json() for r in run.requests),
            ]
        ),
    }


def _outputs(run: ReportsRun) -> list[str]:
    events = [to_json(e) for e in [*run.releases, *run.ledger]]
    return [*events, *(d.payload for d in run.dead_letters), *(r.to_json() for r in run.requests)]


def _found(artifacts: dict[str, str], secrets: set[str]) -> dict[str, list[str]]:
    """Where any of ``secrets`` appears (at most three examples per place)."""
    return {
        where: sorted(s for s in secrets if s in text)[:3]
        for where, text in artifacts.items()
        if any(s in text for s in secrets)
    }


def _chain_texts(run: ReportsRun) -> set[str]:
    """The devices' clipped values: what their noise chains hold besides their reports."""
    assert run.fleet is not None
    out: set[str] = set()
    for device in run.fleet.cgm_devices:
        for phases in device.chains.values():
            for chain in phases.values():
                out |= {repr(float(x)) for x in chain.clipped}
    return out


@pytest.mark.parametrize("name", ["Alg1", "CGM"])
def test_no_raw_value_or_noise_chain_reaches_the_server(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    source = Canaries()
    config = CGM.make_config(epsilon=8.0, window=SLOTS, population=USERS,
                             task=MeanTask(0.0, 100.0), delta=1e-5)  # fmt: skip
    run = run_reports([CGM.build(name, config)], config.task, source,
                      FleetConfig(USERS, 8.0, delta=1e-5), slots=SLOTS, secret=7, device_seed=3)  # fmt: skip
    assert [r.slot for r in run.releases] == list(range(1, SLOTS + 1))
    chains = _chain_texts(run)
    assert len(chains) >= USERS  # every device keeps its last clipped value
    assert _found(_artifacts(run, caplog), source.texts() | chains) == {}


def test_the_search_finds_what_a_simulated_server_holds() -> None:
    """Control: the simulated mode's own client state (the chains it keeps for its simulated
    devices) does hold the canaries' clipped values, so the search above can fail."""
    source = Canaries()
    config = CGM.make_config(epsilon=8.0, window=SLOTS, population=USERS,
                             task=MeanTask(0.0, 100.0), delta=1e-5)  # fmt: skip
    mech = CGM.build("Alg1", config)  # no differential clip: the chain keeps the raw value
    clients, state = mech.client_state(), mech.initial_state()
    for t in range(1, SLOTS + 1):
        randomness = SlotRandomness(1, "s", t, mech.name)
        port = SimulatedClientPort(source.values(t), config.task, randomness, client_state=clients)
        state, _ = mech.step(state, Slot("s", t, port, randomness))
        clients = port.client_state_after
    with np.printoptions(threshold=sys.maxsize, floatmode="unique"):
        held = repr(clients.__dict__)
    assert _found({"simulated store": held}, source.texts())


def test_an_ldp_ids_server_keeps_no_per_user_value(caplog: pytest.LogCaptureFixture) -> None:
    """LDP-IDS values are categories (no canary text): the snapshot holds no value array,
    no buffered slot and no client state, and the outputs name no device."""
    source = Canaries()
    task = FrequencyTask(4)
    config = LDP_IDS.make_config(epsilon=1.0, window=3, population=USERS, task=task)
    run = run_reports([LDP_IDS.build("LPA", config)], task, source, FleetConfig(USERS, 1.0, 3),
                      slots=SLOTS, secret=7, device_seed=3)  # fmt: skip
    assert run.server is not None
    state = run.server.snapshot()
    assert bool(np.all(np.isnan(state.current))) and not state.open_slots
    assert state.clients == {} and state.directory == {}
    outputs = _artifacts(run, caplog)["outputs"]
    assert "sim-" not in outputs  # no device pseudonym in releases, ledger or requests
