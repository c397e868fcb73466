"""State size and snapshot cost of one stream (``bench/state.py``, issue 13).

What Bytewax snapshots of a stream is its ``StreamState`` (``operators.stream_state``), copied
by ``SlottedLogic.snapshot`` and pickled into the recovery store at every epoch close. This
module builds that state the way a flow does — ``SlottedLogic`` fed event batches slot by slot —
and measures it: pickled bytes by component, the copy, pickle, sqlite write and unpickle times,
and the pause the snapshots cause a real flow run with a recovery store.

The components follow the design's accounting (design §3, §4): each mechanism's ledger (budget
division: ``O(w)`` numbers for the whole population; population division: one last-report
slot per user, ``O(n)``; personalized: ``O(classes·w)``; CGM: two counters per user), the rest
of its state, its clients' per-user arrays, the carried-forward values, the open slots, the
registration (named users' directory and requirements), the population accountant and the
tallies. Users are named (user-id strings, as from Kafka or a file) or dense indices (the
in-process synthetic source). Nothing measured here is a value, a count or a user id.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from unittest import mock

import numpy as np
from bytewax import operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource
from numpy.typing import NDArray

from privstream.families.registry import family
from privstream.mechanisms.accountant import BudgetSplit
from privstream.mechanisms.seeding import NoiseKey
from privstream.mechanisms.tasks import FrequencyTask
from privstream.operators import slotting
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.operators.slotting import SlottedLogic, make_plan
from privstream.operators.stream_state import StreamState
from privstream.schema.events import EventBatch

SEED: Final = 1
REPORTING: Final = 0.1
"""Share of the users reporting a new value at every slot after the first (the others carry
their value forward); every user reports at the first slot, so all are enrolled."""
LEDGER_FIELDS: Final = frozenset({"budget", "population", "ledger", "charged", "lifetime"})
"""The fields of a mechanism's state that hold its privacy ledger: ``BudgetLedger`` and
``PopulationLedger`` (LDP-IDS), ``PersonalizedLedger``, CGM's per-user report counters."""


@dataclass(frozen=True)
class Case:
    """One stream configuration: a family's mechanisms and window. Several mechanisms share
    the population's ε equally, or with ``compare`` run side by side with the full ε each (an
    evaluation: each one's state is then the state it has alone, see ``only``)."""

    family: str
    mechanisms: tuple[str, ...]
    window: int
    compare: bool = False

    @property
    def label(self) -> str:
        return "+".join(self.mechanisms)


def user_ids(users: int) -> NDArray[Any]:
    """Named users' ids (strings, as a Kafka or file source delivers them)."""
    return np.array([f"user-{i:07d}" for i in range(users)], dtype=object)


