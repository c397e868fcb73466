"""The stages a family runs (design §13, issue 19 item 3): who computes what, keyed by what,
inside which trust domain. Engine-free: no Bytewax here (``privstream.flows.stages`` wires
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

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

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
