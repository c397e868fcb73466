"""The checks of ``privstream audit`` over column tables of what a flow published.

Independent of what it audits: nothing here imports the operators, the mechanisms' ledgers or
the population accountant. Every spend is recomputed from the per-slot fields of the published
JSON — sliding window sums through cumulative sums, vectorised per group with NumPy — and
compared with the budgets and with what the entries declare. A slot without an entry counts 0.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.schema.keys import release_id

RELATIVE = 1e-9
"""Relative slack of every comparison (a window sum against ε, a declared spend against ours)."""
ABSOLUTE = 1e-15
"""Absolute slack of a declared-against-recomputed comparison (sums of float charges near 0)."""
SLOT_BITS = 40
MAX_SLOT = 1 << SLOT_BITS
"""Slots must lie in ``[0, 2**40)``: a slot and its group index share one int64 sort key."""
PROBLEM_LIMIT = 50

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
Bools = NDArray[np.bool_]


@dataclass(frozen=True)
class LedgerTable:
    """One row per distinct ledger entry (first copy of each ``stream/mechanism/slot``).

    ``epsilon`` and ``window`` are the entry's guarantee's budget and window. ``plain`` marks
    the mechanisms whose users all share one requirement at every entry (a w-event guarantee
    and one class of its window: LDP-IDS, a uniform baseline over one class), whose class is
    summed over all their entries and composes under the population's declared ε; the others
    charge privacy classes of their own (personalized), each composing under ``ε_c / s``.
    ``m1``, ``m2``, ``users1``, ``users2`` and ``window_users`` are the LDP-IDS details a
    population-division entry is checked from (NaN or −1 where a family does not write them).
    ``pop_epsilon``/``pop_spent`` are NaN where an entry lacks ``population_budget`` /
    ``population_spent``. ``user_division`` marks the entries that keep one account per
    user (CGM: users join at different slots; ``plain``, one requirement), whose scope renews
    every ``period`` slots (0: the whole stream) and whose details' ``mu_spent`` (NaN where
    absent) is their most-charged user's μ.
    """

    pair: I64
    slot: I64
    population_division: Bools
    user_division: Bools
    declared_division: Bools
    """Entries of a family's own division (``DivisionSpec``): audited by its ``recompute``
    from the published entries (``Published.declared``), composed by their declared spend."""
    period: I64
    mu_spent: F64
    plain: Bools
    epsilon: F64
    window: I64
    m1: F64
    m2: F64
    users1: I64
    users2: I64
    window_users: I64
    pop_epsilon: F64
    pop_spent: F64
    evaluation: Bools
    insecure: Bools
    gid: I64
    """The entry's guarantee, as an index into ``Published.guarantees`` (equal ids: equal
    measure, parameters, scope and model)."""


@dataclass(frozen=True)
class ClassTable:
    """One row per privacy class of a ledger entry (``row`` indexes the entry): what each
    member was ``charged`` at the entry's slot and the ``spent`` it declares over the class's
    window."""

    row: I64
    window: I64
    epsilon: F64
    charged: F64
    spent: F64


@dataclass(frozen=True)
class Published:
    """What a flow published, as columns: releases, ledger entries, their classes and halts.

    ``pairs[i]`` is the ``(stream, mechanism)`` of pair index ``i``; ``release_epsilon[i]`` is
    the budget of the guarantee that pair's first release states (NaN without a release);
    ``halts`` maps a pair to the earliest slot a halt record names for it. ``releases`` holds
    the first copy of every release as columns: ``strategy`` (0 publish, 1 approximate,
    2 nullified), ``source`` (its ``source_slot``, −1 for none), ``estimate`` (a keyed hash of
    the estimate's float64 bits), ``zero`` (the estimate is all zeros: a mechanism's initial
    value), ``gid`` (its guarantee), ``insecure`` and ``evaluation`` (its flags).
    ``guarantees[gid]`` is each distinct guarantee as ``(measure, budget, delta, text)``.
    """

    pairs: list[tuple[str, str]]
    release_pair: I64
    release_slot: I64
    release_epsilon: F64
    ledger: LedgerTable
    classes: ClassTable
    halts: dict[int, int]
    gaps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Per pair, its recorded gaps ``(first, last)`` (a new incarnation's cooldown)."""
    releases: dict[str, NDArray[Any]] = field(default_factory=dict)
    guarantees: list[tuple[str, float, float, str]] = field(default_factory=list)
    declared: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """A family's own division's ledger entries by division name, as published."""

    def name(self, pair: int, slot: int) -> str:
        """The release id ``stream/mechanism/slot`` (with a keyed pair's parts after it)."""
        return pair_release_id(self.pairs[pair], slot)

    @functools.cached_property
    def bases(self) -> list[int]:
        """Each pair's base pair: a keyed pair's ``(stream, mechanism)`` (its ledger, halts and
        gaps), else itself."""
        index = {pair: p for p, pair in enumerate(self.pairs)}
        out = []
        for p, (stream, keyed) in enumerate(self.pairs):
            mechanism = keyed.split(KEY_SEP, 1)[0]
            out.append(index.get((stream, mechanism), p))
        return out


