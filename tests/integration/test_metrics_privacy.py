"""The public metrics disclose nothing private (design §7): no user identifier, no secret, no true
count, only the labels ``{stream, mechanism, class}`` with configured values (``class`` names a
personalized privacy class by its public ``(w, ε)``: ``w<int>_e<number>``), and only metric names
on the allow-list ``PUBLIC_METRICS`` — never an internal ``privstream_internal_*`` metric (true
event counts, step timing) nor one of their old public names.

``audit`` checks one text exposition against a ``Disclosure`` policy and returns every problem
it finds. It is unit-tested on deliberately leaking fake metrics, then run on the ``/metrics`` of
a real Kafka flow (fed good and bad events, its noise secret in ``PRIVSTREAM_SECRET``) and on
``prometheus_client``'s default registry after an in-process synthetic run. The secret must not
reach the flow's stdout/stderr, its outputs or its recovery store either.
The internal counters are read where they belong: on ``--internal-metrics-port`` (loopback).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.parser import text_string_to_metric_families

import privstream.runtime.heartbeat  # noqa: F401  (defines the cluster members' progress age)
from privstream.connectors.broker import free_port
from privstream.connectors.kafka import (
    DEAD_LETTER_REASON_HEADER,
    KafkaSettings,
    wait_for_messages,
)
from privstream.connectors.synthetic import SyntheticStream
from privstream.families.registry import FAMILIES
from privstream.mechanisms.accounting import DIVISIONS as DIVISION_SPECS
from privstream.operators.metrics import (
    EVENTS,
    INTERNAL_PREFIX,
    PUBLIC_METRICS,
    STEP_SECONDS,
    count_dead_letter,
    serve_internal_metrics,
)
from privstream.schema.events import LATE, REASONS, DeadLetter
from tests.metric_names import exposed_name

from .conftest import PRIVSTREAM, Topics, cli_env, run_cli
from .prometheus import FlowProcess, read_keyed

PREFIX = "privstream_"
ALLOWED_LABELS = frozenset(
    {"stream", "mechanism", "class", "client", "measure", "unit", "scale", "division", "scope"}
)
KAFKA_CLIENTS = frozenset({"source", "sink"})  # privstream_kafka_connected{client}
# {unit, scale} of privstream_measure_unit: what a measure's charge type declares (public code)
UNITS = frozenset({"ε", "μ", "ρ"})
SCALES = frozenset({"linear", "sqrt"})
MEASURES = frozenset({"pure", "approx", "gaussian", "zcdp"})  # {measure}: the guarantee's
# The public names of the operational metrics before they moved to the internal registry.
OLD_NAMES = frozenset(
    PREFIX + name
    for name in ("events_total", "events_rejected_total", "late_events_total", "step_seconds")
)
# scope (w<window>, s<slots>, or lifetime: no window), budget in its unit
CLASS_LABEL = re.compile(r"(?:[ws][1-9][0-9]*|lifetime)_(?:e|mu|rho)[0-9.e+-]+")
SCOPES = frozenset({"window", "class", "stream", "period", "lifetime"})  # Guarantee.scope.kind
# A produced user id ("u0" .. "u{n-1}") as a token of its own.
USER_ID = re.compile(r"(?<!\w)u\d+(?!\w)")
SECRET = "RaRI3ATqVl9AinbJ3RJ88GkURnYsncB7QKAXKcvvY_c"  # a fixed random key: base64url, 32 bytes


@dataclass(frozen=True)
class Disclosure:
    """What a flow's metrics may show.

    ``true_counts`` are the true per-slot counts of every value of the stream; ``public`` the
    numbers anybody may know anyway (see ``public_numbers``). A metric value equal to a true
    count that is not also public is a leak. ``metrics`` is the allow-list of public names.
    """

    streams: frozenset[str]
    mechanisms: frozenset[str]
    secret: str
    true_counts: frozenset[int]
    public: frozenset[float]
    metrics: frozenset[str] = PUBLIC_METRICS

    @property
    def forbidden(self) -> frozenset[int]:
        return frozenset(c for c in self.true_counts if c not in self.public)


def true_counts(stream: SyntheticStream) -> frozenset[int]:
    """``truth(t)·n`` for every slot and every value: how many users held each value."""
    counts = set()
    for slot in range(1, stream.slots + 1):
        for frequency in stream.truth(slot).tolist():
            count = frequency * stream.users
            assert abs(count - round(count)) < 1e-6, (slot, count)  # binary streams only
            counts.add(round(count))
    return frozenset(counts)


def numbers(item: Any) -> Iterator[float]:
    """Every number inside a JSON value."""
    if isinstance(item, bool):
        return
    if isinstance(item, (int, float)):
        yield float(item)
    elif isinstance(item, dict):
        for value in item.values():
            yield from numbers(value)
    elif isinstance(item, (list, tuple)):
        for value in item:
            yield from numbers(value)


def public_numbers(
    users: int, slots: int, window: int, epsilon: float, published: Iterable[Any]
) -> frozenset[float]:
    """The values a metric may take even when they coincide with a true count.

    The rule: a number is trivially public when it follows from the configuration alone or
    was already published by the flow as differentially private output —

    * 0 and 1 (flags, untouched counters), ε, w, n and T;
    * every integer 1..T: slot indices and counts of slots, steps, releases of each kind;
    * ``n·t`` for t in 0..T: events accepted after t complete slots — every registered user
      reports at every slot, so the volume of the stream is known; its split by value is not;
    * every number in the releases and ledger entries the flow published (post-processing of
      DP output, e.g. the LDP-IDS ``details``' ``window_users``/``available_users`` of
      population division).

    Every other metric value equal to a true per-slot count of some value is a leak.
    """
    public = {0.0, 1.0, float(epsilon), float(window), float(users), float(slots)}
    public.update(float(t) for t in range(1, slots + 1))
    public.update(float(users * t) for t in range(slots + 1))
    for item in published:
        public.update(numbers(item))
    return frozenset(public)


def name_problems(exposition: str, policy: Disclosure) -> list[str]:
    """Metrics that are not allow-listed public ones: internal, old or unclassified names."""
    problems = []
    if INTERNAL_PREFIX in exposition:
        problems.append(f"{INTERNAL_PREFIX!r} appears in the public exposition")
    for family in text_string_to_metric_families(exposition):
        names = {exposed_name(family), *(s.name for s in family.samples)}
        if not any(n.startswith(PREFIX) for n in names):
            continue
        name = exposed_name(family)
        if name.startswith(INTERNAL_PREFIX) or names & OLD_NAMES:
            problems.append(f"{name}: an internal metric on the public endpoint")
        elif name not in policy.metrics:
            problems.append(f"{name}: not on the allow-list of public metrics (PUBLIC_METRICS)")
    return problems


def sample_problems(exposition: str, policy: Disclosure) -> list[str]:
    """Labels other than configured ones, and values equal to a true count that is not public."""
    problems = []
    forbidden = policy.forbidden
    allowed = {"stream": policy.streams, "mechanism": policy.mechanisms, "client": KAFKA_CLIENTS,
               "measure": MEASURES, "unit": UNITS, "scale": SCALES,
               # privstream_mechanism_info{division}: how a ledger divides the budget (public
               # code: the built-in divisions and those the discovered families declare)
               "division": frozenset(DIVISION_SPECS), "scope": SCOPES}  # fmt: skip
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX):
                continue
            where = f"{sample.name}{sample.labels}"
            for label in sorted(set(sample.labels) - ALLOWED_LABELS):
                problems.append(f"{where}: label {label!r} is not one of {sorted(ALLOWED_LABELS)}")
            for label, text in sample.labels.items():
                if label == "class" and not CLASS_LABEL.fullmatch(text):
                    problems.append(f"{where}: class={text!r} is not a (scope, budget) class name")
                elif label in allowed and text not in allowed[label]:
                    problems.append(f"{where}: {label}={text!r} is not configured")
            value = float(sample.value)
            if not math.isfinite(value):
                continue
            nearest = round(value)
            if nearest in forbidden and abs(value - nearest) <= 1e-9 * max(1.0, abs(value)):
                problems.append(f"{where} = {value!r} equals a true per-slot count")
    return problems


def audit(exposition: str, policy: Disclosure) -> list[str]:
    """Every way ``exposition`` (Prometheus text format) breaks ``policy``; [] when it is clean."""
    problems = []
    if policy.secret in exposition:
        problems.append("the secret appears in the exposition")
    for number, line in enumerate(exposition.splitlines(), 1):
        if PREFIX in line and (found := USER_ID.search(line)):
            problems.append(f"line {number}: user id {found.group()!r} in {line!r}")
    return problems + name_problems(exposition, policy) + sample_problems(exposition, policy)


# -- the checker itself ---------------------------------------------------------------------------

POLICY = Disclosure(
    streams=frozenset({"sin"}),
    mechanisms=frozenset({"LBU"}),
    secret=SECRET,
    true_counts=frozenset({456, 4544, 5000}),
    public=public_numbers(5000, 60, 20, 1.0, [{"details": {"users_m2": 4544}}]),
)


def _leak(leak: str, registry: CollectorRegistry, spent: Gauge, info: Gauge) -> None:
    """Add the deliberate ``leak`` to ``registry`` (allow-listed names unless the name is it)."""
    pair = ["stream", "mechanism"]
    if leak == "true count":
        Gauge(PREFIX + "dissimilarity", "Dis.", pair, registry=registry).labels("sin", "LBU").set(
            456
        )
    elif leak == "true count as a float":
        Gauge(PREFIX + "dissimilarity", "Dis.", pair, registry=registry).labels("sin", "LBU").set(
            (1 - 0.9088) * 5000  # 455.9999999999997: a frequency times n
        )
    elif leak == "user label":
        Gauge(PREFIX + "last_released_slot", "Slot.", ["user"], registry=registry).labels("u3").set(
            7
        )
    elif leak == "user as stream":
        spent.labels("u3", "LBU").set(0.1)
    elif leak == "reason label":
        PromCounter(
            PREFIX + "privacy_violations", "Refused.", ["stream", "reason"], registry=registry
        ).labels("sin", "late_event").inc()
    elif leak == "unknown mechanism":
        spent.labels("sin", "XYZ").set(0.1)
    elif leak == "undeclared division":
        info.labels("sin", "LPA", "alice").set(1)
    elif leak == "secret":
        Gauge(PREFIX + "insecure_seed", f"Noise from {SECRET}.", registry=registry).set(1)
    elif leak == "user in help":
        Gauge(PREFIX + "evaluation", "First user was u4999.", registry=registry).set(1)
    elif leak == "internal metric":
        PromCounter(INTERNAL_PREFIX + "events", "Events.", ["stream"], registry=registry).labels(
            "sin"
        ).inc(5000)
    elif leak in ("events_total", "events_rejected_total", "late_events_total"):
        name = leak.removesuffix("_total")
        PromCounter(PREFIX + name, "Old.", ["stream"], registry=registry).labels("sin").inc()
    elif leak == "step_seconds":
        Histogram(PREFIX + "step_seconds", "Old.", pair, registry=registry).labels(
            "sin", "LBU"
        ).observe(0.01)
    elif leak == "unclassified metric":
        Gauge(PREFIX + "new_gauge", "Not classified.", pair, registry=registry).labels(
            "sin", "LBU"
        ).set(0.5)
    else:
        raise AssertionError(f"no such leak {leak!r}")


def fake_exposition(leak: str | None = None) -> str:
    """A small exposition in privstream's shape, optionally with one deliberate leak."""
    registry = CollectorRegistry()
    pair = ["stream", "mechanism"]
    spent = Gauge(PREFIX + "scope_budget_spent", "Spend.", pair, registry=registry)
    spent.labels("sin", "LBU").set(0.5)
    Gauge(PREFIX + "population", "n.", pair, registry=registry).labels("sin", "LBU").set(5000)
    used = Gauge(PREFIX + "window_users_used", "Used.", pair, registry=registry)
    used.labels("sin", "LBU").set(4544)  # a true count, but published already: allowed
    Gauge(PREFIX + "population_budget", "ε.", ["stream"], registry=registry).labels("sin").set(1)
    info = Gauge(PREFIX + "mechanism_info", "Division.", [*pair, "division"], registry=registry)
    info.labels("sin", "LBU", "budget").set(1)
    if leak is not None:
        _leak(leak, registry, spent, info)
    return generate_latest(registry).decode()


