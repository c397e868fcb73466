"""Prometheus metrics of privacy spend and throughput (design §7).

Everything is registered in ``prometheus_client``'s default registry, which Bytewax serves on its
dataflow API (``BYTEWAX_DATAFLOW_API_ENABLED``, ``/metrics``). Prefix ``privstream_``, labels
``{stream, mechanism}``.

* **Ledger gauges** are read from ``Tally`` objects that live in the operator's snapshotted
  state, so after a restart they show what the recovered ledger says, and a replayed slot is
  never counted twice. The release counters (publications, approximations, nullified) are
  cumulative counts kept in that state too: Prometheus sees them as counters, yet they are exact
  across restarts.
* **Throughput counters** (events in, rejected by reason, late events) and the step-latency
  histogram are ordinary process counters; they restart at 0 with the process.

Only public or already-private quantities are exported: configured ε/w/n, the per-user spend the
ledger allows, counts of decisions made from private outputs, the de-biased dissimilarity and
the publication error of LDP reports, and counts of events. Never a true count, a raw value, a
user identifier — nor a stream name taken from untrusted input (unconfigured streams are
labelled ``""``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from privstream.connectors.events import LATE, DeadLetter
from privstream.mechanisms.contract import LedgerEntry, PrivacyCost, Release
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE, TOLERANCE

PREFIX: Final = "privstream_"
LABELS: Final = ("stream", "mechanism")  # plus "class" on the personalized class gauges


@dataclass
class Tally:
    """One mechanism's running account on one stream: part of the snapshotted operator state."""

    publications: int = 0
    approximations: int = 0
    nullified: int = 0
    skipped: int = 0
    violations: int = 0
    last_slot: int = -1
    last_ledger: LedgerEntry | None = None
    last_dissimilarity: float | None = None
    last_error: float | None = None

    def record(self, events: Iterable[Release | LedgerEntry]) -> None:
        for event in events:
            if isinstance(event, LedgerEntry):
                self.last_ledger = event
                continue
            self.last_slot = event.slot
            if event.strategy == "publish":
                self.publications += 1
            elif event.strategy == "approximate":
                self.approximations += 1
            elif event.strategy == "nullified":
                self.nullified += 1
            else:
                self.skipped += 1
            if event.dissimilarity is not None:
                self.last_dissimilarity = event.dissimilarity
            if event.error is not None:
                self.last_error = event.error


@dataclass(frozen=True)
class _Account:
    cost: PrivacyCost
    population: int
    tally: Tally
    halted: bool


def _clamp(spent: float, limit: float) -> float:
    # Sums of ε/w shares round; within the ledger's own slack the spend is exactly the limit.
    return min(spent, limit) if spent <= limit * (1 + RELATIVE_TOLERANCE) + TOLERANCE else spent


def window_budget_spent(cost: PrivacyCost, entry: LedgerEntry | None) -> tuple[float, float]:
    """``(spent, limit)``: the most any user has spent in the window ending at the last
    released slot, and the budget it is bounded by.

    Budget division: the ledger's window spend (every reporting user spends the same) against
    ε. Population division: a user reports at most once per window with the full ε, so the
    spend is ε as soon as anyone reported in the window. Personalized ledgers (``classes``): the
    class closest to its limit, against that class's ε_c.
    """
    if entry is None:
        return 0.0, cost.epsilon
    if entry.classes:
        return _clamp(entry.window_spent, entry.epsilon), entry.epsilon
    if cost.division == "budget":
        return _clamp(entry.window_spent, cost.epsilon), cost.epsilon
    return (cost.epsilon if entry.window_users > 0 else 0.0), cost.epsilon


def class_label(window: int, epsilon: float) -> str:
    """The ``class`` label of a personalized privacy class: ``w<window>_e<ε>``."""
    return f"w{window}_e{epsilon:g}"


