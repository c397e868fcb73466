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
    build,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask

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

    def laplace(self, inner: Any) -> Any:
        def wrapped(rng: Any, scale: float, size: int) -> Any:
            sensitivity = SENSITIVITY / D if size == 1 else SENSITIVITY
            self.steps[-1].append((sensitivity / scale, self._sample))
            self._sample = None
            return inner(rng, scale, size)

        return wrapped

    def losses(self, m: int) -> NDArray[np.float64]:
        """``T×m`` actual loss of each class at each step."""
        out = np.zeros((len(self.steps), m))
        for t, uses in enumerate(self.steps):
            for theta_noise, sample in uses:
                if sample is None:  # no sampling: every user's row went in
                    out[t] += theta_noise
                    continue
                budgets, theta = sample
                for c in range(m):
                    b = float(budgets[c])
                    p = 0.0 if b <= 0 else 1.0 if b >= theta else math.expm1(b) / math.expm1(theta)
                    out[t, c] += math.log1p(p * math.expm1(theta_noise))
        return out


@contextlib.contextmanager
def spying() -> Iterator[Spy]:
    spy = Spy()
    originals = personalized.sm_sample, personalized.laplace
    personalized.sm_sample = spy.sm_sample(originals[0])  # type: ignore[assignment]
    personalized.laplace = spy.laplace(originals[1])  # type: ignore[assignment]
    try:
        yield spy
    finally:
        personalized.sm_sample, personalized.laplace = originals  # type: ignore[assignment]


# -- running a mechanism with forced decisions --------------------------------------------------


@dataclass(frozen=True)
class Case:
    classes: tuple[tuple[int, float], ...]  # distinct (w_c, ε_c), sorted as the curator sorts
    sizes: tuple[int, ...]
    decisions: tuple[bool, ...]

    @property
    def n(self) -> int:
        return sum(self.sizes)

    def requirements(self) -> Requirements:
        eps = np.repeat([e for _, e in self.classes], self.sizes)
        win = np.repeat([w for w, _ in self.classes], self.sizes)
        return Requirements(eps, win)

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
    releases: list[Release]
    entries: list[LedgerEntry]
    losses: NDArray[np.float64]  # actual, from the spy

    def charges(self) -> NDArray[np.float64]:
        rows = []
        for e in self.entries:
            assert e.classes is not None
            rows.append([c.epsilon_dc + c.epsilon_pub for c in e.classes])
        return np.array(rows)


def run(mech: PersonalizedMechanism, case: Case) -> Run:
    decisions = case.decisions
    mech.wants_publication = lambda t, dis, thr: decisions[t - 1]  # type: ignore[method-assign]
    req = case.requirements()
    values = np.arange(case.n, dtype=np.int64) % D
    state = mech.initial_state()
    releases, entries = [], []
    with spying() as spy:
        for t in range(1, len(decisions) + 1):
            spy.steps.append([])
            r = SlotRandomness(7, "inv", t)
            slot = Slot("inv", t, SimulatedCurator(values, mech.config.task, req), r)
            state, (release, entry) = mech.step(state, slot)
            assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
            releases.append(release)
            entries.append(entry)
    return Run(releases, entries, spy.losses(len(case.classes)))


# -- checks ---------------------------------------------------------------------------------------


def window_sums(per_slot: Sequence[Fraction] | NDArray[np.float64], w: int) -> list[Any]:
    prefix: list[Any] = [0]
    for x in per_slot:
        prefix.append(prefix[-1] + x)
    return [prefix[t] - prefix[max(0, t - w)] for t in range(1, len(prefix))]


def assert_actual_loss_within_requirements(result: Run, case: Case) -> None:
    """(C1) on what the data went through, for every class and every window of its own w_c;
    and no slot used more than it charged."""
    for c, (w, eps) in enumerate(case.classes):
        sums = window_sums(result.losses[:, c], w)
        worst = int(np.argmax(sums))
        assert sums[worst] <= eps * (1 + RELATIVE_TOLERANCE), (
            f"class (w={w}, ε={eps}) lost {sums[worst]:.6g} in the window ending at slot {worst + 1}"
        )
    assert np.all(result.losses <= result.charges() * (1 + 1e-9) + 1e-15), "loss above charge"


