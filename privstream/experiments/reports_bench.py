"""``privstream bench reports``: the throughput of ``ldp-reports`` mode (issue 23), measured as
ratios in one run on one machine.

1. **Server stage.** One round of ``n`` reports through the server stage's own logic
   (``operators.report_rounds.ReportRoundsLogic``, one LBU stream over ``n`` devices, the oracle
   forced to GRR, OUE or OLH): the opening marker (the step asks), the reports decoded from
   their bytes (``schema.report_wire.decode_poll``: runs as columns) in polls of 5,000 and
   checked (``operators.report_columns.take_columns``), then the closing marker (the round's aggregate, the step and the
   release). Against it, the same ``n`` raw events of the ``ldp-simulated`` path through the
   slotted operator (``parse_raw_batch`` per poll, ``SlottedLogic.on_batch``, the slot's LBU
   step at its end-of-slot marker): the cheapest comparable ingest. One warm-up slot each
   (devices' first reports, users' enrolment), then ``slots`` timed slots; medians.
2. **Through Kafka.** ``n`` reports and the round's closing marker written to a fresh report
   topic on the broker (the gateway's producer configuration, keyed by stream), then read back
   by the server stage's source (``KafkaEventSource``, its partition polled in a loop as a
   worker polls it), decoded and fed to the server stage until the round's release; beside it
   a plain consumer of the source's configuration reading the same messages.
3. **Gateway.** ``privstream gateway`` as its own process between a request topic (one open
   request) and a report topic; a concurrent ``aiohttp`` client in this process POSTs reports,
   one per POST and ``batch`` per POST, over ``connections`` connections. Every report must
   come back accepted (202) and be on the report topic.
4. **Fleet.** ``Fleet.receive`` (``runtime.fleet``) over requests of consecutive slots, GRR, OUE,
   OLH and HM, every device answering through the device library with the OS CSPRNG: devices
   answered per second on this one thread, with the device ledgers in memory and in
   ``FileStore`` files (one per device, fsynced on every answer) in a temporary folder.

Rates count reports (sections 1–3, markers excluded) and devices (section 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from importlib import util
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from privstream.client import FileStore
from privstream.connectors.broker import EmbeddedBroker, free_port
from privstream.connectors.datasets import synthetic_dataset
from privstream.connectors.kafka import (
    KafkaEventSource,
    KafkaSettings,
    RawBatch,
    TopicSpec,
    consumer_config,
    create_topics,
    parse_raw_batch,
)
from privstream.connectors.kafka_sink import producer_config
from privstream.connectors.producer import slot_messages
from privstream.experiments.kafka import read_raw
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.metrics import BOARD
from privstream.operators.report_rounds import ReportRoundsLogic, ReportsPlan
from privstream.operators.slotting import SlottedLogic, SlottingConfig, make_plan
from privstream.runtime.fleet import Fleet, FleetConfig
from privstream.schema.events import EventBatch
from privstream.schema.protocol import (
    OLH_PRIME,
    Close,
    OracleSpec,
    ProtocolError,
    Report,
    Request,
    olh_g,
)
from privstream.schema.report_wire import decode_poll

ORACLES: Final = ("GRR", "OUE", "OLH")
TASK_ORACLE: Final[dict[str, Literal["grr", "oue", "olh"]]] = {
    "GRR": "grr", "OUE": "oue", "OLH": "olh",
}  # fmt: skip
FLEET_ORACLES: Final = ("GRR", "OUE", "OLH", "HM")
EPSILON: Final = 1.0
WINDOW: Final = 20
D: Final = 2  # the Sin stream's categories
POLL: Final = 5000  # messages per poll, as the flows' Kafka source
STREAM: Final = "sin"
MECHANISM: Final = "LBU"  # budget division: every device is asked, every slot
READ_TIMEOUT: Final = 600.0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _key() -> NoiseKey:
    """A fresh random secret: the benchmark's releases are never meant to be reproduced."""
    return NoiseKey.from_text(secrets.token_hex(32), origin="the benchmark's random secret")


# --- 1. the server stage against the slotted operator ----------------------------------------


