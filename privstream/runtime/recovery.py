"""The Bytewax recovery store of ``privstream run --recovery-dir DIR``: made atomically, checked
before every run, rebuilt only when it provably holds nothing.

Bytewax 0.21 keeps a run's state in *recovery partitions*: SQLite files in DIR. It opens every
``*.sqlite3`` file at the top of DIR and reads its ``parts`` row ``(part_index, part_count)``;
state keys are hashed over ``part_count`` partitions, so a run needs the complete set
``0..part_count-1`` with one count. That count is fixed when the store is made
(``init_db_dir(DIR, count)``) and is independent of the number of workers (Bytewax rescales);
one process must hold every partition locally. privstream makes one partition
(``PARTITIONS``), and keeps any complete set it finds.

``prepare_store`` guarantees that DIR is a complete store when it returns, without ever
discarding a snapshot:

* **missing or empty** (no ``*.sqlite3``; other entries such as ``lost+found`` are left
  alone): created. DIR is made first (``mkdir``); the partitions are built in a staging
  directory *inside* it (the same filesystem, even when DIR is a mount point or was made by the
  operator) and hard-linked into place, so a kill at any moment leaves no partition file or
  complete ones, never a half-made one (with several partitions, possibly not all of them: an
  empty incomplete set, rebuilt below). A leftover staging directory is removed by the next
  start once its process is gone.
* **complete** (every partition readable, one count, no index missing): kept as it is.
* **half-made** (a 0-byte or schema-only file, a missing partition record or partition, counts
  that disagree) and *provably empty* (every file is 0 bytes, or a readable, intact SQLite
  database whose ``snaps`` table is missing or has no row): rebuilt, with a warning. This is
  what a kill during the old, non-atomic initialisation left behind.
* **anything else** (an unreadable file, a write-ahead log without its database, or a
  half-made set with snapshots): ``RecoveryStoreError`` saying what is wrong and what to do.
  A store with snapshots holds the privacy ledgers: starting it over would reset budgets.

A 0-byte file counts as empty even if a ``-wal`` file lies next to it: SQLite discards the WAL of
a database without pages on open, so nothing in it can ever be resumed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import cast

log = logging.getLogger(__name__)

PARTITIONS = 1  # what privstream creates: one process, any number of workers
SUFFIX = ".sqlite3"  # Bytewax opens every file with this extension at the top of DIR
STAGING = ".privstream-staging-"  # + "<pid>-<random>": a store being built inside DIR


class RecoveryStoreError(ValueError):
    """A recovery store that can neither be resumed nor safely rebuilt."""


class _Raced(Exception):
    """Somebody else published a partition while this process was building the store."""


@dataclass(frozen=True)
class Partition:
    """One ``*.sqlite3`` file of a store.

    ``records`` are its ``parts`` rows ``(part_index, part_count)`` and ``snapshots`` whether its
    ``snaps`` table has a row; both are None when the file cannot be read (``error`` says why).
    """

    path: Path
    size: int
    records: tuple[tuple[int, int], ...] | None
    snapshots: bool | None
    error: str = ""

    @property
    def empty(self) -> bool:
        """Provably holds no snapshot."""
        return self.size == 0 or self.snapshots is False


@dataclass(frozen=True)
class StoreCheck:
    """What ``check_store`` found in a recovery directory."""

    path: Path
    exists: bool
    partitions: tuple[Partition, ...]
    orphans: tuple[Path, ...]  # write-ahead logs whose database file is missing
    problems: tuple[str, ...]  # why Bytewax could not resume the set; () when it can

    @property
    def complete(self) -> bool:
        return self.exists and not self.problems

    @property
    def empty(self) -> bool:
        """No partition file holds a snapshot and no stray write-ahead log might."""
        return not self.orphans and all(p.empty for p in self.partitions)


def read_partition(path: Path) -> Partition:
    """Read ``path``'s partition records and whether it holds snapshots, opening it read-only
    (a 0-byte file is not opened: SQLite would delete a ``-wal`` beside it). A file that claims
    to hold no snapshot must also pass SQLite's ``quick_check``."""
    size = path.stat().st_size
    if size == 0:
        return Partition(path, 0, (), False)
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            records: tuple[tuple[int, int], ...] = ()
            if "parts" in tables:
                rows = db.execute("SELECT part_index, part_count FROM parts").fetchall()
                records = tuple((int(i), int(c)) for i, c in rows)
            snapshots = "snaps" in tables and bool(
                db.execute("SELECT EXISTS (SELECT 1 FROM snaps)").fetchone()[0]
            )
            if not snapshots:
                (verdict,) = db.execute("PRAGMA quick_check").fetchone()
                if verdict != "ok":
                    raise sqlite3.DatabaseError(f"quick_check: {verdict}")
    except sqlite3.Error as exc:
        return Partition(path, size, None, None, f"unreadable ({exc})")
    return Partition(path, size, records, snapshots)


def set_problems(partitions: Sequence[Partition]) -> list[str]:
    """Why Bytewax could not resume from ``partitions``; [] for a complete set."""
    if not partitions:
        return [f"no recovery partition (*{SUFFIX})"]
    problems: list[str] = []
    where: dict[tuple[int, int], list[str]] = {}
    for part in partitions:
        name = part.path.name
        if part.records is None:
            problems.append(f"{name} is {part.error}")
        elif part.size == 0:
            problems.append(f"{name} is empty (0 bytes)")
        elif len(part.records) != 1:
            problems.append(f"{name} has {len(part.records) or 'no'} partition records, not 1")
        else:
            where.setdefault(part.records[0], []).append(name)
    for (index, _count), names in where.items():
        if len(names) > 1:
            problems.append(f"{', '.join(names)} all claim partition {index}")
    counts = sorted({count for _, count in where})
    if len(counts) > 1:
        problems.append(f"the partitions disagree on their count: {counts}")
    elif counts:
        missing = sorted(set(range(counts[0])) - {index for index, _ in where})
        if missing:
            problems.append(f"partitions {missing} of {counts[0]} are missing")
    return problems


