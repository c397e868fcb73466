"""The shuffle-model demo (``make demo-shuffle``, ``privstream demo-shuffle``): SaO2 on real
devices behind a shuffler, each party its own process, on the embedded default.

1. start the embedded Kafka-protocol broker (Tansu) on a free port; create the report (two
   partitions), task, shuffled, release, ledger and dead-letter topics;
2. start the server stage (``privstream run sao2 --trust ldp-shuffled``): it publishes one
   public task per horizon and reads only the shuffled topic; it alone holds the noise secret;
3. start the shuffler (``privstream shuffler``) with its own store and the clock key only;
4. play the devices (``Sao2Device`` of the device library, one per user, over a synthetic
   trajectory stream: a start cell and moves) and the clock: each slot, every device whose
   level's block ends reports, then a signed end-of-slot marker goes to every partition;
5. wait for the server to release every slot, read back releases, ledger and the shuffled
   manifests; run the same data in ``ldp-simulated`` mode in-process for comparison;
6. print the table (per slot: error against the truth in both modes, the stated standard error,
   the batch sizes) and the privacy line (local ε per horizon, ε_life, the stated central ε_c
   per level), the shuffler's throughput, and save releases, manifests, table and a plot.

Privacy of the outputs: releases, manifests (counts and sizes only) and aggregate numbers; no
report, device id or raw value leaves the devices' and the shuffler's processes.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privstream.cli.demo_reports import DemoFailed, Processes, child_env, say

STREAM = "cells"
TOPICS = ("reports", "tasks", "shuffled", "releases", "ledger", "dead-letters")


@dataclass(frozen=True)
class ShuffleParams:
    """The demo's size and budget: ``epsilon`` is each device's lifetime ε, spent over
    ``horizons`` horizons of ``window`` slots."""

    users: int = 4000
    cells: int = 6
    window: int = 8
    horizons: int = 2
    epsilon: float = 2.0
    changes: int = 4
    seed: int = 1

    @property
    def slots(self) -> int:
        return self.window * self.horizons


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "demo-shuffle",
        help="SaO2 behind a shuffler end to end: embedded broker, the ldp-shuffled server "
        "stage, privstream shuffler and devices of the device library; table and plot",
    )
    d = ShuffleParams()
    p.add_argument("--out", default="demo-shuffle-out", help="directory for outputs and logs")
    p.add_argument("--users", type=int, default=d.users, help="devices")
    p.add_argument("--cells", type=int, default=d.cells, help="one-hot cells d")
    p.add_argument("--window", type=int, default=d.window, help="the horizon T in slots")
    p.add_argument("--horizons", type=int, default=d.horizons, help="horizons (ε_life / ε)")
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="each device's lifetime ε")
    p.add_argument("--seed", type=int, default=d.seed, help="the synthetic data's seed")


def run(args: argparse.Namespace) -> int:
    p = ShuffleParams(args.users, args.cells, args.window, args.horizons, args.epsilon,
                      seed=args.seed)  # fmt: skip
    if min(p.users, p.window, p.horizons) < 1 or p.cells < 2 or not p.epsilon > 0:
        raise ValueError("--users, --window, --horizons >= 1, --cells >= 2, --epsilon > 0")
    try:
        return run_demo_shuffle(Path(args.out), p)
    except (DemoFailed, TimeoutError, subprocess.TimeoutExpired) as exc:
        print(f"privstream demo-shuffle: error: {exc}", file=sys.stderr)
        return 1


def _start(procs: Processes, bootstrap: str, out: Path, p: ShuffleParams) -> bytes:
    """Start the server (it alone gets the noise secret, in its environment: never stored) and
    the shuffler (its own store, the clock key only); the clock key."""
    from privstream.flows.secret import ENV_SECRET, resolve_noise_key

    secret = secrets.token_hex(32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "noise.key"
        path.write_text(secret + "\n")
        key = resolve_noise_key(secret_file=path).clock_key()
    kafka = ["--bootstrap", bootstrap]
    procs.start("server", ["run", "sao2", "--trust", "ldp-shuffled", "--stream", STREAM,
                           "--binary", str(p.cells), "--users", str(p.users), "--epsilon",
                           str(p.epsilon), "--horizons", str(p.horizons), "--window",
                           str(p.window), "--max-changes", str(p.changes), "--slots",
                           str(p.slots), "--no-progress", *kafka,
                           "--shuffled-topic", "shuffled", "--request-topic", "tasks",
                           "--output-topic", "releases", "--ledger-topic", "ledger",
                           "--dead-letter-topic", "dead-letters"],
                child_env(**{ENV_SECRET: secret}))  # fmt: skip
    procs.start("shuffler", ["shuffler", *kafka, "--report-topic", "reports", "--task-topic",
                             "tasks", "--shuffled-topic", "shuffled", "--store",
                             str(out / "shuffler-store"), "--idle-seconds", "8"],
                child_env(PRIVSTREAM_CLOCK_KEY=key.hex()))  # fmt: skip
    return key


def read(settings: Any, topic: str) -> list[Any]:
    from privstream.cli.demo_reports import read_topics

    return read_topics(settings, [topic])[topic]


def _tasks(settings: Any, procs: Processes, count: int, timeout: float = 90) -> list[Any]:
    from privstream.schema.shuffle import Sao2Task

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        found = [Sao2Task.from_obj(json.loads(m.value())) for m in read(settings, "tasks")]
        if len(found) >= count:
            return sorted(found, key=lambda t: t.horizon)
        time.sleep(0.5)
    raise DemoFailed("the server published no tasks; see logs/server.log")


@dataclass(frozen=True)
class Where:
    """Where the demo's parts talk: the cluster, and the clock key the demo's clock signs with."""

    kafka: Any
    clock_key: bytes


def play(settings: Where, tasks: list[Any], data: Any, p: ShuffleParams) -> tuple[int, float]:
    """The devices and the clock: every slot's reports, then its signed markers; the reports
    written and the seconds spent writing them."""
    from confluent_kafka import Producer

    from privstream.runtime.sao2_fleet import Sao2Fleet
    from privstream.schema.events import marker_tag

    key = settings.clock_key
    fleet = Sao2Fleet([f"d{u:06d}" for u in range(p.users)], seed=p.seed)
    producer = Producer(settings.kafka.client_config(**{"linger.ms": 5}))
    written, started = 0, time.perf_counter()
    for task in tasks:
        fleet.begin(task)
        for slot in range(task.first_slot, task.first_slot + task.T):
            for line in fleet.push(slot, data.values(slot)):
                device = json.loads(line)["device"]
                producer.produce("reports", line.encode(), partition=int(device[1:]) % 2)
                written += 1
            for part in (0, 1):
                marker = {"stream": STREAM, "end_of_slot": slot,
                          "tag": marker_tag(key, STREAM, slot)}  # fmt: skip
                producer.produce("reports", json.dumps(marker).encode(), partition=part)
    if producer.flush(120) > 0:
        raise DemoFailed("the broker did not confirm the reports")
    return written, time.perf_counter() - started


def run_demo_shuffle(out: Path, p: ShuffleParams) -> int:
    """Run the demo (steps 1 to 6 of the module docstring); its outputs in ``out``."""
    from privstream.connectors.broker import EmbeddedBroker
    from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics
    from privstream.connectors.sao2_synthetic import trajectory
    from privstream.mechanisms.sao2_task import BinaryTask

    out.mkdir(parents=True, exist_ok=True)
    say(f"privstream demo-shuffle: SaO2 behind a shuffler, {p.users:,} devices, d={p.cells} "
        f"cells, {p.horizons} horizons of T={p.window}, ε_life={p.epsilon:g}")  # fmt: skip
    started = time.perf_counter()
    data = trajectory(p.users, p.slots, p.seed, BinaryTask(p.cells))
    with EmbeddedBroker(log_path=out / "broker.log") as broker, Processes(out / "logs") as procs:
        settings = KafkaSettings((broker.bootstrap,))
        say(f"[1/6] embedded broker (Tansu) on {broker.bootstrap}; topics")
        create_topics(settings, [TopicSpec(n, 2 if n == "reports" else 1) for n in TOPICS])
        say("[2/6] server stage (ldp-shuffled) and [3/6] shuffler, each its own process")
        key = _start(procs, broker.bootstrap, out, p)
        tasks = _tasks(settings, procs, p.horizons)
        say(f"[4/6] {p.users:,} devices (privstream.client.sao2) and the clock, {p.slots} slots")
        begun = time.perf_counter()
        written, writing = play(Where(settings, key), tasks, data, p)
        say("[5/6] waiting for the server to release every slot")
        if procs.wait("server", 300) != 0:
            raise DemoFailed("the server stage failed; see logs/server.log")
        seconds = time.perf_counter() - begun
        procs.wait("shuffler", 120)
        topics = {t: read(settings, t) for t in ("releases", "ledger", "shuffled")}
    from privstream.cli.demo_shuffle_report import report

    say("[6/6] scoring against the truth and the ldp-simulated run of the same data")
    return report(out, p, data, topics, written, (writing, seconds), time.perf_counter() - started)


def params_dict(p: ShuffleParams) -> dict[str, Any]:
    return {**asdict(p), "slots": p.slots}
