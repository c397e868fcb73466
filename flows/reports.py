"""The ready dataflow of ``ldp-reports`` mode (issue 23): report topic → the server stage →
request topic, and releases, ledger and dead letters as every flow writes them.

::

    report topic ──(reports and round markers)──▶ parse ──▶ key by stream ──▶ report_rounds
         ▲                                                                     │
         │ devices answer (privstream devices, the gateway, real phones)       ├─▶ request topic
         └──────────────────────── request topic ◀─────────────────────────────┤
                                                                               └─▶ releases, ledger,
                                                                                   dead letters

The server reads no event and no raw value: its only input is the report topic, where devices
write perturbed reports and the round clock (``privstream clock --requests``) writes the
authenticated markers that open slots and close rounds. Guarantee: each mechanism's declared
one, enforced by the devices' own ledgers and mirrored by the server's before any request
(``operators.report_rounds``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators import KeyedStream

from privstream.connectors import control
from privstream.connectors.kafka import KafkaEventSource, RawBatch
from privstream.connectors.kafka_sink import kafka_output
from privstream.families.registry import family
from privstream.flows.config import FlowConfig, estimation_task
from privstream.flows.io import KafkaIO, outputs, poll_max
from privstream.flows.secret import resolve_noise_key
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Mechanism
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD
from privstream.operators.report_rounds import ReportItem, report_rounds
from privstream.operators.slotting import MechanismOut
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import (
    CLOSE_TYPE,
    UNKNOWN_REQUEST,
    ProtocolError,
    Request,
    decode_message,
    refused,
)
from privstream.schema.report_wire import ReportColumns, decode_poll
from privstream.schema.shuffle import REPORTS_TYPE, ReportBatch


@dataclass(frozen=True)
class ServedStream:
    """One stream the server stage serves: its mechanisms (built with their shares), task,
    enrolled devices and budget split."""

    name: str
    mechanisms: tuple[Mechanism[Any, Any], ...]
    task: EstimationTask
    users: int
    split: BudgetSplit


def build_reports(
    family_name: str,
    kafka: KafkaIO,
    *,
    task: EstimationTask,
    mechanisms: str | Sequence[str] | None = None,
    users: int | None = None,
    epsilon: float | None = None,
    window: int | None = None,
    stream: str = "reports",
    secret: NoiseKey | str | bytes | None = None,
    insecure_seed: int | None = None,
    budget_split: str | None = None,
    shuffled: bool = False,
    **options: Any,
) -> Dataflow:
    """The server stage of ``family_name`` in ``ldp-reports`` mode for one ``stream`` of
    ``users`` enrolled devices: reads ``kafka.input_topic`` (the report topic; ``shuffled``: a
    shuffler's topic), writes its requests to ``kafka.request_topic`` and its outputs to
    ``kafka``'s topics."""
    entry = family(family_name)
    names = entry.names(mechanisms or entry.default)
    split = BudgetSplit.parse(budget_split, len(names))
    users = users or entry.users
    config = entry.make_config(
        epsilon=epsilon or entry.epsilon, window=window or entry.window, population=users,
        task=task, **options,
    )  # fmt: skip
    built = tuple(entry.build_shared(names, config, split.shares))
    served = ServedStream(stream, built, task, users, split)
    flow = Dataflow(f"privstream_{entry.name.replace('-', '_')}_reports")
    return serve(flow, kafka, [served], resolve_noise_key(secret, insecure_seed), shuffled)


def build_report_streams(config: FlowConfig, kafka: KafkaIO, secret: NoiseKey) -> Dataflow:
    """The server stage of every stream of an ``ldp-reports`` flow file (each under its share
    of the population's budget, as ``flows.streams``)."""
    served = []
    for spec in config.streams:
        entry, task = family(spec.family), estimation_task(spec.task)
        split = BudgetSplit.parse(spec.budget_split, len(spec.mechanisms))
        options = dict(spec.options)
        options.pop("client_path", None)  # no simulated clients: the devices answer
        family_config = entry.make_config(
            epsilon=spec.epsilon, window=spec.window, population=config.population.users,
            task=task, **options,
        )  # fmt: skip
        built = tuple(entry.build_shared(spec.mechanisms, family_config, split.shares))
        served.append(ServedStream(spec.name, built, task, config.population.users, split))
    return serve(Dataflow("privstream_reports"), kafka, served, secret)


def serve(
    flow: Dataflow,
    kafka: KafkaIO,
    streams: Sequence[ServedStream],
    secret: NoiseKey,
    shuffled: bool = False,
) -> Dataflow:
    """Wire ``streams``' server stages into ``flow``: report topic in (``shuffled``: a
    shuffler's topic of counts and forwarded markers), requests and the usual outputs out."""
    if kafka.request_topic is None:
        raise ValueError("an ldp-reports flow needs a request topic")
    stop = control.fresh()
    BOARD.clear()
    parse = parse_shuffled_poll if shuffled else parse_report_poll
    items, parse_errors = report_messages(flow, kafka, [s.name for s in streams], stop, parse)
    outs = []
    for spec in streams:
        mine: Any = op.filter(f"stream_{spec.name}", items, functools.partial(_is, spec.name))
        outs.append(report_rounds(
            f"rounds_{spec.name}", mine, mechanisms=spec.mechanisms, task=spec.task,
            population=spec.users, secret=secret, partitions=kafka.partitions, split=spec.split,
            shuffled=shuffled,
        ))  # fmt: skip
    requests = op.merge("requests", *(o.requests for o in outs))
    kafka_output("requests_out", requests, kafka.settings, kafka.request_topic,
                 request_message, stall_seconds=kafka.stall_warning_seconds)  # fmt: skip
    merged = MechanismOut(
        op.merge("releases", *(o.releases for o in outs)),
        op.merge("ledger", *(o.ledger for o in outs)),
        op.merge("mechanism_dead_letters", *(o.dead_letters for o in outs)),
        op.merge("extra", *(o.extra for o in outs)),
    )
    pairs = [(s.name, m.name) for s in streams for m in s.mechanisms]
    outputs(merged, parse_errors, pairs=pairs, kafka=kafka, stop=stop)
    return flow


def _is(name: str, item: tuple[str, ReportItem]) -> bool:
    return item[0] == name


def request_message(request: Request) -> KafkaSinkMessage[bytes, bytes]:
    """A request keyed by its stream (one stream's requests stay in order on one partition)."""
    return KafkaSinkMessage(request.stream.encode(), request.to_json().encode())


def report_messages(
    flow: Dataflow,
    kafka: KafkaIO,
    streams: Sequence[str],
    stop: control.StopSignal,
    parse_poll: Any = None,
) -> tuple[KeyedStream[ReportItem], Stream[DeadLetter]]:
    """The report topic's polls, each message decoded on its own: ``(stream, (partition,
    report or marker))`` for the configured ``streams``, a dead letter for anything else."""
    raw: Stream[RawBatch] = op.input(
        "reports_in", flow,
        KafkaEventSource(kafka.settings, kafka.input_topic, batch_size=poll_max(kafka),
                         stop=stop, stall_seconds=kafka.stall_warning_seconds,
                         recreated=kafka.input_topic_recreated),
    )  # fmt: skip
    known = frozenset(streams)

    parser = parse_poll or parse_report_poll

    def parse(batch: RawBatch) -> list[Any]:
        return list(parser(batch, known))

    split = op.branch("split_parsed", op.flat_map("parse", raw, parse), _is_item)
    return split.trues, cast("Stream[DeadLetter]", split.falses)


def _is_item(parsed: Any) -> bool:
    return not isinstance(parsed, DeadLetter)


def parse_report_poll(batch: RawBatch, streams: frozenset[str]) -> list[Any]:
    """One poll: every message as ``(stream, (partition, item))`` or a ``DeadLetter``,
    decoded in one batch (``schema.report_wire.decode_poll``: runs of well-formed
    reports of a served stream as one item of columns)."""
    out: list[Any] = []
    for index, item in decode_poll(batch.values, streams):
        value = batch.values[index]
        if isinstance(item, ReportColumns):
            out.append((item.stream, (batch.partition, item)))
        elif isinstance(item, ProtocolError):
            out.append(refused(item, value))
        elif item.stream not in streams:
            unknown = ProtocolError(
                UNKNOWN_REQUEST, f"this server serves no stream {item.stream!r}"
            )
            out.append(refused(unknown, value))
        else:
            out.append((item.stream, (batch.partition, item)))
    return out


def parse_shuffled_poll(batch: RawBatch, streams: frozenset[str]) -> list[Any]:
    """A poll of a shuffler's topic: each ``ReportBatch`` or forwarded round marker as
    ``(stream, (partition, item))``; anything else — a raw report above all — a dead letter."""
    out: list[Any] = []
    for value in batch.values:
        try:
            obj = json.loads(value)
            kind = obj.get("type") if isinstance(obj, dict) else None
            item: Any = (ReportBatch.from_obj(obj) if kind == REPORTS_TYPE
                         else decode_message(value) if kind == CLOSE_TYPE else None)  # fmt: skip
            if item is None or item.stream not in streams:
                raise ProtocolError(UNKNOWN_REQUEST, "not a batch or marker of a served stream")
            out.append((item.stream, (batch.partition, item)))
        except ProtocolError as exc:  # a ValueError too: caught first
            out.append(refused(exc, value))
        except (ValueError, RecursionError):
            out.append(refused(ProtocolError("malformed_json", "not JSON"), value))
    return out
