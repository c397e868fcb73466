"""Flow-level conformance checks (``privstream.conformance.checks``): a registered mechanism run through its
family's generic operator under Bytewax, with its testing source and sink.

Two streams of a drifting binary population over ``T`` slots, with an end-of-slot marker per
slot; a ``cdp`` family gets the personalized registration of the mechanism-level checks. The
noise comes from a public test seed (the outputs say so), so runs are comparable byte for byte.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from privstream.connectors.jsonl import to_json
from privstream.families.registry import Registered
from privstream.mechanisms.stages import pre_server
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.operators.stages import persisted_steps
from privstream.schema.events import EventBatch

N, T, SEED = 300, 16, 5
STREAMS = ("a", "b")


class FlowCheckFailed(AssertionError):
    """A mechanism does not conform when run as a flow."""


def _batches(t_max: int = T) -> list[Any]:
    out: list[Any] = []
    for t in range(1, t_max + 1):
        for stream in STREAMS:
            rng = np.random.default_rng([t, len(stream)])
            values = (rng.random(N) < 0.2 + 0.1 * np.sin(t / 4)).astype(np.float64)
            out.append(EventBatch(stream, np.full(N, t), np.arange(N), values, complete_through=t))
    return out


def _flow(registered: Registered, items: list[Any]) -> tuple[Dataflow, dict[str, list[str]]]:
    """The family's operator over ``items``; releases and ledger entries as canonical JSON."""
    family = registered.family
    window = family.mechanisms[registered.name].conformance.window
    config = family.make_config(epsilon=1.0, window=window, population=N, task=family.task)
    prefs = None
    if family.needs_registration:
        eps = np.resize([np.nan, 1.0, 2.0, 1.5], N)
        prefs = Preferences(epsilons=eps, windows=np.resize([0, 3, 5, 2, 5], N))
    flow = Dataflow("conformance")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(items)), lambda b: b.stream)
    out = family_mechanisms("family", keyed, family=family, mechanism=registered.name,
                            config=config, secret=SEED, registration=prefs)  # fmt: skip
    sinks: dict[str, list[str]] = {"releases": [], "ledger": []}
    op.output("r", op.map("r_json", out.releases, to_json), TestingSink(sinks["releases"]))
    op.output("l", op.map("l_json", out.ledger, to_json), TestingSink(sinks["ledger"]))
    return flow, sinks


def _require(ok: bool, registered: Registered, what: str) -> None:
    if not ok:
        raise FlowCheckFailed(f"{registered.name} (flow): {what}")


def _by_id(lines: list[str]) -> dict[str, str]:
    return {json.loads(line)["release_id"]: line for line in lines}


def check_recovery_round_trip(registered: Registered) -> None:
    """Abort mid-stream, resume from the recovery store: every slot is released, and every
    release of either run is byte-identical to the uninterrupted run's."""
    clean_flow, clean = _flow(registered, _batches())
    run_main(clean_flow)
    items = _batches()
    items.insert(len(items) // 2, TestingSource.ABORT())
    with tempfile.TemporaryDirectory() as tmp:
        init_db_dir(Path(tmp), 1)
        recovery = RecoveryConfig(tmp)
        first_flow, first = _flow(registered, items)
        run_main(first_flow, epoch_interval=timedelta(0), recovery_config=recovery)
        second_flow, second = _flow(registered, items)
        run_main(second_flow, epoch_interval=timedelta(0), recovery_config=recovery)
    expected = _by_id(clean["releases"])
    _require(0 < len(first["releases"]) < len(expected), registered, "the abort did not cut")
    replayed = _by_id(first["releases"]) | _by_id(second["releases"])
    _require(replayed.keys() == expected.keys(), registered, "slots missing after the resume")
    for line in first["releases"] + second["releases"]:
        same = line == expected[json.loads(line)["release_id"]]
        _require(same, registered, "a replayed release differs from the uninterrupted run")


def check_two_workers(registered: Registered) -> None:
    """Two workers (the streams on different workers) release exactly what one releases."""
    one_flow, one = _flow(registered, _batches())
    run_main(one_flow)
    two_flow, two = _flow(registered, _batches())
    cluster_main(two_flow, [], 0, worker_count_per_proc=2)
    _require(sorted(two["releases"]) == sorted(one["releases"]), registered, "2 workers ≠ 1")
    _require(sorted(two["ledger"]) == sorted(one["ledger"]), registered, "2 workers' ledger")


def check_pinned_step_ids(registered: Registered) -> None:
    """The stateful step's id is part of the recovery format: ``<step>.mechanism.slots``
    (after the steps of the stages before the server, ``operators.stages.persisted_steps``)."""
    flow, _ = _flow(registered, [])
    found: list[str] = []

    def walk(step: Any) -> None:
        for sub in step.substeps:
            if type(sub).__name__ in ("input", "stateful_batch", "output"):
                found.append(sub.step_id)
            walk(sub)

    walk(flow)
    mech = registered.example(registered.family.mechanisms[registered.name].conformance.population)
    chain = [f"conformance.family.{step}" for step in persisted_steps(pre_server([mech]))]
    pinned = ["conformance.in", *chain, "conformance.family.mechanism.slots", "conformance.r",
              "conformance.l"]  # fmt: skip
    _require(found == pinned, registered, f"persisted step ids {found} ≠ {pinned}")


def check_replay_identical(registered: Registered) -> None:
    """The same input and secret give byte-identical releases and ledger entries."""
    flow_a, a = _flow(registered, _batches())
    run_main(flow_a)
    flow_b, b = _flow(registered, _batches())
    run_main(flow_b)
    _require(a == b, registered, "a replay of the flow differs")
    _require(len(a["releases"]) == len(STREAMS) * T, registered, "a slot was not released")


FLOW_CHECKS: tuple[tuple[str, Callable[[Registered], None]], ...] = (
    ("recovery_round_trip", check_recovery_round_trip),
    ("two_workers", check_two_workers),
    ("pinned_step_ids", check_pinned_step_ids),
    ("replay_identical", check_replay_identical),
)
