"""Accounting as events (``mechanisms.accounting``): every mechanism's ledger entry carries
typed charges in its own measure; the population accountant and the ledgers declare what they
support and refuse the rest, naming the measure; charges of different scopes do not compose."""

from __future__ import annotations

import math

import pytest

from privstream.conformance.checks import make_slot, run, start
from privstream.families.registry import REGISTRY, Registered
from privstream.mechanisms.accountant import ClassKey, PopulationAccountant, class_spend
from privstream.mechanisms.accounting import (
    AllUsers,
    Charge,
    GaussianCharge,
    PrivacyClass,
    PureCharge,
    UnsupportedCharge,
    UserAccount,
    ZcdpCharge,
    charges_for,
    composable,
    describe,
)
from privstream.mechanisms.contract import ClassSpend, LedgerEntry, outputs
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import (
    ClassScope,
    GaussianDP,
    Guarantee,
    PeriodScope,
    PureDP,
    StreamScope,
    WindowScope,
)
from privstream.mechanisms.ledger import BudgetLedger, PersonalizedLedger, PopulationLedger


@pytest.mark.parametrize("registered", REGISTRY, ids=lambda r: r.name)
def test_every_mechanism_emits_its_charges_with_the_numbers_of_its_classes(
    registered: Registered,
) -> None:
    """The 17 mechanisms: the step's events end with one charge per class of its ledger entry,
    of the guarantee's measure, carrying the class's own numbers bit for bit (the events change
    no number); the driver routes none of them to an output, and the accountant's spend from
    the events is what it was from the classes."""
    mech = registered.example(mech_population(registered))
    (_, _), routed = run(mech, start(mech), range(1, 4))
    assert not any(isinstance(e, Charge) for e in routed)
    state, clients = mech.initial_state(), mech.client_state()
    kind = {"pure": PureCharge, "gaussian": GaussianCharge}[mech.privacy_cost.measure.kind]
    for t in range(1, 7):
        slot = make_slot(mech, t, clients=clients)
        state, events = mech.step(state, slot)
        clients = getattr(slot.port, "client_state_after", None) or clients
        (entry,) = [e for e in events if isinstance(e, LedgerEntry)]
        charges = [e for e in events if isinstance(e, Charge)]
        assert events[-len(charges) :] == charges and outputs(events) == events[: -len(charges)]
        assert len(charges) == len(entry.classes)
        for charge, c in zip(charges, entry.classes, strict=True):
            assert type(charge) is kind
            assert (charge.slots, charge.budget, charge.users) == (c.scope, c.budget, c.users)
            assert (charge.charged, charge.spent) == (c.charged, c.spent)
        assert entry.accounting_events == tuple(charges) == mech.charges(entry)
        assert class_spend(entry, 0.5) == {
            ClassKey(c.scope, float(f"{c.budget / 0.5:.12g}")): c.spent for c in entry.classes
        }


def mech_population(registered: Registered) -> int:
    return type(registered.example(50)).conformance.population


def _d() -> object:
    from privstream.mechanisms.ldp_ids import LdpIdsLedger

    return LdpIdsLedger(0.0, 0.2, 0, 10, window_users=0, available_users=10, remaining=0.0)


def test_payers_follow_the_division() -> None:
    spend = (ClassSpend(5, 1.0, 10, 0.2, 0.2),)
    pure = Guarantee(PureDP(1.0), WindowScope(5), "ldp")
    assert charges_for(pure, "budget", spend)[0].payer == AllUsers()
    assert charges_for(pure, "population", spend)[0].payer == PrivacyClass(5, 1.0)
    personal = Guarantee(PureDP(1.0), ClassScope(5), "cdp")
    (c,) = charges_for(personal, "budget", spend)
    assert (c.payer, c.scope) == (PrivacyClass(5, 1.0), ClassScope(5))
    cgm = Guarantee(GaussianDP(0.5), StreamScope(), "ldp")
    (g,) = charges_for(cgm, "user", (ClassSpend(30, 0.25, 10, 0.01, 0.04),))
    assert (type(g), g.payer, g.scope) == (GaussianCharge, UserAccount(), StreamScope())


