"""The sharded operator of one stream (issue 26): ``k`` user shards, then one decision.

``sharded_mechanism`` runs a plan (``operators.slotting.make_plan``) over shard pieces keyed
``<stream>/shard-<i>`` (``operators.user_shards.ShardCut``): each shard's per-user work in its
own Bytewax state (``operators.shard_slots``), then the stream's mechanisms in one decision
state keyed by stream (``operators.shard_decision``). The outputs are the slotted operator's.

Only what can be split without changing a release is sharded: a stream whose every port
follows from counts per registered requirement and bin (``Ports.shard_refusal``) — a
central-DP stream (class histograms, sums over users) or an ``ldp-simulated`` stream of a
closed population asking every user every slot with an oracle whose aggregate is drawn from
the counts (budget division) — with a registration table naming its users, on the
``markers`` clock. Open LDP populations, population division, device state and the ``data``
clock (lateness judged on every row of a partition) are refused by ``check_shardable`` with
the reason (docs/decisions.md, "User shards").
"""

from __future__ import annotations

from bytewax import operators as op
from bytewax.dataflow import operator
from bytewax.operators import KeyedStream

from privstream.operators.metrics import BOARD
from privstream.operators.shard_decision import DecisionLogic
from privstream.operators.shard_slots import ShardLogic, ShardPlan
from privstream.operators.slotting import MechanismOut, SlottedPlan, _pick
from privstream.operators.user_shards import MAX_SHARDS, ShardPiece


def check_shardable(plan: SlottedPlan, shards: int, where: str) -> None:
    """Refuse user shards where they would change a release (module docstring)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"{where}: shards must be an integer 1..{MAX_SHARDS}, got {shards!r}")
    why = plan.ports.shard_refusal(list(plan.mechanisms.values()))
    if why is not None:
        raise ValueError(f"{where}: {why}; splitting its users over shards would change its "
                         "releases")  # fmt: skip
    if plan.config.clock != "markers":
        raise ValueError(
            f'{where}: user shards need the markers clock (kafka.clock = "markers"): with the '
            "data clock a row's lateness depends on every earlier row of its partition"
        )


@operator
def sharded_mechanism(
    step_id: str, up: KeyedStream[ShardPiece], *, plan: SlottedPlan, shards: int
) -> MechanismOut:
    """Run ``plan``'s mechanisms over ``shards`` user shards of every stream of ``up``
    (module docstring). Guarantee: the slotted operator's, with releases byte-identical to
    it for every shard count."""
    check_shardable(plan, shards, f"step {step_id!r}")
    BOARD.set_run(insecure_seed=plan.key.insecure, evaluation=plan.split.evaluation)
    sharded = ShardPlan(plan, shards)
    pieces = op.stateful_batch("shards", up, lambda resume: ShardLogic(step_id, sharded, resume))
    tagged = op.key_rm("shards_untag", pieces)
    counted = op.filter_map("shard_slots", tagged, _pick("share"))
    by_stream = op.key_on("by_stream", counted, lambda message: message.stream)
    decided = op.stateful_batch(
        "decide", by_stream, lambda resume: DecisionLogic(step_id, sharded, resume)
    )
    outputs = op.key_rm("decide_untag", decided)
    return MechanismOut(
        releases=op.filter_map("releases", outputs, _pick("release")),
        ledger=op.filter_map("ledger", outputs, _pick("ledger")),
        dead_letters=op.filter_map("dead_letters", tagged, _pick("dead_letter")),
        extra=op.filter_map("extra", outputs, _pick("extra")),
    )
