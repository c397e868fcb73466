"""A loopback TCP proxy that a test can cut, freeze and resume, and a Tansu broker behind it.

``FaultProxy`` forwards ``127.0.0.1:<port>`` to a target address with two threads per
connection. Faults, each effective at once and undone by ``resume()``:

* ``cut()`` — the broker is down: every open connection is closed and new ones are refused
  (the listening socket is closed; ``resume()`` listens on the same port again).
* ``freeze()`` — the broker hangs: connections stay open and new ones are accepted, but no byte
  is forwarded in either direction (bytes already read are held and sent on ``resume()``).

Kafka clients learn the broker's address from metadata (its advertised listener), so a proxy
only sits between a client and a broker when the broker advertises the proxy's address:
``ProxiedBroker`` starts a dedicated Tansu (the binary of ``EmbeddedBroker``) that listens on a
free port of its own and advertises its proxy's ``bootstrap``. Use ``ProxiedBroker.proxy`` to
inject faults and ``ProxiedBroker.direct`` to reach the broker around them (set-up, checks);
``restart()`` brings a fresh broker up behind the same proxy (in-memory: without any topic).
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import IO

from privstream.connectors.broker import (
    BrokerError,
    broker_binary,
    free_port,
    stop_process,
    wait_until_ready,
)

from .service import Managed

_TICK = 0.05  # how often a pump re-checks the proxy's state (seconds)


class _Connection:
    """One client connection and its upstream twin; closing either closes both."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy(Managed):
    """Forward ``bootstrap`` (loopback) to ``target_host:target_port`` until told otherwise.

    Args:
        target_host, target_port: where connections are forwarded to.
        port: the port to listen on (a free one by default).
    """

    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port(self.host)
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._stopped = False

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        """Listen and forward; returns at once."""
        self._stopped = False
        self._listen()
        return self

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: cut() or stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            connection = _Connection(client, upstream)
            with self._lock:
                self._connections.add(connection)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(connection, src, dst), daemon=True
                ).start()

    def _pump(self, connection: _Connection, src: socket.socket, dst: socket.socket) -> None:
        """Copy ``src`` to ``dst`` while the proxy flows; hold still while it is frozen."""
        try:
            while not connection.closed.is_set():
                if not self._flowing.wait(_TICK):
                    continue
                readable, _, _ = select.select([src], [], [], _TICK)
                if not readable:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                while not self._flowing.wait(_TICK):  # frozen after the read: hold the bytes
                    if connection.closed.is_set():
                        return
                dst.sendall(data)
        except (OSError, ValueError):
            pass  # closed under us (cut, stop) or by the peer
        finally:
            connection.close()
            with self._lock:
                self._connections.discard(connection)

    def _drop_all(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections = list(self._connections)
            self._connections.clear()
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone leaves it listening
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for connection in connections:
            connection.close()

    def cut(self) -> None:
        """Close every connection and refuse new ones until ``resume()``."""
        self._drop_all()

    def freeze(self) -> None:
        """Keep connections (and accept new ones) but forward nothing until ``resume()``."""
        self._flowing.clear()

    def resume(self) -> None:
        """Undo ``cut()`` or ``freeze()``: listen again (same port) and forward."""
        self._flowing.set()
        with self._lock:
            listening = self._listener is not None
        if not listening and not self._stopped:
            self._listen()

    def stop(self) -> None:
        """Close everything; the proxy can be started again."""
        self._stopped = True
        self._flowing.set()
        self._drop_all()


class ProxiedBroker(Managed):
    """A Tansu broker (in-memory) whose advertised listener is a ``FaultProxy`` in front of it:
    every Kafka client given ``bootstrap`` talks to it through the proxy only."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.broker_port: int | None = None
        self.proxy: FaultProxy | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The proxy's address: what the broker advertises."""
        assert self.proxy is not None, "the broker is not started"
        return self.proxy.bootstrap

    @property
    def direct(self) -> str:
        """The broker's own listener (bypasses the proxy only until metadata is fetched: use
        it for admin requests, never for producing or consuming)."""
        assert self.broker_port is not None, "the broker is not started"
        return f"127.0.0.1:{self.broker_port}"

    def start(self, timeout: float = 30.0) -> ProxiedBroker:
        for _attempt in range(3):  # a free port can be taken before it is bound
            self.broker_port = free_port()
            self.proxy = FaultProxy("127.0.0.1", self.broker_port).start()
            if self._launch(timeout):
                return self
            self.stop()
        raise BrokerError(f"the proxied broker did not answer within {timeout} s")

    def _launch(self, timeout: float) -> bool:
        assert self.proxy is not None and self.broker_port is not None
        if self._log is None and self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            [broker_binary(), "broker",
             "--listener-url", f"tcp://127.0.0.1:{self.broker_port}",
             "--advertised-listener-url", f"tcp://{self.proxy.bootstrap}",
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        return wait_until_ready(self._process, self._answers, timeout)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the broker and start a new one on the same port behind the same proxy. Its
        storage is in memory: it comes back without any topic."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, signal.SIGINT, 10.0)
        if not self._launch(timeout):
            raise BrokerError(f"the proxied broker did not come back within {timeout} s")

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        admin.list_topics(timeout=2)
        return True

    def stop(self) -> None:
        """SIGINT (Tansu's clean shutdown), SIGKILL as the fallback; then the proxy."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, signal.SIGINT, 10.0)
        if self.proxy is not None:
            self.proxy.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
