"""``privstream.republish``: a new incarnation never computes a published release id again
(the Kafka side is tests/integration/test_kafka_flow.py::test_a_new_store_starts_after_the_release_topic)."""

from __future__ import annotations

import numpy as np

from privstream.events import ALREADY_PUBLISHED, DeadLetter, EventBatch
from privstream.republish import _note, _split


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
