"""Prometheus metrics of privacy spend and throughput (design §7), in two registries.

**Public** — ``prometheus_client``'s default registry, served by ``serve_metrics``
(``--metrics-port``, ``--metrics-addr``, loopback by default; ``/metrics``). Prefix ``privstream_``,
labels ``{stream, mechanism}`` unless noted. Everything here is safe to show anyone: the
configuration, the spend the ledger allows, counts of decisions taken from private outputs, the
de-biased dissimilarity and the publication error of LDP reports. Never a true count, a raw
value, a user identifier — nor a stream name taken from untrusted input (unconfigured streams are
labelled ``""``). Every public name is on the allow-list ``PUBLIC_METRICS`` (the generic names of
``GENERIC_PUBLIC_METRICS`` plus the metrics families declare public, ``Family.metrics``), so a new
metric has to be classified before it can be exported (the privacy audit enforces it).

* **Ledger gauges** are read from ``Tally`` objects that live in the operator's snapshotted
  state, so after a restart they show what the recovered ledger says, and a replayed slot is
  never counted twice. The release counters (publications, approximations, nullified) are
  cumulative counts kept in that state too: Prometheus sees them as counters, yet they are exact
  across restarts.
* **Population gauges** (``BOARD.update_population``, label ``{stream}``):

  - ``privstream_population_budget``: the population's composed budget per scope;
  - ``privstream_population_scope_slots``: that scope, in slots;
  - ``privstream_population_budget_spent``: the composed spend of the most-charged user
    (or privacy class) over all mechanisms over the scope ending at the last slot;
  - ``privstream_population_budget_remaining``: the budget minus that spend;
  - ``privstream_population_mechanisms``: how many mechanisms share the budget;
  - ``privstream_population_enrolled_ratio`` (``BOARD.update_enrolment``, streams of named
    users): the enrolled users over the population n — how full it is. Under LDP the users who
    ever reported, public like every report count (the server sees who sends); under central
    DP the registration table's size, public by construction. At 1 further newcomers are
    ``population_full`` dead letters.
* **Mechanism info** (``privstream_mechanism_info``, labels ``{stream, mechanism, division,
  scope}``, value 1; ``scope`` is the guarantee's scope kind: ``window``, ``class``,
  ``stream``, ``period`` or ``lifetime`` — DPI's, a budget that never renews, for which
  ``privstream_scope_slots`` is left out and the population's scope reads 0): how the
  mechanism's ledger divides the budget among the users — ``budget`` (every user charged alike), ``population`` (LDP-IDS LSP, LPU, LPD, LPA: disjoint users, each charged
  the whole ε at most once per window, so the scope spend is the whole budget whenever anybody
  reported in the window, by design), ``user`` (CGM) or a family's declared division. Public
  code and configuration; the privacy page shows a population-division row at 100 % as normal.
* **Run gauges** (``BOARD.set_run``, no labels, 0 unless set): ``privstream_insecure_seed`` is 1
  when the run's noise comes from a public reproducible seed — its outputs are never private;
  ``privstream_evaluation`` is 1 when the mechanisms run side by side with the full budget each
  as an evaluation (``--compare``), not a release.
* **Slot clock gauges** (``BOARD.update_clock``, label ``{stream}``): ``privstream_slot_clock``
  is the stream's last closed slot (public: every release names its slot);
  ``privstream_slot_clock_jump_slots`` the most slots one advance of the clock closed in this
  process — above 1 someone forced the clock (the ``PrivstreamSlotClockJump`` alert).
* **Kafka gauge** (``connectors.kafka_health.KAFKA_CONNECTED``, label ``{client}`` = ``source``/``sink``, set by
  ``connectors.kafka_health``): ``privstream_kafka_connected`` is 1 while the flow's clients of
  that kind reach the broker — operational state that depends on the network, not the data.

**Internal** — the separate registry ``INTERNAL``, prefix ``privstream_internal_``: the counters
of events in, rejected by reason and late (true event counts), the step-latency histogram (a
timing side channel on how many events a slot held), the time of the last consumed or delivered
Kafka batch (it tells when input arrived) and the count of undeliverable dead letters. They are
ordinary process counters that
restart at 0 with the process, and are served only by ``serve_internal_metrics``
(``--internal-metrics-port``, loopback by default): reading them needs the same access as
reading the input topic.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from privstream.families.spec import MetricSpec
from privstream.mechanisms.accounting import measure_type
from privstream.mechanisms.contract import LedgerEntry
from privstream.mechanisms.guarantees import Guarantee
from privstream.mechanisms.ledger import clamp_spend
from privstream.operators.stream_state import Tally
from privstream.schema.events import LATE, DeadLetter
from privstream.schema.exposition import INTERNAL, INTERNAL_PREFIX, PREFIX

LABELS: Final = ("stream", "mechanism")  # plus "class" on the privacy class gauges
LIFETIME: Final = "lifetime"
"""``Guarantee.scope.kind`` of a budget over a user's whole lifetime in the stream (DPI): it
has no window and never renews; ``privstream_scope_slots`` is left out for it (no length) and
the population's scope reads 0."""
MEASURE: Final = "measure"
"""The label of every budget-valued gauge: the guarantee's measure (``pure``, ``approx``,
``gaussian``, ``zcdp``). Their values are in its additive unit: ε, μ² or ρ
(docs/accounting.md); a reader shows μ = √value for ``gaussian``, never the value as ε."""

