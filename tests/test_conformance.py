"""One conformance suite over every registered mechanism of every family (design §10 item 4):
the library's ``privstream.conformance.checks``, mechanism- and flow-level, river-style."""

from __future__ import annotations

import dataclasses

import pytest

from privstream.conformance.checks import (
    Check,
    CheckFailed,
    check_config_validation,
    check_declared_cost,
    yield_checks,
)
from privstream.families.registry import FAMILIES, LDP_IDS, REGISTRY, Registered
from privstream.mechanisms.contract import Conformance
from privstream.mechanisms.guarantees import WindowScope
from privstream.mechanisms.ldp_ids import LBU
from privstream.mechanisms.tasks import FrequencyTask

CHECKS = [check for registered in REGISTRY for check in yield_checks(registered)]


def test_every_family_member_is_registered() -> None:
    by_family = {name: {r.name for r in REGISTRY if r.family.name == name} for name in FAMILIES}
    assert by_family == {
        "ldp-ids": {
            "LBU",
            "LSP",
            "LPU",
            "LBD",
            "LBA",
            "LPD",
            "LPA",
            "LB-DSAT",
            "LP-DSAT",
            "LB-RescueDP",
            "LP-RescueDP",
        },
        "personalized": {"BD", "BA", "Uniform", "Sample", "PLBU", "PU", "PBD", "PBA"},
        "cgm": {"CGM", "Alg1"},
        "dpi": {"DPI", "DPI-paper", "DPI-prior", "DPI-uniform", "Laplace-horizon"},
        "sao2": {"SaO2"},
    }
    assert {r.trust for r in REGISTRY if r.family.name == "personalized"} == {"cdp"}
    assert {r.trust for r in REGISTRY if r.family.name in ("ldp-ids", "cgm")} == {"ldp-simulated"}


def test_every_mechanism_gets_every_check() -> None:
    names = {c.name for c in CHECKS}
    assert len(names) == 13 and {"declared_cost", "recovery_round_trip", "two_workers"} <= names
    assert len(CHECKS) == 13 * len(REGISTRY)


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_conformance(check: Check) -> None:
    if check.skip:
        pytest.skip(check.skip)
    check()


class UnderReporting(LBU):
    """A broken LBU for the checks' own test (spec ldp-ids §3.1): its ledger entries report half
    of what it charged at each slot."""

    def _ledger_entry(self, state, slot, o):  # type: ignore[no-untyped-def]
        entry = super()._ledger_entry(state, slot, o)
        halved = tuple(dataclasses.replace(c, charged=c.charged / 2) for c in entry.classes)
        return dataclasses.replace(entry, classes=halved)


class WrongGuarantee(LBU):
    """A broken LBU whose ledger states a wider window than it declares (spec ldp-ids §3.1)."""

    def _ledger_entry(self, state, slot, o):  # type: ignore[no-untyped-def]
        entry = super()._ledger_entry(state, slot, o)
        return dataclasses.replace(entry, guarantee=dataclasses.replace(
            entry.guarantee, scope=WindowScope(entry.guarantee.scope.window + 1)))  # fmt: skip


@pytest.mark.parametrize(("broken", "message"), [(UnderReporting, "sum of its charges"),
                                                 (WrongGuarantee, "another guarantee")])  # fmt: skip
def test_the_cost_check_catches_a_ledger_that_disagrees_with_its_charges(
    broken: type[LBU], message: str
) -> None:
    config = LDP_IDS.make_config(epsilon=1.0, window=5, population=400, task=FrequencyTask(2))
    check_declared_cost(LBU(config))  # the real one passes
    with pytest.raises(CheckFailed, match=message):
        check_declared_cost(broken(config))


def test_a_config_that_validates_nothing_fails_the_check() -> None:
    mech = REGISTRY[0].example(400)
    mech.conformance = Conformance(invalid=(("u_min", 5),))  # a valid value: must be "accepted"
    with pytest.raises(CheckFailed, match="was accepted"):
        check_config_validation(mech)


def test_a_registered_mechanism_is_a_registry_entry() -> None:
    assert all(isinstance(r, Registered) for r in REGISTRY)