def test_audit_passes_a_clean_exposition() -> None:
    assert POLICY.forbidden == {456}  # n and the published 4544 are public
    assert audit(fake_exposition(), POLICY) == []


@pytest.mark.parametrize(
    ("leak", "expected"),
    [
        ("true count", "= 456.0 equals a true per-slot count"),
        ("true count as a float", "= 455.9999999999997 equals a true per-slot count"),
        ("user label", "label 'user' is not one of"),
        ("user as stream", "stream='u3' is not configured"),
        ("reason label", "label 'reason' is not one of"),
        ("unknown mechanism", "mechanism='XYZ' is not configured"),
        ("undeclared division", "division='alice' is not configured"),
        ("secret", "the secret appears"),
        ("user in help", "user id 'u4999'"),
        ("internal metric", "privstream_internal_events_total: an internal metric"),
        ("events_total", "privstream_events_total: an internal metric"),
        ("events_rejected_total", "privstream_events_rejected_total: an internal metric"),
        ("late_events_total", "privstream_late_events_total: an internal metric"),
        ("step_seconds", "privstream_step_seconds: an internal metric"),
        ("unclassified metric", "privstream_new_gauge: not on the allow-list"),
    ],
)
def test_audit_catches_a_deliberate_leak(leak: str, expected: str) -> None:
    problems = audit(fake_exposition(leak), POLICY)
    assert any(expected in p for p in problems), problems