def assert_float_charges_within_requirements(result: Run, case: Case) -> None:
    """(C1) on the charges the mechanism reports, exactly (each float read as a Fraction) up to
    the ledger's relative tolerance; ``window_spent`` is the recomputed window sum."""
    charges = result.charges()
    for c, (w, eps) in enumerate(case.classes):
        exact = window_sums([Fraction(float(x)) for x in charges[:, c]], w)
        limit = Fraction(eps) * (1 + Fraction(RELATIVE_TOLERANCE))
        assert max(exact) <= limit
        reported = [e.classes[c].window_spent for e in result.entries]  # type: ignore[index]
        assert np.allclose(reported, [float(x) for x in exact], rtol=0, atol=1e-12 * eps)


@dataclass
class Schedule:
    """An exact budget schedule: per class and slot, PartDC and PartNOP charges."""

    dc: list[list[Fraction]]
    pub: list[list[Fraction]]
    strategies: list[str]
    personalized: bool


def check_schedule(schedule: Schedule, result: Run, case: Case, tolerance: list[float]) -> None:
    T, m = len(case.decisions), len(case.classes)
    assert [r.strategy for r in result.releases] == schedule.strategies
    for c, (w, eps) in enumerate(case.classes):
        total = [schedule.dc[t][c] + schedule.pub[t][c] for t in range(T)]
        assert max(window_sums(total, w)) <= Fraction(eps), "the exact schedule breaks (C1)"
        dc = window_sums([schedule.dc[t][c] for t in range(T)], w)
        assert max(dc) <= Fraction(eps) / 2
        if schedule.personalized:  # PartDC is exactly ε_c/2 in every full window of w_c slots
            assert all(s == Fraction(eps) / 2 for s in dc[w - 1 :])
            floats = [Fraction(e.classes[c].epsilon_dc) for e in result.entries]  # type: ignore[index]
            half = Fraction(eps) / 2
            assert all(abs(s - half) <= w * ULP * eps for s in window_sums(floats, w)[w - 1 :])
    for t, e in enumerate(result.entries):
        assert e.classes is not None
        for c in range(m):
            assert e.classes[c].epsilon_dc == pytest.approx(float(schedule.dc[t][c]), rel=ULP)
            assert abs(e.classes[c].epsilon_pub - float(schedule.pub[t][c])) <= tolerance[c]


def exact_pbd(case: Case, result: Run, uniform: bool) -> Schedule:
    """Alg. 4 (PBD) or Kellaris' BD (one (ε, w) for all) in exact arithmetic. Decisions are the
    script's; a float allocation that underflows to zero may skip where the exact one publishes
    a negligible amount, so the publish flag follows the mechanism there (checked below)."""
    cfg = case.config()
    classes = [(cfg.window, cfg.epsilon)] * len(case.classes) if uniform else case.classes
    T = len(case.decisions)
    dc = [[Fraction(eps) / (2 * w) for w, eps in classes] for _ in range(T)]
    pub: list[list[Fraction]] = []
    strategies = []
    window = [Fraction(0)] * len(classes)  # Σ_{k=t−w_c+1}^{t−1} E2_c[k], slid slot by slot
    for t in range(T):
        proposal = [
            (Fraction(eps) / 2 - s) / 2 for s, (_, eps) in zip(window, classes, strict=True)
        ]
        published = result.releases[t].strategy == "publish"
        if case.decisions[t] and not published:  # only a float underflow of ε_rm may do this
            assert all(
                p <= 4 * w * ULP * eps for p, (w, eps) in zip(proposal, classes, strict=True)
            )
        assert published <= case.decisions[t]
        pub.append(proposal if published else [Fraction(0)] * len(classes))
        strategies.append("publish" if published else "skip")
        for c, (w, _) in enumerate(classes):
            window[c] += pub[t][c]
            if t - w + 1 >= 0:
                window[c] -= pub[t - w + 1][c]
    return Schedule(dc, pub, strategies, personalized=not uniform)


