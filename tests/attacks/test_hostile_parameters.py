"""The audit's smaller findings: parameters that crashed a worker (and again on every replay),
configurations that silently never publish, and a mislabelled strategy.

* A step that raises anything halts that mechanism on that stream, with its reason in the log
  and the ``halted`` metric; its neighbours and the process go on.
* Requirements outside the limits (w up to 2^62, ε = 1e−310) are refused at start.
* LPD/LPA with a dissimilarity group ⌊βn/w⌋ = 0 would never publish: refused.
* Sample's slots between publications are approximations (spec §3.2), not nullified.
* A publication budget that has shrunk below the sampler's range skips instead of crashing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.ldp_ids import LBU, LdpIdsConfig
from privstream.mechanisms.personalized import MIN_SLOT_EPSILON, PersonalizedConfig
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.operators.slotting import slotted_mechanism
from privstream.schema.events import EventBatch
from tests.attacks.helpers import run_operator

N, T, W = 400, 10, 4


def batches(streams: tuple[str, ...] = ("a", "b")) -> list[EventBatch]:
    rng = np.random.default_rng(3)
    return [
        EventBatch(s, np.full(N, t), np.arange(N), (rng.random(N) < 0.5).astype(float), None, t)
        for t in range(1, T + 1)
        for s in streams
    ]


class _Crashes(LBU):
    """An LBU whose step raises an unexpected error at slot 4 of stream "a" (a bug, a
    MemoryError, a numeric error: anything but a ledger refusal)."""

    name = "LBU_crash"

    def decide(self, state: Any, slot: Any) -> Any:
        if slot.stream == "a" and slot.index == 4:
            raise ArithmeticError("scale overflow in a hostile configuration")
        return super().decide(state, slot)


def test_an_unexpected_error_halts_one_mechanism_on_one_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = LdpIdsConfig(epsilon=1.0, window=W, population=N)
    half = LdpIdsConfig(epsilon=0.5, window=W, population=N)
    mechanisms = [_Crashes(half), LDP_IDS.build("LPA", half)]
    with caplog.at_level(logging.ERROR):
        out = run_operator(
            batches(),
            lambda keyed: slotted_mechanism(
                "m", keyed, mechanisms=mechanisms, task=config.task, population=N, secret=2,
                split=BudgetSplit.parse("equal", 2), epsilon=1.0,
            ),
        )  # fmt: skip
    got = {(r["stream"], r["mechanism"]) for r in out["releases"]}
    counts = {k: sum(1 for r in out["releases"] if (r["stream"], r["mechanism"]) == k) for k in got}
    assert counts == {
        ("a", "LBU_crash"): 3,
        ("a", "LPA"): T,
        ("b", "LBU_crash"): T,
        ("b", "LPA"): T,
    }
    # the error's type and place, never its message (a message may quote the data)
    assert "ArithmeticError at test_hostile_parameters.py" in caplog.text
    assert "scale overflow" not in caplog.text and "halted" in caplog.text
    labels = {"stream": "a", "mechanism": "LBU_crash"}
    assert REGISTRY.get_sample_value("privstream_halted", labels) == 1.0
    assert REGISTRY.get_sample_value("privstream_privacy_violations_total", labels) == 0.0


@pytest.mark.parametrize(
    ("epsilon", "window", "match"),
    [(1e-310, 10, "epsilon must lie"), (0.6, 2**62, "window must be"), (1e7, 5, "epsilon")],
)
def test_hostile_requirements_are_refused_at_start(epsilon: float, window: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PersonalizedConfig(population=10, epsilon=epsilon, window=window)
    with pytest.raises(ValueError, match=match):
        Preferences(epsilons=np.array([epsilon]), windows=np.array([window]))
    with pytest.raises(ValueError, match=match):
        Preferences(by_user={"u": (epsilon, window)})


@pytest.mark.parametrize("name", ["LPD", "LPA"])
def test_population_division_that_could_never_publish_is_refused(name: str) -> None:
    """⌊βn/w⌋ = 0: M1 asks nobody, the dissimilarity is never measured."""
    with pytest.raises(ValueError, match=r"⌊βn/w⌋ >= 1 user.*never publish"):
        LDP_IDS.build(name, LdpIdsConfig(epsilon=1.0, window=40, population=50, beta=0.5))
    LDP_IDS.build(name, LdpIdsConfig(epsilon=1.0, window=25, population=50, beta=0.5))  # ⌊1⌋ = 1


def test_sample_approximates_between_publications() -> None:
    config = PersonalizedConfig(population=N, epsilon=1.0, window=W)
    out = run_operator(
        batches(("a",)),
        lambda keyed: family_mechanisms(
            "p",
            keyed,
            family=PERSONALIZED,
            mechanism="Sample",
            config=config,
            secret=1,
            registration=Preferences(),
        ),
    )
    strategies = [r["strategy"] for r in sorted(out["releases"], key=lambda r: r["slot"])]
    assert strategies == ["publish" if (t - 1) % W == 0 else "approximate" for t in range(1, T + 1)]
    labels = {"stream": "a", "mechanism": "Sample"}
    assert REGISTRY.get_sample_value("privstream_approximations_total", labels) == T - 3
    assert REGISTRY.get_sample_value("privstream_nullified_total", labels) == 0.0


def test_a_vanishing_publication_budget_skips_instead_of_crashing() -> None:
    """BD halves what is left of ε/2 at each publication; forced to publish every slot, the
    remainder underflows the sampler's range after ~40 slots and must then be skipped."""
    mech = PERSONALIZED.build("BD", PersonalizedConfig(population=N, epsilon=1.0, window=200))
    mech.wants_publication = lambda t, dis, threshold: True  # type: ignore[method-assign]
    out = run_operator(
        batches(("a",)),
        lambda keyed: slotted_mechanism(
            "m", keyed, mechanisms=[mech], task=mech.config.task, population=N, secret=1,
            registration=Preferences(),
        ),
    )  # fmt: skip
    assert len(out["releases"]) == T and all(r["strategy"] == "publish" for r in out["releases"])
    # Not enough slots here to underflow; drive the mechanism directly for the rest.
    from privstream.mechanisms.client import Requirements, SimulatedCurator
    from privstream.mechanisms.contract import Slot
    from privstream.mechanisms.seeding import SlotRandomness

    state = mech.initial_state()
    values = np.zeros(N)
    for t in range(1, 80):
        port = SimulatedCurator(values, mech.config.task, Requirements(population=N))
        state, events = mech.step(state, Slot("a", t, port, SlotRandomness(1, "a", t)))
        release = events[0]
        assert release.strategy == "publish" or release.details.theta_pub == 0.0
    assert release.strategy == "approximate" and MIN_SLOT_EPSILON > 0


