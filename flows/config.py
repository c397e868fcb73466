"""A flow configuration file (``privstream run --config flow.toml``): Kafka, the population and
any number of streams, each with its own family, mechanisms, task and budget share.

Privacy: the streams of one population compose. Every stream gets the share ``s`` of the
population's budget ε per window (``Σ s ≤ 1``), so a user present in every stream spends at most
``Σ_s s·ε ≤ ε`` in any window of the population's ``window`` slots; a stream's mechanisms then
split its ``s·ε`` (``budget_split``) under its own population accountant. A stream's window may
be longer than the population's (any population window then lies inside one of the stream's),
never shorter. For a central-DP stream the share scales every registered user's own ε_i, so
``load`` admits only registrations with ``ε_i ≤ ε`` and ``w_i ≥ window``; a mechanism whose
budget renews more often than every ``window`` slots (CGM's ``budget_scope = "timestamp"``) is
refused, and ``compare`` (an evaluation, full ε each) cannot be configured here. An LDP stream
with ``registered_only = true`` is a closed population: only the table's users enrol (sybils
cannot take its seats), and each entry's requirement must hold under the stream's own ε per
window (``operators.registration.check_closed_population``).

δ composes like ε: streams at ``(ε_s, δ_s)`` are together ``(Σ ε_s, Σ δ_s)``-DP. A stream with
a δ (CGM) takes its own ``delta`` or, without one, ``share × population.delta``; their sum may
not pass ``population.delta`` (without it, the population's δ is the sum), and the population's
δ must lie below ``1/users`` unless ``population.allow_large_delta = true``
(``accountant.compose_deltas``).

``load`` reads the file with ``tomllib`` and validates every field; a ``ConfigError`` reads
``FILE: KEY: problem``, where ``KEY`` is the key's path (``population.users``,
``streams["country"].share``; ``streams[k]`` is the k-th ``[[streams]]`` table, from 1, until
it has a valid name). Unknown keys are errors at every level. The limits of ε, w and every
family option are the families' own (``mechanisms.validation``, ``Family.make_config``), so a
file and the command-line flags accept the same values.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from privstream.connectors.registrations import load_preferences
from privstream.families.registry import FAMILIES, Family
from privstream.families.spec import TaskType
from privstream.mechanisms.accountant import BudgetSplit, compose_deltas
from privstream.mechanisms.accounting import (
    AllUsers,
    Charge,
    PureCharge,
    composable,
    measure_type,
    scope_name,
)
from privstream.mechanisms.guarantees import (
    LifetimeScope,
    PeriodScope,
    Scope,
    WindowScope,
    budget_of,
)
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.tasks import BallTask, EstimationTask, FrequencyTask, MeanTask
from privstream.mechanisms.validation import (
    MAX_WINDOW,
    check_fraction,
    check_requirement,
    distinct_requirements,
)
from privstream.operators.ports import DeviceReports, ports_for
from privstream.operators.registration import Preferences, check_closed_population
from privstream.operators.user_shards import MAX_SHARDS
from privstream.schema.events import MAX_EVENT_BYTES

Task = int | tuple[float, float] | tuple[tuple[float, ...], float] | EstimationTask
"""``d`` categories, the ``(lower, upper)`` range of numeric values, the ``(centre, radius)``
L2 ball of vector values, or the ``EstimationTask`` a family's own task type parsed."""


class ConfigError(ValueError):
    """An invalid configuration file; the message names the file, the key and what is allowed."""


@dataclass(frozen=True)
class KafkaSection:
    """``[kafka]``: the cluster and the topics (``[kafka.properties]``: librdkafka client
    properties, e.g. ``"security.protocol" = "SASL_SSL"``)."""

    bootstrap: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str | None = None
    ledger_topic: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    max_event_bytes: int = 65536
    stall_warning_seconds: float = 30.0
    clock: str = "markers"
    trust_input_clock: bool = False
    grow_partitions: bool = False
    input_topic_recreated: bool = False
    extra_topics: Mapping[str, str] = field(default_factory=dict)
    """A family's declared extra outputs (``Family.outputs``) by name → topic, from the keys
    ``<output>_topic`` (``audit_topic``): delivered like the ledger; unnamed ones go nowhere."""
    trust: str = "default"
    """``ldp-reports``: real devices answer; ``input_topic`` is then the report topic (the
    file's ``report_topic``) and the server writes its requests to ``request_topic``."""
    request_topic: str | None = None