KEY_SEP = "\x1f"
"""Joins a release's mechanism and its key parts into the audit's pair name (one pair per
key: the releases of one query form one series; the ledger stays the mechanism's)."""


def keyed_mechanism(mechanism: str, key: Mapping[str, str] | None) -> str:
    """The pair name of a release: its mechanism, with its key parts (``Release.key``)."""
    return KEY_SEP.join((mechanism, *key.values())) if key else mechanism


def pair_release_id(pair: tuple[str, str], slot: int) -> str:
    """The release id of a (stream, keyed mechanism) pair at ``slot``
    (``schema.keys.release_id``)."""
    stream, mechanism, *parts = (pair[0], *pair[1].split(KEY_SEP))
    return release_id(stream, mechanism, slot, *parts)


@dataclass
class Findings:
    """Problems in the order the checks found them: the first ``limit`` are kept with their
    details (each check counts all of its own), plus notes on what could not be checked."""

    limit: int = PROBLEM_LIMIT
    problems: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, ident: str, detail: str) -> None:
        if len(self.problems) < self.limit:
            self.problems.append({"kind": kind, "id": ident, "detail": detail})

    def room(self) -> int:
        return self.limit - len(self.problems)


def close(a: Any, b: Any) -> Any:
    """Elementwise: ``a`` and ``b`` agree within ``RELATIVE`` (plus ``ABSOLUTE`` near 0)."""
    return np.abs(a - b) <= RELATIVE * np.maximum(np.abs(a), np.abs(b)) + ABSOLUTE


def window_sums(
    group: I64, slot: I64, value: NDArray[Any], at_group: I64, at_slot: I64, at_window: I64
) -> NDArray[Any]:
    """For every ``i``: Σ ``value`` over the rows of group ``at_group[i]`` whose slot lies in
    ``(at_slot[i] − at_window[i], at_slot[i]]`` — a slot without a row counts 0.

    One cumulative sum over the rows sorted by (group, slot) and two binary searches per query,
    so rows may be sparse and queries anywhere. Exact for integer values; float values are
    summed in extended precision and returned as float64. Slots lie in ``[0, MAX_SLOT)``.
    """
    order = np.lexsort((slot, group))
    key = (group[order] << SLOT_BITS) | slot[order]
    integer = value.dtype.kind in "iub"
    acc = np.cumsum(value[order], dtype=np.int64 if integer else np.longdouble)
    csum = np.concatenate((np.zeros(1, dtype=acc.dtype), acc))
    base = at_group << SLOT_BITS
    hi = np.searchsorted(key, base | at_slot, side="right")
    lo = np.searchsorted(key, base | np.maximum(at_slot - at_window + 1, 0), side="left")
    sums: NDArray[Any] = csum[hi] - csum[lo]
    return sums if integer else sums.astype(np.float64)


def _report(
    findings: Findings, pub: Published, rows: I64, mask: Bools, kind: str, detail: Any
) -> None:
    """Add the first flagged entries as problems: ``rows[k]`` is the ledger row of local
    position ``k``, ``mask`` flags the positions, ``detail(k)`` describes one."""
    led = pub.ledger
    for k in np.flatnonzero(mask)[: max(findings.room(), 0)].tolist():
        i = int(rows[k])
        findings.add(kind, pub.name(int(led.pair[i]), int(led.slot[i])), detail(k))


def group_ids(*columns: NDArray[Any]) -> tuple[I64, I64]:
    """Dense ids of the distinct tuples of ``columns`` (numbered in lexicographic order of the
    columns, first column most significant) and, per id, the first row holding it."""
    order = np.lexsort(columns[::-1])
    change = np.zeros(order.size, dtype=np.bool_)
    if order.size:
        change[0] = True
        for col in columns:
            c = col[order]
            change[1:] |= c[1:] != c[:-1]
    ids = np.empty(order.size, dtype=np.int64)
    ids[order] = np.cumsum(change) - 1
    return ids, order[change]


# -- check 1: every slot present -------------------------------------------------------------


