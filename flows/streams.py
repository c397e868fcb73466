"""The dataflow of a flow configuration file (``privstream run --config flow.toml``): one Kafka
input topic carrying many streams → parse (where the partition is read) → key by stream → one
family operator per configured stream, each with its own mechanisms, task, budget share, window
and slotting → the shared outputs.

Guarantee: every stream's mechanisms compose under the stream's share ``s·ε`` of the
population's budget (its own population accountant, enforced before release), and the shares
sum to at most 1 (``privstream.flows.config``), so a user present in every stream spends at most
ε in any window of the population's ``window`` slots. A central-DP stream scales every
registered user's own ε_i by its share.

Step ids: ``<family>_<stream>`` per stream (``ldp_ids_country``), and the shared input and
output steps of ``flows.io``; they are part of the recovery format, so a stream keeps its
state across restarts as long as its name does. Under Bytewax's cluster mode each stream's
state lives on one worker (its key's), parsing runs on the worker that reads the partition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.operators import KeyedStream

from privstream.connectors import control
from privstream.connectors.kafka import KafkaSettings
from privstream.families.registry import Family, family
from privstream.flows.config import FlowConfig, StreamSection, estimation_task
from privstream.flows.io import KafkaIO, kafka_events, outputs, slotting_for, stream_plan
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Release
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.family import family_mechanisms
from privstream.operators.metrics import BOARD
from privstream.operators.registration import Preferences
from privstream.operators.slotting import MechanismOut
from privstream.operators.user_shards import SHARD_MARK, ShardCut
from privstream.runtime.republish import StreamPlan
from privstream.schema.events import EventBatch

__all__ = ["build_streams", "kafka_io", "registration_for"]


def kafka_io(config: FlowConfig, until_slot: int | None = None) -> KafkaIO:
    """The Kafka topics of ``config`` (partitions still to be read from the broker); client
    properties from the file win over ``PRIVSTREAM_KAFKA_*`` in the environment."""
    k = config.kafka
    # the environment's PRIVSTREAM_KAFKA_* properties (credentials from a Secret) merge in
    settings = KafkaSettings.from_options(
        k.bootstrap, [f"{p}={v}" for p, v in k.properties.items()]
    )
    return KafkaIO(
        settings, k.input_topic, k.output_topic, k.dead_letter_topic, k.ledger_topic,
        until_slot=until_slot, max_event_bytes=k.max_event_bytes,
        stall_warning_seconds=k.stall_warning_seconds, clock=k.clock,
        trust_input_clock=k.trust_input_clock, grow_partitions=k.grow_partitions,
        input_topic_recreated=k.input_topic_recreated, extra_topics=dict(k.extra_topics),
        request_topic=k.request_topic,
    )  # fmt: skip


def build_streams(
    config: FlowConfig,
    kafka: KafkaIO,
    secret: NoiseKey,
    *,
    progress: Callable[[Release], None] | None = None,
) -> Dataflow:
    """The dataflow of every stream of ``config`` over ``kafka`` (with its partition count);
    an ``ldp-reports`` file's is the server stage of each stream (``flows.reports``)."""
    if config.kafka.trust == "ldp-reports":
        from privstream.flows.reports import build_report_streams

        return build_report_streams(config, kafka, secret)
    if kafka.published:  # a new incarnation's cooldown (issue 18 §2)
        kafka = kafka.with_gaps(_plans(config))
    stop = control.fresh()
    BOARD.clear()
    flow = Dataflow("privstream_streams")
    names = [s.name for s in config.streams]
    shapes = {s.name: estimation_task(s.task).value_shape for s in config.streams}
    batches, parse_errors = kafka_events(flow, kafka, names, stop, shapes)
    sharded = {s.name: s.shards for s in config.streams if s.shards is not None}
    keyed = (
        op.flat_map("by_stream", batches, ShardCut(sharded))  # on the parsing worker
        if sharded
        else op.key_on("by_stream", batches, lambda b: b.stream)
    )
    outs = [_stream_operator(spec, keyed, config, kafka, secret) for spec in config.streams]
    merged = MechanismOut(
        op.merge("releases", *(o.releases for o in outs)),
        op.merge("ledger", *(o.ledger for o in outs)),
        op.merge("mechanism_dead_letters", *(o.dead_letters for o in outs)),
        _merged_extra(outs),
    )
    pairs = [(s.name, m) for s in config.streams for m in s.mechanisms]
    outputs(merged, parse_errors, pairs=pairs, kafka=kafka, stop=stop, progress=progress)
    return flow