def two_classes(users: int, epsilon: float, window: int) -> tuple[NDArray[Any], NDArray[Any]]:
    """Two privacy classes, alternating users: ``(ε, w)`` and ``(2ε, ⌈w/2⌉)``."""
    odd = np.arange(users) % 2 == 1
    return np.where(odd, 2 * epsilon, epsilon), np.where(odd, -(-window // 2), window)


def preferences(ids: NDArray[Any] | None, users: int, epsilon: float, window: int) -> Preferences:
    """The registration table of a central-DP stream in two classes, by user id (``ids``) or
    by dense index."""
    eps, win = two_classes(users, epsilon, window)
    if ids is None:
        return Preferences(epsilons=eps, windows=win)
    table = zip(ids.tolist(), eps.tolist(), win.tolist(), strict=True)
    return Preferences(by_user={user: (e, int(w)) for user, e, w in table})


@dataclass(frozen=True)
class Setup:
    """What the family's operator is given for ``case`` (as ``family_mechanisms`` builds it),
    and the user column of the stream's batches."""

    case: Case
    users: int
    ids: NDArray[Any]
    config: Any
    split: BudgetSplit
    registration: Preferences | None

    @classmethod
    def of(cls, case: Case, users: int, named: bool) -> Setup:
        """``case`` over ``users`` users, named (user-id strings) or by dense index."""
        entry = family(case.family)
        config = entry.make_config(
            epsilon=entry.epsilon, window=case.window, population=users, task=entry.task
        )
        k = len(case.mechanisms)
        split = BudgetSplit.parse("equal" if k > 1 and not case.compare else None, k,
                                  compare=case.compare)  # fmt: skip
        ids = user_ids(users) if named else np.arange(users, dtype=np.int64)
        prefs = None
        if entry.needs_registration:
            prefs = preferences(ids if named else None, users, entry.epsilon, case.window)
        return cls(case, users, ids, config, split, prefs)

    def logic(self) -> SlottedLogic:
        """The slotted operator's logic of one stream, as ``family_mechanisms`` makes it."""
        entry, names = family(self.case.family), list(self.case.mechanisms)
        budget = entry.build(names[0], self.config).privacy_cost.budget
        built = entry.build_shared(names, self.config, self.split.shares)
        plan = make_plan("state", built, self.config.task, self.users, NoiseKey.insecure_seed(SEED),
                         split=self.split, epsilon=budget,
                         registration=self.registration)  # fmt: skip
        return SlottedLogic("state", plan, None)

    def batches(self, slots: int) -> Iterator[EventBatch]:
        """``slots`` closed slots (every user at the first, a random tenth at each later one),
        then one open slot without its end-of-slot marker: what a snapshot finds between two
        slots."""
        rng = np.random.default_rng(SEED)
        n, task = self.users, self.config.task
        for slot in range(1, slots + 2):
            rows = np.arange(n) if slot == 1 else np.flatnonzero(rng.random(n) < REPORTING)
            values = (rng.random(rows.shape[0]) < 0.3).astype(np.float64)
            if not isinstance(task, FrequencyTask):
                values = rng.random(rows.shape[0])  # a mean over [0, 1)
            yield EventBatch("state", np.full(rows.shape[0], slot, dtype=np.int64),
                             self.ids[rows], values,
                             complete_through=slot if slot <= slots else None)  # fmt: skip


def build_state(case: Case, users: int, slots: int, named: bool = True) -> StreamState:
    """The stream state of ``case`` after ``slots`` closed slots over ``users`` users and one
    open slot, built by the slotted operator's logic."""
    setup = Setup.of(case, users, named)
    logic = setup.logic()
    for batch in setup.batches(slots):
        logic.on_batch([batch])
    assert logic.state is not None and not logic.state.halted, "the stream halted"
    return logic.state


def pickled(obj: Any) -> int:
    """Bytes of ``obj`` pickled as Bytewax pickles a snapshot."""
    return len(pickle.dumps(obj))


def components(state: StreamState) -> dict[str, int]:
    """Pickled bytes of each part of ``state``: per mechanism its ledger, the rest of its
    state, its clients' arrays and its tally; then the parts every mechanism shares."""
    out: dict[str, int] = {}
    for name, mech in state.mechanisms.items():
        fields = vars(mech)
        out[f"{name} ledger"] = pickled({k: v for k, v in fields.items() if k in LEDGER_FIELDS})
        out[f"{name} other"] = pickled({k: v for k, v in fields.items() if k not in LEDGER_FIELDS})
        out[f"{name} clients"] = pickled(state.clients.get(name))
        out[f"{name} tally"] = pickled(state.tallies[name])
    out["values"] = pickled(state.current)
    out["open slots"] = pickled((state.open_slots, state.newcomers))
    out["registration"] = pickled((state.directory, state.epsilons, state.windows))
    out["accountant"] = pickled(state.accountant)
    return out


def only(state: StreamState, name: str) -> StreamState:
    """The state of a stream running ``name`` alone, cut from one running several side by side
    (each mechanism's state and randomness are its own)."""
    return dataclasses.replace(
        state,
        mechanisms={name: state.mechanisms[name]},
        clients={name: state.clients[name]} if name in state.clients else {},
        tallies={name: state.tallies[name]},
    )


def _best(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``fn``, in milliseconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1e3 * min(times)


def write_ms(blob: bytes, repeats: int) -> float:
    """Milliseconds to commit ``blob`` to an sqlite store the way Bytewax's recovery
    partitions hold snapshots (WAL journal, one row per step, key and epoch)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "part-0.sqlite3")
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("CREATE TABLE snaps (step_id TEXT, state_key TEXT, snap_epoch INTEGER, "
                       "ser_change BLOB, PRIMARY KEY (step_id, state_key, snap_epoch))")  # fmt: skip
            epochs = itertools.count(1)

            def write() -> None:
                row = ("state", "stream", next(epochs), blob)
                db.execute("INSERT INTO snaps VALUES (?, ?, ?, ?)", row)
                db.commit()

            return _best(write, repeats)
        finally:
            db.close()


def snapshot_cost(state: StreamState, repeats: int = 3) -> dict[str, float]:
    """Milliseconds to copy (``SlottedLogic.snapshot``), pickle, write (``write_ms``) and
    unpickle ``state``; their sum but the last is the pause one snapshot costs the flow."""
    blob = pickle.dumps(state)
    cost = {
        "bytes": float(len(blob)),
        "copy_ms": _best(lambda: copy.deepcopy(state), repeats),
        "pickle_ms": _best(lambda: pickle.dumps(state), repeats),
        "write_ms": write_ms(blob, repeats),
        "unpickle_ms": _best(lambda: pickle.loads(blob), repeats),
    }
    cost["pause_ms"] = cost["copy_ms"] + cost["pickle_ms"] + cost["write_ms"]
    return cost


def measure(state: StreamState, users: int, repeats: int = 3) -> dict[str, Any]:
    """Size, breakdown and snapshot cost of ``state``."""
    cost = snapshot_cost(state, repeats)
    directory = pickled(state.directory) - pickled({})
    return {
        **cost,
        "bytes_per_user": cost["bytes"] / users,
        "dense_bytes_per_user": (cost["bytes"] - directory) / users,
        "components": components(state),
    }


# --- the pause in a real flow ---------------------------------------------------------------


@dataclass
class Timeline:
    """When the slotted operator's callbacks ran: ``(what, start, end)`` in perf_counter s."""

    calls: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)

    def gaps(self) -> tuple[list[float], list[float]]:
        """The time between consecutive ``on_batch`` calls, split into the gaps that held a
        snapshot and the others (seconds)."""
        batches = [c for c in self.calls if c[0] == "on_batch"]
        snaps = [c[1] for c in self.calls if c[0] == "snapshot"]
        with_snap: list[float] = []
        without: list[float] = []
        for before, after in itertools.pairwise(batches):
            gap = after[1] - before[2]
            held = any(before[2] <= s <= after[1] for s in snaps)
            (with_snap if held else without).append(gap)
        return with_snap, without


@contextmanager
def timed_logic() -> Iterator[Timeline]:
    """Record the slotted operator's ``on_batch`` and ``snapshot`` calls of the flows built
    inside (the operator's builder looks ``SlottedLogic`` up when a stream starts)."""
    timeline = Timeline()

    class Timed(SlottedLogic):
        def on_batch(self, values: list[EventBatch]) -> Any:
            started = time.perf_counter()
            try:
                return super().on_batch(values)
            finally:
                timeline.calls.append(("on_batch", started, time.perf_counter()))

        def snapshot(self) -> StreamState:
            started = time.perf_counter()
            try:
                return super().snapshot()
            finally:
                timeline.calls.append(("snapshot", started, time.perf_counter()))

    with mock.patch.object(slotting, "SlottedLogic", Timed):
        yield timeline


def stream_flow(setup: Setup, batches: list[EventBatch]) -> Dataflow:
    """A flow of the family's operator over ``batches`` (an in-process source, one slot per
    batch), its releases and ledger entries counted and dropped."""
    entry = family(setup.case.family)
    flow = Dataflow("state_bench")
    keyed = op.key_on("by_stream", op.input("in", flow, TestingSource(batches)), lambda b: b.stream)
    out = family_mechanisms("family", keyed, family=entry, mechanism=list(setup.case.mechanisms),
                            config=setup.config, secret=SEED, split=setup.split,
                            registration=setup.registration)  # fmt: skip
    op.output("releases", out.releases, TestingSink([]))
    op.output("ledger", out.ledger, TestingSink([]))
    return flow


def _run_flow(
    setup: Setup, batches: list[EventBatch], store: str | None, interval: float
) -> tuple[float, Timeline]:
    from privstream.runtime.runner import run_dataflow

    with timed_logic() as timeline:
        flow = stream_flow(setup, batches)
        started = time.perf_counter()
        run_dataflow(flow, 1, store, interval)
        return time.perf_counter() - started, timeline


def flow_pause(
    case: Case, users: int, slots: int, interval: float = 1.0, named: bool = True
) -> dict[str, Any]:
    """The pause snapshots cause a real flow: the family's operator under Bytewax's runner
    (``runner.run_dataflow``) over the same batches as ``build_state``, run with a recovery
    store and without, at the same epoch (snapshot) interval ``interval`` seconds.

    The pause of one snapshot is the time between two ``on_batch`` calls that held it (the
    state's copy, Bytewax's pickle and its sqlite write) less the median gap without one;
    the copy alone is timed inside ``snapshot``. The run-time difference over the snapshot
    count is the same pause seen from outside."""
    setup = Setup.of(case, users, named)
    batches = list(setup.batches(slots))
    plain, _ = _run_flow(setup, batches, None, interval)
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "recovery")
        wall, timeline = _run_flow(setup, batches, store, interval)
        store_bytes = sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file())
    with_snap, without = timeline.gaps()
    base = statistics.median(without) if without else 0.0
    copies = [end - start for what, start, end in timeline.calls if what == "snapshot"]
    steps = [end - start for what, start, end in timeline.calls if what == "on_batch"]
    return {
        "users": users,
        "slots": slots,
        "interval_s": interval,
        "snapshots": len(copies),
        "wall_s": wall,
        "wall_without_recovery_s": plain,
        "pause_ms": 1e3 * statistics.median([g - base for g in with_snap]) if with_snap else None,
        "pause_from_wall_ms": 1e3 * (wall - plain) / max(len(copies), 1),
        "copy_ms": 1e3 * statistics.median(copies) if copies else None,
        "step_ms": 1e3 * statistics.median(steps[1:]),
        "store_bytes": store_bytes,
    }


def scaling(
    case: Case, users: Sequence[int], windows: Sequence[int], named: bool = False
) -> dict[tuple[int, int], dict[str, int]]:
    """Components of ``case``'s state for every ``(users, window)`` pair, after ``w + 5``
    slots: how each part grows with ``n`` and ``w``."""
    out = {}
    for n in users:
        for w in windows:
            state = build_state(dataclasses.replace(case, window=w), n, w + 5, named)
            out[(n, w)] = {**components(state), "total": pickled(state)}
    return out
