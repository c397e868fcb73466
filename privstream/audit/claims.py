"""The checks of ``privstream audit`` on what the outputs *claim*, beside what they spend.

``audit_checks`` recomputes the spends; these checks hold the outputs to their own statements
and to what the operator expected (issue 18 §3), still from the public outputs alone:

* ``secure_noise`` / ``not_evaluation``: no output marked ``insecure_seed`` (public, reproducible
  noise: not private) or ``evaluation`` (``--compare``: the full ε each, together more) unless
  the audit is told they are expected (``allow_insecure_seed``, ``allow_evaluation``);
* ``repeated_publications``: an ``approximate``/``nullified`` release is a repeat — its
  ``estimate`` has bit for bit the values of its ``source_slot``'s earlier ``publish`` release of the
  same stream and mechanism (before any publication: all zeros, the initial value); a
  ``publish`` release names its own slot and its ledger entry charged at that slot. A repeat
  is post-processing of a private release; anything else in it is unaccounted;
* ``stated_guarantee``: a release states exactly its ledger entry's guarantee (measure,
  parameters, scope, model) and flags, and the budgets of a stream's mechanisms whose users
  share one requirement sum to at most the population's ε (the budget split; not in an
  evaluation);
* ``flow_file`` (``--config``): every stream of the outputs is a stream of the flow file, and
  its entries' population ε is the file's ``share × ε``;
* ``expected_budget``: against the expected budget (``--max-epsilon``, ``--max-delta``, or the
  flow file's ε and δ): every stated guarantee, and at every slot the streams together —
  every stream of the outputs is of one population (a second population is a second flow with
  its own topics) — composed: pure ε adds; μ of Gaussian DP adds in squares and ρ of zCDP adds,
  each converted to ε at δ. Without an expectation it fails: a budget nobody stated is no
  guarantee.

Nothing here imports what it audits: the μ-GDP and zCDP conversions are written again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, ndtr

from privstream.audit.checks import (
    F64,
    I64,
    RELATIVE,
    SLOT_BITS,
    Bools,
    Findings,
    Published,
    _report,
    close,
    group_ids,
)

PUBLISH, APPROXIMATE, NULLIFIED = 0, 1, 2


@dataclass(frozen=True)
class FlowPlan:
    """What a flow file says the outputs must be: the population's ε (and δ when the file
    states one) per ``window`` slots, and each stream's share of it."""

    epsilon: float
    window: int
    shares: dict[str, float]
    delta: float | None = None
    path: str = ""


@dataclass(frozen=True)
class Expectation:
    """What the operator expects of the outputs (``privstream audit``'s flags)."""

    max_epsilon: float | None = None
    max_delta: float | None = None
    allow_insecure_seed: bool = False
    allow_evaluation: bool = False
    flow: FlowPlan | None = None

    @property
    def epsilon(self) -> float | None:
        """The expected ε: ``--max-epsilon``, else the flow file's population ε."""
        if self.max_epsilon is not None:
            return self.max_epsilon
        return None if self.flow is None else self.flow.epsilon

    @property
    def delta(self) -> float | None:
        """The expected δ: ``--max-delta``, else the flow file's (when it states one)."""
        if self.max_delta is not None:
            return self.max_delta
        return None if self.flow is None else self.flow.delta


@dataclass
class ClaimCounts:
    """What the claim checks counted (each a check's failures)."""

    insecure: int = 0
    evaluation: int = 0
    repeats: int = 0
    stated: int = 0
    flow: int = 0
    budget: int = 0
    budget_detail: str = ""
    worst: float = 0.0
    composed: bool = False
    """``worst`` was computed: the largest composed spend, as ε at the expected δ."""


def _base(pub: Published, pair: I64) -> I64:
    """Each release pair's ledger pair: a keyed release's mechanism (``Published.bases``)."""
    bases: I64 = np.asarray(pub.bases, dtype=np.int64)[pair] if pair.size else pair
    return bases


def _key(pair: I64, slot: I64) -> I64:
    key: I64 = (pair << SLOT_BITS) | slot
    return key


def _lookup(keys: I64, at: I64) -> tuple[I64, Bools]:
    """For every key of ``at``: its position in the sorted unique ``keys``, and whether found."""
    pos = np.searchsorted(keys, at)
    found = pos < keys.size
    found[found] = keys[pos[found]] == at[found]
    return np.minimum(pos, max(keys.size - 1, 0)), found