def test_public_registry_holds_only_allow_listed_metrics() -> None:
    """The default registry (what ``--metrics-port`` serves) exports exactly ``PUBLIC_METRICS``,
    however much the internal counters have counted."""
    EVENTS.labels("sin").inc(456)
    count_dead_letter(DeadLetter(LATE, "sin", "{}", "late"), frozenset({"sin"}))
    STEP_SECONDS.labels("sin", "LBU").observe(0.01)
    exposition = generate_latest(REGISTRY).decode()
    assert name_problems(exposition, POLICY) == []
    families = text_string_to_metric_families(exposition)
    exported = {exposed_name(f) for f in families if f.name.startswith(PREFIX)}
    assert exported == PUBLIC_METRICS


def test_internal_endpoint_serves_the_internal_counters_on_loopback_only() -> None:
    EVENTS.labels("sin").inc(7)
    server, thread = serve_internal_metrics(free_port())
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"  # bound to loopback, not 0.0.0.0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    names = {exposed_name(f) for f in text_string_to_metric_families(text)}
    assert {
        INTERNAL_PREFIX + "events_total",
        INTERNAL_PREFIX + "events_rejected_total",
        INTERNAL_PREFIX + "late_events_total",
        INTERNAL_PREFIX + "step_seconds",
    } <= names
    assert not names & PUBLIC_METRICS  # the ledger board is not on the internal endpoint
    events = sample_values(text, INTERNAL_PREFIX + "events_total")
    assert events[(("stream", "sin"),)] >= 7


