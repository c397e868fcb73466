"""``privstream gateway``: the HTTP gateway between devices and the request/report topics of
``ldp-reports`` mode (issue 23).

Endpoints:

- ``GET /v1/requests?stream=S``: the open ``Request`` objects of stream ``S`` (all streams
  without ``stream``) the gateway has read from the request topic, as
  ``{"requests": [...]}``.
- ``POST /v1/reports``: one ``Report`` or a JSON array of them. A body that is not JSON, or
  any item the schema cannot decode, is ``400`` with one reason per item (``{"errors":
  [{"index", "reason"}]}``), nothing written. Otherwise the schema's cheap checks
  (``protocol.check_reports``) run against the open requests and the gateway's
  ``SeenReports`` (duplicates, rate limit per device); the accepted reports are written to the
  report topic and their delivery confirmed before the answer ``202 {"accepted": n,
  "rejected": {reason: count}, "items": [status per item]}``. Delivery not confirmed in time:
  ``503`` and the reports count as never accepted (a retry is not a duplicate).
- ``GET /healthz``: ``200`` with the open request count and the counts by reason.

Rounds: a request opens its round; a request of a later ``(slot, round)`` of the same stream
closes every open request of that stream of an earlier ``(slot, round)`` (``SeenReports.close``),
and a request older than the stream's newest is ignored. Requests of one ``(slot, round)``
with several purposes are open together.

Privacy: the gateway logs counts by reason only — never a report's content, a device id, a
detail text or a client address (aiohttp's access log is off). Its answers carry reasons, never
the content of an item. The gateway is a cheap pre-filter; the server stage judges every report
again (its own ``check_reports``), so a restart that forgets accepted pairs cannot double count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from privstream.schema.events import INVALID_TYPE, MALFORMED, OVERSIZED
from privstream.schema.protocol import (
    ProtocolError,
    Report,
    Request,
    SeenReports,
    canonical,
    check_reports,
    decode_report,
    decode_request,
)

log = logging.getLogger("privstream.gateway")

MAX_BODY_BYTES: Final = 1 << 20
MAX_ITEMS: Final = 1000
READ_TIMEOUT_S: Final = 10.0
DELIVERY_TIMEOUT_S: Final = 30.0
BAD_REQUEST: Final = "bad_request"  # a message of the request topic the schema refuses
NOT_DELIVERED: Final = "not_delivered"
TOO_MANY_ITEMS: Final = "too_many_items"


@dataclass
class OpenRounds:
    """The open requests by id and the gateway's ``SeenReports``; thread-safe (the request
    reader's thread adds, the web handlers read and check)."""

    seen: SeenReports
    requests: dict[str, Request] = field(default_factory=dict)
    newest: dict[str, tuple[int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: Request) -> None:
        """Open ``request``: a later ``(slot, round)`` closes the stream's older requests; an
        older one than the stream's newest is ignored (its round is over)."""
        key = (request.slot, request.round)
        with self.lock:
            newest = self.newest.get(request.stream)
            if newest is not None and key < newest:
                return
            if newest is not None and key > newest:
                for old in [r for r in self.requests.values() if r.stream == request.stream]:
                    self.seen.close(old)
                    del self.requests[old.id]
            self.newest[request.stream] = key
            self.requests[request.id] = request

    def open_for(self, stream: str | None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests.values() if stream in (None, r.stream)]

    def check(self, reports: Sequence[Report]) -> tuple[list[Report], list[str | None]]:
        """The accepted reports and each item's refusal reason (None: accepted); each report
        is judged alone, as ``check_reports`` guarantees, in the order given."""
        accepted: list[Report] = []
        reasons: list[str | None] = []
        with self.lock:
            for report in reports:
                ok, dead = check_reports([report], self.requests, self.seen)
                accepted += ok
                reasons.append(dead[0].reason if dead else None)
        return accepted, reasons

    def forget(self, reports: Sequence[Report]) -> None:
        """Undo the acceptance of reports that were not delivered (a retry is no duplicate)."""
        with self.lock:
            self.seen.accepted -= {(r.request, r.device) for r in reports}


def decode_body(
    body: bytes, max_items: int = MAX_ITEMS
) -> tuple[list[Report], list[dict[str, Any]]]:
    """The reports of a POST body (one object or an array), or the errors by item index
    (reasons only: no detail, which could quote the content)."""
    try:
        obj = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return [], [{"index": None, "reason": MALFORMED}]
    items = obj if isinstance(obj, list) else [obj]
    if len(items) > max_items:
        return [], [{"index": None, "reason": TOO_MANY_ITEMS}]
    reports: list[Report] = []
    errors: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        try:
            reports.append(decode_report(canonical(item)))
        except (ProtocolError, TypeError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, ProtocolError) else INVALID_TYPE
            errors.append({"index": index, "reason": reason})
    return reports, errors


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


class Gateway:
    """The web application over ``rounds`` and a report ``sink`` (an async callable that
    returns once every report it is given is delivered, and raises otherwise)."""

    def __init__(self, rounds: OpenRounds, sink: Any, *, max_body: int = MAX_BODY_BYTES,
                 read_timeout: float = READ_TIMEOUT_S,
                 delivery_timeout: float = DELIVERY_TIMEOUT_S) -> None:  # fmt: skip
        self.rounds, self.sink = rounds, sink
        self.max_body, self.read_timeout = max_body, read_timeout
        self.delivery_timeout = delivery_timeout
        self.counts: Counter[str] = Counter()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get("/v1/requests", self.get_requests)
        app.router.add_post("/v1/reports", self.post_reports)
        app.router.add_get("/healthz", self.healthz)
        return app

    async def get_requests(self, request: web.Request) -> web.Response:
        stream = request.query.get("stream")
        found = [json.loads(r.to_json()) for r in self.rounds.open_for(stream)]
        return web.json_response({"requests": found})

    async def healthz(self, _request: web.Request) -> web.Response:
        body = {"status": "ok", "open_requests": len(self.rounds.open_for(None)),
                "counts": dict(sorted(self.counts.items()))}  # fmt: skip
        return web.json_response(body)

    async def post_reports(self, request: web.Request) -> web.Response:
        """Decode, check, deliver the accepted reports, answer with statuses by item."""
        try:
            body = await asyncio.wait_for(request.read(), self.read_timeout)
        except web.HTTPRequestEntityTooLarge:
            self._count({OVERSIZED: 1})
            return web.json_response({"errors": [{"index": None, "reason": OVERSIZED}]},
                                     status=413)  # fmt: skip
        except TimeoutError:
            return web.json_response({"errors": [{"index": None, "reason": "timeout"}]},
                                     status=408)  # fmt: skip
        reports, errors = decode_body(body)
        if errors:
            self._count(Counter(e["reason"] for e in errors))
            return web.json_response({"errors": errors}, status=400)
        accepted, reasons = self.rounds.check(reports)
        try:
            await asyncio.wait_for(self.sink(accepted), self.delivery_timeout)
        except Exception as exc:  # delivery not confirmed: none of them counts as accepted
            self.rounds.forget(accepted)
            self._count({NOT_DELIVERED: len(accepted)})
            log.warning("gateway: %d reports not delivered (%s)", len(accepted), type(exc).__name__)
            return web.json_response({"error": NOT_DELIVERED}, status=503)
        rejected = Counter(r for r in reasons if r is not None)
        self._count(rejected + Counter({"accepted": len(accepted)}))
        return web.json_response(
            {"accepted": len(accepted), "rejected": dict(sorted(rejected.items())),
             "items": [r or "accepted" for r in reasons]}, status=202,
        )  # fmt: skip

    def _count(self, counts: Any) -> None:
        """Add to the counts by reason and log them (counts only, never content or ids)."""
        counts = Counter(counts)
        self.counts.update(counts)
        log.info("gateway: reports %s", ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


# -- Kafka: the request topic's reader and the report topic's writer ---------------------------


class RequestReader:
    """A thread reading every partition of the request topic from its beginning (no consumer
    group) into ``rounds``; a message the schema refuses is counted (``bad_request``), never
    logged with its content."""

    def __init__(self, settings: Any, topic: str, rounds: OpenRounds) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from privstream.connectors.kafka import consumer_config, require_topics

        parts = require_topics(settings, [topic])[topic]
        self._consumer = Consumer(consumer_config(settings, tail=True))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
        self.rounds, self.bad = rounds, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-requests", daemon=True)

    def start(self) -> RequestReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for message in self._consumer.consume(1000, 0.2):
                    if message.error() is None:
                        self._take(message.value())
        finally:
            self._consumer.close()

    def _take(self, value: bytes | None) -> None:
        try:
            self.rounds.add(decode_request(value or b""))
        except ProtocolError as exc:
            self.bad += 1
            log.warning("gateway: request topic message refused (%s); %d so far", exc.reason,
                        self.bad)  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


class ReportWriter:
    """The report topic's idempotent producer (acks=all, as the release sink); ``await
    writer(reports)`` returns once the broker confirmed every report, else raises."""

    def __init__(self, settings: Any, topic: str) -> None:
        from confluent_kafka import Producer

        from privstream.connectors.kafka import require_topics
        from privstream.connectors.kafka_sink import producer_config

        require_topics(settings, [topic])
        self._producer = Producer(producer_config(settings))
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gateway-reports", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    async def __call__(self, reports: Sequence[Report]) -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in reports]
        for report, future in zip(reports, futures, strict=True):
            self._producer.produce(self._topic, report.to_json().encode(), report.stream.encode(),
                                   on_delivery=_settle(loop, future))  # fmt: skip
        await asyncio.gather(*futures)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._producer.flush(10.0)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Any:
    """A delivery callback (producer thread) that settles ``future`` on ``loop``."""

    def done(error: Any, _message: Any) -> None:
        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(ConnectionError(f"report not delivered: {error.str()}"))

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle)

    return done


def serve(settings: Any, args: Any) -> None:
    """Run the gateway until interrupted (``privstream gateway``)."""
    rounds = OpenRounds(SeenReports(args.rate_window, args.rate_limit))
    reader = RequestReader(settings, args.request_topic, rounds).start()
    writer = ReportWriter(settings, args.report_topic)
    gateway = Gateway(rounds, writer, max_body=args.max_body_bytes,
                      delivery_timeout=args.delivery_timeout)  # fmt: skip
    log.info("gateway: serving on %s:%d (requests %r, reports %r)", args.host, args.port,
             args.request_topic, args.report_topic)  # fmt: skip
    try:
        web.run_app(gateway.app(), host=args.host, port=args.port, access_log=None,
                    print=None, handle_signals=True)  # fmt: skip
    finally:
        reader.stop()
        writer.close()
