"""SaO2's server stage behind a shuffler (``operators.sao2_shuffled``), engine-free: fed the
shuffler's batches of devices that follow the task's public level rule, it releases unbiased
means whose errors match the standard error it states; it reads one record per batch key
(a re-forwarded copy changes nothing, a conflicting one is refused), in any arrival order; a
dropped block makes the slots that need it repeat the last release; and its lifetime ledger
passes the family's audit.

Statistics: as ``tests/mechanisms/test_sao2_mechanism.py`` — over ``RUNS`` runs the mean error
of each coordinate has sd ≤ SE_t/√RUNS (SE_t the stated bound), so |z| < 4 over the 24 cells
fails with probability < 0.2 % for an unbiased estimator; a bias of 0.1 shows as |z| ≈ 3–5.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

import privstream.families.sao2  # noqa: F401  (registers the sao2-lifetime division)
from privstream.families.registry import family
from privstream.families.sao2_audit import verify
from privstream.mechanisms.contract import LedgerEntry, Release
from privstream.mechanisms.sao2 import Sao2Mechanism, Sao2Release
from privstream.mechanisms.sao2_client import Sao2Protocol
from privstream.mechanisms.sao2_task import BinaryTask
from privstream.operators.sao2_shuffled import ShuffledAggregator, tasks_for
from privstream.schema.shuffle import Batch, Sao2Task

N, D, T, RUNS = 6000, 3, 8, 24


def mechanism() -> Sao2Mechanism:
    fam = family("sao2")
    config = fam.make_config(epsilon=2.0, window=T, population=N, task=BinaryTask(D),
                             horizons=2, s=3)  # fmt: skip
    mech = fam.build("SaO2", config)
    assert isinstance(mech, Sao2Mechanism)
    return mech


@cache
def population() -> np.ndarray:
    """``(2T, N)`` cells: a start cell (0.5/0.3/0.2), one move for half the users."""
    rng = np.random.default_rng(5)
    first = rng.choice(D, N, p=[0.5, 0.3, 0.2])
    move = np.where(rng.random(N) < 0.5, rng.integers(2, 2 * T + 1, N), 2 * T + 1)
    second = (first + 1) % D
    return np.stack([np.where(t >= move, second, first) for t in range(1, 2 * T + 1)])


def device_batches(task: Sao2Task, values: np.ndarray, seed: int) -> list[Batch]:
    """What a shuffler forwards for devices that follow the task's level rule (the simulated
    devices of ``mechanisms.sao2_client``, the law the device library equals)."""
    levels = np.array([task.level_of(f"u{i}") for i in range(N)], dtype=np.int64)
    rng, state, out = np.random.default_rng(seed), None, []
    for tau in range(1, task.T + 1):
        proto = Sao2Protocol(tau, task.T, task.r, task.s, task.epsilon, BinaryTask(task.d),
                             task.m, levels if tau == 1 else None)  # fmt: skip
        state, emitted = proto.emit(values[tau - 1], np.ones(N, dtype=bool), state, rng)
        for e in emitted:
            plus = np.bincount(e.coord[e.sign > 0], minlength=task.d)
            minus = np.bincount(e.coord[e.sign < 0], minlength=task.d)
            out.append(Batch(task.id, task.stream, task.horizon, e.level, e.block,
                             task.block_end(e.level, e.block), int((levels == e.level).sum()),
                             1, "forward", tuple(map(int, plus)), tuple(map(int, minus)),
                             "s-1"))  # fmt: skip
    return out


def serve(batches: list[Batch], mech: Sao2Mechanism, tasks: list[Sao2Task]) -> list[object]:
    agg = ShuffledAggregator(mech, "cells", tasks)
    state, events = agg.initial(), []
    for b in batches:
        taken = agg.take(state, b)
        events += taken.events if taken.why is None else [taken.why]
    return events


@cache
def runs() -> tuple[Sao2Mechanism, list[list[Release]]]:
    mech = mechanism()
    (task,) = tasks_for(mech, "cells", 9, 1)
    out = []
    for seed in range(RUNS):
        events = serve(device_batches(task, population()[:T], seed), mech, [task])
        out.append([e for e in events if isinstance(e, Release)])
    return mech, out


def test_the_releases_are_unbiased_against_the_stated_standard_error() -> None:
    _mech, all_runs = runs()
    assert all(len(r) == T for r in all_runs)
    truth = np.stack([np.bincount(v, minlength=D) / N for v in population()[:T]])
    est = np.array([[r.estimate for r in one] for one in all_runs])
    se = np.array([r.details.stderr for r in all_runs[0]])  # type: ignore[attr-defined]
    z = (est.mean(axis=0) - truth) / (se[:, None] / math.sqrt(RUNS))
    assert np.abs(z).max() < 4.0
    assert all(r.strategy == "publish" for r in all_runs[0])


def test_order_and_copies_change_nothing_and_a_conflicting_copy_is_refused() -> None:
    mech = mechanism()
    (task,) = tasks_for(mech, "cells", 9, 1)
    batches = device_batches(task, population()[:T], 0)
    straight = serve(batches, mech, [task])
    shuffled = list(reversed(batches)) + batches[:3]
    assert serve(shuffled, mech, [task]) == straight
    first = batches[0]
    other = Batch(**{**first.__dict__, "plus": tuple(c + 1 for c in first.plus or ())})
    assert serve([first, other], mech, [task])[-1] == "conflicting_batch"
    foreign = Batch(**{**first.__dict__, "task": "0" * 32})
    assert serve([foreign], mech, [task]) == ["unknown_task"]


def test_a_dropped_block_repeats_the_last_release_where_it_is_needed() -> None:
    mech = mechanism()
    (task,) = tasks_for(mech, "cells", 9, 1)
    batches = device_batches(task, population()[:T], 0)
    dropped = [Batch(**{**b.__dict__, "policy": "drop", "plus": None, "minus": None})
               if (b.level, b.block) == (0, 3) else b for b in batches]  # fmt: skip
    releases = [e for e in serve(dropped, mech, [task]) if isinstance(e, Release)]
    # level-0 block 3 (slot 3) is added by x̂_3 only (Algorithm 2: x̂_4 takes level 2's block)
    assert [r.strategy for r in releases] == ["publish"] * 2 + ["approximate"] + ["publish"] * 5
    assert releases[2].estimate == releases[1].estimate and releases[2].source_slot == 2
    assert releases[2].details.stderr is None  # type: ignore[attr-defined]


def test_two_horizons_charge_the_lifetime_and_pass_the_audit() -> None:
    mech = mechanism()
    tasks = tasks_for(mech, "cells", 9, 5)
    assert len(tasks) == 2  # ε_life = 2ε: no third horizon is ever published
    assert tasks[0].salt != tasks[1].salt and tasks[1].first_slot == T + 1
    batches = [b for h, t in enumerate(tasks)
               for b in device_batches(t, population()[h * T:(h + 1) * T], h)]  # fmt: skip
    entries = [e for e in serve(batches, mech, tasks) if isinstance(e, LedgerEntry)]
    assert [e.classes[0].charged for e in entries] == [1.0] + [0.0] * 7 + [1.0] + [0.0] * 7
    assert entries[-1].classes[0].spent == 2.0 == entries[-1].classes[0].budget
    assert verify([e.to_dict() for e in entries]) == []
    details = entries[-1].details
    assert details.shuffle == "shuffler" and sum(details.n_h) == N  # type: ignore[attr-defined]


@pytest.mark.parametrize("field", ["slot", "level"])
def test_a_batch_that_does_not_fit_its_task_is_refused(field: str) -> None:
    mech = mechanism()
    (task,) = tasks_for(mech, "cells", 9, 1)
    first = device_batches(task, population()[:T], 0)[0]
    bad = Batch(**{**first.__dict__, field: 7 if field == "slot" else 9})
    assert serve([bad], mech, [task]) == ["shape_mismatch"]


def test_a_release_states_the_manifests_n_and_lemma_3_4() -> None:
    _mech, all_runs = runs()
    details = all_runs[0][-1].details
    assert isinstance(details, Sao2Release) and details.accountant == "classical-7.1"
    assert sum(details.n_h) == N and all(e < 2.0 for e in details.epsilon_central)


def test_the_server_refuses_anything_but_a_batch_naming_why() -> None:
    from privstream.connectors.kafka import RawBatch
    from privstream.flows.shuffled import parse_poll

    mech = mechanism()
    (task,) = tasks_for(mech, "cells", 9, 1)
    batch = device_batches(task, population()[:T], 0)[0]
    raw = b'{"type":"privstream.sao2.report","version":1,"device":"d-1"}'
    out = parse_poll(RawBatch("t", 0, 0, [batch.to_json().encode(), raw, b"{nope"]))
    assert out[0] == batch
    assert [getattr(x, "reason", None) for x in out[1:]] == ["invalid_type", "malformed_json"]
