"""CPU-seconds per message of a flow-file run at several process counts (issue 26's metric).

    python bench/cluster_cpu.py [--trees DIR1,DIR2] [--processes 1,2] [--runs 3] [--streams 8]
                                [--partitions 8] [--users 20000] [--slots 20] [--fixed-users 100]
                                [--hot SHARDS] [--hot-family personalized|ldp-ids]

Produces ``streams`` synthetic streams over ``partitions`` partitions of one topic of an
embedded broker once (``privstream bench kafka --streams``' data and flow file), then runs
``privstream run --config F --processes P --slots T`` for every source tree (each on its own
``PYTHONPATH``: compare two versions of privstream on the same messages) and every P, ``runs``
rounds, alternating tree by tree inside each round. Each run's CPU is the user + system time of
the launcher and its processes (``RUSAGE_CHILDREN``, what ``/proc`` counts for them once they
are reaped); the broker is another process and is not counted. The same runs over
``fixed_users`` users per stream measure the fixed part (interpreters, imports, the dataflow's
start and end: about 1.7 CPU-s at one process, 4.4 at two here), which is subtracted for the
CPU per message of the flow's work. Prints one JSON line per run and the medians per tree and
P. ``--hot K``: one hot personalized stream of ``users`` users instead (markers clock, a
registration table), run on one key and on ``K`` user shards from every tree (issue 26 item 2);
``--hot-family ldp-ids``: the hot stream is LDP-IDS's LBU over a closed population. Its fixed
part runs over the same registration table of ``users`` users (loading and checking it is a
start cost of every process, not a cost per message), with events of ``fixed_users`` of them.
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
    done = subprocess.run(  # (run in the tree: ``-m`` puts the working directory first)
        [sys.executable, "-m", "privstream.cli.commands", "run", "--config", str(flow),
         "--processes", str(processes), "--slots", str(slots), "--secret-file", str(key)],
        capture_output=True, text=True, timeout=1800, env=env, cwd=tree,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"the flow failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"tree": tree, "processes": processes, "wall_s": wall, "cpu_s": cpu}


def _check_tree(tree: str) -> None:
    """Refuse a tree whose ``privstream`` a run would not import (an installed one wins)."""
    code = "import privstream, sys; sys.stdout.write(privstream.__file__)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=tree), cwd=tree, check=True).stdout  # fmt: skip
    if not Path(found).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"a run in {tree} imports privstream from {found}, not from the tree")


def _topic(settings: Any, args: argparse.Namespace, users: int) -> tuple[str, int]:
    """A fresh topic holding the streams of ``users`` users each; (topic, messages)."""
    from privstream.connectors.kafka import TopicSpec, create_topics
    from privstream.experiments.scaling import produce_streams

    topic = f"bench-events-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [TopicSpec(topic, partitions=args.partitions)])
    per_partition = produce_streams(settings, topic, args.streams, users, args.slots,
                                    args.partitions)  # fmt: skip
    return topic, sum(per_partition)


def _hot_topic(settings: Any, args: argparse.Namespace, users: int, key: Path) -> tuple[str, int]:
    """A fresh topic holding one stream ``hot`` of ``users`` users, spread over the partitions,
    its markers tagged with ``key``'s clock key; (topic, messages)."""
    from privstream.connectors.datasets import synthetic_dataset
    from privstream.connectors.kafka import TopicSpec, create_topics
    from privstream.connectors.producer import produce_synthetic
    from privstream.mechanisms.seeding import NoiseKey

    topic = f"bench-hot-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [TopicSpec(topic, partitions=args.partitions)])
    clock = NoiseKey.from_text(key.read_text()).clock_key()
    events = produce_synthetic(settings, topic, synthetic_dataset("sin", users, args.slots, 1),
                               name="hot", spread=True, clock_key=clock)  # fmt: skip
    return topic, events


HOT = {
    "personalized": ('mechanisms = ["PBD"]\n', lambda u: f"{1.0 if u % 3 else 0.5},20"),
    "ldp-ids": ('mechanisms = ["LBU"]\nregistered_only = true\n', lambda u: "1.0,20"),
}
"""The hot stream's family: its table's lines and each user's registered (ε_i, w_i)."""


def _hot_flow(
    directory: Path,
    settings: Any,
    topic: str,
    users: int,
    shards: int | None,
    family: str = "personalized",
) -> Path:
    """A flow file of the one stream ``hot`` of ``family`` (on ``shards`` user shards, or one
    key) over the registration of its users, on the markers clock."""
    from privstream.connectors.kafka import RELEASE_TOPIC_CONFIG, TopicSpec, create_topics

    tag = uuid.uuid4().hex[:8]
    create_topics(settings, [TopicSpec(f"bench-releases-{tag}", config=RELEASE_TOPIC_CONFIG)])
    lines, requirement = HOT[family]
    table = directory / f"registrations-{family}-{users}.csv"
    if not table.exists():
        table.write_text("user,epsilon,window\n" + "".join(
            f"u{u},{requirement(u)}\n" for u in range(users)))  # fmt: skip
    path = directory / f"hot-{tag}.toml"
    path.write_text(
        f'[kafka]\nbootstrap = "{settings.bootstrap}"\ninput_topic = "{topic}"\n'
        f'output_topic = "bench-releases-{tag}"\n'
        f'[population]\nusers = {users}\nepsilon = 1.0\nwindow = 20\n'
        f'registrations = "{table}"\n'
        f'[[streams]]\nname = "hot"\nfamily = "{family}"\n{lines}'
        "domain = 2\nshare = 1.0\n" + ("" if shards is None else f"shards = {shards}\n")
    )  # fmt: skip
    return path


