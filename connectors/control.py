"""Stopping a running flow cleanly.

An unbounded source (Kafka) polls a ``StopSignal`` and ends its partitions when it is set, so the
dataflow drains, writes its last snapshot and returns normally. Three things set it: SIGTERM (or
a first Ctrl-C) through ``install_signal_handlers``, a flow that has released its last requested
slot (``--slots T``), and tests. A second Ctrl-C aborts at once, as usual.

The signal is per process: Bytewax workers of one process are threads sharing it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


class StopSignal:
    """A request to stop, with its reason (for the log), and conditions that request it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._conditions: list[tuple[Callable[[], bool], str]] = []
        self.reason = ""

    def request(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            log.info("stopping: %s", reason)
            self._event.set()

    def when(self, condition: Callable[[], bool], reason: str) -> None:
        """Request a stop as soon as ``condition()`` holds (checked on every ``is_set``)."""
        self._conditions.append((condition, reason))

    def is_set(self) -> bool:
        if not self._event.is_set():
            for condition, reason in self._conditions:
                if condition():
                    self.request(reason)
                    break
        return self._event.is_set()


_current = StopSignal()


def current() -> StopSignal:
    """The signal the process's signal handlers set."""
    return _current


def fresh() -> StopSignal:
    """A new signal for a new flow; it becomes the one signal handlers set."""
    global _current
    _current = StopSignal()
    return _current


def install_signal_handlers() -> None:
    """SIGTERM and a first SIGINT stop the flow cleanly; a second SIGINT interrupts."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop = current()
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        stop.request(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
