"""The input consumers' memory is bounded whatever the number of partitions (issue 27 item 12).

Catching up a backlog on 8 partitions peaked at 2,145 MiB, over the StatefulSet's 2 Gi limit:
each partition's consumer pre-fetched up to ``queued.min.messages=1000000`` messages. The
consumers now share ``CONSUMER_MEMORY``. The test fills 8 partitions with a backlog several
times that budget, opens the flow's 8 consumers in a fresh process (as ``KafkaEventSource``
does) without reading, lets librdkafka pre-fetch, and reads the peak resident set from /proc.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from confluent_kafka import Producer

from privstream.connectors.kafka import CONSUMER_MEMORY, KafkaSettings, TopicSpec, create_topics

from .conftest import cli_env

PARTITIONS, PER_PARTITION = 8, 200_000  # 1.6 M events of ~100 bytes: ~0.9 GB in librdkafka
BASELINE_ALLOWANCE = 96 * 2**20  # 8 consumers' threads and sockets, Python and imports

PREFETCH = """
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
from privstream.connectors.kafka import KafkaSettings, consumer_config

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

bootstrap, topic, partitions, old = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
settings = KafkaSettings((bootstrap,))
config = consumer_config(settings, partitions=partitions)
if old == "old":  # the configuration before the fix, to measure what it did
    config.update({"queued.min.messages": "1000000", "fetch.max.bytes": "52428800",
                   "max.partition.fetch.bytes": "10485760"})
    del config["queued.max.messages.kbytes"]
base = rss("VmRSS:")
consumers = []
for p in range(partitions):
    c = Consumer(config)
    c.assign([TopicPartition(topic, p, 0)])
    consumers.append(c)
c0 = consumers[0]
c0.poll(0.1)
deadline = time.monotonic() + 20
last, still = 0, 0
while time.monotonic() < deadline and still < 3:  # until the pre-fetch stops growing
    time.sleep(1.0)
    now = rss("VmRSS:")
    still = still + 1 if now - last < 2**20 else 0
    last = now
print(json.dumps({"base": base, "peak": rss("VmHWM:"), "config": {
    k: config[k] for k in ("queued.min.messages", "queued.max.messages.kbytes", "fetch.max.bytes")
    if k in config}}))
for c in consumers:
    c.close()
"""


def _backlog(kafka: KafkaSettings) -> str:
    topic = f"backlog-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [TopicSpec(topic, partitions=PARTITIONS)])
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 500000,
                         "compression.type": "none"})  # fmt: skip
    for i in range(PER_PARTITION):
        value = json.dumps({"stream": "visits", "user": f"u{i}", "slot": 1 + i // 10000,
                            "value": i % 2}).encode()  # fmt: skip
        for p in range(PARTITIONS):
            while True:
                try:
                    producer.produce(topic, value, partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0
    return topic


def prefetch_peak(kafka: KafkaSettings, topic: str, old: bool = False) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PREFETCH, kafka.bootstrap, topic, str(PARTITIONS),
         "old" if old else "new"],
        capture_output=True, text=True, timeout=120, env=cli_env(), check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_backlog_on_8_partitions_stays_within_the_consumer_budget(kafka: KafkaSettings) -> None:
    topic = _backlog(kafka)
    found = prefetch_peak(kafka, topic)
    grown = int(found["peak"]) - int(found["base"])  # type: ignore[call-overload]
    print(f"peak growth {grown / 2**20:.0f} MiB with {found['config']}")
    assert grown < CONSUMER_MEMORY + BASELINE_ALLOWANCE, found
