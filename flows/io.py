"""Inputs and outputs every ready flow shares: synthetic, file or Kafka in; files or Kafka out.

A family's flow (``flows/ldp_ids.py``, ...) resolves its ``Source``, calls ``events`` for the
parsed, stream-keyable batches, runs its operator, and hands the ``MechanismOut`` to ``outputs``.
Step ids made here ("synthetic", "file", "kafka_in", "parse", "split_parsed",
"dead_letters", "count_dead_letters", "log_dead_letters", "*_out") are part of the recovery
format ("columns", stateless, runs only in a new incarnation that skips published slots).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from bytewax import operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.operators import KeyedStream, StatefulBatchLogic

from privstream.connectors import control
from privstream.connectors.control import StopSignal
from privstream.connectors.csv_events import parse_csv_lines
from privstream.connectors.datasets import SlotStream, synthetic_dataset
from privstream.connectors.json_events import parse_json_lines
from privstream.connectors.jsonl import jsonl_output
from privstream.connectors.kafka import (
    POLL_MESSAGES,
    KafkaEventSource,
    KafkaSettings,
    RawBatch,
    dead_letter_message,
    parse_raw_batch,
    record_message,
)
from privstream.connectors.kafka_sink import kafka_output
from privstream.connectors.parsed import split_parsed
from privstream.connectors.sources import SyntheticSource, detect_format, file_source
from privstream.families.registry import Family, FamilyConfig
from privstream.families.spec import DatasetFactory
from privstream.flows.config import check_input_clock
from privstream.mechanisms.contract import ExtraRecord, Gap, Halt, Release
from privstream.mechanisms.tasks import BallTask, EstimationTask, FrequencyTask, MeanTask
from privstream.operators.metrics import BOARD, count_dead_letter
from privstream.operators.registration import Preferences
from privstream.operators.slotting import MechanismOut, SlottingConfig
from privstream.runtime.republish import StreamPlan, gap_records, plan_gaps, skip_published
from privstream.schema.events import MAX_EVENT_BYTES, DeadLetter, EventBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """Where a flow's events come from and what they are."""

    stream: str
    task: EstimationTask
    synthetic: SlotStream | None = None
    path: str | None = None


def resolve_source(
    dataset: str,
    users: int,
    slots: int,
    seed: int,
    domain: int | None = None,
    mean_range: tuple[float, float] | None = None,
    stream: str | None = None,
    independent: bool = False,
    ball: tuple[tuple[float, ...], float] | None = None,
    *,
    task: EstimationTask | None = None,
    datasets: Mapping[str, DatasetFactory] | None = None,
) -> Source:
    """Turn ``--dataset`` (a synthetic name or ``file:PATH``) into a ``Source``.

    With Kafka input the dataset only names the stream and its task (the categories of a
    synthetic dataset, or ``domain``/``mean_range``); the events come from the topic.
    ``task``: a family's own task (wins over the rest); ``datasets``: the family's datasets
    (``Family.sources``), tried before the built-in synthetic ones.
    """
    if dataset.startswith("file:"):
        path = dataset.removeprefix("file:")
        if task is None:
            task = MeanTask(*mean_range) if mean_range else FrequencyTask(domain or 2)
            task = BallTask(*ball) if ball is not None else task
        return Source(stream or "file", task, path=path)
    name = dataset.lower()
    factory = (datasets or {}).get(name)
    if factory is not None:
        synthetic = factory(users, slots, seed, task)
    else:
        synthetic = synthetic_dataset(name, users, slots, seed, independent=independent)
    own = getattr(synthetic, "task", None)  # a family's dataset may state its task
    task = task or (own if isinstance(own, EstimationTask) else None)
    return Source(stream or name, task or _synthetic_task(synthetic, domain, mean_range),
                  synthetic=synthetic)  # fmt: skip