@dataclass(frozen=True)
class PopulationSection:
    """``[population]``: the registered population ``users`` (n) and its budget ``epsilon`` per
    ``window`` slots, shared by all streams; ``registrations``: the registration table
    (``user,epsilon,window`` CSV) of central-DP streams and of ``registered_only`` LDP
    streams, relative to the config file."""

    users: int
    epsilon: float
    window: int
    registrations: Path | None = None
    delta: float | None = None
    """The population's δ: ``population.delta``, or the sum of the streams' δ without it
    (None when no stream has a δ and none is given)."""
    allow_large_delta: bool = False
    """``population.allow_large_delta``: accept a δ ≥ 1/users."""
    retired: tuple[str, ...] = ()
    """Streams removed from the flow on purpose (``privstream.runtime.incarnation``): their share of
    the budget stays spent in the recovery store, and their names never come back."""
    preferences: Mapping[str, tuple[float, int]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """The registration table read from ``registrations`` (user id → ``(ε_i, w_i)``), checked
    against the population's budget; never shown in a repr (it names users)."""


@dataclass(frozen=True)
class RunSection:
    """``[run]`` (optional): how the flow runs."""

    workers: int = 1
    processes: int = 1
    recovery_dir: Path | None = None
    snapshot_interval: float = 10.0
    secret_file: Path | None = None


@dataclass(frozen=True)
class StreamSection:
    """One ``[[streams]]`` table.

    ``epsilon`` is derived: ``share × population.epsilon``; ``window`` defaults to the
    population's and may only be longer; ``options`` are the family's own options by name
    (``Family.options``: LDP-IDS ``beta``; CGM ``delta``, ``bound``, ``budget_scope``, ``lag``)
    plus ``client_path`` where the family has it."""

    name: str
    family: str
    mechanisms: tuple[str, ...]
    task: Task
    share: float
    epsilon: float
    window: int
    budget_split: str | None = None
    lateness: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    registered_only: bool = False
    """An LDP stream's closed population: only ``population.registrations``' users enrol
    (a central-DP stream always counts exactly them)."""
    shards: int | None = None
    """User shards of the stream (``operators.sharded``: central DP, or a closed LDP
    population asking every user every slot): its per-user work on that many Bytewax keys,
    its releases byte-identical to none (None: the stream is one key)."""


@dataclass(frozen=True)
class FlowConfig:
    """A whole configuration file, validated."""

    path: Path
    kafka: KafkaSection
    population: PopulationSection
    streams: tuple[StreamSection, ...]
    run: RunSection = field(default_factory=RunSection)


STREAM_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A stream's name: the ``stream`` field of its events, a suffix of its Bytewax step ids (which
refuse ``.``) and a metric label."""
TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""A Kafka topic name (Kafka's own rule)."""
CLIENT_PATHS: Final = ("aggregate", "per-user")
_STREAM_KEYS: Final = (
    "name",
    "family",
    "mechanisms",
    "share",
    "window",
    "budget_split",
    "lateness",
    "registered_only",
    "shards",
)


def estimation_task(task: Task) -> EstimationTask:
    """The estimation task of a stream's raw ``task``: ``FrequencyTask(d)``,
    ``MeanTask(lower, upper)`` or ``BallTask(centre, radius)``; a family's own task type parses
    into its ``EstimationTask`` directly."""
    if isinstance(task, EstimationTask):
        return task
    if isinstance(task, int):
        return FrequencyTask(task)
    first, second = task
    if isinstance(first, tuple):
        return BallTask(first, second)
    return MeanTask(first, second)


def task_keywords(task: Task) -> dict[str, Any]:
    """The task as ``flows.dataflow.build`` takes it: ``domain``, ``mean_range``, ``ball`` or
    ``task`` (a family's own task type)."""
    if isinstance(task, EstimationTask):
        return {"task": task}
    if isinstance(task, int):
        return {"domain": task}
    return {"ball": task} if isinstance(task[0], tuple) else {"mean_range": task}


def task_types() -> dict[str, TaskType]:
    """Every task type any discovered family declares, by flow-file key, in discovery order
    (the built-in ``domain``, ``range``, ``ball`` first)."""
    found: dict[str, TaskType] = {}
    for family in FAMILIES.values():
        for task in family.task_types:
            found.setdefault(task.key, task)
    return found


def _show(value: object) -> str:
    """A TOML value as an error message shows it."""
    return "a table" if isinstance(value, dict) else json.dumps(value, default=str)


