"""Ready personalized w-event dataflow (spec personalized-w-event §9): synthetic, file or Kafka
events → BD, BA, Uniform, Sample, PLBU, PU, PBD or PBA → JSON lines or Kafka topics, with
Prometheus metrics of every privacy class's spend.

Run it with Bytewax's runner, e.g.::

    python -m bytewax.run "privstream.flows.personalized:build(dataset='sin', mechanisms='PBD,BD', users=20000, slots=300, out='releases.jsonl')"

or through ``privstream run personalized``. Guarantee: (w_i, ε_i)-EPDP for every user (spec
§1.3), central DP with a trusted curator (design §4, ``cdp``).

Users' requirements: a synthetic population gets the spec's assignment (§6.3: ten user types
drawing ε_i ≥ ε and w_i ≤ w from the Table 3 grids); otherwise the registration table
(``preferences``: user → (ε_i, w_i)) names the population and its requirements before the data
arrive, so who is counted never depends on who sent data. A secret noise key is required
(``$PRIVSTREAM_SECRET``), or an explicit ``insecure_seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bytewax.dataflow import Dataflow
from bytewax.operators import KeyedStream

from privstream.connectors.events import EventBatch
from privstream.connectors.secret import resolve_noise_key
from privstream.flows.io import KafkaIO, assemble, resolve_source, slotting_for
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Release
from privstream.mechanisms.personalized import PersonalizedConfig, mechanism_names
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.personalized import personalized
from privstream.operators.slotting import MechanismOut, Preferences
from privstream.personalized_experiments import requirement_arrays

__all__ = ["KafkaIO", "build"]


def build(
    dataset: str = "sin",
    mechanisms: str | Sequence[str] = "PBD",
    users: int = 20_000,
    slots: int = 300,
    epsilon: float = 0.6,
    window: int = 120,
    seed: int = 1,
    out: str = "releases.jsonl",
    ledger_out: str | None = None,
    dead_letter_out: str | None = None,
    lateness: int = 1,
    domain: int | None = None,
    stream: str | None = None,
    preferences: Mapping[str, tuple[float, int]] | None = None,
    progress: Callable[[Release], None] | None = None,
    kafka: KafkaIO | None = None,
    secret: NoiseKey | str | bytes | None = None,
    insecure_seed: int | None = None,
    budget_split: str | None = None,
    compare: bool = False,
) -> Dataflow:
    """The personalized w-event dataflow.

    Args:
        dataset: ``lns``, ``sin`` or ``log`` (binary synthetic streams) or ``file:PATH``.
        mechanisms: one name or a comma-separated list of BD, BA, Uniform, Sample, PLBU, PU,
            PBD, PBA.
        users: registered population size n (for files and Kafka: the most users).
        slots: slots of a synthetic dataset.
        epsilon, window: the stream's default requirement (ε, w) (paper defaults 0.6, 120).
        seed: seed of the synthetic data and requirements (never the noise).
        out, ledger_out, dead_letter_out: JSON-lines outputs (ignored with ``kafka``).
        lateness: slots a slot stays open for late events.
        domain: categories d of a file or Kafka stream (default: the dataset's, 2).
        stream: stream name (defaults to the dataset name).
        preferences: the registration table, user id → (ε_i, w_i): exactly these users are
            the population (required for file and Kafka input, whose users are named; others'
            events are ``unregistered_user`` dead letters).
        progress: called with every release.
        kafka: read events from and write outputs to Kafka.
        secret, insecure_seed, budget_split, compare: the noise key and how several
            mechanisms share the budget (see ``flows.ldp_ids.build``).
    """
    names = mechanism_names(mechanisms)
    key = resolve_noise_key(secret, insecure_seed)
    split = BudgetSplit.parse(budget_split, len(names), compare=compare)
    source = resolve_source(dataset, users, slots, seed, domain, None, stream)
    if not isinstance(source.task, FrequencyTask):
        raise ValueError(f"the personalized mechanisms release histograms; {dataset!r} is numeric")
    if source.synthetic is not None and kafka is None:
        eps, win = requirement_arrays(users, epsilon, window, seed)
        prefs = Preferences(epsilons=eps, windows=win)
    elif preferences:
        prefs = Preferences(by_user=dict(preferences))
    else:
        raise ValueError(
            "central DP counts only registered users, fixed before the data arrive: give the "
            "registration table (user,epsilon,window) with --registrations FILE"
        )
    config = PersonalizedConfig(population=users, epsilon=epsilon, window=window, task=source.task)
    slotting = slotting_for(kafka, lateness, "aggregate")

    def operator(keyed: KeyedStream[EventBatch]) -> MechanismOut:
        return personalized(
            "personalized",
            keyed,
            mechanism=names,
            config=config,
            secret=key,
            slotting=slotting,
            preferences=prefs,
            split=split,
        )

    return assemble(
        "privstream_personalized",
        source,
        names,
        operator,
        kafka=kafka,
        out=out,
        ledger_out=ledger_out,
        dead_letter_out=dead_letter_out,
        progress=progress,
    )