def _synthetic_task(
    synthetic: SlotStream, domain: int | None, mean_range: tuple[float, float] | None
) -> EstimationTask:
    """A synthetic stream's task: ``mean_range`` or ``domain`` where given, else its own."""
    if mean_range is not None:
        return MeanTask(*mean_range)
    if domain is not None:
        return FrequencyTask(domain)
    return MeanTask(*synthetic.bounds) if synthetic.numeric else FrequencyTask(synthetic.d)


@dataclass(frozen=True)
class KafkaIO:
    """Kafka topics of a flow.

    Attributes:
        settings: cluster and client properties.
        input_topic: user events (design §5).
        output_topic: releases keyed by ``release_id`` (compacted topic recommended).
        dead_letter_topic: rejected events (original bytes, reason headers); optional — without
            it dead letters are counted in the metrics and logged by reason only.
        ledger_topic: ledger entries; optional.
        until_slot: stop once every mechanism has released this slot (batch runs, tests);
            None runs until stopped (SIGTERM).
        batch_size: most messages per poll.
        max_event_bytes: larger messages are ``oversized`` dead letters.
        partitions: the input topic's partition count (``require_topics`` gives it;
            ``privstream run`` sets it). The slotting closes a slot only once every partition
            has passed it, and refuses events from a partition beyond this count.
        stall_warning_seconds: warn (rate-limited) once a source partition has heard nothing
            from the broker, or a sink has had messages waiting undelivered, this long.
        stop_file: a cluster's ``until_slot`` stop: the process that sees every stream
            through ``until_slot`` creates this file, and every process stops once it exists
            (each stream's progress lives on one worker; the processes share a host).
        clock: what closes slots (``SlottingConfig.clock``): ``markers`` (default) — only
            end-of-slot markers authenticated with the clock key; ``data`` — the events' own
            slots and any marker, which lets whoever writes to the input topic force slots, so
            it needs ``trust_input_clock``.
        trust_input_clock: the operator vouches for every writer of the input topic (``data``).
        published: each stream's last slot published by an earlier incarnation (the store's
            floors, ``privstream.runtime.republish``): events of those slots are ``already_published``
            dead letters, so no release id is computed twice.
        gaps: each mechanism's cooldown after its stream's floor (``republish.plan_gaps``,
            set by ``with_gaps``): its events are ``incarnation_cooldown`` dead letters and
            its ``Gap`` records go to the ledger output once.
        new_population: the operator states that a new incarnation's population is a new one
            (a whole-stream guarantee may then start afresh after the published slots).
        released: each stream's last slot on the release topic when a resume withdrew users
            (``Incarnation.released``): the withdrawal starts after it
            (``SlottingConfig.released``).
        grow_partitions: accept a recovery store written for fewer input partitions
            (``SlottingConfig.grow_partitions``): the added partitions start at each stream's
            last released slot and every budget is kept.
        input_topic_recreated: accept an input topic that was deleted and re-created since the
            recovery store was written (another topic id): read every partition of the new
            topic from its beginning (``KafkaEventSource``); without it the resume is refused.
        extra_topics: a family's declared extra outputs (``Family.outputs``) by name → topic,
            delivered like the ledger (or the epoch fails); an output not named here is
            written nowhere.
        request_topic: ``ldp-reports``: where the server writes its requests
            (``input_topic`` is then the report topic it reads).
    """

    settings: KafkaSettings
    input_topic: str
    output_topic: str
    dead_letter_topic: str | None = None
    ledger_topic: str | None = None
    until_slot: int | None = None
    batch_size: int = POLL_MESSAGES
    max_event_bytes: int = MAX_EVENT_BYTES
    partitions: int = 1
    stall_warning_seconds: float = 30.0
    stop_file: str | None = None
    clock: str = "markers"
    trust_input_clock: bool = False
    published: Mapping[str, int] = field(default_factory=dict)
    released: Mapping[str, int] = field(default_factory=dict)
    gaps: tuple[Gap, ...] = ()
    new_population: bool = False
    grow_partitions: bool = False
    input_topic_recreated: bool = False
    extra_topics: Mapping[str, str] = field(default_factory=dict)
    request_topic: str | None = None

    def __post_init__(self) -> None:
        check_input_clock(self.clock, self.trust_input_clock)
        if self.output_topic in self.extra_topics.values():
            raise ValueError(
                f"an extra output is routed to the release topic {self.output_topic!r}: give "
                "it its own topic (an output never goes onto the public releases)"
            )

    def topics(self) -> list[str]:
        names = [self.input_topic, self.output_topic, self.dead_letter_topic, self.ledger_topic,
                 self.request_topic]  # fmt: skip
        return [t for t in [*names, *self.extra_topics.values()] if t]

    def with_partitions(self, counts: Mapping[str, int]) -> KafkaIO:
        """This with the input topic's partition count taken from ``counts`` (topic → partition
        count, as ``require_topics`` returns it)."""
        return replace(self, partitions=counts[self.input_topic])

    def with_gaps(self, plans: Mapping[str, StreamPlan]) -> KafkaIO:
        """This with the cooldown of every stream of ``plans`` after its floor
        (``republish.plan_gaps``; raises ``IncompatibleState`` for a whole-stream guarantee)."""
        gaps = plan_gaps(self.published, plans, new_population=self.new_population)
        return replace(self, gaps=gaps)