def _medians(runs: list[dict[str, Any]], tree: str, p: int, data: str) -> tuple[float, float]:
    mine = [r for r in runs if r["tree"] == tree and r["processes"] == p and r["data"] == data]
    return (statistics.median(r["cpu_s"] for r in mine),
            statistics.median(r["wall_s"] for r in mine))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", default=".")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=20)
    parser.add_argument(
        "--fixed-users",
        type=int,
        default=100,
        help="users per stream of the runs that measure the fixed part (0: none)",
    )
    parser.add_argument(
        "--hot",
        type=int,
        default=0,
        help="instead of the streams: one hot personalized stream, on one key and on this "
        "many user shards (each a 'tree' of the report)",
    )
    parser.add_argument("--hot-family", choices=sorted(HOT), default="personalized")
    args = parser.parse_args()
    from privstream.connectors.broker import EmbeddedBroker
    from privstream.connectors.kafka import KafkaSettings
    from privstream.experiments.scaling import _flow_file

    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    for tree in trees:
        _check_tree(tree)
    variants = [(t, None) for t in trees]
    if args.hot:
        variants = [(t, shards) for t in trees for shards in (None, args.hot)]
    counts = [int(p) for p in args.processes.split(",")]
    runs: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as work:
        settings = KafkaSettings((broker.bootstrap,))
        key = Path(work) / "noise.key"
        key.write_text(secrets.token_hex(32))

        def topic(users: int) -> tuple[str, int]:
            return _hot_topic(settings, args, users, key) if args.hot else _topic(
                settings, args, users)  # fmt: skip

        data = {"full": (args.users, *topic(args.users))}
        if args.fixed_users:
            data["fixed"] = (args.fixed_users, *topic(args.fixed_users))
        for _ in range(args.runs):
            for p in counts:
                for tree, shards in variants:
                    for name, (users, topic_name, messages) in data.items():
                        flow = (
                            _hot_flow(  # the whole table: its start cost is fixed
                                Path(work),
                                settings,
                                topic_name,
                                args.users,
                                shards,
                                args.hot_family,
                            )
                            if args.hot
                            else _flow_file(Path(work), settings, topic_name, args.streams, users)
                        )
                        run = run_once(tree, flow, p, args.slots, key)
                        run["tree"] = tree if shards is None else f"{tree} shards={shards}"
                        run.update(
                            data=name,
                            messages=messages,
                            cpu_us_per_message=run["cpu_s"] / messages * 1e6,
                        )
                        print(json.dumps(run), flush=True)
                        runs.append(run)
    _report(runs, sorted({r["tree"] for r in runs}), counts, data)
    return 0


def _report(runs: list[dict[str, Any]], trees: list[str], counts: list[int],
            data: dict[str, tuple[int, str, int]]) -> None:  # fmt: skip
    """Per tree and P: median CPU and wall; with the fixed part, the CPU per message of the
    difference (the flow's work on the messages the small runs lack) and its ratio to P = 1,
    both from the medians and paired round by round (``_paired``)."""
    full = data["full"][2]
    for tree in trees:
        base = None
        for p in counts:
            cpu, wall = _medians(runs, tree, p, "full")
            line = (f"{tree} P={p}: median CPU {cpu:.2f} s ({cpu / full * 1e6:.2f} µs/msg), "
                    f"wall {wall:.2f} s, {full:,} messages")  # fmt: skip
            if "fixed" in data:
                fixed, _ = _medians(runs, tree, p, "fixed")
                per = (cpu - fixed) / (full - data["fixed"][2]) * 1e6
                paired = _paired(runs, tree, p)
                base = (per, paired) if base is None else base
                line += (f"; fixed {fixed:.2f} s, {per:.2f} µs/msg without it "
                         f"({per / base[0]:.2f}×); paired by round {paired:.2f} µs/msg "
                         f"({paired / base[1]:.2f}×)")  # fmt: skip
            print(line)


def _paired(runs: list[dict[str, Any]], tree: str, p: int) -> float:
    """The median over rounds of each round's own CPU per message without the fixed part
    (its full run minus its fixed run): less swayed by one slow fixed run than the difference
    of the medians, which ``_report`` prints beside it."""
    mine = [r for r in runs if r["tree"] == tree and r["processes"] == p]
    full = [r for r in mine if r["data"] == "full"]
    fixed = [r for r in mine if r["data"] == "fixed"]
    return float(statistics.median(
        (a["cpu_s"] - b["cpu_s"]) / (a["messages"] - b["messages"]) * 1e6
        for a, b in zip(full, fixed, strict=True)
    ))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
