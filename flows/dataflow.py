"""The ready dataflow of every mechanism family: synthetic, file or Kafka events → the family's
mechanisms → JSON lines or Kafka topics, with Prometheus metrics of the privacy spend.

Run it with Bytewax's runner, e.g.::

    python -m bytewax.run "privstream.flows.dataflow:build('ldp-ids', dataset='sin', mechanisms='LPA', users=20000, slots=100, out='releases.jsonl')"

with ``PRIVSTREAM_SECRET`` set in the environment, or through ``privstream run <family>``.
Several mechanisms can run over the same input in one flow, each with its own ledgers and its
share of ε (``budget_split``), or side by side with the full ε each as an evaluation
(``compare``). Guarantee: each mechanism's declared one (``families.registry``), composed over
the mechanisms of a production run. A secret noise key is required (``$PRIVSTREAM_SECRET``), or
an explicit ``insecure_seed``.

Parameters of ``build``:

    dataset: a synthetic dataset name (``lns``, ``sin``, ``log``, their ``-con`` variants)
        or ``file:PATH`` for a CSV/JSONL file of ``(user, slot, value)`` records.
    mechanisms: one name or a comma-separated list (default: the family's default).
    users: registered population size n (for files and Kafka: the most users).
    slots: slots of a synthetic dataset (ignored for files).
    epsilon, window: the population's budget ε per window of w slots (the family's
        defaults when None); for central-DP families the default requirement.
    seed: seed of the synthetic data (and of a synthetic registration; never the noise).
    out, ledger_out, dead_letter_out: JSON-lines outputs (ignored with ``kafka``).
    extra_out: the family's declared extra outputs to write, name → JSON-lines path
        (``Family.outputs``; ignored with ``kafka``, whose ``extra_topics`` route them); an
        output not named is written nowhere.
    lateness, client_path: slotting options (``SlottingConfig``).
    domain, mean_range, ball: task of a file or Kafka stream: ``d`` categories (default 2),
        the ``(lower, upper)`` clipping range of a numeric mean, or ``(centre, radius)`` the L2
        ball of vector values (families that estimate means).
    task: the ``EstimationTask`` a family's own task type parsed (its flag or flow key); it
        wins over the three above.
    stream: stream name (defaults to the dataset name).
    preferences: the registration table, user id → (ε_i, w_i): of a central-DP family,
        exactly these users are counted (required for file and Kafka input); of an LDP family,
        a closed population: only these users enrol (optional; each entry's requirement must
        hold under the stream's ε per window).
    progress: called with every release.
    kafka: read events from and write outputs to Kafka (open slots then stay open when the
        flow stops: the stream goes on).
    secret, insecure_seed: the noise key (design §6) — a ``NoiseKey`` or its text (≥ 128
        bits), else ``$PRIVSTREAM_SECRET``; without either the flow refuses to build unless
        ``insecure_seed`` asks for a reproducible run, whose outputs are all marked.
    budget_split, compare: how several mechanisms share the population's ε: ``equal`` or
        weights ``w1,w2,…``; or an evaluation with the full ε each (outputs marked).
    options: the family's own config options (``Family.options``, e.g. LDP-IDS ``beta``).

"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from bytewax.dataflow import Dataflow

from privstream.families.registry import Family, family
from privstream.flows.io import (
    KafkaIO,
    Source,
    assemble,
    resolve_source,
    slotting_for,
    stream_plan,
)
from privstream.flows.secret import resolve_noise_key
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.contract import Release
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import EstimationTask, FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences

__all__ = ["KafkaIO", "build"]


def build(
    family_name: str,
    dataset: str = "sin",
    mechanisms: str | Sequence[str] | None = None,
    users: int | None = None,
    slots: int = 800,
    epsilon: float | None = None,
    window: int | None = None,
    seed: int = 1,
    out: str = "releases.jsonl",
    ledger_out: str | None = None,
    dead_letter_out: str | None = None,
    lateness: int = 1,
    client_path: str = "aggregate",
    domain: int | None = None,
    mean_range: tuple[float, float] | None = None,
    ball: tuple[tuple[float, ...], float] | None = None,
    task: EstimationTask | None = None,
    stream: str | None = None,
    preferences: Mapping[str, tuple[float, int]] | None = None,
    progress: Callable[[Release], None] | None = None,
    kafka: KafkaIO | None = None,
    secret: NoiseKey | str | bytes | None = None,
    insecure_seed: int | None = None,
    budget_split: str | None = None,
    compare: bool = False,
    extra_out: Mapping[str, str] | None = None,
    **options: Any,
) -> Dataflow:
    """The dataflow of the family ``family_name`` (``families.registry.FAMILIES``); the
    parameters are described in the module docstring."""
    entry = family(family_name)
    names = entry.names(mechanisms or entry.default)
    routed = {**(extra_out or {}), **(kafka.extra_topics if kafka is not None else {})}
    for name in routed:
        entry.output(name)  # refuses an output the family does not declare
    key = resolve_noise_key(secret, insecure_seed)
    split = BudgetSplit.parse(budget_split, len(names), compare=compare)
    users = users or entry.users
    eps, win = epsilon or entry.epsilon, window or entry.window
    source = resolve_source(
        dataset, users, slots, seed, domain, mean_range, stream, entry.bench.independent, ball,
        task=task, datasets=entry.sources,
    )  # fmt: skip
    check_task(entry, source.task, dataset)
    config = entry.make_config(
        epsilon=eps, window=win, population=users, task=source.task, **options
    )
    registration = _registration(entry, source, kafka, preferences, (users, eps, win, seed))
    if kafka is not None and kafka.published:  # a new incarnation's cooldown (issue 18 §2)
        kafka = kafka.with_gaps({source.stream: stream_plan(entry, names, config, registration)})
    step = entry.name.replace("-", "_")
    operator = functools.partial(
        family_mechanisms, step, family=entry, mechanism=names, config=config, secret=key,
        slotting=slotting_for(kafka, lateness, client_path), split=split,
        registration=registration,
    )  # fmt: skip
    return assemble(f"privstream_{step}", source, names, operator, kafka=kafka, out=out,
                    ledger_out=ledger_out, dead_letter_out=dead_letter_out,
                    progress=progress, extra_out=extra_out)  # fmt: skip


def check_task(entry: Family, task: EstimationTask, dataset: str) -> None:
    """Refuse a source whose task none of the family's task types covers (``Family.accepts``).
    A family that takes both histograms and means lets its config judge the rest (an LDP oracle
    refuses a ball)."""
    if entry.accepts(task) or (entry.takes("domain") and entry.takes("range")):
        return
    frequency = isinstance(task, FrequencyTask)
    if entry.takes("domain") and not frequency:
        raise ValueError(f"the {entry.name} mechanisms release histograms; {dataset!r} is numeric")
    if entry.takes("range") and frequency:
        raise ValueError(
            f"the {entry.name} mechanisms release means: give a numeric dataset or --domain LO:HI"
        )
    kinds = ", ".join(t.flag or t.key for t in entry.task_types)
    raise ValueError(
        f"the {entry.name} mechanisms take a task of {kinds}; {dataset!r} gives a {task.kind} task"
    )


def _registration(
    entry: Family,
    source: Source,
    kafka: KafkaIO | None,
    preferences: Mapping[str, tuple[float, int]] | None,
    setting: tuple[int, float, int, int],
) -> Preferences | None:
    """The registration of a central-DP family: a synthetic population's assignment
    (``Family.requirements``) or the given table; an LDP family's closed population (the given
    table, optional)."""
    if not entry.needs_registration:
        if preferences and source.synthetic is not None and kafka is None:
            raise ValueError(
                f"a synthetic {entry.name} stream addresses users by index: a registration "
                "table names users of file or Kafka input"
            )
        return Preferences(by_user=dict(preferences)) if preferences else None
    if source.synthetic is not None and kafka is None:
        if entry.requirements is None:  # users share the stream's requirement: all registered
            users = setting[0]
            return Preferences(epsilons=np.full(users, np.nan), windows=np.zeros(users, np.int64))
        eps, win = entry.requirements(*setting)
        return Preferences(epsilons=eps, windows=win)
    if preferences:
        return Preferences(by_user=dict(preferences))
    raise ValueError(
        "central DP counts only registered users, fixed before the data arrive: give the "
        "registration table (user,epsilon,window) with --registrations FILE"
    )
