"""Accounting as events: what a mechanism charged, to whom, in its own measure, over its scope.

A mechanism's step emits, after its releases and its ledger entry, one typed charge per
privacy class it charged, in its event list (``Mechanism.charges``). The population
accountant (``mechanisms.accountant``) and the ledgers (``mechanisms.ledger``) read the charges,
never a bare ``epsilon``: each declares ``supports(event)`` and refuses the rest with a message
naming the charge's measure and what it supports (the ``dp_accounting`` model).

Every charge holds three numbers in its measure's *additive* unit (the one sequential
composition adds, ``guarantees.budget_of``): ``charged`` (this slot), ``spent`` (over the scope
ending at this slot, for the most-charged member of the payer) and ``budget`` (the limit):

- ``PureCharge``: ε (pure ε-DP; ε adds);
- ``GaussianCharge``: μ² (μ-Gaussian DP; μ adds in squares) — shown as μ and as ε at δ;
- ``ZcdpCharge``: ρ (ρ-zCDP; ρ adds).

``shown`` turns them into the units a person reads (ε; μ and ε at δ; ρ); a μ² is never shown
as an ε.

Composition (``composable``): charges add only when they share the measure and the scope —
what it bounds (a window, a period, the stream, a lifetime) and its length in slots. Two w-event windows of different lengths, a window
and a whole stream, or a period and a lifetime do not add: a bound on the loss in every
window of w slots says nothing about a window of another length or about the whole stream, so
summing them would state a guarantee neither mechanism has. Such a combination is refused with
the reason; run the mechanisms on separate populations, or give them the same scope. Streams of
one population compose the same way (their shares of one budget, their δ added up by
``accountant.compose_deltas``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from privstream.mechanisms.guarantees import (
    ClassScope,
    GaussianDP,
    Guarantee,
    PeriodScope,
    Scope,
    StreamScope,
    WindowScope,
)

if TYPE_CHECKING:
    from privstream.mechanisms.contract import ClassSpend, Division


class UnsupportedCharge(ValueError):
    """An accountant or ledger was handed a charge it cannot account (another measure or scope,
    or two charges that do not compose)."""


# -- payers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllUsers:
    """Every user of the population was charged alike (budget division)."""

    kind: ClassVar[str] = "all-users"


@dataclass(frozen=True)
class PrivacyClass:
    """The users sharing one requirement ``(scope w_c, budget)`` (personalized w-event DP;
    population division charges each member at most once per window)."""

    scope: int
    budget: float
    kind: ClassVar[str] = "class"


@dataclass(frozen=True)
class UserAccount:
    """One account per user; the charge's ``spent`` is the most-charged user's (user division)."""

    kind: ClassVar[str] = "user"


Payer = AllUsers | PrivacyClass | UserAccount


# -- charges ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """One charge to ``payer`` (``users`` users) over ``scope``, in the measure's additive unit.

    ``slots`` is the scope's length in slots the ledger counts over (the class's window w_c,
    or a user-division ledger's reports per budget); ``scope`` is the guarantee's scope."""

    payer: Payer
    scope: Scope
    slots: int
    users: int
    charged: float
    spent: float
    budget: float
    measure: ClassVar[str] = ""
    unit: ClassVar[str] = ""
    """The additive unit's symbol (what ``charged``/``spent``/``budget`` hold)."""
    additive: ClassVar[bool] = False
    """Whether charges of this type add up under sequential composition in ``unit`` (the
    population accountant composes only those; a measure that does not add is refused)."""
    symbol: ClassVar[str] = ""
    """The symbol a person reads a budget in (``reads`` converts to it); default ``unit``."""
    label: ClassVar[str] = ""
    """The tag of a privacy class's metric label, ``<w|s><scope>_<label><reads(budget)>``."""
    title: ClassVar[str] = ""
    """The measure's name in a sentence (``privstream config check``)."""
    scale: ClassVar[str] = "linear"
    """How ``symbol`` reads from the additive unit: ``linear`` (the value itself) or ``sqrt``
    (μ = √(μ²)); published with the unit (``privstream_measure_unit``) for the privacy page."""

    @classmethod
    def reads(cls, value: float) -> float:
        """``value`` (in the additive unit) in the unit a person reads (``symbol``)."""
        return math.sqrt(max(value, 0.0)) if cls.scale == "sqrt" else value

    @classmethod
    def epsilon_at(cls, value: Any, delta: float) -> Any:
        """``value`` (additive unit; a number or an array) as the ε of (ε, δ)-DP at
        ``delta``, or None when the measure declares no conversion (the audit's expected-budget
        check of a family's own measure)."""
        return None

    @classmethod
    def aside(cls, epsilon: float) -> str:
        """What ``config check`` adds after the budget: the stream's ε where it is one at δ."""
        return ""

    @classmethod
    def text(cls, value: float) -> str:
        """``value`` as a person reads it, e.g. ``ε 1`` or ``μ 0.2681``."""
        return f"{cls.symbol or cls.unit} {cls.reads(value):.6g}"

    def shown(self, value: float, delta: float | None = None) -> dict[str, float]:
        """``value`` (in the additive unit) in the units a person reads."""
        return {self.symbol or self.unit: self.reads(value)}

    def composes_with(self, other: Charge) -> str | None:
        """None when this charge adds up with ``other`` (same measure and scope already
        checked), otherwise why not: a measure with a parameter of its own (a Rényi order)
        refuses another value of it."""
        return None


