"""The simulated fleet over HTTP (issue 23): ``privstream devices --gateway URL``.

The same devices as over Kafka (:class:`~privstream.runtime.fleet.Fleet`: ledgers, dropout,
late reports, liars), talking to the gateway (``privstream gateway``, ``runtime.gateway``)
instead of the topics: the fleet polls ``GET {URL}/v1/requests`` every ``poll_seconds``,
hands each request id it has not seen to ``Fleet.receive`` once (in the gateway's order), and
posts the reports that come back to ``POST {URL}/v1/reports`` as JSON arrays of at most
``batch`` items (the gateway's ``MAX_ITEMS``). A late report is posted with the next request's
reports, after its round closed: the gateway answers it ``closed_round`` (over Kafka, the
server's dead letters say so).

The gateway's answers, per item, are counted by reason: ``202`` (accepted or the reason of the
refusal); ``400`` (an item the schema refuses: dropped, counted, the others posted again —
the gateway writes nothing of a body with one bad item); ``413`` (the batch is halved);
``503``/``408`` and an unreachable gateway (retried with back-off for ``retry_seconds``, then
counted ``undelivered``). The fleet stops once no new request came for ``idle_seconds`` or
after ``max_requests``. Stats are counts only: no value, no device id, no request content.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from privstream.runtime.fleet import Fleet, FleetStats, Message
from privstream.runtime.gateway import MAX_ITEMS
from privstream.schema.protocol import canonical

POLL_SECONDS: Final = 0.2
RETRY_SECONDS: Final = 30.0
CONCURRENT_POSTS: Final = 4
UNDELIVERED: Final = "undelivered"
RETRIED: Final = frozenset({408, 503})
"""The gateway's answers that mean "not written, try again" (read timeout, delivery failed)."""


@dataclass
class HttpStats:
    """What went over HTTP, as counts only."""

    polls: int = 0
    unreachable: int = 0  # polls and posts without an answer from the gateway
    posts: int = 0
    retries: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # the gateway's reasons, per item

    def lines(self) -> list[str]:
        reasons = ", ".join(f"{k}: {n}" for k, n in sorted(self.rejected.items())) or "none"
        return [
            f"gateway: {self.polls} polls, {self.posts} posts ({self.retries} retried, "
            f"{self.unreachable} unanswered)",
            f"gateway accepted {self.accepted} reports; refused {sum(self.rejected.values())} "
            f"({reasons})",
        ]