# -- flags ---------------------------------------------------------------------------------------


def check_flags(
    pub: Published, expect: Expectation, findings: Findings, counts: ClaimCounts
) -> None:
    """Outputs marked ``insecure_seed`` or ``evaluation`` fail unless expected."""
    rel, led = pub.releases, pub.ledger
    for flag, allowed, kind, why in (
        ("insecure", expect.allow_insecure_seed, "insecure_seed_output",
         "noise from a public seed: reproducible by anyone, not private (--allow-insecure-seed "
         "if a test run is expected)"),
        ("evaluation", expect.allow_evaluation, "evaluation_output",
         "an evaluation (--compare): every mechanism spent the full ε, together more "
         "(--allow-evaluation if an evaluation is expected)"),
    ):  # fmt: skip
        if allowed:
            continue
        marked_releases = np.flatnonzero(rel[flag])
        marked_entries = np.flatnonzero(getattr(led, flag))
        setattr(counts, flag, int(marked_releases.size + marked_entries.size))
        # one problem per (stream, mechanism): the first marked release, else entry
        _, first = np.unique(rel["pair"][marked_releases], return_index=True)
        for i in marked_releases[first][: max(findings.room(), 0)].tolist():
            findings.add(kind, pub.name(int(rel["pair"][i]), int(rel["slot"][i])), why)
        pairs, first = np.unique(led.pair[marked_entries], return_index=True)
        alone = ~np.isin(pairs, rel["pair"][marked_releases])
        _report(findings, pub, marked_entries[first], alone, kind, lambda _k, why=why: why)


# -- repeats -------------------------------------------------------------------------------------


def _charged(pub: Published) -> F64:
    """Per ledger entry, the largest charge of any of its classes at its slot (0 without)."""
    charged = np.zeros(pub.ledger.slot.size)
    np.maximum.at(charged, pub.classes.row, pub.classes.charged)
    return charged


def _segment_start(pub: Published, pair: I64, slot: I64) -> I64:
    """Per release, the first slot after the last recorded gap of its pair before it (0 when
    none): a new incarnation starts from its own initial estimate after its cooldown."""
    start = np.zeros(slot.size, dtype=np.int64)
    for p, gaps in pub.gaps.items():
        mine = pair == p
        for _first, last in gaps:
            after = mine & (slot > last)
            start[after] = np.maximum(start[after], last + 1)
    return start


def _keys_between(keys: I64, lo: I64, hi: I64) -> I64:
    """Per ``(lo, hi)``: how many of the sorted ``keys`` lie in ``[lo, hi)``."""
    counts: I64 = np.searchsorted(keys, hi) - np.searchsorted(keys, lo)
    return counts


def check_sources(pub: Published, findings: Findings, counts: ClaimCounts) -> None:
    """Every repeat repeats its source publication exactly; every publication names its own
    slot and was charged (``repeated_publications``)."""
    rel = pub.releases
    pair, slot, strategy, source = rel["pair"], rel["slot"], rel["strategy"], rel["source"]
    publish = strategy == PUBLISH
    order = np.argsort(_key(pair[publish], slot[publish]))
    pub_keys = _key(pair[publish], slot[publish])[order]
    pub_hash = rel["estimate"][publish][order]
    repeat = ~publish
    sourced = repeat & (source >= 0)
    pos, found = _lookup(pub_keys, _key(pair, np.maximum(source, 0)))
    found &= sourced
    wrong_source = sourced & ~found
    wrong_source |= sourced & (source >= slot)
    differs = found & (pub_hash[pos] != rel["estimate"]) & ~wrong_source
    since = _keys_between(pub_keys, _key(pair, _segment_start(pub, pair, slot)), _key(pair, slot))
    early = repeat & (source < 0) & (~rel["zero"] | (since > 0))
    bad_publish = publish & (source != slot)
    led_keys = _key(pub.ledger.pair, pub.ledger.slot)
    led_order = np.argsort(led_keys)
    lpos, lfound = _lookup(led_keys[led_order], _key(_base(pub, pair), slot))
    charged = _charged(pub)[led_order][lpos] if led_keys.size else np.zeros(slot.size)
    # a family's own division says itself when a publication costs nothing (its verify)
    own = pub.ledger.declared_division[led_order][lpos] if led_keys.size else lfound
    uncharged = publish & lfound & ~(charged > 0) & ~own
    problems = (
        (wrong_source, "repeat_without_source",
         "repeats no earlier publish release of its stream and mechanism at its source_slot"),
        (differs, "repeat_differs", "its estimate differs from its source publication's"),
        (early, "repeat_without_source",
         "a repeat before any publication that is not the initial all-zero estimate"),
        (bad_publish, "publish_source", "a publish release whose source_slot is not its slot"),
        (uncharged, "publish_uncharged", "a publish release whose ledger entry charged nothing"),
    )  # fmt: skip
    for mask, kind, detail in problems:
        counts.repeats += int(mask.sum())
        for i in np.flatnonzero(mask)[: max(findings.room(), 0)].tolist():
            findings.add(kind, pub.name(int(pair[i]), int(slot[i])), detail)


