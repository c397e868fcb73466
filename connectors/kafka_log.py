"""librdkafka's log lines, rate-limited, through Python logging.

Without a ``logger`` every client writes librdkafka's lines to stderr itself: each consumer (one
per input partition) and producer logs every failed reconnect, so a 2-minute broker outage
wrote about 15,000 lines and buried everything else. Every client privstream makes gets
``KAFKA_LOG`` (``KafkaSettings.client_config``): at most ``BURST`` lines per (level, facility)
per ``WINDOW`` seconds reach the logger ``privstream.kafka.librdkafka``; when a window with
suppressed lines ends, the next line of that kind says how many were left out. What is logged is
librdkafka's own text (brokers, states, errors), never a message's content.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

BURST: Final = 5
WINDOW: Final = 60.0

log = logging.getLogger("privstream.kafka.librdkafka")


class KafkaLog:
    """A ``logger`` for confluent-kafka clients (it calls ``log(level, fmt, *args)`` with
    ``args = (facility, client name, text)``) that lets ``BURST`` lines per kind through per
    ``WINDOW`` s."""

    def __init__(self, burst: int = BURST, window: float = WINDOW) -> None:
        self.burst = burst
        self.window = window
        self._lock = threading.Lock()
        self._kinds: dict[tuple[int, str], list[float]] = {}  # [window start, shown, dropped]

    def log(self, level: int, msg: str, *args: Any) -> None:
        facility = str(args[0]) if args else ""
        now = time.monotonic()
        with self._lock:
            start, shown, dropped = self._kinds.get((level, facility), (now, 0, 0))
            if now - start >= self.window:
                start, shown = now, 0
            if shown >= self.burst:
                self._kinds[(level, facility)] = [start, shown, dropped + 1]
                return
            self._kinds[(level, facility)] = [start, shown + 1, 0]
        if dropped:
            log.log(level, "(%d more librdkafka %s lines left out)", dropped, facility or "log")
        log.log(level, msg, *args)

    def __reduce__(self) -> tuple[Any, tuple[()]]:  # a client config sent to another process
        return (shared, ())


KAFKA_LOG: Final = KafkaLog()


def shared() -> KafkaLog:
    """The process's one ``KafkaLog`` (what an unpickled configuration gets)."""
    return KAFKA_LOG
