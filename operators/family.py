"""The one Bytewax operator of every mechanism family (design §3–§5): a family's registry entry
(``families.registry``) and its config are all it needs.

Example::

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main
    import numpy as np
    from privstream.schema.events import EventBatch
    from privstream.families.registry import LDP_IDS
    from privstream.mechanisms.tasks import FrequencyTask
    from privstream.operators.family import family_mechanisms

    n = 1000
    batches = [EventBatch("clicks", np.full(n, t), np.arange(n), np.arange(n) % 2.0,
                          complete_through=t) for t in range(1, 41)]
    flow = Dataflow("example")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(batches)), lambda b: b.stream)
    config = LDP_IDS.make_config(epsilon=1.0, window=20, population=n, task=FrequencyTask(2))
    out = family_mechanisms("lpa", keyed, family=LDP_IDS, mechanism="LPA", config=config, secret=7)
    releases = []
    op.output("releases", out.releases, TestingSink(releases))
    run_main(flow)
    assert [r.slot for r in releases] == list(range(1, 41))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bytewax.dataflow import operator
from bytewax.operators import KeyedStream

from privstream.families.registry import Family, FamilyConfig, family
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.stages import pre_server
from privstream.operators.registration import Preferences, check_closed_population
from privstream.operators.sharded import sharded_mechanism
from privstream.operators.slotting import (
    MechanismOut,
    SlottingConfig,
    make_plan,
    slotted_mechanism,
)
from privstream.operators.stages import chain_events
from privstream.schema.events import EventBatch


@operator
def family_mechanisms(
    step_id: str,
    up: KeyedStream[EventBatch],
    *,
    family: Family | str,
    mechanism: str | Sequence[str],
    config: FamilyConfig,
    secret: NoiseKey | int | bytes,
    slotting: SlottingConfig | None = None,
    split: BudgetSplit | None = None,
    registration: Preferences | None = None,
    shards: int | None = None,
) -> MechanismOut:
    """Publish the family's ``mechanism`` releases for every stream of ``up`` (keyed by stream).

    ``mechanism`` may be a list of names: they then run side by side over one slotting of the
    input, each with its own ledger and its share ``s_j`` of ``split`` (required for several:
    ``BudgetSplit.parse("equal", k)``, or an evaluation). Guarantee: each mechanism's declared
    ``privacy_cost`` (w-event ε-LDP for LDP-IDS, (w_i, ε_i)-EPDP for personalized) at the
    population budget ``config.epsilon``, composed over the mechanisms by the population
    accountant and enforced by their ledgers before release. ``registration`` is the
    registration table of a central-DP (``cdp``) family, or the closed population of an LDP
    family: only its users enrol (sybils cannot take seats), each entry's requirement checked
    against the stream's one guarantee (``check_closed_population``).

    A mechanism that declares stages before its server stage (``Mechanism.stages()``) has them
    wired between ``up`` and the slotted operator (``operators.stages.chain_events``), each keyed
    by its own key with its own snapshotted state; a one-stage family adds no step.
    ``shards``: run the per-user work on that many user shards of each stream
    (``operators.sharded``; ``up`` then holds ``ShardCut``'s pieces), byte-identical releases.
    """
    entry = _family(family)
    names = entry.names(mechanism)
    split = split or BudgetSplit.parse(None, len(names))
    # the population's budget in the guarantees' additive unit (ε, μ², ρ): a full share's
    cost = entry.build(names[0], config).privacy_cost
    budget = cost.budget
    if registration is not None and not entry.needs_registration:
        check_closed_population(registration, config.epsilon, cost, config.population)
    mechanisms = entry.build_shared(names, config, split.shares)
    stages = pre_server(mechanisms)
    if shards is not None:
        if stages:
            raise ValueError(f"step {step_id!r}: user shards run no stages before the server")
        plan = make_plan(step_id, mechanisms, config.task, config.population, secret, slotting,
                         registration, split, budget)  # fmt: skip
        pieces: Any = up  # ShardCut's pieces, keyed by shard
        return sharded_mechanism("mechanism", pieces, plan=plan, shards=shards)
    if stages:  # devices, a shuffler ...: keyed by their own keys, then by stream again
        up = chain_events(up, stages)
    return slotted_mechanism(
        "mechanism", up, mechanisms=mechanisms, task=config.task, population=config.population,
        secret=secret, slotting=slotting, split=split, epsilon=budget, registration=registration,
    )  # fmt: skip


def _family(entry: Family | str) -> Family:
    return entry if isinstance(entry, Family) else family(entry)
