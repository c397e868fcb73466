"""Incarnations: no two computations of a release id share noise, and a store stays bound to
the flow it was made for (design §6; issue 18 §2 and §4, issue 27 item 3).

**Guarantee.** Noise is derived from ``(secret, stream, slot, purpose, incarnation)``
(``mechanisms.seeding``). An *incarnation* is a random 128-bit nonce:

* made with a new recovery store and kept in it (``privstream-incarnation.json`` beside the
  partitions, written to a temporary file, fsynced and hard-linked into place, so it appears
  whole or not at all and a concurrent start never replaces it); a store that holds snapshots
  but not its nonce is refused (its replays could not draw their own noise again);
* fresh for every run without a recovery store (such a run cannot resume);
* the fixed public incarnation for an ``--insecure-seed`` run (public noise anyway; its runs
  reproduce byte for byte).

A replay from the store draws exactly the noise it drew before (same bytes, same release ids);
a new store, started after a halt or after the data changed, draws fresh noise, so the
difference of two computations of one release id is no longer the exact difference of their
data. Releases never state the nonce; the short public ``incarnation_id`` (a digest) is logged.

**Binding.** The file also holds the store's *manifest*: the population's ε and window, every
stream's share, the retired streams' shares and a keyed digest of each registered user's
requirement, and the digests of users withdrawn from it. A user removed from the table is
withdrawn (``registration_plan``: counted no more from each stream's next slot, seat kept,
never back under the same id); any other change of the table is refused by kind and count.
A resume that changes anything else is refused naming the change, except:
a stream gone from the flow file and listed in ``[population] retired`` (its share stays spent
for as long as the store lives: conservative, never returned), and a new stream whose share
fits with the live and retired shares under 1. A retired name never comes back (its old
snapshot would publish the slots it was absent for from stale values).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from privstream.connectors.kafka import KafkaSettings
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.ledger import budget_limit
from privstream.mechanisms.seeding import NoiseKey
from privstream.runtime.recovery import check_store, prepare_store

log = logging.getLogger(__name__)

FILE: Final = "privstream-incarnation.json"
NONCE_BYTES: Final = 16
VERSION: Final = 1


@dataclass(frozen=True)
class Manifest:
    """What a store is bound to beyond each stream's snapshot: the population's budget,
    every stream's share and the registration (a keyed digest per user: never a user id)."""

    epsilon: float
    window: int
    streams: Mapping[str, float]
    retired: Mapping[str, float] = field(default_factory=dict)
    registration: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    withdrawn: frozenset[str] = frozenset()
    """Keyed digests of the users withdrawn from the registration table on a resume: their
    seats stay, they never count again and never come back under the same id."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "window": self.window,
            "streams": dict(self.streams),
            "retired": dict(self.retired),
            "registration": {k: list(v) for k, v in sorted(self.registration.items())},
            "withdrawn": sorted(self.withdrawn),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        reg = {str(k): (float(v[0]), int(v[1])) for k, v in data["registration"].items()}
        return cls(
            float(data["epsilon"]), int(data["window"]),
            {str(k): float(v) for k, v in data["streams"].items()},
            {str(k): float(v) for k, v in data["retired"].items()}, reg,
            frozenset(str(k) for k in data.get("withdrawn", ())),
        )  # fmt: skip


def registration_digests(
    table: Mapping[str, tuple[float, int]], key: NoiseKey
) -> dict[str, tuple[float, int]]:
    """Each registered user's requirement under a keyed digest of the user id (the store
    never names a user outside its snapshots; the digest is keyed by the secret)."""
    out: dict[str, tuple[float, int]] = {}
    for user, (eps, win) in table.items():
        h = hashlib.blake2b(user.encode(), key=key.prf_key, digest_size=12, person=b"ps-reg")
        out[h.hexdigest()] = (float(eps), int(win))
    return out


@dataclass(frozen=True)
class Incarnation:
    """The run's key placed in its incarnation; ``new`` when no snapshot of an earlier run of
    this incarnation exists (a new store or no store: ``privstream.runtime.republish`` applies);
    ``floors``: each stream's last slot published before the incarnation began (kept in the
    store, so every run of the incarnation skips the same slots)."""

    key: NoiseKey
    new: bool
    floors: Mapping[str, int] = field(default_factory=dict)
    withdrawing: bool = False
    """This run withdraws users the store had not withdrawn yet (``Manifest.withdrawn``)."""
    released: Mapping[str, int] = field(default_factory=dict)
    """With ``withdrawing`` on Kafka: each stream's last slot on the release topic now."""
    created: bool = True
    """The nonce was made by this run (no store, or a store without one yet): nothing it
    computes was computed before; otherwise a replay recomputes the same bytes."""

    @property
    def id(self) -> str:
        return self.key.incarnation_id()


