"""Issue 18 §1: whoever wrote to the input topic drove the slot clock.

Reproduced (as it was, still the ``data`` clock with an unbounded carry): 99 sybils and a victim
who sent one event; one unauthenticated end-of-slot marker forced 2,000 slots, the victim's
carried-forward value fed every one of them, and the mean of the public releases shows it at
~30 σ while every window stayed within ε. Fixed: Kafka runs close slots only on markers tagged
with the clock key (a forged marker is an ``unauthenticated_marker`` dead letter, a jump beyond
``max_clock_jump`` a ``far_future_slot`` one, events never move the clock), and a value is
carried at most ``w − 1`` slots after its report, so one event feeds at most one window.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest

from privstream.families.registry import PERSONALIZED
from privstream.flows.config import check_input_clock
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.metrics import BOARD
from privstream.operators.slotting import SlottingConfig
from privstream.schema.events import (
    FAR_FUTURE,
    UNAUTHENTICATED_MARKER,
    EventBatch,
    marker_authentic,
    marker_tag,
)

from .helpers import Outputs, run_operator

N, EPSILON, W = 100, 4.0, 4  # Uniform spends ε/w = 1 per slot: Laplace(1) noise per count
FORCED = 2_000
SIGMA_MEAN = np.sqrt(2.0 / FORCED)  # Var Laplace(b = 1) = 2; the mean of FORCED releases
KEY = NoiseKey.from_text(secrets.token_hex(32))


def run(items: list[EventBatch], slotting: SlottingConfig) -> Outputs:
    config = PersonalizedConfig(population=N, epsilon=EPSILON, window=W, task=FrequencyTask(2))

    def operator(keyed: Any) -> Any:
        return family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism="Uniform", config=config, secret=KEY,
            slotting=slotting,
        )  # fmt: skip

    return run_operator(items, operator)


def victim_and_sybils() -> EventBatch:
    """Slot 1: the victim (user 0) reports 1, the 99 sybils 0; nobody reports again."""
    values = np.zeros(N)
    values[0] = 1.0
    return EventBatch("s", np.ones(N, dtype=np.int64), np.arange(N), values)


def marker(t: int, tag: str | None = None) -> EventBatch:
    empty = np.zeros(0, dtype=np.int64)
    return EventBatch("s", empty, empty, np.zeros(0), None, t, marker_tag=tag)


def signed(t: int) -> EventBatch:
    return marker(t, marker_tag(KEY.clock_key(), "s", t))


def victim_mean(out: Outputs) -> float:
    return float(np.mean([r["estimate"][1] for r in out["releases"]]))


def reasons(out: Outputs) -> list[str]:
    return [d.reason for d in out["dead_letters"]]


def test_before_a_forged_marker_and_an_unbounded_carry_reveal_the_victim() -> None:
    """The attack as it was: 2,000 slots from one unauthenticated marker, the victim's one
    event in every one of them; the releases' mean is the victim's value (1), ~30 σ from 0."""
    out = run([victim_and_sybils(), marker(FORCED)], SlottingConfig(carry_slots=10**9))
    assert len(out["releases"]) == FORCED and not out["dead_letters"]
    mean = victim_mean(out)
    assert abs(mean - 1.0) < 4 * SIGMA_MEAN and mean > 10 * SIGMA_MEAN
    spent = max(e["population_spent"] for e in out["ledger"])
    assert spent <= EPSILON * (1 + 1e-9)  # every window "within ε"


def test_a_forged_marker_closes_nothing_on_the_markers_clock() -> None:
    items = [victim_and_sybils(), signed(1), marker(FORCED), marker(2, "00" * 16)]
    out = run(items, SlottingConfig(clock="markers"))
    assert [r["slot"] for r in out["releases"]] == [1]
    assert reasons(out) == [UNAUTHENTICATED_MARKER, UNAUTHENTICATED_MARKER]
    assert '"end_of_slot":2000' in out["dead_letters"][0].payload


def test_an_authentic_marker_may_not_jump_and_events_never_move_the_clock() -> None:
    """A replayed or jumping signed marker closes nothing; events of a far slot neither close
    slots nor get buffered beyond the ahead window."""
    far = EventBatch("s", np.full(3, 500, dtype=np.int64), np.arange(3), np.ones(3))
    items = [victim_and_sybils(), signed(1), far, signed(FORCED), signed(2), signed(2), signed(3)]
    BOARD.clear()
    out = run(items, SlottingConfig(clock="markers"))
    assert [r["slot"] for r in out["releases"]] == [1, 2, 3]
    assert reasons(out) == [FAR_FUTURE] * 3 + [FAR_FUTURE]  # the events, then the jump
    assert "max_clock_jump=1" in out["dead_letters"][-1].detail
    # the clock gauges: last closed slot 3, never more than 1 slot at once
    clock = {m.name: m.samples[0].value for m in BOARD.collect() if "slot_clock" in m.name}
    assert clock == {"privstream_slot_clock": 3.0, "privstream_slot_clock_jump_slots": 1.0}


def test_the_first_marker_cannot_be_stretched_by_old_events() -> None:
    """Events of slot 1 buffered before the clock's first marker at slot 50 do not make the
    first advance close 50 slots: it closes ``max_clock_jump`` (1)."""
    out = run([victim_and_sybils(), signed(50), signed(51)], SlottingConfig(clock="markers"))
    assert [r["slot"] for r in out["releases"]] == [50, 51]


def test_a_value_is_carried_at_most_w_minus_1_slots() -> None:
    """Even with a trusted data clock forcing 2,000 slots, the victim's one report feeds w = 4
    slots (one window: at most ε for the event): the releases' mean shows nothing."""
    out = run([victim_and_sybils(), marker(FORCED)], SlottingConfig())
    assert len(out["releases"]) == FORCED
    assert abs(victim_mean(out) - W / FORCED) < 4 * SIGMA_MEAN


def test_carry_slots_zero_and_the_binding() -> None:
    config: dict[str, Any] = {"clock": "markers", "max_clock_jump": 2, "carry_slots": 0}
    slotting = SlottingConfig(**config)
    assert slotting.max_slot_gap == 64 and SlottingConfig().max_slot_gap == 10_000
    with pytest.raises(ValueError, match="max_clock_jump"):
        SlottingConfig(clock="markers", max_clock_jump=0)
    with pytest.raises(ValueError, match="clock must be"):
        SlottingConfig(clock="wall")  # type: ignore[arg-type]


def test_the_clock_key_authenticates_and_reveals_nothing_of_the_secret() -> None:
    clock = KEY.clock_key()
    assert len(clock) == 32 and clock != KEY.material and clock != KEY.prf_key
    assert clock.hex() not in KEY.fingerprint()
    tag = marker_tag(clock, "s", 7)
    assert marker_authentic(clock, "s", 7, tag)
    assert not marker_authentic(clock, "s", 8, tag) and not marker_authentic(clock, "t", 7, tag)
    other = NoiseKey.from_text(secrets.token_hex(32)).clock_key()
    assert not marker_authentic(other, "s", 7, tag) and not marker_authentic(clock, "s", 7, None)


def test_kafka_refuses_the_data_clock_unless_every_writer_is_trusted() -> None:
    with pytest.raises(ValueError, match="--trust-input-clock"):
        check_input_clock("data", False)
    check_input_clock("data", True)
    check_input_clock("markers", False)