def reports_logic(n: int, oracle: str, key: NoiseKey) -> ReportRoundsLogic:
    """The server stage of one LBU stream over ``n`` devices whose task selects ``oracle``."""
    task = FrequencyTask(D, oracle=TASK_ORACLE[oracle])
    config = LDP_IDS.make_config(epsilon=EPSILON, window=WINDOW, population=n, task=task)
    plan = make_plan("bench", [LDP_IDS.build(MECHANISM, config)], task, n, key)
    return ReportRoundsLogic("bench", ReportsPlan.of(plan, partitions=1), None)


def wire_values(request: Request, n: int, rng: np.random.Generator) -> list[Any]:
    """``n`` values of the shape ``request``'s oracle sends (uniform: only their shape and
    size matter to the server's work)."""
    name, d = request.oracle.name, request.oracle.d
    if name == "GRR":
        return [int(v) for v in rng.integers(0, d, n)]
    if name == "OUE":
        return ["".join(map(str, bits)) for bits in rng.integers(0, 2, (n, d)).tolist()]
    g = olh_g(request.epsilon)
    cols = (rng.integers(1, OLH_PRIME, n), rng.integers(0, OLH_PRIME, n), rng.integers(0, g, n))
    return [list(abc) for abc in zip(*(c.tolist() for c in cols), strict=True)]


def report_lines(request: Request, n: int, rng: np.random.Generator) -> list[bytes]:
    """Devices ``sim-0 … sim-(n−1)``'s reports to ``request``, as the report topic holds them."""
    values = wire_values(request, n, rng)
    return [
        Report.answering(request, f"sim-{i}", v).to_json().encode() for i, v in enumerate(values)
    ]


def feed(logic: ReportRoundsLogic, partition: int, lines: list[bytes]) -> list[tuple[str, Any]]:
    """One poll of report-topic messages into the server stage (a message the protocol
    refuses would be a dead letter of the flow's parser: none is expected here)."""
    decoded = [item for _, item in decode_poll(lines)]
    bad = [m for m in decoded if isinstance(m, ProtocolError)]
    if bad:
        raise RuntimeError(f"the benchmark's own reports were refused: {bad[0].reason}")
    out, _ = logic.on_batch([(partition, m) for m in decoded])  # type: ignore[misc]
    emitted: list[tuple[str, Any]] = list(out)
    return emitted


def _open(logic: ReportRoundsLogic, clock_key: bytes, t: int) -> tuple[Request, float, float]:
    """Open slot ``t``: its one request, and the seconds and thread CPU seconds it took."""
    started, cpu = time.perf_counter(), time.thread_time()
    out, _ = logic.on_batch([(0, Close(STREAM, t, 0).signed(clock_key))])
    seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    requests = [item for kind, item in out if kind == "request"]
    if len(requests) != 1:
        raise RuntimeError(f"slot {t} asked {len(requests)} requests, expected 1")
    return requests[0], seconds, cpu


def reports_slot(logic: ReportRoundsLogic, key: NoiseKey, t: int, n: int) -> dict[str, Any]:
    """One round of ``n`` reports through the server stage (module docstring, 1.); seconds
    of its parts and thread CPU seconds in all (report generation excluded)."""
    clock_key = key.clock_key()
    request, open_s, open_cpu = _open(logic, clock_key, t)
    lines = report_lines(request, n, np.random.default_rng(t))
    close = Close(STREAM, t, request.round).signed(clock_key).to_json().encode()
    started, cpu, dead = time.perf_counter(), time.thread_time(), 0
    for k in range(0, n, POLL):
        dead += sum(kind == "dead_letter" for kind, _ in feed(logic, 0, lines[k : k + POLL]))
    mid = time.perf_counter()
    out = feed(logic, 0, [close])
    done, cpu = time.perf_counter(), open_cpu + time.thread_time() - cpu
    released = sum(kind == "release" for kind, _ in out)
    if dead or released != 1:
        raise RuntimeError(f"slot {t}: {dead} dead letters and {released} releases")
    total = open_s + done - started
    return {"seconds": total, "open_s": open_s, "reports_s": mid - started, "close_s": done - mid,
            "cpu_s": cpu, "reports_per_second": n / total}  # fmt: skip


def events_logic(n: int, key: NoiseKey) -> SlottedLogic:
    """The slotted operator of one LBU stream over ``n`` users of the Sin stream."""
    task = FrequencyTask(D)
    config = LDP_IDS.make_config(epsilon=EPSILON, window=WINDOW, population=n, task=task)
    plan = make_plan("bench", [LDP_IDS.build(MECHANISM, config)], task, n, key,
                     SlottingConfig(close_on_eof=False))  # fmt: skip
    return SlottedLogic("bench", plan, None)


