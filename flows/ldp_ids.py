"""Ready LDP-IDS dataflow: synthetic, file or Kafka events → LDP-IDS mechanisms → JSON lines or
Kafka topics, with Prometheus metrics of the privacy spend.

Run it with Bytewax's runner, e.g.::

    python -m bytewax.run "privstream.flows.ldp_ids:build(dataset='sin', mechanisms='LPA', users=20000, slots=100, out='releases.jsonl')"

with ``PRIVSTREAM_SECRET`` set in the environment

or through ``privstream run ldp-ids``. Several mechanisms can run over the same input in one
flow, each with its own ledgers and its share of ε (``budget_split``), or side by side with the
full ε each as an evaluation (``compare``). Guarantee: w-event ε-LDP for every user (spec
ldp-ids §1.3), composed over the mechanisms of a production run. A secret noise key is
required (``$PRIVSTREAM_SECRET``), or an explicit ``insecure_seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bytewax.dataflow import Dataflow
from bytewax.operators import KeyedStream

from privstream.connectors.events import EventBatch
from privstream.connectors.secret import resolve_noise_key
from privstream.flows.io import KafkaIO, Source, assemble, resolve_source, slotting_for
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Release
from privstream.mechanisms.ldp_ids import LdpIdsConfig, mechanism_names
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.ldp_ids import ldp_ids
from privstream.operators.slotting import MechanismOut

__all__ = ["KafkaIO", "Source", "build", "resolve_source"]


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
    kafka: KafkaIO | None = None,
    secret: NoiseKey | str | bytes | None = None,
    insecure_seed: int | None = None,
    budget_split: str | None = None,
    compare: bool = False,
) -> Dataflow:
    """The LDP-IDS dataflow.

    Args:
        dataset: ``lns``, ``sin``, ``log`` (or a ``-con`` variant) for a synthetic population,
            or ``file:PATH`` for a CSV/JSONL file of ``(user, slot, value)`` records.
        mechanisms: one name or a comma-separated list of LBU, LSP, LPU, LBD, LBA, LPD, LPA.
        users: registered population size n (for files: the most users the stream may have).
        slots: slots of a synthetic dataset (ignored for files).
        epsilon, window, beta: ε, w and β of every mechanism.
        seed: seed of the synthetic dataset (data only; never the noise).
        out, ledger_out, dead_letter_out: JSON-lines outputs (the last two optional).
        lateness, client_path: slotting options (see ``SlottingConfig``).
        domain, mean_range: task of a file dataset: ``d`` categories (default 2) or the
            ``(lower, upper)`` clipping range of a numeric mean.
        stream: stream name (defaults to the dataset name, or the records' ``stream`` field).
        progress: called with every release (for progress bars).
        kafka: read events from and write outputs to Kafka instead (``out``,
            ``ledger_out`` and ``dead_letter_out`` are then ignored; ``dataset`` only names the
            stream and its task). Open slots stay open when the flow stops: the stream goes on.
        secret: the noise key (design §6): a ``NoiseKey`` or its text (≥ 128 bits), else
            ``$PRIVSTREAM_SECRET``; without either the flow refuses to build unless
            ``insecure_seed`` asks for a reproducible run, whose outputs are all marked
            ``insecure_seed`` (not private).
        budget_split: several mechanisms share the population's ε: ``equal`` or weights
            ``w1,w2,…`` (each runs with its share; the population accountant composes them).
        compare: run several mechanisms side by side with the full ε each — an evaluation,
            whose outputs are all marked ``evaluation`` (their composition is not bounded by ε).
    """
    names = mechanism_names(mechanisms)
    key = resolve_noise_key(secret, insecure_seed)
    split = BudgetSplit.parse(budget_split, len(names), compare=compare)
    source = resolve_source(dataset, users, slots, seed, domain, mean_range, stream)
    config = LdpIdsConfig(
        epsilon=epsilon, window=window, population=users, task=source.task, beta=beta
    )
    slotting = slotting_for(kafka, lateness, client_path)

    def operator(keyed: KeyedStream[EventBatch]) -> MechanismOut:
        return ldp_ids(
            "ldp_ids",
            keyed,
            mechanism=names,
            config=config,
            secret=key,
            slotting=slotting,
            split=split,
        )

    return assemble(
        "privstream_ldp_ids",
        source,
        names,
        operator,
        kafka=kafka,
        out=out,
        ledger_out=ledger_out,
        dead_letter_out=dead_letter_out,
        progress=progress,
    )