def check_store(path: Path) -> StoreCheck:
    """Inspect the recovery directory ``path`` without changing anything in it."""
    if not path.exists():
        return StoreCheck(path, False, (), (), ("it does not exist",))
    if not path.is_dir():
        raise RecoveryStoreError(f"recovery store {path} is not a directory")
    entries = sorted(path.iterdir())
    partitions = tuple(read_partition(p) for p in entries if p.suffix == SUFFIX and p.is_file())
    orphans = tuple(
        p
        for p in entries
        if p.name.endswith(SUFFIX + "-wal")
        and p.stat().st_size > 0
        and not p.with_name(p.name[: -len("-wal")]).exists()
    )
    problems = set_problems(partitions)
    problems += [f"{p.name} is a write-ahead log without its database" for p in orphans]
    return StoreCheck(path, True, partitions, orphans, tuple(problems))


def prepare_store(path: str | Path, partitions: int = PARTITIONS) -> str:
    """Make ``path`` a complete recovery store Bytewax can run from; returns what was done:
    ``"kept"``, ``"created"`` or ``"rebuilt"``. Never removes a file that may hold a snapshot;
    raises ``RecoveryStoreError`` (what is wrong, what to do) when it would have to."""
    path = Path(path)
    for _attempt in range(3):
        try:
            return _prepare_once(path, partitions)
        except _Raced:
            continue
    raise RecoveryStoreError(
        f"recovery store {path} kept changing while privstream prepared it: is another "
        "privstream run using it? Run one process per recovery store."
    )


def _prepare_once(path: Path, partitions: int) -> str:
    found = check_store(path)
    if found.complete:
        _remove_stale_staging(path)
        return "kept"
    if not found.empty:
        raise RecoveryStoreError(_refusal(found))
    if not found.exists:
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise _Raced from None
        _fsync_dir(path.parent)
    _remove_stale_staging(path)
    _remove_partitions(path, found.partitions)  # provably empty: nothing is lost
    _create(path, partitions)
    if found.partitions:
        log.warning(
            "recovery store %s was half-made (%s) and held no snapshot: rebuilt it with %d "
            "partition(s)",
            path, "; ".join(found.problems), partitions,
        )  # fmt: skip
        return "rebuilt"
    log.info("created recovery store %s with %d partition(s)", path, partitions)
    return "created"


def _refusal(found: StoreCheck) -> str:
    holding = [p.path.name for p in found.partitions if not p.empty] + [
        p.name for p in found.orphans
    ]
    return (
        f"recovery store {found.path} cannot be resumed: {'; '.join(found.problems)}. "
        f"{', '.join(holding)} may hold snapshots (privacy ledgers, open slots, input offsets), "
        "so privstream will not rebuild it: starting over would reset every user's privacy "
        f"budget. Restore all partition files (*{SUFFIX}) of {found.path} from one backup and "
        "run again. Moving the directory away to start empty is safe only if nobody needs "
        "these ledgers any more: the streams' users would be granted a fresh budget."
    )


def _create(path: Path, partitions: int) -> None:
    """Build ``partitions`` partitions in a staging directory inside ``path`` and hard-link them
    into place (``link`` never replaces a file another process just published)."""
    from bytewax.recovery import init_db_dir

    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=path))
    try:
        cast(Callable[[Path, int], None], init_db_dir)(staging, partitions)
        built = sorted(staging.glob(f"*{SUFFIX}"))
        problems = set_problems([read_partition(file) for file in built])
        if problems or len(built) != partitions:
            raise RecoveryStoreError(f"init_db_dir built a broken store: {'; '.join(problems)}")
        for file in built:
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        for file in built:
            _publish(file, path / file.name)
        _fsync_dir(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(file: Path, target: Path) -> None:
    """Put ``file`` at ``target`` atomically without replacing an existing file: a hard link,
    or a rename on a filesystem without hard links (replacing only in a tiny race window)."""
    try:
        os.link(file, target)
    except FileExistsError:
        raise _Raced from None
    except OSError:  # EPERM/ENOTSUP: no hard links here
        if target.exists():
            raise _Raced from None
        os.rename(file, target)


def _remove_partitions(path: Path, partitions: Sequence[Partition]) -> None:
    """Remove every write-ahead log, index and journal at the top of ``path``
    (``*.sqlite3-*``), then the ``partitions``' files: logs first, since one left beside a new
    file of the same name would be replayed into it."""
    for sidecar in path.glob(f"*{SUFFIX}-*"):
        sidecar.unlink(missing_ok=True)
    for part in partitions:
        part.path.unlink(missing_ok=True)


def _remove_stale_staging(path: Path) -> None:
    """Remove staging directories whose process has exited (killed while building)."""
    for entry in path.glob(f"{STAGING}*"):
        pid = entry.name[len(STAGING) :].split("-", 1)[0]
        if entry.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    """Make the directory's entries durable (a power loss after a rename or link)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
