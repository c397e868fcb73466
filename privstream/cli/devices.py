"""``privstream devices``: a simulated fleet of devices answering ``ldp-reports`` requests
(``privstream.runtime.fleet``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(commands: Any, kafka_flags: Any) -> None:
    """Register ``devices`` with the Kafka flags ``kafka_flags(parser)`` adds."""
    p = commands.add_parser(
        "devices",
        help="simulate devices: answer requests from a topic through the device library",
    )
    kafka_flags(p, required=True)
    p.add_argument("--request-topic", required=True, help="the server's requests")
    p.add_argument("--report-topic", required=True, help="where the devices' reports go")
    p.add_argument("--dataset", default="lns", help="synthetic dataset of the devices' values")
    p.add_argument("--users", type=int, default=100, help="devices 0..N-1 (default 100)")
    p.add_argument("--slots", type=int, default=100, help="the dataset's slots (default 100)")
    p.add_argument("--seed", type=int, default=0, help="dataset, dropout and lateness seed")
    p.add_argument("--epsilon", type=float, default=1.0, help="each device's ε per window")
    p.add_argument("--window", type=int, default=10, help="each device's window w in slots")
    p.add_argument("--delta", type=float, default=1e-5, help="CGM: δ of each device's (ε, δ)")
    p.add_argument(
        "--mu", type=float,
        help="CGM: each device's μ per stream over its life (default: μ*(--epsilon, --delta))",
    )  # fmt: skip
    p.add_argument("--dropout", type=float, default=0.0, help="P(an asked device is silent)")
    p.add_argument(
        "--late", type=float, default=0.0,
        help="P(a report is written only after the next request, i.e. after its round closed)",
    )  # fmt: skip
    p.add_argument("--liars", type=int, default=0, help="the last K devices lie (one way each)")
    p.add_argument("--flood", type=int, default=64, help="copies a flooding liar sends")
    p.add_argument(
        "--store-dir", type=Path,
        help="a folder of one ledger file per device (kept between runs); default: in memory",
    )  # fmt: skip
    p.add_argument("--idle-seconds", type=float, default=10.0, help="stop after this long idle")
    p.add_argument("--max-requests", type=int, help="stop after this many requests")


def run(args: argparse.Namespace) -> int:
    """Answer requests until idle; print the stats on stderr (counts only)."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.connectors.kafka import KafkaSettings, require_topics
    from privstream.runtime.fleet import Fleet, FleetConfig, run_fleet

    settings = KafkaSettings.from_options(args.bootstrap, args.kafka_config)
    require_topics(settings, [args.request_topic, args.report_topic])
    config = FleetConfig(
        args.users, args.epsilon, args.window, args.dropout, args.late, args.liars,
        args.flood, args.store_dir, args.seed, args.delta, args.mu,
    )  # fmt: skip
    fleet = Fleet(config, synthetic_dataset(args.dataset, args.users, args.slots, args.seed))
    try:
        stats = run_fleet(fleet, settings, args.request_topic, args.report_topic,
                          idle_seconds=args.idle_seconds, max_requests=args.max_requests)  # fmt: skip
    except KeyboardInterrupt:
        stats = fleet.stats
    for line in stats.lines():
        print(line, file=sys.stderr)
    return 0
