"""``privstream devices`` over the embedded broker: requests written by hand to a request topic,
the fleet's reports read back from the report topic and judged by ``check_reports``."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from privstream.cli.commands import main
from privstream.cli.devices import READY
from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics, wait_for_messages
from privstream.runtime.fleet import LIES, run_fleet
from privstream.schema.protocol import Request
from tests.test_fleet import HONEST, _fleet, check_fleet_output, scenario


def _topics(kafka: KafkaSettings) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    requests, reports = f"requests-{tag}", f"reports-{tag}"
    create_topics(kafka, [TopicSpec(requests), TopicSpec(reports)])
    return requests, reports


def _write(kafka: KafkaSettings, topic: str, requests: list[Request]) -> None:
    producer = Producer(kafka.client_config())
    for request in requests:
        producer.produce(topic, value=request.to_json().encode())
    assert producer.flush(30) == 0


def _read(kafka: KafkaSettings, topic: str, count: int) -> list[tuple[str, str]]:
    got = wait_for_messages(kafka, topic, lambda m: len(m) >= count, timeout=60)
    assert len(got) == count
    return [(m.key().decode(), m.value().decode()) for m in got]


def test_the_fleet_answers_over_kafka_and_the_server_judges_its_reports(
    kafka: KafkaSettings,
) -> None:
    """One request at a time, as a server would: the fleet answers it, the server judges the
    new reports while that round is open, then closes it; late reports arrive after."""
    request_topic, report_topic = _topics(kafka)
    requests = scenario()
    fleet = _fleet(dropout=0.2, late=0.25)
    batches, read = [], 0
    for i, request in enumerate(requests):
        _write(kafka, request_topic, [request])
        last = i == len(requests) - 1
        run_fleet(fleet, kafka, request_topic, report_topic, idle_seconds=30, max_requests=1,
                  flush_late=False)  # fmt: skip
        if last:  # the last round's late reports: written when the fleet stops
            batch = _read(kafka, report_topic, fleet.stats.messages)[read:]
            batches.append(batch)
            read += len(batch)
            run_fleet(fleet, kafka, request_topic, report_topic, idle_seconds=1)
        batch = _read(kafka, report_topic, fleet.stats.messages)[read:]
        batches.append(batch)
        read += len(batch)
    assert len(batches) == len(requests) + 1
    dead, accepted = check_fleet_output(requests, batches)
    s = fleet.stats
    assert s.requests == 6 and s.late > 0 and s.dropped > 0
    assert sum(dead[f"sim-{u}"]["closed_round"] for u in range(HONEST)) == s.late
    assert sum(accepted[f"sim-{u}"] for u in range(HONEST)) == s.reports - s.late
    assert 0 < s.refused["exhausted"] < HONEST  # the ledgers refused the over-budget request
    assert set(s.lies) == set(LIES)


def test_privstream_devices_answers_every_request_and_prints_counts_only(
    kafka: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    request_topic, report_topic = _topics(kafka)
    requests = scenario()
    _write(kafka, request_topic, requests)
    code = main([
        "devices", "--bootstrap", kafka.bootstrap, "--request-topic", request_topic,
        "--report-topic", report_topic, "--users", "40", "--window", "3", "--liars", "8",
        "--flood", "8", "--max-requests", "6", "--idle-seconds", "30", "--slots", "10",
    ])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"{READY} 40 devices answer the requests of {request_topic!r}"
    assert "requests seen: 6" in err and "exhausted: 32" in err and "sim-" not in err
    written = int(err.rsplit("messages written: ", 1)[1].split()[0])
    reports = _read(kafka, report_topic, written)
    keys = Counter(key for key, _ in reports)
    assert len(keys) == 40 and all(key.startswith("sim-") for key in keys)