@dataclass(frozen=True)
class PureCharge(Charge):
    """Pure ε-DP: ε adds under sequential composition."""

    measure: ClassVar[str] = "pure"
    unit: ClassVar[str] = "ε"
    additive: ClassVar[bool] = True
    symbol: ClassVar[str] = "ε"
    label: ClassVar[str] = "e"

    def shown(self, value: float, delta: float | None = None) -> dict[str, float]:
        return {"epsilon": value}


@dataclass(frozen=True)
class GaussianCharge(Charge):
    """μ-Gaussian DP: μ adds in squares, so the additive unit is μ²; shown as μ = √(μ²) and,
    with a δ, as the ε of the exact (ε, δ) curve (Dong, Roth & Su 2019, Cor. 2.13)."""

    measure: ClassVar[str] = "gaussian"
    unit: ClassVar[str] = "μ²"
    additive: ClassVar[bool] = True
    symbol: ClassVar[str] = "μ"
    label: ClassVar[str] = "mu"
    title: ClassVar[str] = "Gaussian DP"
    scale: ClassVar[str] = "sqrt"

    @classmethod
    def aside(cls, epsilon: float) -> str:
        return f" (ε {epsilon:g} at δ)"

    def shown(self, value: float, delta: float | None = None) -> dict[str, float]:
        mu = math.sqrt(max(value, 0.0))
        out = {"mu": mu}
        if delta is not None and 0 < delta < 1:
            out["epsilon_at_delta"] = GaussianDP(mu).epsilon(delta) if mu > 0 else 0.0
            out["delta"] = delta
        return out


@dataclass(frozen=True)
class ZcdpCharge(Charge):
    """ρ-zero-concentrated DP: ρ adds."""

    measure: ClassVar[str] = "zcdp"
    unit: ClassVar[str] = "ρ"
    additive: ClassVar[bool] = True
    symbol: ClassVar[str] = "ρ"
    label: ClassVar[str] = "rho"
    title: ClassVar[str] = "zCDP"

    def shown(self, value: float, delta: float | None = None) -> dict[str, float]:
        return {"rho": value}


CHARGES: dict[str, type[Charge]] = {c.measure: c for c in (PureCharge, GaussianCharge, ZcdpCharge)}
"""The charge type of each measure kind (``guarantees.Measure.kind``); ``approx`` charges its
ε as a ``PureCharge`` (its δ is composed per stream, ``accountant.compose_deltas``). A family
with a measure of its own adds its charge type with ``register_charge``."""