# The allow-list of the public endpoint, by exposed name (counters with their ``_total``).
GENERIC_PUBLIC_METRICS: Final[frozenset[str]] = frozenset(
    {
        # configuration and ledger spend, per (stream, mechanism)
        "privstream_budget",
        "privstream_scope_slots",
        "privstream_population",
        "privstream_scope_budget_spent",
        "privstream_scope_budget_remaining",
        "privstream_window_users_used",
        "privstream_users_available",
        "privstream_last_released_slot",
        "privstream_halted",
        # counts of decisions taken from private outputs
        "privstream_publications_total",
        "privstream_approximations_total",
        "privstream_nullified_total",
        "privstream_privacy_violations_total",
        # privacy classes (public metadata and their spend; one class where users share one
        # requirement)
        "privstream_class_budget_spent",
        "privstream_class_budget_remaining",
        "privstream_class_users",
        "privstream_class_budget",
        # the population's composed budget, per stream
        "privstream_population_budget",
        "privstream_population_scope_slots",
        "privstream_population_budget_spent",
        "privstream_population_budget_remaining",
        "privstream_population_mechanisms",
        "privstream_population_enrolled_ratio",
        # how each mechanism divides its budget among the users (public code)
        "privstream_mechanism_info",
        # the unit each measure in use is read in (the privacy page shows budgets in it)
        "privstream_measure_unit",
        # how the run was configured
        "privstream_insecure_seed",
        "privstream_evaluation",
        # operational, independent of the data: whether the Kafka clients reach the broker
        "privstream_kafka_connected",
        # the slot clock, per stream (releases show the last closed slot anyway)
        "privstream_slot_clock",
        "privstream_slot_clock_jump_slots",
        # operational: seconds since each cluster member last ran its dataflow loop
        "privstream_cluster_member_progress_age_seconds",
    }
)


@dataclass(frozen=True)
class _Account:
    cost: Guarantee
    population: int
    tally: Tally
    halted: bool
    division: str = "budget"
    """How the mechanism's ledger divides the budget (``Mechanism.division``)."""
    handed: int = -1
    """The last slot whose release was handed to the output sink (``last_released_slot``),
    filled in from the board's ``_handed`` at scrape time."""


_clamp: Final = clamp_spend
"""Sums of ε/w shares round; within the ledger's own slack the spend is exactly the limit."""


def window_budget_spent(cost: Guarantee, entry: LedgerEntry | None) -> tuple[float, float]:
    """``(spent, limit)``: the most any user has spent in the window ending at the last
    released slot, and the budget it is bounded by: the window spend of the entry's class
    closest to its limit, against that class's budget (``LedgerEntry.worst``).

    Budget division: the ledger's window spend (every user is charged alike) against ε.
    Population division: a user reports at most once per window with the full ε, so the class
    has spent ε as soon as anyone reported in the window. Personalized ledgers: the class
    closest to its limit, against that class's ε_c. Before the first entry: nothing of the
    guarantee's budget.
    """
    if entry is None:
        return 0.0, cost.budget
    return _clamp(entry.spent, entry.budget), entry.budget


