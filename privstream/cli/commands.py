"""The ``privstream`` command line: run flows against files or Kafka, manage the embedded broker
and topics, produce synthetic events, run benchmarks, run the demo.

The commands and their flags are contracts: scripts and later checks rely on them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from privstream.cli import accountant as accountant_cli
from privstream.cli import bench_reports as bench_reports_cli
from privstream.cli import demo_reports as demo_reports_cli
from privstream.cli import demo_shuffle as demo_shuffle_cli
from privstream.cli import devices as devices_cli
from privstream.cli import gateway as gateway_cli
from privstream.cli import items as items_cli
from privstream.cli import reports as reports_cli
from privstream.cli import shuffled_run as shuffled_cli
from privstream.cli import shuffler as shuffler_cli
from privstream.cli.argtypes import positive_float as _positive_float
from privstream.cli.argtypes import positive_int as _positive_int
from privstream.cli.run_config import add_config_flags, add_topic_change_flags, run_config
from privstream.families.registry import FAMILIES, Family
from privstream.families.tasks import parse_mean_range
from privstream.mechanisms.accountant import check_delta_bound
from privstream.runtime.incarnation import Incarnation, refuse_overwrite
from privstream.runtime.runner import run_dataflow, serve
from privstream.runtime.summary import (
    CSV_HINT,
    RunCounts,
    counts_now,
    exit_on_interrupt,
    nothing_accepted,
    summary_line,
)

log = logging.getLogger("privstream")


Ball = tuple[tuple[float, ...], float]


def _domain(text: str) -> int | tuple[float, float] | Ball:
    """``--domain``: ``d`` categories, ``LO:HI`` the public range of numeric values, or
    ``ball:C1,…,Cd:R`` the L2 ball of vector values (centre and radius)."""
    if text.startswith("ball:"):
        try:
            center, radius = text.removeprefix("ball:").rsplit(":", 1)
            return tuple(float(c) for c in center.split(",")), float(radius)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ball:C1,...,Cd:R, got {text}") from None
    if ":" in text:
        return parse_mean_range(text)
    return _positive_int(text)


def _common(
    p: argparse.ArgumentParser,
    *,
    users: int = 200_000,
    epsilon: float = 1.0,
    window: int | None = 20,
    window_help: str = "window size w (default %(default)s)",
    datasets: tuple[str, ...] = ("lns", "sin", "log", "lns-con", "sin-con", "log-con"),
) -> None:
    p.add_argument(
        "--dataset",
        default=_default_dataset(datasets),
        help=f"{', '.join(datasets)}, or file:PATH (default %(default)s)",
    )
    p.add_argument(
        "--users",
        type=_positive_int,
        default=users,
        help="registered population size n (default %(default)s)",
    )
    p.add_argument(
        "--slots",
        type=_positive_int,
        help="slots 1..T of a synthetic stream (default 800); with Kafka input, stop once "
        "slot T is released (default: run until SIGTERM)",
    )
    p.add_argument(
        "--epsilon",
        type=_positive_float,
        default=epsilon,
        help="privacy budget ε over the family's scope: a window of w slots, l reports or a lifetime (default %(default)s)",
    )
    p.add_argument("--window", type=_positive_int, default=window, help=window_help)


def _kafka_flags(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    p.add_argument(
        "--bootstrap",
        required=required and not os.environ.get("PRIVSTREAM_BOOTSTRAP"),
        help="Kafka bootstrap servers HOST:PORT[,...] (or $PRIVSTREAM_BOOTSTRAP)",
    )
    p.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka client property, e.g. security.protocol=SASL_SSL (repeatable; "
        "also $PRIVSTREAM_KAFKA_<PROPERTY>)",
    )


def _topic_flags(p: argparse.ArgumentParser, *, input_required: bool) -> None:
    p.add_argument("--input-topic", required=input_required, help="topic of user events")
    p.add_argument("--output-topic", help="topic of releases (keyed by release_id)")
    p.add_argument("--dead-letter-topic", help="topic of rejected events (optional)")
    p.add_argument("--ledger-topic", help="topic of ledger entries (optional)")


def _default_dataset(datasets: tuple[str, ...]) -> str:
    return "sin" if "sin" in datasets else datasets[0]


def _window_default(family: Family) -> int | None:
    """A family whose window is the stream's length takes ``--slots`` unless told."""
    return None if family.window_default == "slots" else family.window


def _window_help(family: Family) -> str:
    if family.window_default == "slots":
        return "l: the reports one budget covers (default: --slots)"
    return "window size w (default %(default)s)"


def _option_flags(p: argparse.ArgumentParser, family: Family) -> None:
    """The family's config options (``Family.options``) as ``--flags``."""
    for option in family.options:
        p.add_argument(
            f"--{option.word.replace('_', '-')}",
            dest=option.name,
            type=option.parse,
            default=option.default,
            help=f"{option.help} (default %(default)s)",
        )


def _family_flags(p: argparse.ArgumentParser, family: Family) -> None:
    """The family's own run flags: its options, the mean task, the client path of the LDP
    modes and the registration table of central DP — all from its registry entry."""
    _option_flags(p, family)
    if family.delta_option is not None:
        p.add_argument(
            "--allow-large-delta",
            action="store_true",
            help="accept --delta >= 1/--users (refused by default: one of the n users may be "
            "expected to lose everything)",
        )
    for task in family.task_types:
        if task.flag is not None and task.parse_flag is not None:
            p.add_argument(task.flag, type=task.parse_flag, help=task.help)
    if family.client_path:
        p.add_argument("--client-path", choices=("aggregate", "per-user"), default="aggregate")
    if family.needs_registration:
        p.add_argument(
            "--registrations",
            "--preferences",
            dest="preferences",
            help="registration table: CSV (user,epsilon,window) or JSON lines; exactly these "
            "users are counted (required for file and Kafka input)",
        )
    elif family.simulates_clients:
        p.add_argument(
            "--registrations",
            dest="preferences",
            help="registration table (CSV user,epsilon,window or JSON lines): a closed "
            "population, only these users enrol and anybody else's events are "
            "unregistered_user dead letters; each entry's (epsilon, window) must hold under the "
            "stream's epsilon per window (default: open, the first n users to report enrol)",
        )


def _run_flags(p: argparse.ArgumentParser, family: Family) -> None:
    """Flags every ``privstream run`` family shares, with the family's defaults."""
    _common(p, users=family.users, epsilon=family.epsilon, window=_window_default(family),
            window_help=_window_help(family), datasets=tuple(family.sources))  # fmt: skip
    p.add_argument(
        "--mechanism",
        default=family.default,
        help=f"one or more of {','.join(family.mechanisms)}, comma separated (default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=1, help="seed of the synthetic data (never of the noise)"
    )
    p.add_argument(
        "--insecure-seed",
        type=int,
        metavar="N",
        help="draw the noise from the public seed N instead of a secret: reproducible, NOT "
        "private; every release, ledger entry and the privstream_insecure_seed gauge say so",
    )
    p.add_argument(
        "--budget-split",
        metavar="equal|W1,W2,...",
        help="several mechanisms share the population's ε: equally or by weights (required "
        "with several mechanisms unless --compare)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="evaluation: run the mechanisms side by side with the full ε each; outputs are "
        "marked evaluation (together they are not ε-private)",
    )
    _family_flags(p, family)
    _output_flags(p)
    reports_cli.add_run_flags(p)
    _extra_output_flags(p, family)
    _service_flags(p)