def base_url(url: str) -> str:
    """The gateway's base URL without a trailing slash (``ValueError`` unless http(s))."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--gateway must be an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


class GatewayClient:
    """The fleet's side of the gateway's API over one ``aiohttp`` session."""

    def __init__(self, session: aiohttp.ClientSession, url: str, stats: HttpStats, *,
                 batch: int = MAX_ITEMS, retry_seconds: float = RETRY_SECONDS) -> None:  # fmt: skip
        if batch < 1:
            raise ValueError(f"a batch holds at least one report, got {batch}")
        self.session, self.url, self.stats = session, base_url(url), stats
        self.batch, self.retry_seconds = batch, retry_seconds
        self._slots = asyncio.Semaphore(CONCURRENT_POSTS)

    async def requests(self) -> list[tuple[str, str]]:
        """The open requests as ``(id, JSON text)``, in the gateway's order; none when the
        gateway did not answer with its ``{"requests": [...]}``."""
        self.stats.polls += 1
        try:
            async with self.session.get(f"{self.url}/v1/requests") as answer:
                found = (await answer.json())["requests"] if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            found = None
        if not isinstance(found, list):
            self.stats.unreachable += 1
            return []
        return [(_request_id(item), canonical(item)) for item in found]

    async def post(self, reports: Sequence[str]) -> None:
        """Post ``reports`` (JSON texts) in batches of at most ``batch``, a few at a time."""
        chunks = [list(reports[i : i + self.batch]) for i in range(0, len(reports), self.batch)]
        await asyncio.gather(*(self._deliver(chunk) for chunk in chunks))

    async def _deliver(self, chunk: list[str]) -> None:
        """Post one batch until the gateway has judged every item (module docstring)."""
        pending, deadline, pause = [chunk], time.monotonic() + self.retry_seconds, 0.05
        while pending:
            items = pending.pop()
            async with self._slots:
                status, body = await self._post(items)
            if status == 202:
                self._tally(body)
            elif status == 400 and isinstance(body, dict):
                pending += self._without_refused(items, body)
            elif status == 413 and len(items) > 1:
                pending += [items[: len(items) // 2], items[len(items) // 2 :]]
            elif (status is None or status in RETRIED) and time.monotonic() < deadline:
                self.stats.retries += 1
                pending.append(items)
                await asyncio.sleep(pause)
                pause = min(2 * pause, 2.0)
            else:
                reason = UNDELIVERED if status is None or status in RETRIED else f"http_{status}"
                self.stats.rejected[reason] += len(items)

    async def _post(self, items: list[str]) -> tuple[int | None, Any]:
        """One POST: the answer's status and JSON body (None: no answer)."""
        self.stats.posts += 1
        body = "[" + ",".join(items) + "]"
        headers = {"Content-Type": "application/json"}
        try:
            async with self.session.post(f"{self.url}/v1/reports", data=body.encode(),
                                         headers=headers) as answer:  # fmt: skip
                try:
                    return answer.status, await answer.json(content_type=None)
                except ValueError:
                    return answer.status, None
        except (aiohttp.ClientError, TimeoutError):
            self.stats.unreachable += 1
            return None, None

    def _tally(self, body: Any) -> None:
        """Count a ``202`` answer's statuses per item."""
        statuses = Counter(body.get("items", []) if isinstance(body, dict) else [])
        self.stats.accepted += statuses.pop("accepted", 0)
        self.stats.rejected.update(statuses)

    def _without_refused(self, items: list[str], body: dict[str, Any]) -> list[list[str]]:
        """After a ``400``: count the refused items by reason and return the others to post
        again; a refusal of the whole body (no index) refuses every item."""
        errors = [e for e in body.get("errors", []) if isinstance(e, dict)]
        bad = {e.get("index"): str(e.get("reason")) for e in errors}
        if not bad or None in bad:
            self.stats.rejected[bad.get(None, "http_400")] += len(items)
            return []
        self.stats.rejected.update(bad.values())
        rest = [item for i, item in enumerate(items) if i not in bad]
        return [rest] if rest else []


def _request_id(item: Any) -> str:
    """A request's id as the fleet remembers it (an item without one: its text, so the
    fleet still counts it once as an invalid request)."""
    found = item.get("id") if isinstance(item, dict) else None
    return found if isinstance(found, str) else json.dumps(item, sort_keys=True, default=str)


async def run_http_fleet(
    fleet: Fleet,
    url: str,
    stats: HttpStats,
    *,
    idle_seconds: float = 10.0,
    max_requests: int | None = None,
    poll_seconds: float = POLL_SECONDS,
    batch: int = MAX_ITEMS,
    flush_late: bool = True,
) -> FleetStats:
    """Answer the gateway's requests until ``max_requests`` were answered or none came for
    ``idle_seconds`` (module docstring); held-back (late) reports are posted before stopping
    unless ``flush_late`` is False. Returns the fleet's stats (``stats`` holds HTTP's).

    Each request's reports are posted while the fleet goes on with the next requests (a slow
    delivery delays no other request's reports); the fleet polls again once they are all
    answered, and never has more than ``CONCURRENT_POSTS`` posts in flight."""
    timeout = aiohttp.ClientTimeout(total=60.0, connect=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = GatewayClient(session, url, stats, batch=batch)
        seen: set[str] = set()
        answered, last_new = 0, time.monotonic()
        while max_requests is None or answered < max_requests:
            new = [(i, text) for i, text in await client.requests() if i not in seen]
            room = None if max_requests is None else max_requests - answered
            posts = []
            for request_id, text in new[:room]:
                seen.add(request_id)
                answered += 1
                posts.append(asyncio.create_task(_send(client, fleet, fleet.receive(text))))
                await asyncio.sleep(0)  # let the posts start while the next request is answered
            await asyncio.gather(*posts)
            if new:
                last_new = time.monotonic()
            elif time.monotonic() - last_new >= idle_seconds:
                break
            await asyncio.sleep(poll_seconds)
        if flush_late:
            await _send(client, fleet, fleet.flush())
    return fleet.stats


async def _send(client: GatewayClient, fleet: Fleet, messages: list[Message]) -> None:
    fleet.stats.messages += len(messages)
    await client.post([value for _key, value in messages])
