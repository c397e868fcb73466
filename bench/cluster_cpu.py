"""CPU-seconds per message of a flow-file run at several process counts (issue 26's metric).

    python bench/cluster_cpu.py [--trees DIR1,DIR2] [--processes 1,2] [--runs 3] [--streams 8]
                                [--partitions 8] [--users 20000] [--slots 20]

Produces ``streams`` synthetic streams over ``partitions`` partitions of one topic of an
embedded broker once (``privstream bench kafka --streams``' data and flow file), then runs
``privstream run --config F --processes P --slots T`` for every source tree (each on its own
``PYTHONPATH``: compare two versions of privstream on the same messages) and every P, ``runs``
rounds, alternating tree by tree inside each round. Each run's CPU is the user + system time of
the launcher and its processes (``RUSAGE_CHILDREN``, what ``/proc`` counts for them once they
are reaped); the broker is another process and is not counted. Prints one JSON line per run and
the medians per tree and P.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(tree: str, flow: Path, processes: int, slots: int, key: Path) -> dict[str, Any]:
    """One ``privstream run`` of ``flow`` from the source ``tree``: wall and CPU seconds."""
    env = dict(os.environ, PYTHONPATH=tree)
    cpu, wall = _cpu(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "privstream.cli.commands", "run", "--config", str(flow),
         "--processes", str(processes), "--slots", str(slots), "--secret-file", str(key)],
        capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"the flow failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"tree": tree, "processes": processes, "wall_s": wall, "cpu_s": cpu}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", default=".")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=20)
    args = parser.parse_args()
    from privstream.connectors.broker import EmbeddedBroker
    from privstream.connectors.kafka import KafkaSettings, TopicSpec, create_topics
    from privstream.experiments.scaling import _flow_file, produce_streams

    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    counts = [int(p) for p in args.processes.split(",")]
    runs: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as work:
        settings = KafkaSettings((broker.bootstrap,))
        topic = f"bench-events-{uuid.uuid4().hex[:8]}"
        create_topics(settings, [TopicSpec(topic, partitions=args.partitions)])
        per_partition = produce_streams(settings, topic, args.streams, args.users, args.slots,
                                        args.partitions)  # fmt: skip
        messages = sum(per_partition)
        key = Path(work) / "noise.key"
        key.write_text(secrets.token_hex(32))
        for _ in range(args.runs):
            for p in counts:
                for tree in trees:
                    flow = _flow_file(Path(work), settings, topic, args.streams, args.users)
                    run = run_once(tree, flow, p, args.slots, key)
                    run["cpu_us_per_message"] = run["cpu_s"] / messages * 1e6
                    print(json.dumps(run), flush=True)
                    runs.append(run)
    for tree in trees:
        for p in counts:
            mine = [r for r in runs if r["tree"] == tree and r["processes"] == p]
            cpu = statistics.median(r["cpu_s"] for r in mine)
            wall = statistics.median(r["wall_s"] for r in mine)
            print(f"{tree} P={p}: median CPU {cpu:.2f} s ({cpu / messages * 1e6:.2f} µs/msg), "
                  f"wall {wall:.2f} s over {len(mine)} runs of {messages:,} messages")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