def _extra_output_flags(p: argparse.ArgumentParser, family: Family) -> None:
    """``--<name>-out PATH`` and ``--<name>-topic TOPIC`` for each extra output the family
    declares (``Family.outputs``): an output is written only where one of them names it."""
    for spec in family.outputs:
        kind = "public" if spec.public else "internal"
        p.add_argument(
            f"--{spec.name}-out",
            dest=f"{spec.dest}_out",
            metavar="PATH",
            help=f"{spec.help} ({kind}; JSON lines; written only when given)",
        )
        p.add_argument(
            f"--{spec.name}-topic",
            dest=f"{spec.dest}_topic",
            metavar="TOPIC",
            help=f"{spec.help} ({kind}; Kafka topic; written only when given)",
        )


def _extra_routes(args: argparse.Namespace, family: Family, kind: str) -> dict[str, str]:
    """The declared outputs the run names a sink for: output name → path (``kind`` ``out``)
    or topic (``topic``)."""
    routes = {o.name: getattr(args, f"{o.dest}_{kind}", None) for o in family.outputs}
    return {name: where for name, where in routes.items() if where}


def _output_flags(p: argparse.ArgumentParser) -> None:
    """Where a run reads and writes: files, stream, Kafka topics."""
    p.add_argument("--out", default="releases.jsonl", help="releases, one JSON object per line")
    p.add_argument(
        "--overwrite-output",
        action="store_true",
        help="let a new secure run replace a non-empty --out (refused by default: its release "
        "ids would be computed a second time with fresh noise)",
    )
    p.add_argument(
        "--new-population",
        action="store_true",
        help="a new recovery store over a release topic that holds this stream's releases "
        "serves a population none of whose users took part before (lets a whole-stream "
        "guarantee, e.g. CGM budget_scope stream, start afresh)",
    )
    p.add_argument("--ledger-out", help="ledger entries as JSON lines (optional)")
    p.add_argument(
        "--dead-letter-out", help="rejected events with reasons as JSON lines (optional)"
    )
    p.add_argument(
        "--lateness",
        type=int,
        default=1,
        help="slots a slot stays open for late events (default 1)",
    )
    p.add_argument(
        "--domain",
        type=_domain,
        help="categories d of a file or Kafka stream, LO:HI the range of numeric values, or "
        "ball:C1,...,Cd:R the ball of vector values",
    )
    p.add_argument("--stream", help="stream name (default: the dataset name)")
    _kafka_flags(p)
    _topic_flags(p, input_required=False)
    p.add_argument(
        "--max-event-bytes",
        type=_positive_int,
        default=64 * 1024,
        help="larger Kafka messages are 'oversized' dead letters (default %(default)s)",
    )
    p.add_argument(
        "--clock",
        choices=("markers", "data"),
        default="markers",
        help="what closes a Kafka stream's slots: 'markers' (default) only end-of-slot markers "
        "tagged with the clock key (privstream clock); 'data' the events' own slots and any "
        "marker (needs --trust-input-clock)",
    )
    p.add_argument(
        "--trust-input-clock",
        action="store_true",
        help="with --clock data: every writer of the input topic is trusted to drive the clock",
    )
    add_topic_change_flags(p)


def _service_flags(p: argparse.ArgumentParser) -> None:
    """How a run is served: workers, recovery, the secret, metrics, progress, stall warnings."""
    p.add_argument(
        "--workers", type=_positive_int, default=1, help="Bytewax worker threads (default 1)"
    )
    p.add_argument("--recovery-dir", help="Bytewax recovery store directory (created if missing)")
    p.add_argument(
        "--snapshot-interval",
        type=_positive_float,
        default=10.0,
        help="seconds between recovery snapshots (Bytewax epoch; default %(default)s)",
    )
    p.add_argument(
        "--secret-file",
        help="file holding the secret noise key: random hex (>= 32 digits) or base64 (>= 16 "
        "bytes) (default $PRIVSTREAM_SECRET; required unless --insecure-seed, and refused with it)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the public Prometheus metrics on this port (/metrics)",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the public metrics server (default %(default)s: loopback only; "
        "0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--internal-metrics-port",
        type=int,
        metavar="PORT",
        help="serve the internal metrics (true event counts and timing: they need the same "
        "access as the input topic) on this port",
    )
    p.add_argument(
        "--internal-metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the internal metrics server (default %(default)s: loopback only)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    p.add_argument(
        "--stall-warning-seconds",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="warn when a Kafka source has heard nothing from the broker, or a Kafka output has "
        "waited undelivered, for S seconds (default %(default)s)",
    )


def version() -> str:
    """The installed distribution's version (its metadata); ``privstream.__version__`` when the
    package runs from a checkout that is not installed."""
    from importlib import metadata

    try:
        return metadata.version("privstream")
    except metadata.PackageNotFoundError:
        from privstream import __version__

        return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privstream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--version", action="version", version=f"privstream {version()}",
        help="print the installed version and exit",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a ready dataflow: a family's (one stream), or a configuration file's"
    )
    add_config_flags(run)
    run_family = run.add_subparsers(dest="family")
    bench = commands.add_parser(
        "bench", help="run a reproduction benchmark on the engine-free core"
    )
    bench_family = bench.add_subparsers(dest="family", required=True)
    for family in FAMILIES.values():
        _run_flags(run_family.add_parser(family.name, help=family.summary), family)
        if family.bench.command is not None:
            family.bench.command.load().add_parser(bench_family)
        else:
            _bench_flags(bench_family.add_parser(family.name, help=family.summary), family)
    _kafka_tools(commands)
    _bench_tools(bench_family)
    _demo_audit(commands)
    _config_tools(commands)
    return parser


def _bench_flags(p: argparse.ArgumentParser, family: Family) -> None:
    """``privstream bench <family>``: the family's datasets, defaults and options."""
    spec, names = family.bench, tuple(family.sources)
    files = ", or file:PATH" if spec.files else ""
    p.add_argument("--dataset", default=_default_dataset(names),
                   help=f"{', '.join(names)}{files}")  # fmt: skip
    p.add_argument("--users", type=_positive_int, default=spec.users)
    p.add_argument("--slots", type=_positive_int, default=spec.slots)
    p.add_argument("--epsilon", type=_positive_float, default=family.epsilon)
    p.add_argument("--window", type=_positive_int, default=_window_default(family),
                   help=_window_help(family))  # fmt: skip
    p.add_argument(
        "--mechanisms",
        default=",".join(spec.mechanisms),
        help=f"comma-separated, of {','.join(family.mechanisms)} (default %(default)s)",
    )
    p.add_argument("--seeds", type=_positive_int, default=1, help="seeds 1..K to average over")
    p.add_argument("--json", help="write the results as JSON to this file")
    p.add_argument("--no-progress", action="store_true")
    if spec.files:
        p.add_argument("--domain", type=_positive_int, help="categories d of a file dataset")
        p.add_argument(
            "--numeric", action="store_true", help="a file dataset holds numbers: their mean"
        )
    _option_flags(p, family)


