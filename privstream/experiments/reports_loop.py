"""``ldp-reports`` in one process, without Kafka: the server stage and a simulated fleet
exchange requests, reports and round markers as the topics would carry them (issue 23).

``run_reports`` drives the server stage's own logic (``operators.report_rounds``) slot by slot:
the clock opens each slot, every request the server publishes goes through its JSON encoding to
the fleet (``runtime.fleet``, every device answering through the device library and its own
ledger), every report back through its JSON encoding to the server, and the clock closes each
round once the fleet has answered it. It is what the equivalence tests and the bench's
in-process figures run; the Kafka flow (``flows.reports``) runs the same logic between topics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from privstream.client.randomizers import SeededRandomness
from privstream.connectors.datasets import SlotStream
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Halt, LedgerEntry, Mechanism, Release
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.report_rounds import ReportRoundsLogic, ReportsPlan
from privstream.operators.slotting import make_plan
from privstream.runtime.fleet import Fleet, FleetConfig
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import Close, ProtocolError, Request, decode_request
from privstream.schema.report_wire import ReportColumns, decode_poll


def seeded_devices(seed: int) -> Callable[[], SeededRandomness]:
    """A factory giving each simulated device its own reproducible randomness."""
    counter = iter(range(1 << 62))
    return lambda: SeededRandomness(seed * 1_000_003 + next(counter))


@dataclass
class ReportsRun:
    """What a run released and refused, and its timings (server seconds exclude the fleet);
    ``fleet`` the simulated devices after the run (their stats, ledgers and chains)."""

    releases: list[Release] = field(default_factory=list)
    ledger: list[LedgerEntry | Halt] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    reports: int = 0
    server_seconds: float = 0.0
    fleet_seconds: float = 0.0
    fleet: Fleet | None = None
    server: ReportRoundsLogic | None = None
    inputs: list[str] = field(default_factory=list)
    """Every report-topic message the server read (reports and round markers), as written."""


def run_reports(
    mechanisms: Sequence[Mechanism[Any, Any]],
    task: EstimationTask,
    source: SlotStream,
    fleet: FleetConfig,
    *,
    slots: int,
    secret: NoiseKey | int | bytes,
    stream: str = "reports",
    device_seed: int | None = None,
    split: BudgetSplit | None = None,
) -> ReportsRun:
    """Run ``mechanisms`` over ``slots`` slots with ``fleet.users`` simulated devices holding
    ``source``'s values (device ``i`` is user ``i``); ``device_seed`` makes the devices'
    randomness reproducible (None: the OS CSPRNG, as real devices). A report the fleet holds
    back (``FleetConfig.late``) reaches the server after its round's marker, whichever of the
    round's requests it answers; the last round's after the last slot."""
    key = NoiseKey.coerce(secret)
    plan = ReportsPlan.of(
        make_plan("reports", mechanisms, task, fleet.users, key, split=split), partitions=1
    )
    logic = ReportRoundsLogic("reports", plan, None)
    factory = seeded_devices(device_seed) if device_seed is not None else None
    devices = Fleet(fleet, source, factory) if factory else Fleet(fleet, source)
    clock_key, run = key.clock_key(), ReportsRun(fleet=devices, server=logic)
    late: list[str] = []  # reports the fleet held back: written after their round's marker
    for t in range(1, slots + 1):
        pending = _server(logic, run, [Close(stream, t, 0).signed(clock_key)])
        while pending:
            started, lines, late = time.perf_counter(), late, []
            for request in pending:
                lines += [m for _key, m in devices.receive(request.to_json())]
                late += [m for _key, m in devices.flush()]  # not before the round closes
            run.fleet_seconds += time.perf_counter() - started
            run.reports += len(lines)
            closes = [Close(stream, t, r.round).signed(clock_key) for r in pending[:1]]
            pending = _server(logic, run, _decoded(lines) + closes)
    if late:  # the last round's, written when the fleet stops
        run.reports += len(late)
        _server(logic, run, _decoded(late))
    return run


def _decoded(lines: list[str]) -> list[Any]:
    """The report-topic messages ``lines`` as the server stage decodes them (in one batch:
    runs of reports as columns)."""
    out = []
    for _, item in decode_poll(lines):
        if isinstance(item, ProtocolError):
            raise item  # the fleet writes well-formed messages only
        out.append(item)
    return out


def _server(logic: ReportRoundsLogic, run: ReportsRun, messages: list[Any]) -> list[Request]:
    """One call of the server stage; its requests (decoded as a device reads them)."""
    for m in messages:
        run.inputs += (
            [r.to_json() for r in m.reports()] if isinstance(m, ReportColumns) else [m.to_json()]
        )
    started = time.perf_counter()
    out, _ = logic.on_batch([(0, m) for m in messages])
    run.server_seconds += time.perf_counter() - started
    requests = []
    for kind, item in out:
        if kind == "release":
            run.releases.append(item)
        elif kind == "ledger":
            run.ledger.append(item)
        elif kind == "dead_letter":
            run.dead_letters.append(item)
        elif kind == "request":
            requests.append(decode_request(item.to_json()))
    run.requests += requests
    return requests