class LedgerBoard(Collector):
    """The latest account of every (stream, mechanism) of this process, exported on scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[tuple[str, str], _Account] = {}

    def update(
        self,
        stream: str,
        mechanism: str,
        cost: PrivacyCost,
        population: int,
        tally: Tally,
        halted: bool,
    ) -> None:
        snapshot = Tally(**vars(tally))  # scrapes read a copy, never the live state
        with self._lock:
            self._accounts[(stream, mechanism)] = _Account(cost, population, snapshot, halted)

    def clear(self) -> None:
        with self._lock:
            self._accounts.clear()

    def released_through(self, pairs: Iterable[tuple[str, str]], slot: int) -> bool:
        """Whether every (stream, mechanism) has released ``slot`` (or halted)."""
        with self._lock:
            for pair in pairs:
                account = self._accounts.get(pair)
                if account is None or not (account.halted or account.tally.last_slot >= slot):
                    return False
        return True

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            accounts = dict(self._accounts)

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=LABELS)

        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "epsilon": gauge("epsilon", "Configured window budget ε per user."),
            "window": gauge("window", "Configured window size w in slots."),
            "population": gauge("population", "Registered population size n."),
            "spent": gauge(
                "window_budget_spent",
                "Most privacy budget any user has spent in the window ending at the last "
                "released slot (never above ε; personalized: the class closest to its limit).",
            ),
            "remaining": gauge(
                "window_budget_remaining",
                "Budget left to that user: ε (or the class's ε_c) minus the spend.",
            ),
            "used": gauge(
                "window_users_used", "Users who reported in the window (population division)."
            ),
            "available": gauge("users_available", "Users able to report at the next slot."),
            "last_slot": gauge("last_released_slot", "Index of the last released slot."),
            "dis": gauge("dissimilarity", "Last de-biased dissimilarity estimate (private)."),
            "err": gauge("publication_error", "Last potential publication error (public)."),
            "halted": gauge(
                "halted", "1 when the ledger refused a charge and the mechanism stopped."
            ),
            "publications": counter("publications", "Slots released with a fresh estimate."),
            "approximations": counter(
                "approximations", "Slots released by repeating an earlier estimate."
            ),
            "nullified": counter("nullified", "Slots nullified to absorb budget (BA/PBA)."),
            "violations": counter(
                "privacy_violations", "Charges the ledger refused (must stay 0)."
            ),
        }
        class_labels = (*LABELS, "class")
        class_spent = GaugeMetricFamily(
            PREFIX + "class_window_budget_spent",
            "Personalized mechanisms: a privacy class's spend over its own window w_c.",
            labels=class_labels,
        )
        class_remaining = GaugeMetricFamily(
            PREFIX + "class_window_budget_remaining",
            "Personalized mechanisms: ε_c minus the class's window spend.",
            labels=class_labels,
        )
        class_users = GaugeMetricFamily(
            PREFIX + "class_users",
            "Personalized mechanisms: registered users in the class (public metadata).",
            labels=class_labels,
        )
        for (stream, mechanism), account in sorted(accounts.items()):
            labels = [stream, mechanism]
            cost, tally = account.cost, account.tally
            entry = tally.last_ledger
            spent, limit = window_budget_spent(cost, entry)
            for c in (entry.classes or ()) if entry is not None else ():
                c_labels = [stream, mechanism, class_label(c.window, c.epsilon)]
                c_spent = _clamp(c.window_spent, c.epsilon)
                class_spent.add_metric(c_labels, c_spent)
                class_remaining.add_metric(c_labels, max(c.epsilon - c_spent, 0.0))
                class_users.add_metric(c_labels, c.users)
            values = {
                "epsilon": cost.epsilon,
                "window": cost.window,
                "population": account.population,
                "spent": spent,
                "remaining": max(limit - spent, 0.0),
                "used": entry.window_users if entry is not None else 0,
                "available": entry.available_users if entry is not None else account.population,
                "last_slot": tally.last_slot,
                "dis": tally.last_dissimilarity,
                "err": tally.last_error,
                "halted": int(account.halted),
                "publications": tally.publications,
                "approximations": tally.approximations,
                "nullified": tally.nullified,
                "violations": tally.violations,
            }
            for key, value in values.items():
                if value is not None and math.isfinite(value):
                    families[key].add_metric(labels, float(value))
        yield from families.values()
        yield from (class_spent, class_remaining, class_users)


BOARD: Final = LedgerBoard()
REGISTRY.register(BOARD)

EVENTS = Counter(PREFIX + "events", "Events accepted into a slot.", ["stream"], registry=REGISTRY)
REJECTED = Counter(
    PREFIX + "events_rejected",
    "Events sent to the dead-letter output, by machine-readable reason.",
    ["stream", "reason"],
    registry=REGISTRY,
)
LATE_EVENTS = Counter(
    PREFIX + "late_events", "Events for an already released slot.", ["stream"], registry=REGISTRY
)
STEP_SECONDS = Histogram(
    PREFIX + "step_seconds",
    "Wall time of one mechanism step (one slot).",
    LABELS,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
    registry=REGISTRY,
)


def count_dead_letter(letter: DeadLetter, streams: frozenset[str]) -> None:
    """Count a dead letter; streams outside the configured set are labelled ``""``."""
    stream = letter.stream if letter.stream in streams else ""
    REJECTED.labels(stream, letter.reason).inc()
    if letter.reason == LATE:
        LATE_EVENTS.labels(stream).inc()
