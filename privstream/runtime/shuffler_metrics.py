"""The shuffler's own Prometheus metrics (issue 25; spec sao2 §10.7's shuffle batch size), on
its own registry and endpoint: the shuffler is another trust domain than the server, so it
serves its metrics itself. Everything here is a count of messages, of refusals by reason, or
a batch's size and policy — the batch sizes are in the forwarded manifests anyway — never a
device id or a symbol.

Every policy and every known refusal reason is exported at 0 from the start, so that an alert's
``increase()`` sees the first drop or the first forged marker (a series that first appears at
1 has no increase) and a shuffler that never forwarded a batch still has a batch series at 0
(deploy/prometheus/rules/privstream-shuffler.rules.yml)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from privstream.runtime.shuffle_book import SHUFFLER_POLICIES
from privstream.schema.shuffle import REPORT_REASONS, Batch, ReportBatch

PREFIX: Final = "privstream_shuffler_"
UNAUTHENTICATED: Final = "unauthenticated_marker"
MALFORMED: Final = "malformed_json"
REFUSALS: Final = (*REPORT_REASONS, UNAUTHENTICATED, MALFORMED)
"""The refusal reasons exported at 0 from the start (a message the schema refuses adds its own)."""
BATCH_POLICIES: Final = ("forward", *SHUFFLER_POLICIES)
BATCH_BUCKETS: Final = (0, 10, 50, 100, 250, 562, 1000, 2500, 5000, 10_000, 50_000, 100_000)


class ShufflerMetrics:
    """Counters and gauges of one shuffler process, on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reports = Counter(PREFIX + "reports", "Device reports kept for a block.", registry=r)
        self.refused = Counter(PREFIX + "refused", "Messages refused, by reason.", ["reason"],
                               registry=r)  # fmt: skip
        self.batches = Counter(PREFIX + "batches", "Batches forwarded, by the policy applied "
                               "(forward; drop or below_min when n < n_min).", ["policy"],
                               registry=r)  # fmt: skip
        self.size = Histogram(PREFIX + "batch_size", "Reports per forwarded batch (n).",
                              buckets=BATCH_BUCKETS, registry=r)  # fmt: skip
        self.open = Gauge(PREFIX + "open_blocks", "Blocks collecting reports.", registry=r)
        for reason in REFUSALS:
            self.refused.labels(reason)
        for policy in BATCH_POLICIES:
            self.batches.labels(policy)

    def report(self, reason: str | None) -> None:
        if reason is None:
            self.reports.inc()
        else:
            self.refused.labels(reason).inc()

    def batch(self, batch: Batch | ReportBatch) -> None:
        self.batches.labels(batch.policy).inc()
        self.size.observe(batch.n)

    def open_blocks(self, count: int) -> None:
        self.open.set(count)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve this registry on ``addr:port`` (``/metrics``)."""
        start_http_server(port, addr=addr, registry=self.registry)
