"""Finding 5 of the privacy audit: replay was only safe if it replayed the same thing.

Reproduced (as it was): a resume with another secret re-released the replayed slots with fresh
noise (two answers for one release id), and a restart with ``--window 20`` over a ``w = 5``
store let users report again 10 slots later. Fixed: a snapshot is bound to the noise key's
fingerprint and every privacy parameter; a resume that differs fails at start and names what
differs. (Slot contents independent of partition interleaving: tests/flows/
test_partitioned_flow.py and tests/integration/test_kafka_partitions.py.)
"""

from __future__ import annotations

import secrets
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
from privstream.families.registry import LDP_IDS
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.mechanisms.seeding import NoiseKey
from privstream.operators.family import family_mechanisms
from privstream.schema.events import EventBatch

N, T = 500, 20
KEY = NoiseKey.from_text(secrets.token_hex(32))


def items() -> list[Any]:
    rng = np.random.default_rng(8)
    out: list[Any] = [
        EventBatch("s", np.full(N, t), np.arange(N), (rng.random(N) < 0.4).astype(float), None, t)
        for t in range(1, T + 1)
    ]
    out.insert(T // 2, TestingSource.ABORT())  # the first run stops half way
    return out


def run(key: NoiseKey, window: int, recovery: RecoveryConfig, source: list[Any]) -> list[str]:
    """One run over ``source`` (the same list each time: an ABORT fires only once)."""
    flow = Dataflow("replay")
    keyed = op.key_on("k", op.input("in", flow, TestingSource(source)), lambda b: b.stream)
    config = LdpIdsConfig(epsilon=1.0, window=window, population=N)
    out = family_mechanisms(
        "mech", keyed, family=LDP_IDS, mechanism="LPD", config=config, secret=key
    )
    releases: list[str] = []
    op.output("out", op.map("json", out.releases, to_json), TestingSink(releases))
    run_main(flow, epoch_interval=timedelta(0), recovery_config=recovery)
    return releases


Store = tuple[RecoveryConfig, list[Any]]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    init_db_dir(tmp_path, 1)
    recovery, source = RecoveryConfig(str(tmp_path)), items()
    first = run(KEY, 5, recovery, source)
    assert len(first) == T // 2
    return recovery, source


def test_a_resume_with_the_same_secret_and_parameters_goes_on(store: Store) -> None:
    assert len(run(KEY, 5, *store)) == T - T // 2


def test_a_resume_with_another_secret_fails_at_start(store: Store) -> None:
    other = NoiseKey.from_text(secrets.token_hex(32))
    with pytest.raises(Exception, match="another secret") as err:
        run(other, 5, *store)
    assert KEY.material.decode() not in str(err.value)
    assert other.material.decode() not in str(err.value)


def test_a_resume_with_another_window_fails_at_start_naming_it(store: Store) -> None:
    with pytest.raises(Exception, match=r"mechanism LPD: stored .*window=5.*now .*window=20"):
        run(KEY, 20, *store)


def test_a_resume_with_an_insecure_seed_instead_of_the_secret_fails(store: Store) -> None:
    with pytest.raises(Exception, match="another secret"):
        run(NoiseKey.insecure_seed(1), 5, *store)
