"""Bytewax operator for the personalized w-event family (spec personalized-w-event §9).

Central DP with a trusted curator (design §4, ``cdp``): events carry raw values, and every
registered user ``i`` has a privacy requirement ``(ε_i, w_i)`` — given in the registration
table (``preferences``) or the stream default (``config.epsilon``, ``config.window``), fixed
before the data arrive. Guarantee: (w_i, ε_i)-EPDP for every user (spec §1.3), enforced by the
per-class ledger on every charge, before anything of the slot is released.

Example::

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main
    import numpy as np
    from privstream.connectors.events import EventBatch
    from privstream.mechanisms.personalized import PersonalizedConfig
    from privstream.operators.personalized import personalized

    n = 1000
    batches = [EventBatch("clicks", np.full(n, t), np.arange(n), np.arange(n) % 2.0,
                          complete_through=t) for t in range(1, 41)]
    flow = Dataflow("example")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(batches)), lambda b: b.stream)
    config = PersonalizedConfig(population=n, epsilon=1.0, window=10)
    out = personalized("pbd", keyed, mechanism="PBD", config=config, secret=7)
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
from privstream.mechanisms.personalized import PersonalizedConfig, build, mechanism_names
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.slotting import (
    MechanismOut,
    Preferences,
    SlottingConfig,
    TrustedCurator,
    slotted_mechanism,
)


@operator
def personalized(
    step_id: str,
    up: KeyedStream[EventBatch],
    *,
    mechanism: str | Sequence[str],
    config: PersonalizedConfig,
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    preferences: Preferences | None = None,
    split: BudgetSplit | None = None,
) -> MechanismOut:
    """Publish ``mechanism`` (BD, BA, Uniform, Sample, PLBU, PU, PBD or PBA) releases for every
    stream; a list of names runs side by side over one slotting, each with its own ledger and
    its share of ``split`` (required for several, see ``operators.ldp_ids.ldp_ids``).

    ``preferences`` is the registration, fixed before the data: named users must be in its
    table (others are ``unregistered_user`` dead letters); dense indices ``0..n−1`` are all
    registered. Ledger entries carry every privacy class's spend (``LedgerEntry.classes``); an
    event stating another requirement than the registered one is a ``requirement_changed``
    dead letter.
    """
    names = mechanism_names(mechanism)
    split = split or BudgetSplit.parse(None, len(names))
    return slotted_mechanism(
        "mechanism",
        up,
        mechanisms=[
            build(name, dataclasses.replace(config, budget_share=share))
            for name, share in zip(names, split.shares, strict=True)
        ],
        task=config.task,
        population=config.population,
        secret=secret,
        slotting=slotting,
        trust=TrustedCurator(config.task, preferences),
        split=split,
        epsilon=config.epsilon,
    )
