"""What a ``privstream run`` accepted and rejected, for the operator's own terminal.

The counts come from the internal counters ``EVENTS`` and ``REJECTED``
(``privstream.operators.metrics``): true counts of this process, so they go to the stderr of
the run that read the input, never to a public metric or output. A summary holds counts by
dead-letter reason only: no raw value, no user id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType

from prometheus_client import Counter

from privstream.operators.metrics import EVENTS, REJECTED

INTERRUPTED: int = 128 + signal.SIGINT
"""The exit status of a bounded run stopped by Ctrl-C (the shell's convention for SIGINT)."""

CSV_HINT: str = (
    " (a file holds JSON lines or comma-separated CSV with the columns user,slot,value: "
    "docs/cli.md)"
)
"""How a file run that accepted nothing ends its line: the format it expects."""


@dataclass(frozen=True)
class RunCounts:
    """Events accepted into a slot and dead letters by reason, in this process."""

    accepted: int = 0
    rejected: Mapping[str, int] = field(default_factory=dict)

    @property
    def total_rejected(self) -> int:
        return sum(self.rejected.values())

    def since(self, before: RunCounts) -> RunCounts:
        """What was counted after ``before`` (the counters are per process, not per run)."""
        reasons = {r: n - before.rejected.get(r, 0) for r, n in self.rejected.items()}
        return RunCounts(
            self.accepted - before.accepted, {r: n for r, n in reasons.items() if n > 0}
        )


def _totals(counter: Counter, label: str | None) -> dict[str, int]:
    """The counter's values summed by ``label`` (everything under ``""`` when None)."""
    sums: dict[str, int] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if not sample.name.endswith("_total"):
                continue
            key = "" if label is None else sample.labels[label]
            sums[key] = sums.get(key, 0) + int(sample.value)
    return sums


def counts_now() -> RunCounts:
    """The process's counts so far (take one before a run and ``since`` it after)."""
    return RunCounts(_totals(EVENTS, None).get("", 0), _totals(REJECTED, "reason"))


def _rejected_text(counts: RunCounts) -> str:
    by_reason = ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.rejected.items()))
    return f"{counts.total_rejected} events rejected ({by_reason})"


def summary_line(counts: RunCounts, dead_letters: str | None, keep_flag: str) -> str:
    """One line: accepted and rejected by reason, and where the dead letters went
    (``dead_letters``: a file or topic) or the flag (``keep_flag``) that keeps them."""
    accepted = f"accepted {counts.accepted} events"
    if not counts.rejected:
        return f"{accepted}, rejected none"
    where = f"dead letters in {dead_letters}" if dead_letters else f"add {keep_flag} to keep them"
    return f"{accepted}; {_rejected_text(counts)}; {where}"


def nothing_accepted(
    counts: RunCounts, resumed: bool, dead_letters: str | None, keep_flag: str, hint: str = ""
) -> str | None:
    """The one line of a bounded run that accepted no event (it exits 1), or None when it
    accepted some or was a resume with nothing left to read (a store that had already read the
    whole input: it rejected nothing either); ``hint`` ends the line."""
    if counts.accepted or (resumed and not counts.rejected):
        return None
    if not counts.rejected:
        return "the run accepted no event: its input was empty"
    where = f"see {dead_letters}" if dead_letters else f"add {keep_flag} to see them"
    return f"the run accepted no event: all {_rejected_text(counts)}; {where}{hint}"


@contextlib.contextmanager
def exit_on_interrupt(line: Callable[[], str]) -> Iterator[None]:
    """While inside, Ctrl-C (SIGINT) ends a bounded run at once with one line (``line()``) on
    stderr and exit status ``INTERRUPTED``, without a Rust panic or traceback; the handler
    before is back on leaving. Guarantee: this is a kill as
    ``tests/integration/test_recovery_kills.py`` exercises it: the recovery store keeps its
    last committed snapshot and the file sinks truncate to it on resume (they flush and fsync
    every batch), so a resume releases exactly what an uninterrupted run would."""

    def on_interrupt(_signum: int, _frame: FrameType | None) -> None:
        sys.stderr.write(f"{line()}\n")
        sys.stderr.flush()
        os._exit(INTERRUPTED)

    before = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