@dataclass
class SlotCounts:
    """What ``check_slots`` counted: slots expected, missing, pairs halted, outputs after one."""

    expected: int = 0
    missing: int = 0
    halted: int = 0
    after_halt: int = 0
    gap_slots: int = 0
    in_gap: int = 0


def _slots_by_pair(pair: I64, slot: I64, pairs: int) -> list[I64]:
    """The sorted distinct slots of every pair index ``0..pairs−1``."""
    _, first = group_ids(pair, slot)
    upair, uslot = pair[first], slot[first]
    bounds = np.searchsorted(upair, np.arange(pairs + 1))
    return [uslot[bounds[p] : bounds[p + 1]] for p in range(pairs)]


def check_slots(pub: Published, expect_slots: int | None, findings: Findings) -> SlotCounts:
    """Every (stream, mechanism) has a release and a ledger entry at every slot from its first
    to its last (or to ``expect_slots``), except after a halt: a halt record at slot ``h`` makes
    slots ``≥ h`` not expected (nothing of a halted slot is released), and anything published
    after ``h`` is a problem; a recorded gap ``first..last`` (``Published.gaps``) makes its
    slots not expected, and anything published inside it is a problem. An unrecorded gap stays
    missing slots."""
    counts = SlotCounts(halted=len(pub.halts))
    n = len(pub.pairs)
    releases = _slots_by_pair(pub.release_pair, pub.release_slot, n)
    ledger = _slots_by_pair(pub.ledger.pair, pub.ledger.slot, n)
    bases = pub.bases
    releases, ledger = _keyed_slots(bases, releases, ledger)
    for p in range(n):
        seen = np.union1d(releases[p], ledger[p])
        if seen.size == 0:
            continue
        first, end = int(seen[0]), int(seen[-1])
        if expect_slots is not None:
            end = max(end, expect_slots)
        halt = pub.halts.get(p, pub.halts.get(bases[p]))
        if halt is not None:
            end = min(end, halt - 1)
            after = seen[seen > halt]
            counts.after_halt += int(after.size)
            for t in after[: max(findings.room(), 0)].tolist():
                findings.add("published_after_halt", pub.name(p, t), f"halted at slot {halt}")
        present = np.intersect1d(releases[p], ledger[p], assume_unique=True)
        present = present[(present >= first) & (present <= end)]
        skipped = _gap_slots(pub, p, seen, first, end, counts, findings)
        present = np.union1d(present, skipped)
        span = max(0, end - first + 1)
        counts.expected += span - int(skipped.size)
        counts.missing += span - int(present.size)
        _report_missing(findings, pub, p, present, first, end, (releases[p], ledger[p]))
    return counts


def _keyed_slots(
    bases: Sequence[int], releases: list[I64], ledger: list[I64]
) -> tuple[list[I64], list[I64]]:
    """Per pair, the slots of its releases and ledger entries where releases carry key parts
    (``Release.key``): a keyed pair's ledger slots are its mechanism's, and the mechanism's
    release slots are those of any of its keyed pairs — so several queries' releases of one
    slot are not duplicates. A mechanism that released every key it ever used at some slot
    publishes all its keys at every slot: a slot with one key's release missing is missing
    for that key. One that never released all its keys at one slot samples its keys (DPI: one
    query per slot), so only a slot without any release of it is missing (for the
    mechanism)."""
    if all(b == p for p, b in enumerate(bases)):
        return releases, ledger
    releases, ledger = list(releases), list(ledger)
    children: dict[int, list[int]] = {}
    for p, b in enumerate(bases):
        if b != p:
            children.setdefault(b, []).append(p)
            releases[b] = np.union1d(releases[b], releases[p])
    empty = np.empty(0, dtype=np.int64)
    for b, keyed in children.items():
        slots = np.concatenate([releases[p] for p in keyed])
        every = np.bincount(slots - slots.min()).max() == len(keyed) if slots.size else True
        for p in keyed:
            ledger[p] = ledger[b] if every else empty
            releases[p] = releases[p] if every else empty
    return releases, ledger


def _gap_slots(
    pub: Published, p: int, seen: I64, first: int, end: int, counts: SlotCounts, found: Findings
) -> I64:
    """The slots of ``first..end`` inside pair ``p``'s recorded gaps (not expected); what was
    published inside one is counted and reported."""
    inside: list[I64] = []
    for lo, hi in pub.gaps.get(p, pub.gaps.get(pub.bases[p], [])):
        published = seen[(seen >= lo) & (seen <= hi)]
        counts.in_gap += int(published.size)
        for t in published[: max(found.room(), 0)].tolist():
            found.add("published_in_gap", pub.name(p, t), f"inside the recorded gap {lo}..{hi}")
        inside.append(np.arange(max(lo, first), min(hi, end) + 1, dtype=np.int64))
    slots = np.unique(np.concatenate(inside)) if inside else np.empty(0, dtype=np.int64)
    counts.gap_slots += int(slots.size)
    return slots


