"""The shuffler's metrics (``runtime.shuffler_metrics``) as its alert rules read them
(deploy/prometheus/rules/privstream-shuffler.rules.yml): every message ``take`` refuses is
counted once under its dead letter's reason — forged markers and malformed JSON included, which
the rule on forged markers reads — accepted reports under ``reports``; and every batch policy
and known refusal reason is exported at 0 before anything happened, so that ``increase()`` sees
the first drop and a shuffler that never forwarded a batch has a batch series to alert on."""

from __future__ import annotations

import json

from prometheus_client import generate_latest

from privstream.runtime.shuffle_book import SHUFFLER_POLICIES, ShuffleBook
from privstream.runtime.shuffle_reports import ReportShuffleBook
from privstream.runtime.shuffler import Books, Poll, take
from privstream.runtime.shuffler_metrics import REFUSALS, ShufflerMetrics
from privstream.schema.events import marker_tag
from privstream.schema.shuffle import Sao2Report, Sao2Task

TASK = Sao2Task("cells", 0, 1, 4, 2, 3, 5, "onehot", 1.0, 2.0, (4, 3, 2), (0.4, 0.3, 0.3),
                "ab" * 16)  # fmt: skip
KEY = bytes(range(32))
REPORTS, TASKS = "reports", "tasks"


def sample(metrics: ShufflerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def marker(slot: int, key: bytes = KEY) -> bytes:
    return json.dumps({"stream": "cells", "end_of_slot": slot,
                       "tag": marker_tag(key, "cells", slot)}).encode()  # fmt: skip


def test_every_refusal_is_counted_under_its_dead_letters_reason() -> None:
    book = Books(ShuffleBook("s-1", 1, n_min=1), ReportShuffleBook("s-1", 1, n_min=1))
    book.sao2.add_task(TASK)
    metrics, out = ShufflerMetrics(), Poll([], [])
    devices = [f"dev-{i}" for i in range(40)]
    level0 = [d for d in devices if TASK.level_of(d) == 0]
    other = next(d for d in devices if TASK.level_of(d) != 0)
    good = [Sao2Report(TASK.id, "cells", 0, 0, 1, d, ((1, 1),)) for d in level0[:3]]
    wrong = Sao2Report(TASK.id, "cells", 0, 0, 1, other, ((1, 1),))  # not its level
    messages = [
        *(r.to_json().encode() for r in good),
        wrong.to_json().encode(),
        b"{not json",
        marker(1, key=bytes(32)),  # tagged with another key
        json.dumps({"stream": "cells", "end_of_slot": 1}).encode(),  # untagged
        b'{"type": "privstream.sao2.report", "version": 1}',  # the schema refuses it
        marker(1),  # authentic: closes level 0's block 1
    ]
    for value in messages:
        take(book, KEY, REPORTS, TASKS, 0, value, out, metrics)
    reasons = [reason for reason, _ in out.dead]
    schema_reason = reasons[-1]
    assert reasons == ["wrong_level", "malformed_json", "unauthenticated_marker",
                       "unauthenticated_marker", schema_reason]  # fmt: skip
    assert schema_reason not in REFUSALS  # a ProtocolError reason, counted all the same
    assert sample(metrics, "privstream_shuffler_reports_total") == 3
    expected = {reason: reasons.count(reason) for reason in (*REFUSALS, schema_reason)}
    counted = {r: sample(metrics, "privstream_shuffler_refused_total", reason=r) for r in expected}
    assert counted == expected
    (batch,) = out.batches
    assert (batch.level, batch.block, batch.n, batch.policy) == (0, 1, 3, "forward")


def test_every_policy_and_known_reason_is_exported_at_zero_from_the_start() -> None:
    metrics = ShufflerMetrics()
    for policy in ("forward", *SHUFFLER_POLICIES):
        assert sample(metrics, "privstream_shuffler_batches_total", policy=policy) == 0
    for reason in REFUSALS:
        assert sample(metrics, "privstream_shuffler_refused_total", reason=reason) == 0
    assert {"unauthenticated_marker", "malformed_json", "wrong_level"} <= set(REFUSALS)
    text = generate_latest(metrics.registry).decode()
    assert "dev-" not in text and "device" not in text