def _merged_extra(outs: list[MechanismOut]) -> Any:
    """Every stream operator's extra-output records on one stream (None: no operator has one)."""
    extra = [o.extra for o in outs if o.extra is not None]
    return op.merge("extra", *extra) if extra else None


@dataclass(frozen=True)
class _Setup:
    """One stream's family, its config, its registration and its client path."""

    entry: Family
    config: Any
    registration: Preferences | None
    client_path: str


def _setup(spec: StreamSection, config: FlowConfig) -> _Setup:
    """``spec``'s family config and registration (as its operator runs them)."""
    entry = family(spec.family)
    options = dict(spec.options)
    client_path = str(options.pop("client_path", "aggregate"))
    family_config = entry.make_config(
        epsilon=spec.epsilon, window=spec.window, population=config.population.users,
        task=estimation_task(spec.task), **options,
    )  # fmt: skip
    registration = registration_for(spec, config) if entry.needs_registration else None
    if spec.registered_only:  # a closed LDP population: the table's users, unscaled
        registration = Preferences(by_user=dict(config.population.preferences))
    return _Setup(entry, family_config, registration, client_path)


def _plans(config: FlowConfig) -> dict[str, StreamPlan]:
    """Every stream's cooldown plan (``flows.io.stream_plan``)."""
    plans = {}
    for spec in config.streams:
        setup = _setup(spec, config)
        plans[spec.name] = stream_plan(
            setup.entry, setup.entry.names(spec.mechanisms), setup.config, setup.registration
        )
    return plans


def _stream_operator(
    spec: StreamSection,
    keyed: KeyedStream[EventBatch],
    config: FlowConfig,
    kafka: KafkaIO,
    secret: NoiseKey,
) -> MechanismOut:
    """``spec``'s family operator over its own events (the batches keyed by its name)."""
    setup = _setup(spec, config)
    entry = setup.entry
    mine: Any = op.filter(
        f"stream_{spec.name}",
        keyed,
        functools.partial(_is, spec.name if spec.shards is None else spec.name + SHARD_MARK),
    )
    step = f"{entry.name.replace('-', '_')}_{spec.name}"
    return family_mechanisms(
        step, mine, family=entry, mechanism=spec.mechanisms, config=setup.config,
        secret=secret, slotting=slotting_for(kafka, spec.lateness, setup.client_path),
        split=BudgetSplit.parse(spec.budget_split, len(spec.mechanisms)),
        registration=setup.registration, shards=spec.shards,
    )  # fmt: skip


def registration_for(spec: StreamSection, config: FlowConfig) -> Preferences:
    """A central-DP stream's registration: the population's table at the stream's share. The
    mechanisms run every user at ``share·ε_i``; users state (and are checked against) their own
    ``ε_i`` (``Preferences.share``)."""
    table = config.population.preferences  # read and checked by flow_config.load
    if not table:
        raise ValueError(f"stream {spec.name!r}: central DP needs the registration table")
    return Preferences(by_user=dict(table), share=spec.share)


def _is(key: str, item: tuple[str, Any]) -> bool:
    """An item of the stream ``key`` names, or of one of its shards (``key`` ends with
    ``SHARD_MARK``: stream names hold no ``/``)."""
    return item[0] == key or (key.endswith(SHARD_MARK) and item[0].startswith(key))
