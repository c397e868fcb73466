"""``privstream devices``: a simulated fleet of devices answering ``ldp-reports`` requests
(``privstream.runtime.fleet``), over Kafka (``--request-topic``/``--report-topic``) or over
HTTP through the gateway (``--gateway URL``, ``privstream.runtime.fleet_http``)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from privstream.runtime.fleet import Fleet

READY: Final = "privstream devices: ready:"
"""How the line starts that a Kafka fleet prints on stderr once it reads its request topic."""


def add_parser(commands: Any, kafka_flags: Any) -> None:
    """Register ``devices`` with the Kafka flags ``kafka_flags(parser)`` adds."""
    p = commands.add_parser(
        "devices",
        help="simulate devices: answer requests from a topic, or from the HTTP gateway, "
        "through the device library",
    )
    kafka_flags(p)
    p.add_argument("--request-topic", help="Kafka: the server's requests")
    p.add_argument("--report-topic", help="Kafka: where the devices' reports go")
    p.add_argument(
        "--gateway", metavar="URL",
        help="HTTP instead of Kafka: poll URL/v1/requests and post to URL/v1/reports "
        "(privstream gateway); no topic or Kafka flag then",
    )  # fmt: skip
    p.add_argument(
        "--poll-seconds", type=float, default=0.2, help="--gateway: seconds between polls"
    )  # fmt: skip
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
    p.add_argument("--sao2-tasks", metavar="TOPIC",
                   help="SaO2 behind a shuffler: read the server's tasks from TOPIC and report to "
                   "--report-topic at each block end, half a slot before the clock's markers "
                   "(--slot-seconds, --origin as privstream clock's); --dataset trajectory or sets")  # fmt: skip
    p.add_argument("--slot-seconds", type=float, default=2.0, help="SaO2: seconds per slot")
    p.add_argument("--origin", type=float, help="SaO2: Unix time of slot 0 (default: now)")


def check_transport(args: argparse.Namespace) -> None:
    """Exactly one transport: ``--gateway``, or both topics over Kafka (``ValueError``)."""
    topics = [f for f, v in (("--request-topic", args.request_topic),
                             ("--report-topic", args.report_topic)) if v]  # fmt: skip
    if args.gateway is not None:
        kafka = topics + (["--bootstrap"] if args.bootstrap else [])
        kafka += ["--kafka-config"] if args.kafka_config else []
        if kafka:
            raise ValueError(f"--gateway is the transport: leave out {', '.join(kafka)}")
        if args.poll_seconds <= 0:
            raise ValueError(f"--poll-seconds must be > 0, got {args.poll_seconds}")
    elif len(topics) < 2:
        raise ValueError("give --gateway URL, or --request-topic and --report-topic (Kafka)")


def run(args: argparse.Namespace) -> int:
    """Answer requests until idle or SIGINT; print the stats on stderr (counts only)."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.runtime.fleet import Fleet, FleetConfig

    # A fleet started in the background of a script (`cmd &`) inherits SIGINT ignored, and
    # then neither `asyncio.run` nor the Kafka loop could be stopped by it: it ran until idle.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.sao2_tasks:
        return _sao2(args)
    check_transport(args)
    config = FleetConfig(
        args.users, args.epsilon, args.window, args.dropout, args.late, args.liars,
        args.flood, args.store_dir, args.seed, args.delta, args.mu,
    )  # fmt: skip
    fleet = Fleet(config, synthetic_dataset(args.dataset, args.users, args.slots, args.seed))
    lines = _over_http(args, fleet) if args.gateway else _over_kafka(args, fleet)
    for line in lines:
        print(line, file=sys.stderr)
    return 0


def _over_kafka(args: argparse.Namespace, fleet: Fleet) -> list[str]:
    from privstream.connectors.kafka import KafkaSettings, require_topics
    from privstream.runtime.fleet import run_fleet

    settings = KafkaSettings.from_options(args.bootstrap, args.kafka_config)
    require_topics(settings, [args.request_topic, args.report_topic])

    def ready() -> None:  # a script waits for this line before it opens rounds
        print(f"{READY} {args.users} devices answer the requests of {args.request_topic!r}",
              file=sys.stderr, flush=True)  # fmt: skip

    try:
        stats = run_fleet(fleet, settings, args.request_topic, args.report_topic,
                          idle_seconds=args.idle_seconds, max_requests=args.max_requests,
                          on_ready=ready)  # fmt: skip
    except KeyboardInterrupt:
        stats = fleet.stats
    return stats.lines()


def _over_http(args: argparse.Namespace, fleet: Fleet) -> list[str]:
    import asyncio
    import contextlib

    from privstream.extras import require

    require("gateway", ("aiohttp",), "privstream devices --gateway")
    from privstream.runtime.fleet_http import HttpStats, base_url, run_http_fleet

    http = HttpStats()
    main = run_http_fleet(fleet, base_url(args.gateway), http, idle_seconds=args.idle_seconds,
                          max_requests=args.max_requests, poll_seconds=args.poll_seconds)  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):  # stopped: the counts so far
        asyncio.run(main)
    return fleet.stats.lines() + http.lines()


def _sao2(args: argparse.Namespace) -> int:
    """``privstream devices --sao2-tasks``: the SaO2 fleet over Kafka (``runtime.sao2_fleet``)."""
    import time

    from privstream.connectors.kafka import KafkaSettings, require_topics
    from privstream.families.registry import family
    from privstream.runtime.sao2_fleet import Sao2Fleet, serve_over_kafka

    if not args.report_topic or args.gateway or args.request_topic:
        raise ValueError(
            "--sao2-tasks takes --report-topic (Kafka) and no --request-topic or --gateway"
        )
    settings = KafkaSettings.from_options(args.bootstrap, args.kafka_config)
    require_topics(settings, [args.sao2_tasks, args.report_topic])
    factory = family("sao2").sources.get(args.dataset)
    if factory is None:
        raise ValueError(f"--dataset for SaO2 devices: one of {', '.join(family('sao2').sources)}")
    from privstream.mechanisms.sao2_task import BinaryTask

    def source(task: Any) -> Any:
        return factory(args.users, args.slots, args.seed, BinaryTask(task.d, task.kind))

    fleet = Sao2Fleet([f"d{u:06d}" for u in range(args.users)], args.seed, args.dropout,
                      store_dir=args.store_dir)  # fmt: skip
    origin = time.time() if args.origin is None else args.origin
    for s in serve_over_kafka(fleet, source, settings, args.sao2_tasks, args.report_topic,
                              args.slot_seconds, origin):  # fmt: skip
        print(
            f"horizon {s.horizon}: {s.enrolled} enrolled, {s.dropped} dropped, "
            f"{sum(s.refused.values())} refused, {s.reports} reports",
            file=sys.stderr,
        )
    return 0