def _users(entry: LedgerEntry | None, name: str, population: int) -> int:
    """The entry's ``details`` count ``name`` (LDP-IDS: ``window_users``, ``available_users``)
    or, for a family that does not report it (a trusted curator uses every registered user's
    data at every slot), the users of the entry's privacy classes; before the first entry, 0
    used and the whole ``population`` available."""
    if entry is None:
        return 0 if name == "window_users" else population
    value = getattr(entry.details, name, None)
    return int(value) if value is not None else sum(c.users for c in entry.classes)


def class_label(scope: int, budget: float, guarantee: Guarantee | None = None) -> str:
    """The ``class`` label of a privacy class, its budget in the measure's own unit:
    ``w<w>_e<ε>`` (pure or approximate DP over a window), ``w<w>_rho<ρ>`` (zCDP),
    ``s<scope>_mu<μ>`` (Gaussian DP, μ = √budget: never μ² as an ε); ``s`` where the scope is
    not a window (its length in slots, e.g. a user-division ledger's reports per budget);
    ``lifetime_e<ε>`` for a lifetime scope (DPI: no window, its class scope is 0 slots, never
    read as a length); a family's own measure with its charge type's ``label`` and ``reads``."""
    kind = measure_type("pure" if guarantee is None else guarantee.measure.kind)
    if guarantee is not None and guarantee.scope.kind == LIFETIME:
        return f"{LIFETIME}_{kind.label}{kind.reads(budget):g}"  # no window: every slot counts
    prefix = "w" if guarantee is None or guarantee.window is not None else "s"
    return f"{prefix}{scope}_{kind.label}{kind.reads(budget):g}"


@dataclass(frozen=True)
class _Population:
    budget: float
    scope: int
    spent: float
    mechanisms: int
    measure: str = "pure"


_MEASURED: Final = frozenset({"budget", "spent", "remaining"})
"""The per-mechanism families whose value is a budget (labelled with ``MEASURE``)."""


def _mechanism_families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)

    def measured(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=(*LABELS, MEASURE))

    def counter(name: str, doc: str) -> CounterMetricFamily:
        return CounterMetricFamily(PREFIX + name, doc, labels=LABELS)

    return {
        "budget": measured(
            "budget",
            "Configured budget per user over the scope, in the measure's additive unit "
            "(label measure: pure ε, gaussian μ², zcdp ρ).",
        ),
        "scope": gauge(
            "scope_slots",
            "Configured scope in slots (the window w; absent where the scope is no window).",
        ),
        "population": gauge("population", "Registered population size n."),
        "spent": measured(
            "scope_budget_spent",
            "Most privacy budget any user has spent in the scope ending at the last released "
            "slot, additive unit (never above the budget; personalized: the class closest to "
            "its limit).",
        ),
        "remaining": measured(
            "scope_budget_remaining",
            "Budget left to that user: the budget (or the class's) minus the spend.",
        ),
        "used": gauge(
            "window_users_used", "Users who reported in the window (population division)."
        ),
        "available": gauge("users_available", "Users able to report at the next slot."),
        "last_slot": gauge("last_released_slot", "Index of the last released slot."),
        "halted": gauge("halted", "1 when the ledger refused a charge and the mechanism stopped."),
        "publications": counter("publications", "Slots released with a fresh estimate."),
        "approximations": counter(
            "approximations", "Slots released by repeating an earlier estimate."
        ),
        "nullified": counter("nullified", "Slots nullified to absorb budget (BA/PBA)."),
        "violations": counter("privacy_violations", "Charges the ledger refused (must stay 0)."),
    }


def _account_values(account: _Account) -> dict[str, float | None]:
    cost, tally = account.cost, account.tally
    entry = tally.last_ledger
    spent, limit = window_budget_spent(cost, entry)
    return {
        "budget": cost.budget,
        "scope": cost.window,
        "population": account.population,
        "spent": spent,
        "remaining": max(limit - spent, 0.0),
        "used": _users(entry, "window_users", account.population),
        "available": _users(entry, "available_users", account.population),
        "last_slot": account.handed,
        "halted": int(account.halted),
        "publications": tally.publications,
        "approximations": tally.approximations,
        "nullified": tally.nullified,
        "violations": tally.violations,
    }


