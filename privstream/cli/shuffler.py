"""``privstream shuffler``: the shuffle model's middle party as its own process
(``privstream.runtime.shuffler``; docs/shuffler.md)."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privstream.cli.argtypes import positive_float, positive_int


def add_parser(commands: Any, kafka_flags: Callable[..., None],
               clock_key_flags: Callable[[argparse.ArgumentParser], None]) -> None:  # fmt: skip
    p = commands.add_parser(
        "shuffler",
        help="batch devices' SaO2 reports per block, strip every identifier and forward each "
        "block's counts and manifest to the shuffled topic (its own trust domain)",
    )
    kafka_flags(p, required=True)
    p.add_argument("--report-topic", required=True, help="the devices' reports and markers")
    p.add_argument(
        "--task-topic", required=True, help="the server's SaO2 tasks (its request topic)"
    )
    p.add_argument("--shuffled-topic", required=True, help="where batches and manifests go")
    p.add_argument(
        "--dead-letter-topic", help="refused messages (the shuffler's own: they hold device ids)"
    )
    p.add_argument(
        "--store", required=True, type=Path, help="the shuffler's own recovery store directory"
    )
    p.add_argument(
        "--shuffler-id", default="shuffler-1", help="this shuffler's name (its transactional id)"
    )
    p.add_argument("--policy", choices=("drop", "below_min"), default="drop",
                   help="a batch below --n-min: drop its counts (default) or forward them named below_min")  # fmt: skip
    p.add_argument(
        "--n-min", type=positive_int, help="the minimum batch (default ⌈16 e^ε log(4/δ)⌉ per task)"
    )
    p.add_argument(
        "--delta",
        type=positive_float,
        default=1e-5,
        help="δ of the default n_min (default %(default)s)",
    )
    p.add_argument(
        "--idle-seconds", type=positive_float, help="stop after this long without a message"
    )
    p.add_argument("--no-transactions", action="store_true",
                   help="write without Kafka transactions (a cluster that does not offer them)")  # fmt: skip
    p.add_argument("--metrics-port", type=positive_int, help="serve the shuffler's metrics here")
    p.add_argument(
        "--metrics-addr", default="127.0.0.1", help="metrics address (default %(default)s)"
    )
    clock_key_flags(p)


def run(args: argparse.Namespace) -> int:
    """Run the shuffler until interrupted (or idle); refuse bad flags with one line."""
    from privstream.connectors.kafka import KafkaSettings
    from privstream.flows.secret import resolve_clock_key
    from privstream.runtime.shuffler import Shuffler, ShufflerConfig
    from privstream.runtime.shuffler_metrics import ShufflerMetrics

    key = resolve_clock_key(args.clock_key_file, args.secret_file, args.insecure_seed)
    if key is None:
        raise ValueError("the shuffler needs the clock key: --clock-key-file, --secret-file "
                         "or $PRIVSTREAM_CLOCK_KEY (it closes blocks only on authentic markers)")  # fmt: skip
    logging.getLogger("privstream.shuffler").setLevel(logging.INFO)
    config = ShufflerConfig(
        KafkaSettings.from_options(args.bootstrap, args.kafka_config), args.report_topic,
        args.task_topic, args.shuffled_topic, args.store, key, args.shuffler_id,
        args.dead_letter_topic, args.policy, args.n_min, args.delta, args.idle_seconds,
        not args.no_transactions,
    )  # fmt: skip
    metrics = ShufflerMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_addr)
    shuffler = Shuffler(config, metrics)
    for signum in (signal.SIGTERM, signal.SIGINT):  # stop after the poll in hand (store saved)
        signal.signal(signum, lambda *_: shuffler.stop())
    shuffler.run()
    open_now = len(shuffler.books.sao2.open) + len(shuffler.books.rounds.reports)
    print(f"shuffler {args.shuffler_id}: stopped, {open_now} block(s) or round(s) still open")
    return 0