def _report_missing(
    findings: Findings,
    pub: Published,
    pair: int,
    present: I64,
    first: int,
    end: int,
    sources: tuple[I64, I64],
) -> None:
    """Problems for the first slots of ``first..end`` missing from ``present`` (found through
    the gaps, so a huge range costs nothing)."""
    edges = np.concatenate(([first - 1], present, [end + 1]))
    for g in np.flatnonzero(np.diff(edges) > 1).tolist():
        start, stop = int(edges[g]) + 1, int(edges[g + 1]) - 1
        for t in range(start, min(stop, start + findings.room() - 1) + 1):
            absent = [
                what
                for what, slots in zip(("release", "ledger entry"), sources, strict=True)
                if not np.isin(t, slots)
            ]
            findings.add("missing_slot", pub.name(pair, t), " and ".join(absent) + " missing")
        if findings.room() <= 0:
            return


# -- check 3: every mechanism within its window budget ------------------------------------------


@dataclass
class WindowCounts:
    """What ``check_windows`` counted: windows over ε, over n users, per-user spends their
    charges cannot explain (user division), declared mismatches."""

    over_budget: int = 0
    over_users: int = 0
    user_spends: int = 0
    mismatches: int = 0


def check_windows(pub: Published, population: int | None, findings: Findings) -> WindowCounts:
    """Every mechanism's per-user spend over every window, recomputed from its per-slot
    charges, stays within its budget: per privacy class over the class's own window (budget
    division: the charges add up), within n reporting users (population division: each
    reporting user spends ε, at most once per window), within the bounds the charges set on
    the most-charged user's account (user division); declared window spends and user counts
    that differ from ours are mismatches."""
    counts = WindowCounts()
    _budget_windows(pub, findings, counts)
    _population_windows(pub, population, findings, counts)
    _user_windows(pub, findings, counts)
    _declared_windows(pub, findings, counts)
    return counts


def _declared_windows(pub: Published, findings: Findings, counts: WindowCounts) -> None:
    """A family's own division: its ``recompute`` (the family's ``DivisionSpec``, discovered
    through ``privstream.families``) gives each entry's spend over the scope ending there from
    the published entries; over the budget is a window over budget, and an entry claiming less
    than the recomputed spend is a declared mismatch. Its ``verify`` names what else is
    inconsistent (``division_inconsistent``); entries it cannot read are
    ``division_unreadable``. Both count as declared mismatches."""
    from privstream.mechanisms.accounting import DIVISIONS

    for name, entries in sorted(pub.declared.items()):
        division = DIVISIONS[name]
        for pair, own in sorted(_by_mechanism(entries).items()):
            try:
                problems = division.verify(own) if division.verify is not None else []
                recomputed = division.recompute(own) if division.recompute is not None else []
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                counts.mismatches += 1
                findings.add("division_unreadable", pair_release_id(pair, int(own[0]["slot"])),
                             f"{name} division: its entries cannot be recomputed: {exc!r}")  # fmt: skip
                continue
            counts.mismatches += len(problems)
            for slot, why in problems:
                findings.add(
                    "division_inconsistent", pair_release_id(pair, slot), f"{name} division: {why}"
                )
            _declared_spends(name, pair, own, recomputed, findings, counts)


def _declared_spends(
    name: str,
    pair: tuple[str, str],
    own: list[dict[str, Any]],
    recomputed: list[tuple[int, float, float]],
    findings: Findings,
    counts: WindowCounts,
) -> None:
    """A family's division's recomputed spends against their budgets and the entries' claims."""
    claimed = {e["slot"]: max(c["spent"] for c in e["classes"]) for e in own}
    for slot, spend, budget in recomputed:
        ident = pair_release_id(pair, slot)
        if spend > budget * (1 + RELATIVE):
            counts.over_budget += 1
            findings.add("window_over_budget", ident, (
                f"{name} division: recomputed spend {spend:.12g} > budget {budget:g} over the "
                "scope ending here"))  # fmt: skip
        if claimed[slot] < spend and not close(claimed[slot], spend):
            counts.mismatches += 1
            findings.add("declared_mismatch", ident, (
                f"{name} division: the entry claims {claimed[slot]:.12g} but its charges "
                f"recompute to {spend:.12g}"))  # fmt: skip


