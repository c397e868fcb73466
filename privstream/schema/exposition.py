"""The two Prometheus registries privstream exports to (design §7), in a module of their own
so that connectors and operators can both register metrics without importing each other.

* Public: ``prometheus_client``'s default ``REGISTRY``, names ``privstream_*``; everything on
  it is safe to show anyone (``operators.metrics.PUBLIC_METRICS`` is the allow-list).
* Internal: ``INTERNAL``, names ``privstream_internal_*``: true event counts and timing, served
  only on the internal endpoint (the same access as the input topic). The process and Python
  collectors move here too: CPU seconds, memory and GC counts grow with the events processed,
  a timing side channel on true counts.
"""

from __future__ import annotations

import contextlib
from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

PREFIX: Final = "privstream_"
INTERNAL_PREFIX: Final = PREFIX + "internal_"

INTERNAL: Final = CollectorRegistry()
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    with contextlib.suppress(KeyError):  # already moved (the module was reloaded)
        REGISTRY.unregister(_collector)
ProcessCollector(registry=INTERNAL)
PlatformCollector(registry=INTERNAL)
GCCollector(registry=INTERNAL)
