"""``privstream bench reports``: the throughput of ``ldp-reports`` mode — the server stage
against the slotted operator, reports through Kafka and through the gateway, and the fleet's
devices per second (``privstream.experiments.reports_bench``; bench/README.md, section 9)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from privstream.cli.argtypes import positive_int


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(positive_int(x) for x in text.split(","))
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected N1,N2,..., got {text!r}")
    return sizes


def add_parser(bench_family: Any, kafka_flags: Any) -> None:
    """Register ``bench reports`` with the Kafka flags ``kafka_flags(parser)`` adds."""
    p = bench_family.add_parser(
        "reports",
        help="ldp-reports throughput: server stage vs raw events, Kafka, gateway, fleet",
    )
    p.add_argument("--users", type=_sizes, default=(10_000, 100_000), metavar="N1,N2,...",
                   help="reports per round of the server-stage section (default 10000,100000)")  # fmt: skip
    p.add_argument("--slots", type=positive_int, default=2, help="timed slots (after a warm-up)")
    p.add_argument("--kafka-reports", type=positive_int, default=100_000)
    p.add_argument("--repeats", type=positive_int, default=2, help="runs of the Kafka section")
    p.add_argument("--gateway-reports", type=positive_int, default=5_000,
                   help="reports POSTed one per POST (default 5000)")  # fmt: skip
    p.add_argument("--gateway-batched", type=positive_int, default=50_000,
                   help="reports POSTed --gateway-batch per POST (default 50000)")  # fmt: skip
    p.add_argument("--gateway-batch", type=positive_int, default=100)
    p.add_argument("--connections", type=positive_int, default=32, help="the client's connections")
    p.add_argument("--fleet-devices", type=positive_int, default=10_000,
                   help="devices with ledgers in memory (default 10000)")  # fmt: skip
    p.add_argument("--file-devices", type=positive_int, default=1_000,
                   help="devices with FileStore ledgers in a temporary folder (default 1000)")  # fmt: skip
    p.add_argument("--fleet-requests", type=positive_int, default=2)
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka section")
    p.add_argument("--no-gateway", action="store_true", help="skip the gateway section")
    p.add_argument("--json", help="write the results as JSON to this file")
    kafka_flags(p)


def run(args: argparse.Namespace) -> int:
    from privstream.connectors.kafka import KafkaSettings
    from privstream.experiments.reports_bench import bench_reports, format_reports

    settings = (
        KafkaSettings.from_options(args.bootstrap, args.kafka_config) if args.bootstrap else None
    )
    modes = [] if args.no_gateway else [(args.gateway_reports, 1),
                                         (args.gateway_batched, args.gateway_batch)]  # fmt: skip
    result = bench_reports(
        settings, sizes=args.users, slots=args.slots, repeats=args.repeats,
        kafka_reports=None if args.no_kafka else args.kafka_reports, gateway_modes=modes,
        connections=args.connections, fleet_devices=(args.fleet_devices, args.file_devices),
        fleet_requests=args.fleet_requests,
    )  # fmt: skip
    print(format_reports(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