def _kafka_tools(commands: Any) -> None:
    """``privstream broker``, ``topics create`` and ``produce``."""
    _broker_parser(commands)

    topics = commands.add_parser("topics", help="manage the Kafka topics of a flow")
    topics_cmd = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_cmd.add_parser(
        "create",
        help="create the topics of a flow (idempotent); release, ledger and extra-output topics are compacted",
    )
    create.add_argument(
        "--config", metavar="FLOW",
        help="create every topic of this flow file: input, output, ledger, dead letters and "
        "each declared extra output (its [kafka] settings; no other topic flag)",
    )  # fmt: skip
    _kafka_flags(create)
    _topic_flags(create, input_required=False)
    create.add_argument("--report-topic", help="ldp-reports: the devices' reports (an input)")
    create.add_argument("--request-topic", help="ldp-reports: the server's requests")
    create.add_argument("--partitions", type=_positive_int, default=1)
    create.add_argument("--replication", type=_positive_int, default=1)

    produce = commands.add_parser(
        "produce", help="write a synthetic stream of user events to a Kafka topic"
    )
    produce.add_argument("--dataset", default="sin", help="lns, sin, log or a -con variant")
    produce.add_argument("--users", type=_positive_int, default=20_000)
    produce.add_argument(
        "--first-slot", type=_positive_int, default=1,
        help="first slot to write (default %(default)s)",
    )  # fmt: skip
    produce.add_argument(
        "--last-slot", type=_positive_int, metavar="T",
        help="last slot to write, inclusive (default 100): slots --first-slot..T",
    )  # fmt: skip
    produce.add_argument(
        "--slots", type=_positive_int, dest="slots_deprecated", metavar="T",
        help="deprecated: the same as --last-slot (it was always the last slot, not a count)",
    )  # fmt: skip
    produce.add_argument("--seed", type=int, default=1, help="seed of the synthetic data")
    produce.add_argument("--topic", required=True, help="event topic (must exist)")
    produce.add_argument("--stream", help="stream name (default: the dataset name)")
    produce.add_argument("--no-progress", action="store_true")
    produce.add_argument(
        "--spread",
        action="store_true",
        help="write each slot's events round-robin over all partitions of the topic and its "
        "end-of-slot marker to every partition (default: one partition, by the stream's key)",
    )
    _kafka_flags(produce, required=True)
    _clock_key_flags(produce)
    _consume_parser(commands)
    _clock_tools(commands)


def _consume_parser(commands: Any) -> None:
    """``privstream consume TOPIC``."""
    consume = commands.add_parser(
        "consume",
        help="print a topic (releases, ledger, dead letters, ...) as JSON lines from its "
        "beginning, until no message arrived for --idle-seconds; no consumer group",
    )
    consume.add_argument("topic", metavar="TOPIC", help="the topic to read (every partition)")
    consume.add_argument(
        "--idle-seconds", type=_positive_float, default=3.0, metavar="S",
        help="stop once no message arrived for S seconds (default %(default)s)",
    )  # fmt: skip
    consume.add_argument(
        "--max-messages", type=_positive_int, metavar="N",
        help="stop after printing N messages",
    )  # fmt: skip
    consume.add_argument("--stream", help='only messages whose "stream" is this')
    consume.add_argument("--mechanism", help='only messages whose "mechanism" is this')
    _kafka_flags(consume, required=True)


def _broker_parser(commands: Any) -> None:
    """``privstream broker [start|stop|status]``."""
    from privstream.connectors.broker import DEFAULT_PORT, STORAGE_NOTE

    broker = commands.add_parser(
        "broker",
        help=f"run the embedded Kafka-protocol broker (Tansu) for demos and trials; {STORAGE_NOTE}",
        description=f"The embedded Kafka-protocol broker (Tansu) for demos and trials, with "
        f"{STORAGE_NOTE}. 'start' (the default) runs it in this terminal until Ctrl-C, or in "
        "the background with --detach; 'stop' and 'status' act on the detached one.",
    )
    broker.add_argument(
        "action", nargs="?", choices=("start", "stop", "status"), default="start",
        help="start (default), stop or status of the detached broker",
    )  # fmt: skip
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    broker.add_argument(
        "--port", type=_positive_int, default=DEFAULT_PORT,
        help="listen port (default %(default)s); a port in use is refused",
    )  # fmt: skip
    broker.add_argument(
        "--detach", action="store_true",
        help="run in the background: print the bootstrap address and return once it answers "
        "(stop it with 'privstream broker stop')",
    )  # fmt: skip
    broker.add_argument(
        "--state-dir", type=Path, metavar="DIR",
        help="where --detach records the broker (pid, address, log) for stop and status "
        "(default $XDG_STATE_HOME/privstream or ~/.local/state/privstream)",
    )  # fmt: skip


def _clock_tools(commands: Any) -> None:
    """``privstream clock`` and ``clock-key``: the authenticated slot clock of Kafka runs."""
    clock = commands.add_parser(
        "clock",
        help="write the authenticated end-of-slot markers of a markers-clock run, one per slot "
        "as real time passes",
    )
    clock.add_argument(
        "--config", help="a flow file: its input topic, every stream and its Kafka settings"
    )
    clock.add_argument("--topic", help="event topic (must exist; or --config)")
    clock.add_argument("--stream", action="append", help="stream (repeatable; or --config)")
    clock.add_argument("--slot-seconds", type=_positive_float, default=60.0)
    clock.add_argument(
        "--origin", type=float, default=0.0, help="Unix time of slot 0 (default: the epoch)"
    )
    clock.add_argument(
        "--first-slot",
        type=int,
        help="first marker (default: --catch-up slots before the next slot to end)",
    )
    clock.add_argument(
        "--catch-up",
        type=int,
        default=64,
        help="at start, re-mark this many slots before the current one, one per slot, so a "
        "clock that was down closes the slots it missed without a jump (markers of closed "
        "slots are ignored; default 64, the markers clock's look-ahead)",
    )
    clock.add_argument("--through", type=int, help="last marker (default: run until stopped)")
    clock.add_argument(
        "--now", action="store_true", help="write the markers at once (tests, demos; --through)"
    )
    reports_cli.add_clock_flags(clock)
    _kafka_flags(clock)
    _clock_key_flags(clock)
    key = commands.add_parser(
        "clock-key", help="print the clock key (hex) of the secret, for clock writers"
    )
    key.add_argument("--secret-file", help="the noise secret (default $PRIVSTREAM_SECRET)")


def _clock_key_flags(p: argparse.ArgumentParser) -> None:
    """Where the key tagging end-of-slot markers comes from (``flows.secret.resolve_clock_key``)."""
    p.add_argument(
        "--clock-key-file",
        help="file with the clock key (privstream clock-key prints it; default "
        "$PRIVSTREAM_CLOCK_KEY): markers tagged with it close slots of a markers-clock run",
    )
    p.add_argument("--secret-file", help="derive the clock key from the noise secret instead")
    p.add_argument(
        "--insecure-seed", type=int, metavar="N", help="the clock key of a public seed's run"
    )


