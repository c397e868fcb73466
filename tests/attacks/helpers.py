"""Small flows the attack tests run: one stream of events through an operator, outputs as
dictionaries (the JSON that would reach the output topics)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.operators import KeyedStream
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.jsonl import to_json
from privstream.operators.slotting import MechanismOut
from privstream.schema.events import EventBatch

Outputs = dict[str, list[Any]]


def run_operator(
    items: list[EventBatch], operator: Callable[[KeyedStream[EventBatch]], MechanismOut]
) -> Outputs:
    """Run ``operator`` over ``items`` (keyed by stream) and return releases, ledger entries
    (parsed JSON) and dead letters."""
    flow = Dataflow("attack")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(items)), lambda b: b.stream)
    out = operator(keyed)
    sinks: dict[str, list[Any]] = {"releases": [], "ledger": [], "dead_letters": []}
    op.output(
        "releases_out", op.map("r_json", out.releases, to_json), TestingSink(sinks["releases"])
    )
    op.output("ledger_out", op.map("l_json", out.ledger, to_json), TestingSink(sinks["ledger"]))
    op.output("dead_out", out.dead_letters, TestingSink(sinks["dead_letters"]))
    run_main(flow)
    sinks["releases"] = [json.loads(r) for r in sinks["releases"]]
    sinks["ledger"] = [json.loads(r) for r in sinks["ledger"]]
    return sinks