def test_a_failure_in_the_slotting_halts_only_that_stream(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Anything that breaks while a batch is taken (here: the ingest of stream "a" at slot 5)
    halts that stream with its reason; its later events are ``stream_halted`` dead letters and
    stream "b" goes on."""
    from privstream.operators.ingest import Windower

    original = Windower.ingest

    def breaking(self: Any, state: Any, batch: EventBatch, notes: Any) -> Any:
        if batch.stream == "a" and int(batch.slots[0]) == 5:
            raise MemoryError("ring of 2^62 slots")
        return original(self, state, batch, notes)

    monkeypatch.setattr(Windower, "ingest", breaking)
    config = LdpIdsConfig(epsilon=1.0, window=W, population=N)
    with caplog.at_level(logging.ERROR):
        out = run_operator(
            batches(), lambda keyed: slotted_mechanism(
                "m", keyed, mechanisms=[LDP_IDS.build("LBU", config)], task=config.task, population=N,
                secret=2,
            ),
        )  # fmt: skip
    slots = {s: sorted(r["slot"] for r in out["releases"] if r["stream"] == s) for s in "ab"}
    assert slots == {"a": [1, 2, 3, 4], "b": list(range(1, T + 1))}
    assert {d.reason for d in out["dead_letters"]} == {"stream_halted"}
    assert len(out["dead_letters"]) == (T - 4) * N
    assert "MemoryError at test_hostile_parameters.py" in caplog.text
    assert "ring of 2^62" not in caplog.text
