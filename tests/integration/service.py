"""A context manager for the test services (proxy, brokers, Prometheus, flow processes):
``with Service() as running`` starts it and always stops it; ``LocalDaemon``, the server
binaries (Prometheus, Alertmanager) on free loopback ports."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

import pytest

from privstream.connectors.broker import free_port, stop_process, wait_until_ready

S = TypeVar("S", bound="Managed")


class Managed:
    """Subclasses define ``start() -> self`` and ``stop()``."""

    def start(self: S) -> S:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalDaemon(Managed):
    """A server binary of the tests (Prometheus, Alertmanager) on a free loopback port, with its
    log in ``workdir``: ``start`` tries up to three ports (a free port can be taken before the
    server binds it) and returns once ``/-/ready`` answers 200; ``stop`` sends SIGTERM (both shut
    down cleanly on it), SIGKILL after a timeout. Subclasses give ``name`` and ``command``."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / f"{self.name}.log"
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    def command(self, port: int, attempt: int) -> list[str]:
        raise NotImplementedError

    @property
    def address(self) -> str:
        assert self.port is not None, f"{self.name} is not started"
        return f"127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self: D, timeout: float = 30.0) -> D:
        for attempt in range(3):
            self.port = free_port()
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            process = self._process = subprocess.Popen(
                self.command(self.port, attempt), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip

            def ready() -> bool:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=1) as r:
                    return bool(r.status == 200)

            if wait_until_ready(process, ready, timeout, pause=0.1):
                return self
            self.stop()
        pytest.fail(f"{self.name} did not become ready within {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, signal.SIGTERM, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


def check_config(command: Sequence[str], what: str) -> None:
    """Run a configuration checker (``promtool check config``, ``amtool check-config``); fail
    the test with its words when it refuses."""
    check = subprocess.run(list(command), capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        pytest.fail(f"{what} rejected the configuration:\n{check.stdout}{check.stderr}")


D = TypeVar("D", bound=LocalDaemon)