def register_charge(kind: type[Charge]) -> type[Charge]:
    """Declare a family's own charge type (its measure's units and whether it adds), so the
    generic surfaces (metrics labels, ``config check``, the audit) show it in its units and
    the population accountant composes it when it is ``additive``. A class decorator; a kind
    already taken by a type of another name is refused (a module imported again replaces its
    own)."""
    taken = CHARGES.get(kind.measure)
    same = taken is not None and _named(taken) == _named(kind)
    if not kind.measure or (taken is not None and not same):
        raise ValueError(f"charge measure {kind.measure!r} is empty or taken by {taken!r}")
    CHARGES[kind.measure] = kind
    return kind


def _named(kind: type[Charge]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def charge_type(guarantee: Guarantee) -> type[Charge]:
    """The charge a mechanism with ``guarantee`` emits (``approx`` charges ε, as pure)."""
    return measure_type(guarantee.measure.kind)


def measure_type(kind: str) -> type[Charge]:
    """The charge type of a measure kind: a registered one, else pure ε (``approx``)."""
    return CHARGES.get(kind, PureCharge)


# -- divisions -------------------------------------------------------------------------------


Recompute = Callable[[Sequence[Mapping[str, Any]]], list[tuple[int, float, float]]]
"""A division's audit: from one mechanism's public ledger entries (the JSON objects, one per
slot, in slot order) each entry's slot, the spend recomputed for the most-charged payer over the
scope ending there, and the budget it must stay within."""

Verify = Callable[[Sequence[Mapping[str, Any]]], list[tuple[int, str]]]
"""A division's consistency audit: from the same entries, what is inconsistent in them beyond
the spend (a series element used twice, a charge that is not what its public parameters give),
as ``(slot, what is wrong in words)``; empty when nothing is."""


@dataclass(frozen=True)
class DivisionSpec:
    """A division: how a ledger divides the budget among the users, declared as an object.

    ``name`` is what a ledger entry states (``LedgerEntry.division``); ``payer(spend,
    personalized)`` who a class's spend is charged to (``payer_of``); ``recompute`` how the
    audit recomputes a scope's spend from the public ledger entries (None: the audit's own
    checks of the built-in divisions, ``privstream.audit.checks.check_windows``); ``verify``
    (optional) what else the audit checks in the entries, each problem in words. A family
    ships its own in ``Family.divisions``; the audit asks the family for it by name."""

    name: str
    payer: Callable[[ClassSpend, bool], Payer]
    recompute: Recompute | None = None
    summary: str = ""
    verify: Verify | None = None


def _class_or_all(spend: ClassSpend, personalized: bool) -> Payer:
    return PrivacyClass(spend.scope, spend.budget) if personalized else AllUsers()


BUDGET = DivisionSpec("budget", _class_or_all, summary="every user charged alike per slot")
POPULATION = DivisionSpec(
    "population",
    lambda spend, _personalized: PrivacyClass(spend.scope, spend.budget),
    summary="disjoint users, each charged the whole ε at most once per window",
)
USER = DivisionSpec(
    "user",
    lambda _spend, _personalized: UserAccount(),
    summary="one account per user (users join at different slots)",
)
DIVISIONS: dict[str, DivisionSpec] = {d.name: d for d in (BUDGET, POPULATION, USER)}
"""The declared divisions by name: the built-in three and those of discovered families."""


def register_division(division: DivisionSpec) -> DivisionSpec:
    """Declare a family's division (``Family.divisions`` does it at discovery); a built-in
    name is refused."""
    if division.name in (BUDGET.name, POPULATION.name, USER.name):
        raise ValueError(f"division {division.name!r} is built in; name yours otherwise")
    DIVISIONS[division.name] = division
    return division


def division_of(name: str) -> DivisionSpec:
    """The declared division ``name`` (``DIVISIONS``); an undeclared name is refused."""
    try:
        return DIVISIONS[name]
    except KeyError:
        known = ", ".join(sorted(DIVISIONS))
        raise ValueError(
            f"division {name!r} is not declared (known: {known}); a family declares its own "
            "in Family.divisions"
        ) from None


def payer_of(division: Division, spend: ClassSpend, personalized: bool) -> Payer:
    """Who a class's spend was charged to, by the ledger's declared division."""
    return division_of(division).payer(spend, personalized)


def charges_for(
    guarantee: Guarantee, division: Division, classes: tuple[ClassSpend, ...]
) -> tuple[Charge, ...]:
    """The charges of one ledger entry's classes, in the guarantee's measure (the numbers are
    the classes' own, unchanged). A windowed guarantee charges each class over its own window
    w_c (a personal window under ``ClassScope``; a uniform baseline's classes keep theirs); the
    other scopes are the guarantee's."""
    kind = charge_type(guarantee)
    personalized = isinstance(guarantee.scope, ClassScope)
    windowed = isinstance(guarantee.scope, WindowScope)
    out = []
    for c in classes:
        scope: Scope = guarantee.scope
        if personalized:
            scope = ClassScope(c.scope)
        elif windowed:
            scope = WindowScope(c.scope)
        payer = payer_of(division, c, personalized)
        out.append(kind(payer, scope, c.scope, c.users, c.charged, c.spent, c.budget))
    return tuple(out)


# -- composition -----------------------------------------------------------------------------


def scope_name(scope: Scope) -> str:
    """A reader's name for a scope (in refusals and the docs)."""
    if isinstance(scope, WindowScope):
        return f"a w-event window of w={scope.window}"
    if isinstance(scope, ClassScope):
        return f"a personal window of w={scope.window}"
    if isinstance(scope, PeriodScope):
        return f"a period of {scope.length} slot(s)"
    if isinstance(scope, StreamScope):
        return "the whole stream"
    return "a user's lifetime"


def _span(scope: Scope) -> tuple[str, int]:
    """What a scope bounds: a window of w slots (w-event or a personal window alike), a period
    of L slots, the whole stream or a lifetime."""
    if isinstance(scope, (WindowScope, ClassScope)):
        return "window", scope.window
    if isinstance(scope, PeriodScope):
        return "period", scope.length
    return scope.kind, 0


def window_of(scope: Scope) -> int | None:
    """The window length of a w-event or personal-window scope (None for the others)."""
    return scope.window if isinstance(scope, (WindowScope, ClassScope)) else None


def composable(a: Charge, b: Charge) -> str | None:
    """None when ``a`` and ``b`` add up (same measure, same scope); otherwise why not."""
    if a.measure != b.measure:
        return (
            f"a {a.measure} charge (in {a.unit}) and a {b.measure} charge (in {b.unit}) do not "
            "add: convert both to one measure first (guarantees.PureDP.to_zcdp, "
            "GaussianDP.to_zcdp) or run them on separate populations"
        )
    if _span(a.scope) != _span(b.scope):
        return (
            f"{scope_name(a.scope)} and {scope_name(b.scope)} do not compose: a bound over one "
            "says nothing about the other, so their sum would state a guarantee neither "
            "mechanism has; give the mechanisms the same scope or separate populations"
        )
    return a.composes_with(b)


def check_composable(charges: list[Charge]) -> None:
    """Refuse charges to one population class that do not compose (``composable``)."""
    for other in charges[1:]:
        why = composable(charges[0], other)
        if why is not None:
            raise UnsupportedCharge(why)


def refuse(holder: str, event: Charge, supported: str) -> UnsupportedCharge:
    """The one refusal of an unsupported charge: its measure and scope, and what is supported."""
    return UnsupportedCharge(
        f"{holder} cannot account a {event.measure} charge (in {event.unit}) over "
        f"{scope_name(event.scope)}; it supports {supported}"
    )


def describe(event: Charge, delta: float | None = None) -> dict[str, Any]:
    """A charge as a reader sees it: measure, scope and each number in its own units."""
    return {
        "measure": event.measure,
        "scope": scope_name(event.scope),
        "payer": event.payer.kind,
        "charged": event.shown(event.charged, delta),
        "spent": event.shown(event.spent, delta),
        "budget": event.shown(event.budget, delta),
    }