# -- what is stated ------------------------------------------------------------------------------


def check_stated(pub: Published, findings: Findings, counts: ClaimCounts) -> None:
    """Each release states its ledger entry's guarantee and flags; a stream's single-requirement
    mechanisms' budgets sum to at most its population ε (``stated_guarantee``)."""
    rel, led = pub.releases, pub.ledger
    led_keys = _key(led.pair, led.slot)
    if not led_keys.size:  # nothing to compare with: the missing entries are found elsewhere
        _check_split(pub, findings, counts)
        return
    order = np.argsort(led_keys)
    pos, found = _lookup(led_keys[order], _key(_base(pub, rel["pair"]), rel["slot"]))
    row = order[pos]
    other = found & (rel["gid"] != led.gid[row])
    flags = found & (
        (rel["insecure"] != led.insecure[row]) | (rel["evaluation"] != led.evaluation[row])
    )
    text = pub.guarantees
    checks: tuple[tuple[Bools, str, Callable[[int], str]], ...] = (
        (other, "guarantee_mismatch", lambda i: (
            f"the release states {text[int(rel['gid'][i])][3]} but its ledger entry "
            f"{text[int(led.gid[row[i]])][3]}"
        )),
        (flags & ~other, "flag_mismatch", lambda i: (
            f"the release says insecure_seed={bool(rel['insecure'][i])}, "
            f"evaluation={bool(rel['evaluation'][i])}; its ledger entry "
            f"{bool(led.insecure[row[i]])}, {bool(led.evaluation[row[i]])}"
        )),
    )  # fmt: skip
    for mask, kind, detail in checks:
        counts.stated += int(mask.sum())
        for i in np.flatnonzero(mask)[: max(findings.room(), 0)].tolist():
            findings.add(kind, pub.name(int(rel["pair"][i]), int(rel["slot"][i])), detail(i))
    _check_split(pub, findings, counts)


def _check_split(pub: Published, findings: Findings, counts: ClaimCounts) -> None:
    """At every (stream, slot), the guarantee budgets of the non-evaluation single-requirement
    entries sum to at most the population ε they declare."""
    led = pub.ledger
    stream_of_pair = _stream_ids(pub)
    rows = np.flatnonzero(led.plain & ~led.evaluation & ~np.isnan(led.pop_epsilon))
    if rows.size == 0:
        return
    stream = stream_of_pair[led.pair[rows]]
    group, first = group_ids(stream, led.slot[rows])
    total = np.bincount(group, weights=led.epsilon[rows])
    limit = np.full(total.size, np.inf)
    np.minimum.at(limit, group, led.pop_epsilon[rows])
    over = total > limit * (1 + RELATIVE)
    counts.stated += int(over.sum())
    firsts = rows[first]
    _report(findings, pub, firsts, over, "split_over_population", lambda k: (
        f"the stream's mechanisms state budgets summing to {total[k]:.12g} > its population "
        f"ε={limit[k]:g}: the outputs of an evaluation, or a split that does not compose"
    ))  # fmt: skip


