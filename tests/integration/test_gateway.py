"""``privstream gateway`` against the embedded broker: requests read from the request topic are
served, honest reports reach the report topic exactly once, lying reports get their reason and
never reach it, malformed bodies are 400, and the log holds counts only."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics
from privstream.runtime.gateway import (
    Gateway,
    OpenRounds,
    ReportWriter,
    RequestReader,
    decode_body,
)
from privstream.schema.protocol import (
    OracleSpec,
    Report,
    Request,
    SeenReports,
    Selection,
)

from .conftest import PRIVSTREAM, cli_env, read_all

GRR4 = OracleSpec("GRR", 4)
SECRET_DEVICE = "dev-SECRET-42"  # must never appear in the log
ROUND1 = Request("country", 7, 1, "m1", GRR4, 0.5, 10)
# population division: a hash-selected group (half the devices)
HALF = Selection("hash", bytes(range(16)), 1 << 31, 1 << 32)
POP = Request("country", 7, 1, "m2", OracleSpec("OUE", 3), 1.0, 10, "population", HALF)


def produce(settings: KafkaSettings, topic: str, values: list[str]) -> None:
    producer = Producer(settings.client_config(**{"linger.ms": 5}))
    for value in values:
        producer.produce(topic, value.encode())
    assert producer.flush(30) == 0


class Setup:
    """Fresh request and report topics, a reader and a writer of them, and the gateway."""

    def __init__(self, kafka: KafkaSettings, per_window: int = 100) -> None:
        tag = uuid.uuid4().hex[:8]
        self.kafka = kafka
        self.requests, self.reports = f"requests-{tag}", f"reports-{tag}"
        create_topics(kafka, [TopicSpec(self.requests), TopicSpec(self.reports)])
        self.rounds = OpenRounds(SeenReports(10, per_window))
        self.reader = RequestReader(kafka, self.requests, self.rounds).start()
        self.writer = ReportWriter(kafka, self.reports)
        self.gateway = Gateway(self.rounds, self.writer, max_body=4096)

    def publish(self, *requests: Request) -> None:
        """Write ``requests`` to the request topic and wait until the gateway has read them."""
        produce(self.kafka, self.requests, [r.to_json() for r in requests])
        deadline = time.monotonic() + 60
        while not all(self.rounds.newest.get(r.stream, (-1, 0)) >= (r.slot, r.round)
                      for r in requests):  # fmt: skip
            assert time.monotonic() < deadline, "the gateway never read the requests"
            time.sleep(0.1)

    def serve(self, test: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
        async def main() -> None:
            async with TestClient(TestServer(self.gateway.app())) as client:
                await test(client)

        try:
            asyncio.run(main())
        finally:
            self.reader.stop()
            self.writer.close()

    def topic(self) -> list[dict[str, Any]]:
        return [json.loads(m.value()) for m in read_all(self.kafka, self.reports)]


def asked(request: Request, want: bool, prefix: str = "d") -> str:
    """The first device id ``prefix<i>`` that ``request`` asks (``want``) or does not ask."""
    return next(f"{prefix}{i}" for i in range(1000) if request.asks(f"{prefix}{i}") == want)


def test_serves_open_requests_and_closes_older_rounds(kafka: KafkaSettings) -> None:
    s = Setup(kafka)
    other = Request("device", 3, 1, "m1", GRR4, 0.5, 10)
    produce(kafka, s.requests, ['{"type": "privstream.request", "SECRET": 1}', "not json"])
    s.publish(ROUND1, POP, other)
    deadline = time.monotonic() + 30
    while s.reader.bad < 2:  # refused and counted; the reader goes on
        assert time.monotonic() < deadline
        time.sleep(0.1)
    later = Request("country", 8, 1, "m1", GRR4, 0.5, 10)

    async def test(client: TestClient[Any, Any]) -> None:
        got = await (await client.get("/v1/requests", params={"stream": "country"})).json()
        assert sorted(r["id"] for r in got["requests"]) == sorted([ROUND1.id, POP.id])
        assert {json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                for r in got["requests"]} == {ROUND1.to_json(), POP.to_json()}  # fmt: skip
        await asyncio.to_thread(s.publish, later)  # slot 8 closes slot 7's round
        got = await (await client.get("/v1/requests", params={"stream": "country"})).json()
        assert [r["id"] for r in got["requests"]] == [later.id]
        everything = await (await client.get("/v1/requests")).json()
        assert sorted(r["id"] for r in everything["requests"]) == sorted([later.id, other.id])
        health = await client.get("/healthz")
        assert health.status == 200 and (await health.json())["open_requests"] == 2

    s.serve(test)


def test_honest_reports_reach_the_topic_exactly_once(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(kafka)
    s.publish(ROUND1)
    honest = [Report.answering(ROUND1, f"{SECRET_DEVICE}-{i}", i % 4) for i in range(5)]
    body = "[" + ",".join(r.to_json() for r in honest) + "]"

    async def test(client: TestClient[Any, Any]) -> None:
        first = await client.post("/v1/reports", data=body)
        assert first.status == 202
        assert await first.json() == {"accepted": 5, "rejected": {}, "items": ["accepted"] * 5}
        again = await client.post("/v1/reports", data=body)  # a retry: all duplicates
        assert (await again.json())["rejected"] == {"duplicate_report": 5}
        one = Report.answering(ROUND1, f"{SECRET_DEVICE}-9", 3)
        single = await client.post("/v1/reports", data=one.to_json())  # one object, no array
        assert (await single.json())["accepted"] == 1

    with caplog.at_level(logging.DEBUG):
        s.serve(test)
    got = s.topic()
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(json.loads(r.to_json()), sort_keys=True)
        for r in [*honest, Report.answering(ROUND1, f"{SECRET_DEVICE}-9", 3)]
    )
    assert s.gateway.counts == {"accepted": 6, "duplicate_report": 5}
    assert SECRET_DEVICE not in caplog.text
    assert "accepted=5" in caplog.text  # counts are logged


def test_each_lie_gets_its_reason_and_never_reaches_the_topic(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(kafka, per_window=3)
    s.publish(ROUND1, POP)
    good = Report.answering(ROUND1, "honest-1", 2)
    forged = Request("country", 7, 1, "m9", GRR4, 0.5, 10)  # never published
    lies = {
        "unknown_request": Report.answering(forged, "liar-1", 1),
        "shape_mismatch": Report.answering(ROUND1, "liar-2", 4),  # GRR over 4: 0..3
        "oracle_mismatch": Report(ROUND1.id, "country", 7, 1, "m1", "liar-3", "OUE", 0.5, 1),
        "budget_mismatch": Report(ROUND1.id, "country", 7, 1, "m1", "liar-4", "GRR", 5.0, 1),
        "not_asked": Report.answering(POP, asked(POP, False, "liar-5-"), "010"),
    }
    flooder = asked(POP, True, "flood")
    flood = [Report.answering(POP, flooder, "001")] + [Report.answering(forged, flooder, 1)] * 3
    items = [good, *lies.values()]

    async def test(client: TestClient[Any, Any]) -> None:
        answer = await client.post(
            "/v1/reports", data="[" + ",".join(r.to_json() for r in items) + "]"
        )
        assert answer.status == 202
        got = await answer.json()
        assert got["items"] == ["accepted", *lies]
        assert got["rejected"] == dict.fromkeys(lies, 1)
        flooded = await client.post(
            "/v1/reports", data="[" + ",".join(r.to_json() for r in flood) + "]"
        )
        assert (await flooded.json())["items"] == [
            "accepted",
            "unknown_request",
            "unknown_request",
            "rate_limited",
        ]
        later = Request("country", 8, 1, "m1", GRR4, 0.5, 10)
        await asyncio.to_thread(s.publish, later)
        late = await client.post(
            "/v1/reports", data=Report.answering(ROUND1, "late-1", 0).to_json()
        )
        assert (await late.json())["items"] == ["closed_round"]

    with caplog.at_level(logging.DEBUG):
        s.serve(test)
    got = s.topic()
    assert sorted(m["device"] for m in got) == sorted(["honest-1", flood[0].device])
    assert not any(name in caplog.text for name in ("liar-", "honest-1", "late-1", "flood"))


def offline(sink: Any) -> Gateway:
    """A gateway over one open round and a fake report sink (no broker)."""
    rounds = OpenRounds(SeenReports(10, 100))
    rounds.add(ROUND1)
    return Gateway(rounds, sink, max_body=2048)


def post(gateway: Gateway, body: str | bytes) -> tuple[int, Any]:
    async def main() -> tuple[int, Any]:
        async with TestClient(TestServer(gateway.app())) as client:
            answer = await client.post("/v1/reports", data=body)
            return answer.status, await answer.json()

    return asyncio.run(main())


async def _delivered(reports: list[Report]) -> None:
    DELIVERED.extend(reports)


DELIVERED: list[Report] = []


def test_a_malformed_body_is_400_with_reasons_per_item_and_no_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    DELIVERED.clear()
    gateway = offline(_delivered)
    good = json.loads(Report.answering(ROUND1, "ok-1", 1).to_json())
    missing = {k: v for k, v in good.items() if k != "value"} | {"device": "leak-SECRET"}
    extra = good | {"raw_value": "LEAK-RAW-VALUE", "device": "leak-SECRET"}
    wrong = good | {"slot": "SECRET-slot", "device": "leak-SECRET"}
    with caplog.at_level(logging.DEBUG):
        status, got = post(gateway, "{not json SECRET-TEXT")
        assert (status, got) == (400, {"errors": [{"index": None, "reason": "malformed_json"}]})
        status, got = post(gateway, json.dumps([good, missing, extra, wrong, 7]))
    assert status == 400
    assert got == {"errors": [
        {"index": 1, "reason": "missing_field"}, {"index": 2, "reason": "unexpected_field"},
        {"index": 3, "reason": "invalid_type"}, {"index": 4, "reason": "invalid_type"},
    ]}  # fmt: skip
    assert DELIVERED == []  # nothing of a refused body is written, not even the good item
    assert "SECRET" not in json.dumps(got) and "LEAK" not in json.dumps(got)
    assert "SECRET" not in caplog.text and "LEAK" not in caplog.text
    status, got = post(gateway, json.dumps([good] * 40))  # over max_body (2048 bytes)
    assert (status, got) == (413, {"errors": [{"index": None, "reason": "oversized"}]})
    assert gateway.counts == {"malformed_json": 1, "missing_field": 1, "unexpected_field": 1,
                              "invalid_type": 2, "oversized": 1}  # fmt: skip


def test_a_body_of_too_many_items_is_refused_whole() -> None:
    good = Report.answering(ROUND1, "ok-1", 1).to_json()
    assert decode_body(f"[{good},{good}]".encode(), max_items=2)[1] == []
    reports, errors = decode_body(f"[{good},{good},{good}]".encode(), max_items=2)
    assert (reports, errors) == ([], [{"index": None, "reason": "too_many_items"}])


def test_undelivered_reports_are_503_and_not_remembered() -> None:
    async def broken(_reports: list[Report]) -> None:
        raise ConnectionError("broker down")

    DELIVERED.clear()
    gateway = offline(broken)
    body = Report.answering(ROUND1, "dev-1", 1).to_json()
    assert post(gateway, body) == (503, {"error": "not_delivered"})
    gateway.sink = _delivered  # the broker is back: the retry is accepted, not a duplicate
    assert post(gateway, body)[1]["items"] == ["accepted"]
    assert [r.device for r in DELIVERED] == ["dev-1"]
    assert gateway.counts == {"not_delivered": 1, "accepted": 1}


def test_the_command_serves_and_refuses_a_missing_topic(kafka: KafkaSettings) -> None:
    """``privstream gateway`` as its own process: a missing topic is a one-line refusal (exit
    2); with both topics it serves a published request and confirms a report on the topic."""
    tag = uuid.uuid4().hex[:8]
    requests, reports = f"requests-{tag}", f"reports-{tag}"
    flags = ["--bootstrap", kafka.bootstrap, "--request-topic", requests, "--report-topic", reports]
    refused = subprocess.run([*PRIVSTREAM, "gateway", *flags], capture_output=True, text=True,
                             timeout=60, env=cli_env())  # fmt: skip
    assert refused.returncode == 2 and "privstream: error:" in refused.stderr
    create_topics(kafka, [TopicSpec(requests), TopicSpec(reports)])
    produce(kafka, requests, [ROUND1.to_json()])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway = subprocess.Popen([*PRIVSTREAM, "gateway", *flags, "--port", str(port)],
                               env=cli_env(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
                    if json.load(answer)["open_requests"] == 1:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the gateway never served its request"
            time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/v1/requests?stream=country", timeout=5) as answer:
            assert [r["id"] for r in json.load(answer)["requests"]] == [ROUND1.id]
        report = Report.answering(ROUND1, "cli-dev-1", 3)
        post = urllib.request.Request(f"{base}/v1/reports", data=report.to_json().encode())
        with urllib.request.urlopen(post, timeout=30) as answer:
            assert answer.status == 202 and json.load(answer)["accepted"] == 1
    finally:
        gateway.send_signal(signal.SIGINT)
        _out, err = gateway.communicate(timeout=30)
    assert [json.loads(m.value()) for m in read_all(kafka, reports)] == [
        json.loads(report.to_json())
    ]
    assert "cli-dev-1" not in err
