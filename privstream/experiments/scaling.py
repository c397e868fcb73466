"""``privstream bench kafka --streams S --processes 1,2,4``: how a flow file's run scales with
Bytewax processes, against raw consumers with the same parallelism (design §8).

One topic of ``partitions`` partitions holds ``streams`` synthetic streams of ``users × slots``
events each, spread round-robin over all partitions (every slot's end-of-slot marker on every
partition). For each process count P, in one run on one broker:

* **flow** — ``privstream run --config F --processes P --slots T`` over a flow file with the S
  streams (LPA, d = 2, equal shares), its noise from a fresh secret; timed by the processes
  themselves from the dataflow's start to its end (the slowest process), so the interpreter's
  start is not counted;
* **raw** — P processes, each a plain ``confluent-kafka`` consumer with the flow's consumer
  configuration reading its share of the partitions (the flow spreads partitions over its
  workers the same way), timed from the consumers' creation to the last message.

Rates count messages (markers included). The result has, per P, both rates, their ratio
(flow ÷ raw), and each reader's scaling against P = 1.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    consumer_config,
    create_topics,
)

SLOT_FLOW = re.compile(r"streams to topic \S+ in ([0-9.]+) s")


def _consume(args: tuple[dict[str, Any], str, list[int], int, Any]) -> None:
    """One raw reader: its partitions from the beginning until ``expected`` messages."""
    config, topic, partitions, expected, queue = args
    started = time.perf_counter()
    consumer = Consumer(config)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    count = 0
    while count < expected:
        for message in consumer.consume(5000, 0.01):
            if message.error() is None:
                message.value()
                count += 1
    queue.put(time.perf_counter() - started)
    consumer.close()


def raw_rate(settings: KafkaSettings, topic: str, counts: Sequence[int], processes: int) -> float:
    """Messages per second of ``processes`` raw readers splitting the partitions round-robin."""
    config = consumer_config(settings, tail=True, partitions=len(counts))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    shares = [list(range(i, len(counts), processes)) for i in range(processes)]
    jobs = [
        context.Process(
            target=_consume, args=((config, topic, part, sum(counts[p] for p in part), queue),)
        )
        for part in shares
        if part
    ]
    for job in jobs:
        job.start()
    seconds = max(float(queue.get(timeout=600)) for _ in jobs)
    for job in jobs:
        job.join(timeout=30)
    return sum(counts) / seconds


def _flow_file(directory: Path, settings: KafkaSettings, topic: str, streams: int,
               users: int) -> Path:  # fmt: skip
    tag = uuid.uuid4().hex[:8]
    releases = f"bench-releases-{tag}"
    create_topics(settings, [TopicSpec(releases, config=RELEASE_TOPIC_CONFIG)])
    share = f"{1 / streams:.6f}"
    path = directory / f"flow-{tag}.toml"
    path.write_text(
        f'[kafka]\nbootstrap = "{settings.bootstrap}"\ninput_topic = "{topic}"\n'
        f'output_topic = "{releases}"\n'
        # the benchmark writes every message of the topic itself: its events may drive the clock
        'clock = "data"\ntrust_input_clock = true\n'
        f'[population]\nusers = {users}\nepsilon = 1.0\n'
        "window = 20\n" + "".join(
            f'[[streams]]\nname = "s{k}"\nfamily = "ldp-ids"\nmechanisms = ["LPA"]\n'
            f"domain = 2\nshare = {share}\n" for k in range(streams)
        )
    )  # fmt: skip
    return path


def flow_rate(flow: Path, processes: int, slots: int, messages: int, key: Path) -> float:
    """Messages per second of ``privstream run --config flow --processes P --slots T``."""
    done = subprocess.run(
        [sys.executable, "-m", "privstream.cli.commands", "run", "--config", str(flow), "--processes",
         str(processes), "--slots", str(slots), "--secret-file", str(key)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the flow failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds = [float(s) for s in SLOT_FLOW.findall(done.stderr)]
    if len(seconds) != processes:
        raise RuntimeError(f"expected {processes} timings, got:\n{done.stderr[-2000:]}")
    return messages / max(seconds)


def produce_streams(settings: KafkaSettings, topic: str, streams: int, users: int,
                    slots: int, partitions: int) -> list[int]:  # fmt: skip
    """Produce the streams spread over the topic; the messages per partition (each stream's
    events round-robin from partition 0, its markers on every partition)."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.connectors.producer import produce_synthetic
    from privstream.experiments.kafka import partition_counts

    for k in range(streams):
        produce_synthetic(settings, topic, synthetic_dataset("sin", users, slots, k + 1),
                          name=f"s{k}", spread=True)  # fmt: skip
    return [streams * count for count in partition_counts(users, slots, partitions)]


def bench_scaling(
    settings: KafkaSettings,
    *,
    partitions: int,
    streams: int,
    processes: Sequence[int],
    users: int,
    slots: int,
) -> dict[str, Any]:
    """The scaling table (see the module docstring)."""
    topic = f"bench-events-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [TopicSpec(topic, partitions=partitions)])
    counts = produce_streams(settings, topic, streams, users, slots, partitions)
    rows = []
    with tempfile.TemporaryDirectory(prefix="privstream-scaling-") as work:
        key = Path(work) / "noise.key"
        key.write_text(secrets.token_hex(32))
        for p in processes:
            flow = _flow_file(Path(work), settings, topic, streams, users)
            rows.append({"processes": p, "flow": flow_rate(flow, p, slots, sum(counts), key),
                         "raw": raw_rate(settings, topic, counts, p)})  # fmt: skip
    for row in rows:
        row["ratio"] = row["flow"] / row["raw"]
        row["flow_scaling"] = row["flow"] / rows[0]["flow"]
        row["raw_scaling"] = row["raw"] / rows[0]["raw"]
    return {"partitions": partitions, "streams": streams, "users": users, "slots": slots,
            "messages": sum(counts), "rows": rows}  # fmt: skip


def format_scaling(result: dict[str, Any]) -> str:
    """The table ``privstream bench kafka --processes`` prints."""
    lines = [
        f"{result['streams']} streams × {result['users']:,} users × {result['slots']} slots over "
        f"{result['partitions']} partitions ({result['messages']:,} messages)",
        "processes  flow msg/s  raw msg/s  flow/raw  flow scaling  raw scaling",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['processes']:>9}  {r['flow']:>10,.0f}  {r['raw']:>9,.0f}  {r['ratio']:>8.2f}"
            f"  {r['flow_scaling']:>12.2f}  {r['raw_scaling']:>11.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - ad-hoc runs
    """``python -m privstream.experiments.scaling BOOTSTRAP`` (an existing broker)."""
    args = list(sys.argv[1:] if argv is None else argv)
    settings = KafkaSettings((args[0],))
    result = bench_scaling(settings, partitions=8, streams=8, processes=(1, 2),
                           users=20_000, slots=20)  # fmt: skip
    print(format_scaling(result))
    print(json.dumps(result))
    return 0
