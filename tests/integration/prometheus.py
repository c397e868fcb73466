"""A real Prometheus server for the integration tests (design §9, §10).

``ensure_prometheus`` finds ``prometheus`` and ``promtool`` on PATH and, on a fresh machine,
installs Debian's ``prometheus`` package itself (``apt-get``, through ``sudo -n`` when not root);
``ensure_alertmanager`` and ``ensure_chromium`` do the same for Alertmanager and Chromium.
When that is impossible the test fails with the reason: a metrics test that silently skips
checks nothing.

``PrometheusServer`` runs its own ``prometheus`` process on a free loopback port with a
temporary configuration (validated by ``promtool check config``) and a temporary TSDB, so it
neither relies on nor conflicts with a packaged service on :9090. ``query`` runs PromQL through
the HTTP API (``/api/v1/query``).

``FlowProcess`` is the ``privstream run`` process whose ``/metrics`` endpoint is scraped, and
``read_keyed`` reads its keyed outputs (releases, ledger entries) back from Kafka.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from privstream.connectors.broker import stop_process
from privstream.connectors.kafka import KafkaSettings, wait_for_messages

from .service import LocalDaemon, check_config

# Serialises the installers of parallel test processes (pytest-xdist workers).
INSTALL_LOCK = Path(tempfile.gettempdir()) / f"privstream-apt-install-{os.getuid()}.lock"


def _found(binaries: Sequence[str]) -> dict[str, str] | None:
    paths = {}
    for name in binaries:
        path = shutil.which(name) or next(
            (p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.access(p, os.X_OK)),
            None,
        )
        if path is None:
            return None
        paths[name] = path
    return paths


def _install(package: str) -> None:
    """``apt-get install <package>``; fails the test with apt's own words when that is not
    possible."""
    if shutil.which("apt-get") is None:
        pytest.fail(
            f"Debian's `{package}` package is needed by this test and is not installed, and this "
            "machine has no apt-get to install it; install its programs on PATH"
        )
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            pytest.fail(
                f"`{package}` is not installed and installing Debian's package needs root, but "
                f"sudo is not available; run `apt-get install {package}` as root"
            )
        prefix = ["sudo", "-n"]  # never wait for a password prompt
    apt = [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q"]
    wait = ["-o", "DPkg::Lock::Timeout=300"]
    for step in (
        [*apt, *wait, "update"],
        [*apt, *wait, "install", "-y", "--no-install-recommends", package],
    ):
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"cannot install {package}: `{' '.join(step)}` failed: {exc}")
        if done.returncode != 0:
            pytest.fail(
                f"cannot install {package}: `{' '.join(step)}` exited {done.returncode}:\n"
                f"{(done.stderr or done.stdout)[-2000:]}"
            )


def ensure_debian(package: str, binaries: Sequence[str]) -> dict[str, str]:
    """Paths of ``binaries``, installing Debian's ``package`` when one is missing (a test that
    silently skips checks nothing, so failing to install fails the test with the reason)."""
    paths = _found(binaries)
    if paths is not None:
        return paths
    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others then find it
        paths = _found(binaries)
        if paths is None:
            _install(package)
            paths = _found(binaries)
    if paths is None:
        pytest.fail(
            f"installed Debian's `{package}` package, but {', '.join(binaries)} are still not "
            "found on PATH or in /usr/bin"
        )
    return paths


def ensure_prometheus() -> dict[str, str]:
    """Paths of ``prometheus`` and ``promtool`` (Debian's ``prometheus``)."""
    return ensure_debian("prometheus", ("prometheus", "promtool"))


def ensure_alertmanager() -> dict[str, str]:
    """Paths of ``prometheus-alertmanager`` and ``amtool`` (Debian's
    ``prometheus-alertmanager``)."""
    return ensure_debian("prometheus-alertmanager", ("prometheus-alertmanager", "amtool"))


def ensure_chromium() -> str:
    """Path of Debian's headless-capable ``chromium``."""
    return ensure_debian("chromium", ("chromium",))["chromium"]


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    alertmanagers: Sequence[str] = (),
) -> str:
    """A Prometheus configuration scraping each job's targets every second, evaluating
    ``rule_files`` every second and sending alerts to ``alertmanagers`` (JSON is valid YAML)."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(targets)}],
            }
            for job, targets in jobs.items()
        ],
    }
    if rule_files:
        config["rule_files"] = [str(path) for path in rule_files]
    if alertmanagers:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]
        }
    return json.dumps(config, indent=2) + "\n"


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


class PrometheusServer(LocalDaemon):
    """``prometheus`` scraping ``targets``, on a free loopback port; a context manager.

    Args:
        targets: ``host:port`` of the endpoints to scrape (job ``job``), or job → targets.
        workdir: directory for the configuration, the TSDB and the server's log.
        rule_files: recording and alerting rules to evaluate (every second).
        alertmanagers: ``host:port`` of the Alertmanagers that receive its alerts.
        user_assets: a directory served at ``/user/`` (``--web.user-assets``).
        config: a configuration file to run as is (e.g. ``deploy/prometheus/local.yml``)
            instead of one scraping ``targets``.
    """

    name = "prometheus"

    def __init__(
        self,
        targets: Sequence[str] | Mapping[str, Sequence[str]],
        workdir: Path,
        job: str = "privstream",
        *,
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
        user_assets: Path | None = None,
        config: Path | None = None,
    ) -> None:
        super().__init__(workdir)
        self.paths = ensure_prometheus()
        jobs = targets if isinstance(targets, Mapping) else {job: targets}
        self.user_assets = user_assets
        self.config = config or workdir / "prometheus.yml"
        if config is None:
            self.config.write_text(scrape_config(jobs, rule_files, alertmanagers))
        check_config([self.paths["promtool"], "check", "config", str(self.config)], "promtool")

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self, port: int, attempt: int) -> list[str]:
        return [
            self.paths["prometheus"],
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / f'tsdb-{attempt}'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *([f"--web.user-assets={self.user_assets}"] if self.user_assets else []),
        ]

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            with exc:
                raise AssertionError(f"Prometheus refused {params}: {exc.read()[:500]!r}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[Sample]:
        """Evaluate ``promql`` now; an instant vector (a scalar becomes one unlabelled sample)."""
        data = self.api("query", query=promql)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        assert data["resultType"] == "vector", data
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def by_mechanism(self, promql: str) -> dict[str, float]:
        """``promql`` as mechanism → value (each mechanism must appear once)."""
        result: dict[str, float] = {}
        for sample in self.query(promql):
            mechanism = sample.labels.get("mechanism", "")
            assert mechanism not in result, f"{promql}: two series for {mechanism!r}"
            result[mechanism] = sample.value
        return result

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        """Poll ``condition`` (PromQL checks) until it holds; fail naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                targets = self.api("targets")["activeTargets"]
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
                pytest.fail(f"Prometheus never showed {what} within {timeout} s; targets: {health}")
            time.sleep(0.25)


