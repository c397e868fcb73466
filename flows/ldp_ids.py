"""Ready LDP-IDS dataflow: a synthetic or file source → LDP-IDS mechanisms → JSON lines.

Run it with Bytewax's runner, e.g.::

    python -m bytewax.run "privstream.flows.ldp_ids:build(dataset='sin', mechanisms='LPA', users=20000, slots=100, out='releases.jsonl')"

or through ``privstream run ldp-ids``. Several mechanisms can run over the same input in one
flow; each keeps its own ledgers. Guarantee: w-event ε-LDP for every user (spec ldp-ids §1.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bytewax import operators as op
from bytewax.dataflow import Dataflow, Stream

from privstream.connectors.events import EventBatch, parse_csv_lines, parse_json_lines
from privstream.connectors.jsonl import jsonl_output
from privstream.connectors.sources import SyntheticSource, detect_format, file_source
from privstream.connectors.synthetic import DATASETS, SyntheticStream
from privstream.mechanisms.contract import Release
from privstream.mechanisms.ldp_ids import LdpIdsConfig, mechanism_names
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask, MeanTask
from privstream.operators.ldp_ids import ldp_ids
from privstream.operators.slotting import SlottingConfig


@dataclass(frozen=True)
class Source:
    """Where a flow's events come from and what they are."""

    stream: str
    task: EstimationTask
    synthetic: SyntheticStream | None = None
    path: str | None = None


def resolve_source(
    dataset: str,
    users: int,
    slots: int,
    seed: int,
    domain: int | None = None,
    mean_range: tuple[float, float] | None = None,
    stream: str | None = None,
) -> Source:
    """Turn ``--dataset`` (a synthetic name or ``file:PATH``) into a ``Source``."""
    if dataset.startswith("file:"):
        path = dataset.removeprefix("file:")
        task: EstimationTask = MeanTask(*mean_range) if mean_range else FrequencyTask(domain or 2)
        return Source(stream or "file", task, path=path)
    name = dataset.lower()
    if name not in DATASETS:
        raise ValueError(
            f"unknown dataset {dataset!r}; use one of {', '.join(DATASETS)} or file:PATH"
        )
    synthetic = SyntheticStream(name, users, slots, seed=seed)
    task = MeanTask(*synthetic.bounds) if synthetic.numeric else FrequencyTask(synthetic.d)
    return Source(stream or name, task, synthetic=synthetic)


def events(flow: Dataflow, source: Source) -> tuple[Stream[EventBatch], Stream[Any] | None]:
    """Input step(s): parsed event batches and the dead letters of parsing (None when the
    source needs no parsing)."""
    if source.synthetic is not None:
        batches: Stream[Any] = op.input(
            "synthetic", flow, SyntheticSource(source.synthetic, source.stream)
        )
        return batches, None
    assert source.path is not None
    lines = op.input("file", flow, file_source(source.path))
    parse = parse_csv_lines if detect_format(source.path) == "csv" else parse_json_lines

    def parse_batch(batch: list[str]) -> list[Any]:
        return parse(batch, default_stream=source.stream)

    parsed = op.flat_map_batch("parse", lines, parse_batch)
    split = op.branch("split_parsed", parsed, lambda item: isinstance(item, EventBatch))
    return split.trues, split.falses


def build(
    dataset: str = "sin",
    mechanisms: str | Sequence[str] = "LPA",
    users: int = 200_000,
    slots: int = 800,
    epsilon: float = 1.0,
    window: int = 20,
    seed: int = 1,
    out: str = "releases.jsonl",
    ledger_out: str | None = None,
    dead_letter_out: str | None = None,
    beta: float = 0.5,
    lateness: int = 1,
    client_path: str = "aggregate",
    domain: int | None = None,
    mean_range: tuple[float, float] | None = None,
    stream: str | None = None,
    progress: Callable[[Release], None] | None = None,
) -> Dataflow:
    """The LDP-IDS dataflow.

    Args:
        dataset: ``lns``, ``sin``, ``log`` (or a ``-con`` variant) for a synthetic population,
            or ``file:PATH`` for a CSV/JSONL file of ``(user, slot, value)`` records.
        mechanisms: one name or a comma-separated list of LBU, LSP, LPU, LBD, LBA, LPD, LPA.
        users: registered population size n (for files: the most users the stream may have).
        slots: slots of a synthetic dataset (ignored for files).
        epsilon, window, beta: ε, w and β of every mechanism.
        seed: secret seed of the mechanisms' randomness (and the synthetic dataset's seed).
        out, ledger_out, dead_letter_out: JSON-lines outputs (the last two optional).
        lateness, client_path: slotting options (see ``SlottingConfig``).
        domain, mean_range: task of a file dataset: ``d`` categories (default 2) or the
            ``(lower, upper)`` clipping range of a numeric mean.
        stream: stream name (defaults to the dataset name, or the records' ``stream`` field).
        progress: called with every release (for progress bars).
    """
    names = mechanism_names(mechanisms)
    source = resolve_source(dataset, users, slots, seed, domain, mean_range, stream)
    config = LdpIdsConfig(
        epsilon=epsilon, window=window, population=users, task=source.task, beta=beta
    )
    slotting = SlottingConfig(lateness=lateness, client_path=client_path)  # type: ignore[arg-type]

    flow = Dataflow("privstream_ldp_ids")
    batches, parse_errors = events(flow, source)
    keyed = op.key_on("by_stream", batches, lambda b: b.stream)
    mech = ldp_ids("ldp_ids", keyed, mechanism=names, config=config, secret=seed, slotting=slotting)
    all_releases = mech.releases
    if progress is not None:
        op.inspect("progress", all_releases, lambda _step, release: progress(release))
    jsonl_output("releases_out", all_releases, out)
    if ledger_out:
        jsonl_output("ledger_out", mech.ledger, ledger_out)
    if dead_letter_out:
        jsonl_output(
            "dead_letters_out",
            mech.dead_letters
            if parse_errors is None
            else op.merge("dead_letters", parse_errors, mech.dead_letters),
            dead_letter_out,
        )
    return flow
