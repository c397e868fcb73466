"""The simulated fleet over HTTP (``privstream.runtime.fleet_http``) against the real gateway
application (``runtime.gateway.Gateway``) on a loopback port, with a report sink in memory (no
broker): each request is answered once however often it is polled, reports go in batches of
at most ``batch``, honest ones are accepted exactly once and every lie is refused for its
reason, late reports are ``closed_round``, and 503, 400 and 413 answers are handled."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from privstream.connectors.datasets import synthetic_dataset
from privstream.runtime.fleet import EXPECTED_REASONS, LIES, Fleet, FleetConfig, device_id
from privstream.runtime.fleet_http import GatewayClient, HttpStats, base_url, run_http_fleet
from privstream.runtime.gateway import Gateway, OpenRounds
from privstream.schema.protocol import CLOSED_ROUND, OracleSpec, Report, Request, SeenReports
from tests.test_fleet import HONEST, USERS, W, scenario

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Recorded:
    """What the gateway saw: items per POST, each device's statuses, the delivered reports."""

    def __init__(self, failures: int = 0) -> None:
        self.sizes: list[int] = []
        self.statuses: dict[str, Counter[str]] = defaultdict(Counter)
        self.delivered: list[Report] = []
        self.failures = failures  # the sink's first calls that fail (the broker is down)

    async def sink(self, reports: Sequence[Report]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("broker down")
        self.delivered += reports

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Record each POST's items and, for a 202, each item's status by device."""
        response = await handler(request)
        if request.method == "POST" and isinstance(response, web.Response):
            items = json.loads(await request.read())
            self.sizes.append(len(items))
            if response.status == 202:
                statuses = json.loads(response.body)["items"]  # type: ignore[arg-type]
                for item, status in zip(items, statuses, strict=True):
                    self.statuses[item["device"]][status] += 1
        return response


def _fleet(late: float = 0.0) -> Fleet:
    config = FleetConfig(USERS, 1.0, W, late=late, liars=len(LIES), flood=8, seed=7)
    return Fleet(config, synthetic_dataset("lns", USERS, 10, 1))


async def _answered(fleet: Fleet, http: HttpStats, count: int) -> None:
    """Wait until the fleet has answered ``count`` requests and posted their reports (it
    polls again only once its posts are answered)."""
    while fleet.stats.requests < count:
        await asyncio.sleep(0.005)
    polls = http.polls
    while http.polls <= polls:
        await asyncio.sleep(0.005)


def run_against_gateway(
    requests: Sequence[Sequence[Request]], fleet: Fleet, recorded: Recorded, batch: int = 7
) -> HttpStats:
    """Open each group of ``requests`` at the gateway in turn (a later round of a stream
    closes its earlier one), each once the fleet answered the previous group."""
    rounds = OpenRounds(SeenReports(W, 4))
    app = Gateway(rounds, recorded.sink).app()
    app.middlewares.append(recorded.middleware)
    http = HttpStats()

    async def main() -> None:
        async with TestServer(app) as server:
            run = asyncio.create_task(run_http_fleet(
                fleet, str(server.make_url("")), http, idle_seconds=0.5, poll_seconds=0.02,
                batch=batch,
            ))  # fmt: skip
            done = 0
            for group in requests:
                for request in group:
                    rounds.add(request)
                done += len(group)
                await _answered(fleet, http, done)
            await run

    asyncio.run(main())
    return http


def test_each_request_is_answered_once_in_batches_and_every_lie_refused() -> None:
    """The scenario of tests/test_fleet.py over HTTP: four streams' first requests open
    together, then slot 2 of ``a`` (over every device's budget: refused by the ledgers), then
    slot 5. The same verdicts as over Kafka: honest reports accepted once, each liar refused
    for its lie's reasons only."""
    requests = scenario()
    fleet, recorded = _fleet(), Recorded()
    http = run_against_gateway([requests[:4], [requests[4]], [requests[5]]], fleet, recorded)
    assert fleet.stats.requests == len(requests)  # polled many times, answered once each
    assert http.polls > len(requests)
    assert recorded.sizes and max(recorded.sizes) <= 7
    assert sum(recorded.sizes) == fleet.stats.messages and len(recorded.sizes) == http.posts
    b = requests[1]
    asked_b = sum(b.asks(device_id(u)) for u in range(HONEST))
    honest = {device_id(u) for u in range(HONEST)}
    delivered = Counter(r.device for r in recorded.delivered)
    assert sum(delivered[d] for d in honest) == fleet.stats.reports == HONEST * 4 + asked_b
    assert len({(r.request, r.device) for r in recorded.delivered}) == len(recorded.delivered)
    assert fleet.stats.refused == Counter({"exhausted": HONEST})
    for device in honest:
        assert set(recorded.statuses[device]) == {"accepted"}
    for j, lie in enumerate(LIES):
        refusals = set(recorded.statuses[device_id(HONEST + j)]) - {"accepted"}
        assert refusals and refusals <= set(EXPECTED_REASONS[lie]), (lie, refusals)
    assert http.accepted == len(recorded.delivered)
    assert sum(http.rejected.values()) + http.accepted == fleet.stats.messages
    text = "\n".join(fleet.stats.lines() + http.lines())
    assert "sim-" not in text and "gateway accepted" in text


def test_late_reports_are_posted_after_the_next_request_and_refused_closed_round() -> None:
    first = Request("a", 1, 1, "m1", OracleSpec("GRR", 4), 0.3, W)
    second = Request("a", 2, 1, "m1", OracleSpec("GRR", 4), 0.3, W)
    fleet, recorded = _fleet(late=1.0), Recorded()
    http = run_against_gateway([[first], [second]], fleet, recorded)
    # every honest report is late: slot 1's go out with slot 2's request, after slot 2 opened
    # (closing slot 1 at the gateway); slot 2's go out when the fleet stops, still open
    assert fleet.stats.late == fleet.stats.reports == 2 * HONEST
    assert http.rejected[CLOSED_ROUND] == HONEST
    assert {r.slot for r in recorded.delivered if r.device in {device_id(u) for u in
            range(HONEST)}} == {2}  # fmt: skip


async def _client_against(gateway: Gateway, test: Callable[[GatewayClient], Awaitable[None]],
                          stats: HttpStats, batch: int = 1000) -> None:  # fmt: skip
    async with TestServer(gateway.app()) as server, aiohttp.ClientSession() as session:
        await test(GatewayClient(session, str(server.make_url("")), stats, batch=batch,
                                 retry_seconds=5.0))  # fmt: skip


ROUND = Request("s", 3, 1, "m1", OracleSpec("GRR", 4), 0.5, W)


def _reports(count: int) -> list[str]:
    return [Report.answering(ROUND, f"dev-{i}", i % 4).to_json() for i in range(count)]


def _gateway(recorded: Recorded, max_body: int = 1 << 20) -> Gateway:
    rounds = OpenRounds(SeenReports(W, 100))
    rounds.add(ROUND)
    return Gateway(rounds, recorded.sink, max_body=max_body)


def test_503_is_retried_until_delivered_without_duplicates() -> None:
    recorded, stats = Recorded(failures=2), HttpStats()
    asyncio.run(_client_against(_gateway(recorded), lambda c: c.post(_reports(5)), stats))
    assert stats.retries == 2 and stats.posts == 3
    assert stats.accepted == 5 and not stats.rejected
    assert sorted(r.device for r in recorded.delivered) == [f"dev-{i}" for i in range(5)]


def test_an_item_the_schema_refuses_is_dropped_and_the_rest_posted_again() -> None:
    recorded, stats = Recorded(), HttpStats()
    good = _reports(3)
    missing = json.dumps({k: v for k, v in json.loads(good[1]).items() if k != "value"})
    items = [good[0], missing, good[2], "7"]
    asyncio.run(_client_against(_gateway(recorded), lambda c: c.post(items), stats))
    assert stats.rejected == Counter({"missing_field": 1, "invalid_type": 1})
    assert stats.accepted == 2 and stats.posts == 2
    assert sorted(r.device for r in recorded.delivered) == ["dev-0", "dev-2"]


def test_a_body_over_the_limit_is_halved() -> None:
    recorded, stats = Recorded(), HttpStats()
    reports = _reports(16)  # about 190 bytes each: 4 fit in 1,000 bytes, 8 do not
    assert sum(len(r) + 1 for r in reports[:4]) < 1000 < sum(len(r) + 1 for r in reports[:8])
    asyncio.run(_client_against(_gateway(recorded, 1000), lambda c: c.post(reports), stats))
    assert stats.accepted == 16 and not stats.rejected
    assert stats.posts == 1 + 2 + 4  # 16 → 2 × 8 → 4 × 4
    assert len(recorded.delivered) == 16


def test_an_unreachable_gateway_is_counted_and_the_fleet_stops_when_idle() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fleet, http = _fleet(), HttpStats()
    asyncio.run(run_http_fleet(fleet, f"http://127.0.0.1:{port}/", http, idle_seconds=0.3,
                               poll_seconds=0.05))  # fmt: skip
    assert http.polls == http.unreachable >= 3 and fleet.stats.requests == 0


@pytest.mark.parametrize("url", ["localhost:8080", "ftp://x", ""])
def test_a_gateway_url_must_be_http(url: str) -> None:
    with pytest.raises(ValueError, match="--gateway must be an http"):
        base_url(url)


def test_max_requests_stops_after_that_many() -> None:
    requests = scenario()[:4]
    fleet, recorded = _fleet(), Recorded()
    rounds = OpenRounds(SeenReports(W, 4))
    for request in requests:
        rounds.add(request)
    http = HttpStats()

    async def main() -> Any:
        async with TestServer(Gateway(rounds, recorded.sink).app()) as server:
            return await run_http_fleet(fleet, str(server.make_url("")), http, idle_seconds=5.0,
                                        max_requests=2, poll_seconds=0.02)  # fmt: skip

    assert asyncio.run(main()).requests == 2 and http.polls == 1


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--gateway", "http://127.0.0.1:1", "--request-topic", "q"],
         "--gateway is the transport: leave out --request-topic"),
        (["--gateway", "http://127.0.0.1:1", "--bootstrap", "b:1"],
         "--gateway is the transport: leave out --bootstrap"),
        (["--request-topic", "q"], "give --gateway URL, or --request-topic and --report-topic"),
        ([], "give --gateway URL, or --request-topic and --report-topic"),
        (["--gateway", "127.0.0.1:1"], "--gateway must be an http"),
    ],
)  # fmt: skip
def test_devices_takes_exactly_one_transport(
    flags: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from privstream.cli.commands import main

    assert main(["devices", "--users", "10", "--idle-seconds", "0.1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("privstream: error:") and refusal in err, err


def test_a_fleet_started_with_sigint_ignored_still_stops_on_it() -> None:
    """A script's background job (`privstream devices ... &`) inherits SIGINT ignored: the
    fleet then polled until idle (120 s in the HTTP integration test, which timed out in a CI
    started that way). It now stops on SIGINT as in a terminal and prints its counts."""
    import signal
    import subprocess
    import sys
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    polled = threading.Event()

    class NoRequests(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            polled.set()
            body = b'{"requests": []}'
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the fleet stopped mid-answer
                pass

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoRequests)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "privstream.cli", "devices", "--gateway", url, "--dataset", "sin",
         "--users", "10", "--slots", "2", "--epsilon", "1", "--window", "2",
         "--idle-seconds", "300", "--poll-seconds", "0.05"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `cmd &` does
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert polled.wait(60), "the fleet never polled"
        started = time.monotonic()
        fleet.send_signal(signal.SIGINT)
        _, err = fleet.communicate(timeout=30)
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.communicate()
        server.shutdown()
        server.server_close()
    assert fleet.returncode == 0, err[-2000:]
    assert "gateway accepted 0 reports" in err and time.monotonic() - started < 30
