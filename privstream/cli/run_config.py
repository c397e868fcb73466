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
import functools
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privstream.cli.argtypes import positive_float, positive_int

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
    flag("--cluster-dir", default=SUPPRESS, help=SUPPRESS)  # the launcher's heartbeats, reasons
    flag("--stall-limit", type=positive_float, metavar="S", default=SUPPRESS,
         help="a cluster (--processes): stop it and exit 4 once a member made no progress for S "
         "seconds (frozen or hung), so that the orchestrator restarts it (default 300)")  # fmt: skip
    flag("--workers", type=positive_int, metavar="W", default=SUPPRESS,
         help="Bytewax worker threads per process (default [run] workers)")  # fmt: skip
    flag("--recovery-dir", default=SUPPRESS, help="recovery store (default [run] recovery_dir)")
    flag("--snapshot-interval", type=positive_float, default=SUPPRESS,
         help="seconds between snapshots (default [run] snapshot_interval)")  # fmt: skip
    flag("--secret-file", default=SUPPRESS, help="the noise key (default [run] secret_file, "
         "else $PRIVSTREAM_SECRET)")  # fmt: skip
    flag("--insecure-seed", type=int, metavar="N", default=SUPPRESS,
         help="public reproducible noise: NOT private (tests)")  # fmt: skip
    flag("--new-population", action="store_true", default=SUPPRESS,
         help="a new recovery store over a release topic that holds the streams' releases "
         "serves a new population (lets a whole-stream guarantee start afresh)")  # fmt: skip
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
    from privstream.flows.config import load

    config = load(args.config)
    processes = _get(args, "processes", config.run.processes)
    if processes > 1 and not hasattr(args, "process_id"):
        from privstream.runtime.cluster import DEFAULT_STALL_LIMIT, launch

        return launch(argv, processes, _get(args, "stall_limit", DEFAULT_STALL_LIMIT))
    if not hasattr(args, "process_id"):
        return _run_process(args, config)
    try:
        return _run_process(args, config)
    except BaseException as exc:  # a member says why it stops, for its launcher's summary
        return _member_failed(args, args.process_id, exc)


