"""The personalized w-event mechanisms slot by slot (spec personalized-w-event §3, §4, §10).

* §10 item 2 — ledger traces with forced decisions: PBD-1, PBD-2 (§4.2), PBA-1, PBA-2 (§4.3)
  exactly, and BD/BA as single-class special cases.
* §10 item 4 — differential tests: with one class and ``threshold_mode = laplace_scale``, PBD
  equals BD and PBA equals BA bit for bit under shared randomness.
* §10 item 7 — end-to-end smoke tests with huge and tiny budgets.
* PLBU's estimate is unbiased; the uniform baselines refuse requirements they cannot meet; a
  user changing class halts the stream (their old class shrinks; growth is in
  ``test_personalized_growth``).

Decisions are forced by replacing ``wants_publication`` (the ``dis > threshold`` rule), which
is what the spec calls injecting the decision.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray

from privstream.families.registry import PERSONALIZED
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import LedgerEntry, Release, Slot
from privstream.mechanisms.errors import PrivacyBudgetExceeded
from privstream.mechanisms.guarantees import ClassScope, Guarantee, PureDP, WindowScope
from privstream.mechanisms.personalized import (
    MECHANISMS,
    PersonalizedConfig,
    PersonalizedMechanism,
    PersonalizedRelease,
    PersonalizedState,
)
from privstream.mechanisms.seeding import SlotRandomness
from privstream.mechanisms.tasks import FrequencyTask
from tests.mechanisms.ledger_rows import Row, class_rows

Values = Callable[[int], NDArray[np.int64]]
Step = tuple[Release, LedgerEntry]


def constant(n: int, d: int = 2) -> Values:
    values = np.arange(n, dtype=np.int64) % d
    return lambda t: values


def drifting(n: int, d: int, seed: int = 5) -> Values:
    """A population whose histogram drifts slowly with bursts, so adaptive mechanisms both
    publish and approximate."""

    def values(t: int) -> NDArray[np.int64]:
        rng = np.random.default_rng([seed, t])
        shift = int(3 * math.sin(t / 15)) + (t // 40) % 2
        return np.asarray((rng.integers(0, d, n) + (rng.random(n) < 0.3) * shift) % d)

    return values


def drive(
    mech: PersonalizedMechanism,
    requirements: Requirements,
    values: Values,
    T: int,
    seed: int = 1,
    scope: str = "",
    state: PersonalizedState | None = None,
) -> list[Step]:
    state = mech.initial_state() if state is None else state
    steps: list[Step] = []
    for t in range(1, T + 1):
        r = SlotRandomness(seed, "s", t, scope=scope)
        slot = Slot("s", t, SimulatedCurator(values(t), mech.config.task, requirements), r)
        state, events = mech.step(state, slot)
        release, entry, *_ = events
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        steps.append((release, entry))
    return steps


def forced(mech: PersonalizedMechanism, decisions: Sequence[bool]) -> PersonalizedMechanism:
    """Publish exactly when ``decisions[t − 1]`` (the step's decision is injected)."""
    mech.wants_publication = lambda t, dis, threshold: decisions[t - 1]  # type: ignore[method-assign]
    return mech


def proposals(mech: PersonalizedMechanism) -> list[NDArray[np.float64]]:
    """Record PWSM's proposed ``𝛆^{(2)}`` of every slot that is not nullified."""
    seen: list[NDArray[np.float64]] = []
    inner = mech.publication_budgets  # type: ignore[attr-defined]

    def spy(state: PersonalizedState, hist: object) -> NDArray[np.float64]:
        out: NDArray[np.float64] = inner(state, hist)
        seen.append(out.copy())
        return out

    mech.publication_budgets = spy  # type: ignore[attr-defined]
    return seen


def classes_of(steps: list[Step]) -> list[tuple[Row, ...]]:
    return [class_rows(entry) for _, entry in steps]


def details(release: Release) -> PersonalizedRelease:
    assert isinstance(release.details, PersonalizedRelease)
    return release.details


def exact(x: float) -> Fraction:
    return Fraction(x)


def config(n: int, eps: float = 1.0, w: int = 4, d: int = 2, **kw: object) -> PersonalizedConfig:
    return PersonalizedConfig(population=n, epsilon=eps, window=w, task=FrequencyTask(d), **kw)  # type: ignore[arg-type]


# -- §10 item 2: ledger traces ------------------------------------------------------------------


def test_pbd_1_paper_figure_5() -> None:
    """One user class with w = 4: decisions [pub, skip, pub] propose ε/4, ε/8 (not charged),
    ε/8; DC is ε/8 every slot; slot 1 charges 3ε/8."""
    mech = forced(PERSONALIZED.build("PBD", config(3)), [True, False, True])
    seen = proposals(mech)
    steps = drive(mech, Requirements(population=3), constant(3), 3)
    assert [exact(float(p[0])) for p in seen] == [Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]
    rows = [c[0] for c in classes_of(steps)]
    assert [exact(r.epsilon_dc) for r in rows] == [Fraction(1, 8)] * 3
    assert [exact(r.epsilon_pub) for r in rows] == [Fraction(1, 4), 0, Fraction(1, 8)]
    assert exact(rows[0].epsilon_dc + rows[0].epsilon_pub) == Fraction(3, 8)
    assert [r.strategy for r, _ in steps] == ["publish", "approximate", "publish"]
    assert [exact(r.window_spent) for r in rows] == [Fraction(3, 8), Fraction(1, 2), Fraction(3, 4)]


def test_pbd_1_scales_with_epsilon() -> None:
    """The allocation fraction depends on w only (§4.2): the same trace at ε = 0.6."""
    mech = forced(PERSONALIZED.build("PBD", config(3, eps=0.6)), [True, False, True])
    seen = proposals(mech)
    drive(mech, Requirements(population=3), constant(3), 3)
    assert [float(p[0]) for p in seen] == pytest.approx([0.15, 0.075, 0.075], rel=1e-15)


def test_pbd_2_two_windows() -> None:
    """§4.2 PBD-2: windows 4 and 2, decisions pub, pub, pub, skip, pub, pub (exact fractions)."""
    req = Requirements([1.0] * 4, [4, 4, 2, 2])
    mech = forced(PERSONALIZED.build("PBD", config(4)), [True, True, True, False, True, True])
    seen = proposals(mech)
    steps = drive(mech, req, constant(4), 6)
    w2 = [
        Fraction(1, 4),
        Fraction(1, 8),
        Fraction(3, 16),
        Fraction(5, 32),
        Fraction(1, 4),
        Fraction(1, 8),
    ]
    w4 = [
        Fraction(1, 4),
        Fraction(1, 8),
        Fraction(1, 16),
        Fraction(1, 32),
        Fraction(5, 32),
        Fraction(9, 64),
    ]
    # classes are sorted by window: (2, 1.0) then (4, 1.0)
    assert [exact(float(p[0])) for p in seen] == w2
    assert [exact(float(p[1])) for p in seen] == w4
    charged = [[exact(c.epsilon_pub) for c in row] for row in classes_of(steps)]
    assert charged[3] == [0, 0]  # the skipped slot's allocation is discarded
    assert [row[0] for row in charged] == [x if t != 3 else 0 for t, x in enumerate(w2)]


def test_pbd_publishing_every_slot_w4() -> None:
    mech = forced(PERSONALIZED.build("PBD", config(2)), [True] * 8)
    seen = proposals(mech)
    drive(mech, Requirements(population=2), constant(2), 8)
    want = [Fraction(1, 4), Fraction(1, 8), Fraction(1, 16), Fraction(1, 32),
            Fraction(9, 64), Fraction(17, 128), Fraction(25, 256), Fraction(33, 512)]  # fmt: skip
    assert [exact(float(p[0])) for p in seen] == want


def test_bd_is_the_single_class_pbd_trace() -> None:
    mech = forced(PERSONALIZED.build("BD", config(3)), [True, False, True])
    rows = [c[0] for c in classes_of(drive(mech, Requirements(population=3), constant(3), 3))]
    assert [exact(r.epsilon_pub) for r in rows] == [Fraction(1, 4), 0, Fraction(1, 8)]
    assert [exact(r.epsilon_dc) for r in rows] == [Fraction(1, 8)] * 3


def test_pba_1_paper_figure_6() -> None:
    """§4.3 PBA-1: users with windows (4, 2, 3); pub, skip, pub, (nullified), pub."""
    eps = {4: 0.8, 2: 0.5, 3: 0.9}
    req = Requirements([eps[4], eps[2], eps[3]], [4, 2, 3])
    mech = forced(PERSONALIZED.build("PBA", config(3)), [True, False, True, True, True])
    steps = drive(mech, req, constant(3), 5)
    assert [r.strategy for r, _ in steps] == [
        "publish", "approximate", "publish", "nullified", "publish"
    ]  # fmt: skip
    shares = {1: 1, 2: 0, 3: 2, 4: 0, 5: 1}
    for t, row in enumerate(classes_of(steps), start=1):
        assert [c.window for c in row] == [2, 3, 4]
        for c in row:
            share = c.epsilon / (2 * c.window)
            assert c.epsilon_dc == share  # PartDC every slot, the nullified one included
            assert c.epsilon_pub == shares[t] * share
    # the table's ε^{(2)} column at t = 3: ε1/4, ε2/2, ε3/3
    third = {c.window: c.epsilon_pub for c in classes_of(steps)[2]}
    assert third == {4: eps[4] / 4, 2: eps[2] / 2, 3: pytest.approx(eps[3] / 3, rel=1e-15)}


def test_pba_2_cap_and_mixed_windows() -> None:
    """§4.3 PBA-2: windows {3, 5}; skip slots 1–6, then "wanted publish" every slot."""
    req = Requirements([1.0, 1.0], [3, 5])
    T = 14
    mech = forced(PERSONALIZED.build("PBA", config(2, w=5)), [False] * 6 + [True] * (T - 6))
    state = mech.initial_state()
    steps: list[Step] = []
    absorbed: dict[int, list[int]] = {}
    for t in range(1, T + 1):
        r = SlotRandomness(1, "s", t)
        state, (release, entry, *_) = mech.step(
            state, Slot("s", t, SimulatedCurator(constant(2)(t), mech.config.task, req), r)
        )
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        steps.append((release, entry))
        assert state.absorbed is not None
        absorbed[t] = state.absorbed.tolist()
    strategies = [r.strategy for r, _ in steps]
    assert (
        strategies
        == ["approximate"] * 6 + ["publish"] + ["nullified"] * 4 + ["publish"] + ["nullified"] * 2
    )
    used = [
        [round(c.epsilon_pub / (c.epsilon / (2 * c.window))) for c in row]
        for row in classes_of(steps)
    ]
    assert used[6] == [3, 5] and absorbed[7] == [10, 12]
    assert used[11] == [3, 1] and absorbed[12] == [15, 13]
    assert all(u == [0, 0] for t, u in enumerate(used, start=1) if t not in (7, 12))


def test_ba_is_the_single_class_pba_trace() -> None:
    """BA with w = 2: publish (1 share), skip, publish (2 shares), nullified, publish (1)."""
    mech = forced(PERSONALIZED.build("BA", config(2, w=2)), [True, False, True, True, True])
    steps = drive(mech, Requirements(population=2), constant(2), 5)
    assert [r.strategy for r, _ in steps] == [
        "publish", "approximate", "publish", "nullified", "publish"
    ]  # fmt: skip
    assert [details(r).theta_pub for r, _ in steps] == [0.25, 0.0, 0.5, 0.0, 0.25]
    assert [details(r).theta_dc for r, _ in steps] == [0.25] * 5


# -- §10 item 4: differential tests ---------------------------------------------------------------


@pytest.mark.parametrize(("personal", "kellaris"), [("PBD", "BD"), ("PBA", "BA")])
def test_single_class_equals_kellaris_bit_for_bit(personal: str, kellaris: str) -> None:
    n, d, T = 3000, 3, 250
    cfg = config(n, eps=1.0, w=10, d=d, threshold_mode="laplace_scale")
    req = Requirements(population=n)  # nobody states a preference: one class (1.0, 10)
    ours = drive(PERSONALIZED.build(personal, cfg), req, drifting(n, d), T, scope="shared")
    theirs = drive(PERSONALIZED.build(kellaris, cfg), req, drifting(n, d), T, scope="shared")
    # one class: the per-class guarantee (w_c, ε_c) is the uniform one (w, ε), declared so
    personal_guarantee, uniform_guarantee = ours[0][0].guarantee, theirs[0][0].guarantee
    assert personal_guarantee == Guarantee(PureDP(1.0), ClassScope(10), "cdp")
    assert uniform_guarantee == Guarantee(PureDP(1.0), WindowScope(10), "cdp")
    for (a, ea), (b, eb) in zip(ours, theirs, strict=True):
        assert dataclasses.replace(a, mechanism=kellaris, guarantee=uniform_guarantee) == b
        assert dataclasses.replace(ea, mechanism=kellaris, guarantee=uniform_guarantee) == eb
    strategies = {r.strategy for r, _ in ours}
    assert "publish" in strategies and "approximate" in strategies
    if kellaris == "BA":
        assert "nullified" in strategies


def test_default_threshold_is_the_papers() -> None:
    """A14: PBD/PBA compare with sqrt(err); BD/BA with the Laplace scale Δ/ε2."""
    assert PERSONALIZED.build("PBD", config(3)).threshold_mode == "sqrt_err"
    assert PERSONALIZED.build("PBA", config(3)).threshold_mode == "sqrt_err"
    assert PERSONALIZED.build("BD", config(3)).threshold_mode == "laplace_scale"
    assert PERSONALIZED.build("BA", config(3)).threshold_mode == "laplace_scale"
    assert (
        PERSONALIZED.build("BD", config(3, threshold_mode="sqrt_err")).threshold_mode == "sqrt_err"
    )
    mech = PERSONALIZED.build("PBD", config(3))
    assert mech.threshold(0.5, 8.0) == math.sqrt(8.0)
    assert PERSONALIZED.build("BD", config(3)).threshold(0.5, 8.0) == 2.0


# -- §10 item 7: end-to-end smoke tests -----------------------------------------------------------


@pytest.mark.parametrize("name", ["PBD", "PBA", "BD", "BA", "Uniform", "PU", "Sample"])
def test_huge_budgets_track_the_truth(name: str) -> None:
    """ε = 10⁶: every noise scale is ≤ 2^w·w/ε ≈ 10⁻⁴, OBS picks a threshold that samples
    everybody (err_s = 0 is optimal), and the stream changes every slot, so every release is
    the true histogram up to variance ≲ 10⁻⁷ (Sample only at its sampling slots)."""
    n, d, T = 400, 4, 40
    req = Requirements(np.resize([1e6, 2e6], n), np.resize([2, 5], n))
    values = drifting(n, d)
    mech = PERSONALIZED.build(name, config(n, eps=1e6, w=5, d=d))
    steps = drive(mech, req, values, T)
    truth = np.array([np.bincount(values(t), minlength=d) for t in range(1, T + 1)])
    releases = np.array([r.estimate for r, _ in steps])
    rows = range(0, T, 5) if name == "Sample" else range(T)
    amre = float(np.mean((releases[list(rows)] - truth[list(rows)]) ** 2))
    assert amre <= 1e-6


@pytest.mark.parametrize("name", ["PBD", "PBA"])
def test_tiny_budgets_stop_publishing(name: str) -> None:
    """ε ∈ {0.01, 0.02}, d = 100, n = 100,000: the first slot publishes (dis* = n/d exceeds the
    threshold), then the skip/null rate approaches 1 — the last release's own noise averages
    ``E|Lap(b)| = b`` per bin, below the PWSM threshold ``sqrt(err) ≥ √2·b``, and DC's noise
    ``Lap(2w/(dε))`` is small beside the gap. (With Kellaris' threshold ``b`` the same argument
    gives a coin flip, so this holds for PBD/PBA, not BD/BA.)"""
    n, d, T = 100_000, 100, 120
    req = Requirements(np.resize([0.01, 0.02], n), np.resize([1, 2], n))
    mech = PERSONALIZED.build(name, config(n, eps=0.01, w=2, d=d))
    steps = drive(mech, req, lambda t: np.random.default_rng([3, t]).integers(0, d, n), T)
    strategies = [r.strategy for r, _ in steps]
    assert strategies[0] == "publish"
    later = strategies[5:]
    assert sum(s != "publish" for s in later) / len(later) >= 0.98


# -- PLBU -----------------------------------------------------------------------------------------


def test_plbu_is_unbiased_with_the_oue_variance() -> None:
    """A13: each user reports with OUE at ε_i/w_i; the summed per-class estimates are unbiased,
    within four standard errors of the closed-form variance
    ``Σ_c [n_cj/4 + (m_c − n_cj)·q_c(1 − q_c)]/(1/2 − q_c)²``."""
    n, d, K = 300, 3, 3000
    req = Requirements(np.resize([1.0, 0.5], n), np.resize([2, 5], n))
    values = np.resize(np.array([0, 1, 1, 2, 2, 2]), n)
    mech = PERSONALIZED.build("PLBU", config(n, eps=0.5, w=5, d=d))
    assert mech.privacy_cost == Guarantee(PureDP(0.5), ClassScope(5), "ldp")
    steps = drive(mech, req, lambda t: values, K)
    estimates = np.array([r.estimate for r, _ in steps])
    hist = SimulatedCurator(values, FrequencyTask(d), req).class_histogram(0.5, 5)
    var = np.zeros(d)
    for c in range(hist.windows.shape[0]):
        q = 1 / (math.exp(hist.epsilons[c] / hist.windows[c]) + 1)
        m = hist.counts[c].sum()
        var += (hist.counts[c] / 4 + (m - hist.counts[c]) * q * (1 - q)) / (0.5 - q) ** 2
    assert np.all(np.abs(estimates.mean(axis=0) - hist.total) <= 4 * np.sqrt(var / K))
    rows = classes_of(steps[:1])[0]
    assert [c.epsilon_pub for c in rows] == [c.epsilon / c.window for c in rows]
    assert all(r.strategy == "publish" and details(r).bits == n * d for r, _ in steps[:5])


# -- requirements, validation, names --------------------------------------------------------------


@pytest.mark.parametrize("name", ["BD", "BA", "Uniform", "Sample"])
def test_uniform_baselines_refuse_stricter_users(name: str) -> None:
    """One (ε, w) protects user i only if ε ≤ ε_i and w ≥ w_i (spec §3)."""
    for eps, win in (([0.5, 1.0], [3, 3]), ([1.0, 1.0], [3, 6])):
        mech = PERSONALIZED.build(name, config(2, eps=1.0, w=5))
        with pytest.raises(PrivacyBudgetExceeded, match="cannot protect"):
            drive(mech, Requirements(eps, win), constant(2), 1)
    drive(
        PERSONALIZED.build(name, config(2, eps=1.0, w=5)),
        Requirements([1.0, 3.0], [5, 2]),
        constant(2),
        3,
    )


def test_changed_requirements_halt_the_stream() -> None:
    mech = PERSONALIZED.build("PBD", config(4))
    steps_state = mech.initial_state()
    first = Requirements([1.0, 1.0, 2.0, 2.0], [4, 4, 2, 2])
    moved = Requirements([1.0, 2.0, 2.0, 2.0], [4, 2, 2, 2])  # user 1 changes class
    r = SlotRandomness(1, "s", 1)
    state, _ = mech.step(
        steps_state, Slot("s", 1, SimulatedCurator(constant(4)(1), mech.config.task, first), r)
    )
    r2 = SlotRandomness(1, "s", 2)
    with pytest.raises(PrivacyBudgetExceeded, match=r"class 1 \(w=4, ε=1\) shrank from 2 to 1"):
        mech.step(
            state, Slot("s", 2, SimulatedCurator(constant(4)(2), mech.config.task, moved), r2)
        )
    same = Requirements([1.0, 1.0, 2.0, 2.0], [4, 4, 2, 2])  # rebuilt registry, same content
    mech.step(state, Slot("s", 2, SimulatedCurator(constant(4)(2), mech.config.task, same), r2))


def test_population_and_domain_must_match() -> None:
    mech = PERSONALIZED.build("PBA", config(4, d=3))
    r = SlotRandomness(1, "s", 1)
    with pytest.raises(ValueError, match="expects n=4"):
        mech.step(
            mech.initial_state(),
            Slot(
                "s",
                1,
                SimulatedCurator(np.zeros(5), FrequencyTask(3), Requirements(population=5)),
                r,
            ),
        )
    with pytest.raises(ValueError, match="expected d=3"):
        mech.step(
            mech.initial_state(),
            Slot(
                "s",
                1,
                SimulatedCurator(np.zeros(4), FrequencyTask(2), Requirements(population=4)),
                r,
            ),
        )


def test_release_and_entry_fields() -> None:
    n = 6
    req = Requirements([0.5, 0.5, 1.0, 1.0, np.nan, np.nan], [2, 2, 4, 4, 0, 0])
    mech = forced(PERSONALIZED.build("PBA", config(n, eps=1.0, w=4)), [True, False, True, True])
    steps = drive(mech, req, constant(n), 4)
    release, entry = steps[0]
    assert release.release_id == "s/PBA/1" and release.source_slot == 1
    assert details(release).users_dc == details(release).users_pub == n  # both parts charged
    assert details(release).registered == n
    assert details(release).error is not None and details(release).dissimilarity is not None
    assert sum(c.users for c in entry.classes) == n
    ratios = [c.spent_ratio for c in entry.classes]
    assert entry.spent / entry.budget == max(ratios)  # properties: the binding class
    nullified = steps[3][0]
    assert nullified.strategy == "nullified" and details(nullified).users_pub == 0
    assert nullified.estimate == steps[2][0].estimate and nullified.source_slot == 3
    assert steps[1][0].estimate == release.estimate  # an approximation repeats r_{t−1}
    assert release.guarantee == entry.guarantee == mech.privacy_cost
    assert mech.privacy_cost == Guarantee(PureDP(1.0), ClassScope(4), "cdp")  # (w, ε)-EPDP
    assert PERSONALIZED.build("BD", config(3)).privacy_cost == Guarantee(
        PureDP(1.0), WindowScope(4), "cdp"
    )  # w-event ε-DP


def test_mechanism_names() -> None:
    assert PERSONALIZED.names("pbd, BA,uniform") == ["PBD", "BA", "Uniform"]
    assert PERSONALIZED.names(["sample", "PLBU"]) == ["Sample", "PLBU"]
    with pytest.raises(ValueError, match="unknown"):
        PERSONALIZED.names("PBX")
    with pytest.raises(ValueError, match="twice"):
        PERSONALIZED.names("pbd,PBD")
    with pytest.raises(ValueError, match="unknown personalized mechanism"):
        PERSONALIZED.build("LBD", config(3))
    assert set(MECHANISMS) == {"BD", "BA", "Uniform", "Sample", "PLBU", "PU", "PBD", "PBA"}