def test_a_gaussian_charge_is_shown_in_mu_and_eps_at_delta_never_mu_squared() -> None:
    """μ² = 0.00791805 (CGM's budget, once shown as "ε 0.007918") reads μ ≈ 0.08898 and the
    ε of the exact GDP curve at δ."""
    g = GaussianCharge(UserAccount(), StreamScope(), 10, 1000, 0.0, 0.00791805, 0.00791805)
    shown = describe(g, delta=1e-5)
    assert set(shown["budget"]) == {"mu", "epsilon_at_delta", "delta"}
    assert shown["budget"]["mu"] == pytest.approx(math.sqrt(0.00791805), rel=1e-15)
    assert shown["budget"]["epsilon_at_delta"] == GaussianDP(math.sqrt(0.00791805)).epsilon(1e-5)
    assert "epsilon" not in shown["budget"]
    z = ZcdpCharge(AllUsers(), WindowScope(5), 5, 10, 0.1, 0.3, 0.5)
    assert describe(z)["spent"] == {"rho": 0.3}
    assert describe(PureCharge(AllUsers(), WindowScope(5), 5, 10, 0.1, 0.3, 1.0))["budget"] == {
        "epsilon": 1.0
    }


def charge(kind: type[Charge], scope: object, spent: float = 0.2, budget: float = 1.0) -> Charge:
    slots = getattr(scope, "window", None) or getattr(scope, "length", None) or 30
    return kind(AllUsers(), scope, slots, 10, spent, spent, budget)  # type: ignore[arg-type]


def test_composition_of_different_scopes_or_measures_is_refused_with_the_reason() -> None:
    window, stream = WindowScope(5), StreamScope()
    assert composable(charge(PureCharge, window), charge(PureCharge, window)) is None
    # a personal window of w=5 bounds the same window as a w-event window of w=5
    assert composable(charge(PureCharge, window), charge(PureCharge, ClassScope(5))) is None
    why = composable(charge(PureCharge, window), charge(PureCharge, stream))
    assert why is not None and "w-event window of w=5 and the whole stream do not compose" in why
    why = composable(charge(PureCharge, window), charge(PureCharge, WindowScope(10)))
    assert why is not None and "w=5" in why and "w=10" in why
    why = composable(charge(PureCharge, window), charge(GaussianCharge, window))
    assert why is not None and "pure charge (in ε)" in why and "gaussian charge (in μ²)" in why
    why = composable(charge(PureCharge, PeriodScope(1)), charge(PureCharge, stream))
    assert why is not None and "a period of 1 slot(s)" in why


def test_the_accountant_refuses_charges_to_one_class_that_do_not_compose() -> None:
    """Two mechanisms of one population, one over a 5-slot window and one over the whole
    stream: nothing is charged and the reason names both scopes. An evaluation composes
    nothing, so it does not refuse."""
    key = ClassKey(5, 1.0)
    accountant = PopulationAccountant()
    mixed = [([charge(PureCharge, WindowScope(5))], 0.5, key),
             ([charge(PureCharge, StreamScope())], 0.5, key)]  # fmt: skip
    with pytest.raises(UnsupportedCharge, match="the whole stream do not compose"):
        accountant.charge_events(3, mixed)
    assert accountant.last == {}
    PopulationAccountant(evaluation=True).charge_events(3, mixed)


def test_the_accountant_composes_events_and_refuses_an_overspend() -> None:
    key = ClassKey(5, 1.0)
    accountant = PopulationAccountant()
    accountant.charge_events(1, [([charge(PureCharge, WindowScope(5), 0.4)], 0.5, key)] * 2)
    assert accountant.last == {key: 0.8} and accountant.worst() == (5, 1.0, 0.8)
    with pytest.raises(PrivacyBudgetExceeded, match=r"charged 1\.2 > budget 1 "):
        accountant.charge_events(2, [([charge(PureCharge, WindowScope(5), 0.6)], 0.5, key)] * 2)
    # per-user requirements: each class keyed by its full budget (its share's ε / share)
    personal = [PureCharge(PrivacyClass(4, 0.5), ClassScope(4), 4, 7, 0.1, 0.3, 0.5)]
    accountant.charge_events(3, [(personal, 0.5, None)])
    assert accountant.last == {ClassKey(4, 1.0): 0.3}