def _by_mechanism(entries: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Each (stream, mechanism)'s entries, first copy per slot, in slot order."""
    out: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for e in entries:
        out.setdefault((e["stream"], e["mechanism"]), {}).setdefault(e["slot"], e)
    return {k: [v[t] for t in sorted(v)] for k, v in out.items()}


def _budget_windows(pub: Published, findings: Findings, counts: WindowCounts) -> None:
    """Budget division: each class's charges summed over its window, against its ε. The one
    class of a ``plain`` mechanism is summed over all its entries whatever they declare; a
    personalized class by its ``(w_c, ε_c)``."""
    led, cls = pub.ledger, pub.classes
    own = led.population_division | led.user_division | led.declared_division
    keep = np.flatnonzero(~own[cls.row])
    rows, window, epsilon = cls.row[keep], cls.window[keep], cls.epsilon[keep]
    plain, pair, slot = led.plain[rows], led.pair[rows], led.slot[rows]
    group, _ = group_ids(pair, np.where(plain, 0, window), np.where(plain, 0.0, epsilon))
    sums = window_sums(group, slot, cls.charged[keep], group, slot, window)
    declared = cls.spent[keep]
    over = sums > epsilon * (1 + RELATIVE)
    wrong = ~close(sums, declared)
    counts.over_budget += int(over.sum())
    counts.mismatches += int(wrong.sum())

    def name(k: int) -> str:
        return "" if plain[k] else f"class (w={window[k]}, ε={epsilon[k]:g}): "

    _report(findings, pub, rows, over & plain, "window_over_budget", lambda k: (
        f"per-slot charges sum to {sums[k]:.12g} > ε={epsilon[k]:g} over the window of "
        f"w={window[k]} ending here"
    ))  # fmt: skip
    _report(findings, pub, rows, over & ~plain, "class_over_budget", lambda k: (
        f"{name(k)}per-slot charges sum to {sums[k]:.12g} over its window ending here"
    ))  # fmt: skip
    _report(findings, pub, rows, wrong, "declared_mismatch", lambda k: (
        f"{name(k)}spent {declared[k]:.12g} but the per-slot charges sum to "
        f"{sums[k]:.12g}"
    ))  # fmt: skip


def _population_windows(
    pub: Published, population: int | None, findings: Findings, counts: WindowCounts
) -> None:
    """Population division: the users who reported over each window (at most n), each
    reporting user's spend (exactly ε), and the one class's declared charge and window spend
    (ε when anybody reported at the slot, or in the window)."""
    led, cls = pub.ledger, pub.classes
    rows = np.flatnonzero(led.population_division)
    pair, slot, window = led.pair[rows], led.slot[rows], led.window[rows]
    reported = led.users1[rows] + led.users2[rows]
    users = window_sums(pair, slot, reported, pair, slot, window)
    declared = led.window_users[rows]
    epsilon = led.epsilon[rows]
    charged, spent = _one_class(led.slot.size, cls)
    charged, spent = charged[rows], spent[rows]
    overspent = charged > epsilon * (1 + RELATIVE)
    underspent = ~close(charged, np.where(reported > 0, epsilon, 0.0))
    underspent |= ~close(spent, np.where(users > 0, epsilon, 0.0))
    for part, users_part in ((led.m1[rows], led.users1[rows]), (led.m2[rows], led.users2[rows])):
        overspent |= (users_part > 0) & (part > epsilon * (1 + RELATIVE))
        underspent |= (users_part > 0) & ~close(part, epsilon)
    underspent &= ~overspent
    wrong = users != declared
    over_users = users > population if population is not None else np.zeros_like(wrong)
    counts.over_users += int(over_users.sum())
    counts.over_budget += int(overspent.sum())
    counts.mismatches += int(wrong.sum() + underspent.sum())
    _report(findings, pub, rows, over_users, "window_over_users", lambda k: (
        f"{users[k]} users reported over the window of w={window[k]} ending here > n={population}"
    ))  # fmt: skip
    _report(findings, pub, rows, overspent, "window_over_budget", lambda k: (
        f"a reporting user spends more than ε={epsilon[k]:g} at this slot"
    ))  # fmt: skip
    _report(findings, pub, rows, wrong | underspent, "declared_mismatch", lambda k: (
        f"window_users {declared[k]} against {users[k]} reports in the window, or a reporting "
        f"user's spend, the class's charge or its window spend differs from ε={epsilon[k]:g} "
        "(or 0 while nobody reported)"
    ))  # fmt: skip


def _user_windows(pub: Published, findings: Findings, counts: WindowCounts) -> None:
    """User division: one account per user, users joining at different slots, so the
    most-charged user's spend (the class's ``spent``) is not the sum of the per-slot
    charges, only bounded by them (``_user_bounds``); it never passes the class's ε, and the
    details' ``mu_spent`` is its square root (μ of Gaussian DP, whose budget is μ²)."""
    led, cls = pub.ledger, pub.classes
    keep = np.flatnonzero(led.user_division[cls.row])
    rows, epsilon, charged = cls.row[keep], cls.epsilon[keep], cls.charged[keep]
    spent, mu = cls.spent[keep], led.mu_spent[cls.row[keep]]
    fell, beyond, below, most = _user_bounds(led, rows, charged, spent)
    over = spent > epsilon * (1 + RELATIVE)
    inconsistent = (fell | beyond | below) & ~over
    wrong = ~np.isnan(mu) & ~close(mu, np.sqrt(spent))
    counts.over_budget += int(over.sum())
    counts.user_spends += int(inconsistent.sum())
    counts.mismatches += int(wrong.sum())

    def why(k: int) -> str:
        if fell[k]:
            return "fell since the previous entry of its scope"
        if beyond[k]:
            return f"passes {most[k]:.12g}, the spend at the slot before plus this slot's charge"
        return f"is below this slot's charge {charged[k]:.12g}"

    _report(findings, pub, rows, over, "window_over_budget", lambda k: (
        f"the most-charged user's spend {spent[k]:.12g} > ε={epsilon[k]:g} in its scope"
    ))  # fmt: skip
    _report(findings, pub, rows, inconsistent, "user_spend_inconsistent", lambda k: (
        f"the most-charged user's spend {spent[k]:.12g} {why(k)}"
    ))  # fmt: skip
    _report(findings, pub, rows, wrong, "declared_mismatch", lambda k: (
        f"mu_spent {mu[k]:.12g} but the square root of spent is {np.sqrt(spent[k]):.12g}"
    ))  # fmt: skip


def _user_bounds(
    led: LedgerTable, rows: I64, charged: F64, spent: F64
) -> tuple[Bools, Bools, Bools, F64]:
    """The bounds the per-slot charges set on a user-division spend within its scope (the
    whole stream, or each period of ``period`` slots counted from slot 0): it never falls from
    one entry to the next (``fell`` flags those that do); it never passes the spend at the
    slot before plus this slot's charge (``most``, what one user could have paid so far:
    0 before the scope's first slot; so never more than the sum of the scope's charges so far),
    checked where the slot before has an entry or the mechanism has none earlier (``beyond``:
    a lost entry's charge is unknown); and it never stays below the slot's own charge (a
    reporting user paid it: ``below``)."""
    pair, slot, period = led.pair[rows], led.slot[rows], led.period[rows]
    group, _ = group_ids(pair, np.where(period > 0, slot // np.maximum(period, 1), 0))
    order = np.lexsort((slot, group))  # by mechanism, then slot: scopes are runs of slots
    previous = np.full(rows.size, -1)  # each entry's predecessor of its mechanism
    after, before = order[1:], order[:-1]
    previous[after] = np.where(pair[after] == pair[before], before, -1)
    has = previous >= 0
    scoped = has & (group[previous] == group)
    fell = scoped & (spent < spent[previous]) & ~close(spent, spent[previous])
    most = np.where(scoped, spent[previous], 0.0) + charged
    adjacent = ~has | (slot[previous] == slot - 1)
    beyond = adjacent & (spent > most) & ~close(spent, most)
    below = (spent < charged) & ~close(spent, charged)
    return fell, beyond, below, most


def _one_class(entries: int, cls: ClassTable) -> tuple[F64, F64]:
    """Per entry, the charge and window spend of its class (NaN for an entry without one;
    meant for the entries that have exactly one)."""
    charged, spent = np.full(entries, np.nan), np.full(entries, np.nan)
    charged[cls.row], spent[cls.row] = cls.charged, cls.spent
    return charged, spent


# -- check 4: the population accountant --------------------------------------------------------


@dataclass
class AccountantCounts:
    """What ``check_accountant`` counted: windows over the population's ε, declared mismatches;
    and per composed stream ``(name, slots, spend, rows)``: at each of its slots the recomputed
    window spend of its class key closest to the budget in the ledgers' unit (ε, μ², ρ) — what
    the stream's mechanisms together charged one user — and its ledger rows."""

    over_budget: int = 0
    mismatches: int = 0
    streams: list[tuple[str, I64, F64, I64]] = field(default_factory=list)


@dataclass(frozen=True)
class _Sources:
    """The accountant's summands: one source per (mechanism, division, window, class budget),
    with the rows that charge it (``row_*``) and, per source, its attributes."""

    row_group: I64
    row_slot: I64
    row_value: F64
    pair: I64
    window: I64
    population: Bools
    classwise: Bools
    epsilon: F64
    """Population division: the mechanism's ε (a user who reports spends it); classes: ε_c·s."""


def _sources(pub: Published) -> _Sources:
    """Population division: the users who reported at each slot (a user who reports spends
    the mechanism's ε once per window); budget division: each class's per-slot charges, one
    source per ``plain`` mechanism, one per class of the others; user division: the declared
    spend of the most-charged user (it cannot be recomputed, ``check_windows`` bounds it),
    counted at its own slot (a window of 1), one source per mechanism."""
    led, cls = pub.ledger, pub.classes
    reports = np.flatnonzero(led.population_division)
    budget = np.flatnonzero(~led.population_division[cls.row])
    rows = cls.row[budget]
    user = (led.user_division | led.declared_division)[rows]
    pair = np.concatenate((led.pair[reports], led.pair[rows]))
    kind = np.concatenate(
        (np.ones(reports.size, dtype=np.int64), np.where(user, 3, np.where(led.plain[rows], 0, 2)))
    )
    window = np.concatenate((led.window[reports], np.where(user, 1, cls.window[budget])))
    epsilon = np.concatenate((led.epsilon[reports], cls.epsilon[budget]))
    key = np.where(kind == 2, epsilon, 0.0)
    group, first = group_ids(pair, kind, window, key)
    users = (led.users1 + led.users2)[reports].astype(np.float64)
    spends = np.where(user, cls.spent[budget], cls.charged[budget])
    return _Sources(
        row_group=group,
        row_slot=np.concatenate((led.slot[reports], led.slot[rows])),
        row_value=np.concatenate((users, spends)),
        pair=pair[first],
        window=window[first],
        population=kind[first] == 1,
        classwise=kind[first] == 2,
        epsilon=epsilon[first],
    )


@dataclass(frozen=True)
class _Stream:
    """One stream's composition: its ledger rows, slots, sources and their (w, ε) class keys."""

    name: str
    rows: I64
    slots: I64
    members: I64
    key_window: I64
    key_epsilon: F64


def _shares(pub: Published, pairs: I64, evaluation: bool) -> F64 | None:
    """Each personalized mechanism's share s of the population budget: 1 in an evaluation,
    else its releases' ε over the sum of the stream's mechanisms' (a production budget split
    sums to 1). None when a mechanism has no release to say it."""
    if evaluation:
        return np.ones(pairs.size)
    stated = pub.release_epsilon[np.unique(pairs)]
    if np.isnan(stated).any():
        return None
    shares: F64 = pub.release_epsilon[pairs] / stated.sum()
    return shares


def _stream_plan(
    pub: Published, src: _Sources, name: str, rows: I64, members: I64, findings: Findings
) -> _Stream | None:
    """The class key of every source of one stream — ``(w, population_budget)`` for the
    families with one requirement, ``(w_c, ε_c·s / s)`` per personalized class (12
    significant digits, so every mechanism names the same class) — or None (with a note)
    when the entries cannot say it."""
    led = pub.ledger
    if np.isnan(led.pop_epsilon[rows]).any() or np.isnan(led.pop_spent[rows]).any():
        findings.notes.append(
            f"stream {name!r}: entries without population_budget (a run from before the "
            "population accountant): composition not checked"
        )
        return None
    key_epsilon = np.empty(members.size)
    plain = ~src.classwise[members]
    if plain.any():
        single = rows[led.plain[rows]]  # else a family's own division: the population's ε
        values, seen = np.unique(
            led.pop_epsilon[single if single.size else rows], return_counts=True
        )
        key_epsilon[plain] = values[np.argmax(seen)]
    if not plain.all():
        classwise = members[~plain]
        shares = _shares(pub, src.pair[classwise], bool(led.evaluation[rows].any()))
        if shares is None:
            findings.notes.append(
                f"stream {name!r}: a personalized mechanism without releases (its budget share "
                "is unknown): composition not checked"
            )
            return None
        full = src.epsilon[classwise] / shares
        key_epsilon[~plain] = [float(f"{e:.12g}") for e in full.tolist()]
    slots = np.unique(led.slot[rows])
    return _Stream(name, rows, slots, members, src.window[members], key_epsilon)


def _plans(pub: Published, src: _Sources, findings: Findings) -> list[_Stream]:
    names, stream_of_pair = np.unique([s for s, _ in pub.pairs], return_inverse=True)
    stream_of_pair = stream_of_pair.reshape(-1).astype(np.int64)
    row_stream = stream_of_pair[pub.ledger.pair]
    order = np.argsort(row_stream, kind="stable")
    bounds = np.searchsorted(row_stream[order], np.arange(names.size + 1))
    src_stream = stream_of_pair[src.pair]
    plans = []
    for s, name in enumerate(names.tolist()):
        rows = order[bounds[s] : bounds[s + 1]]
        if rows.size:
            members = np.flatnonzero(src_stream == s)
            plan = _stream_plan(pub, src, name, rows, members, findings)
            if plan is not None:
                plans.append(plan)
    return plans


def check_accountant(pub: Published, findings: Findings) -> AccountantCounts:
    """At every slot of every stream, the mechanisms' per-user window spends — recomputed; a
    mechanism past its last entry (halted) keeps its last window spend, as the accountant
    counts it — summed per class key stay within the key's ε unless the entries are marked
    ``evaluation``; and every entry's ``population_spent`` is the composed spend of the
    class closest to its limit, whose budget is its ``population_budget``."""
    counts = AccountantCounts()
    led = pub.ledger
    src = _sources(pub)
    plans = _plans(pub, src, findings)
    if not plans:
        return counts
    last = np.full(len(pub.pairs), -1, dtype=np.int64)
    np.maximum.at(last, led.pair, led.slot)
    at_group, at_slot, at_window = [], [], []
    for plan in plans:
        k, n = plan.members.size, plan.slots.size
        at_group.append(np.repeat(plan.members, n))
        until = np.repeat(last[src.pair[plan.members]], n)
        at_slot.append(np.minimum(np.tile(plan.slots, k), until))
        at_window.append(np.repeat(src.window[plan.members], n))
    sums = window_sums(
        src.row_group, src.row_slot, src.row_value,
        np.concatenate(at_group), np.concatenate(at_slot), np.concatenate(at_window),
    )  # fmt: skip
    start = 0
    for plan in plans:
        k, n = plan.members.size, plan.slots.size
        block = sums[start : start + k * n].reshape(k, n)
        start += k * n
        population = src.population[plan.members]
        block[population] = np.where(
            block[population] > 0, src.epsilon[plan.members][population, None], 0.0
        )
        _judge(pub, plan, block, findings, counts)
    return counts


def _judge(
    pub: Published, plan: _Stream, spends: F64, findings: Findings, counts: AccountantCounts
) -> None:
    """Compose one stream's source spends per class key and compare them with the keys'
    budgets and with what the entries declare."""
    led = pub.ledger
    key, first = group_ids(plan.key_window, plan.key_epsilon)
    onehot = np.zeros((first.size, key.size))
    onehot[key, np.arange(key.size)] = 1.0
    totals = onehot @ spends
    counts.streams.append((plan.name, plan.slots, totals.max(axis=0), plan.rows))
    windows, budgets = plan.key_window[first], plan.key_epsilon[first]
    at = np.searchsorted(plan.slots, led.slot[plan.rows])
    evaluation = np.zeros(plan.slots.size, dtype=np.bool_)
    evaluation[at[led.evaluation[plan.rows]]] = True
    over = (totals > budgets[:, None] * (1 + RELATIVE)) & ~evaluation
    counts.over_budget += int(over.sum())
    for c, t in np.argwhere(over)[: max(findings.room(), 0)].tolist():
        findings.add("population_over_budget", f"{plan.name}/{int(plan.slots[t])}", (
            f"the stream's mechanisms together charged {totals[c, t]:.12g} > ε={budgets[c]:g} "
            f"over the window of w={windows[c]} ending here"
        ))  # fmt: skip
    ratio = totals / budgets[:, None]
    worst = ratio >= ratio.max(axis=0) * (1 - RELATIVE)
    declared_epsilon, declared = led.pop_epsilon[plan.rows], led.pop_spent[plan.rows]
    match = (
        worst[:, at]
        & close(totals[:, at], declared[None, :])
        & close(budgets[:, None], declared_epsilon[None, :])
    ).any(axis=0)
    counts.mismatches += int((~match).sum())
    _report(findings, pub, plan.rows, ~match, "declared_mismatch", lambda k: (
        f"population_spent {declared[k]:.12g} of budget {declared_epsilon[k]:g}, but the "
        f"class closest to its limit has {totals[:, at[k]].tolist()} of {budgets.tolist()}"
    ))  # fmt: skip