def exact_pba(case: Case, uniform: bool) -> Schedule:
    """Alg. 5 in its paper form (t_{i,N}, t_{i,A} with the max bound, A16's virtual start) for
    PBA, or Kellaris' BA for one (ε, w), in exact arithmetic."""
    cfg = case.config()
    classes = [(cfg.window, cfg.epsilon)] * len(case.classes) if uniform else case.classes
    T = len(case.decisions)
    dc = [[Fraction(eps) / (2 * w) for w, eps in classes] for _ in range(T)]
    pub: list[list[Fraction]] = []
    strategies = []
    last, used = 0, [1] * len(classes)  # virtual publication at slot 0 with one share each
    for t in range(1, T + 1):
        t_n = [s - 1 for s in used]
        if t - last <= max(t_n):
            pub.append([Fraction(0)] * len(classes))
            strategies.append("nullified")
            continue
        t_a = [max(t - last - tn, 0) for tn in t_n]
        shares = [min(a, w) for a, (w, _) in zip(t_a, classes, strict=True)]
        if case.decisions[t - 1]:
            pub.append(
                [s * Fraction(eps) / (2 * w) for s, (w, eps) in zip(shares, classes, strict=True)]
            )
            strategies.append("publish")
            last, used = t, shares
        else:
            pub.append([Fraction(0)] * len(classes))
            strategies.append("skip")
    return Schedule(dc, pub, strategies, personalized=not uniform)


# -- hypothesis -----------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> Case:
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
    return Case(classes, sizes, decisions)


def tolerance(case: Case) -> list[float]:
    """A PBD allocation is ``(ε_c/2 − Σ_{w_c−1 terms})/2``: each of the ``w_c`` float operations
    errs by at most one ulp of ``ε_c`` (values ≤ ε_c), and earlier errors enter halved, so the
    float charge is within ``4·w_c·2^-52·ε_c`` of the exact one."""
    return [4 * w * ULP * eps for w, eps in case.classes]


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_pbd_invariant(case: Case) -> None:
    result = run(build("PBD", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    check_schedule(exact_pbd(case, result, uniform=False), result, case, tolerance(case))


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_pba_invariant(case: Case) -> None:
    result = run(build("PBA", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    shares = [ULP * eps for _, eps in case.classes]  # one rounded product per charge
    check_schedule(exact_pba(case, uniform=False), result, case, shares)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_bd_invariant(case: Case) -> None:
    result = run(build("BD", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    cfg = case.config()
    tol = [4 * cfg.window * ULP * cfg.epsilon] * len(case.classes)
    check_schedule(exact_pbd(case, result, uniform=True), result, case, tol)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_ba_invariant(case: Case) -> None:
    result = run(build("BA", case.config()), case)
    assert_actual_loss_within_requirements(result, case)
    assert_float_charges_within_requirements(result, case)
    cfg = case.config()
    check_schedule(
        exact_pba(case, uniform=True), result, case, [ULP * cfg.epsilon] * len(case.classes)
    )


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

    def start(self, state: PersonalizedState, hist: ClassHistogram) -> None:
        state.ledger = ForgetfulLedger(hist.windows, hist.epsilons)


class ArtifactPBA(PBA):
    """The artifact's PBA: the last-publication record stays at (slot −1, one share) forever,
    i.e. ``a ≡ 0``: nothing is ever nullified and after w slots every publication absorbs w
    shares (spec §8 item 1)."""

    name = "PBA"

    def start(self, state: PersonalizedState, hist: ClassHistogram) -> None:
        state.absorbed = np.zeros(hist.windows.shape[0], dtype=np.int64)

    def published(
        self, state: PersonalizedState, hist: ClassHistogram, pub: NDArray[np.float64]
    ) -> None:
        pass


class UnguardedArtifactPBA(ArtifactPBA):
    def start(self, state: PersonalizedState, hist: ClassHistogram) -> None:
        super().start(state, hist)
        state.ledger = ForgetfulLedger(hist.windows, hist.epsilons)


DEFECT_CASE = Case(((6, 1.0), (12, 2.0)), (3, 2), (True,) * 60)


def test_the_checks_pass_on_the_real_mechanisms() -> None:
    for mech in (build("PBD", DEFECT_CASE.config()), build("PBA", DEFECT_CASE.config())):
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