POLL_MAX_ENV: Final = "PRIVSTREAM_POLL_MAX"
"""Most messages per poll of a Kafka source (default ``KafkaIO.batch_size``: ``POLL_MESSAGES``):
a tuning knob; the releases are the same whatever it is (``make chaos`` replays with another)."""


def poll_max(kafka: KafkaIO) -> int:
    """The source's messages per poll: ``$PRIVSTREAM_POLL_MAX`` if set, else ``batch_size``."""
    text = os.environ.get(POLL_MAX_ENV, "").strip()
    if not text:
        return kafka.batch_size
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{POLL_MAX_ENV} must be a whole number >= 1, got {text!r}")
    return int(text)


def events(
    flow: Dataflow,
    source: Source,
    kafka: KafkaIO | None = None,
    stop: StopSignal | None = None,
) -> tuple[Stream[EventBatch], Stream[DeadLetter] | None]:
    """Input step(s): parsed event batches and the dead letters of parsing (None when the
    source needs no parsing)."""
    shapes = {source.stream: source.task.value_shape}
    if kafka is not None:
        return kafka_events(flow, kafka, [source.stream], stop, shapes)
    if source.synthetic is not None:
        batches: Stream[Any] = op.input(
            "synthetic", flow, SyntheticSource(source.synthetic, source.stream)
        )
        return batches, None
    assert source.path is not None
    lines = op.input("file", flow, file_source(source.path))
    parse = parse_csv_lines if detect_format(source.path) == "csv" else parse_json_lines

    def parse_batch(batch: list[str]) -> list[Any]:
        return parse(batch, default_stream=source.stream, shapes=source.task.value_shape)

    return _split_parsed(op.flat_map_batch("parse", lines, parse_batch))


def kafka_events(
    flow: Dataflow,
    kafka: KafkaIO,
    streams: Sequence[str],
    stop: StopSignal | None,
    shapes: Mapping[str, int] | None = None,
) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    """The Kafka input steps: polls of every partition, parsed on the worker that read them
    into event batches of the configured ``streams`` and dead letters (``shapes``: each
    stream's value shape, its task's ``value_shape``)."""
    raw: Stream[RawBatch] = op.input(
        "kafka_in",
        flow,
        KafkaEventSource(
            kafka.settings,
            kafka.input_topic,
            batch_size=poll_max(kafka),
            stop=stop,
            stall_seconds=kafka.stall_warning_seconds,
            recreated=kafka.input_topic_recreated,
        ),
    )
    published = bool(kafka.published)
    batches, dead = parse_polls(raw, streams, shapes, kafka.max_event_bytes, published)
    if not published:
        return batches, dead
    batches, skipped = skip_published(batches, kafka.published, kafka.gaps)
    columns = op.map("columns", batches, without_bytes)  # (skipped rows keep their bytes)
    return columns, op.merge("parse_or_published", dead, skipped)