def _bench_tools(bench_family: Any) -> None:
    """``privstream bench noise``, ``bench kafka`` and ``bench reports``."""
    bnoise = bench_family.add_parser(
        "noise", help="cost of the keyed AES-CTR stream and the exact discrete Laplace"
    )
    bnoise.add_argument("--users", type=_positive_int, default=1_000_000)
    bnoise.add_argument("--repeats", type=_positive_int, default=5)
    bnoise.add_argument("--json", help="write the results as JSON to this file")
    bkafka = bench_family.add_parser(
        "kafka", help="flow events/s against a plain confluent-kafka consumer, same messages"
    )
    bkafka.add_argument("--dataset", default="sin")
    bkafka.add_argument("--users", type=_positive_int, default=20_000)
    bkafka.add_argument("--slots", type=_positive_int, default=100)
    bkafka.add_argument("--mechanism", default="LBU", help="mechanism(s) of the flow")
    bkafka.add_argument("--repeats", type=_positive_int, default=3, help="runs of each reader")
    bkafka.add_argument(
        "--partitions",
        type=_positive_int,
        default=1,
        help="partitions of the input topic: events round-robin, markers in each (as produce "
        "--spread); the raw side reads them with one consumer per partition on one thread, as "
        "the flow's one worker does (default 1)",
    )
    bkafka.add_argument(
        "--streams", type=_positive_int, metavar="S",
        help="scaling run: S streams of a flow file (LPA, equal shares) over the --partitions, "
        "run with each of --processes",
    )  # fmt: skip
    bkafka.add_argument(
        "--processes", type=_process_counts, metavar="P1,P2,...",
        help="scaling run: the Bytewax process counts to measure (e.g. 1,2,4,8), each against "
        "raw consumers with the same parallelism; ratios against the first",
    )  # fmt: skip
    bkafka.add_argument("--json", help="write the results as JSON to this file")
    _kafka_flags(bkafka)
    bench_reports_cli.add_parser(bench_family, _kafka_flags)


def _process_counts(text: str) -> tuple[int, ...]:
    counts = tuple(_positive_int(x) for x in text.split(","))
    if not counts:
        raise argparse.ArgumentTypeError(f"expected P1,P2,..., got {text!r}")
    return counts


def _demo_audit(commands: Any) -> None:
    """``privstream demo`` and ``audit``."""
    demo = commands.add_parser(
        "demo",
        help="the main job: embedded broker, synthetic Sin events on Kafka, all seven LDP-IDS "
        "mechanisms over Kafka with metrics, summary of the releases read back",
    )
    demo.add_argument(
        "--out", default="demo-out", help="directory for releases, table, metrics and plot"
    )
    demo.add_argument("--users", type=_positive_int, default=20_000)
    demo.add_argument("--slots", type=_positive_int, default=200)
    demo.add_argument("--epsilon", type=_positive_float, default=1.0)
    demo.add_argument("--window", type=_positive_int, default=20)
    demo.add_argument("--seed", type=int, default=1)
    demo_reports_cli.add_parser(commands)
    demo_shuffle_cli.add_parser(commands)
    _audit_parser(commands)


def _audit_parser(commands: Any) -> None:
    """``privstream audit``: its inputs, then what it expects (``_audit_expectations``)."""
    audit = commands.add_parser(
        "audit",
        help="check what a flow published (files or topics): every slot present, no conflicting "
        "duplicate, every window within budget, recomputed from the per-slot spends; what the "
        "outputs claim (guarantees, repeats, insecure or evaluation outputs) and the expected "
        "budget (--max-epsilon or --config); exit 0 when all hold, 1 when one fails, 2 on an "
        "input error",
    )
    audit.add_argument("--releases", metavar="FILE", help="releases (JSON lines, run --out)")
    audit.add_argument("--ledger", metavar="FILE", help="ledger entries (run --ledger-out)")
    _kafka_flags(audit)
    audit.add_argument("--release-topic", help="topic of releases (read from the beginning)")
    audit.add_argument("--ledger-topic", help="topic of ledger entries (read from the beginning)")
    audit.add_argument(
        "--idle-seconds",
        type=_positive_float,
        default=2.0,
        help="a topic has ended once no message arrived for this long (default %(default)s)",
    )
    audit.add_argument(
        "--population", type=_positive_int, metavar="N", help="n: users a window may hold"
    )
    audit.add_argument(
        "--expect-slots",
        type=_positive_int,
        metavar="T",
        help="every (stream, mechanism) runs to slot T unless halted (default: its last slot)",
    )
    _audit_expectations(audit)
    audit.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print the JSON report instead of the summary (for scripts); --json FILE: the "
        "summary on stdout and the JSON report in FILE",
    )
    audit.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    _audit_metrics(audit)


def _audit_expectations(audit: argparse.ArgumentParser) -> None:
    """What the audit checks the outputs against: the expected budget, the flow file, and
    whether insecure or evaluation outputs are expected."""
    audit.add_argument(
        "--max-epsilon", type=_positive_float, metavar="E",
        help="the expected budget: every guarantee, and all streams composed per window, within "
        "ε = E (default: the --config file's population ε; without either the audit fails)",
    )  # fmt: skip
    audit.add_argument(
        "--max-delta", type=_positive_float, metavar="D",
        help="the expected δ of the population, for (ε, δ) and Gaussian guarantees (CGM): their "
        "ε is taken at δ = D (default: the --config file's δ, when it states one)",
    )  # fmt: skip
    audit.add_argument(
        "--config", metavar="FLOW",
        help="the flow file (TOML) of the outputs' population: every stream must be in it, "
        "with its share of the population's ε, and all compose within it",
    )  # fmt: skip
    audit.add_argument(
        "--allow-insecure-seed", action="store_true",
        help="expect outputs of an --insecure-seed run (public noise: a test, not private)",
    )  # fmt: skip
    audit.add_argument(
        "--allow-evaluation", action="store_true",
        help="expect the outputs of an evaluation (--compare: the full ε each, together more)",
    )  # fmt: skip


def _audit_metrics(audit: argparse.ArgumentParser) -> None:
    """Serving the audit's verdict as metrics for a periodic job."""
    audit.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="after the audit, serve its verdict as Prometheus metrics (privstream_audit_*) on "
        "this port for --linger seconds, so a periodic job is scraped before it exits",
    )  # fmt: skip
    audit.add_argument(
        "--metrics-addr", default="127.0.0.1", metavar="ADDR",
        help="address of that server (default %(default)s; 0.0.0.0 in a pod)",
    )  # fmt: skip
    audit.add_argument(
        "--linger", type=_positive_float, default=60.0, metavar="S",
        help="seconds to serve the verdict after the audit (default %(default)s; longer than "
        "two scrape intervals; SIGTERM ends it early)",
    )  # fmt: skip


def _config_tools(commands: Any) -> None:
    """``privstream config check FILE``."""
    items_cli.add_parser(commands)
    gateway_cli.add_parser(commands, _kafka_flags)
    devices_cli.add_parser(commands, _kafka_flags)
    shuffler_cli.add_parser(commands, _kafka_flags, _clock_key_flags)
    accountant_cli.add_parser(commands)
    config = commands.add_parser("config", help="work with a flow configuration file (TOML)")
    config_cmd = config.add_subparsers(dest="config_command", required=True)
    check = config_cmd.add_parser(
        "check",
        help="validate FILE without running: print each stream's family, mechanisms, task, "
        "ε (its share of the population's) and window, and the total share; exit 2 naming the "
        "file, the key and what is allowed when a field is invalid",
    )
    check.add_argument("file", metavar="FILE", help="the configuration file (TOML)")
    check.add_argument(
        "--recovery-dir", metavar="DIR",
        help="also report what a resume of this recovery store would do with the flow: "
        "withdrawals from the registration table (count), stricter requirements (count) and "
        "every refused change (kind, count); needs the secret (--secret-file or "
        "$PRIVSTREAM_SECRET) for the keyed digests. Exit 2 when a resume would be refused",
    )  # fmt: skip
    check.add_argument("--secret-file", help="file holding the noise secret (for --recovery-dir)")


