"""The stages a family runs (design §13, issue 19 item 3): who computes what, keyed by what,
inside which trust domain. Engine-free: no Bytewax here (``privstream.operators.stages`` wires
stages into a dataflow).

A ``Stage`` declares

* its ``role``: ``randomizer`` (alias ``device``: the users' devices), ``shuffler`` (an
  anonymising intermediary) or ``curator`` (alias ``server``: the server that releases);
* its ``key``: what its work is partitioned by, a function of one input record (a user, a
  user shard, an epoch, a stream); each key's records meet one state;
* its ``trust_domain``: who runs it and may see its input (the devices, the shuffler's
  operator, the curator);
* its ``input`` and ``output`` batch types (a type or a name), so a chain of stages is checked
  before it runs;
* its ``state`` factory (a plain picklable object per key: snapshot-safe) and optionally its
  ``step(state, record) -> (state, outputs)``.

Today's families declare one server stage keyed by stream (``server_stage``; the mechanism's
``step`` is the stage's step), which changes nothing they do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

Role = Literal["randomizer", "shuffler", "curator"]
ROLES: Final[dict[str, Role]] = {
    "randomizer": "randomizer",
    "device": "randomizer",
    "shuffler": "shuffler",
    "curator": "curator",
    "server": "curator",
}
"""Accepted role names and the role each means (device = randomizer, server = curator)."""

DEVICES: Final = "devices"
SHUFFLER: Final = "shuffler operator"
CURATOR: Final = "curator"
"""The trust domains of the three roles' usual deployments."""

StepFn = Callable[[Any, Any], tuple[Any, Sequence[Any]]]


@dataclass(frozen=True)
class StageKey:
    """What a stage's work is partitioned by: ``of(record)`` is the record's key (a string, the
    engine's partition key); ``name`` says what it is (``user``, ``user shard``, ``epoch``,
    ``stream``)."""

    name: str
    of: Callable[[Any], str]


def by_stream(stream: Callable[[Any], str] = lambda r: r.stream) -> StageKey:
    """Key by the record's stream (each stream's ledger lives on one worker, design §5)."""
    return StageKey("stream", lambda r: str(stream(r)))


def by_user(user: Callable[[Any], str] = lambda r: r.user) -> StageKey:
    """Key by the record's user (one state per device)."""
    return StageKey("user", lambda r: str(user(r)))


def shard_of(user: str, shards: int) -> int:
    """The stable shard of ``user`` among ``shards`` (BLAKE2b of the id: the same in every
    process, unlike Python's salted ``hash``)."""
    digest = hashlib.blake2b(user.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % shards


def by_user_shard(shards: int, user: Callable[[Any], str] = lambda r: r.user) -> StageKey:
    """Key by ``shard_of(user, shards)``: ``shards`` states, each holding a fixed set of users."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    return StageKey("user shard", lambda r: f"shard-{shard_of(str(user(r)), shards)}")


def by_epoch(epoch: Callable[[Any], int] = lambda r: r.epoch) -> StageKey:
    """Key by the record's epoch (a shuffler batches one epoch's reports)."""
    return StageKey("epoch", lambda r: f"epoch-{int(epoch(r))}")


@dataclass(frozen=True)
class Stage:
    """One stage of a family (module docstring). ``step`` is None for a stage whose step the
    engine runs itself (a simulated device behind a ``ClientPort``)."""

    name: str
    role: str
    key: StageKey
    trust_domain: str
    input: type | str
    output: type | str
    state: Callable[[], Any]
    step: StepFn | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"a stage name is letters, digits, '-' and '_', got {self.name!r}")
        if self.role not in ROLES:
            raise ValueError(
                f"stage {self.name!r} has role {self.role!r}; roles are {sorted(ROLES)}"
            )
        object.__setattr__(self, "role", ROLES[self.role])
        if not self.trust_domain:
            raise ValueError(f"stage {self.name!r} needs a trust domain (who runs it)")

    @property
    def input_name(self) -> str:
        return type_name(self.input)

    @property
    def output_name(self) -> str:
        return type_name(self.output)


def type_name(t: type | str) -> str:
    """A batch type's name (a type's qualified name, or the name given)."""
    return t if isinstance(t, str) else t.__qualname__


def check_chain(stages: Sequence[Stage]) -> None:
    """Refuse a chain whose stage names repeat, or where a stage's output batch type is not the
    next stage's input type (naming both stages and types)."""
    if not stages:
        raise ValueError("a family declares at least one stage")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names must be distinct, got {names}")
    for up, down in itertools.pairwise(stages):
        if up.output_name != down.input_name:
            raise ValueError(
                f"stage {up.name!r} outputs {up.output_name} but the next stage "
                f"{down.name!r} takes {down.input_name}"
            )


