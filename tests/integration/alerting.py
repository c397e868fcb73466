"""A real Alertmanager and a webhook receiver for the alerting end-to-end test.

``AlertmanagerServer`` runs Debian's ``prometheus-alertmanager`` on free loopback ports with a
configuration (checked by ``amtool check-config``) that routes every alert to a webhook after
one second; ``WebhookReceiver`` is that webhook: an HTTP server on a thread that keeps every
notification Alertmanager posts, with the time it arrived.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest

from privstream.connectors.broker import free_port, stop_process, wait_until_ready

from .prometheus import ensure_alertmanager
from .service import Managed


@dataclass(frozen=True)
class Notification:
    """One webhook POST: Alertmanager's JSON body and when it arrived (``time.time()``)."""

    body: dict[str, Any]
    received: float


class WebhookReceiver(Managed):
    """An HTTP server on a free loopback port keeping every JSON notification posted to it."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with receiver._lock:
                    receiver.notifications.append(Notification(body, time.time()))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/alerts"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, alertname: str, timeout: float) -> tuple[dict[str, Any], float]:
        """The first firing alert named ``alertname`` and when its notification arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for note in self.notifications:
                    for alert in note.body.get("alerts", []):
                        named = alert["labels"].get("alertname") == alertname
                        if named and alert["status"] == "firing":
                            return alert, note.received
            time.sleep(0.1)
        seen = [a["labels"] for n in self.notifications for a in n.body.get("alerts", [])]
        pytest.fail(f"no {alertname} notification within {timeout} s; received: {seen}")


def webhook_config(url: str) -> str:
    """Every alert to ``url``, grouped per alert and mechanism, sent one second after it fires
    (JSON is valid YAML)."""
    config = {
        "route": {
            "receiver": "test",
            "group_by": ["alertname", "stream", "mechanism"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "test", "webhook_configs": [{"url": url, "send_resolved": True}]}],
    }
    return json.dumps(config, indent=2) + "\n"


class AlertmanagerServer(Managed):
    """``prometheus-alertmanager`` with ``config`` on a free loopback port, no cluster."""

    def __init__(self, config: str, workdir: Path) -> None:
        self.paths = ensure_alertmanager()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(config)
        check = subprocess.run(
            [self.paths["amtool"], "check-config", str(self.config)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if check.returncode != 0:
            pytest.fail(f"amtool rejected the configuration:\n{check.stdout}{check.stderr}")
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        assert self.port is not None, "Alertmanager is not started"
        return f"127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.workdir / "alertmanager.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout: float = 30.0) -> AlertmanagerServer:
        for attempt in range(3):  # a free port can be taken before alertmanager binds it
            self.port = free_port()
            self._log = open(self.workdir / "alertmanager.log", "ab")  # noqa: SIM115
            self._process = subprocess.Popen(
                [self.paths["prometheus-alertmanager"], f"--config.file={self.config}",
                 f"--storage.path={self.workdir / f'data-{attempt}'}",
                 f"--web.listen-address={self.address}", "--cluster.listen-address="],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )  # fmt: skip

            def ready() -> bool:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=1) as r:
                    return bool(r.status == 200)

            if wait_until_ready(self._process, ready, timeout, pause=0.1):
                return self
            self.stop()
        pytest.fail(f"Alertmanager did not become ready within {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, signal.SIGTERM, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