def test_the_accountant_refuses_an_event_it_does_not_support() -> None:
    class Renyi(Charge):
        measure = "renyi"
        unit = "ε(α)"

    odd = Renyi(AllUsers(), WindowScope(5), 5, 10, 0.1, 0.1, 1.0)
    accountant = PopulationAccountant()
    assert not accountant.supports(odd)
    assert all(accountant.supports(charge(k, WindowScope(5))) for k in (PureCharge, GaussianCharge,
               ZcdpCharge))  # fmt: skip
    with pytest.raises(UnsupportedCharge, match=r"renyi charge \(in ε\(α\)\).*supports pure"):
        accountant.charge_events(1, [([odd], 1.0, ClassKey(5, 1.0))])


def test_the_ledgers_declare_what_they_support_and_refuse_the_rest() -> None:
    budget = BudgetLedger(1.0, 5)
    assert budget.supports(charge(PureCharge, WindowScope(5)))
    assert budget.supports(charge(GaussianCharge, WindowScope(5)))  # μ² adds in a window too
    assert not budget.supports(charge(PureCharge, WindowScope(10)))
    with pytest.raises(
        UnsupportedCharge, match="over the whole stream; it supports charges to all"
    ):
        budget.accept(charge(PureCharge, StreamScope()))
    population = PopulationLedger(10, 5)
    in_class = PureCharge(PrivacyClass(5, 1.0), WindowScope(5), 5, 10, 1.0, 1.0, 1.0)
    assert population.supports(in_class)
    with pytest.raises(UnsupportedCharge, match="gaussian charge"):
        population.accept(GaussianCharge(PrivacyClass(5, 1.0), WindowScope(5), 5, 10, 1, 1, 1))
    personal = PersonalizedLedger([4, 2], [1.0, 2.0])
    assert personal.supports(PureCharge(PrivacyClass(2, 2.0), ClassScope(2), 2, 3, 0.5, 1.0, 2.0))
    assert not personal.supports(
        PureCharge(PrivacyClass(3, 2.0), ClassScope(3), 3, 3, 0.5, 1.0, 2.0)
    )  # no such class
    with pytest.raises(UnsupportedCharge, match="PersonalizedLedger cannot account"):
        personal.accept(charge(PureCharge, WindowScope(4)))  # all users: not a class


def test_an_envelope_pickled_before_schema_3_resumes_under_the_new_names() -> None:
    """A recovery store written before the measure-neutral names holds ledger entries (the
    tallies' last entry) with ``window``/``epsilon``/``window_spent`` classes and
    ``population_epsilon``/``population_window_spent``: they unpickle under the new names with
    the same numbers, so the store resumes."""
    import pickle

    from privstream.mechanisms.contract import ClassSpend, LedgerEntry

    old_class = ClassSpend.__new__(ClassSpend)
    object.__setattr__(old_class, "__dict__", {"window": 5, "epsilon": 1.0, "users": 3,
                                               "charged": 0.2, "window_spent": 0.6})  # fmt: skip
    entry = LedgerEntry.__new__(LedgerEntry)
    fields = {"stream": "s", "mechanism": "LBU", "slot": 4, "guarantee": None,
              "division": "budget", "classes": (old_class,), "details": None,
              "population_epsilon": 1.0, "population_window_spent": 0.6,
              "insecure_seed": False, "evaluation": False}  # fmt: skip
    object.__setattr__(entry, "__dict__", fields)
    restored = pickle.loads(pickle.dumps(entry))
    (spend,) = restored.classes
    assert (spend.scope, spend.budget, spend.users, spend.charged, spend.spent) == (
        5,
        1.0,
        3,
        0.2,
        0.6,
    )
    assert (restored.population_budget, restored.population_spent) == (1.0, 0.6)
    assert not hasattr(spend, "window") and "population_epsilon" not in vars(restored)
