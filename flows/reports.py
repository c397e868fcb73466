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

from collections.abc import Sequence
from typing import Any, cast

from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators import KeyedStream

from privstream.connectors import control
from privstream.connectors.kafka import KafkaEventSource, RawBatch
from privstream.connectors.kafka_sink import kafka_output
from privstream.families.registry import family
from privstream.flows.io import KafkaIO, outputs, poll_max
from privstream.flows.secret import resolve_noise_key
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import EstimationTask
from privstream.operators.metrics import BOARD
from privstream.operators.report_rounds import ReportItem, report_rounds
from privstream.schema.events import DeadLetter
from privstream.schema.protocol import (
    UNKNOWN_REQUEST,
    ProtocolError,
    Request,
    decode_message,
    refused,
)


def build_reports(
    family_name: str,
    kafka: KafkaIO,
    request_topic: str,
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
    **options: Any,
) -> Dataflow:
    """The server stage of ``family_name`` in ``ldp-reports`` mode for one ``stream`` of
    ``users`` enrolled devices: reads ``kafka.input_topic`` (the report topic), writes its
    requests to ``request_topic`` and its outputs to ``kafka``'s topics."""
    entry = family(family_name)
    names = entry.names(mechanisms or entry.default)
    key = resolve_noise_key(secret, insecure_seed)
    split = BudgetSplit.parse(budget_split, len(names))
    users = users or entry.users
    config = entry.make_config(
        epsilon=epsilon or entry.epsilon, window=window or entry.window, population=users,
        task=task, **options,
    )  # fmt: skip
    built = entry.build_shared(names, config, split.shares)
    stop = control.fresh()
    BOARD.clear()
    flow = Dataflow(f"privstream_{entry.name.replace('-', '_')}_reports")
    items, parse_errors = report_messages(flow, kafka, [stream], stop)
    served = report_rounds(
        "rounds", items, mechanisms=built,
        task=task, population=users, secret=key, partitions=kafka.partitions, split=split,
    )  # fmt: skip
    kafka_output("requests_out", served.requests, kafka.settings, request_topic,
                 request_message, stall_seconds=kafka.stall_warning_seconds)  # fmt: skip
    outputs(served.mechanism_out(), parse_errors, pairs=[(stream, m) for m in names], kafka=kafka, stop=stop)
    return flow


def request_message(request: Request) -> KafkaSinkMessage[bytes, bytes]:
    """A request keyed by its stream (one stream's requests stay in order on one partition)."""
    return KafkaSinkMessage(request.stream.encode(), request.to_json().encode())


def report_messages(
    flow: Dataflow, kafka: KafkaIO, streams: Sequence[str], stop: control.StopSignal
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

    def parse(batch: RawBatch) -> list[Any]:
        return parse_report_poll(batch, known)

    split = op.branch("split_parsed", op.flat_map("parse", raw, parse), _is_item)
    return split.trues, cast("Stream[DeadLetter]", split.falses)


def _is_item(parsed: Any) -> bool:
    return not isinstance(parsed, DeadLetter)


def parse_report_poll(batch: RawBatch, streams: frozenset[str]) -> list[Any]:
    """One poll: every message as ``(stream, (partition, item))`` or a ``DeadLetter``."""
    out: list[Any] = []
    for value in batch.values:
        try:
            item = decode_message(value)
        except ProtocolError as exc:
            out.append(refused(exc, value))
            continue
        if item.stream not in streams:
            unknown = ProtocolError(
                UNKNOWN_REQUEST, f"this server serves no stream {item.stream!r}"
            )
            out.append(refused(unknown, item))
            continue
        out.append((item.stream, (batch.partition, item)))
    return out
