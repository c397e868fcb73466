"""``privstream.runtime.republish``: a new incarnation never computes a published release id again
(the Kafka side is tests/integration/test_kafka_flow.py::test_a_new_store_starts_after_the_release_topic)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privstream.mechanisms.contract import Gap
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.guarantees import (
    ClassScope,
    Guarantee,
    LifetimeScope,
    PeriodScope,
    PureDP,
    StreamScope,
    WindowScope,
)
from privstream.runtime.republish import (
    StreamPlan,
    _note,
    _split,
    cooldown_ends,
    plan_gaps,
    resume_slot,
)
from privstream.schema.events import ALREADY_PUBLISHED, INCARNATION_COOLDOWN, DeadLetter, EventBatch


def test_last_published_reads_release_ids() -> None:
    last: dict[str, int] = {}
    for key in [b"s/LPA/3", b"s/LPD/41", b"s/LPA/40", b"t/x/2", b"bad", None, b"a/b/c/x"]:
        _note(last, key)
    assert last == {"s": 41, "t": 2}


def test_events_of_published_slots_become_dead_letters() -> None:
    batch = EventBatch("s", np.array([40, 41, 39, 42]), np.array([0, 1, 2, 3]),
                       np.array([1.0, 0.0, 1.0, 0.0]), None, 41)  # fmt: skip
    out = _split(batch, {"s": 40})
    letters = [x for x in out if isinstance(x, DeadLetter)]
    kept = [x for x in out if isinstance(x, EventBatch)]
    assert [d.reason for d in letters] == [ALREADY_PUBLISHED] * 2
    assert len(kept) == 1 and kept[0].slots.tolist() == [41, 42]
    assert kept[0].complete_through == 41
    assert _split(batch, {"other": 100}) == [batch]
    only_old = EventBatch("s", np.array([3]), np.array([0]), np.array([1.0]), None, 3)
    assert all(isinstance(x, DeadLetter) for x in _split(only_old, {"s": 40}))


def test_events_of_the_cooldown_become_their_own_dead_letters() -> None:
    """Issue 18 §2: after the floor 40 and a cooldown to 44, slots 41..44 are skipped too; a
    marker inside the cooldown does not pass (the stream starts at 45)."""
    batch = EventBatch("s", np.array([40, 41, 44, 45]), np.array([0, 1, 2, 3]),
                       np.array([1.0, 0.0, 1.0, 0.0]), None, 44)  # fmt: skip
    out = _split(batch, {"s": 40}, {"s": 44})
    letters = [x for x in out if isinstance(x, DeadLetter)]
    kept = [x for x in out if isinstance(x, EventBatch)]
    assert [d.reason for d in letters] == [ALREADY_PUBLISHED] + [INCARNATION_COOLDOWN] * 2
    assert len(kept) == 1 and kept[0].slots.tolist() == [45]
    assert kept[0].complete_through is None
    marker_only = EventBatch("s", np.array([], dtype=np.int64), np.array([], dtype=np.int64),
                             np.array([]), None, 43)  # fmt: skip
    assert _split(marker_only, {"s": 40}, {"s": 44}) == []


def _guarantee(scope: Any) -> Guarantee:
    return Guarantee(PureDP(1.0), scope, "ldp")


def test_the_cooldown_covers_the_largest_window_and_waits_for_a_new_period() -> None:
    assert resume_slot(20, _guarantee(WindowScope(5))) == 25
    assert resume_slot(20, _guarantee(ClassScope(5)), [3, 12]) == 32
    assert resume_slot(20, _guarantee(PeriodScope(1))) == 21  # per timestamp: no gap
    assert resume_slot(20, _guarantee(PeriodScope(8))) == 24
    assert resume_slot(20, _guarantee(StreamScope())) is None
    plans = {
        "s": StreamPlan(("A", "B"), (_guarantee(WindowScope(5)), _guarantee(WindowScope(9)))),
        "t": StreamPlan(("C",), (_guarantee(WindowScope(5)),)),
    }
    gaps = plan_gaps({"s": 20}, plans)
    assert gaps == (
        Gap("s", "A", 21, 28, INCARNATION_COOLDOWN),
        Gap("s", "B", 21, 28, INCARNATION_COOLDOWN),
    )
    assert cooldown_ends(gaps) == {"s": 28}
    assert plan_gaps({"s": 20}, {"s": StreamPlan(("A",), (_guarantee(WindowScope(1)),))}) == ()


def test_a_dpi_lifetime_guarantee_is_never_restarted_over_its_population() -> None:
    """DPI (issue 22): a new store would start the series ledger again, a second ε for the
    same users' lifetime; refused once anything was published, unless a new population."""
    from privstream.families.registry import family
    from privstream.mechanisms.dpi import DpiConfig

    guarantee = family("dpi").build("DPI", DpiConfig(2.0, 1, 100)).privacy_cost
    assert isinstance(guarantee.scope, LifetimeScope)
    plans = {"s": StreamPlan(("DPI",), (guarantee,))}
    with pytest.raises(IncompatibleState, match=r"stream 's'.*--new-population"):
        plan_gaps({"s": 20}, plans)
    assert plan_gaps({}, plans) == ()
    assert plan_gaps({"s": 20}, plans, new_population=True) == ()


def test_a_whole_stream_guarantee_is_never_restarted_over_its_population() -> None:
    """CGM budget_scope 'stream': a new incarnation would spend the lifetime budget again."""
    plans = {"s": StreamPlan(("CGM",), (_guarantee(StreamScope()),))}
    with pytest.raises(IncompatibleState, match=r"stream 's'.*--new-population") as err:
        plan_gaps({"s": 20}, plans)
    assert "Resume the stream's recovery store" in str(err.value)
    assert plan_gaps({}, plans) == ()  # nothing published yet: a first incarnation
    assert plan_gaps({"s": 20}, plans, new_population=True) == ()
