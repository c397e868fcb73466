"""The name a Prometheus metric family is exposed and documented under (counters gain
``_total``), which is how ``PUBLIC_METRICS`` and docs/operations.md list them."""

from __future__ import annotations

from prometheus_client.core import Metric


def exposed_name(family: Metric) -> str:
    return family.name + ("_total" if family.type == "counter" else "")
