"""One writer per recovery store: an exclusive ``flock`` held for the life of the process.

Two runs on one store interleave their snapshots: both publish the same slots (a restarted
launcher beside its still-running cluster released 596 duplicates) and the ledgers of one
overwrite the other's. ``lock_store`` takes ``DIR/.privstream-process-I.lock`` (``I`` the
Bytewax process id, 0 when alone) with ``LOCK_EX | LOCK_NB`` and keeps the descriptor open
until the process exits, when the kernel releases it (a SIGKILL included: no stale lock).

The members of one cluster share the store legitimately, each under its own process id; every
run has a process 0, so a second single process or a second cluster of any size on the same
store fails at start, with the holder's pid in the message. A store the process cannot write
(a read-only mount or permissions) is said to be that, not "restore from a backup": it is
intact, only unusable by this process.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from privstream.runtime.recovery import RecoveryStoreError

LOCK_NAME = ".privstream-process-{}.lock"
_HELD: dict[tuple[str, int], int] = {}  # (store, process id) -> open descriptor, never closed


def lock_store(path: str | Path, process_id: int = 0) -> None:
    """Hold the exclusive lock of ``path`` for ``process_id`` until this process exits (a
    second call for the same pair is a no-op); ``RecoveryStoreError`` if another process holds
    it or the store is read-only. Creates ``path`` if missing (``prepare_store`` keeps it)."""
    path = Path(path)
    key = (str(path.resolve()), process_id)
    if key in _HELD:
        return
    lock = path / LOCK_NAME.format(process_id)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RecoveryStoreError(
            f"recovery store {path} is in use by another privstream run (process id "
            f"{process_id}{holder}): two runs on one store would publish every slot twice and "
            "overwrite each other's privacy ledgers. Stop the other run (or its cluster "
            "launcher) first, or give this run its own --recovery-dir."
        ) from None
    if not os.access(path, os.W_OK):  # root passes; a read-only mount failed the open above
        os.close(fd)
        raise _unwritable(path, PermissionError(errno.EACCES, "Permission denied"))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
    return f", pid {pid}" if pid.isdigit() else ""


def _unwritable(path: Path, exc: OSError) -> RecoveryStoreError:
    """A store privstream cannot write: intact as far as anyone knows, so no backup advice."""
    why = "read-only" if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else "unusable"
    return RecoveryStoreError(
        f"recovery store {path} is {why} for this process ({exc.strerror or exc}): privstream "
        "must write snapshots to it. Its files are untouched; mount it read-write (or give uid "
        f"{os.getuid()} write access) and run again. Do not restore it from a backup."
    )
