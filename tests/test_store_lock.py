"""One writer per recovery store, and a read-only store said to be read-only (issue 27, items
10 and 13)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from privstream.runtime.recovery import prepare_store

ROOT = Path(__file__).resolve().parents[1]
OPEN_STORE = """
import sys
from privstream.runtime.recovery import prepare_store
from privstream.runtime.store_lock import lock_store
try:
    lock_store(sys.argv[1], int(sys.argv[2]))
    prepare_store(sys.argv[1])
except ValueError as exc:
    print(exc)
    sys.exit(2)
print("opened")
sys.stdout.flush()
if len(sys.argv) > 3:
    import time; time.sleep(float(sys.argv[3]))
"""


def _open(
    store: Path, process_id: int = 0, hold: float | None = None, prefix: list[str] | None = None
) -> subprocess.Popen[str]:
    argv = [*(prefix or []), sys.executable, "-c", OPEN_STORE, str(store), str(process_id)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([*argv, *([] if hold is None else [str(hold)])], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip


def test_a_second_run_on_a_held_store_is_refused(tmp_path: Path) -> None:
    """Before: a restarted launcher ran a second cluster beside the first on one store (596
    duplicate releases). Now the second run's process 0 fails at start, naming the holder."""
    store = tmp_path / "recovery"
    first = _open(store, 0, hold=30)
    assert first.stdout is not None and first.stdout.readline().strip() == "opened"
    try:
        second = _open(store, 0)
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 2
        assert "in use by another privstream run" in out and f"pid {first.pid}" in out
        other_member = _open(store, 1)  # a cluster member under another process id: shared
        assert other_member.communicate(timeout=60)[0].strip() == "opened"
    finally:
        first.kill()
        first.communicate()
    again = _open(store, 0)  # the kernel released the killed holder's lock: no stale lock
    assert again.communicate(timeout=60)[0].strip() == "opened"


def test_the_lock_is_taken_once_per_process(tmp_path: Path) -> None:
    from privstream.runtime.store_lock import lock_store

    lock_store(tmp_path / "s", 5)
    lock_store(tmp_path / "s", 5)  # the same process again (a second flow in one process)
    assert (tmp_path / "s" / ".privstream-process-5.lock").read_text().strip() == str(os.getpid())


def _read_only_mounts() -> bool:
    """Whether this host lets the test bind-mount a directory read-only (root, mount namespaces)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _read_only_mounts(), reason="needs unshare -m to mount read-only")
def test_a_read_only_store_is_reported_read_only_not_lost(tmp_path: Path) -> None:
    """Before: an intact store on a read-only mount was refused with "Restore all partition
    files ... from one backup" (SQLite cannot open it without its shared-memory file). Now it
    says read-only, and every file is left as it was."""
    store = tmp_path / "recovery"
    prepare_store(store)
    _write_snapshot_row(store)
    before = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    mount = f'mount --bind -o ro {store} {store} && exec "$@"'
    child = _open(store, 0, prefix=["unshare", "-m", "--propagation", "private",
                                    "sh", "-c", mount, "sh"])  # fmt: skip
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 2, out
    assert "is read-only for this process" in out
    assert "Do not restore it from a backup" in out
    assert "Restore all partition files" not in out
    after = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    assert after == before


def _write_snapshot_row(store: Path) -> None:
    """Give the store a snapshot row, as a store that ran has (so it may never be rebuilt)."""
    import sqlite3

    (db_file,) = store.glob("*.sqlite3")
    with sqlite3.connect(db_file) as db:
        db.execute(
            "INSERT INTO snaps (step_id, state_key, snap_epoch, ser_change) VALUES (?, ?, ?, ?)",
            ("flow.step", "key", 1, b"state"),
        )
    db.close()