def _kafka_settings(args: argparse.Namespace) -> Any:
    from privstream.connectors.kafka import KafkaSettings

    return KafkaSettings.from_options(args.bootstrap, args.kafka_config)


def _progress_bar(total: int | None, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


def _kafka_io(args: argparse.Namespace) -> Any:
    """The Kafka topics of a run (None for file and synthetic input), checked to exist."""
    from privstream.connectors.kafka import require_topics
    from privstream.flows.io import KafkaIO

    if not _names_kafka(args):
        return None  # $PRIVSTREAM_BOOTSTRAP alone never makes a file or synthetic run a Kafka one
    if not args.input_topic or not args.output_topic:
        raise ValueError("Kafka runs need --input-topic and --output-topic (leave out "
                         "--bootstrap and the topic flags for a file or synthetic run)")  # fmt: skip
    settings = _kafka_settings(args)
    kafka = KafkaIO(
        settings, args.input_topic, args.output_topic, args.dead_letter_topic, args.ledger_topic,
        until_slot=args.slots, max_event_bytes=args.max_event_bytes,
        stall_warning_seconds=args.stall_warning_seconds, clock=args.clock,
        trust_input_clock=args.trust_input_clock, new_population=args.new_population,
        grow_partitions=args.grow_partitions, input_topic_recreated=args.input_topic_recreated,
        extra_topics=_extra_routes(args, FAMILIES[args.family], "topic"),
    )  # fmt: skip
    return kafka.with_partitions(require_topics(settings, kafka.topics()))


def _names_kafka(args: argparse.Namespace) -> bool:
    """A run is a Kafka run when its flags name Kafka (``--input-topic``, ``--bootstrap`` or
    another topic flag); the environment supplies the bootstrap only then."""
    topics = (args.input_topic, args.output_topic, args.dead_letter_topic, args.ledger_topic)
    return bool(args.bootstrap or any(topics))


def _task_options(args: argparse.Namespace, family: Family) -> dict[str, Any]:
    """The task keywords of ``flows.dataflow.build``: ``domain`` (categories), ``mean_range``
    (a numeric range) or ``ball`` from the generic ``--domain``, and what each flag of the
    family's task types (``Family.task_types``) parsed, under its declared ``keyword`` (a flag
    wins over ``--domain``)."""
    given = args.domain
    ball = given if isinstance(given, tuple) and isinstance(given[0], tuple) else None
    numeric = given if isinstance(given, tuple) and ball is None else None
    flagged = {
        task.keyword: getattr(args, task.dest)
        for task in family.task_types
        if task.flag is not None and getattr(args, task.dest, None) is not None
    }
    mean_range = flagged.pop("mean_range", None) or numeric
    if (mean_range is not None or ball is not None) and not family.takes("range"):
        raise ValueError(f"the {family.name} family releases histograms: --domain takes d")
    domain = None if isinstance(given, tuple) else given
    options: dict[str, Any] = {"domain": domain, "mean_range": mean_range, **flagged}
    if ball is not None:
        options["ball"] = ball
    return options


def _flow_options(args: argparse.Namespace, family: Family) -> dict[str, Any]:
    """The family-specific keywords of ``flows.dataflow.build`` from its flags."""
    from privstream.connectors.registrations import load_preferences

    options: dict[str, Any] = {o.name: getattr(args, o.name) for o in family.options}
    if family.delta_option is not None:  # one stream over --users users: its δ is the population's
        check_delta_bound(options[family.delta_option], args.users,
                          allow_large=args.allow_large_delta,
                          override="--allow-large-delta")  # fmt: skip
    if family.client_path:
        options["client_path"] = args.client_path
    if getattr(args, "preferences", None):
        options["preferences"] = load_preferences(args.preferences)
    return options


def run_flow(args: argparse.Namespace) -> int:
    """``privstream run FAMILY``: the family's ready flow on a synthetic, file or Kafka input;
    ``privstream run --config FILE``: every stream of a configuration file."""
    if args.family is None:
        if not hasattr(args, "config"):
            raise ValueError(
                "name a family (privstream run ldp-ids ...) or a configuration file "
                "(privstream run --config flow.toml)"
            )
        return run_config(args, args.argv)
    if hasattr(args, "config"):
        raise ValueError("--config runs the file's streams: leave out the family name")
    return _run_family(args)


def _run_family(args: argparse.Namespace) -> int:
    """``privstream run FAMILY``."""
    from privstream.connectors import control
    from privstream.flows.dataflow import build
    from privstream.flows.secret import resolve_noise_key

    family = FAMILIES[args.family]
    names = family.names(args.mechanism)
    if getattr(args, "trust", "default") in (reports_cli.REPORTS, reports_cli.SHUFFLED):
        return _run_reports(args, family)
    kafka = _kafka_io(args)
    slots = args.slots or 800
    secret = resolve_noise_key(secret_file=args.secret_file, insecure_seed=args.insecure_seed)
    incarnation = _family_incarnation(args, secret, kafka, args.window or slots)
    secret = incarnation.key
    if kafka is not None:
        kafka = dataclasses.replace(
            kafka, published=incarnation.floors, released=incarnation.released
        )
    synthetic = kafka is None and not args.dataset.startswith("file:")
    total = slots if synthetic or (kafka is not None and args.slots) else None
    bar = None if args.no_progress else _progress_bar(total * len(names) if total else None,
                                                       "release")  # fmt: skip
    extra_out = _extra_routes(args, family, "out") if kafka is None else None
    flow = build(
        family.name, dataset=args.dataset, mechanisms=names, users=args.users, slots=slots,
        epsilon=args.epsilon, window=args.window or slots, seed=args.seed, out=args.out,
        ledger_out=args.ledger_out, dead_letter_out=args.dead_letter_out,
        lateness=args.lateness, stream=args.stream, **_task_options(args, family),
        progress=(lambda _release: bar.update(1)) if bar is not None else None,
        kafka=kafka, secret=secret, budget_split=args.budget_split, compare=args.compare,
        extra_out=extra_out, **_flow_options(args, family),
    )  # fmt: skip
    refuse_overwrite(  # after build: a refused configuration is reported first
        incarnation, args.out if kafka is None else None, getattr(args, "overwrite_output", False)
    )
    if kafka is None:
        for path in (args.out, args.ledger_out, args.dead_letter_out, *(extra_out or {}).values()):
            if path:  # outputs exist after the run even when nothing was written to them
                Path(path).touch()
        stopping: Any = exit_on_interrupt(functools.partial(_interrupted_line, args, bar))
    else:
        control.install_signal_handlers()
        stopping = contextlib.nullcontext()
    started, before = time.perf_counter(), counts_now()
    with stopping:
        _serve_run(flow, args)
    if bar is not None:
        bar.close()
    where = f"topic {args.output_topic}" if kafka is not None else args.out
    reason = f" ({control.current().reason})" if kafka is not None else ""
    wrote = f"wrote releases to {where} in {time.perf_counter() - started:.1f} s{reason}"
    counts = counts_now().since(before)
    return _run_summary(args, counts, kafka is not None, incarnation.new, wrote)


def _run_reports(args: argparse.Namespace, family: Family) -> int:
    """``privstream run FAMILY --trust ldp-reports`` (or ``ldp-shuffled``): the server stage
    until stopped (or ``--slots`` released); its recovery store bound like every run's."""
    from privstream.connectors import control
    from privstream.flows.io import resolve_source
    from privstream.flows.secret import resolve_noise_key

    shuffled = args.trust == reports_cli.SHUFFLED
    (shuffled_cli if shuffled else reports_cli).check_run(args, family)
    options = _task_options(args, family)
    source = resolve_source(args.dataset, args.users, args.slots or 1, args.seed,
                            options.pop("domain"), options.pop("mean_range"), args.stream,
                            ball=options.pop("ball", None), task=options.pop("task", None),
                            datasets=family.sources)  # fmt: skip
    secret = resolve_noise_key(secret_file=args.secret_file, insecure_seed=args.insecure_seed)
    incarnation = _family_incarnation(args, secret, None, args.window or family.window)
    prepare = shuffled_cli.prepare if shuffled else reports_cli.run
    flow = prepare(args, family, _kafka_settings(args), source.task, incarnation.key)
    control.install_signal_handlers()
    started = time.perf_counter()
    _serve_run(flow, args)
    print(f"served {args.shuffled_topic if shuffled else args.report_topic} → {args.output_topic} in "
          f"{time.perf_counter() - started:.1f} s ({control.current().reason})",
          file=sys.stderr)  # fmt: skip
    return 0


def _interrupted_line(args: argparse.Namespace, bar: Any) -> str:
    """The one line of a bounded run stopped by Ctrl-C (``summary.exit_on_interrupt``)."""
    if args.recovery_dir:
        then = f"run the same command again to resume from {args.recovery_dir}"
    else:
        then = f"{args.out} holds the releases so far; without --recovery-dir a run starts over"
    return ("\n" if bar is not None else "") + f"privstream: interrupted (SIGINT): {then}"


def _run_summary(
    args: argparse.Namespace, counts: RunCounts, on_kafka: bool, new: bool, wrote: str
) -> int:
    """Print ``wrote`` and what the run accepted and rejected (``summary.summary_line``); a
    bounded run that accepted no event says only that, in one line, and exits 1 (a Kafka run
    may legitimately have had no input while it ran: it exits 0)."""
    dead = args.dead_letter_topic if on_kafka else args.dead_letter_out
    keep = "--dead-letter-topic" if on_kafka else "--dead-letter-out FILE"
    if not on_kafka:
        hint = CSV_HINT if args.dataset.startswith("file:") else ""
        refused = nothing_accepted(counts, not new, dead, keep, hint)
        if refused is not None:
            print(f"privstream: error: {refused}", file=sys.stderr)
            return 1
    print(wrote, file=sys.stderr)
    print(summary_line(counts, dead, keep), file=sys.stderr)
    return 0


def _family_incarnation(
    args: argparse.Namespace, secret: Any, kafka: Any, window: int
) -> Incarnation:
    """The incarnation of a family run (``privstream.runtime.incarnation.start``): its store bound to
    the stream's name, ε, window and registration table."""
    from privstream.connectors.registrations import load_preferences
    from privstream.runtime.incarnation import Manifest, registration_digests, start

    family = FAMILIES[args.family]
    stream = args.stream or ("file" if args.dataset.startswith("file:") else args.dataset)
    table = load_preferences(args.preferences) if getattr(args, "preferences", None) else {}
    manifest = Manifest(
        args.epsilon or family.epsilon, window, {stream: 1.0},
        registration=registration_digests(table, secret),
    )  # fmt: skip
    releases = None if kafka is None else (kafka.settings, kafka.output_topic)
    return start(secret, args.recovery_dir, manifest, releases=releases)


def _serve_run(flow: Any, args: argparse.Namespace) -> None:
    """Run ``flow`` with the internal metrics server around it when asked for."""
    internal = None
    if args.internal_metrics_port is not None:
        internal = serve(args.internal_metrics_port, args.internal_metrics_addr, True)
    try:
        run_dataflow(flow, args.workers, args.recovery_dir, args.snapshot_interval,
                  args.metrics_port, args.metrics_addr)  # fmt: skip
    finally:
        if internal is not None:
            internal.close()


def broker(args: argparse.Namespace) -> int:
    """``privstream broker``: the embedded broker in this terminal (until Ctrl-C or SIGTERM),
    in the background (``--detach``), or ``stop``/``status`` of the background one."""
    from privstream.connectors import broker as embedded

    state_dir = args.state_dir or embedded.default_state_dir()
    if args.action == "stop":
        stopped = embedded.stop_detached(state_dir)
        what = "no detached broker was running" if stopped is None else (
            f"stopped the embedded broker on {stopped.bootstrap} (pid {stopped.pid})")  # fmt: skip
        print(f"{what} ({state_dir})", file=sys.stderr)
        return 0
    if args.action == "status":
        state = embedded.read_state(state_dir)
        if state is None:
            print(f"no detached broker is running ({state_dir})", file=sys.stderr)
            return 1
        print(f"PRIVSTREAM_BOOTSTRAP={state.bootstrap}")
        print(f"embedded broker running (pid {state.pid}, log {state.log}); "
              f"{embedded.STORAGE_NOTE}", file=sys.stderr)  # fmt: skip
        return 0
    if args.detach:
        state = embedded.detach(args.host, args.port, state_dir)
        print(f"PRIVSTREAM_BOOTSTRAP={state.bootstrap}", flush=True)
        print(f"embedded broker running in the background (pid {state.pid}, log {state.log}); "
              f"{embedded.STORAGE_NOTE}; privstream broker stop stops it", file=sys.stderr)  # fmt: skip
        return 0
    return _broker_foreground(args.host, args.port)


def _broker_foreground(host: str, port: int) -> int:
    """The embedded broker until SIGINT or SIGTERM."""
    import signal
    import threading

    from privstream.connectors.broker import STORAGE_NOTE, EmbeddedBroker

    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    with EmbeddedBroker(host, port) as running:
        print(f"PRIVSTREAM_BOOTSTRAP={running.bootstrap}", flush=True)
        print(f"embedded broker running ({STORAGE_NOTE}); Ctrl-C or SIGTERM stops it",
              file=sys.stderr, flush=True)  # fmt: skip
        done.wait()
    print("embedded broker stopped", file=sys.stderr)
    return 0


def topics_create(args: argparse.Namespace) -> int:
    """``privstream topics create``: the named topics, or a flow file's (``--config``);
    release, ledger and extra-output topics (keyed by release id) compacted, existing topics
    left alone."""
    from privstream.connectors.kafka import RELEASE_TOPIC_CONFIG, TopicSpec, create_topics

    settings, topics, extra = _topics_to_create(args)
    inputs, outputs, dead_letters, ledger, requests = topics
    roles = [(inputs, {}), (requests, {}), (outputs, RELEASE_TOPIC_CONFIG), (dead_letters, {}),
             (ledger, RELEASE_TOPIC_CONFIG), *((name, RELEASE_TOPIC_CONFIG) for name in extra)]  # fmt: skip
    specs = [
        TopicSpec(name, args.partitions, args.replication, config) for name, config in roles if name
    ]
    if not specs:
        raise ValueError("name at least one topic (--input-topic, --output-topic, ...) or a "
                         "flow file (--config FLOW)")  # fmt: skip
    for name, status in create_topics(settings, specs).items():
        print(f"{name}: {status}")
    return 0


def _topics_to_create(
    args: argparse.Namespace,
) -> tuple[Any, tuple[str | None, ...], list[str]]:
    """The settings, the (input, output, dead-letter, ledger, request) topics and the extra
    outputs' topics of ``topics create``: the flow file's (``--config``) or the flags'
    (``ldp-reports``: the report topic is the input)."""
    if args.input_topic and args.report_topic:
        raise ValueError("--report-topic is an ldp-reports server's input: give it or "
                         "--input-topic, not both")  # fmt: skip
    named = (args.input_topic or args.report_topic, args.output_topic, args.dead_letter_topic,
             args.ledger_topic, args.request_topic)  # fmt: skip
    if args.config is None:
        if not (args.bootstrap or os.environ.get("PRIVSTREAM_BOOTSTRAP")):
            raise ValueError("topics create needs --bootstrap (or $PRIVSTREAM_BOOTSTRAP) or "
                             "--config FLOW")  # fmt: skip
        return _kafka_settings(args), named, []
    if any(named) or args.bootstrap or args.kafka_config:
        raise ValueError("--config takes the topics and Kafka settings from the flow file: "
                         "leave out --bootstrap, --kafka-config and the --*-topic flags")  # fmt: skip
    from privstream.flows.config import load
    from privstream.flows.streams import kafka_io

    kafka = kafka_io(load(args.config))
    topics = (kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic, kafka.ledger_topic,
              kafka.request_topic)  # fmt: skip
    return kafka.settings, topics, list(kafka.extra_topics.values())


def _clock_key(args: argparse.Namespace) -> bytes | None:
    from privstream.flows.secret import resolve_clock_key

    return resolve_clock_key(args.clock_key_file, args.secret_file, args.insecure_seed)


def clock(args: argparse.Namespace) -> int:
    """``privstream clock``: authenticated end-of-slot markers, one per slot."""
    from privstream.connectors.producer import write_clock

    key = _clock_key(args)
    if key is None:
        raise ValueError("the clock needs its key: --clock-key-file, $PRIVSTREAM_CLOCK_KEY or "
                         "--secret-file")  # fmt: skip
    requests = reports_cli.request_topic(args)
    if requests is not None:
        settings, topic, streams = _clock_target(args)
        return reports_cli.round_clock(args, key, settings, topic, streams, requests)
    if args.now and args.through is None:
        raise ValueError("--now writes the markers at once through --through: give --through")
    settings, topic, streams = _clock_target(args)
    first = args.first_slot
    if first is None:
        now = int((time.time() - args.origin) // args.slot_seconds) + 1
        first = max(now - max(args.catch_up, 0), 1)
    last = write_clock(
        settings, topic, streams, key, first_slot=first, through=args.through,
        slot_seconds=args.slot_seconds, origin=args.origin, wait=not args.now,
    )  # fmt: skip
    print(f"wrote end-of-slot markers {first}..{last} to {topic}", file=sys.stderr)
    return 0


def _clock_target(args: argparse.Namespace) -> tuple[Any, str, list[str]]:
    """Where the clock writes: a flow file's input topic and streams, or the flags'."""
    if args.config is not None:
        from privstream.flows.config import load
        from privstream.flows.streams import kafka_io

        config = load(args.config)
        kafka = kafka_io(config)
        return kafka.settings, kafka.input_topic, [s.name for s in config.streams]
    if not args.topic or not args.stream:
        raise ValueError("the clock needs --config FLOW_FILE, or --topic and --stream")
    if not (args.bootstrap or os.environ.get("PRIVSTREAM_BOOTSTRAP")):
        raise ValueError("the clock needs --bootstrap (or $PRIVSTREAM_BOOTSTRAP) or --config")
    return _kafka_settings(args), args.topic, list(args.stream)


def clock_key(args: argparse.Namespace) -> int:
    """``privstream clock-key``: the clock key of the secret, in hex."""
    from privstream.flows.secret import resolve_noise_key

    key = resolve_noise_key(secret_file=args.secret_file)
    print(key.clock_key().hex())
    return 0


def _last_slot(args: argparse.Namespace) -> int:
    """``produce``'s last slot: ``--last-slot`` (or the deprecated ``--slots``, with a
    warning; default 100); an empty range ``--first-slot`` > last is refused."""
    last, old = args.last_slot, args.slots_deprecated
    if old is not None:
        if last is not None and last != old:
            raise ValueError(f"--slots {old} and --last-slot {last} disagree: give --last-slot")
        log.warning("--slots is deprecated: it is the last slot, not a count; give --last-slot "
                    "%d", old)  # fmt: skip
        last = old
    last = 100 if last is None else last
    if args.first_slot > last:
        raise ValueError(f"empty slot range: --first-slot {args.first_slot} is after the last "
                         f"slot {last} (--last-slot is the last slot written, not a count)")  # fmt: skip
    return last


def produce(args: argparse.Namespace) -> int:
    """``privstream produce``: slots ``--first-slot``..``--last-slot`` of a synthetic stream
    onto a topic, with signed end-of-slot markers when a clock key is given."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.connectors.producer import produce_synthetic

    last = _last_slot(args)
    key = _clock_key(args)
    if key is None:
        log.warning("end-of-slot markers written without a tag: a run on the markers clock "
                    "dead-letters them (give --clock-key-file or --secret-file)")  # fmt: skip

    stream = synthetic_dataset(args.dataset, args.users, last, args.seed)
    count = args.users * (last - args.first_slot + 1)
    bar = None if args.no_progress else _progress_bar(count, "event")
    started = time.perf_counter()
    written = produce_synthetic(
        _kafka_settings(args),
        args.topic,
        stream,
        name=args.stream,
        first_slot=args.first_slot,
        progress=bar.update if bar is not None else None,
        spread=args.spread,
        clock_key=key,
    )
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - started
    print(
        f"wrote {written} events to {args.topic} in {seconds:.1f} s "
        f"({written / max(seconds, 1e-9):,.0f} events/s)",
        file=sys.stderr,
    )
    return 0


def consume(args: argparse.Namespace) -> int:
    """``privstream consume TOPIC``: the topic's messages on stdout, one JSON value a line
    (a value that is not JSON as a JSON string), read with the tools' one reader
    (``kafka.read_until_idle``); empty messages (tombstones) are skipped."""
    from privstream.connectors.kafka import read_until_idle

    printed = 0
    wanted = {k: v for k, v in (("stream", args.stream), ("mechanism", args.mechanism)) if v}
    for messages in read_until_idle(_kafka_settings(args), [args.topic], args.idle_seconds):
        for message in messages:
            line = _consumed_line(message.value() or b"", wanted)
            if line is None:
                continue
            print(line)
            printed += 1
            if printed == args.max_messages:
                break
        sys.stdout.flush()
        if printed == args.max_messages:
            break
    print(f"read {printed} messages from {args.topic}", file=sys.stderr)
    return 0


def _consumed_line(value: bytes, wanted: dict[str, str]) -> str | None:
    """One JSON line for a message value — a one-line JSON value as it is, byte for byte, any
    other text as a JSON string — or None when it is empty or the filter ``wanted`` (field →
    value) leaves it out (only a JSON object can match one)."""
    value = value.strip()
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        data = value.decode("utf-8", errors="replace")
        line = json.dumps(data, ensure_ascii=False)
    else:
        line = value.decode() if b"\n" not in value else json.dumps(data, ensure_ascii=False)
    if wanted and not (isinstance(data, dict) and all(data.get(k) == v for k, v in wanted.items())):
        return None
    return line


def _report(result: dict[str, Any], path: str | None) -> int:
    """Write a benchmark's result as JSON when ``--json`` asks for it."""
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def bench_kafka(args: argparse.Namespace) -> int:
    if args.streams is not None or args.processes is not None:
        return _bench_scaling(args)
    from privstream.experiments.kafka import bench_kafka as run
    from privstream.experiments.kafka import format_result

    settings = _kafka_settings(args) if args.bootstrap else None
    result = run(
        settings=settings,
        dataset=args.dataset,
        users=args.users,
        slots=args.slots,
        mechanisms=args.mechanism,
        repeats=args.repeats,
        run_flow=run_dataflow,
        partitions=args.partitions,
    )
    print(format_result(result))
    return _report(result, args.json)


def _bench_scaling(args: argparse.Namespace) -> int:
    """``bench kafka --streams S --processes 1,2,...`` (an embedded broker unless --bootstrap)."""
    import contextlib

    from privstream.connectors.broker import EmbeddedBroker
    from privstream.connectors.kafka import KafkaSettings
    from privstream.experiments.scaling import bench_scaling, format_scaling

    with contextlib.ExitStack() as stack:
        if args.bootstrap or os.environ.get("PRIVSTREAM_BOOTSTRAP"):
            settings = _kafka_settings(args)
        else:
            settings = KafkaSettings((stack.enter_context(EmbeddedBroker()).bootstrap,))
        result = bench_scaling(
            settings, partitions=args.partitions, streams=args.streams or 1,
            processes=args.processes or (1,), users=args.users, slots=args.slots,
        )  # fmt: skip
    print(format_scaling(result))
    return _report(result, args.json)


def bench_noise(args: argparse.Namespace) -> int:
    from privstream.experiments.noise import bench_noise as run
    from privstream.experiments.noise import format_noise

    result = run(users=args.users, repeats=args.repeats)
    print(format_noise(result))
    return _report(result, args.json)


def _bench_command(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """``privstream bench <family>``'s runner: the family's own command where it declares one
    (``BenchSpec.command``), else the generic harness run (``bench_family``)."""
    family = FAMILIES.get(getattr(args, "family", "") or "")
    command = family.bench.command if family is not None else None
    if command is None:
        return bench_family
    run: Callable[[argparse.Namespace], int] = command.load().run
    return run


def bench_family(args: argparse.Namespace) -> int:
    """``privstream bench <family>``: the family's benchmark on the engine-free core."""
    from privstream.experiments import harness

    family = FAMILIES[args.family]
    files = {"domain": args.domain, "numeric": args.numeric} if family.bench.files else {}
    result = harness.bench(
        family, args.dataset, args.users, args.slots, args.epsilon, args.window or args.slots,
        family.names(args.mechanisms), args.seeds, progress=not args.no_progress,
        **files, **{o.name: getattr(args, o.name) for o in family.options},
    )  # fmt: skip
    print(harness.format_table(result))
    return _report(result, args.json)


def demo(args: argparse.Namespace) -> int:
    from privstream.cli.demo import run_demo

    return run_demo(
        out_dir=Path(args.out),
        users=args.users,
        slots=args.slots,
        epsilon=args.epsilon,
        window=args.window,
        seed=args.seed,
        run_flow=run_dataflow,
        progress_bar=_progress_bar,
    )


def audit(args: argparse.Namespace) -> int:
    """``privstream audit``: the summary on stdout (the JSON report with ``--json``, or in
    ``--json FILE``); 0 ok, 1 a check failed."""
    from privstream.audit.main import main as run_audit

    return run_audit(args)


def config_check(args: argparse.Namespace) -> int:
    """``privstream config check FILE``: the file's streams, one line each; a ``ConfigError``
    (a ``ValueError``) exits 2 through ``main``."""
    from privstream.flows.config import describe, load

    config = load(args.file)
    for line in describe(config):
        print(line)
    if getattr(args, "recovery_dir", None) is None:
        return 0
    lines, refused = _resume_report(config, args.recovery_dir, args.secret_file)
    for line in lines:
        print(line)
    return 2 if refused else 0


def _resume_report(
    config: Any, recovery_dir: str, secret_file: str | None
) -> tuple[list[str], bool]:
    """What a resume of the store ``recovery_dir`` would do with the flow ``config``
    (``config check --recovery-dir``): its registration changes by kind and count
    (``incarnation.registration_plan``) and every refused change; never a user id."""
    from privstream.cli.run_config import flow_manifest
    from privstream.flows.secret import resolve_noise_key
    from privstream.runtime.incarnation import changes, read, registration_plan

    stored = read(Path(recovery_dir))
    if stored is None:
        return [f"recovery store {recovery_dir}: no incarnation yet (a run would make it)"], False
    now = flow_manifest(config, resolve_noise_key(secret_file=secret_file))
    plan = registration_plan(stored.manifest, now)
    refusals = changes(stored.manifest, now, frozenset(config.population.retired))
    kinds = ", ".join(f"{kind} ({count})" for kind, count in plan.refused) or "none"
    lines = [
        f"resume of {recovery_dir}: registration table: withdrawals {len(plan.withdrawn)} "
        f"(from each stream's next slot), stricter requirements {plan.stricter} (refused in "
        f"this version), refused changes: {kinds}",
        *(f"  refused: {reason}" for reason in refusals),
    ]
    lines.append(f"resume of {recovery_dir}: " + ("refused" if refusals else "accepted"))
    return lines, bool(refusals)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv  # a cluster launcher starts its processes with the same arguments
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("privstream.status").setLevel(logging.INFO)  # told even without -v
    from privstream.connectors.broker import BrokerError
    from privstream.connectors.kafka import TopicMissing
    from privstream.extras import MissingExtra
    from privstream.mechanisms.errors import IncompatibleState

    commands = {
        "run": run_flow,
        "broker": broker,
        "topics": topics_create,
        "produce": produce,
        "consume": consume,
        "clock": clock,
        "clock-key": clock_key,
        "bench": {
            "kafka": bench_kafka,
            "noise": bench_noise,
            "reports": bench_reports_cli.run,
        }.get(getattr(args, "family", ""), _bench_command(args)),
        "demo": demo,
        "demo-ldp": demo_reports_cli.run,
        "demo-shuffle": demo_shuffle_cli.run,
        "audit": audit,
        "config": config_check,
        "items": items_cli.run,
        "gateway": gateway_cli.run,
        "devices": devices_cli.run,
        "shuffler": shuffler_cli.run,
        "accountant": accountant_cli.run,
    }
    refusals = (
        ValueError,
        FileNotFoundError,
        TopicMissing,
        BrokerError,
        MissingExtra,
        ConnectionError,
        IncompatibleState,
    )
    try:
        return commands[args.command](args)
    except Exception as exc:  # Bytewax wraps what a source raises at start: unwrap refusals
        direct = isinstance(exc, refusals)
        refusal = exc if direct else _cause_of(exc, (TopicMissing, IncompatibleState))
        if refusal is None:
            raise
        print(f"privstream: error: {refusal}", file=sys.stderr)
        return 2


def _cause_of(exc: BaseException, kinds: tuple[type[Exception], ...]) -> BaseException | None:
    """``exc`` or the first exception of its ``__cause__`` chain that is one of ``kinds``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return seen
        seen = seen.__cause__
    return None


if __name__ == "__main__":
    raise SystemExit(main())
