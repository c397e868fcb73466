"""A real Alertmanager and a webhook receiver for the alerting end-to-end test.

``AlertmanagerServer`` runs Debian's ``prometheus-alertmanager`` on free loopback ports with a
configuration (checked by ``amtool check-config``) that routes every alert to a webhook after
one second; ``WebhookReceiver`` is that webhook: an HTTP server on a thread that keeps every
notification Alertmanager posts, with the time it arrived.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .prometheus import ensure_alertmanager
from .service import LocalDaemon, Managed, check_config


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


class AlertmanagerServer(LocalDaemon):
    """``prometheus-alertmanager`` with ``config`` on a free loopback port, no cluster."""

    name = "alertmanager"

    def __init__(self, config: str, workdir: Path) -> None:
        super().__init__(workdir)
        self.paths = ensure_alertmanager()
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(config)
        check_config([self.paths["amtool"], "check-config", str(self.config)], "amtool")

    def command(self, port: int, attempt: int) -> list[str]:
        return [
            self.paths["prometheus-alertmanager"], f"--config.file={self.config}",
            f"--storage.path={self.workdir / f'data-{attempt}'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
        ]  # fmt: skip