def server_stage(
    name: str,
    state: Callable[[], Any],
    step: StepFn | None = None,
    *,
    key: StageKey | None = None,
    input: type | str = "Slot",
    output: type | str = "Release | LedgerEntry",
    trust_domain: str = CURATOR,
) -> Stage:
    """The one server (curator) stage of today's families: keyed by stream, in the curator's
    trust domain, taking a slot and emitting releases and ledger entries."""
    return Stage(name, "curator", key or by_stream(), trust_domain, input, output, state, step)


central_stage = server_stage
"""The same helper under the name of the central (trusted-curator) model."""


# -- stages before the server: event batches, split by key and put back together ---------------


EVENTS: Final = "EventBatch"
"""The batch type of a stage before the server: a stream's events (``schema.events``), rows
in columns. Such a stage maps each batch of its key's rows to one batch of as many rows."""


@dataclass(frozen=True)
class Row:
    """What a key function of a stage before the server reads of one event row."""

    stream: str
    slot: int
    user: Any
    partition: int


@dataclass(frozen=True)
class Piece:
    """Some rows of one input batch on their way through the stages before the server:
    ``origin`` (stream, partition, sequence number) and ``total`` rows name the batch they came
    from, ``positions`` their places in it, ``key`` the current stage's key of them, and
    ``marker`` the batch's end-of-slot marker (``complete_through``, ``marker_tag``), which
    travels beside the rows and is put back on the batch once every row is back."""

    origin: tuple[str, int, int]
    total: int
    positions: Any
    batch: Any
    marker: tuple[int | None, str | None] = (None, None)
    key: str = ""


_COLUMNS: Final = ("slots", "users", "values", "epsilons", "windows", "lines", "offsets", "lengths")
"""An event batch's per-row columns (each row's line, offset and length where the input
recorded them)."""


def take_rows(batch: Any, rows: Any) -> Any:
    """The rows ``rows`` (an index array) of an event batch, every column alike."""
    changes: dict[str, Any] = {
        c: getattr(batch, c)[rows] for c in _COLUMNS if getattr(batch, c) is not None
    }
    if batch.raw is not None:
        changes["raw"] = [batch.raw[int(i)] for i in np.asarray(rows)]
    return dataclasses.replace(batch, **changes)


def piece_of(batch: Any, sequence: int) -> Piece:
    """A whole input batch as the first piece of its ``sequence`` number (its stream and
    partition's count of batches), its marker held beside it."""
    bare = dataclasses.replace(batch, complete_through=None, marker_tag=None)
    origin = (str(batch.stream), int(batch.partition), sequence)
    return Piece(origin, len(batch), np.arange(len(batch)), bare,
                 (batch.complete_through, batch.marker_tag))  # fmt: skip


def split(piece: Piece, key: StageKey) -> list[Piece]:
    """``piece`` cut by ``key`` (of every row): one piece per key, rows in their order."""
    batch = piece.batch
    keys = [
        key.of(Row(batch.stream, int(s), u, batch.partition))
        for s, u in zip(batch.slots, batch.users, strict=True)
    ]
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return [
        dataclasses.replace(
            piece, positions=piece.positions[idx], batch=take_rows(batch, idx), key=k
        )
        for k, rows in groups.items()
        for idx in [np.asarray(rows, dtype=np.int64)]
    ]