def parse_polls(
    raw: Stream[RawBatch],
    streams: Sequence[str],
    shapes: Mapping[str, int] | None,
    max_bytes: int = MAX_EVENT_BYTES,
    keep_bytes: bool = False,
) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    """The ``parse`` step of Kafka polls: each message judged on its own against its stream
    (``shapes``: value shape per stream), so a replay whose polls are cut elsewhere gives the
    same rows and dead letters (``tests/flows/test_poll_sizes.py``). The batches carry columns
    and where each row's message is, not its bytes (``keep_bytes``: they do, for a later step
    of this process; ``without_bytes`` drops them before the batches cross to their owner)."""
    known, shaped = list(streams), dict(shapes or {})

    def parse_poll(batch: RawBatch) -> list[EventBatch | DeadLetter]:
        return parse_raw_batch(
            batch, streams=known, max_bytes=max_bytes, shapes=shaped, keep_bytes=keep_bytes
        )

    return _split_parsed(op.flat_map("parse", raw, parse_poll))


def without_bytes(batch: EventBatch) -> EventBatch:
    """``batch`` without its rows' original bytes (its columns and their locations stay)."""
    return batch if batch.raw is None else replace(batch, raw=None)


def _split_parsed(parsed: Stream[Any]) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    return split_parsed("split_parsed", parsed)


def outputs(
    mech: MechanismOut,
    parse_errors: Stream[DeadLetter] | None,
    *,
    pairs: Sequence[tuple[str, str]],
    kafka: KafkaIO | None = None,
    stop: StopSignal | None = None,
    out: str | None = None,
    ledger_out: str | None = None,
    dead_letter_out: str | None = None,
    progress: Callable[[Release], None] | None = None,
    extra_out: Mapping[str, str] | None = None,
) -> None:
    """Write releases, ledger entries and dead letters to Kafka topics or JSON-lines files,
    count dead letters in the metrics, and stop at ``kafka.until_slot`` once every (stream,
    mechanism) of ``pairs`` has released it. Extra outputs go where they are routed:
    ``extra_out`` (name → JSON-lines path) or ``kafka.extra_topics``; nowhere else."""
    known = frozenset(stream for stream, _mechanism in pairs)
    releases = op.inspect(
        "handed",
        mech.releases,
        lambda _step, release: BOARD.mark_handed(release.stream, release.mechanism, release.slot),
    )
    if progress is not None:
        op.inspect("progress", releases, lambda _step, release: progress(release))
    dead = (
        mech.dead_letters
        if parse_errors is None
        else op.merge("dead_letters", parse_errors, mech.dead_letters)
    )
    op.inspect("count_dead_letters", dead, lambda _step, letter: count_dead_letter(letter, known))
    if kafka is None:
        jsonl_output("releases_out", releases, out or "releases.jsonl")
        if ledger_out:
            jsonl_output("ledger_out", mech.ledger, ledger_out)
        if dead_letter_out:
            jsonl_output("dead_letters_out", dead, dead_letter_out)
        for name, stream in extra_streams(mech.extra, extra_out or {}):
            jsonl_output(f"{_ident(name)}_out", stream, (extra_out or {})[name])
        return
    _kafka_outputs(kafka, releases, mech.ledger, dead)
    for name, stream in extra_streams(mech.extra, kafka.extra_topics):
        kafka_output(f"{_ident(name)}_out", stream, kafka.settings, kafka.extra_topics[name],
                     record_message, stall_seconds=kafka.stall_warning_seconds)  # fmt: skip
    if kafka.until_slot is not None:
        assert stop is not None, "until_slot needs a stop signal"
        _stop_at(kafka, stop, pairs, _release_progress(releases, mech.ledger))


def extra_streams(
    extra: Stream[ExtraRecord] | None, routes: Mapping[str, str]
) -> list[tuple[str, Stream[ExtraRecord]]]:
    """One stream per routed extra output (``routes``: output name → sink), each holding only
    the records of that name; an output without a route is dropped (never written)."""
    if extra is None or not routes:
        return []
    return [
        (name, op.filter(f"extra_{_ident(name)}", extra, functools.partial(_named, name)))
        for name in sorted(routes)
    ]


