"""Privacy invariant (C1) of the personalized mechanisms (spec personalized-w-event §1.4, §8,
§10 item 3).

Two accountings, both independent of ``PersonalizedLedger``:

* **What the data actually went through.** A spy wraps the module's ``sm_sample`` and
  ``laplace`` and records every use of the data: each Laplace draw is a ``θ'``-DP step
  (``θ' = Δ/scale`` for a release, ``(Δ/d)/scale`` for the dissimilarity, whose sensitivity is
  ``Δ/d``), and a preceding SM_s with budgets ``b_c`` and threshold ``θ`` amplifies it to
  ``ln(1 + p_c(e^{θ'} − 1))`` for class ``c`` (``p_c`` recomputed here). Summed over every
  class's own window these losses must stay within ``ε_c``: this is what catches a publication
  whose budget is not recorded (the reference artifact's defect of spec §8 item 1).
* **What the paper allocates.** An exact ``Fraction`` re-implementation of each mechanism's
  budget schedule, driven by the same decisions, satisfies (C1) exactly, PartDC sums to exactly
  ``ε_c/2`` per full window, and the mechanism's float charges match it.

Classes are random (w ∈ [1, 300], ε ∈ (0, 5]) and decision sequences are random, of length at
least 5·max w (spec §10 item 3).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from privstream.families.registry import PERSONALIZED
from privstream.mechanisms import personalized
from privstream.mechanisms.client import ClassHistogram, Requirements, SimulatedCurator
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.ledger import RELATIVE_TOLERANCE, LedgerPart, PersonalizedLedger
from privstream.mechanisms.personalized import (
    PBA,
    PBD,
    SENSITIVITY,
    PersonalizedConfig,
    PersonalizedMechanism,
    PersonalizedState,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.mechanisms.ledger_rows import class_rows

D = 2
EXAMPLES = 10
ULP = 2.0**-52

# -- the spy: actual privacy loss per class and slot -----------------------------------------------


@dataclass
class Spy:
    """Records, per step, every (sampling, noise) use of the data."""

    steps: list[list[tuple[float, tuple[NDArray[np.float64], float] | None]]] = field(
        default_factory=list
    )
    _sample: tuple[NDArray[np.float64], float] | None = None

    def sm_sample(self, inner: Any) -> Any:
        def wrapped(counts: Any, budgets: Any, theta: float, rng: Any) -> Any:
            self._sample = (np.array(budgets, dtype=np.float64), float(theta))
            return inner(counts, budgets, theta, rng)

        return wrapped

    def noise(self, inner: Any) -> Any:
        """Every noise draw is ``DLap(Δ/ε)`` on an integer query of sensitivity ``Δ`` (the
        histogram, or the dissimilarity's integer sum): the loss is ``ε`` (at most, since the
        public scale rounds up)."""

        def wrapped(rng: Any, epsilon: float, size: int) -> Any:
            out = inner(rng, epsilon, size)
            scale = personalized.noise_scale(epsilon)
            assert SENSITIVITY / scale <= Fraction(epsilon)  # rounding up never spends more
            self.steps[-1].append((epsilon, self._sample))
            self._sample = None
            return out

        return wrapped

    def losses(self, orders: Sequence[Sequence[int]], m: int) -> NDArray[np.float64]:
        """``T×m`` actual loss of each class at each step; ``orders[t][k]`` is the case class of
        the mechanism's ``k``-th class at step ``t`` (only registered classes' data is used)."""
        out = np.zeros((len(self.steps), m))
        for t, uses in enumerate(self.steps):
            for theta_noise, sample in uses:
                if sample is None:  # no sampling: every registered user's row went in
                    out[t, list(orders[t])] += theta_noise
                    continue
                budgets, theta = sample
                assert budgets.shape[0] == len(orders[t])
                for k, c in enumerate(orders[t]):
                    b = float(budgets[k])
                    p = 0.0 if b <= 0 else 1.0 if b >= theta else math.expm1(b) / math.expm1(theta)
                    out[t, c] += math.log1p(p * math.expm1(theta_noise))
        return out


@contextlib.contextmanager
def spying() -> Iterator[Spy]:
    spy = Spy()
    originals = personalized.sm_sample, personalized.discrete_noise
    personalized.sm_sample = spy.sm_sample(originals[0])  # type: ignore[assignment]
    personalized.discrete_noise = spy.noise(originals[1])  # type: ignore[assignment]
    try:
        yield spy
    finally:
        personalized.sm_sample, personalized.discrete_noise = originals  # type: ignore[assignment]


# -- running a mechanism with forced decisions --------------------------------------------------


@dataclass(frozen=True)
class Case:
    """Classes, their sizes, the forced decisions and, optionally, when each user registers.

    ``arrivals[c][u]`` is the step at which member ``u`` of class ``c`` registers (None: every
    user from step 1). A class joins the stream with its first member (spec §9.5); users
    registering later join its ledger. Unregistered users still hold values, which the curator
    must ignore.
    """

    classes: tuple[tuple[int, float], ...]  # distinct (w_c, ε_c), sorted as the curator sorts
    sizes: tuple[int, ...]
    decisions: tuple[bool, ...]
    arrivals: tuple[tuple[int, ...], ...] | None = None

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def T(self) -> int:
        return len(self.decisions)

    def joins(self) -> list[int]:
        """Step (1-based) at which each class joins."""
        if self.arrivals is None:
            return [1] * len(self.classes)
        return [min(a) for a in self.arrivals]

    def present(self) -> NDArray[np.bool_]:
        """``T×m``: class ``c`` is registered at step ``t + 1``."""
        steps = np.arange(1, self.T + 1)[:, None]
        return np.asarray(steps >= np.array(self.joins())[None, :])

    def requirements(self, t: int = 1) -> Requirements:
        eps = np.repeat([e for _, e in self.classes], self.sizes)
        win = np.repeat([w for w, _ in self.classes], self.sizes)
        if self.arrivals is None:
            return Requirements(eps, win)
        arrival = np.concatenate([np.array(a, dtype=np.int64) for a in self.arrivals])
        return Requirements(eps, win, registered=arrival <= t)

    def config(self) -> PersonalizedConfig:
        """The stream default is the only uniform (ε, w) satisfying everyone (spec §3)."""
        return PersonalizedConfig(
            population=self.n,
            epsilon=min(e for _, e in self.classes),
            window=max(w for w, _ in self.classes),
            task=FrequencyTask(D),
        )


@dataclass
class Run:
    """Per step and case class: PartDC and PartNOP charged and the reported window spend (zero
    while the class is not registered)."""

    releases: list[Release]
    entries: list[LedgerEntry]
    losses: NDArray[np.float64]  # actual, from the spy
    dc: NDArray[np.float64]
    pub: NDArray[np.float64]
    spent: NDArray[np.float64]

    def charges(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.dc + self.pub
        return out


def run(mech: PersonalizedMechanism, case: Case) -> Run:
    decisions = case.decisions
    mech.wants_publication = lambda t, dis, thr: decisions[t - 1]  # type: ignore[method-assign]
    index = {key: c for c, key in enumerate(case.classes)}
    m, T = len(case.classes), case.T
    values = np.arange(case.n, dtype=np.int64) % D
    state = mech.initial_state()
    releases, entries, orders = [], [], []
    dc, pub, spent = np.zeros((T, m)), np.zeros((T, m)), np.zeros((T, m))
    req, registered = case.requirements(1), -1
    with spying() as spy:
        for t in range(1, T + 1):
            if case.arrivals is not None:  # rebuilt only when somebody registers, as an operator
                now = case.requirements(t)
                if now.registered_count != registered:
                    req, registered = now, now.registered_count
            spy.steps.append([])
            r = SlotRandomness(7, "inv", t)
            slot = Slot("inv", t, SimulatedCurator(values, mech.config.task, req), r)
            state, (release, entry, *_) = mech.step(state, slot)
            assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
            rows = class_rows(entry)
            order = [index[(c.window, c.epsilon)] for c in rows]
            assert sorted(order) == np.flatnonzero(case.present()[t - 1]).tolist()
            for k, c in enumerate(order):
                row = rows[k]
                dc[t - 1, c], pub[t - 1, c], spent[t - 1, c] = (
                    row.epsilon_dc,
                    row.epsilon_pub,
                    row.window_spent,
                )
            releases.append(release)
            entries.append(entry)
            orders.append(order)
    return Run(releases, entries, spy.losses(orders, m), dc, pub, spent)


# -- checks ---------------------------------------------------------------------------------------


def window_sums(per_slot: Sequence[Fraction] | NDArray[np.float64], w: int) -> list[Any]:
    prefix: list[Any] = [0]
    for x in per_slot:
        prefix.append(prefix[-1] + x)
    return [prefix[t] - prefix[max(0, t - w)] for t in range(1, len(prefix))]


def assert_actual_loss_within_requirements(result: Run, case: Case) -> None:
    """(C1) on what the data went through, for every class and every window of its own w_c
    (windows reaching before its join hold zeros there); no slot used more than it charged, and
    nothing of a class was used before it registered."""
    for c, (w, eps) in enumerate(case.classes):
        sums = window_sums(result.losses[:, c], w)
        worst = int(np.argmax(sums))
        assert sums[worst] <= eps * (1 + RELATIVE_TOLERANCE), (
            f"class (w={w}, ε={eps}) lost {sums[worst]:.6g} in the window ending at slot {worst + 1}"
        )
    assert np.all(result.losses <= result.charges() * (1 + 1e-9) + 1e-15), "loss above charge"
    assert np.all(result.losses[~case.present()] == 0), "an unregistered class's data was used"


def assert_float_charges_within_requirements(result: Run, case: Case) -> None:
    """(C1) on the charges the mechanism reports, exactly (each float read as a Fraction) up to
    the ledger's relative tolerance, over every window since each class joined;
    ``window_spent`` is the recomputed window sum."""
    charges = result.charges()
    present = case.present()
    for c, (w, eps) in enumerate(case.classes):
        exact = window_sums([Fraction(float(x)) for x in charges[:, c]], w)
        limit = Fraction(eps) * (1 + Fraction(RELATIVE_TOLERANCE))
        assert max(exact) <= limit
        assert all(x == 0 for x in charges[~present[:, c], c])
        assert np.allclose(result.spent[:, c], [float(x) for x in exact], rtol=0, atol=1e-12 * eps)


@dataclass
class Schedule:
    """An exact budget schedule: per class and slot, PartDC and PartNOP charges."""

    dc: list[list[Fraction]]
    pub: list[list[Fraction]]
    strategies: list[str]
    personalized: bool


def check_schedule(schedule: Schedule, result: Run, case: Case, tolerance: list[float]) -> None:
    T = case.T
    assert [r.strategy for r in result.releases] == schedule.strategies
    for c, ((w, eps), join) in enumerate(zip(case.classes, case.joins(), strict=True)):
        total = [schedule.dc[t][c] + schedule.pub[t][c] for t in range(T)]
        assert max(window_sums(total, w)) <= Fraction(eps), "the exact schedule breaks (C1)"
        dc = window_sums([schedule.dc[t][c] for t in range(T)], w)
        assert max(dc) <= Fraction(eps) / 2
        if schedule.personalized:  # PartDC is exactly ε_c/2 in every full window since the join
            full = join - 1 + w - 1  # index of the first window lying after the join
            assert all(s == Fraction(eps) / 2 for s in dc[full:])
            floats = [Fraction(float(x)) for x in result.dc[:, c]]
            half = Fraction(eps) / 2
            assert all(abs(s - half) <= w * ULP * eps for s in window_sums(floats, w)[full:])
        for t in range(T):
            assert result.dc[t, c] == pytest.approx(float(schedule.dc[t][c]), rel=ULP)
            assert abs(result.pub[t, c] - float(schedule.pub[t][c])) <= tolerance[c]


def exact_pbd(case: Case, result: Run, uniform: bool) -> Schedule:
    """Alg. 4 (PBD) or Kellaris' BD (one (ε, w) for all) in exact arithmetic, with classes
    joining per spec §9.5: PBD starts a class with an empty look-back at its join; BD keeps one
    stream-wide schedule and charges each class from its join on. Decisions are the script's;
    a float allocation that underflows to zero may approximate where the exact one publishes a
    negligible amount (or one below ``MIN_SLOT_EPSILON``, which is never spent), so the publish
    flag follows the mechanism there (checked below). Nobody
    registered: approximate, charge nothing."""
    cfg = case.config()
    m, T = len(case.classes), case.T
    present = case.present()
    # PBD: one schedule per class; BD: one stream schedule (ε, w) applied to every class.
    schedules = [(cfg.window, cfg.epsilon)] if uniform else list(case.classes)
    E2: list[list[Fraction]] = []  # per schedule and step
    window = [Fraction(0)] * len(schedules)  # Σ_{k=t−w+1}^{t−1} E2[k], slid slot by slot
    dc: list[list[Fraction]] = []
    pub: list[list[Fraction]] = []
    strategies = []
    for t in range(T):
        live = present[t] if not uniform else np.array([present[t].any()])
        proposal = [
            (Fraction(eps) / 2 - s) / 2 if on else Fraction(0)
            for s, (_, eps), on in zip(window, schedules, live, strict=True)
        ]
        published = result.releases[t].strategy == "publish"
        if case.decisions[t] and present[t].any() and not published:  # a vanishing remainder
            floor = Fraction(personalized.MIN_SLOT_EPSILON)  # below it nothing is spent
            assert all(
                p <= 4 * w * ULP * eps or p < floor * (1 + Fraction(1, 10**6))
                for p, (w, eps) in zip(proposal, schedules, strict=True)
            )
        assert published <= (case.decisions[t] and present[t].any())
        floor = Fraction(personalized.MIN_SLOT_EPSILON)  # a vanishing remainder is not spent
        spent = [p if p >= floor else Fraction(0) for p in proposal]
        E2.append(spent if published else [Fraction(0)] * len(schedules))
        strategies.append("publish" if published else "approximate")
        for k, (w, _) in enumerate(schedules):
            window[k] += E2[t][k]
            if t - w + 1 >= 0:
                window[k] -= E2[t - w + 1][k]
        own = [schedules[0 if uniform else c] for c in range(m)]
        dc.append(
            [
                Fraction(eps) / (2 * w) if present[t, c] else Fraction(0)
                for c, (w, eps) in enumerate(own)
            ]
        )
        pub.append([E2[t][0 if uniform else c] if present[t, c] else Fraction(0) for c in range(m)])
    return Schedule(dc, pub, strategies, personalized=not uniform)


def exact_pba(case: Case, uniform: bool) -> Schedule:
    """Alg. 5 in its paper form (t_{i,N}, t_{i,A} with the max bound, A16's virtual start) for
    PBA, or Kellaris' BA for one (ε, w), in exact arithmetic.

    Classes joining later (spec §9.5): PBA gives each class its own last publication ``l_c``
    and shares ``s_c``, starting from a virtual publication of one share at ``t_c − 1`` (A16
    at the join, i.e. ``a_c = t_c``); every class present at the last publication has the
    paper's ``l``. BA keeps one stream-wide ``(l, s_l)`` and charges each class from its join
    on. Nobody registered: approximate, nothing changes."""
    cfg = case.config()
    m, T = len(case.classes), case.T
    present = case.present()
    own = [(cfg.window, cfg.epsilon)] * m if uniform else list(case.classes)
    dc = [
        [
            Fraction(eps) / (2 * w) if present[t, c] else Fraction(0)
            for c, (w, eps) in enumerate(own)
        ]
        for t in range(T)
    ]
    pub: list[list[Fraction]] = []
    strategies = []
    if uniform:  # one record for the stream: virtual publication at slot 0 with one share
        stream_last, stream_used = 0, 1
    last, used = [j - 1 for j in case.joins()], [1] * m
    for t in range(1, T + 1):
        live = [c for c in range(m) if present[t - 1, c]]
        if uniform:
            last, used = [stream_last] * m, [stream_used] * m
        t_n = [s - 1 for s in used]
        row = [Fraction(0)] * m
        if not live:
            strategy = "approximate"
        elif any(t - last[c] <= t_n[c] for c in live):
            strategy = "nullified"
        else:
            shares = [min(max(t - last[c] - t_n[c], 0), own[c][0]) for c in range(m)]
            strategy = "publish" if case.decisions[t - 1] else "approximate"
            if strategy == "publish":
                for c in live:
                    w, eps = own[c]
                    row[c] = shares[c] * Fraction(eps) / (2 * w)
                    last[c], used[c] = t, shares[c]
                if uniform:
                    stream_last, stream_used = t, shares[0]
        pub.append(row)
        strategies.append(strategy)
    return Schedule(dc, pub, strategies, personalized=not uniform)


# -- hypothesis -----------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn, growing: bool = False) -> Case:
    raw = draw(
        st.lists(
            st.tuples(
                st.integers(1, 300),
                st.floats(1e-3, 5.0, allow_nan=False, allow_infinity=False),
            ),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    classes = tuple(sorted(raw))
    sizes = tuple(draw(st.lists(st.integers(1, 3), min_size=len(classes), max_size=len(classes))))
    T = 5 * max(w for w, _ in classes) + draw(st.integers(0, 10))
    mode = draw(st.sampled_from(["random", "all", "none", "bursts"]))
    if mode == "random":
        rate = draw(st.floats(0.05, 0.95))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        decisions = tuple(bool(x) for x in rng.random(T) < rate)
    elif mode == "bursts":
        period = draw(st.integers(1, 60))
        decisions = tuple((t // period) % 2 == 0 for t in range(T))
    else:
        decisions = (mode == "all",) * T
    arrivals = None
    if growing:  # each class joins at a random step (often 1); later members register later
        joined = []
        for size in sizes:
            first = 1 if draw(st.booleans()) else draw(st.integers(1, T))
            later = draw(st.lists(st.integers(first, T), min_size=size - 1, max_size=size - 1))
            joined.append((first, *sorted(later)))
        arrivals = tuple(joined)
    return Case(classes, sizes, decisions, arrivals)


def tolerance(case: Case) -> list[float]:
    """A PBD allocation is ``(ε_c/2 − Σ_{w_c−1 terms})/2``: each of the ``w_c`` float operations
    errs by at most one ulp of ``ε_c`` (values ≤ ε_c), and earlier errors enter halved, so the
    float charge is within ``4·w_c·2^-52·ε_c`` of the exact one."""
    return [4 * w * ULP * eps for w, eps in case.classes]


def check_pbd(case: Case) -> None:
    result = run(PERSONALIZED.build("PBD", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    check_schedule(exact_pbd(case, result, uniform=False), result, case, tolerance(case))


def check_pba(case: Case) -> None:
    result = run(PERSONALIZED.build("PBA", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    shares = [ULP * eps for _, eps in case.classes]  # one rounded product per charge
    check_schedule(exact_pba(case, uniform=False), result, case, shares)


def check_bd(case: Case) -> None:
    result = run(PERSONALIZED.build("BD", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    cfg = case.config()
    tol = [4 * cfg.window * ULP * cfg.epsilon] * len(case.classes)
    check_schedule(exact_pbd(case, result, uniform=True), result, case, tol)


def check_ba(case: Case) -> None:
    result = run(PERSONALIZED.build("BA", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    cfg = case.config()
    check_schedule(
        exact_pba(case, uniform=True), result, case, [ULP * cfg.epsilon] * len(case.classes)
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_pbd_invariant(case: Case) -> None:
    check_pbd(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_pba_invariant(case: Case) -> None:
    check_pba(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_bd_invariant(case: Case) -> None:
    check_bd(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_ba_invariant(case: Case) -> None:
    check_ba(case)


# Users register over time (spec §9.5): classes join at random steps (the stream may start with
# nobody registered), later members join their class's ledger, and a class whose window is
# larger than every earlier one grows the ledger's ring.


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(growing=True))
def test_pbd_invariant_with_joining_classes(case: Case) -> None:
    check_pbd(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(growing=True))
def test_pba_invariant_with_joining_classes(case: Case) -> None:
    check_pba(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(growing=True))
def test_bd_invariant_with_joining_classes(case: Case) -> None:
    check_bd(case)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(growing=True))
def test_ba_invariant_with_joining_classes(case: Case) -> None:
    check_ba(case)


JOINING = [
    # a late class with the largest window (ring resize) while the small one keeps publishing
    Case(((3, 0.7), (40, 1.3)), (2, 1), (True,) * 120 + (False,) * 10 + (True,) * 70,
         ((1, 50), (60,))),
    # empty start; the wide class joins first, the narrow one inside its nullified period
    Case(((2, 0.5), (9, 2.0)), (1, 2), ((True, False, False) * 40),
         ((17,), (5, 80))),
    # a class joins at the very last step
    Case(((4, 1.0), (7, 1.0)), (1, 1), (True,) * 40, ((1,), (40,))),
]  # fmt: skip


@pytest.mark.parametrize("case", JOINING)
@pytest.mark.parametrize("check", [check_pbd, check_pba, check_bd, check_ba])
def test_joining_examples(case: Case, check: Any) -> None:
    check(case)


def test_partdc_is_exactly_half_the_budget_per_window() -> None:
    case = Case(((3, 0.7), (5, 1.3)), (2, 1), (True, False) * 10)
    schedule = exact_pba(case, uniform=False)
    for c, (w, eps) in enumerate(case.classes):
        sums = window_sums([schedule.dc[t][c] for t in range(20)], w)
        assert all(s == Fraction(eps) / 2 for s in sums[w - 1 :])


# -- the reference artifact's defect (spec §8 item 1) and an unrecorded publication -------------


class ForgetfulLedger(PersonalizedLedger):
    """A ledger that loses publication charges: the publication happens, its budget is never
    recorded."""

    def charge(self, t: int, amounts: NDArray[np.float64], part: LedgerPart) -> None:
        if part == "dc":
            super().charge(t, amounts, part)


class UnrecordedPBD(PBD):
    """PBD whose publications are not recorded, so ε_rm never shrinks."""

    name = "PBD"

    def new_ledger(self) -> PersonalizedLedger:
        return ForgetfulLedger(np.zeros(0, dtype=np.int64), np.zeros(0))


class ArtifactPBA(PBA):
    """The artifact's PBA: the last-publication record stays at (slot −1, one share) forever,
    i.e. ``a ≡ 0``: nothing is ever nullified and after w slots every publication absorbs w
    shares (spec §8 item 1)."""

    name = "PBA"

    def join(self, state: PersonalizedState, added: int) -> None:
        assert state.absorbed is not None
        state.absorbed = np.concatenate([state.absorbed, np.zeros(added, dtype=np.int64)])

    def published(
        self, state: PersonalizedState, hist: ClassHistogram, pub: NDArray[np.float64]
    ) -> None:
        pass


class UnguardedArtifactPBA(ArtifactPBA):
    def new_ledger(self) -> PersonalizedLedger:
        return ForgetfulLedger(np.zeros(0, dtype=np.int64), np.zeros(0))


DEFECT_CASE = Case(((6, 1.0), (12, 2.0)), (3, 2), (True,) * 60)


def test_the_checks_pass_on_the_real_mechanisms() -> None:
    for mech in (
        PERSONALIZED.build("PBD", DEFECT_CASE.config()),
        PERSONALIZED.build("PBA", DEFECT_CASE.config()),
    ):
        result = run(mech, DEFECT_CASE)
        assert_actual_loss_within_requirements(result, DEFECT_CASE)
        assert_float_charges_within_requirements(result, DEFECT_CASE)


def test_unrecorded_publication_is_caught() -> None:
    """The ledger never sees the publications, so it cannot object; the independent accounting
    of what the data went through does."""
    result = run(UnrecordedPBD(DEFECT_CASE.config()), DEFECT_CASE)
    with pytest.raises(AssertionError, match="lost"):
        assert_actual_loss_within_requirements(result, DEFECT_CASE)


def test_artifact_pba_is_refused_by_the_ledger() -> None:
    """With the ledger in place the artifact's overspending publication is refused before
    anything of its slot is released."""
    with pytest.raises(PrivacyBudgetExceeded, match="would spend"):
        run(ArtifactPBA(DEFECT_CASE.config()), DEFECT_CASE)


def test_artifact_pba_is_caught_without_the_ledger() -> None:
    result = run(UnguardedArtifactPBA(DEFECT_CASE.config()), DEFECT_CASE)
    assert all(r.strategy == "publish" for r in result.releases)  # never nullified
    with pytest.raises(AssertionError, match="lost"):
        assert_actual_loss_within_requirements(result, DEFECT_CASE)
    with pytest.raises(AssertionError):
        check_schedule(
            exact_pba(DEFECT_CASE, uniform=False), result, DEFECT_CASE, tolerance(DEFECT_CASE)
        )