class _Table:
    """One table of the file being read: typed getters whose errors name the file and the
    key's path."""

    def __init__(self, source: Path, where: str, data: object) -> None:
        self.source, self.where = source, where
        if not isinstance(data, dict):
            raise self.error(None, f"must be a table, got {_show(data)}")
        self.data: dict[str, Any] = data

    def path_of(self, key: str | None) -> str:
        if key is None:
            return self.where or "(top level)"
        shown = f'"{key}"' if "." in key or not key else key
        return f"{self.where}.{shown}" if self.where else shown

    def error(self, key: str | None, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.path_of(key)}: {problem}")

    def only(self, allowed: Iterable[str]) -> None:
        """Refuse every key not in ``allowed``."""
        names = sorted(allowed)
        for key in self.data:
            if key not in names:
                raise self.error(key, f"unknown key; allowed: {', '.join(names)}")

    def get(self, key: str, what: str) -> Any:
        """A required key's value."""
        if key not in self.data:
            raise self.error(key, f"missing; required ({what})")
        return self.data[key]

    def table(self, key: str, *, required: bool = True) -> _Table:
        where = self.path_of(key)
        if key not in self.data and not required:
            return _Table(self.source, where, {})
        return _Table(self.source, where, self.get(key, f"a table [{where}]"))

    def text(
        self, key: str, pattern: re.Pattern[str] | None = None, what: str = "a non-empty string"
    ) -> str:
        value = self.get(key, what)
        if not (isinstance(value, str) and value) or (pattern and not pattern.fullmatch(value)):
            raise self.error(key, f"must be {what}, got {_show(value)}")
        return value

    def optional_text(
        self, key: str, pattern: re.Pattern[str] | None = None, what: str = "a non-empty string"
    ) -> str | None:
        return self.text(key, pattern, what) if key in self.data else None

    def file_path(self, key: str) -> Path | None:
        """An optional path; a relative one is relative to the configuration file's folder."""
        value = self.optional_text(key, what="a path (a non-empty string)")
        return None if value is None else (self.source.parent / value).absolute()

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.data.get(key, default)
        if not (isinstance(value, str) and value in choices):
            raise self.error(key, f"must be one of {', '.join(choices)}; got {_show(value)}")
        return value

    def integer(
        self, key: str, low: int, high: int | None = None, default: int | None = None, why: str = ""
    ) -> int:
        """An integer in ``[low, high]`` (``≥ low`` without ``high``); required without a
        ``default``. A boolean is not an integer."""
        value = self.get(key, "an integer") if default is None else self.data.get(key, default)
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be {bound}, got {_show(value)}")
        if value < low or (high is not None and value > high):
            raise self.error(key, f"must be {bound}, got {_show(value)}{why}")
        return value

    def number(self, key: str, default: float | None = None, *, positive: bool = False) -> float:
        """A finite number (an integer is one too; a boolean is not); required without a
        ``default``."""
        value = self.get(key, "a number") if default is None else self.data.get(key, default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and (value > 0 or not positive)):
            bound = " > 0" if positive else ""
            raise self.error(key, f"must be a finite number{bound}, got {_show(value)}")
        return float(value)

    def flag(self, key: str) -> bool:
        """An optional boolean (default false)."""
        value = self.data.get(key, False)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {_show(value)}")
        return value

    def numbers(self, key: str, what: str) -> tuple[float, ...]:
        """A non-empty array of finite numbers."""
        value = self.get(key, what)
        ok = isinstance(value, list) and bool(value)
        ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        if not (ok and all(math.isfinite(x) for x in value)):
            raise self.error(key, f"must be {what}, got {_show(value)}")
        return tuple(float(x) for x in value)


def load(path: str | Path) -> FlowConfig:
    """Read and validate a flow configuration file (the module docstring); a ``ConfigError``
    names the file, the key and what is allowed."""
    source = Path(path)
    try:
        with source.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the configuration file: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not a valid TOML file: {exc}") from None
    top = _Table(source, "", data)
    top.only(("kafka", "population", "run", "streams"))
    kafka = _kafka(top.table("kafka"))
    population_table = top.table("population")
    population = _population(population_table)
    run = _run(top.table("run", required=False))
    streams = _streams(top, population, kafka.trust)
    _check_trust(top.table("kafka"), kafka, streams)
    sharded = [s.name for s in streams if s.shards is not None]
    if sharded and kafka.clock != "markers":
        raise top.table("kafka").error(
            "clock",
            f"stream(s) {sharded} set shards: user shards need the markers clock (a row's "
            "lateness on the data clock depends on every earlier row of its partition)",
        )
    live = sorted({s.name for s in streams} & set(population.retired))
    if live:
        raise population_table.error("retired", f"names configured stream(s) {live}")
    population = _deltas(population_table, population, streams)
    population = _registrations(population_table, population, streams)
    _check_outputs(top.table("kafka"), kafka, streams)
    return FlowConfig(source, kafka, population, streams, run)


def _check_trust(t: _Table, kafka: KafkaSection, streams: Sequence[StreamSection]) -> None:
    """Refuse an ``ldp-reports`` flow with a stream whose family is not local DP."""
    if kafka.trust == "default":
        return
    closed = [s.name for s in streams if s.registered_only]
    if closed:
        raise t.error(
            "trust",
            f"stream(s) {closed} set registered_only: in ldp-reports the devices enrol "
            "themselves (population.users is how many the server plans for)",
        )
    central = [s.name for s in streams if not FAMILIES[s.family].local]
    if central:
        raise t.error(
            "trust",
            f"ldp-reports runs local-DP families only; stream(s) {central} run a trusted "
            "curator (central DP)",
        )


def output_keys() -> dict[str, str]:
    """The ``[kafka]`` key of every discovered family's extra output → the output's name
    (``audit_topic`` → ``audit``)."""
    return {
        f"{spec.dest}_topic": spec.name for entry in FAMILIES.values() for spec in entry.outputs
    }


def _check_outputs(t: _Table, kafka: KafkaSection, streams: Sequence[StreamSection]) -> None:
    """Refuse a routed extra output no stream's family declares (an internal output is
    written only where the file names a topic for it: never onto the release topic)."""
    for name in kafka.extra_topics:
        if not any(name in {o.name for o in FAMILIES[s.family].outputs} for s in streams):
            declared = sorted({o.name for s in streams for o in FAMILIES[s.family].outputs})
            raise t.error(
                f"{name.replace('-', '_')}_topic",
                f"no stream's family declares the output {name!r} (declared: "
                f"{', '.join(declared) or 'none'})",
            )