def step_piece(stage: Stage, state: Any, piece: Piece) -> tuple[Any, Piece]:
    """Run ``stage``'s step on the rows of ``piece``: it must return one batch of as many rows
    (the rows keep their places), else the stage is refused by name."""
    assert stage.step is not None
    new, out = stage.step(state, piece.batch)
    batches = list(out)
    if len(batches) != 1 or len(batches[0]) != len(piece.batch):
        raise ValueError(
            f"stage {stage.name!r} must map a batch of {len(piece.batch)} rows to one batch "
            "of as many rows"
        )
    return new, dataclasses.replace(piece, batch=batches[0])


def merge(pieces: Sequence[Piece]) -> Any:
    """The input batch the ``pieces`` of one origin came from, rows back in their places and
    its marker back on it (``pieces`` hold every row: ``total`` of them)."""
    first = pieces[0]
    positions = np.concatenate([p.positions for p in pieces])
    order = np.argsort(positions, kind="stable")
    parts = [p.batch for p in pieces]
    changes: dict[str, Any] = {}
    for c in _COLUMNS:
        cols = [getattr(b, c) for b in parts]
        if all(col is not None for col in cols):
            changes[c] = np.concatenate(cols)[order]
    if all(b.raw is not None for b in parts):
        raw = [line for b in parts for line in b.raw]
        changes["raw"] = [raw[int(i)] for i in order]
    else:
        changes["raw"] = None
    through, tag = first.marker
    return dataclasses.replace(first.batch, complete_through=through, marker_tag=tag, **changes)


def complete(pieces: Sequence[Piece]) -> bool:
    """Every row of the pieces' origin batch is back."""
    return bool(pieces) and sum(len(p.positions) for p in pieces) == pieces[0].total


StageStates = dict[str, dict[str, Any]]
"""Every stage's states by key: ``{stage name: {key: state}}``."""


def run_chain(
    stages: Sequence[Stage], batches: Sequence[Any], states: StageStates | None = None
) -> list[Any]:
    """Run event ``batches`` through ``stages`` in order, engine-free (the bench harness and
    the conformance checks run this; the dataflow runs the same ``split``/``step_piece``/
    ``merge`` through ``operators.stages``): every row meets only its key's state in each stage;
    ``states`` (mutated) carries the states from one call to the next. Returns the batches as
    the server receives them, in order."""
    check_chain(stages)
    states = {} if states is None else states
    out: list[Any] = []
    for sequence, batch in enumerate(batches):
        pieces = [piece_of(batch, sequence)]
        for stage in stages:
            held = states.setdefault(stage.name, {})
            stepped = []
            for piece in (q for p in pieces for q in split(p, stage.key)):
                state = held[piece.key] if piece.key in held else stage.state()
                new, moved = step_piece(stage, state, piece)
                if new is None:
                    held.pop(piece.key, None)
                else:
                    held[piece.key] = new
                stepped.append(moved)
            pieces = stepped
        out.append(merge(pieces) if pieces else batch)
    return out


def pre_server(mechanisms: Sequence[Any]) -> tuple[Stage, ...]:
    """The stages the ``mechanisms`` of one stream run before their server stage (every stage
    ``Mechanism.stages()`` declares but the last): none for today's one-stage families. A
    stream whose mechanism has stages before the server runs that one mechanism alone (the
    stages randomise its input for its own budget); their batch types must meet."""
    chains = [tuple(m.stages()[:-1]) for m in mechanisms]
    if not any(chains):
        return ()
    if len(mechanisms) > 1:
        raise ValueError(
            "a mechanism with stages before its server stage runs alone on its stream: "
            f"{', '.join(m.name for m in mechanisms)} were asked together"
        )
    check_chain(chains[0])
    if chains[0][0].input_name != EVENTS or chains[0][-1].output_name != EVENTS:
        raise ValueError(
            f"the stages before the server take and give {EVENTS}; "
            f"{chains[0][0].name!r} takes {chains[0][0].input_name}, "
            f"{chains[0][-1].name!r} gives {chains[0][-1].output_name}"
        )
    return chains[0]
