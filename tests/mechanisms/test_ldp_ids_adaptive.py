"""LB/LP-DSAT and LB/LP-RescueDP (spec ldp-ids §3.8–§3.9): their privacy invariants under
adversarial decisions and data, and the three faults of the public central-DP port
(``streamdp-benchmark``) that must not come back:

1. its DSAT window summed slots ``t−w … t−2``, so w consecutive slots could spend 1.5× the
   budget (w = 10) and 1.7× across the first window's boundary;
2. its PID feedback divided two integers, so the threshold only ever moved down;
3. its RescueDP Kalman filter took its process variance from the raw stream.

The accounting is recomputed from what the devices were asked (``RecordingPort`` of
``test_ldp_ids_invariants``), independently of the ledgers.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from privstream.mechanisms.contract import Slot
from privstream.mechanisms.ldp_ids import AdaptiveRelease, LdpIdsConfig, LdpIdsState
from privstream.mechanisms.ldp_ids_dsat import Dsat, LPDsat, publication_rate
from privstream.mechanisms.ldp_ids_rescue import RescueDP
from tests.mechanisms.test_ldp_ids_invariants import (
    TASK,
    TOL,
    StepRecord,
    all_present,
    build,
    check_budget_division,
    check_population_division,
    drive,
    scripted,
)

DSAT = ("LB-DSAT", "LP-DSAT")
RESCUE = ("LB-RescueDP", "LP-RescueDP")
EXAMPLES = 60


def control(rec: StepRecord) -> dict[str, Any]:
    details = rec.release.details
    assert isinstance(details, AdaptiveRelease)
    return details.control


def decisions_for(mode: str, T: int, draw: st.DrawFn) -> list[bool]:
    """Adversarial decision sequences: always, never, alternating, random."""
    if mode == "random":
        return draw(st.lists(st.booleans(), min_size=T, max_size=T))
    if mode == "alternating":
        return [t % 2 == 0 for t in range(T)]
    return [mode == "always"] * T


def min_population(name: str, beta: float, w: int, C: int) -> int:
    """LP-DSAT refuses g1 = ⌊⌊βn⌋/w⌋ = 0 (its dissimilarity would never be measured) and
    g2 = ⌊(n − ⌊βn⌋)/C⌋ = 0 (a publication would ask nobody)."""
    n = 50
    C = C or max(1, math.ceil(w / 5))
    if name == "LP-DSAT":
        while math.floor(beta * n) // w < 1 or (n - math.floor(beta * n)) // C < 1:
            n += 1
    return n


@st.composite
def cases(draw: st.DrawFn, names: tuple[str, ...]) -> tuple[str, LdpIdsConfig, list[bool]]:
    name = draw(st.sampled_from(names))
    w = draw(st.integers(1, 25))
    beta = draw(st.sampled_from([0.3, 0.5, 0.7]))
    C = draw(st.integers(0, w))
    cfg = LdpIdsConfig(
        epsilon=draw(st.floats(0.05, 8.0)),
        window=w,
        population=draw(st.integers(min_population(name, beta, w, C), 300)),
        task=TASK,
        beta=beta,
        publications=C,
    )
    T = draw(st.integers(1, 70))
    mode = draw(st.sampled_from(["always", "never", "alternating", "random"]))
    return name, cfg, decisions_for(mode, T, draw)


def check_division(records: list[StepRecord], cfg: LdpIdsConfig, division: str) -> None:
    """Thm 4.1 (Σ ε over any w consecutive slots ≤ ε) or Thm 5.2 (nobody reports twice in a
    window, so at most n reports per window), recomputed from the requests."""
    if division == "budget":
        check_budget_division(records, cfg)
        return
    check_population_division(records, cfg)
    reports = [r.rel.users_m1 + r.rel.users_m2 for r in records]
    for i in range(len(reports)):
        assert sum(reports[max(0, i - cfg.window + 1) : i + 1]) <= cfg.population


def publications_per_window(records: list[StepRecord], w: int) -> int:
    published = [r.release.strategy == "publish" for r in records]
    return max(sum(published[max(0, i - w + 1) : i + 1]) for i in range(len(published)))


# -- adversarial decision sequences ----------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(DSAT))
def test_dsat_invariants_under_adversarial_decisions(
    case: tuple[str, LdpIdsConfig, list[bool]],
) -> None:
    name, cfg, decisions = case
    mech = scripted(name, cfg, decisions)
    assert isinstance(mech, Dsat)
    records = drive(mech, len(decisions), all_present(cfg.population))
    check_division(records, cfg, mech.division)
    assert publications_per_window(records, cfg.window) <= mech.C
    g1 = mech.g1 if isinstance(mech, LPDsat) else cfg.population
    before = mech.initial_state().controller.threshold
    for rec in records:
        ctl = control(rec)
        assert ctl["threshold"] >= 0.0
        if ctl["threshold"] > before:  # a raise is clamped at 2 (scaled, A20)
            assert ctl["threshold"] <= 2.0 * cfg.threshold_scale
        before = ctl["threshold"]
        if rec.rel.users_m1:  # M1 ran: the distance test's full cost was charged
            assert rec.rel.users_m1 == g1
            assert rec.rel.epsilon_m1 == (
                cfg.epsilon
                if mech.division == "population"
                else cfg.beta * cfg.epsilon / cfg.window
            )
        else:  # skipped: no publication left in the window, no M1; the controller steps
            assert rec.release.strategy == "approximate" and ctl["feedback"] is not None


class ScriptedRescue:
    """A RescueDP whose sampling schedule is scripted: sample at slot t iff ``decisions[t−1]``;
    with ``pin_interval`` the interval is also held at 1 (so is the share p)."""

    def __init__(self, mech: RescueDP, decisions: list[bool], pin_interval: bool = False) -> None:
        original = mech.decide

        def decide(state: LdpIdsState, slot: Slot) -> Any:
            state.controller.next_step = state.t if decisions[state.t - 1] else -1
            if pin_interval:
                state.controller.interval = 1.0
            return original(state, slot)

        mech.decide = decide  # type: ignore[method-assign]
        self.mech = mech


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(RESCUE))
def test_rescue_invariants_under_adversarial_schedules(
    case: tuple[str, LdpIdsConfig, list[bool]],
) -> None:
    name, cfg, decisions = case
    mech = build(name, cfg)
    assert isinstance(mech, RescueDP)
    ScriptedRescue(mech, decisions)
    records = drive(mech, len(decisions), all_present(cfg.population))
    check_division(records, cfg, mech.division)
    for rec, sample in zip(records, decisions, strict=True):
        assert rec.rel.users_m1 == 0 and rec.rel.epsilon_m1 == 0.0  # no dissimilarity step
        if not sample:
            assert rec.release.strategy == "approximate" and rec.rel.users_m2 == 0


# -- adversarial data: always far from the last release --------------------------------------------


def far(n: int) -> Any:
    """Every user flips between 0 and 1 each slot: the histogram jumps by 1 every slot."""
    return lambda t: np.full(n, t % 2, dtype=np.int64)


@pytest.mark.parametrize("name", [*DSAT, *RESCUE])
@pytest.mark.parametrize("w", [1, 3, 10, 20])
def test_invariants_when_data_is_always_far(name: str, w: int) -> None:
    cfg = LdpIdsConfig(epsilon=1.0, window=w, population=40 * w, task=TASK)
    mech = build(name, cfg)
    records = drive(mech, 6 * w + 5, far(cfg.population))
    check_division(records, cfg, mech.division)
    if isinstance(mech, Dsat):
        assert publications_per_window(records, w) <= mech.C


def window_spends(records: list[StepRecord], w: int) -> list[float]:
    spend = [r.eps_spent() for r in records]
    return [sum(spend[i : i + w]) for i in range(len(spend) - w + 1)]


@pytest.mark.parametrize("w", [10, 20, 30])
def test_lb_dsat_spends_exactly_the_budget_over_its_kellaris_window(w: int) -> None:
    """Fault 1, our side: with data that always passes the threshold, LB-DSAT's publication
    spend over any w consecutive slots reaches its budget (1−β)ε exactly and never more
    (1.0×), and the whole spend (M1 runs only while a publication is left) stays within ε."""
    cfg = LdpIdsConfig(epsilon=1.0, window=w, population=200, task=TASK)
    mech = scripted("LB-DSAT", cfg, [True] * 10 * w)
    records = drive(mech, 10 * w, all_present(cfg.population))
    assert max(window_spends(records, w)) <= cfg.epsilon + TOL
    m2 = [r.rel.epsilon_m2 for r in records]
    assert max(sum(m2[i : i + w]) for i in range(len(m2) - w + 1)) == pytest.approx(
        (1 - cfg.beta) * cfg.epsilon, abs=TOL
    )


def public_port_spend(w: int, slots: int, first: float, later: float, skipped: int = 2) -> float:
    """A model of the public port's DSAT publication budget, in units of its per-window
    publication budget (1.0), with data that always passes the threshold: C = ⌈0.15w⌉;
    slots 0 … w publish at 0 and after ``skipped`` skipping points until C publications, each
    costing ``first``; from slot w+1 on it publishes ``later`` whenever the budget minus the
    spend at slots t−w … t−2 (its window) is positive. Returns the largest spend over any w
    consecutive slots."""
    C = math.ceil(0.15 * w)
    used = [0.0] * slots
    count = 0
    for t in range(slots):
        if t <= w:
            if (t == 0 or t > skipped) and count < C:
                used[t], count = first, count + 1
        elif 1.0 - sum(used[max(0, t - w) : t - 1]) > 1e-5:
            used[t] = later
    return max(sum(used[i : i + w]) for i in range(slots - w + 1))


def kellaris_spend(w: int, slots: int, cost: float) -> float:
    """The same budget with the Kellaris window t−w+1 … t: publish while it fits."""
    used = [0.0] * slots
    for t in range(slots):
        if sum(used[max(0, t - w + 1) : t]) + cost <= 1.0 + 1e-12:
            used[t] = cost
    return max(sum(used[i : i + w]) for i in range(slots - w + 1))


def test_the_public_ports_window_overspends_and_the_kellaris_window_does_not() -> None:
    """Fault 1, reproduced: at w = 10 (C = 2, each publication half the budget) the port's
    window t−w … t−2 lets 1.5× the budget into some w consecutive slots; across the first
    window's boundary, where its publications cost 0.7 of the later budget (its first window
    splits ε differently: 0.14 against 0.1 at ε = 1), 1.7×. The Kellaris window gives 1.0×."""
    C = math.ceil(0.15 * 10)
    assert public_port_spend(10, 400, 1 / C, 1 / C) == pytest.approx(1.5)
    assert public_port_spend(10, 400, 0.7, 1 / C) == pytest.approx(1.7)
    assert kellaris_spend(10, 400, 1 / C) == pytest.approx(1.0)


# -- fault 2: the PID feedback is a real ratio -------------------------------------------------------


def test_the_publication_rate_is_a_real_ratio() -> None:
    assert publication_rate(1, 3, 10) == 0.5  # an integer division gives 0
    assert publication_rate(3, 30, 10) == pytest.approx(3 / 9)
    assert publication_rate(0, 1, 10) == 0.0


@pytest.mark.parametrize("name", DSAT)
def test_the_threshold_rises_when_publishing_too_often(name: str) -> None:
    """Fault 2: with data that always passes the threshold, the rate exceeds C/w and the PID
    raises T̃; an integer-division rate (``count // t``) is 0 whenever count < t, below C/w,
    so it could only ever lower T̃."""
    w = 10
    cfg = LdpIdsConfig(epsilon=1.0, window=w, population=400, task=TASK)
    mech = scripted(name, cfg, [True] * 200)
    assert isinstance(mech, Dsat)
    records = drive(mech, 200, all_present(cfg.population))
    thresholds = [control(r)["threshold"] for r in records]
    rates = [control(r)["rate"] for r in records]
    late = [i for i in range(2 * w, 200) if rates[i] > mech.C / w]  # after the first windows
    assert late
    assert all(thresholds[i] > thresholds[i - 1] or thresholds[i] == 2.0 for i in late)
    integer_rates = [c // t for c, t in ((2, 9), (1, 2), (3, 9))]
    assert all(rate < mech.C / w for rate in integer_rates)


# -- fault 3: the Kalman filter sees only public numbers ---------------------------------------------


def sin_values(n: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)

    def values(t: int) -> NDArray[np.int64]:
        p = 0.075 + 0.05 * math.sin(0.01 * t)
        return (rng.random(n) < p).astype(np.int64)

    return values


@pytest.mark.parametrize("name", RESCUE)
def test_the_filter_is_reproduced_from_the_releases_and_public_config(name: str) -> None:
    """Every gain and variance is recomputed by an outsider from the releases (strategy, the
    reporting users, their budget) and the public configuration alone: Q is the configured
    prior, R the oracle's variance V(ε_t, n_t). Nothing of the raw stream enters the filter."""
    cfg = LdpIdsConfig(epsilon=1.0, window=20, population=5000, task=TASK)
    mech = build(name, cfg)
    records = drive(mech, 200, sin_values(cfg.population, 3))
    P = 1.0
    publications = 0
    for rec in records:
        P += cfg.process_variance
        if rec.release.strategy == "publish":
            publications += 1
            R = cfg.measurement_factor * mech.V(rec.rel.epsilon_m2, rec.rel.users_m2)
            K = P / (P + R)
            P = (1 - K) * P
            assert control(rec)["gain"] == pytest.approx(K, rel=1e-12)
        assert control(rec)["variance"] == pytest.approx(P, rel=1e-12)
    assert 5 <= publications < 200


@pytest.mark.parametrize("name", RESCUE)
def test_the_filter_does_not_depend_on_the_raw_spread(name: str) -> None:
    """Two streams with very different raw dynamics (a steady one, one that flips every slot)
    under the same sampling schedule and shares give the filter the same variances and gains
    (the schedule and shares themselves follow the releases: public)."""
    cfg = LdpIdsConfig(epsilon=1.0, window=10, population=2000, task=TASK)
    schedule = [t % 3 == 1 for t in range(60)]
    runs = []
    for values in (all_present(cfg.population), far(cfg.population)):
        mech = build(name, cfg)
        assert isinstance(mech, RescueDP)
        ScriptedRescue(mech, schedule, pin_interval=True)
        records = drive(mech, 60, values)
        runs.append([(control(r)["variance"], control(r)["gain"]) for r in records])
    assert runs[0] == runs[1]


# -- state: snapshot, resume, binding ----------------------------------------------------------------


@pytest.mark.parametrize("name", [*DSAT, *RESCUE])
def test_a_resumed_snapshot_continues_identically(name: str) -> None:
    cfg = LdpIdsConfig(epsilon=1.0, window=10, population=3000, task=TASK)
    mech = build(name, cfg)
    values = sin_values(cfg.population, 5)
    frames = [values(t) for t in range(1, 61)]
    whole = drive(mech, 60, lambda t: frames[t - 1])
    state = mech.initial_state()
    first = drive(mech, 30, lambda t: frames[t - 1], state=state)
    resumed = pickle.loads(pickle.dumps(_state_after(mech, frames, 30)))
    rest = _drive_from(mech, frames, resumed, 31, 60)
    for a, b in zip(whole, [*first, *rest], strict=True):
        assert a.release.to_dict() == b.release.to_dict()
        assert a.entry.to_dict() == b.entry.to_dict()


def _state_after(mech: Any, frames: list[Any], T: int) -> LdpIdsState:
    from privstream.mechanisms.client import SimulatedClientPort
    from privstream.mechanisms.seeding import SlotRandomness

    state = mech.initial_state()
    for t in range(1, T + 1):
        r = SlotRandomness(1, "s", t)
        state, _ = mech.step(state, Slot("s", t, SimulatedClientPort(frames[t - 1], TASK, r), r))
    return state


def _drive_from(
    mech: Any, frames: list[Any], state: LdpIdsState, lo: int, hi: int
) -> list[StepRecord]:
    from privstream.mechanisms.client import SimulatedClientPort
    from privstream.mechanisms.contract import LedgerEntry, Release
    from privstream.mechanisms.seeding import SlotRandomness

    out = []
    for t in range(lo, hi + 1):
        r = SlotRandomness(1, "s", t)
        state, events = mech.step(
            state, Slot("s", t, SimulatedClientPort(frames[t - 1], TASK, r), r)
        )
        release, entry, *_ = events
        assert isinstance(release, Release) and isinstance(entry, LedgerEntry)
        out.append(StepRecord(t, release, entry))
    return out


def test_the_config_binding_shows_the_samplers_parameters_only_when_set() -> None:
    """A snapshot is bound to ``repr(config)``: the seven mechanisms' binding is what it was
    before the samplers' parameters existed, and a changed C or Q is a changed binding."""
    base = LdpIdsConfig(epsilon=1.0, window=10, population=100)
    assert repr(base) == (
        "LdpIdsConfig(epsilon=1.0, window=10, population=100, task=FrequencyTask(d=2, "
        "oracle='ada', kind='frequency'), beta=0.5, u_min=1, include_sampling_variance=False, "
        "absorption_init='literal', force_first_publish=False)"
    )
    assert "publications=3" in repr(
        LdpIdsConfig(epsilon=1.0, window=10, population=100, publications=3)
    )
    assert "process_variance=0.01" in repr(
        LdpIdsConfig(epsilon=1.0, window=10, population=100, process_variance=0.01)
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"publications": 11}, "publications"),
        ({"threshold_scale": -1.0}, "threshold_scale"),
        ({"interval_rule": "sometimes"}, "interval_rule"),
        ({"max_share": 1.5}, "max_share"),
        ({"pid_gains": (1.0, -0.1, 0.0)}, "pid_gains"),
        ({"process_variance": float("nan")}, "process_variance"),
    ],
)
def test_bad_sampler_parameters_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LdpIdsConfig(epsilon=1.0, window=10, population=100, **changes)


def test_lp_dsat_refuses_a_population_too_small_for_its_groups() -> None:
    with pytest.raises(ValueError, match="g1"):
        build("LP-DSAT", LdpIdsConfig(epsilon=1.0, window=30, population=40, task=TASK))


def test_lp_dsat_publishes_at_most_c_times_when_its_groups_round_down() -> None:
    """Found by the property test: n = 50, β = 0.7 gives n2 = 15 and, at C = 4, g2 = ⌊15/4⌋ = 3,
    so the spec's user rule n_rm ≥ g2 alone let five publications into a window of 5."""
    cfg = LdpIdsConfig(epsilon=1.0, window=5, population=50, task=TASK, beta=0.7, publications=4)
    mech = scripted("LP-DSAT", cfg, [True] * 40)
    records = drive(mech, 40, all_present(cfg.population))
    check_division(records, cfg, "population")
    assert publications_per_window(records, cfg.window) == 4
