"""``privstream run --config flow.toml``: every stream of a flow configuration file in one flow,
on one process or a Bytewax cluster of several (``--processes P`` on this host, or
``--process-id i --addresses a0;a1;…`` per process on several hosts, as Bytewax runs them).

Its flags sit on the ``run`` command itself, before any family name, with suppressed defaults
so that they never shadow a family's own flags; the ``[run]`` section of the file gives the
defaults of ``--workers``, ``--processes``, ``--recovery-dir``, ``--snapshot-interval`` and
``--secret-file``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privstream.argtypes import positive_float, positive_int

log = logging.getLogger("privstream")

SUPPRESS = argparse.SUPPRESS


def add_topic_change_flags(p: argparse.ArgumentParser, default: Any = False) -> None:
    """The flags that accept a changed input topic on resume (family runs and ``--config``;
    a flow file's ``kafka.grow_partitions`` / ``kafka.input_topic_recreated`` do the same)."""
    p.add_argument("--grow-partitions", action="store_true", default=default,
                   help="resume a recovery store written for fewer input partitions: the new "
                   "ones start at each stream's last released slot, every budget is kept")  # fmt: skip
    p.add_argument("--input-topic-recreated", action="store_true", default=default,
                   help="resume on an input topic that was deleted and re-created: read it from "
                   "its beginning (events for released slots are late_event dead letters)")  # fmt: skip


def add_config_flags(run: argparse.ArgumentParser) -> None:
    """The ``run --config`` flags (defaults from the file's ``[run]`` section)."""
    flag = run.add_argument
    flag("--config", metavar="FILE", default=SUPPRESS,
         help="run every stream of this flow configuration file (TOML; check it with "
         "`privstream config check FILE`); give the flags below before any family name")  # fmt: skip
    flag("--slots", type=positive_int, metavar="T", default=SUPPRESS,
         help="stop once every stream's mechanisms released slot T (default: run until SIGTERM)")  # fmt: skip
    flag("--processes", type=positive_int, metavar="P", default=SUPPRESS,
         help="run as a Bytewax cluster of P processes on this host (default [run] processes)")  # fmt: skip
    flag("--process-id", type=int, metavar="I", default=SUPPRESS,
         help="several hosts: this process's index in --addresses (one command per process)")  # fmt: skip
    flag("--addresses", metavar="HOST:PORT;...", default=SUPPRESS,
         help="several hosts: every cluster process's address, in process-id order")  # fmt: skip
    flag("--stop-file", default=SUPPRESS, help=SUPPRESS)  # the launcher's --slots stop
    flag("--workers", type=positive_int, metavar="W", default=SUPPRESS,
         help="Bytewax worker threads per process (default [run] workers)")  # fmt: skip
    flag("--recovery-dir", default=SUPPRESS, help="recovery store (default [run] recovery_dir)")
    flag("--snapshot-interval", type=positive_float, default=SUPPRESS,
         help="seconds between snapshots (default [run] snapshot_interval)")  # fmt: skip
    flag("--secret-file", default=SUPPRESS, help="the noise key (default [run] secret_file, "
         "else $PRIVSTREAM_SECRET)")  # fmt: skip
    flag("--insecure-seed", type=int, metavar="N", default=SUPPRESS,
         help="public reproducible noise: NOT private (tests)")  # fmt: skip
    flag("--metrics-port", type=int, metavar="PORT", default=SUPPRESS,
         help="public metrics (process i of a cluster: PORT + i)")  # fmt: skip
    flag("--metrics-addr", metavar="ADDR", default=SUPPRESS, help="default 127.0.0.1")
    flag("--internal-metrics-port", type=int, metavar="PORT", default=SUPPRESS,
         help="internal metrics (process i of a cluster: PORT + i)")  # fmt: skip
    flag("--internal-metrics-addr", metavar="ADDR", default=SUPPRESS, help="default 127.0.0.1")
    add_topic_change_flags(run, SUPPRESS)
    flag("--no-progress", action="store_true", default=SUPPRESS,
         help="accepted for symmetry with a family's run: a flow file's run shows no bar")  # fmt: skip


def run_config(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the file's streams: launch the cluster, or be one process of it (or the only one)."""
    from privstream.flow_config import load

    config = load(args.config)
    processes = _get(args, "processes", config.run.processes)
    if processes > 1 and not hasattr(args, "process_id"):
        from privstream.cluster import launch

        return launch(argv, processes)
    return _run_process(args, config)


def _get(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def _run_process(args: argparse.Namespace, config: Any) -> int:
    """One process: its part of the cluster's dataflow (all of it when alone)."""
    from privstream.connectors import control
    from privstream.connectors.kafka import require_topics
    from privstream.flows.secret import resolve_noise_key
    from privstream.flows.streams import build_streams, kafka_io
    from privstream.runner import run_dataflow, serve

    cluster = _cluster(args)  # before reaching Kafka: a wrong command line fails at once
    kafka = kafka_io(config, until_slot=_get(args, "slots", None))
    kafka = kafka.with_partitions(require_topics(kafka.settings, kafka.topics()))
    kafka = dataclasses.replace(
        kafka,
        stop_file=_get(args, "stop_file", None),
        grow_partitions=kafka.grow_partitions or _get(args, "grow_partitions", False),
        input_topic_recreated=kafka.input_topic_recreated
        or _get(args, "input_topic_recreated", False),
    )
    secret_file = _get(args, "secret_file", config.run.secret_file)
    secret = resolve_noise_key(
        secret_file=None if secret_file is None else str(secret_file),
        insecure_seed=_get(args, "insecure_seed", None),
    )
    flow = build_streams(config, kafka, secret)
    control.install_signal_handlers()
    internal_port = _get(args, "internal_metrics_port", None)
    internal = None
    if internal_port is not None:
        internal = serve(internal_port, _get(args, "internal_metrics_addr", "127.0.0.1"), True)
    recovery = _get(args, "recovery_dir", config.run.recovery_dir)
    started = time.perf_counter()
    try:
        run_dataflow(
            flow, _get(args, "workers", config.run.workers),
            None if recovery is None else str(recovery),
            _get(args, "snapshot_interval", config.run.snapshot_interval),
            _get(args, "metrics_port", None), _get(args, "metrics_addr", "127.0.0.1"),
            **cluster,
        )  # fmt: skip
    except BaseException as exc:  # Bytewax's panic when a peer process of the cluster is gone
        if cluster and type(exc).__name__ == "PanicException":
            print(f"privstream: error: process {cluster['process_id']} lost the cluster (another "
                  "process stopped); restart every process: the cluster resumes from its "
                  "recovery store", file=sys.stderr)  # fmt: skip
            return 3
        raise
    finally:
        if internal is not None:
            internal.close()
    print(f"{len(config.streams)} streams to topic {kafka.output_topic} in "
          f"{time.perf_counter() - started:.1f} s ({control.current().reason})",
          file=sys.stderr)  # fmt: skip
    return 0


def _cluster(args: argparse.Namespace) -> dict[str, Any]:
    """``process_id`` and ``addresses`` of a cluster member (empty when alone)."""
    if not hasattr(args, "process_id") and not hasattr(args, "addresses"):
        return {}
    if not (hasattr(args, "process_id") and hasattr(args, "addresses")):
        raise ValueError("a cluster process needs both --process-id and --addresses")
    addresses = [a for a in args.addresses.split(";") if a]
    if not 0 <= args.process_id < len(addresses):
        raise ValueError(
            f"--process-id {args.process_id} is not an index of the {len(addresses)} --addresses"
        )
    return {"process_id": args.process_id, "addresses": addresses}


def config_path(args: argparse.Namespace) -> Path | None:
    """The ``--config`` file of a ``run`` command, if any."""
    value = getattr(args, "config", None)
    return None if value is None else Path(value)
