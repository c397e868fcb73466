"""Running a dataflow in this process: Bytewax's runner with the recovery store, the snapshot
interval and the metrics endpoints the operator asked for (what ``privstream run``, the demo
and the benchmarks share)."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from privstream.operators.metrics import MetricsServer

log = logging.getLogger("privstream")

EXIT_EPOCH_FAILED = 1
"""The exit code of a run whose epoch could not be delivered (a restart resends it)."""


def say_failure(exc: BaseException) -> int:
    """Say why a run stops as ``privstream run`` does (``privstream: error: ...`` on stderr);
    the exit code: 2 when restarting cannot help (the topic is gone), 1 otherwise."""
    from privstream.connectors.kafka import TopicMissing
    from privstream.runtime.cluster import EXIT_REFUSED

    sys.stderr.write(f"privstream: error: {exc}\n")
    return EXIT_REFUSED if isinstance(exc, TopicMissing) else EXIT_EPOCH_FAILED


def _end_on_epoch_failure(report: Callable[[BaseException], int], exc: Exception) -> None:
    """End the process as a run ends on any other failure (Bytewax 0.21 would abort it with a
    panic): ``report`` says why and gives the exit code. Nothing of the epoch is recorded."""
    code = report(exc)
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def run_dataflow(
    flow: Any,
    workers: int,
    recovery_dir: str | None,
    snapshot_interval: float | None = None,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
    process_id: int | None = None,
    addresses: list[str] | None = None,
    report: Callable[[BaseException], int] = say_failure,
) -> None:
    """Run ``flow`` in this process with Bytewax's runner: recovery store (``prepare_store``),
    snapshot interval and the public metrics endpoint (``serve_metrics`` on
    ``metrics_addr:metrics_port``, stopped when the run ends) as asked; ``process_id`` of
    ``addresses`` makes it one process of a Bytewax cluster; ``report`` says why an epoch's
    delivery failed and gives the exit code (a cluster member records it for its launcher)."""
    from bytewax.recovery import RecoveryConfig
    from bytewax.run import cli_main

    from privstream.runtime.collector import streaming_collector
    from privstream.runtime.recovery import prepare_store
    from privstream.runtime.store_lock import lock_store
    from privstream.runtime.timer_slack import coarse_waiter, set_timer_slack

    recovery = None
    if recovery_dir:
        lock_store(recovery_dir, process_id or 0)  # one writer per store, held until exit
        prepare_store(recovery_dir)  # created atomically, kept, or refused; never reset
        recovery = RecoveryConfig(Path(recovery_dir))
    if os.environ.pop("BYTEWAX_DATAFLOW_API_ENABLED", None) is not None:
        # Its web server answers scrapes from threads that need the GIL, while the main thread
        # waits for it holding the GIL: a scraped run never exits.
        log.warning("ignoring BYTEWAX_DATAFLOW_API_ENABLED: its server can hang the exit")
    from privstream.connectors.kafka_sink import on_epoch_failure

    on_epoch_failure(functools.partial(_end_on_epoch_failure, report))
    interval = timedelta(seconds=snapshot_interval) if snapshot_interval else None
    server = None if metrics_port is None else serve(metrics_port, metrics_addr)
    waiter = coarse_waiter(flow) if process_id is not None or workers > 1 else None
    try:
        with streaming_collector():
            cli_main(
                flow, workers_per_process=workers, process_id=process_id, addresses=addresses,
                epoch_interval=interval, recovery_config=recovery,
            )  # fmt: skip
    finally:
        if waiter is not None:
            set_timer_slack(waiter)
        on_epoch_failure(None)
        if server is not None:
            server.close()


def serve(port: int, addr: str, internal: bool = False) -> MetricsServer:
    """The public (or internal) metrics server; a clear error when it cannot listen."""
    from privstream.operators.metrics import serve_internal_metrics, serve_metrics

    try:
        return serve_internal_metrics(port, addr) if internal else serve_metrics(port, addr)
    except OSError as exc:
        which = "internal metrics" if internal else "metrics"
        raise ValueError(f"cannot serve {which} on {addr}:{port}: {exc.strerror or exc}") from exc
