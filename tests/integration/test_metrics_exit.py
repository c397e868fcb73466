"""A run whose ``/metrics`` is being scraped still stops: on SIGTERM, and by itself at ``--slots T``.

Four threads scrape the public endpoint back to back, as a few Prometheus servers and dashboards
would. Bytewax's dataflow API server (the old endpoint) deadlocked the exit: the main thread
waited for its web server while holding the GIL, the server threads waited for the GIL to answer
a scrape. The endpoint is now ``prometheus_client``'s own server, on loopback unless
``--metrics-addr`` says otherwise.
"""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from privstream.cli.commands import _parser, main
from privstream.connectors.broker import free_port
from privstream.connectors.kafka import KafkaSettings
from privstream.operators.metrics import serve_metrics

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli
from .prometheus import FlowProcess

USERS, SLOTS = 2000, 30
SCRAPERS = 4
EXIT_WITHIN = 10.0  # seconds from SIGTERM (or from the last slot) to the process's exit
LAST_SLOT = f'privstream_last_released_slot{{mechanism="LBU",stream="sin"}} {float(SLOTS)}'


class Scrapers:
    """``count`` threads fetching ``url`` back to back until stopped; counts the answers."""

    def __init__(self, url: str, count: int = SCRAPERS) -> None:
        self.url = url
        self.done = threading.Event()
        self.answers = [0] * count
        self.last = ""
        self.threads = [threading.Thread(target=self._scrape, args=(i,)) for i in range(count)]

    def _scrape(self, index: int) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    self.last = response.read().decode()
                self.answers[index] += 1
            except (OSError, http.client.HTTPException):
                self.done.wait(0.01)  # not listening (yet), or cut off by the exit: again

    @contextmanager
    def running(self) -> Iterator[Scrapers]:
        for thread in self.threads:
            thread.start()
        try:
            yield self
        finally:
            self.done.set()
            for thread in self.threads:
                thread.join(10)

    def wait_for(self, text: str, flow: FlowProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.last:
            flow.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"/metrics never showed {text!r}; last:\n{self.last[-2000:]}")
            time.sleep(0.05)


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port`` (Linux ``/proc/net``)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    raw = bytes.fromhex(address)
                    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
                    packed = b"".join(words)
                    found.add(".".join(map(str, packed)) if len(packed) == 4 else packed.hex())
    return found


def flow_command(topics: Topics, kafka: KafkaSettings, secret: Path, *extra: str) -> list[str]:
    return [
        *PRIVSTREAM, "run", "ldp-ids", "--dataset", "sin", "--mechanism", "LBU",
        "--users", str(USERS), "--secret-file", str(secret), "--no-progress",
        *topics.run_flags(kafka), *extra,
    ]  # fmt: skip


def produce(kafka: KafkaSettings, topics: Topics) -> None:
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--users", str(USERS), "--slots", str(SLOTS), "--no-progress",
    )  # fmt: skip


def wait_exit(flow: FlowProcess, timeout: float) -> tuple[int | None, float]:
    started = time.monotonic()
    try:
        code: int | None = flow.process.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - started


def test_sigterm_stops_a_scraped_kafka_run_within_seconds(
    kafka: KafkaSettings, topics: Topics, secret_file: Path, tmp_path: Path
) -> None:
    produce(kafka, topics)
    for attempt in range(3):
        port, workdir = free_port(), tmp_path / f"run-{attempt}"
        workdir.mkdir()
        # each attempt is a new incarnation (no store): it writes to release topics of its own,
        # since a new incarnation never publishes a release id already on its topic
        outputs = Topics(kafka)
        outputs.events = topics.events
        command = flow_command(outputs, kafka, secret_file)
        with (
            FlowProcess(command, port, workdir, cli_env()) as flow,
            Scrapers(f"http://127.0.0.1:{port}/metrics").running() as scrapers,
        ):
            scrapers.wait_for(LAST_SLOT, flow)
            assert listening_addresses(port) == {"127.0.0.1"}  # loopback only by default
            answered = list(scrapers.answers)
            flow.process.send_signal(signal.SIGTERM)
            code, seconds = wait_exit(flow, EXIT_WITHIN)
            assert code == 0, (
                f"attempt {attempt}: exit {code} {seconds:.1f} s after SIGTERM:\n"
                + flow.output()[1][-3000:]
            )
        assert all(n > 0 for n in answered), f"every scraper was answered: {answered}"
        assert "received SIGTERM" in flow.output()[1]
        print(f"attempt {attempt}: exit 0 {seconds:.2f} s after SIGTERM; scrapes {answered}")


def test_a_finished_run_exits_by_itself_while_scraped(
    kafka: KafkaSettings, topics: Topics, secret_file: Path, tmp_path: Path
) -> None:
    produce(kafka, topics)
    port = free_port()
    command = flow_command(topics, kafka, secret_file, "--slots", str(SLOTS))
    with (
        FlowProcess(command, port, tmp_path, cli_env()) as flow,
        Scrapers(f"http://127.0.0.1:{port}/metrics").running() as scrapers,
    ):
        scrapers.wait_for(LAST_SLOT, flow)  # the last slot is released: the run stops now
        code, seconds = wait_exit(flow, EXIT_WITHIN)
        assert code == 0, f"exit {code} {seconds:.1f} s after slot {SLOTS}:\n{flow.output()[1]}"
        answered = list(scrapers.answers)
    assert all(n > 0 for n in answered), answered
    assert f"(slot {SLOTS} released)" in flow.output()[1]
    print(f"exit 0 {seconds:.2f} s after slot {SLOTS} showed on /metrics; scrapes {answered}")


def test_metrics_addr_chooses_the_listening_address() -> None:
    args = _parser().parse_args(["run", "ldp-ids", "--metrics-port", "9100"])
    assert (args.metrics_port, args.metrics_addr) == (9100, "127.0.0.1")
    port = free_port()
    server = serve_metrics(port, "127.0.0.2")  # still loopback, but not 127.0.0.1
    try:
        assert listening_addresses(port) == {"127.0.0.2"}
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5) as response:
            assert "privstream_insecure_seed" in response.read().decode()
    finally:
        server.close()
    assert listening_addresses(port) == set()
    assert not server.thread.is_alive()


def test_a_metrics_port_in_use_is_an_error_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.csv"
    events.write_text("user,slot,value\n" + "".join(f"u{u},1,{u % 2}\n" for u in range(10)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", "ldp-ids", "--mechanism", "LBU", "--dataset", f"file:{events}",
                "--users", "10", "--insecure-seed", "1", "--out", str(tmp_path / "r.jsonl"),
                "--no-progress", "--metrics-port", str(port)]  # fmt: skip
        assert main(argv) == 2
    assert f"privstream: error: cannot serve metrics on 127.0.0.1:{port}" in capsys.readouterr().err
