"""A durable local store for the device's ledger: one JSON file, replaced atomically.

:meth:`FileStore.save` writes a temporary file next to the store, fsyncs it, renames it over the
store (``os.replace``, atomic on POSIX and Windows) and fsyncs the folder, so after a crash the
store holds either the old or the new ledger, never a mix. The file carries a SHA-256 of its
content: a store that does not parse or whose checksum does not match is a :class:`StoreError`,
and the device then refuses to report rather than start again from an empty (unspent) budget.
A missing store is an error too unless the store was opened with ``create=True`` (first run).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Final

FORMAT: Final = "privstream-client-ledger"
VERSION: Final = 1


class StoreError(Exception):
    """The store cannot be read or written; the device must not report."""


def _digest(state: dict[str, Any]) -> str:
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class FileStore:
    """The ledger's JSON file at ``path``; ``create=True`` only on the device's first run."""

    def __init__(self, path: str | os.PathLike[str], create: bool = False) -> None:
        self.path = Path(path)
        self.create = create

    def load(self) -> dict[str, Any]:
        """The stored ledger state (``{}`` for a new store); ``StoreError`` if missing or corrupt."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            if self.create:
                return {}
            raise StoreError(
                f"ledger store {self.path} is missing: refusing to report (a lost store must not reset the budget)"
            ) from None
        except OSError as exc:
            raise StoreError(f"ledger store {self.path} unreadable: {exc.strerror}") from None
        try:
            doc = json.loads(raw)
            ok = (
                isinstance(doc, dict)
                and doc.get("format") == FORMAT
                and doc.get("version") == VERSION
            )
            state = doc["state"] if ok else None
            if not isinstance(state, dict) or doc.get("sha256") != _digest(state):
                raise ValueError("format, version or checksum mismatch")
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"ledger store {self.path} is corrupt ({exc}): refusing to report"
            ) from None
        return state

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` durably and atomically (temp file, fsync, rename, fsync folder)."""
        doc = {"format": FORMAT, "version": VERSION, "state": state, "sha256": _digest(state)}
        data = json.dumps(doc, sort_keys=True, allow_nan=False).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            raise StoreError(f"ledger store {self.path} not written: {exc.strerror}") from None
        self.create = False  # from now on a missing store is a lost store


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); a platform without directory fds skips it."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