@dataclass(frozen=True)
class Stored:
    """The content of a store's incarnation file."""

    nonce: bytes
    manifest: Manifest
    floors: Mapping[str, int] = field(default_factory=dict)


def begin(
    key: NoiseKey,
    recovery_dir: str | Path | None,
    manifest: Manifest,
    retiring: frozenset[str] = frozenset(),
) -> Incarnation:
    """The incarnation of a run: the store's (created with it, checked against ``manifest``),
    a fresh one without a store, the fixed public one for an insecure key. Raises
    ``IncompatibleState`` naming every refused change."""
    if recovery_dir is None:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return _announce(Incarnation(key.with_incarnation(nonce), True), "this run (no store)")
    path = Path(recovery_dir)
    prepare_store(path)
    snapshots = not check_store(path).empty
    stored = read(path)
    created = stored is None
    if stored is None:
        if snapshots:
            raise IncompatibleState(
                f"recovery store {path} holds snapshots but no incarnation ({FILE}): it was "
                "written by an older privstream or the file was lost, so its replays cannot draw "
                "their own noise again. Restore the file from the store's backup, or start a new "
                "recovery directory (it starts after the slots already published)."
            )
        stored = _create(path, manifest)
    updated = reconcile(stored.manifest, manifest, where=str(path), retiring=retiring)
    if updated != stored.manifest:
        _write(path, replace(stored, manifest=updated), replace_existing=True)
    withdrawing = bool(set(updated.withdrawn) - set(stored.manifest.withdrawn))
    found = Incarnation(
        key.with_incarnation(stored.nonce), not snapshots, stored.floors,
        withdrawing=withdrawing, created=created,
    )  # fmt: skip
    return _announce(found, f"store {path}")


def with_floors(
    incarnation: Incarnation, recovery_dir: str | Path | None, published: Mapping[str, int]
) -> Incarnation:
    """``incarnation`` starting after the slots ``published`` (``republish.last_published``),
    kept in its store so every later run of it skips the same slots."""
    floors = dict(incarnation.floors)
    for stream, slot in published.items():
        floors[stream] = max(slot, floors.get(stream, slot))
    if recovery_dir is not None and floors != incarnation.floors:
        path = Path(recovery_dir)
        stored = read(path)
        assert stored is not None, "with_floors after begin"
        _write(path, replace(stored, floors=floors), replace_existing=True)
    return replace(incarnation, floors=floors)


def _announce(incarnation: Incarnation, where: str) -> Incarnation:
    log.warning("incarnation %s of %s", incarnation.id, where)
    return incarnation


def read(path: Path) -> Stored | None:
    """The nonce, manifest and floors kept in the store ``path`` (None when it has none)."""
    file = path / FILE
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text("utf-8"))
        nonce = bytes.fromhex(data["nonce"])
        if data["version"] != VERSION or len(nonce) != NONCE_BYTES:
            raise ValueError("unknown version or nonce length")
        floors = {str(k): int(v) for k, v in data.get("published", {}).items()}
        return Stored(nonce, Manifest.from_dict(data["manifest"]), floors)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise IncompatibleState(
            f"recovery store {path}: {FILE} is unreadable ({type(exc).__name__}); restore it "
            "from the store's backup"
        ) from None


def _create(path: Path, manifest: Manifest) -> Stored:
    """A new nonce for the store ``path``; a concurrent start that won keeps its own."""
    stored = Stored(secrets.token_bytes(NONCE_BYTES), manifest)
    try:
        _write(path, stored, replace_existing=False)
    except FileExistsError:
        found = read(path)
        assert found is not None
        return found
    return stored