def _stream_ids(pub: Published) -> I64:
    """A dense stream index of every pair index."""
    names = [s for s, _ in pub.pairs]
    if not names:
        return np.zeros(0, dtype=np.int64)
    ids: I64 = np.unique(names, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return ids


# -- the flow file -------------------------------------------------------------------------------


def check_flow(pub: Published, flow: FlowPlan, findings: Findings, counts: ClaimCounts) -> None:
    """Every stream of the outputs is in the flow file, and its single-requirement entries
    declare the file's ``share × ε`` as their population ε (``flow_file``)."""
    led = pub.ledger
    names = sorted({s for s, _ in pub.pairs})
    for name in names:
        if name not in flow.shares:
            counts.flow += 1
            findings.add("stream_not_in_flow_file", name, (
                f"stream {name!r} is in the outputs but not in {flow.path or 'the flow file'} "
                f"(its streams: {', '.join(sorted(flow.shares))}): its spend composes with "
                "theirs over the same population"
            ))  # fmt: skip
    per_pair = [flow.shares.get(s, math.nan) * flow.epsilon for s, _ in pub.pairs]
    expected = np.array(per_pair, dtype=np.float64)[led.pair] if per_pair else np.zeros(0)
    wrong = led.plain & ~np.isnan(expected) & ~np.isnan(led.pop_epsilon)
    wrong &= ~close(led.pop_epsilon, expected)
    counts.flow += int(wrong.sum())
    rows = np.arange(led.slot.size)
    _report(findings, pub, rows, wrong, "population_epsilon_not_the_flow_files", lambda k: (
        f"population_budget {led.pop_epsilon[k]:g} but the flow file gives this stream "
        f"share × ε = {expected[k]:g}"
    ))  # fmt: skip


# -- the expected budget -------------------------------------------------------------------------


def gdp_epsilon(mu: F64, delta: float) -> F64:
    """The smallest ε with δ(ε) ≤ ``delta`` under μ-Gaussian DP, elementwise: δ(ε) =
    Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth & Su 2019, Cor. 2.13), by bisection."""
    mu = np.asarray(mu, dtype=np.float64)
    positive = mu > 0
    m = np.where(positive, mu, 1.0)

    def delta_of(eps: F64) -> F64:
        a, b = -eps / m + m / 2, -eps / m - m / 2
        value: F64 = ndtr(a) - np.exp(eps + log_ndtr(b))
        return value

    high = np.ones_like(m)
    for _ in range(64):
        grow = delta_of(high) > delta
        if not grow.any():
            break
        high = np.where(grow, high * 2, high)
    low = np.zeros_like(m)
    for _ in range(100):
        mid = (low + high) / 2
        above = delta_of(mid) > delta
        low, high = np.where(above, mid, low), np.where(above, high, mid)
    return np.where(positive & (delta_of(np.zeros_like(m)) > delta), high, 0.0)


def zcdp_epsilon(rho: F64, delta: float) -> F64:
    """ρ-zCDP implies (ρ + 2√(ρ·ln(1/δ)), δ)-DP (Bun & Steinke 2016, Prop. 1.3)."""
    value: F64 = rho + 2 * np.sqrt(rho * math.log(1 / delta))
    return value


def _as_epsilon(measure: str, budget: F64, delta: float | None) -> F64 | None:
    """A spend in the ledgers' unit of ``measure`` as ε (at ``delta`` where the measure needs
    one); None when it needs a δ and none is expected."""
    if measure in ("pure", "approx"):
        return budget
    if delta is None:
        return None
    if measure == "gaussian":
        return gdp_epsilon(np.sqrt(budget), delta)
    if measure == "zcdp":
        return zcdp_epsilon(budget, delta)
    return family_epsilon(measure, budget, delta)


def family_epsilon(measure: str, budget: F64, delta: float) -> F64 | None:
    """A family's own measure as ε at ``delta``, by the conversion its charge type declares
    (``Charge.epsilon_at``; families discovered through ``privstream.families``); None when
    the measure is unknown or declares none."""
    from privstream.families.registry import families
    from privstream.mechanisms.accounting import CHARGES

    families()  # importing a family's module registers its charge type
    kind = CHARGES.get(measure)
    value = None if kind is None else kind.epsilon_at(budget, delta)
    return None if value is None else np.asarray(value, dtype=np.float64)


def check_expected(
    pub: Published,
    streams: list[tuple[str, I64, F64, I64]],
    expect: Expectation,
    findings: Findings,
    counts: ClaimCounts,
) -> None:
    """Every stated guarantee, and all streams composed at every slot, within the expected
    budget (``expected_budget``)."""
    epsilon, delta = expect.epsilon, expect.delta
    if epsilon is None:
        counts.budget += 1
        counts.budget_detail = (
            "no expected budget: give --max-epsilon E (and --max-delta D for (ε, δ) or "
            "Gaussian guarantees) or --config FLOW; the budget was not checked"
        )
        findings.add("budget_not_checked", "", counts.budget_detail)
        return
    _check_stated_budgets(pub, epsilon, delta, findings, counts)
    _check_composed(pub, streams, epsilon, delta, findings, counts, expect.allow_evaluation)
    if not counts.budget_detail:
        counts.budget_detail = (
            f"the streams together spend at most ε={counts.worst:.6g} of the expected "
            f"ε={epsilon:g}" + ("" if delta is None else f" at δ={delta:g}")
        )


def _measures(pub: Published, gids: I64) -> list[str]:
    return [pub.guarantees[int(g)][0] for g in gids.tolist()]


def _check_stated_budgets(
    pub: Published,
    epsilon: float,
    delta: float | None,
    findings: Findings,
    counts: ClaimCounts,
) -> None:
    """Every distinct guarantee of the outputs (and δ of an (ε, δ) one) is within the
    expectation; one that needs a δ without one expected fails."""
    for gid, (measure, budget, stated_delta, text) in enumerate(pub.guarantees):
        as_eps = _as_epsilon(measure, np.array([budget]), delta)
        problem = None
        if as_eps is None:
            problem = f"{text} needs an expected δ to be checked: give --max-delta"
        elif as_eps[0] > epsilon * (1 + RELATIVE):
            problem = f"{text} is ε={as_eps[0]:.6g} > the expected ε={epsilon:g}"
        elif measure == "approx" and (delta is None or stated_delta > delta):
            problem = f"{text}: δ={stated_delta:g} beyond the expected δ={delta}"
        if problem is not None:
            used = (pub.ledger.gid == gid).sum() + (pub.releases["gid"] == gid).sum()
            counts.budget += int(max(used, 1))
            findings.add("guarantee_over_expected", f"guarantee #{gid}", problem)


def _check_composed(
    pub: Published,
    streams: list[tuple[str, I64, F64, I64]],
    epsilon: float,
    delta: float | None,
    findings: Findings,
    counts: ClaimCounts,
    allow_evaluation: bool = False,
) -> None:
    """All streams' window spends composed at every slot (a stream without an entry at a slot
    keeps its latest spend), as ε at the expected δ, within the expected ε; the slots of an
    expected evaluation (``allow_evaluation``) are exempt."""
    if not streams:
        return
    led = pub.ledger
    slots = np.unique(np.concatenate([s for _, s, _, _ in streams]))
    units: dict[str, F64] = {}
    evaluation = np.zeros(slots.size, dtype=np.bool_)
    for _name, own, spend, rows in streams:
        measure = _measures(pub, led.gid[rows[:1]])[0]
        unit = "pure" if measure == "approx" else measure
        at = np.searchsorted(own, slots, side="right") - 1
        value = np.where(at >= 0, spend[np.maximum(at, 0)], 0.0)
        units[unit] = units.get(unit, np.zeros(slots.size)) + value
        evaluation |= np.isin(slots, led.slot[rows[led.evaluation[rows]]])
    total = np.zeros(slots.size)
    for unit, spent in units.items():
        as_eps = _as_epsilon(unit, spent, delta)
        if as_eps is None:
            counts.budget += 1
            counts.budget_detail = f"{unit} spends need an expected δ: give --max-delta"
            findings.add("budget_not_checked", "", counts.budget_detail)
            return
        total = total + as_eps
    if allow_evaluation:  # an expected evaluation composes over its budget by design
        total = np.where(evaluation, 0.0, total)
    counts.worst, counts.composed = float(total.max()), True
    over = total > epsilon * (1 + RELATIVE)
    counts.budget += int(over.sum())
    names = ", ".join(name for name, _, _, _ in streams)
    for t in np.flatnonzero(over)[: max(findings.room(), 0)].tolist():
        findings.add("over_expected_budget", f"slot {int(slots[t])}", (
            f"the streams ({names}) together spent ε={total[t]:.12g} over the windows ending "
            f"here > the expected ε={epsilon:g}"
        ))  # fmt: skip