def _named(name: str, record: ExtraRecord) -> bool:
    return record.output == name


def _ident(name: str) -> str:
    return name.replace("-", "_")


def _kafka_outputs(
    kafka: KafkaIO, releases: Stream[Release], ledger: Stream[Any], dead: Stream[DeadLetter]
) -> None:
    """Releases and ledger entries (with a new incarnation's gap records) are delivered or the
    epoch fails; dead letters best effort, or logged without a dead-letter topic."""
    stall = kafka.stall_warning_seconds
    kafka_output("releases_out", releases, kafka.settings, kafka.output_topic, record_message,
                 stall_seconds=stall)  # fmt: skip
    if kafka.gaps and kafka.ledger_topic:
        ledger = op.merge("ledger_and_gaps", ledger, gap_records(ledger.flow(), kafka.gaps))
    if kafka.ledger_topic:
        kafka_output("ledger_out", ledger, kafka.settings, kafka.ledger_topic, record_message,
                     stall_seconds=stall)  # fmt: skip
    if kafka.dead_letter_topic:
        kafka_output("dead_letters_out", dead, kafka.settings, kafka.dead_letter_topic,
                     dead_letter_message, best_effort=True, stall_seconds=stall)  # fmt: skip
    else:
        op.inspect(
            "log_dead_letters",
            dead,
            lambda _step, letter: log.warning(
                "dead letter (%s) dropped: no --dead-letter-topic", letter.reason
            ),
        )


def _stop_at(
    kafka: KafkaIO, stop: StopSignal, pairs: Sequence[tuple[str, str]], progress_of: Any
) -> None:
    """Stop once every (stream, mechanism) of ``pairs`` released ``kafka.until_slot`` (or
    another member of the cluster said so through the stop file). Slots an earlier incarnation
    published (``kafka.published``) count as released: this incarnation skips them, and a run
    told to stop at one of them would otherwise wait for ever."""
    last, stop_file = kafka.until_slot, kafka.stop_file
    assert last is not None
    on_topic = {pair: kafka.published[pair[0]] for pair in pairs if pair[0] in kafka.published}
    progress_of.update(on_topic)  # an earlier incarnation's releases: this one skips them
    done = sorted({stream for (stream, _), slot in on_topic.items() if slot >= last})
    if done:
        logging.getLogger("privstream.status").info(  # shown without -v
            "stream(s) %s: slot %d is already on the release topic (an earlier incarnation "
            "published through it), so --slots %d is reached for them", done, last, last,
        )  # fmt: skip

    def released() -> bool:
        if progress_of.through(pairs, last):
            if stop_file is not None:
                Path(stop_file).touch()
            return True
        return stop_file is not None and os.path.exists(stop_file)

    stop.when(released, f"slot {last} released")


HALTED: Final = 2**62
"""The progress of a halted mechanism: it will release nothing more, so it is done."""


class ReleaseProgress:
    """The last slot handed on per (stream, mechanism), read from the release stream and the
    ``Halt`` records of the ledger stream — what ``KafkaIO.until_slot`` waits for. Kept in a
    recovered state (``_ProgressLogic``), so a run resumed after its last slot stops at once."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def update(self, last: Mapping[tuple[str, str], int]) -> None:
        """Raise each pair's last slot to ``last``'s (it never goes back)."""
        with self._lock:
            for pair, slot in last.items():
                self._last[pair] = max(slot, self._last.get(pair, slot))

    def through(self, pairs: Iterable[tuple[str, str]], slot: int) -> bool:
        """Every pair has released ``slot`` (or halted)."""
        with self._lock:
            return all(self._last.get(pair, -1) >= slot for pair in pairs)


Progress = dict[tuple[str, str], int]


class _ProgressLogic(StatefulBatchLogic[Any, None, Progress]):
    """Every stream's released slots per mechanism (a halted one counts as done)."""

    def __init__(self, progress: ReleaseProgress, resume: Progress | None) -> None:
        self.progress = progress
        self.last: Progress = dict(resume or {})
        progress.update(self.last)

    def on_batch(self, values: list[Any]) -> tuple[Iterable[None], bool]:
        for item in values:
            key = (item.stream, item.mechanism)
            slot = HALTED if isinstance(item, Halt) else item.slot
            self.last[key] = max(self.last.get(key, -1), slot)
        self.progress.update(self.last)
        return (), StatefulBatchLogic.RETAIN

    def snapshot(self) -> Progress:
        return dict(self.last)


