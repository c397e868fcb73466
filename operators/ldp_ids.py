"""Bytewax operator for the LDP-IDS family (spec ldp-ids §6): w-event ε-LDP releases per stream.

Example::

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main
    import numpy as np
    from privstream.connectors.events import EventBatch
    from privstream.mechanisms.ldp_ids import LdpIdsConfig
    from privstream.operators.ldp_ids import ldp_ids

    n = 1000
    batches = [EventBatch("clicks", np.full(n, t), np.arange(n), np.arange(n) % 2.0, complete_through=t)
               for t in range(1, 41)]
    flow = Dataflow("example")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(batches)), lambda b: b.stream)
    out = ldp_ids("lpa", keyed, mechanism="LPA", config=LdpIdsConfig(1.0, 20, n), secret=7)
    releases = []
    op.output("releases", out.releases, TestingSink(releases))
    run_main(flow)
    assert [r.slot for r in releases] == list(range(1, 41))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bytewax.dataflow import operator
from bytewax.operators import KeyedStream

from privstream.connectors.events import EventBatch
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.ldp_ids import LdpIdsConfig, build
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.slotting import MechanismOut, SlottingConfig, slotted_mechanism


@operator
def ldp_ids(
    step_id: str,
    up: KeyedStream[EventBatch],
    *,
    mechanism: str | Sequence[str],
    config: LdpIdsConfig,
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    split: BudgetSplit | None = None,
) -> MechanismOut:
    """Publish ``mechanism`` (LBU, LSP, LPU, LBD, LBA, LPD or LPA) releases for every stream.

    ``mechanism`` may be a list of names: they then run side by side over one slotting of the
    input, each with its own ledger and its share ``s_j`` of ``split`` (required for several:
    ``BudgetSplit.parse("equal", k)``, or an evaluation). Guarantee: w-event ε-LDP for every
    user of every stream (spec §1.3) with ``ε = config.epsilon`` and ``w = config.window``,
    composed over the mechanisms (each runs with ``s_j·ε``) and enforced by their ledgers and
    the population accountant.
    """
    names = [mechanism] if isinstance(mechanism, str) else list(mechanism)
    split = split or BudgetSplit.parse(None, len(names))
    return slotted_mechanism(
        "mechanism",
        up,
        mechanisms=[
            build(name, dataclasses.replace(config, epsilon=config.epsilon * share))
            for name, share in zip(names, split.shares, strict=True)
        ],
        task=config.task,
        population=config.population,
        secret=secret,
        slotting=slotting,
        split=split,
        epsilon=config.epsilon,
    )
