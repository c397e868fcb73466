"""``ldp-reports`` from the command line (issue 23): ``privstream run FAMILY --trust
ldp-reports`` (the server stage, ``flows.reports``) and ``privstream clock --requests`` (the
round clock, ``runtime.round_clock``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

REPORTS = "ldp-reports"
SHUFFLED = "ldp-shuffled"


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """``--trust``, ``--report-topic`` and ``--request-topic`` of ``privstream run``."""
    p.add_argument(
        "--trust",
        choices=("default", REPORTS, SHUFFLED),
        default="default",
        help="'ldp-reports': real devices randomise and keep their own ledgers; the server "
        "reads their reports from --report-topic and writes requests to --request-topic "
        "(local-DP families; default: the family's own mode). 'ldp-shuffled': the server "
        "reads only a shuffler's batches from --shuffled-topic and writes its tasks to "
        "--request-topic (SaO2)",
    )
    p.add_argument("--shuffled-topic", help="ldp-shuffled: the shuffler's batches and manifests")
    p.add_argument("--report-topic", help="ldp-reports: the devices' reports and round markers")
    p.add_argument("--request-topic", help="ldp-reports: where the server writes its requests")


def add_clock_flags(p: argparse.ArgumentParser) -> None:
    """The round clock's flags of ``privstream clock``."""
    p.add_argument(
        "--requests",
        metavar="TOPIC",
        help="ldp-reports: follow this request topic and write round markers to --topic (the "
        "report topic): slot openings on the --slot-seconds schedule, and each round's close "
        "--round-seconds after its request appeared",
    )
    p.add_argument(
        "--round-seconds",
        type=float,
        default=10.0,
        help="ldp-reports: the devices' time to answer a request (default %(default)s)",
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="ldp-reports with --through: stop this long after the last marker",
    )


def check_run(args: argparse.Namespace, family: Any) -> None:
    """Refuse an ``ldp-reports`` run that cannot be one, naming what is wrong."""
    if not family.local:
        raise ValueError(
            f"--trust {REPORTS} is a local-DP mode; the {family.name} family runs as "
            f"{family.trust} (a trusted curator sees raw values)"
        )
    if args.input_topic:
        raise ValueError(
            f"in {REPORTS} mode the server reads no events: the devices' reports come on "
            "--report-topic (leave out --input-topic; a server that read raw events would not "
            "be local DP)"
        )
    needed = {"--report-topic": args.report_topic, "--request-topic": args.request_topic,
              "--output-topic": args.output_topic}  # fmt: skip
    missing = [flag for flag, value in needed.items() if not value]
    if missing:
        raise ValueError(f"--trust {REPORTS} needs {', '.join(missing)}")
    if args.report_topic == args.request_topic:
        raise ValueError("--report-topic and --request-topic must be two topics")


def kafka_io(args: argparse.Namespace, settings: Any) -> Any:
    """The run's topics: the report topic is the flow's input (checked to exist, with the
    request and output topics)."""
    from privstream.connectors.kafka import require_topics
    from privstream.flows.io import KafkaIO

    kafka = KafkaIO(
        settings, args.report_topic, args.output_topic, args.dead_letter_topic,
        args.ledger_topic, until_slot=args.slots, max_event_bytes=args.max_event_bytes,
        stall_warning_seconds=args.stall_warning_seconds,
        input_topic_recreated=args.input_topic_recreated, request_topic=args.request_topic,
    )  # fmt: skip
    found = require_topics(settings, kafka.topics())
    return kafka.with_partitions(found)


def run(args: argparse.Namespace, family: Any, settings: Any, task: Any, secret: Any) -> Any:
    """The server stage's flow of ``privstream run FAMILY --trust ldp-reports``."""
    from privstream.flows.reports import build_reports

    check_run(args, family)
    kafka = kafka_io(args, settings)
    stream = args.stream or args.dataset
    options = {o.name: getattr(args, o.name) for o in family.options}
    return build_reports(
        family.name, kafka, task=task, mechanisms=args.mechanism,
        users=args.users, epsilon=args.epsilon, window=args.window, stream=stream,
        secret=secret, budget_split=args.budget_split, **options,
    )  # fmt: skip


def request_topic(args: argparse.Namespace) -> str | None:
    """The request topic a ``privstream clock`` follows: ``--requests``, or an ``ldp-reports``
    flow file's; None for the slot clock of an event topic."""
    if args.requests is not None or args.config is None:
        return str(args.requests) if args.requests is not None else None
    from privstream.flows.config import load

    kafka = load(args.config).kafka
    return kafka.request_topic if kafka.trust == REPORTS else None


def round_clock(
    args: argparse.Namespace,
    key: bytes,
    settings: Any,
    topic: str,
    streams: list[str],
    requests: str,
) -> int:
    """``privstream clock --requests``: the round clock until ``--through`` is done."""
    from privstream.runtime.round_clock import RoundSchedule, run_round_clock

    schedule = RoundSchedule(
        tuple(streams), args.first_slot or 1, args.through,
        0.0 if args.now else args.slot_seconds, args.round_seconds, args.origin,
        args.idle_seconds,
    )  # fmt: skip
    stats = run_round_clock(settings, topic, requests, key, schedule)
    print(f"opened {stats.opened} slots and closed {stats.closed} rounds on {topic} "
          f"({stats.requests} requests read)", file=sys.stderr)  # fmt: skip
    return 0