def _kafka(t: _Table) -> KafkaSection:
    """``[kafka]``: the brokers, the topics (each role its own) and the client properties."""
    t.only(
        (
            "bootstrap",
            "input_topic",
            "output_topic",
            "dead_letter_topic",
            "ledger_topic",
            "max_event_bytes",
            "stall_warning_seconds",
            "properties",
            "clock",
            "trust_input_clock",
            "grow_partitions",
            "input_topic_recreated",
            "trust",
            "report_topic",
            "request_topic",
            *output_keys(),
        )
    )
    bootstrap = t.text("bootstrap", what="HOST:PORT[,...] (a non-empty string)")
    what = f"a Kafka topic name ({TOPIC_NAME.pattern})"
    trust, input_topic, request_topic = _input_topics(t, what)
    output_topic = t.text("output_topic", TOPIC_NAME, what)
    dead_letter_topic = t.optional_text("dead_letter_topic", TOPIC_NAME, what)
    ledger_topic = t.optional_text("ledger_topic", TOPIC_NAME, what)
    extra = {key: t.optional_text(key, TOPIC_NAME, what) for key in output_keys() if key in t.data}
    roles: dict[str, str] = {}
    for role, topic in (
        ("input_topic" if trust == "default" else "report_topic", input_topic),
        ("request_topic", request_topic),
        ("output_topic", output_topic),
        ("dead_letter_topic", dead_letter_topic),
        ("ledger_topic", ledger_topic),
        *extra.items(),
    ):
        if topic is not None and roles.setdefault(topic, role) != role:
            raise t.error(
                role, f"{_show(topic)} is also kafka.{roles[topic]}; each role needs its own topic"
            )
    return KafkaSection(
        bootstrap,
        input_topic,
        output_topic,
        dead_letter_topic,
        ledger_topic,
        properties=_properties(t.table("properties", required=False)),
        max_event_bytes=t.integer("max_event_bytes", 1, default=MAX_EVENT_BYTES),
        stall_warning_seconds=t.number("stall_warning_seconds", 30.0, positive=True),
        **_clock(t),
        grow_partitions=_flag(t, "grow_partitions"),
        input_topic_recreated=_flag(t, "input_topic_recreated"),
        extra_topics={output_keys()[k]: v for k, v in extra.items() if v is not None},
        trust=trust,
        request_topic=request_topic,
    )


def _input_topics(t: _Table, what: str) -> tuple[str, str, str | None]:
    """``kafka.trust`` and the topics the server reads and writes besides its outputs: the
    event topic (``input_topic``), or in ``ldp-reports`` the report topic it reads and the
    request topic it writes (and never an event topic: it reads no raw value)."""
    trust = t.choice("trust", ("default", "ldp-reports"), "default")
    if trust == "default":
        for key in ("report_topic", "request_topic"):
            if key in t.data:
                raise t.error(key, 'is read only with trust = "ldp-reports"')
        return trust, t.text("input_topic", TOPIC_NAME, what), None
    if "input_topic" in t.data:
        raise t.error(
            "input_topic",
            "an ldp-reports server reads no events: its input is report_topic (the devices' "
            "reports), and it writes request_topic",
        )
    report = t.text("report_topic", TOPIC_NAME, what)
    return trust, report, t.text("request_topic", TOPIC_NAME, what)


def _flag(t: _Table, key: str) -> bool:
    """An optional true/false key (false when absent)."""
    value = t.data.get(key, False)
    if not isinstance(value, bool):
        raise t.error(key, f"must be true or false, got {_show(value)}")
    return value


def check_input_clock(clock: str, trusted: bool) -> None:
    """Refuse the ``data`` clock on Kafka unless every writer of the input topic is trusted:
    with it, one event or marker from anyone can close thousands of slots."""
    if clock not in ("markers", "data"):
        raise ValueError(f"clock must be 'markers' or 'data', got {clock!r}")
    if clock == "data" and not trusted:
        raise ValueError(
            "the data clock closes a Kafka stream's slots on the slots of its events and on "
            "unauthenticated end-of-slot markers, so anyone who can write to the input topic "
            "can force slots and make a silent user's value count again and again. Keep the "
            "default markers clock (run `privstream clock` with the clock key), or say that "
            "you trust every writer of the input topic with --trust-input-clock "
            "(kafka.trust_input_clock = true in a flow file)"
        )


def _clock(t: _Table) -> dict[str, Any]:
    """``kafka.clock`` (``markers``, default, or ``data``) and ``kafka.trust_input_clock``:
    the data clock lets every writer of the input topic close slots, so it must be trusted."""
    clock = t.choice("clock", ("markers", "data"), "markers")
    trusted = t.data.get("trust_input_clock", False)
    if not isinstance(trusted, bool):
        raise t.error("trust_input_clock", f"must be true or false, got {_show(trusted)}")
    try:
        check_input_clock(clock, trusted)
    except ValueError as exc:
        raise t.error("clock", str(exc)) from None
    return {"clock": clock, "trust_input_clock": trusted}


def _properties(t: _Table) -> dict[str, str]:
    """``[kafka.properties]``: librdkafka properties as strings. A value is never shown in an
    error (it may be a credential); the brokers are ``kafka.bootstrap``."""
    for key, value in t.data.items():
        if key == "bootstrap.servers":
            raise t.error(key, "set the brokers with kafka.bootstrap")
        if not isinstance(value, str):
            raise t.error(key, "must be a string (librdkafka properties are strings: quote it)")
    return dict(t.data)


