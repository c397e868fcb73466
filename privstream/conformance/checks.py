"""Conformance checks for every registered mechanism (design §10 item 4), in the style of river's
``check_estimator``: ``yield_checks(registered)`` yields the checks that apply to a mechanism,
chosen from what it declares (trust mode, division, guarantee) and parameterised by what it
supplies (``Mechanism.conformance``: invalid configs, skips, example size).

Mechanism level: one release and one ledger entry per slot; a pickled snapshot restores and
continues identically; same seed same releases, another seed other noise; a replayed slot is
identical and ``step`` is pure; the declared guarantee is what every ledger entry states and no
class is charged beyond it; config validation names the field; an incompatible state and a
skipped slot are refused; docstrings state the guarantee and cite the spec. Flow level (through
the family's generic operator under Bytewax): a recovery round trip is byte-identical, two
workers release what one does, the persisted step ids are the pinned ones, and a replay of the
whole flow is identical.

Example::

    from privstream.conformance.checks import yield_checks
    from privstream.families.registry import REGISTRY

    for check in yield_checks(REGISTRY[0], flows=False):
        check()
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privstream.conformance import flows as flow_checks
from privstream.families.registry import Registered
from privstream.mechanisms.accounting import division_of
from privstream.mechanisms.client import (
    ClientPort,
    CuratorPort,
    ReportPort,
    Requirements,
    slot_port,
)
from privstream.mechanisms.contract import (
    ClassSpend,
    Conformance,
    Event,
    ExtraRecord,
    LedgerEntry,
    Mechanism,
    Release,
    Slot,
)
from privstream.mechanisms.driver import Lane, drive_slot
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.guarantees import WindowScope
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.stages import pre_server
from privstream.mechanisms.trust import needs_registration
from privstream.operators.chain import chain_slot
from privstream.schema.keys import release_id

SEED = 11
TOLERANCE = 1e-9  # relative slack of a window sum of float shares (the ledgers' own)


class CheckFailed(AssertionError):
    """A mechanism does not conform; the message names the mechanism and the property."""


@dataclass(frozen=True)
class Check:
    """One conformance check of one mechanism: call it to run it (raises ``CheckFailed``)."""

    name: str
    mechanism: str
    family: str
    run: Callable[[], None]
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.family}:{self.mechanism}:{self.name}"

    def __call__(self) -> None:
        self.run()


def _require(ok: bool, mech: Mechanism[Any, Any], what: str) -> None:
    if not ok:
        raise CheckFailed(f"{mech.name}: {what}")


def population_values(t: int, n: int) -> NDArray[np.float64]:
    """A drifting binary population, so adaptive mechanisms both publish and approximate."""
    rng = np.random.default_rng([99, t])
    p = 0.2 + 0.15 * np.sin(t / 3)
    values: NDArray[np.float64] = (rng.random(n) < p).astype(np.float64)
    return values


def registration(n: int) -> Requirements:
    """Personalized requirements of a ``cdp`` example (stream default ε = 1, w = 5): a third of
    the users keep the default (NaN / 0), the others ask for their own."""
    return Requirements(np.resize([np.nan, 1.0, 2.0, 1.5], n), np.resize([0, 3, 5, 2, 5], n))


def make_slot(mech: Mechanism[Any, Any], t: int, seed: int = SEED, clients: Any = None) -> Slot:
    """Slot ``t`` with the port of the mechanism's trust mode over the example population
    (``clients``: the client side's state, behind the port)."""
    randomness = SlotRandomness(seed, "conf", t)
    return Slot("conf", t, _port(mech, t, randomness, clients), randomness)


def _port(
    mech: Mechanism[Any, Any], t: int, randomness: SlotRandomness, clients: Any
) -> ClientPort | CuratorPort | ReportPort:
    """The port of the mechanism's trust mode at slot ``t`` over the example population, as
    its stages before the server hand it on (``chain_slot``: the devices' reports; fresh
    stage states, so a replay of a slot is the same)."""
    n = mech.conformance.population
    values, task = population_values(t, n), mech.config.task
    values = chain_slot(pre_server([mech]), "conf", t, values, {})
    mode = mech.trust_modes[0]
    regs = registration(n) if needs_registration(mode) else None
    return slot_port(mode, values, task, randomness, requirements=regs, clients=clients)


States = tuple[Any, Any]
"""A stream of one mechanism: its state and its client side's state."""


def start(mech: Mechanism[Any, Any]) -> States:
    return mech.initial_state(), mech.client_state()


def run(
    mech: Mechanism[Any, Any], states: States, slots: range, seed: int = SEED
) -> tuple[States, list[Event]]:
    """Step ``mech`` through ``slots`` with the shared step driver (``mechanisms.driver``);
    the devices' state moves on with every step, as the operator moves it."""
    lane = Lane(mech, *states)
    events: list[Event] = []
    for t in slots:
        randomness = SlotRandomness(seed, "conf", t)

        def port_for(_: str, r: SlotRandomness, clients: Any, t: int = t) -> Any:
            return _port(mech, t, r, clients)

        def randomness_for(_: str, r: SlotRandomness = randomness) -> SlotRandomness:
            return r

        step = drive_slot({mech.name: lane}, "conf", t, port_for, randomness_for,
                          halt_failures=False)  # fmt: skip
        stepped = step.stepped[mech.name]
        lane.state = stepped.state
        lane.clients = lane.clients if stepped.clients is None else stepped.clients
        events.extend(stepped.events)
    return (lane.state, lane.clients), events


def _releases(events: Sequence[Event]) -> list[Release]:
    return [e for e in events if isinstance(e, Release)]


# -- mechanism level -------------------------------------------------------------------------------


def check_one_release_per_slot(mech: Mechanism[Any, Any]) -> None:
    T = mech.conformance.slots
    _, events = run(mech, start(mech), range(1, T + 1))
    groups = _slot_groups(events)
    _require(groups is not None and len(groups) == T, mech,
             "each slot must emit one release per release key, then one ledger entry")  # fmt: skip
    for t, releases in enumerate(groups or [], start=1):
        ids = [r.release_id for r in releases]
        keyed = all(r.key for r in releases)
        expected = [release_id("conf", mech.name, t, *(v for _k, v in r.key)) for r in releases]
        _require(ids == expected and (keyed or len(ids) == 1), mech, "release ids")


def _slot_groups(events: Sequence[Event]) -> list[list[Release]] | None:
    """Each slot's releases in ``events``: releases with distinct release ids (one per release
    key, ``Release.key``; one where a family declares no key parts) then one ledger entry;
    None when they break that shape. Extra-output records may come anywhere."""
    groups: list[list[Release]] = []
    current: list[Release] = []
    for event in events:
        if isinstance(event, Release):
            if event.release_id in {r.release_id for r in current}:
                return None
            current.append(event)
        elif isinstance(event, LedgerEntry):
            if not current:
                return None
            groups.append(current)
            current = []
        elif not isinstance(event, ExtraRecord):
            return None
    return None if current else groups


def check_pickle_restore(mech: Mechanism[Any, Any]) -> None:
    T = mech.conformance.slots
    half, first = run(mech, start(mech), range(1, T // 2 + 1))
    _, resumed = run(mech, pickle.loads(pickle.dumps(half)), range(T // 2 + 1, T + 1))
    _, straight = run(mech, start(mech), range(1, T + 1))
    _require(first + resumed == straight, mech, "a restored snapshot must continue identically")


def check_seeding(mech: Mechanism[Any, Any]) -> None:
    slots = range(1, mech.conformance.slots + 1)
    _, a = run(mech, start(mech), slots)
    _, b = run(mech, start(mech), slots)
    _, c = run(mech, start(mech), slots, seed=SEED + 1)
    _require(a == b, mech, "the same seed must give the same releases")
    _require([r.estimate for r in _releases(a)] != [r.estimate for r in _releases(c)], mech,
             "another seed must give other noise")  # fmt: skip


def check_purity_and_replay(mech: Mechanism[Any, Any]) -> None:
    (state, clients), _ = run(mech, start(mech), range(1, 8))
    before = pickle.dumps((state, clients))
    slot = make_slot(mech, 8, clients=clients)
    once, twice = mech.step(state, slot), mech.step(state, slot)
    _require(pickle.dumps((state, clients)) == before, mech, "step mutated its input state")
    _require(once[1] == twice[1], mech, "a replayed slot must release identically")
    _require(pickle.dumps(once[0]) == pickle.dumps(twice[0]), mech, "replayed state differs")


def check_declared_cost(mech: Mechanism[Any, Any]) -> None:
    """Every ledger entry states the declared guarantee and division, and what it charged each
    class stays within it: per-slot charges add up to the window spend (budget division), a
    class is charged the whole ε at most once per window (population division), or no user's
    account passes the budget (per-user division)."""
    cost = mech.privacy_cost
    _, events = run(mech, start(mech), range(1, 3 * mech.conformance.slots + 1))
    entries = [e for e in events if isinstance(e, LedgerEntry)]
    _require(all(e.guarantee == cost for e in entries), mech, "ledger states another guarantee")
    _require(all(e.division == mech.division for e in entries), mech, "ledger's division")
    for k in range(max(len(e.classes) for e in entries)):
        rows = [e.classes[k] for e in entries if len(e.classes) > k]
        _check_class(mech, k, rows)
    _check_declared_division(mech, entries)


def _check_declared_division(mech: Mechanism[Any, Any], entries: list[LedgerEntry]) -> None:
    """A family's own division (``DivisionSpec.recompute``): the spend the audit recomputes
    from the published entries is what each entry declares, within its budget."""
    recompute = division_of(mech.division).recompute
    if recompute is None:
        return
    for entry, (slot, spend, budget) in zip(
        entries, recompute([e.to_dict() for e in entries]), strict=True
    ):
        declared = max(c.spent for c in entry.classes)
        _require(slot == entry.slot and abs(declared - spend) <= TOLERANCE * budget, mech,
                 f"slot {slot}: declares {declared:g}, its division recomputes {spend:g}")  # fmt: skip
        _require(spend <= budget * (1 + TOLERANCE), mech, f"slot {slot}: division overspent")


def _check_class(mech: Mechanism[Any, Any], k: int, rows: list[ClassSpend]) -> None:
    cost, cls = mech.privacy_cost, rows[0]
    charged = np.array([c.charged for c in rows])
    spent = np.array([c.spent for c in rows])
    _require(spent.max() <= cls.budget * (1 + TOLERANCE), mech, f"class {k} overspent")
    _require(bool((charged >= 0).all()), mech, f"class {k}: a negative charge")
    if mech.division == "budget":
        sums = np.convolve(charged, np.ones(cls.scope))[: len(charged)]
        _require(np.allclose(spent, sums, rtol=0, atol=1e-12), mech,
                 f"class {k}: window spend is not the sum of its charges")  # fmt: skip
    elif mech.division == "population":
        _require(set(charged) | set(spent) <= {0.0, cls.budget}, mech,
                 f"class {k}: population division charges the whole ε or nothing")  # fmt: skip
    if isinstance(cost.scope, WindowScope) and mech.division == "budget":
        uniform = np.convolve(charged, np.ones(cost.scope.window))[: len(charged)]
        _require(uniform.max() <= cost.budget * (1 + TOLERANCE), mech,
                 "the declared (ε, w) is exceeded")  # fmt: skip


def check_config_validation(mech: Mechanism[Any, Any]) -> None:
    for field, value in mech.conformance.invalid:
        try:
            dataclasses.replace(mech.config, **{field: value})
        except ValueError as exc:
            _require(field in str(exc), mech, f"the error for {field}={value!r} must name it")
        else:
            raise CheckFailed(f"{mech.name}: {field}={value!r} was accepted")


def check_incompatible_state(mech: Mechanism[Any, Any]) -> None:
    state = mech.initial_state()
    state.version += 1
    try:
        mech.step(state, make_slot(mech, 1, clients=mech.client_state()))
    except IncompatibleState as exc:
        _require("version" in str(exc), mech, "the refusal must name the version")
    else:
        raise CheckFailed(f"{mech.name}: a state of another version was accepted")


def check_skipped_slot(mech: Mechanism[Any, Any]) -> None:
    (state, clients), _ = run(mech, start(mech), range(1, 3))
    try:
        mech.step(state, make_slot(mech, 5, clients=clients))
    except ValueError as exc:
        _require("expected slot 3" in str(exc), mech, "the refusal must name the slot")
    else:
        raise CheckFailed(f"{mech.name}: a skipped slot was accepted")


def check_documentation(mech: Mechanism[Any, Any]) -> None:
    doc = type(mech).__doc__ or ""
    cited = re.search(r"spec( [\w.-]+)? §", doc) is not None
    _require(cited, mech, "docstring must cite the spec section it implements")
    module = __import__(type(mech).__module__, fromlist=["_"]).__doc__ or ""
    _require("ε" in module and "DP" in module, mech, "module docstring must state the guarantee")


MECHANISM_CHECKS: tuple[Callable[[Mechanism[Any, Any]], None], ...] = (
    check_one_release_per_slot, check_pickle_restore, check_seeding, check_purity_and_replay,
    check_declared_cost, check_config_validation, check_incompatible_state, check_skipped_slot,
    check_documentation,
)  # fmt: skip


def yield_checks(registered: Registered, *, flows: bool = True) -> Iterator[Check]:
    """The checks that apply to ``registered``: every mechanism-level check and, with ``flows``,
    the flow-level ones; a check the mechanism skips carries its reason."""
    skips = _conformance(registered).skips
    named: list[tuple[str, Callable[[], None]]] = [
        (fn.__name__.removeprefix("check_"), _bind(fn, registered)) for fn in MECHANISM_CHECKS
    ]
    if flows:
        named += [(name, _bind_flow(fn, registered)) for name, fn in flow_checks.FLOW_CHECKS]
    for name, fn in named:
        yield Check(name, registered.name, registered.family.name, fn, skips.get(name))


def _conformance(registered: Registered) -> Conformance:
    return registered.family.mechanisms[registered.name].conformance


def _bind(fn: Callable[[Mechanism[Any, Any]], None], registered: Registered) -> Callable[[], None]:
    return lambda: fn(registered.example(_conformance(registered).population))


def _bind_flow(fn: Callable[[Registered], None], registered: Registered) -> Callable[[], None]:
    return lambda: fn(registered)