def _class_families(accounts: dict[tuple[str, str], _Account]) -> Iterator[Metric]:
    class_labels = (*LABELS, "class", MEASURE)
    spent = GaugeMetricFamily(
        PREFIX + "class_budget_spent",
        "A privacy class's spend over its own scope (personalized mechanisms have one class "
        "per requirement, the others one class), in the measure's additive unit.",
        labels=class_labels,
    )
    remaining = GaugeMetricFamily(
        PREFIX + "class_budget_remaining",
        "The class's budget minus its spend over its scope.",
        labels=class_labels,
    )
    users = GaugeMetricFamily(
        PREFIX + "class_users",
        "Registered users in the privacy class (public metadata).",
        labels=class_labels,
    )
    budget = GaugeMetricFamily(
        PREFIX + "class_budget",
        "The privacy class's budget over its scope: its spend must never exceed it.",
        labels=class_labels,
    )
    for (stream, mechanism), account in sorted(accounts.items()):
        entry, cost = account.tally.last_ledger, account.cost
        for c in entry.classes if entry is not None else ():
            labels = [stream, mechanism, class_label(c.scope, c.budget, cost),
                      cost.measure.kind]  # fmt: skip
            c_spent = _clamp(c.spent, c.budget)
            spent.add_metric(labels, c_spent)
            remaining.add_metric(labels, max(c.budget - c_spent, 0.0))
            users.add_metric(labels, c.users)
            budget.add_metric(labels, c.budget)
    yield from (spent, remaining, users, budget)


def _account_families(accounts: dict[tuple[str, str], _Account]) -> Iterator[Metric]:
    families = _mechanism_families()
    for (stream, mechanism), account in sorted(accounts.items()):
        measure = [account.cost.measure.kind]
        for key, value in _account_values(account).items():
            if value is not None and math.isfinite(value):
                labels = [stream, mechanism, *(measure if key in _MEASURED else ())]
                families[key].add_metric(labels, float(value))
    yield from families.values()
    yield from _declared_families(accounts)
    yield from _class_families(accounts)
    yield from _unit_family(accounts)
    yield from _info_family(accounts)


def _info_family(accounts: dict[tuple[str, str], _Account]) -> Iterator[Metric]:
    """``privstream_mechanism_info{stream, mechanism, division, scope}`` = 1: each mechanism's
    division and its guarantee's scope kind (public code and configuration). A
    population-division mechanism spends its whole window budget whenever anybody reported in
    the window, so its scope spend at 100 % is normal, not an alarm; a ``lifetime`` scope has
    no window (``privstream_scope_slots`` is absent for it) and its spend never renews."""
    family = GaugeMetricFamily(
        PREFIX + "mechanism_info",
        "1 per mechanism, labelled with how its ledger divides the budget among the users "
        "(division: budget, population — the whole budget spent whenever anybody reported "
        "in the window —, user, or a family's own) and the kind of its guarantee's scope "
        "(scope: window, class, stream, period, lifetime — a budget that never renews).",
        labels=(*LABELS, "division", "scope"),
    )
    for (stream, mechanism), account in sorted(accounts.items()):
        scope = account.cost.scope.kind
        family.add_metric([stream, mechanism, account.division, scope], 1.0)
    yield family


def _unit_family(accounts: dict[tuple[str, str], _Account]) -> Iterator[Metric]:
    """``privstream_measure_unit``: for each measure in use, the symbol a person reads its
    budgets in and how from the additive unit (``linear`` or ``sqrt``), as its charge type
    declares it (``mechanisms.accounting``); a family's own measure is shown in its own unit."""
    family = GaugeMetricFamily(
        PREFIX + "measure_unit",
        "The unit a measure's budgets are read in (1 per measure in use).",
        labels=["measure", "unit", "scale"],
    )
    for kind in sorted({account.cost.measure.kind for account in accounts.values()}):
        charge = measure_type(kind)
        family.add_metric([kind, charge.symbol or charge.unit, charge.scale], 1.0)
    yield family