def _get(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def _run_process(args: argparse.Namespace, config: Any) -> int:
    """One process: its part of the cluster's dataflow (all of it when alone)."""
    from privstream.connectors import control
    from privstream.connectors.kafka import require_topics
    from privstream.flows.secret import resolve_noise_key
    from privstream.flows.streams import build_streams, kafka_io
    from privstream.runtime.runner import run_dataflow, serve
    from privstream.runtime.summary import counts_now, summary_line

    cluster = _cluster(args)  # before reaching Kafka: a wrong command line fails at once
    kafka = kafka_io(config, until_slot=_get(args, "slots", None))
    kafka = kafka.with_partitions(require_topics(kafka.settings, kafka.topics()))
    kafka = dataclasses.replace(
        kafka,
        stop_file=_get(args, "stop_file", None),
        new_population=bool(_get(args, "new_population", False)),
        grow_partitions=kafka.grow_partitions or _get(args, "grow_partitions", False),
        input_topic_recreated=kafka.input_topic_recreated
        or _get(args, "input_topic_recreated", False),
    )
    secret_file = _get(args, "secret_file", config.run.secret_file)
    secret = resolve_noise_key(
        secret_file=None if secret_file is None else str(secret_file),
        insecure_seed=_get(args, "insecure_seed", None),
    )
    recovery = _get(args, "recovery_dir", config.run.recovery_dir)
    incarnation = flow_incarnation(config, secret, recovery, kafka)
    kafka = dataclasses.replace(kafka, published=incarnation.floors, released=incarnation.released)
    flow = build_streams(config, kafka, incarnation.key)
    control.install_signal_handlers()
    internal_port = _get(args, "internal_metrics_port", None)
    internal = None
    if internal_port is not None:
        internal = serve(internal_port, _get(args, "internal_metrics_addr", "127.0.0.1"), True)
    _watch_member(args, flow, cluster)
    started, before = time.perf_counter(), counts_now()
    try:
        run_dataflow(
            flow, _get(args, "workers", config.run.workers),
            None if recovery is None else str(recovery),
            _get(args, "snapshot_interval", config.run.snapshot_interval),
            _get(args, "metrics_port", None), _get(args, "metrics_addr", "127.0.0.1"),
            **cluster, **_reporter(args),
        )  # fmt: skip
    finally:
        if internal is not None:
            internal.close()
    print(f"{len(config.streams)} streams to topic {kafka.output_topic} in "
          f"{time.perf_counter() - started:.1f} s ({control.current().reason})",
          file=sys.stderr)  # fmt: skip
    keep = "dead_letter_topic under [kafka]"
    print(summary_line(counts_now().since(before), kafka.dead_letter_topic, keep), file=sys.stderr)
    return 0


def flow_incarnation(config: Any, secret: Any, recovery: Any, kafka: Any) -> Any:
    """The incarnation of a flow file's run (``privstream.runtime.incarnation.start``): its store
    bound to the population's ε and window, every stream's share and the registration table;
    the file's ``retired`` streams leave it explicitly."""
    from privstream.runtime.incarnation import start

    return start(
        secret, None if recovery is None else str(recovery), flow_manifest(config, secret),
        retiring=frozenset(config.population.retired),
        releases=(kafka.settings, kafka.output_topic),
    )  # fmt: skip


def flow_manifest(config: Any, secret: Any) -> Any:
    """What a flow file binds its store to (``privstream.runtime.incarnation.Manifest``)."""
    from privstream.runtime.incarnation import Manifest, registration_digests

    pop = config.population
    return Manifest(
        pop.epsilon, pop.window, {s.name: s.share for s in config.streams},
        registration=registration_digests(pop.preferences, secret),
    )  # fmt: skip


def _watch_member(args: argparse.Namespace, flow: Any, cluster: dict[str, Any]) -> None:
    """A launcher's member: beat from every worker's loop (``heartbeat.HeartbeatSource``) and
    export every member's progress age (``privstream_cluster_member_progress_age_seconds``)."""
    directory = _get(args, "cluster_dir", None)
    if directory is None or not cluster:
        return
    import bytewax.operators as op

    from privstream.connectors import control
    from privstream.runtime import heartbeat

    member = cluster["process_id"]
    heartbeat.beat(heartbeat.alive_file(directory, member))
    source = heartbeat.HeartbeatSource(heartbeat.alive_file(directory, member), control.current())
    op.input("cluster_heartbeat", flow, source)
    heartbeat.PROGRESS.configure(directory, len(cluster["addresses"]), time.time())


def _reporter(args: argparse.Namespace) -> dict[str, Any]:
    """A cluster member reports a failed epoch as it reports any failure (for its launcher);
    a lone process as ``privstream run`` does (``runtime.runner``'s default)."""
    if not hasattr(args, "process_id"):
        return {}
    return {"report": functools.partial(_member_failed, args, args.process_id)}


def _member_failed(args: argparse.Namespace, member: int, exc: BaseException) -> int:
    """A cluster member's failure: print and record (for the launcher) its own reason, and exit
    2 when restarting cannot help (a refused configuration), 3 when it only lost the cluster
    because another member stopped (Bytewax's panic), 1 otherwise."""
    import traceback

    from privstream.connectors.kafka import TopicMissing
    from privstream.mechanisms.errors import IncompatibleState
    from privstream.runtime.cluster import EXIT_LOST, EXIT_REFUSED

    root = _root_cause(exc)
    if type(exc).__name__ == "PanicException" and root is exc:
        code, reason = EXIT_LOST, "lost the cluster: another member stopped"
    elif isinstance(root, IncompatibleState | ValueError | FileNotFoundError | TopicMissing):
        code, reason = EXIT_REFUSED, f"refused: {root}"
    elif isinstance(root, KeyboardInterrupt | SystemExit):
        raise exc
    else:
        traceback.print_exception(exc)
        code, reason = 1, f"{type(root).__name__}: {root}"
    advice = ("restarting will not help: fix what it names, then start the cluster again"
              if code == EXIT_REFUSED else "the cluster resumes from its recovery store")  # fmt: skip
    print(f"privstream: error: cluster member {member} {reason}; {advice}", file=sys.stderr)
    directory = _get(args, "cluster_dir", None)
    if directory is not None:
        from privstream.runtime.heartbeat import write_reason

        write_reason(directory, member, code, reason)
    return code


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost cause of a Bytewax error (the operator's own exception)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


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