def _population(t: _Table) -> PopulationSection:
    """``[population]``: n, and the budget ε per window that all streams share."""
    t.only(("users", "epsilon", "window", "registrations", "delta", "allow_large_delta", "retired"))
    users = t.integer("users", 1)
    epsilon = t.number("epsilon")
    try:
        check_requirement(epsilon, 1, "the population's budget")
    except ValueError as exc:
        raise t.error("epsilon", str(exc)) from None
    window = t.integer("window", 1, MAX_WINDOW)
    delta = t.number("delta") if "delta" in t.data else None
    if delta is not None and not 0 < delta < 1:
        raise t.error("delta", f"must lie in (0, 1), got {_show(t.data['delta'])}")
    retired = t.data.get("retired", [])
    if not (
        isinstance(retired, list)
        and all(isinstance(n, str) and STREAM_NAME.fullmatch(n) for n in retired)
    ):
        raise t.error("retired", f"must be a list of stream names, got {_show(retired)}")
    return PopulationSection(users, epsilon, window, t.file_path("registrations"), delta,
                             t.flag("allow_large_delta"), tuple(retired))  # fmt: skip


def _run(t: _Table) -> RunSection:
    """``[run]``: workers, processes, the recovery store and the noise key file."""
    t.only(("workers", "processes", "recovery_dir", "snapshot_interval", "secret_file"))
    return RunSection(
        workers=t.integer("workers", 1, default=1),
        processes=t.integer("processes", 1, default=1),
        recovery_dir=t.file_path("recovery_dir"),
        snapshot_interval=t.number("snapshot_interval", 10.0, positive=True),
        secret_file=t.file_path("secret_file"),
    )


def _streams(
    top: _Table, population: PopulationSection, trust: str = "default"
) -> tuple[StreamSection, ...]:
    """Every ``[[streams]]`` table, named uniquely, whose shares sum to at most 1."""
    raw = top.get("streams", "one or more [[streams]] tables")
    if not (isinstance(raw, list) and raw):
        raise top.error("streams", f"must be one or more [[streams]] tables, got {_show(raw)}")
    streams: list[StreamSection] = []
    scope_of: dict[str, Scope] = {}
    for k, item in enumerate(raw, start=1):
        t = _Table(top.source, f"streams[{k}]", item)
        name = t.text("name", STREAM_NAME, f"a stream name ({STREAM_NAME.pattern})")
        twin = next((i for i, s in enumerate(streams, start=1) if s.name == name), None)
        if twin is not None:
            raise t.error(
                "name",
                f"{_show(name)} is also the name of streams[{twin}]; stream names are unique",
            )
        t.where = f"streams[{_show(name)}]"
        stream, scopes = _stream(t, name, population, trust)
        _check_scopes(t, stream, scopes, streams, scope_of)
        streams.append(stream)
        scope_of[name] = scopes[0]
    total = math.fsum(s.share for s in streams)
    if total > budget_limit(1.0):
        shares = ", ".join(f"{s.name} {s.share:g}" for s in streams)
        raise top.error(
            "streams",
            f"the shares sum to {total:.12g} > 1 ({shares}): the streams "
            "of one population compose, so together they may spend at most "
            "population.epsilon per window",
        )
    return tuple(streams)


def _deltas(
    t: _Table, population: PopulationSection, streams: tuple[StreamSection, ...]
) -> PopulationSection:
    """The population's δ: the streams' δ composed (``accountant.compose_deltas``)."""
    deltas = {s.name: d for s in streams if (d := stream_delta(s)) is not None}
    try:
        delta = compose_deltas(deltas, population.delta, population.users,
                               allow_large=population.allow_large_delta,
                               override="population.allow_large_delta = true")  # fmt: skip
    except ValueError as exc:
        raise t.error("delta", str(exc)) from None
    return replace(population, delta=delta if deltas or population.delta else None)


def _check_scopes(
    t: _Table,
    stream: StreamSection,
    scopes: tuple[Scope, ...],
    earlier: Sequence[StreamSection],
    scope_of: Mapping[str, Scope],
) -> None:
    """Refuse a lifetime guarantee (user-level: all of a user's data, never renewed) beside a
    guarantee of another scope in one population, or inside one stream: the population's
    budget is then either per ``population.window`` or over a user's lifetime, and the two do
    not compose (``accounting.composable``): a bound over one says nothing about the other."""
    mine = [*scopes, *(scope_of[s.name] for s in earlier)]
    names = [stream.name] * len(scopes) + [s.name for s in earlier]
    lifetime = [k for k, scope in enumerate(mine) if isinstance(scope, LifetimeScope)]
    if not lifetime:
        return
    for k, scope in enumerate(mine):
        if composable(_probe(mine[lifetime[0]]), _probe(scope)) is None:
            continue
        a, b = names[lifetime[0]], names[k]
        both = f"streams {a} and {b}" if a != b else f"the mechanisms of stream {a}"
        raise t.error(None, (
            f"{both} do not compose: {a} is private over {scope_name(mine[lifetime[0]])} and "
            f"{b} over {scope_name(scope)}, and a bound over one says nothing about the other "
            "(accounting.composable); a population's budget is "
            "either per population.window or over a user's lifetime, not both: run the "
            "lifetime stream on a population of its own (a flow file of its own, with its own "
            "users and registrations)"
        ))  # fmt: skip


def _probe(scope: Scope) -> Charge:
    """A zero charge over ``scope`` (one measure for all: only the scopes are compared)."""
    return PureCharge(AllUsers(), scope, 1, 0, 0.0, 0.0, 1.0)