# -- a running Kafka flow -------------------------------------------------------------------------

USERS, SLOTS, WINDOW, EPSILON, DATA_SEED = 4000, 40, 10, 1.0, 3
MECHANISMS = ("LBU", "LPA", "LBA")
# Bad events after the stream, with user ids that must not reach the metrics.
BAD_EVENTS = {
    "late_event": (b'{"stream":"sin","user":"u9","slot":5,"value":1}', "sin"),
    "out_of_domain": (b'{"stream":"sin","user":"u11","slot":41,"value":7}', "sin"),
    "unknown_stream": (b'{"stream":"u17","user":"u17","slot":3,"value":1}', ""),
    "missing_field": (b'{"stream":"sin","user":"u23","slot":41}', "sin"),
    "malformed_json": (b'{"stream":"sin","user":"u29", not json', ""),
}


def produce_raw(settings: KafkaSettings, topic: str, payloads: list[bytes]) -> None:
    """Write ``payloads`` as they are (the producer is destroyed on return)."""
    producer = Producer(settings.client_config())
    for payload in payloads:
        producer.produce(topic, payload)
    assert producer.flush(30) == 0


def sample_values(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples called ``name``: sorted label pairs → value."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    }


def check_internal(internal: str) -> None:
    """The internal endpoint counts what the public one must not show: every event, every dead
    letter by reason, the late event, the step timing — and still no user id or secret."""
    rejected = sample_values(internal, INTERNAL_PREFIX + "events_rejected_total")
    assert rejected == {
        (("reason", reason), ("stream", stream)): 1.0
        for reason, (_payload, stream) in BAD_EVENTS.items()
    }
    assert set(BAD_EVENTS) <= set(REASONS)
    late = sample_values(internal, INTERNAL_PREFIX + "late_events_total")
    assert late == {(("stream", "sin"),): 1.0}
    assert sample_values(internal, INTERNAL_PREFIX + "events_total") == {
        (("stream", "sin"),): float(USERS * SLOTS)
    }
    steps = sample_values(internal, INTERNAL_PREFIX + "step_seconds_count")
    assert steps == {(("mechanism", m), ("stream", "sin")): float(SLOTS) for m in MECHANISMS}
    assert SECRET not in internal
    assert not USER_ID.search(internal)


def check_secret_nowhere(flow: FlowProcess, pages: dict[str, str], recovery: Path) -> None:
    """The secret is not in the process output, the outputs, or the recovery store."""
    stdout, stderr = flow.output()
    assert "received SIGTERM" in stderr
    for where, text in [("stdout", stdout), ("stderr", stderr), *pages.items()]:
        assert SECRET not in text, f"the secret appears in the flow's {where}"
    store = [p for p in recovery.rglob("*") if p.is_file()]
    assert store, "the recovery store must hold snapshots"
    blobs = b"".join(p.read_bytes() for p in store)
    # Snapshots are plain pickles in SQLite, so a byte search sees what the state holds.
    assert b"privstream.operators.stream_state" in blobs and b"tallies" in blobs
    for form in (SECRET.encode(), SECRET.encode().hex().encode(), SECRET.encode("utf-16-le")):
        assert form not in blobs, f"the secret appears in the recovery store as {form!r}"


def test_metrics_of_a_kafka_flow_disclose_nothing_private(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path
) -> None:
    run_cli(
        "produce", "--bootstrap", kafka.bootstrap, "--topic", topics.events, "--dataset", "sin",
        "--users", str(USERS), "--slots", str(SLOTS), "--seed", str(DATA_SEED), "--no-progress",
    )  # fmt: skip
    produce_raw(kafka, topics.events, [payload for payload, _stream in BAD_EVENTS.values()])

    recovery, internal_port = tmp_path / "recovery", free_port()
    command = [
        *PRIVSTREAM, "run", "ldp-ids", "--dataset", "sin", "--mechanism", ",".join(MECHANISMS),
        "--users", str(USERS), "--window", str(WINDOW), "--epsilon", str(EPSILON),
        "--recovery-dir", str(recovery), "--snapshot-interval", "0.5", "--budget-split", "equal",
        "--internal-metrics-port", str(internal_port), *topics.run_flags(kafka),
    ]  # fmt: skip
    expected = {f"sin/{m}/{t}" for m in MECHANISMS for t in range(1, SLOTS + 1)}
    with FlowProcess(command, free_port(), tmp_path, cli_env(PRIVSTREAM_SECRET=SECRET)) as flow:
        releases = read_keyed(kafka, topics.releases, expected, flow)
        ledger = read_keyed(kafka, topics.ledger, expected, flow)
        dead = wait_for_messages(kafka, topics.dlq, lambda got: len(got) >= len(BAD_EVENTS), 60)

        def counted(text: str) -> bool:
            rejected = sum(sample_values(text, INTERNAL_PREFIX + "events_rejected_total").values())
            steps = sample_values(text, INTERNAL_PREFIX + "step_seconds_count").values()
            return rejected == len(BAD_EVENTS) and list(steps) == [SLOTS] * len(MECHANISMS)

        def settled(text: str) -> bool:
            last = list(sample_values(text, PREFIX + "last_released_slot").values())
            return last == [SLOTS] * len(MECHANISMS)

        internal = flow.wait_metrics(counted, "every dead letter", 30, port=internal_port)
        exposition = flow.wait_metrics(settled, "every slot", 30)
        assert flow.terminate() == 0, flow.output()[1][-3000:]

    # The flow did what the metrics are about: the checks below look at real numbers.
    reasons = sorted(dict(m.headers())[DEAD_LETTER_REASON_HEADER].decode() for m in dead)
    assert reasons == sorted(BAD_EVENTS)
    check_internal(internal)
    families = text_string_to_metric_families(exposition)
    cluster_only = {PREFIX + "cluster_member_progress_age_seconds"}  # served by cluster members
    exposed = {exposed_name(f) for f in families if f.name.startswith(PREFIX)}
    assert exposed == PUBLIC_METRICS - cluster_only
    assert sample_values(exposition, PREFIX + "insecure_seed") == {(): 0.0}  # a real secret
    assert sample_values(exposition, PREFIX + "evaluation") == {(): 0.0}  # a split budget
    assert sample_values(exposition, PREFIX + "population_budget") == {
        (("measure", "pure"), ("stream", "sin")): EPSILON
    }
    # each mechanism's division, as its code declares it: LPA divides the population
    divisions = {m: FAMILIES["ldp-ids"].mechanisms[m].division for m in MECHANISMS}
    assert divisions == {"LBU": "budget", "LPA": "population", "LBA": "budget"}
    assert sample_values(exposition, PREFIX + "mechanism_info") == {
        (("division", d), ("mechanism", m), ("scope", "window"), ("stream", "sin")): 1.0
        for m, d in divisions.items()
    }

    synthetic = SyntheticStream("sin", USERS, SLOTS, seed=DATA_SEED)
    policy = Disclosure(
        streams=frozenset({"sin"}),
        mechanisms=frozenset(MECHANISMS),
        secret=SECRET,
        true_counts=true_counts(synthetic),
        public=public_numbers(
            USERS, SLOTS, WINDOW, EPSILON, [*releases.values(), *ledger.values()]
        ),
    )
    assert len(policy.forbidden) >= SLOTS, "the true-count check must have counts to look for"
    assert audit(exposition, policy) == []
    pages = {"releases": json.dumps(releases)}
    check_secret_nowhere(flow, {**pages, "ledger": json.dumps(ledger)}, recovery)


# -- prometheus_client's default registry after an in-process run --------------------------------

IN_PROCESS = """
import os, sys
from bytewax.testing import run_main
from prometheus_client import REGISTRY, generate_latest
from privstream.flows.ldp_ids import build
from privstream.operators.metrics import INTERNAL

dataset, mechanisms, users, slots, seed, out, ledger, internal = sys.argv[1:]
flow = build(dataset=dataset, mechanisms=mechanisms, users=int(users), slots=int(slots),
             window=10, seed=int(seed), out=out, ledger_out=ledger,
             secret=os.environ["PRIVSTREAM_SECRET"].encode(), compare=True)
run_main(flow)
sys.stdout.write(generate_latest(REGISTRY).decode())
with open(internal, "w") as file:
    file.write(generate_latest(INTERNAL).decode())
"""


def test_default_registry_after_an_in_process_run_discloses_nothing_private(
    tmp_path: Path,
) -> None:
    users, slots, seed = 3000, 50, 13
    out, ledger_out = tmp_path / "releases.jsonl", tmp_path / "ledger.jsonl"
    internal = tmp_path / "internal.txt"
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, "lns", ",".join(MECHANISMS), str(users), str(slots),
         str(seed), str(out), str(ledger_out), str(internal)],
        capture_output=True, text=True, timeout=120, env=cli_env(PRIVSTREAM_SECRET=SECRET),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    exposition = done.stdout
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    ledger = [json.loads(line) for line in ledger_out.read_text().splitlines()]
    assert len(releases) == len(ledger) == slots * len(MECHANISMS)

    last = sample_values(exposition, PREFIX + "last_released_slot")
    assert last == {(("mechanism", m), ("stream", "lns")): float(slots) for m in MECHANISMS}
    # The event count is on the internal registry only, never on the public one.
    assert sample_values(internal.read_text(), INTERNAL_PREFIX + "events_total") == {
        (("stream", "lns"),): float(users * slots)
    }
    policy = Disclosure(
        streams=frozenset({"lns"}),
        mechanisms=frozenset(MECHANISMS),
        secret=SECRET,
        true_counts=true_counts(SyntheticStream("lns", users, slots, seed=seed)),
        public=public_numbers(users, slots, 10, 1.0, [*releases, *ledger]),
    )
    assert len(policy.forbidden) >= slots
    assert audit(exposition, policy) == []
    assert SECRET not in done.stderr
