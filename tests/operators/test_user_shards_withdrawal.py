"""A withdrawal on user shards (issue 26 with issue 18 §4): a closed LDP population, and a
central-DP stream, resumed from their recovery stores with a registration table that no
longer lists one user.

Each shard withdraws its own users at the resume (``Population.withdraw`` over its part of
the new table), so the victim's later rows become ``withdrawn_user`` dead letters and the
releases after the resume are the one-key stream's, byte for byte, whatever the victim sends.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import numpy as np
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.connectors.jsonl import to_json
from privstream.families.registry import LDP_IDS, PERSONALIZED
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.schema.events import WITHDRAWN, EventBatch

from .test_user_shards import CLOCK, KEY, PARTITIONS, D, _marker, keyed

USERS = [f"u{i}" for i in range(60)]
VICTIM, SLOTS = "u7", 10
Run = tuple[list[str], list[str]]


def _items(victim: float, abort: Any) -> list[Any]:
    """Every user reports at every slot over three partitions; from the resume on the victim
    reports ``victim``; the first run stops half way (``abort``, fired once)."""
    rng = np.random.default_rng(5)
    out: list[Any] = []
    for t in range(1, SLOTS + 1):
        values = rng.integers(0, D, len(USERS)).astype(float)
        if t > SLOTS // 2:
            values[USERS.index(VICTIM)] = victim
        for p in range(PARTITIONS):
            mine = [i for i in range(len(USERS)) if i % PARTITIONS == p]
            users = np.array([USERS[i] for i in mine], dtype=object)
            out.append(EventBatch("s", np.full(len(mine), t), users, values[mine], partition=p))
        out += [_marker(t, p) for p in range(PARTITIONS)]
        if t == SLOTS // 2:
            out.append(abort)
    return out


def _run(store: Path, items: list[Any], users: list[str], family: str, shards: int | None) -> Run:
    if family == "ldp-ids":
        entry, names = LDP_IDS, ["LBU"]
        config: Any = LdpIdsConfig(population=70, epsilon=1.0, window=4, task=FrequencyTask(D))
    else:
        entry, names = PERSONALIZED, ["PBD"]
        config = PersonalizedConfig(population=70, epsilon=2.0, window=4, task=FrequencyTask(D))
    flow = Dataflow("withdraw")
    out = family_mechanisms(
        "w", keyed(op.input("in", flow, TestingSource(items)), shards), family=entry, mechanism=names, config=config, secret=KEY, slotting=CLOCK,
        registration=Preferences(by_user={u: (2.0, 4) for u in users}), shards=shards,
        split=BudgetSplit.parse("equal", 1),
    )  # fmt: skip
    releases: list[str] = []
    letters: list[Any] = []
    op.output("r", op.map("rj", out.releases, to_json), TestingSink(releases))
    op.output("d", out.dead_letters, TestingSink(letters))
    run_main(flow, epoch_interval=timedelta(0), recovery_config=RecoveryConfig(str(store)))
    return sorted(releases), sorted(d.reason for d in letters)


def _resume(tmp: Path, family: str, shards: int | None, victim: float) -> Run:
    """A first run into a fresh store with every user, then a resume without the victim."""
    store = tmp / f"{family}-{shards}-{victim}"
    store.mkdir()
    init_db_dir(store, 1)
    abort = TestingSource.ABORT()
    first, _ = _run(store, _items(victim, abort), USERS, family, shards)
    assert len(first) == SLOTS // 2
    without = [u for u in USERS if u != VICTIM]
    return _run(store, _items(victim, abort), without, family, shards)


@pytest.mark.parametrize("family", ["ldp-ids", "personalized"])
def test_a_withdrawn_user_on_shards_stops_counting_as_on_one_key(
    tmp_path: Path, family: str
) -> None:
    one = _resume(tmp_path, family, None, 0.0)
    assert len(one[0]) == SLOTS - SLOTS // 2
    assert one[1] == [WITHDRAWN] * (SLOTS - SLOTS // 2)
    assert _resume(tmp_path, family, 4, 0.0) == one
    assert _resume(tmp_path, family, 4, 3.0) == one  # whatever the victim sends