def _stream(
    t: _Table, name: str, population: PopulationSection, trust: str = "default"
) -> tuple[StreamSection, tuple[Scope, ...]]:
    """One ``[[streams]]`` table (ε is its share of the population's budget) and the scopes
    of its mechanisms' guarantees."""
    family = FAMILIES.get(t.text("family", what=f"one of {', '.join(FAMILIES)}"), None)
    if family is None:
        raise t.error(
            "family", f"must be one of {', '.join(FAMILIES)}; got {_show(t.data['family'])}"
        )
    options = [o.word for o in family.options]
    if family.client_path:
        options.append("client_path")
    t.only((*_STREAM_KEYS, *task_types(), *options))
    names = _mechanisms(t, family)
    task = _task(t, family)
    share = t.number("share")
    try:
        check_fraction("share", share, closed=True)
    except ValueError as exc:
        raise t.error("share", str(exc)) from None
    window = t.integer(
        "window",
        population.window,
        MAX_WINDOW,
        default=population.window,
        why=f" (a stream's window may be longer than population.window = "
        f"{population.window}, never shorter)",
    )
    split, split_text = _split(t, names)
    stream = StreamSection(
        name,
        family.name,
        tuple(names),
        task,
        share,
        share * population.epsilon,
        window,
        split_text,
        t.integer("lateness", 0, default=1),
        _options(t, family, share, population),
        _registered_only(t, family),
        _shards(t),
    )
    return stream, _check_guarantee(t, family, stream, split, population, trust)


def _shards(t: _Table) -> int | None:
    """``shards``: user shards of the stream (1..``MAX_SHARDS``; absent: none); which streams
    may have them is checked on their mechanisms (``_check_shards``)."""
    if "shards" not in t.data:
        return None
    return t.integer("shards", 1, MAX_SHARDS)


def _registered_only(t: _Table, family: Family) -> bool:
    """``registered_only``: a boolean, for LDP families (central DP is always registered)."""
    value = t.data.get("registered_only", False)
    if not isinstance(value, bool):
        raise t.error("registered_only", f"must be true or false, got {_show(value)}")
    if value and family.needs_registration:
        raise t.error(
            "registered_only", f"the {family.name} family always counts only registered users"
        )
    return value


def _mechanisms(t: _Table, family: Family) -> list[str]:
    """``mechanisms``: a list of names or one comma-separated string (``Family.names``)."""
    raw = t.get("mechanisms", f"a list of {family.name} mechanisms")
    if not (
        isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(x, str) for x in raw))
    ):
        raise t.error(
            "mechanisms",
            f"must be a list of names of {', '.join(family.mechanisms)} "
            f"(or one comma-separated string), got {_show(raw)}",
        )
    try:
        return family.names(raw)
    except ValueError as exc:
        raise t.error("mechanisms", str(exc)) from None


def _split(t: _Table, names: list[str]) -> tuple[BudgetSplit, str | None]:
    """``budget_split``: ``"equal"``, weights ``"w1,w2,…"`` or ``[w1, w2, …]``, as
    ``--budget-split`` (``BudgetSplit.parse``); required with several mechanisms."""
    raw = t.data.get("budget_split")
    if isinstance(raw, list) and all(
        isinstance(w, (int, float)) and not isinstance(w, bool) for w in raw
    ):
        raw = ",".join(repr(w) for w in raw)
    if raw is not None and not isinstance(raw, str):
        raise t.error(
            "budget_split", f'must be "equal", "w1,w2,..." or [w1, w2, ...], got {_show(raw)}'
        )
    if raw is None and len(names) > 1:
        raise t.error(
            "budget_split",
            f"missing; required with several mechanisms ({', '.join(names)} "
            'share the stream\'s ε): "equal" or weights "w1,w2,..."',
        )
    try:
        return BudgetSplit.parse(raw, len(names)), raw
    except ValueError as exc:
        raise t.error("budget_split", str(exc)) from None


def _task(t: _Table, family: Family) -> Task:
    """Exactly one task key of any family's task types (``domain``, ``range``, ``ball``, …), of
    a type the family declares, parsed by that type (``TaskType.parse_flow``); checked by the
    task class the run builds."""
    known = task_types()
    given = [key for key in known if key in t.data]
    if len(given) != 1:
        raise t.error(
            None,
            f"give exactly one of {', '.join(k.describe for k in known.values())}; got "
            f"{' and '.join(given) or 'none'}",
        )
    kind = given[0]
    own = {task.key: task for task in family.task_types}
    if kind not in own:
        allowed = " or ".join(task.describe for task in own.values())
        raise t.error(kind, f"the {family.name} family takes {allowed}")
    task: Task = own[kind].parse_flow(t)
    try:
        estimation_task(task)
    except ValueError as exc:
        raise t.error(kind, str(exc)) from None
    return task