def _declared_metrics() -> dict[str, MetricSpec]:
    """The metrics the discovered families declare (``Family.metrics``), by name; one name
    declared by two families is exported once (the first declaration's help and reader)."""
    from privstream.families.registry import families

    declared: dict[str, MetricSpec] = {}
    for entry in families().values():
        for spec in entry.metrics:
            declared.setdefault(spec.name, spec)
    return declared


def _declared_families(accounts: dict[tuple[str, str], _Account]) -> Iterator[Metric]:
    """The families' declared gauges, one sample per (stream, mechanism) whose reader answers
    a finite value. Only public ones are exported: a metric declared internal never reaches the
    public endpoint (no family declares one yet, so none is served on ``INTERNAL`` either)."""
    for spec in _declared_metrics().values():
        if not spec.public:
            continue
        gauge = GaugeMetricFamily(PREFIX + spec.name, spec.help, labels=spec.labels)
        for (stream, mechanism), account in sorted(accounts.items()):
            for extra, value in _read(spec, account):
                gauge.add_metric([stream, mechanism, *extra], value)
        yield gauge


def _read(spec: MetricSpec, account: _Account) -> list[tuple[tuple[str, ...], float]]:
    """``spec``'s finite samples for ``account`` as (values of the labels beyond ``{stream,
    mechanism}``, value): one unlabelled sample for a reader answering a number, one per key
    for a reader answering a mapping (``MetricSpec.labels``); none where the reader cannot
    read it: every declared gauge is read for every (stream, mechanism) of the process, so a
    family's reader meets other families' entries, and one that fails on them must not fail
    the scrape (a scrape that raises serves no metric at all)."""
    extra = len(spec.labels) - len(LABELS)
    try:
        value = spec.value(account.tally, account.tally.last_ledger)
        pairs = [((), value)] if not isinstance(value, Mapping) else list(value.items())
        out = [(tuple(str(k) for k in key), float(v)) for key, v in pairs if v is not None]
    except (AttributeError, KeyError, TypeError, ValueError):
        return []
    return [(key, v) for key, v in out if len(key) == extra and math.isfinite(v)]


def public_metrics() -> frozenset[str]:
    """The public endpoint's allow-list: the generic names plus every discovered family's
    metrics declared public (``MetricSpec.public``)."""
    declared = {PREFIX + s.name for s in _declared_metrics().values() if s.public}
    return GENERIC_PUBLIC_METRICS | declared


def __getattr__(name: str) -> frozenset[str]:
    """``PUBLIC_METRICS``: ``public_metrics()``, resolved on first use (discovery is lazy)."""
    if name == "PUBLIC_METRICS":
        return public_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _population_families(populations: dict[str, _Population]) -> Iterator[Metric]:
    def gauge(name: str, doc: str, measured: bool = False) -> GaugeMetricFamily:
        labels = ("stream", MEASURE) if measured else ("stream",)
        return GaugeMetricFamily(PREFIX + "population_" + name, doc, labels=labels)

    families = {
        "budget": gauge(
            "budget",
            "The population's composed budget per scope, in the measure's additive unit "
            "(label measure: pure ε, gaussian μ², zcdp ρ).",
            True,
        ),
        "scope": gauge(
            "scope_slots", "The scope of the composed budget, in slots (0: a lifetime budget)."
        ),
        "spent": gauge(
            "budget_spent",
            "Composed spend of the most-charged user (or privacy class) over all mechanisms "
            "over the scope ending at the last slot.",
            True,
        ),
        "remaining": gauge("budget_remaining", "The composed budget minus that spend.", True),
        "mechanisms": gauge("mechanisms", "Mechanisms sharing the population's budget."),
    }
    for stream, p in sorted(populations.items()):
        spent = _clamp(p.spent, p.budget)
        values = {
            "budget": p.budget,
            "scope": p.scope,
            "spent": spent,
            "remaining": max(p.budget - spent, 0.0),
            "mechanisms": p.mechanisms,
        }
        for key, value in values.items():
            if math.isfinite(value):
                measured = key in _MEASURED
                families[key].add_metric([stream, *([p.measure] if measured else [])], value)
    yield from families.values()


