"""``privstream audit --metrics-port``: the last audit's verdict as Prometheus metrics.

The audit runs as a periodic job (a Kubernetes CronJob in ``deploy/``): it reads the published
topics, prints its report, and then serves that report's verdict on ``/metrics`` for
``--linger`` seconds so Prometheus scrapes it at least once before the job exits; an alert on
``last_over_time(privstream_audit_passed[2h]) == 0`` then holds until a later audit passes.

Everything here is public: the audit reads only the flow's public outputs (releases and ledger
entries), and these metrics say whether its checks held and how many records it read — no
released value, no true count, no user identifier. They live in their own registry, never mixed
with a flow's.

* ``privstream_audit_passed``: 1 when every check held, 0 when one failed or the audit could not
  read its inputs (a missing topic, no broker: ``check="inputs"``);
* ``privstream_audit_check_passed{check}``: 1/0 per check of the report;
* ``privstream_audit_last_run_timestamp_seconds``: Unix time the audit finished;
* ``privstream_audit_releases``, ``privstream_audit_ledger_entries``: distinct records read.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge, start_http_server

PREFIX: Final = "privstream_audit_"
INPUTS: Final = "inputs"  # the pseudo-check of an audit that could not read what it audits


class AuditMetrics:
    """The audit's metrics server: bound before the audit runs (a port conflict fails at
    once), empty until ``record`` — a scrape during the audit sees no verdict, never a
    premature 0 — then serving the verdict until ``linger`` ends."""

    def __init__(self, port: int, addr: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:  # the CLI reports a ValueError as an input error (exit 2)
            raise ValueError(f"cannot serve the audit's metrics on {addr}:{port}: {exc}") from exc

    def record(self, report: Mapping[str, Any] | None, finished: float) -> None:
        """Publish ``report``'s verdict (None: the inputs could not be read)."""
        registry = self.registry
        gauge = Gauge(
            PREFIX + "passed", "1 when every check of the last audit held.", registry=registry
        )
        check = Gauge(
            PREFIX + "check_passed", "1 when this check of the last audit held.", ["check"],
            registry=registry,
        )  # fmt: skip
        if report is None:
            check.labels(INPUTS).set(0)
        else:
            check.labels(INPUTS).set(1)
            for name, verdict in report["checks"].items():
                check.labels(name).set(1 if verdict["ok"] else 0)
            for key in ("releases", "ledger_entries"):
                about = f"Distinct {key.replace('_', ' ')} the last audit read."
                Gauge(PREFIX + key, about, registry=registry).set(report["counts"][key])
        gauge.set(1 if report is not None and report["ok"] else 0)
        Gauge(
            PREFIX + "last_run_timestamp_seconds", "Unix time the last audit finished.",
            registry=registry,
        ).set(finished)  # fmt: skip

    def linger(self, seconds: float) -> None:
        """Serve for ``seconds`` more (SIGTERM ends the wait early, so a CronJob pod stops at
        once), then stop the server."""
        done = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: done.set())
        try:
            deadline = time.monotonic() + seconds
            while not done.is_set() and time.monotonic() < deadline:
                done.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