def _options(
    t: _Table, family: Family, share: float, population: PopulationSection
) -> dict[str, Any]:
    """The family's options by name, checked by each ``Option.parse`` as the flags are, with
    their defaults where absent (``delta``: ``share × population.delta`` where that is given);
    ``client_path`` where the family has it."""
    options: dict[str, Any] = {}
    name = family.delta_option
    defaults = {name: share * population.delta} if name and population.delta is not None else {}
    for option in family.options:
        value = t.data.get(option.word, defaults.get(option.name, option.default))
        if value is None and option.default is None:  # absent, and the family's default is none
            options[option.name] = None
            continue
        kinds: tuple[type, ...] = (type(option.default),)
        if isinstance(option.default, float) or option.default is None:
            kinds = (int, float) if option.default is not None else (int, float, str)
        if isinstance(value, bool) or not isinstance(value, kinds):
            kind = {float: "a number", int: "an integer", str: "a string"}.get(
                type(option.default), "a value"
            )
            raise t.error(option.word, f"must be {kind} ({option.help}), got {_show(value)}")
        try:
            options[option.name] = option.parse(str(value))
        except ValueError as exc:
            raise t.error(option.word, f"{exc} ({option.help})") from None
    if family.client_path:
        options["client_path"] = t.choice("client_path", CLIENT_PATHS, "aggregate")
    return options


def _check_guarantee(
    t: _Table,
    family: Family,
    stream: StreamSection,
    split: BudgetSplit,
    population: PopulationSection,
    trust: str = "default",
) -> tuple[Scope, ...]:
    """Build the stream's mechanisms as the run does (``Family.make_config``: the family's own
    limits of ε, w, n, the task and the options; each mechanism its share of the stream's ε)
    and refuse one whose budget renews within a population window; their guarantees' scopes."""
    try:
        config = _family_config(family, stream, population)
        mechanisms = family.build_shared(stream.mechanisms, config, split.shares)
    except ValueError as exc:
        raise t.error(
            None,
            f"the {family.name} family refuses ε = share × population.epsilon = "
            f"{stream.share:g} × {population.epsilon:g} = {stream.epsilon:g}, "
            f"w = {stream.window}: {exc}",
        ) from None
    _check_shards(t, family, stream, mechanisms, config.task, trust)
    for mechanism in mechanisms:
        scope = mechanism.privacy_cost.scope
        renews = scope.length if isinstance(scope, PeriodScope) else None
        renews = scope.window if isinstance(scope, WindowScope) else renews
        if renews is not None and renews < population.window:
            raise t.error(
                None,
                f"with these options {mechanism.name}'s budget renews every "
                f"{renews} slot(s), fewer than population.window = {population.window}: "
                "one population window could spend more than the stream's share",
            )
    return tuple(m.privacy_cost.scope for m in mechanisms)


REGISTERED: Final = Preferences(by_user={"a registered user": (1.0, 1)})
"""A stand-in for a stream's registration table: its users are read when the flow starts."""


def _check_shards(
    t: _Table,
    family: Family,
    stream: StreamSection,
    mechanisms: list[Any],
    task: Any,
    trust: str = "default",
) -> None:
    """Refuse ``shards`` where splitting the stream's users would change a release, with the
    reason ``check_shardable`` gives at start (``Ports.shard_refusal``)."""
    if stream.shards is None:
        return
    closed = family.needs_registration or stream.registered_only
    path = stream.options.get("client_path", "aggregate")
    ports = (
        DeviceReports()
        if trust == "ldp-reports"
        else ports_for(mechanisms, task, path, REGISTERED if closed else None)
    )
    why = ports.shard_refusal(mechanisms)
    if why is not None:
        raise t.error("shards", f"{why}, so {stream.name} runs on one key")


def _family_config(family: Family, stream: StreamSection, population: PopulationSection) -> Any:
    """The family config a stream runs with (``Family.make_config``); ``ValueError`` if refused."""
    options = {k: v for k, v in stream.options.items() if k != "client_path"}
    return family.make_config(
        epsilon=stream.epsilon,
        window=stream.window,
        population=population.users,
        task=estimation_task(stream.task),
        **options,
    )


def _registrations(
    t: _Table, population: PopulationSection, streams: tuple[StreamSection, ...]
) -> PopulationSection:
    """Central-DP streams and ``registered_only`` LDP streams count exactly the registered
    users: their table is required, read and checked here. A central-DP stream's share scales
    every ε_i, so the population's guarantee needs ``ε_i ≤ ε`` and ``w_i ≥ window`` of every
    entry; a closed LDP stream gives everybody its own ε per window, which must satisfy every
    entry (``check_closed_population``); at most n users."""
    cdp = [s.name for s in streams if FAMILIES[s.family].needs_registration]
    central = [
        s.name for s in streams if FAMILIES[s.family].needs_registration or s.registered_only
    ]
    path = population.registrations
    if not central:
        if path is not None:
            raise t.error(
                "registrations",
                "no stream counts registered users (the central-DP families do: "
                + ", ".join(f.name for f in FAMILIES.values() if f.needs_registration)
                + "; an LDP stream with registered_only = true)",
            )
        return population
    if path is None:
        raise t.error(
            "registrations",
            f"missing; required by the {'central-DP' if cdp == central else 'registered'} "
            f"stream(s) {', '.join(central)}: the table (CSV user,epsilon,window or JSON lines) "
            "of the users they count, fixed before the data",
        )
    try:
        table = load_preferences(path)
    except (OSError, ValueError) as exc:
        raise t.error("registrations", str(exc)) from None
    if len(table) > population.users:
        raise t.error(
            "registrations",
            f"the table registers {len(table)} users, more than "
            f"population.users = {population.users}",
        )
    for k, (epsilon, window) in distinct_requirements(table.values()):
        try:
            check_requirement(epsilon, window, f"entry {k}")
        except ValueError as exc:
            raise t.error("registrations", str(exc)) from None
        if cdp and (epsilon > population.epsilon or window < population.window):
            raise t.error(
                "registrations",
                f"entry {k} asks (ε_i, w_i) = ({epsilon:g}, {window}); "
                f"the population's guarantee needs ε_i <= population.epsilon = "
                f"{population.epsilon:g} and w_i >= population.window = "
                f"{population.window}",
            )
    _check_closed(t, population, streams, table)
    return replace(population, preferences=table)