def events_slot(logic: SlottedLogic, source: Any, t: int, offset: int) -> dict[str, Any]:
    """Slot ``t``'s ``n`` raw events and its end-of-slot marker through the slotted operator,
    in polls of ``POLL`` (message generation excluded)."""
    messages = slot_messages(source, STREAM, t)
    parse = 0.0
    started, cpu = time.perf_counter(), time.thread_time()
    for k in range(0, len(messages), POLL):
        poll = messages[k : k + POLL]
        t0 = time.perf_counter()
        parsed = parse_raw_batch(RawBatch("bench", 0, offset + k, poll), streams=[STREAM])
        parse += time.perf_counter() - t0
        if not all(isinstance(item, EventBatch) for item in parsed):
            raise RuntimeError("the benchmark's own events produced dead letters")
        logic.on_batch(parsed)  # type: ignore[arg-type]
    total, cpu = time.perf_counter() - started, time.thread_time() - cpu
    n = len(messages) - 1
    return {"seconds": total, "parse_s": parse, "slotting_s": total - parse, "cpu_s": cpu,
            "events_per_second": n / total}  # fmt: skip


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def server_stage(n: int, slots: int) -> dict[str, Any]:
    """Section 1 at ``n`` devices: the raw events' rate, then each oracle's reports' rate and
    its ratio to the events' (medians of ``slots`` timed slots after one warm-up slot), by
    wall time and by thread CPU time (steadier on a shared machine)."""
    key = _key()
    source = synthetic_dataset("sin", n, slots + 1, 1)
    events = events_logic(n, key)
    runs = [events_slot(events, source, t, (t - 1) * (n + 1)) for t in range(1, slots + 2)]
    out: dict[str, Any] = {"n": n, "events": {"runs": runs[1:], **_medians(runs[1:])}}
    for oracle in ORACLES:
        logic = reports_logic(n, oracle, key)
        runs = [reports_slot(logic, key, t, n) for t in range(1, slots + 2)]
        row: dict[str, Any] = {"runs": runs[1:], **_medians(runs[1:])}
        row["ratio_to_events"] = row["reports_per_second"] / out["events"]["events_per_second"]
        row["cpu_ratio_to_events"] = out["events"]["cpu_s"] / row["cpu_s"]  # same n
        row["us_per_report"] = {k.removesuffix("_s"): 1e6 * row[k] / n
                                for k in ("open_s", "reports_s", "close_s", "seconds", "cpu_s")}  # fmt: skip
        out[oracle] = row
    BOARD.clear()
    return out


# --- 2. through Kafka --------------------------------------------------------------------------


def _topic(settings: KafkaSettings, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [TopicSpec(name)])
    return name


def write_reports(settings: KafkaSettings, topic: str, lines: list[bytes]) -> float:
    """Write ``lines`` to ``topic`` with the gateway's producer configuration (idempotent,
    acks=all), keyed by the stream as the gateway keys them; seconds until all delivered."""
    from confluent_kafka import Producer

    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(producer_config(settings))
    key = STREAM.encode()
    started = time.perf_counter()
    for line in lines:
        while True:
            try:
                producer.produce(topic, line, key, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) or failures:
        raise RuntimeError(f"reports not delivered to {topic}: {failures[:1]}")
    return time.perf_counter() - started


def read_into_stage(
    settings: KafkaSettings, topic: str, logic: ReportRoundsLogic, expected: int
) -> dict[str, Any]:
    """The server stage's source (``KafkaEventSource``, one partition) polled in a loop, each
    poll decoded into the stage, until it releases the round; seconds (and until the first
    poll with messages: the consumer's start) and thread CPU."""
    started, cpu = time.perf_counter(), time.thread_time()
    source = KafkaEventSource(settings, topic, batch_size=POLL)
    source.list_parts()
    part = source.build_part("bench", "partition-0", None)
    read = released = 0
    first = None
    try:
        while not released:
            if time.perf_counter() - started > READ_TIMEOUT:
                raise TimeoutError(f"the server stage read {read} of {expected} messages")
            for raw in part.next_batch():
                first = first or time.perf_counter() - started
                read += len(raw.values)
                out = feed(logic, raw.partition, raw.values)
                released += sum(kind == "release" for kind, _ in out)
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    finally:
        part.close()
    if read != expected:
        raise RuntimeError(f"the server stage read {read} messages, expected {expected}")
    return {"seconds": seconds, "first_s": first, "cpu_seconds": cpu, "messages": read}