class FlowProcess:
    """``privstream run ...`` as its own process serving ``/metrics`` on ``metrics_port``.

    stdout and stderr go to files in ``workdir`` (read them with ``output()``); leaving the
    context kills a flow that is still running, so a failing test leaves no process behind.
    """

    def __init__(
        self, command: Sequence[str], metrics_port: int, workdir: Path, env: dict[str, str]
    ) -> None:
        self.metrics_port = metrics_port
        self.stdout_path = workdir / "flow.stdout"
        self.stderr_path = workdir / "flow.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [*command, "--metrics-port", str(metrics_port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=workdir,
            )

    def output(self) -> tuple[str, str]:
        """What the flow wrote so far to stdout and stderr."""
        return (
            self.stdout_path.read_text(errors="replace"),
            self.stderr_path.read_text(errors="replace"),
        )

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            pytest.fail(f"the flow exited early with code {code}:\n{self.output()[1][-3000:]}")

    def get(self, path: str, port: int | None = None) -> str:
        """A page of the flow's public metrics endpoint (``/metrics``), or of
        another of its servers on ``port`` (``--internal-metrics-port``)."""
        url = f"http://127.0.0.1:{port or self.metrics_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode("utf-8"))

    def metrics(self, port: int | None = None) -> str:
        """The text exposition of the flow's ``/metrics`` endpoint (or the one on ``port``)."""
        return self.get("/metrics", port)

    def wait_metrics(
        self,
        condition: Callable[[str], bool],
        what: str,
        timeout: float,
        port: int | None = None,
    ) -> str:
        """The first exposition (of the endpoint on ``port``, by default the public
        ``/metrics``) for which ``condition`` holds."""
        return scrape_until(port or self.metrics_port, condition, self.check_alive, timeout, what)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code (fails when the flow does not stop in ``timeout`` s)."""
        if not stop_process(self.process, signal.SIGTERM, timeout):
            pytest.fail(f"the flow did not stop within {timeout} s of SIGTERM")
        return self.process.returncode

    def __enter__(self) -> FlowProcess:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def scrape_until(
    port: int,
    condition: Callable[[str], bool],
    check_alive: Callable[[], None] | None = None,
    timeout: float = 30.0,
    what: str = "what the test waits for",
) -> str:
    """The first text of ``http://127.0.0.1:port/metrics`` for which ``condition`` holds;
    ``check_alive`` fails the test early once the server's process is gone."""
    deadline = time.monotonic() + timeout
    text = ""
    while True:
        if check_alive is not None:
            check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode("utf-8")
            if condition(text):
                return text
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"/metrics on :{port} never showed {what}; last:\n{text[-3000:]}")
        time.sleep(0.1)


def read_keyed(
    settings: KafkaSettings,
    topic: str,
    keys: set[str],
    flow: FlowProcess,
    timeout: float = 60.0,
) -> dict[str, dict[str, Any]]:
    """The JSON messages of ``topic`` by key once every key in ``keys`` arrived (the output is
    at-least-once: a repeated key must carry the same message). Fails early if the flow dies."""
    seen: dict[str, bytes] = {}

    def complete(messages: list[Any]) -> bool:
        flow.check_alive()
        for message in messages:
            key = message.key().decode()
            assert seen.setdefault(key, message.value()) == message.value(), (
                f"two different messages for {key!r} on {topic!r}"
            )
        return keys <= seen.keys()

    wait_for_messages(settings, topic, complete, timeout)
    return {key: json.loads(value) for key, value in seen.items()}