def _release_progress(releases: Stream[Release], ledger: Stream[Any]) -> ReleaseProgress:
    """Track each stream's released slots (and halts) in the recovered step ``release_progress``."""
    progress = ReleaseProgress()
    halts = op.filter("halts", ledger, lambda item: isinstance(item, Halt))
    # one key: one worker sees every stream's progress (a cluster's --slots stop needs that)
    done = op.key_on("progress_key", op.merge("progress_in", releases, halts), lambda _e: "all")
    op.stateful_batch("release_progress", done, lambda resume: _ProgressLogic(progress, resume))
    return progress


def assemble(
    flow_id: str,
    source: Source,
    mechanisms: Sequence[str],
    operator: Callable[[KeyedStream[EventBatch]], MechanismOut],
    *,
    kafka: KafkaIO | None = None,
    out: str | None = None,
    ledger_out: str | None = None,
    dead_letter_out: str | None = None,
    progress: Callable[[Release], None] | None = None,
    extra_out: Mapping[str, str] | None = None,
) -> Dataflow:
    """A ready flow: ``source`` → parse → key by stream → ``operator`` → outputs.

    With Kafka, a fresh ``StopSignal`` ends the input on SIGTERM or at ``kafka.until_slot``.
    The metrics board is cleared so the endpoint shows this flow's ledgers.
    """
    stop = control.fresh() if kafka is not None else None
    BOARD.clear()
    flow = Dataflow(flow_id)
    batches, parse_errors = events(flow, source, kafka, stop)
    keyed = op.key_on("by_stream", batches, lambda b: b.stream)
    outputs(
        operator(keyed),
        parse_errors,
        pairs=[(source.stream, m) for m in mechanisms],
        kafka=kafka,
        stop=stop,
        out=out,
        ledger_out=ledger_out,
        dead_letter_out=dead_letter_out,
        progress=progress,
        extra_out=extra_out,
    )
    return flow


def stream_plan(
    entry: Family, names: Sequence[str], config: FamilyConfig, registration: Preferences | None
) -> StreamPlan:
    """What the cooldown of a new incarnation needs of one stream (``republish.StreamPlan``):
    each mechanism's declared guarantee and the registered classes' windows."""
    windows: set[int] = set()
    if registration is not None:
        windows.update(int(w) for _eps, w in registration.by_user.values())
        if registration.windows is not None:
            windows.update(int(w) for w in set(registration.windows.tolist()) if w)
    guarantees = tuple(entry.build(name, config).privacy_cost for name in names)
    return StreamPlan(tuple(names), guarantees, tuple(sorted(windows)))


def slotting_for(kafka: KafkaIO | None, lateness: int, client_path: str) -> SlottingConfig:
    """Slotting of a ready flow: bounded inputs release their open slots at the end and close
    slots on their own slots (the ``data`` clock); a Kafka stream keeps them open for the next
    run, closes them on its clock (``KafkaIO.clock``: authenticated markers by default), and
    only once every partition of the input topic has passed them (files and synthetic sources
    are one partition)."""
    return SlottingConfig(
        lateness=lateness,
        client_path=client_path,  # type: ignore[arg-type]
        close_on_eof=kafka is None,
        partitions=1 if kafka is None else kafka.partitions,
        clock="data" if kafka is None else kafka.clock,  # type: ignore[arg-type]
        grow_partitions=kafka is not None and kafka.grow_partitions,
        released=() if kafka is None else tuple(sorted(kafka.released.items())),
    )