def kafka_round(settings: KafkaSettings, n: int) -> dict[str, Any]:
    """One round of ``n`` reports written to a fresh report topic, read by a plain consumer
    and by the server stage's source into the stage (module docstring, 2.)."""
    key = _key()
    logic = reports_logic(n, "GRR", key)
    request, _, _ = _open(logic, key.clock_key(), 1)
    lines = report_lines(request, n, np.random.default_rng(1))
    lines.append(Close(STREAM, 1, request.round).signed(key.clock_key()).to_json().encode())
    topic = _topic(settings, "bench-reports")
    write = write_reports(settings, topic, lines)
    raw = read_raw(consumer_config(settings), topic, [len(lines)], POLL)
    stage = read_into_stage(settings, topic, logic, len(lines))
    BOARD.clear()
    return {"write_s": write, "raw_read_s": raw["seconds"], "raw_cpu_s": raw["cpu_seconds"],
            "stage_s": stage["seconds"], "stage_first_s": stage["first_s"],
            "stage_cpu_s": stage["cpu_seconds"], "write_per_second": n / write,
            "raw_read_per_second": n / raw["seconds"], "stage_per_second": n / stage["seconds"],
            "stage_after_first_per_second": n / (stage["seconds"] - stage["first_s"])}  # fmt: skip


def through_kafka(settings: KafkaSettings, n: int, repeats: int) -> dict[str, Any]:
    """Section 2: ``repeats`` rounds of ``n`` GRR reports, each on its own topic; medians."""
    runs = []
    for i in range(1, repeats + 1):
        runs.append(kafka_round(settings, n))
        r = runs[-1]
        _log(f"  kafka {i}/{repeats}: write {r['write_per_second']:,.0f}/s, plain read "
             f"{r['raw_read_per_second']:,.0f}/s, server stage {r['stage_per_second']:,.0f}/s")  # fmt: skip
    return {"n": n, "oracle": "GRR", "runs": runs, **_medians(runs)}