def _enrolment_family(enrolment: dict[str, float]) -> Iterator[Metric]:
    family = GaugeMetricFamily(
        PREFIX + "population_enrolled_ratio",
        "Enrolled users over the population n (named users; at 1 newcomers are "
        "population_full dead letters).",
        labels=("stream",),
    )
    for stream, ratio in sorted(enrolment.items()):
        family.add_metric([stream], ratio)
    yield family


def _clock_families(clocks: dict[str, tuple[int, int]]) -> Iterator[Metric]:
    last = GaugeMetricFamily(
        PREFIX + "slot_clock", "The stream's last closed slot.", labels=("stream",)
    )
    jump = GaugeMetricFamily(
        PREFIX + "slot_clock_jump_slots",
        "The most slots a single advance of the stream's clock closed (in this process).",
        labels=("stream",),
    )
    for stream, (slot, largest) in sorted(clocks.items()):
        last.add_metric([stream], float(slot))
        jump.add_metric([stream], float(largest))
    yield from (last, jump)


def _run_families(insecure_seed: bool, evaluation: bool) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        PREFIX + "insecure_seed",
        "1 when the run's noise comes from a public reproducible seed: its outputs are never "
        "private.",
        value=int(insecure_seed),
    )
    yield GaugeMetricFamily(
        PREFIX + "evaluation",
        "1 when the mechanisms run side by side with the full budget each as an evaluation "
        "(--compare), not a release.",
        value=int(evaluation),
    )


class LedgerBoard(Collector):
    """The latest account of every (stream, mechanism) of this process, the composed budget of
    every stream's population and the run's flags, exported on scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[tuple[str, str], _Account] = {}
        self._handed: dict[tuple[str, str], int] = {}
        self._populations: dict[str, _Population] = {}
        self._clocks: dict[str, tuple[int, int]] = {}  # (last closed slot, largest advance)
        self._run = (False, False)  # (insecure_seed, evaluation)
        self._enrolment: dict[str, float] = {}

    def update(
        self,
        stream: str,
        mechanism: str,
        cost: Guarantee,
        population: int,
        tally: Tally,
        halted: bool,
        *,
        division: str = "budget",
    ) -> None:
        """Show ``mechanism``'s account on ``stream``: its guarantee ``cost``, the population
        ``n``, a copy of its ``tally``, whether it ``halted`` and its ``division``
        (``Mechanism.division``, exported on ``privstream_mechanism_info``)."""
        snapshot = Tally(**vars(tally))  # scrapes read a copy, never the live state
        key = (stream, mechanism)
        with self._lock:
            # A resumed state's releases were handed on before its snapshot was taken.
            self._handed.setdefault(key, tally.last_slot)
            self._accounts[key] = _Account(cost, population, snapshot, halted, str(division))

    def mark_handed(self, stream: str, mechanism: str, slot: int) -> None:
        """A release of ``slot`` reached the output sink's step: ``last_released_slot`` and
        ``released_through`` follow what was handed on, not what the operator computed."""
        key = (stream, mechanism)
        with self._lock:
            self._handed[key] = max(self._handed.get(key, -1), slot)

    def update_population(
        self,
        stream: str,
        budget: float,
        scope: int,
        spent: float,
        mechanisms: int,
        measure: str = "pure",
    ) -> None:
        """Show the composed budget of ``stream``'s population: ``budget`` per scope of
        ``scope`` slots, the composed spend of the most-charged user (or class) over all
        ``mechanisms`` over the scope ending at the last slot, in ``measure``'s additive unit."""
        population = _Population(
            float(budget), int(scope), float(spent), int(mechanisms), str(measure)
        )
        with self._lock:
            self._populations[stream] = population

    def update_enrolment(self, stream: str, enrolled: int, population: int) -> None:
        """Show how full ``stream``'s population of named users is: ``enrolled`` of
        ``population`` (a public count, see the module docstring)."""
        with self._lock:
            self._enrolment[stream] = enrolled / population if population > 0 else 0.0

    def update_clock(self, stream: str, last_closed: int | None, advance: int) -> None:
        """``stream``'s clock closed ``advance`` slots at once, through ``last_closed``."""
        with self._lock:
            largest = self._clocks.get(stream, (-1, 0))[1]
            slot = -1 if last_closed is None else int(last_closed)
            self._clocks[stream] = (slot, max(largest, int(advance)))

    def set_run(self, insecure_seed: bool, evaluation: bool) -> None:
        """Flag a run whose noise comes from a public reproducible seed, or that evaluates the
        mechanisms side by side with the full budget each (``--compare``)."""
        with self._lock:
            self._run = (bool(insecure_seed), bool(evaluation))

    def clear(self) -> None:
        with self._lock:
            self._accounts.clear()
            self._handed.clear()
            self._populations.clear()
            self._enrolment.clear()
            self._clocks.clear()
            self._run = (False, False)

    def released_through(self, pairs: Iterable[tuple[str, str]], slot: int) -> bool:
        """Whether every (stream, mechanism) has handed ``slot``'s release to the sink (or
        halted)."""
        with self._lock:
            for pair in pairs:
                account = self._accounts.get(pair)
                if account is None or not (account.halted or self._handed[pair] >= slot):
                    return False
        return True

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            accounts = {
                key: dataclasses.replace(account, handed=self._handed[key])
                for key, account in self._accounts.items()
            }
            populations, run = dict(self._populations), self._run
            enrolment = dict(self._enrolment)
            clocks = dict(self._clocks)
        yield from _account_families(accounts)
        yield from _population_families(populations)
        yield from _enrolment_family(enrolment)
        yield from _clock_families(clocks)
        yield from _run_families(*run)