def _write(path: Path, stored: Stored, *, replace_existing: bool) -> None:
    """Write the file whole: a temporary file, fsynced, then linked (new) or renamed over."""
    content = {
        "version": VERSION,
        "nonce": stored.nonce.hex(),
        "manifest": stored.manifest.to_dict(),
        "published": dict(stored.floors),
    }
    text = json.dumps(content, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=".privstream-incarnation-", dir=path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace_existing:
            os.replace(tmp, path / FILE)
        else:
            os.link(tmp, path / FILE)
    finally:
        Path(tmp).unlink(missing_ok=True)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def changes(stored: Manifest, now: Manifest, retiring: frozenset[str]) -> list[str]:
    """Every refused difference between the store's manifest and this run's, in words."""
    refused: list[str] = []
    if not math.isclose(stored.epsilon, now.epsilon, rel_tol=1e-12):
        refused.append(
            f"the population's epsilon changed from {stored.epsilon:g} to {now.epsilon:g}"
        )
    if stored.window != now.window:
        refused.append(f"the population's window changed from {stored.window} to {now.window}")
    for name, share in stored.streams.items():
        if name in now.streams and not math.isclose(share, now.streams[name], rel_tol=1e-12):
            refused.append(
                f"stream {name!r}: its share changed from {share:g} to {now.streams[name]:g}"
            )
        elif name not in now.streams and name not in retiring:
            refused.append(
                f"stream {name!r} is gone from the flow (removed or renamed); declare it "
                f'retired (retired = ["{name}"] in [population]): its share stays spent'
            )
    for name in now.streams.keys() & stored.retired.keys():
        refused.append(
            f"stream {name!r} was retired and cannot come back (its slots while absent would "
            "be published from stale values); give the stream a new name"
        )
    refused += _registration_changes(stored, now)
    return refused


@dataclass(frozen=True)
class RegistrationPlan:
    """What a resume does with the changes of the registration table (issue 18 §4), by kind
    and count, never by user: ``withdrawn`` (keyed digests of the users removed now: they
    stop counting from each stream's next slot, ``operators.registration``), ``stricter``
    (users asking a smaller ε_i or a larger w_i) and ``refused`` (kind, count)."""

    withdrawn: frozenset[str] = frozenset()
    stricter: int = 0
    refused: tuple[tuple[str, int], ...] = ()


REFUSED_WHY: Final = {
    "table removed": "the store was made with a registration table and this run has none; "
    "keep the table (remove only the users to withdraw)",
    "added": "a running store cannot take a new user: its seats, class sizes and ledgers are "
    "fixed when the store is made",
    "back after withdrawal": "a withdrawal lasts as long as the store: the user cannot come "
    "back under the same id",
    "stricter requirement": "a stricter ε_i or w_i cannot be honoured in a running store in this "
    "version (the per-class ledgers cannot move one user's spend to another class); withdraw "
    "the user (remove them from the table) instead",
    "looser requirement": "a larger ε_i or a smaller w_i would spend more than the user agreed "
    "to in windows already charged",
}


def registration_plan(stored: Manifest, now: Manifest) -> RegistrationPlan:
    """Classify the registration table's changes since the store was made: a removed user is
    a withdrawal (honoured: the ledgers keep their seat); everything else is refused by kind
    and count (``REFUSED_WHY`` says why)."""
    before, after = stored.registration, now.registration
    removed = frozenset(before.keys() - after.keys())
    stricter = looser = 0
    for k in before.keys() & after.keys():
        (eps0, win0), (eps1, win1) = before[k], after[k]
        if (eps0, win0) == (eps1, win1):
            continue
        if eps1 <= eps0 and win1 >= win0:
            stricter += 1
        else:
            looser += 1
    counts = {
        "table removed": len(removed) if before and not after else 0,
        "added": len(after.keys() - before.keys() - stored.withdrawn),
        "back after withdrawal": len(after.keys() & stored.withdrawn),
        "stricter requirement": stricter,
        "looser requirement": looser,
    }
    refused = tuple((kind, count) for kind, count in counts.items() if count)
    withdrawn = frozenset() if counts["table removed"] else removed
    return RegistrationPlan(withdrawn, stricter, refused)


def _registration_changes(stored: Manifest, now: Manifest) -> list[str]:
    """The refused changes of the registration table by kind and count (never naming a
    user), each with its reason and what to do."""
    plan = registration_plan(stored, now)
    return [
        f"registration table: {kind}, {count} user(s): {REFUSED_WHY[kind]}"
        for kind, count in plan.refused
    ]


def reconcile(
    stored: Manifest, now: Manifest, *, where: str, retiring: frozenset[str] = frozenset()
) -> Manifest:
    """The store's manifest after this run's explicit changes, or ``IncompatibleState`` naming
    every refused one. ``retiring``: the flow file's ``retired`` streams."""
    retire = retiring
    refused = changes(stored, now, retire)
    retired = dict(stored.retired)
    retired.update(
        {n: s for n, s in stored.streams.items() if n not in now.streams and n in retire}
    )
    total = math.fsum(now.streams.values()) + math.fsum(retired.values())
    added = sorted(now.streams.keys() - stored.streams.keys() - stored.retired.keys())
    if added and total > budget_limit(1.0):
        refused.append(
            f"adding stream(s) {', '.join(added)} brings the live and retired shares to "
            f"{total:.12g} > 1: a retired stream's share stays spent"
        )
    if refused:
        raise IncompatibleState(
            f"recovery store {where} was made for another flow: "
            + "; ".join(refused)
            + ". Resume with the store's configuration, or start a new recovery directory (a "
            "new incarnation: fresh noise, starting after the slots already published, but "
            "every budget starts afresh)"
        )
    for name in added:
        log.warning("stream %r joins the store %s with share %g", name, where, now.streams[name])
    for name in retired.keys() - stored.retired.keys():
        log.warning(
            "stream %r is retired in the store %s: its share %g stays spent",
            name,
            where,
            retired[name],
        )
    withdrawn = registration_plan(stored, now).withdrawn
    if withdrawn:
        log.warning(
            "%d user(s) withdrawn from the registration table of the store %s: they stop "
            "counting from each stream's next slot; their seats stay", len(withdrawn), where,
        )  # fmt: skip
    return replace(now, retired=retired, withdrawn=stored.withdrawn | withdrawn)


def start(
    key: NoiseKey,
    recovery_dir: str | Path | None,
    manifest: Manifest,
    *,
    retiring: frozenset[str] = frozenset(),
    releases: tuple[KafkaSettings, str] | None = None,
) -> Incarnation:
    """What ``privstream run`` does before building its flow: the run's incarnation
    (``begin``); for a new one on Kafka (``releases``: the settings and release topic), the
    slots already published (``republish.last_published``), kept with the store; and the log
    line per stream saying what is skipped."""
    from privstream.runtime.republish import announce, last_published

    incarnation = begin(key, recovery_dir, manifest, retiring)
    if incarnation.new and releases is not None:
        incarnation = with_floors(incarnation, recovery_dir, last_published(*releases))
    elif incarnation.withdrawing and releases is not None:  # withdraw after what is published
        incarnation = replace(incarnation, released=last_published(*releases))
    announce(incarnation.floors, list(manifest.streams))
    return incarnation


def refuse_overwrite(incarnation: Incarnation, path: str | Path | None, allowed: bool) -> None:
    """A new secure incarnation writing to files would replace ``path``'s releases with a
    second computation of the same release ids: refused unless ``allowed``
    (``--overwrite-output``) or the file holds an insecure run's public releases."""
    if path is None or allowed or not incarnation.created or incarnation.key.insecure:
        return
    file = Path(path)
    if file.is_file() and file.stat().st_size > 0 and not _insecure_output(file):
        raise ValueError(
            f"{file} already holds releases of an earlier run: a new run would publish the same "
            "release ids again with fresh noise (together they spend the budget twice). Resume "
            "that run's --recovery-dir, write elsewhere, or pass --overwrite-output if the old "
            "releases were never published"
        )


def _insecure_output(file: Path) -> bool:
    """Whether ``file``'s first release says it was drawn from a public seed (nothing private
    to protect: such outputs may be replaced)."""
    with file.open("rb") as f:
        first = f.readline(1 << 20)
    try:
        return json.loads(first).get("insecure_seed") is True
    except (ValueError, AttributeError):
        return False