def _check_closed(
    t: _Table,
    population: PopulationSection,
    streams: tuple[StreamSection, ...],
    table: dict[str, tuple[float, int]],
) -> None:
    """Every ``registered_only`` stream's guarantee satisfies every entry of the table."""
    for s in streams:
        if not s.registered_only:
            continue
        family = FAMILIES[s.family]
        cost = family.build(s.mechanisms[0], _family_config(family, s, population)).privacy_cost
        try:
            check_closed_population(Preferences(by_user=table), s.epsilon, cost, population.users)
        except ValueError as exc:
            raise t.error(
                "registrations", f"for the registered_only stream {s.name}: {exc}"
            ) from None


def describe(config: FlowConfig) -> list[str]:
    """What ``privstream config check`` prints: one line per stream (name, family, mechanisms,
    task, ε = share × ε, w) and the total share."""
    pop = config.population
    lines = []
    for s in config.streams:
        split = f" (budget_split {s.budget_split})" if s.budget_split else ""
        each = (
            f" (registered users: {s.share:g} × ε_i)"
            if FAMILIES[s.family].needs_registration
            else ""
        )
        each += " (registered users only)" if s.registered_only else ""
        each += f" (on {s.shards} user shards)" if s.shards is not None else ""
        lines.append(
            f"stream {s.name}: {s.family} {', '.join(s.mechanisms)}{split}; "
            f"{_task_text(s)}; ε = {s.share:g} × {pop.epsilon:g} = "
            f"{s.epsilon:g}{each}{_delta_text(s)}; {_scope_text(s, pop)}{_measure_text(s, pop)}"
        )
    total = math.fsum(s.share for s in config.streams)
    deltas = [d for s in config.streams if (d := stream_delta(s)) is not None]
    delta = ""
    if pop.delta is not None:
        delta = f" and {math.fsum(deltas):g} of δ = {pop.delta:g} (1/n = {1 / pop.users:.3g})"
    lines.append(
        f"{len(config.streams)} stream(s), n = {pop.users}: shares sum to {total:g}, so "
        f"a user in every stream spends at most {total * pop.epsilon:g} of "
        f"ε = {pop.epsilon:g}{delta} {_span_text(config)}"
    )
    return lines


def _lifetime(stream: StreamSection, population: PopulationSection) -> bool:
    """Whether the stream's guarantee covers a user's lifetime (no window renews it)."""
    family = FAMILIES[stream.family]
    try:
        config = _family_config(family, stream, population)
        scope = family.build(stream.mechanisms[0], config).privacy_cost.scope
    except ValueError:
        return False
    return isinstance(scope, LifetimeScope)


def _scope_text(stream: StreamSection, population: PopulationSection) -> str:
    lifetime = _lifetime(stream, population)
    return "over a user's lifetime" if lifetime else f"w = {stream.window}"


def _span_text(config: FlowConfig) -> str:
    """Over what the population's budget holds: a lifetime when its streams' guarantees do
    (``_check_scopes`` refuses a mix), else per population window."""
    pop = config.population
    if all(_lifetime(s, pop) for s in config.streams):
        return "over their lifetime"
    return f"per {pop.window} slots"


def stream_delta(stream: StreamSection) -> float | None:
    """The stream's δ: its family's declared δ option (``Family.delta_option``), if any."""
    name = FAMILIES[stream.family].delta_option
    return float(stream.options[name]) if name and name in stream.options else None


def _measure_text(stream: StreamSection, population: PopulationSection) -> str:
    """A stream whose guarantee is not pure ε, in its own unit: Gaussian DP as μ (the stream's
    ε is its ε at δ), zCDP as ρ; empty for pure ε (docs/accounting.md)."""
    family = FAMILIES[stream.family]
    try:
        config = _family_config(family, stream, population)
        measure = family.build(stream.mechanisms[0], config).privacy_cost.measure
    except ValueError:
        return ""
    kind = measure_type(measure.kind)
    if not kind.title:
        return ""
    text = f"; {kind.title}: {kind.symbol} = {kind.reads(budget_of(measure)):.6g}"
    return text + kind.aside(stream.epsilon)


def _delta_text(stream: StreamSection) -> str:
    delta = stream_delta(stream)
    return f", δ = {delta:g}" if delta is not None else ""


def _task_text(stream: StreamSection) -> str:
    task = stream.task
    if isinstance(task, EstimationTask):
        own = FAMILIES[stream.family].task_types
        return next(t.show(task) for t in own if isinstance(task, t.classes))
    if isinstance(task, int):
        return f"d = {task}"
    first, second = task
    if isinstance(first, tuple):
        return f"ball center ({', '.join(f'{c:g}' for c in first)}) radius {second:g}"
    return f"range [{first:g}, {second:g}]"