BOARD: Final = LedgerBoard()
REGISTRY.register(BOARD)

# -- internal: true event counts and timing, never on the public endpoint ------------------------

EVENTS = Counter(
    INTERNAL_PREFIX + "events", "Events accepted into a slot.", ["stream"], registry=INTERNAL
)
REJECTED = Counter(
    INTERNAL_PREFIX + "events_rejected",
    "Events sent to the dead-letter output, by machine-readable reason.",
    ["stream", "reason"],
    registry=INTERNAL,
)
LATE_EVENTS = Counter(
    INTERNAL_PREFIX + "late_events",
    "Events for an already released slot.",
    ["stream"],
    registry=INTERNAL,
)
MARKERS_IGNORED = Counter(
    INTERNAL_PREFIX + "markers_ignored",
    "End-of-slot markers that closed nothing, by reason: already_released (the slot was "
    "released), far_future (beyond the gap limit or max_clock_jump; also a dead letter), "
    "before_any_event, unauthenticated (no valid clock-key tag; also a dead letter).",
    ["stream", "reason"],
    registry=INTERNAL,
)
STEP_SECONDS = Histogram(
    INTERNAL_PREFIX + "step_seconds",
    "Wall time of one mechanism step (one slot).",
    LABELS,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
    registry=INTERNAL,
)


class MetricsServer(NamedTuple):
    """A running metrics endpoint: the HTTP ``server`` (``server.server_address``) and the
    daemon ``thread`` serving it. ``close()`` stops it."""

    server: WSGIServer
    thread: threading.Thread

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, release the port and wait up to ``timeout`` s for the serving thread.
        Scrapes in flight run on daemon threads and never hold up the process's exit."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout)


def serve_metrics(
    port: int, addr: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY
) -> MetricsServer:
    """Serve ``registry`` (default: the public one) in the Prometheus text format on
    ``http://addr:port/metrics`` (any path) with ``prometheus_client``'s own server, from a
    daemon thread. Scrapes only take the GIL like any Python thread, so they can neither stall
    the flow nor hold up its exit. ``addr`` defaults to loopback. Raises ``OSError`` when the
    address cannot be bound."""
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)


def serve_internal_metrics(port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve the ``INTERNAL`` registry like ``serve_metrics``.

    These metrics reveal true event counts and step timing: expose them only to whoever may
    read the input topic (the default address is loopback).
    """
    return serve_metrics(port, addr, INTERNAL)


def count_dead_letter(letter: DeadLetter, streams: frozenset[str]) -> None:
    """Count a dead letter; streams outside the configured set are labelled ``""``."""
    stream = letter.stream if letter.stream in streams else ""
    REJECTED.labels(stream, letter.reason).inc()
    if letter.reason == LATE:
        LATE_EVENTS.labels(stream).inc()
