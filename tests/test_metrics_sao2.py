"""SaO2's public metrics (spec §10.7, ``privstream.families.sao2.METRICS``): every declared gauge
is public and allow-listed; the per-level ones carry a ``level`` label (and ``method`` for the
central ε), read from the last ledger entry of a real engine-free run; another family's stream
gets no SaO2 sample; nothing in them depends on a user's value (two populations of different
data give the same samples)."""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from privstream.families.registry import family
from privstream.families.sao2 import METRICS
from privstream.mechanisms.client import SimulatedClientPort
from privstream.mechanisms.contract import LedgerEntry, Slot
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.mechanisms.seeding import SlotRandomness
from privstream.operators import metrics
from privstream.operators.metrics import LedgerBoard
from privstream.operators.stream_state import Tally
from tests.metric_names import exposed_name

SAO2_METRICS = {"privstream_" + spec.name for spec in METRICS}
N, D, T = 900, 5, 4


def last_entry(data_seed: int) -> LedgerEntry:
    """The ledger entry after slot 3 of a run on random cells drawn from ``data_seed``."""
    fam = family("sao2")
    config = fam.make_config(epsilon=2.0, window=T, population=N, task=BinaryTask(D),
                             horizons=2, s=3)  # fmt: skip
    mech = fam.build("SaO2", config)
    state, clients, entry = mech.initial_state(), mech.client_state(), None
    values = np.random.default_rng(data_seed).integers(0, D, (3, N)).astype(np.float64)
    for t in (1, 2, 3):
        randomness = SlotRandomness(7, "s", t, mech.name)
        port = SimulatedClientPort(values[t - 1], config.task, randomness, client_state=clients)
        state, events = mech.step(state, Slot("s", t, port, randomness))
        clients = port.client_state_after or clients
        entry = next(e for e in events if isinstance(e, LedgerEntry))
    assert entry is not None
    return entry


def scrape(entry: LedgerEntry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    board = LedgerBoard()
    board.update("cells", "SaO2", entry.guarantee, N, Tally(last_slot=3, last_ledger=entry), False)
    registry = CollectorRegistry()
    registry.register(board)
    text = generate_latest(registry).decode()
    return {
        exposed_name(f): {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
        if exposed_name(f) in SAO2_METRICS
    }


def test_every_declared_sao2_metric_is_public_and_allow_listed() -> None:
    assert all(spec.public for spec in METRICS)
    assert metrics.public_metrics() >= SAO2_METRICS


def test_the_gauges_read_the_last_entry_per_level() -> None:
    entry = last_entry(1)
    details: Any = entry.details
    got = scrape(entry)
    assert set(got) == SAO2_METRICS
    base = (("mechanism", "SaO2"), ("stream", "cells"))
    levels = len(details.n_h)
    assert levels == 3 and sum(details.n_h) == N
    assert got["privstream_sao2_users_enrolled"] == {
        (("level", str(h)), *base): float(n) for h, n in enumerate(details.n_h)
    }
    assert got["privstream_sao2_epsilon_central"] == {
        (("level", str(h)), *base[:1], ("method", "classical-7.1"), base[1]): e
        for h, e in enumerate(details.epsilon_central)
    }
    assert got["privstream_sao2_epsilon_local"] == {base: 1.0}  # ε/horizons
    assert got["privstream_sao2_delta"] == {base: 1e-5}
    assert got["privstream_sao2_estimate_stderr"] == {base: details.stderr}
    assert got["privstream_sao2_budget_refusals"] == {base: 0.0}
    assert got["privstream_sao2_horizon"] == {base: 0.0}


def test_the_samples_do_not_depend_on_the_data() -> None:
    assert scrape(last_entry(1)) == scrape(last_entry(2))
