"""A replay releases the same bytes whatever the poll sizes (issue 27 item 1, issue 18 §4).

Before: the parser judged each value's shape against the first value of its parse call, so a
``[0]`` first in a poll of a histogram stream (or a 2-vector first in a 3-vector CGM stream)
turned every good event of that poll into an ``invalid_type`` dead letter, while alone in its
poll it dropped only itself: a replay with other poll sizes published other releases (whose
difference, with identical noise, is the exact change of the histogram). Now every message is
judged on its own against its stream's task: the same input cut into polls of 1, 7 or all of
its messages gives byte-identical releases, ledger entries and dead letters (with their
offsets), with the hostile messages first in their polls.
"""

from __future__ import annotations

import json
from typing import Any

import bytewax.operators as op
import numpy as np
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.jsonl import to_json
from privstream.connectors.kafka import RawBatch
from privstream.families.registry import family
from privstream.flows.config import estimation_task
from privstream.flows.io import parse_polls
from privstream.operators.family import family_mechanisms
from privstream.operators.slotting import MechanismOut, SlottingConfig
from privstream.schema.events import DeadLetter

N, T = 60, 6
TASKS: dict[str, Any] = {"visits": 2, "pos": ((0.0, 0.0, 0.0), 1.0)}
HOSTILE = [
    b'{"stream":"visits","user":"x","slot":%d,"value":[0]}',
    b'{"stream":"pos","user":"y","slot":%d,"value":[0.1,0.2]}',
    b'{"stream":"visits","user":"z","slot":%d,"value":1,"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"stream":"visits","user":"w","slot":' + b"9" * 5000 + b',"value":1,"t":%d}',
    b'{"stream":"pos","end_of_slot":%d,"tag":"zz","junk":[[[1]]]}',
]


def messages() -> list[bytes]:
    """Both streams' events slot by slot, each slot's markers after them, and a hostile
    message at every seventh position (so polls of 7 and of 1 start with one)."""
    rng = np.random.default_rng(11)
    good: list[bytes] = []
    for t in range(1, T + 1):
        for u in range(N):
            good.append(b'{"stream":"visits","user":"u%d","slot":%d,"value":%d}'
                        % (u, t, int(rng.random() < 0.3)))  # fmt: skip
            x = rng.uniform(-0.3, 0.3, 3).round(3).tolist()
            good.append(b'{"stream":"pos","user":"u%d","slot":%d,"value":%s}'
                        % (u, t, json.dumps(x).encode()))  # fmt: skip
        good += [
            b'{"stream":"visits","end_of_slot":%d}' % t,
            b'{"stream":"pos","end_of_slot":%d}' % t,
        ]
    out, k = [], 0
    for i, line in enumerate(good):
        if i % 6 == 0:  # with the hostile line: every seventh message
            t = 1 + i // (2 * N + 2)  # the slot being written (a marker: the one before)
            hostile = HOSTILE[k % len(HOSTILE)]
            out.append(hostile % (t - 1 if b"end_of_slot" in hostile else t))
            k += 1
        out.append(line)
    return out


def stream_operator(name: str, keyed: Any) -> MechanismOut:
    entry = family("ldp-ids" if name == "visits" else "cgm")
    config = entry.make_config(
        epsilon=2.0, window=4, population=N, task=estimation_task(TASKS[name])
    )
    mine = op.filter(f"only_{name}", keyed, lambda item, n=name: item[0] == n)
    return family_mechanisms(
        f"mech_{name}", mine, family=entry, mechanism="LBU" if name == "visits" else "CGM",
        config=config, secret=5, slotting=SlottingConfig(close_on_eof=True),
    )  # fmt: skip


def run(poll: int) -> dict[str, list[bytes]]:
    """The flow's parse step over ``messages()`` cut into polls of ``poll`` messages, then
    both streams' operators: every output as bytes."""
    values = messages()
    polls = [RawBatch("in", 0, i, values[i : i + poll]) for i in range(0, len(values), poll)]
    flow = Dataflow("polls")
    shapes = {name: estimation_task(task).value_shape for name, task in TASKS.items()}
    batches, dead = parse_polls(op.input("in", flow, TestingSource(polls)), list(TASKS), shapes)
    keyed = op.key_on("by_stream", batches, lambda b: b.stream)
    outs = [stream_operator(name, keyed) for name in TASKS]
    sinks: dict[str, list[bytes]] = {"releases": [], "ledger": [], "dead": []}
    releases = op.merge("r", *(o.releases for o in outs))
    ledger = op.merge("l", *(o.ledger for o in outs))
    letters = op.merge("d", dead, *(o.dead_letters for o in outs))
    op.output(
        "r_out",
        op.map("r_json", releases, lambda r: to_json(r).encode()),
        TestingSink(sinks["releases"]),
    )
    op.output(
        "l_out",
        op.map("l_json", ledger, lambda e: to_json(e).encode()),
        TestingSink(sinks["ledger"]),
    )
    op.output("d_out", op.map("d_bytes", letters, _letter), TestingSink(sinks["dead"]))  # fmt: skip
    run_main(flow)
    return {k: sorted(v) for k, v in sinks.items()}


def _letter(d: DeadLetter) -> bytes:
    return b"%s|%s|%s|%s|" % (d.reason.encode(), str(d.stream).encode(), str(d.offset).encode(),
                              d.detail.encode()) + d.payload_bytes()  # fmt: skip


def test_a_replay_releases_the_same_bytes_whatever_the_poll_sizes() -> None:
    whole = run(len(messages()))
    assert run(1) == whole
    assert run(7) == whole
    releases = [json.loads(r) for r in whole["releases"]]
    assert sorted({(r["stream"], r["slot"]) for r in releases}) == [
        (s, t) for s in ("pos", "visits") for t in range(1, T + 1)
    ]
    # every hostile event is one dead letter, and no good event is refused
    refused = [d.split(b"|", 4)[4] for d in whole["dead"]]
    hostile = [
        m for m in messages() if any(b'"user":"%s"' % u in m for u in (b"x", b"y", b"z", b"w"))
    ]
    assert sorted(m for m in refused if m in hostile) == sorted(hostile)
    assert not [m for m in refused if m not in hostile and b"end_of_slot" not in m]
