"""librdkafka's log lines are rate-limited (issue 27 item 13): a broker outage wrote about
15,000 lines in 2 minutes (8 consumers and a producer, each logging every reconnect)."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from privstream.connectors.kafka_log import KAFKA_LOG, KafkaLog

ROOT = Path(__file__).resolve().parents[2]
OUTAGE = """
import logging, sys, time
from confluent_kafka import Consumer, TopicPartition
from privstream.connectors.broker import free_port
from privstream.connectors.kafka import KafkaSettings, consumer_config
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
config = consumer_config(KafkaSettings((f"127.0.0.1:{free_port()}",)), partitions=8)  # nobody
if sys.argv[1] == "raw":
    del config["logger"]  # what every client did before
consumers = [Consumer(dict(config)) for _ in range(8)]
for c in consumers:
    c.assign([TopicPartition("events", 0, 0)])
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for c in consumers:
        c.consume(100, 0.01)
"""


def _stderr_lines(mode: str, seconds: float) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", OUTAGE, mode, str(seconds)], capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    return done.stderr.splitlines()


def test_an_outage_writes_a_bounded_number_of_log_lines() -> None:
    """8 consumers without a broker for 4 s: every reconnect of every client was a line (about
    600 here, 15,000 in a 2-minute outage); now at most BURST per kind per minute."""
    raw = _stderr_lines("raw", 4)
    limited = _stderr_lines("limited", 4)
    assert len(raw) > 200  # the reproduction: hundreds of lines in seconds
    assert 1 <= len(limited) <= 3 * KAFKA_LOG.burst, limited
    assert all("privstream.kafka.librdkafka" in line for line in limited)


def test_suppressed_lines_are_counted_when_the_window_ends(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("privstream.connectors.kafka_log.time.monotonic", lambda: clock[0])
    limiter = KafkaLog(burst=2, window=10.0)
    with caplog.at_level(logging.INFO, "privstream.kafka.librdkafka"):
        for _ in range(7):
            limiter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
        limiter.log(logging.INFO, "%s [%s] %s", "CONF", "rdkafka#consumer-1", "other kind")
        clock[0] = 10.0
        limiter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "FAIL [rdkafka#consumer-1] refused",
        "FAIL [rdkafka#consumer-1] refused",
        "CONF [rdkafka#consumer-1] other kind",
        "(5 more librdkafka FAIL lines left out)",
        "FAIL [rdkafka#consumer-1] refused",
    ]


def test_a_configuration_with_the_logger_pickles_to_the_shared_one() -> None:
    assert pickle.loads(pickle.dumps({"logger": KAFKA_LOG}))["logger"] is KAFKA_LOG
