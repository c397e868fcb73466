"""The population-level accountant: several mechanisms over one population compose (design §3).

Every mechanism of a stream queries the same users. By sequential composition, a user's privacy
loss over a window is the sum of what every mechanism charged them there; each mechanism's own
ledger only bounds its own part. A production run therefore gives mechanism ``j`` the share
``s_j`` of the population budget (``BudgetSplit``: ``Σ s_j = 1``) and the accountant checks, at
every slot and before anything of it is released, that the composed spend stays within budget:

    for every privacy class c:   Σ_j  spend_j(c, window ending at t)  ≤  ε_c

where ``spend_j(c, ·)`` is the most mechanism ``j`` charged any member of ``c`` over that window
(its ledger's window spend), so the sum bounds every user's composed loss from above. For the
LDP-IDS families there is one class, ``(w, ε)``; population division charges ``ε_j`` to a user
at most once per window (its population ledger enforces it). A violation raises
``PrivacyBudgetExceeded``: the stream stops before release.

δ composes too: streams at ``(ε_s, δ_s)`` over one population are ``(Σ ε_s, Σ δ_s)``-DP, so
``compose_deltas`` checks ``Σ δ_s`` against the population's δ, and ``check_delta_bound`` keeps
that δ below ``1/n`` unless an operator says otherwise.

Running mechanisms side by side with the full budget each is an evaluation (``--compare``): the
accountant then only reports the composed spend (which exceeds ε) and every output says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from privstream.mechanisms.accounting import (
    CHARGES,
    Charge,
    check_composable,
    refuse,
)
from privstream.mechanisms.contract import LedgerEntry
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import Guarantee
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE, budget_limit


class ClassKey(NamedTuple):
    """A privacy class of the population: its scope ``w_c`` (slots) and full budget (in the
    measure's additive unit: ε, μ² or ρ). A tuple: snapshots of plain ``(w, ε)`` pairs read
    back equal."""

    scope: int
    budget: float


@dataclass(frozen=True)
class BudgetSplit:
    """How the population budget is divided among a stream's mechanisms.

    ``shares[j]`` is mechanism ``j``'s fraction (positive, summing to 1). ``evaluation`` is the
    side-by-side comparison: every mechanism gets the full budget (share 1) and nothing is
    composed — its outputs are marked as an evaluation, never a release.
    """

    shares: tuple[float, ...]
    evaluation: bool = False

    def __post_init__(self) -> None:
        if not self.shares or any(not (0 < s <= 1) for s in self.shares):
            raise ValueError(f"budget shares must lie in (0, 1], got {list(self.shares)}")
        if not self.evaluation and sum(self.shares) > budget_limit(1.0):
            raise ValueError(f"budget shares sum to {sum(self.shares):.12g} > 1")

    @classmethod
    def parse(cls, text: str | None, mechanisms: int, *, compare: bool = False) -> BudgetSplit:
        """``equal``, ``w1,w2,…`` (weights, normalised) or None for a single mechanism; with
        ``compare`` the evaluation split. Several mechanisms need one or the other."""
        if compare:
            if text is not None:
                raise ValueError(
                    "--compare gives every mechanism the full budget; drop --budget-split"
                )
            return cls((1.0,) * mechanisms, evaluation=True)
        if text is None:
            if mechanisms == 1:
                return cls((1.0,))
            raise ValueError(
                f"{mechanisms} mechanisms over one population compose: divide the budget with "
                "--budget-split equal|w1,w2,… (each gets its share), or run an evaluation with "
                "--compare (each gets the full budget and the outputs are marked as such)"
            )
        if text.strip().lower() == "equal":
            return cls((1.0 / mechanisms,) * mechanisms)
        try:
            weights = [float(w) for w in text.split(",")]
        except ValueError:
            raise ValueError(
                f"--budget-split must be 'equal' or numbers w1,w2,…; got {text!r}"
            ) from None
        if len(weights) != mechanisms or any(not (w > 0) or w == float("inf") for w in weights):
            raise ValueError(
                f"--budget-split needs {mechanisms} positive finite weights, got {text!r}"
            )
        total = sum(weights)
        return cls(tuple(w / total for w in weights))


def class_spend(
    entry: LedgerEntry, share: float, population: ClassKey | None = None
) -> dict[ClassKey, float]:
    """What one mechanism charged each population class over the window ending at the entry's
    slot, in the guarantee's additive budget unit (``guarantees.budget_of``).

    A population whose users share one requirement (no registration) has one class,
    ``population`` = ``(w, ε)``: every class the entry lists is charged to it, whatever budget
    the entry states (a mechanism that misstates its own budget is still composed against the
    population's). With per-user requirements each class is keyed by its full (unshared)
    requirement ``ε_c·s / s`` (the mechanism ran with its share ``s`` of every class's budget).
    """
    return charge_spend(entry.accounting_events, share, population)


def charge_spend(
    charges: Sequence[Charge], share: float, population: ClassKey | None = None
) -> dict[ClassKey, float]:
    """``class_spend`` from a mechanism's accounting events: each charge's ``spent`` keyed by
    its population class (``population`` when the users share one requirement, else the
    charge's ``(slots, budget / share)``)."""
    if population is not None:
        return {ClassKey(*population): max((c.spent for c in charges), default=0.0)}
    return {ClassKey(c.slots, _full(c.budget, share)): c.spent for c in charges}


def _full(epsilon: float, share: float) -> float:
    """The class's full budget from a mechanism's share of it (rounded to 12 significant
    digits, so ``(ε·s)/s`` of every mechanism names the same class)."""
    return float(f"{epsilon / share:.12g}")


def check_shares(
    costs: Sequence[tuple[str, Guarantee]], split: BudgetSplit, population_epsilon: float
) -> None:
    """Refuse mechanisms that were not built with their share ``s·ε`` of the population budget
    (an evaluation gives each the full ε)."""
    for (name, cost), share in zip(costs, split.shares, strict=True):
        given = population_epsilon * share
        if abs(cost.budget - given) > RELATIVE_TOLERANCE * given:
            raise ValueError(
                f"mechanism {name} runs with ε={cost.budget:g} but its share of the population "
                f"budget ε={population_epsilon:g} is {share:g} (ε={given:g}); build it with "
                "its share"
            )


@dataclass
class PopulationAccountant:
    """Composed spend of one stream's population (kept in the operator's snapshotted state).

    ``last`` is the composed window spend per class after the last charged slot, and
    ``worst`` the class closest to its limit (for the ledger entries and the metrics).
    """

    evaluation: bool = False
    last: dict[ClassKey, float] = field(default_factory=dict)

    def supports(self, event: Charge) -> bool:
        """Whether this accountant can compose ``event`` (the ``dp_accounting`` model): any
        charge whose type declares that it adds up in its unit (``Charge.additive``: the
        built-in ε, μ², ρ, and a family's own measure that declares it)."""
        return type(event).additive

    def charge_events(
        self,
        slot: int,
        charges: Sequence[tuple[Sequence[Charge], float, ClassKey | None]],
    ) -> None:
        """Compose the mechanisms' accounting events at ``slot``: per mechanism its charges,
        its budget share and its population class (None: per-user requirements). Refuses an
        unsupported charge, charges to one class that do not compose (another measure or
        scope, ``accounting.composable``) and, unless an evaluation, an overspend."""
        keyed: dict[ClassKey, list[Charge]] = {}
        spends = []
        for events, share, population in charges:
            for event in events:
                if not self.supports(event):
                    raise refuse("the population accountant", event, self._supported())
                key = population or ClassKey(event.slots, _full(event.budget, share))
                keyed.setdefault(ClassKey(*key), []).append(event)
            spends.append(charge_spend(events, share, population))
        if not self.evaluation:  # an evaluation composes nothing
            for group in keyed.values():
                check_composable(group)
        self.charge(slot, spends)

    def _supported(self) -> str:
        known = ", ".join(f"{c.measure} ({c.unit})" for c in CHARGES.values() if c.additive)
        return f"{known}: charges whose type declares an additive unit"

    def charge(self, slot: int, spends: Sequence[Mapping[ClassKey, float]]) -> None:
        """Compose the mechanisms' window spends at ``slot``; refuse an overspend (before
        release) unless this is an evaluation."""
        total: dict[ClassKey, float] = {}
        for spend in spends:
            for key, value in spend.items():
                total[key] = total.get(key, 0.0) + value
        if not self.evaluation:
            for (scope, budget), value in total.items():
                if value > budget_limit(budget):
                    raise PrivacyBudgetExceeded(
                        f"the stream's mechanisms together charged {value:.6g} > budget "
                        f"{budget:g} over the scope of {scope} slot(s) ending at slot {slot}: "
                        "the population budget is overspent (split it with --budget-split)"
                    )
        self.last = total

    def worst(self) -> tuple[int, float, float] | None:
        """``(scope, budget, composed spend)`` of the class closest to (or furthest past) its
        limit, in the measure's additive unit."""
        if not self.last:
            return None
        (scope, budget), spent = max(self.last.items(), key=lambda kv: kv[1] / kv[0][1])
        return scope, budget, spent


LARGE_DELTA_FLAG: Final = "population.allow_large_delta = true (--allow-large-delta)"
"""How an operator accepts a population δ ≥ 1/n (named in every refusal)."""


def check_delta_bound(delta: float, users: int, *, allow_large: bool, override: str) -> None:
    """Refuse a population δ that is not well below ``1/n``.

    (ε, δ)-DP allows a failure with probability δ for each user: at δ ≥ 1/n one of n users
    is expected to lose everything. ``delta`` must lie in (0, 1) always and below ``1/users``
    unless ``allow_large`` (``override`` says how an operator sets it).
    """
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and 0 < delta < 1):
        raise ValueError(f"δ must lie in (0, 1), got {delta!r}")
    if delta * users >= 1 and not allow_large:
        raise ValueError(
            f"δ = {delta:g} is at least 1/n = 1/{users} = {1 / users:.3g}: one of the n users "
            f"may be expected to lose everything; take δ well below 1/n (e.g. "
            f"{_well_below(users):.0e}) or, to accept it anyway, set {override}"
        )


def _well_below(users: int) -> float:
    """A δ well below 1/n: the power of ten at or below ``1/(100·n)``."""
    return 10.0 ** math.floor(math.log10(1 / (100 * users)))


def compose_deltas(
    deltas: Mapping[str, float],
    population_delta: float | None,
    users: int,
    *,
    allow_large: bool = False,
    override: str = LARGE_DELTA_FLAG,
) -> float:
    """The population's δ for the streams ``deltas`` (stream name → its δ) over one population.

    Basic composition: streams at ``(ε_s, δ_s)`` over the same users are together
    ``(Σ ε_s, Σ δ_s)``-DP, so the population is ``(ε, δ)`` when ``Σ ε_s ≤ ε`` (the shares) and
    ``Σ δ_s ≤ δ``. With ``population_delta`` given the sum must stay within it; without, the
    population's δ is the sum. Either way it must pass :func:`check_delta_bound`. Returns the
    population's δ (0 when no stream has one). Raises ValueError naming the streams.
    """
    total = math.fsum(deltas.values())
    if population_delta is not None:
        if total > budget_limit(population_delta):
            each = ", ".join(f"{name} {d:g}" for name, d in deltas.items())
            raise ValueError(
                f"the streams' δ sum to {total:.6g} > population δ = {population_delta:g} "
                f"({each}): the streams of one population compose, so their δ add up; lower "
                "them or raise population.delta"
            )
        check_delta_bound(population_delta, users, allow_large=allow_large, override=override)
        return population_delta
    if not deltas:
        return 0.0
    if total >= 1:
        raise ValueError(
            f"the streams' δ sum to {total:.6g} >= 1: the streams of one population compose, "
            "so their δ add up; set population.delta and lower the streams' δ"
        )
    check_delta_bound(total, users, allow_large=allow_large, override=override)
    return total