# --- 3. the gateway ----------------------------------------------------------------------------


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far (Linux ``/proc``; else None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


@contextlib.contextmanager
def gateway_process(
    settings: KafkaSettings, request_topic: str, report_topic: str
) -> Iterator[tuple[str, int]]:
    """``privstream gateway`` as its own process on a free port, once it serves the request
    topic's one request: its base URL and process id. Stopped with SIGINT as an operator would."""
    port = free_port()
    cmd = [sys.executable, "-m", "privstream.cli", "gateway", "--bootstrap", settings.bootstrap,
           "--request-topic", request_topic, "--report-topic", report_topic,
           "--port", str(port)]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors, text=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(OSError, ValueError):
                    if _get_json(f"{base}/healthz")["open_requests"] == 1:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    raise RuntimeError(f"the gateway did not serve: {errors.read()[-2000:]}")
                time.sleep(0.2)
            yield base, proc.pid
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _post_all(url: str, bodies: list[bytes], connections: int) -> dict[str, Any]:
    """POST every body over ``connections`` connections (as many workers, each taking the
    next body when its answer came); each must be 202. Seconds, accepted, latencies."""
    import aiohttp

    pending = iter(bodies)
    latencies: list[float] = []
    accepted = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal accepted
        for body in pending:
            sent = time.perf_counter()
            async with session.post(url, data=body) as answer:
                got = await answer.json()
                if answer.status != 202:
                    raise RuntimeError(f"the gateway answered {answer.status}: {got}")
            latencies.append(time.perf_counter() - sent)
            accepted += got["accepted"]

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        started, cpu = time.perf_counter(), time.thread_time()
        await asyncio.gather(*(worker(session) for _ in range(connections)))
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
    ms = 1000 * np.asarray(latencies)
    return {"seconds": seconds, "client_cpu_s": cpu, "posts": len(bodies), "accepted": accepted,
            "latency_ms_p50": float(np.median(ms)),
            "latency_ms_p99": float(np.percentile(ms, 99))}  # fmt: skip


def gateway_bodies(request: Request, n: int, batch: int, prefix: str) -> list[bytes]:
    """``n`` reports of devices ``<prefix>-i`` to ``request``, ``batch`` per POST body (one
    report: the object itself; several: a JSON array)."""
    rng = np.random.default_rng(len(prefix) + n)
    values = wire_values(request, n, rng)
    items = [Report.answering(request, f"{prefix}-{i}", v).to_json() for i, v in enumerate(values)]
    if batch == 1:
        return [item.encode() for item in items]
    return [("[" + ",".join(items[k : k + batch]) + "]").encode() for k in range(0, n, batch)]


def through_gateway(
    settings: KafkaSettings, modes: list[tuple[int, int]], connections: int
) -> dict[str, Any]:
    """Section 3: for each ``(reports, per POST)`` of ``modes``, POST them through one
    ``privstream gateway`` process; every report must be accepted and reach the report topic."""
    request = Request(STREAM, 1, 1, f"{MECHANISM}.m1", OracleSpec("GRR", D), EPSILON / WINDOW,
                      WINDOW)  # fmt: skip
    requests, reports = _topic(settings, "bench-requests"), _topic(settings, "bench-reports")
    write_reports(settings, requests, [request.to_json().encode()])
    out: dict[str, Any] = {"connections": connections, "modes": []}
    total = 0
    with gateway_process(settings, requests, reports) as (base, pid):
        for i, (n, batch) in enumerate(modes):
            bodies = gateway_bodies(request, n, batch, f"gw{i}")
            cpu0 = _proc_cpu(pid)
            run = asyncio.run(_post_all(f"{base}/v1/reports", bodies, connections))
            cpu1 = _proc_cpu(pid)
            if run["accepted"] != n:
                raise RuntimeError(f"the gateway accepted {run['accepted']} of {n} reports")
            total += n
            gateway_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
            out["modes"].append({"reports": n, "per_post": batch, **run,
                                 "gateway_cpu_s": gateway_cpu,
                                 "reports_per_second": n / run["seconds"],
                                 "posts_per_second": run["posts"] / run["seconds"]})  # fmt: skip
            _log(f"  gateway, {batch} per POST: {n / run['seconds']:,.0f} reports/s")
        counts = _get_json(f"{base}/healthz")["counts"]
    on_topic = read_raw(consumer_config(settings), reports, [total], POLL)["messages"]
    if counts.get("accepted") != total or on_topic != total:
        raise RuntimeError(
            f"sent {total}; the gateway counted {counts}, the topic holds {on_topic}"
        )
    out["accepted"], out["on_topic"] = counts["accepted"], on_topic
    return out


# --- 4. the fleet ------------------------------------------------------------------------------


def fleet_rate(n: int, oracle: str, store_dir: Path | None, requests: int) -> dict[str, Any]:
    """``n`` devices answering ``requests`` requests (consecutive slots, one each) through
    ``Fleet.receive``: devices per second and thread CPU per device; building excluded."""
    source = synthetic_dataset("sin", n, requests, 1)
    started = time.perf_counter()
    fleet = Fleet(FleetConfig(n, EPSILON, WINDOW, store_dir=store_dir), source)
    build = time.perf_counter() - started
    spec = OracleSpec(oracle, 1 if oracle == "HM" else D)
    seconds = cpu = 0.0
    answered = 0
    for t in range(1, requests + 1):
        line = Request(STREAM, t, 1, f"{MECHANISM}.m1", spec, EPSILON / WINDOW, WINDOW).to_json()
        t0, c0 = time.perf_counter(), time.thread_time()
        answered += len(fleet.receive(line))
        seconds, cpu = seconds + time.perf_counter() - t0, cpu + time.thread_time() - c0
    if answered != n * requests:
        raise RuntimeError(f"{answered} reports from {n} devices × {requests} requests")
    return {"devices": n, "requests": requests, "build_s": build, "seconds": seconds,
            "cpu_seconds": cpu, "devices_per_second": answered / seconds,
            "cpu_us_per_device": 1e6 * cpu / answered}  # fmt: skip


def store_save_ms(folder: Path, saves: int = 50) -> float:
    """Median milliseconds of one ``FileStore.save`` of a small ledger in ``folder`` (write,
    fsync, rename, fsync of the folder): the disk's durable-write latency a device pays."""
    store = FileStore(folder / "probe.json", create=True)
    times = []
    for k in range(saves):
        started = time.perf_counter()
        store.save({"probe": k})
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def fleet(memory_devices: int, file_devices: int, requests: int) -> dict[str, Any]:
    """Section 4: every oracle with the ledgers in memory, then in ``FileStore`` files (with
    the folder's durable-write latency, measured before each)."""
    out: dict[str, Any] = {"memory": {}, "file": {}, "store_save_ms": {}}
    for oracle in FLEET_ORACLES:
        out["memory"][oracle] = fleet_rate(memory_devices, oracle, None, requests)
        with tempfile.TemporaryDirectory(prefix="privstream-bench-ledgers-") as folder:
            out["store_save_ms"][oracle] = store_save_ms(Path(folder))
            out["file"][oracle] = fleet_rate(file_devices, oracle, Path(folder), requests)
    return out


# --- the benchmark -----------------------------------------------------------------------------


def bench_reports(
    settings: KafkaSettings | None,
    *,
    sizes: tuple[int, ...] = (10_000, 100_000),
    slots: int = 2,
    kafka_reports: int | None = 100_000,
    repeats: int = 2,
    gateway_modes: list[tuple[int, int]] | None = None,
    connections: int = 32,
    fleet_devices: tuple[int, int] = (10_000, 1_000),
    fleet_requests: int = 2,
) -> dict[str, Any]:
    """All four sections (module docstring); Kafka and the gateway on ``settings``' broker
    (an embedded Tansu when None). ``kafka_reports`` None skips section 2, ``gateway_modes``
    ``[]`` section 3 (None: 5,000 reports one per POST and 50,000 a hundred per POST)."""
    modes = [(5_000, 1), (50_000, 100)] if gateway_modes is None else gateway_modes
    params = {"sizes": list(sizes), "slots": slots, "kafka_reports": kafka_reports,
              "repeats": repeats, "gateway_modes": [list(m) for m in modes],
              "connections": connections, "fleet_devices": list(fleet_devices),
              "fleet_requests": fleet_requests, "mechanism": MECHANISM, "epsilon": EPSILON,
              "window": WINDOW, "d": D, "poll": POLL}  # fmt: skip
    out: dict[str, Any] = {"params": params, "cpus": os.cpu_count()}
    _log(f"reports 1. server stage against the slotted operator, n = {list(sizes)}")
    out["server_stage"] = [server_stage(n, slots) for n in sizes]
    out["kafka"] = out["gateway"] = None
    if kafka_reports is not None or modes:
        with _broker(settings) as (kafka, label):
            out["broker"] = label
            if kafka_reports is not None:
                _log(f"reports 2. {kafka_reports:,} reports through Kafka ({label})")
                out["kafka"] = through_kafka(kafka, kafka_reports, repeats)
            if modes:
                out["gateway"] = _gateway_section(kafka, modes, connections)
    _log(f"reports 4. the fleet: {fleet_devices[0]:,} devices in memory, "
         f"{fleet_devices[1]:,} with FileStore ledgers")  # fmt: skip
    out["fleet"] = fleet(*fleet_devices, fleet_requests)
    return out


def _gateway_section(
    settings: KafkaSettings, modes: list[tuple[int, int]], connections: int
) -> dict[str, Any] | None:
    if util.find_spec("aiohttp") is None:
        _log("reports 3. gateway skipped: aiohttp is not installed (the gateway extra)")
        return {"skipped": "aiohttp is not installed (pip install 'privstream[gateway]')"}
    _log(f"reports 3. the gateway, {connections} connections")
    return through_gateway(settings, modes, connections)


@contextlib.contextmanager
def _broker(settings: KafkaSettings | None) -> Iterator[tuple[KafkaSettings, str]]:
    if settings is not None:
        yield settings, settings.bootstrap
        return
    with EmbeddedBroker() as broker:
        yield KafkaSettings((broker.bootstrap,)), f"embedded Tansu on {broker.bootstrap}"


def format_reports(result: dict[str, Any]) -> str:
    """The summary tables of every section that ran."""
    lines = [f"ldp-reports throughput ({result['cpus']} CPUs; LBU, ε = {EPSILON}, w = {WINDOW}, "
             f"d = {D}; polls of {POLL:,})", "", "1. server stage (median of the timed slots; "
             "ratios to the raw events' rate by wall time, then by thread CPU time)",
             f"{'n':>8} {'path':6} {'per s':>11} {'µs each':>8} {'ratio':>6} {'CPU µs':>7} "
             f"{'ratio':>6}   breakdown µs (open / reports / close; events: parse / slotting)"]  # fmt: skip
    for row in result["server_stage"]:
        n, ev = row["n"], row["events"]
        lines.append(f"{n:8,} {'events':6} {ev['events_per_second']:11,.0f} "
                     f"{1e6 * ev['seconds'] / n:8.2f} {1:6.2f} {1e6 * ev['cpu_s'] / n:7.2f} "
                     f"{1:6.2f}   {1e6 * ev['parse_s'] / n:.2f} / {1e6 * ev['slotting_s'] / n:.2f}")  # fmt: skip
        for oracle in ORACLES:
            r, us = row[oracle], row[oracle]["us_per_report"]
            lines.append(f"{n:8,} {oracle:6} {r['reports_per_second']:11,.0f} {us['seconds']:8.2f} "
                         f"{r['ratio_to_events']:6.2f} {us['cpu']:7.2f} "
                         f"{r['cpu_ratio_to_events']:6.2f}   {us['open']:.2f} / "
                         f"{us['reports']:.2f} / {us['close']:.2f}")  # fmt: skip
    return "\n".join(
        lines + _format_kafka(result) + _format_gateway(result) + _format_fleet(result)
    )


def _format_kafka(result: dict[str, Any]) -> list[str]:
    k = result.get("kafka")
    if not k:
        return []
    return ["", f"2. through Kafka ({result['broker']}): {k['n']:,} {k['oracle']} reports, "
            f"median of {len(k['runs'])} runs",
            f"   written {k['write_per_second']:,.0f}/s; read by a plain consumer "
            f"{k['raw_read_per_second']:,.0f}/s; read by the server stage's source into the "
            f"stage {k['stage_per_second']:,.0f}/s (thread CPU {k['stage_cpu_s']:.2f} s of "
            f"{k['stage_s']:.2f} s; {k['stage_after_first_per_second']:,.0f}/s after the first "
            f"poll, which took {k['stage_first_s']:.2f} s)"]  # fmt: skip


def _format_gateway(result: dict[str, Any]) -> list[str]:
    g = result.get("gateway")
    if not g:
        return []
    if "skipped" in g:
        return ["", f"3. gateway skipped: {g['skipped']}"]
    lines = ["", f"3. privstream gateway, {g['connections']} connections "
             f"(every report accepted and on the topic: {g['on_topic']:,})"]  # fmt: skip
    for m in g["modes"]:
        cpu = "" if m["gateway_cpu_s"] is None else f", gateway CPU {m['gateway_cpu_s']:.2f} s"
        lines.append(f"   {m['per_post']:>4} per POST: {m['reports_per_second']:9,.0f} reports/s "
                     f"({m['posts_per_second']:,.0f} POST/s; latency p50 {m['latency_ms_p50']:.1f} "
                     f"ms, p99 {m['latency_ms_p99']:.1f} ms; {m['seconds']:.2f} s, client CPU "
                     f"{m['client_cpu_s']:.2f} s{cpu})")  # fmt: skip
    return lines


def _format_fleet(result: dict[str, Any]) -> list[str]:
    f = result["fleet"]
    lines = ["", "4. the fleet on one thread (devices answered per second; CPU µs per device)"]
    for store, label in (("memory", "ledgers in memory"), ("file", "FileStore ledgers")):
        cells = [f"{o} {r['devices_per_second']:,.0f} ({r['cpu_us_per_device']:.0f} µs)"
                 for o, r in f[store].items()]  # fmt: skip
        n = next(iter(f[store].values()))["devices"]
        lines.append(f"   {label}, {n:,} devices: " + ", ".join(cells))
    saves = ", ".join(f"{ms:.1f}" for ms in f["store_save_ms"].values())
    lines.append(
        f"   one FileStore.save in the same folder, median ms (before each oracle): {saves}"
    )
    return lines
