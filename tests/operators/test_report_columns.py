"""``operators.report_columns.DeviceSeen``: the rate limit counted in arrays, for a whole run at
once, admits exactly the attempts ``schema.protocol.SeenReports.admit`` admits one by one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from privstream.operators.report_columns import DeviceSeen
from privstream.schema.protocol import SeenReports

STREAM = "s"


@pytest.mark.parametrize("seed", range(5))
def test_runs_admit_what_one_by_one_admits(seed: int) -> None:
    """Random runs (devices repeated within a run, slots behind, in and ahead of the window,
    a stream clock that stalls and jumps) against the dictionary version, attempt by attempt;
    the per-report ``admit`` of ``DeviceSeen`` is checked on every third run."""
    rng = random.Random(seed)
    window, per_window = rng.choice([(1, 1), (3, 4), (5, 2), (20, 6)])
    ref, arrays = SeenReports(window, per_window), DeviceSeen(window, per_window, stream=STREAM)
    now, admitted, attempts = 0, 0, 0
    for run in range(60):
        now += rng.choice([0, 0, 1, 1, 2, window + 3])
        devices = [f"d{rng.randrange(12)}" for _ in range(rng.randrange(1, 30))]
        slots = [max(0, now + rng.randrange(-window - 2, 3)) for _ in devices]
        expected = [ref.admit(d, STREAM, s, now) for d, s in zip(devices, slots, strict=True)]
        if run % 3 == 0:
            got = [arrays.admit(d, STREAM, s, now) for d, s in zip(devices, slots, strict=True)]
        else:
            rows = arrays.rows(devices)
            got = arrays.admit_rows(rows, np.asarray(slots, np.int64), now).tolist()
        assert got == expected, (run, now)
        admitted, attempts = admitted + sum(expected), attempts + len(expected)
    assert 0 < admitted < attempts  # some admitted, some over the limit


def test_accepted_pairs_and_other_streams() -> None:
    """Accepted pairs per request (forgotten when its round closes is ``close``'s job: here the
    bits); a stream other than its own keeps the dictionary of ``SeenReports``."""
    seen = DeviceSeen(3, 2, stream=STREAM)
    assert not seen.has("r", "a")
    seen.add("r", "a")
    seen.rows([f"new{i}" for i in range(200)])  # the directory grows past the bits
    assert seen.has("r", "a") and not seen.has("r", "new150") and not seen.has("q", "a")
    assert seen.accepted_rows("r", seen.rows(["a", "new150"])).tolist() == [True, False]
    assert [seen.admit("a", "?", 0, 0) for _ in range(3)] == [True, True, False]
    assert seen.attempts == {("a", "?"): {0: 2}}
