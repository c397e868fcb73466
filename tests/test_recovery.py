"""The recovery store is made atomically, kept when complete, rebuilt only when provably empty,
and refused with a clear message when it may hold snapshots (``privstream/runtime/recovery.py``)."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.recovery import NoPartitionsError, RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from privstream.cli.commands import main
from privstream.runtime.recovery import (
    STAGING,
    RecoveryStoreError,
    check_store,
    prepare_store,
)

ZERO = timedelta(0)


def keep_max(flow_out: list[Any], items: list[Any]) -> Dataflow:
    """Bytewax's own recovery example: the running maximum per key, in recoverable state."""

    def step(state: int | None, value: int) -> tuple[int, tuple[int, int]]:
        top = max(state or 0, value)
        return top, top

    flow = Dataflow("keep_max")
    stream = op.input("inp", flow, TestingSource(items))
    op.output("out", op.stateful_map("max", stream, step), TestingSink(flow_out))
    return flow


ITEMS = [("a", 4), ("b", 4), TestingSource.EOF(), ("a", 1), ("b", 5)]


def run_keep_max(store: Path) -> list[Any]:
    out: list[Any] = []
    run_main(keep_max(out, ITEMS), epoch_interval=ZERO, recovery_config=RecoveryConfig(store))
    return out


def store_with_snapshots(store: Path) -> Path:
    """A real store after a run that snapshotted state (keys a and b at 4)."""
    assert prepare_store(store) == "created"
    assert run_keep_max(store) == [("a", 4), ("b", 4)]
    assert all(p.snapshots for p in check_store(store).partitions)
    return store


def digest(store: Path) -> dict[str, str]:
    """The content of every partition file (sidecars aside)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("*.sqlite3"))
    }


def sql(file: Path, *statements: str) -> None:
    with sqlite3.connect(file) as db:
        for statement in statements:
            db.execute(statement)
    db.close()


def assert_complete_one_partition(store: Path) -> None:
    found = check_store(store)
    assert found.complete, found.problems
    assert [(p.path.name, p.records) for p in found.partitions] == [("part-0.sqlite3", ((0, 1),))]
    assert not any(p.name.startswith(STAGING) for p in store.iterdir())


# -- stores that are created or rebuilt ---------------------------------------------------------


def test_a_missing_directory_is_created_with_one_partition(tmp_path: Path) -> None:
    store = tmp_path / "a" / "b" / "store"
    assert prepare_store(store) == "created"
    assert_complete_one_partition(store)
    assert run_keep_max(store) == [("a", 4), ("b", 4)]


def test_an_empty_directory_is_initialised(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(NoPartitionsError):  # what Bytewax does with it
        run_keep_max(store)
    assert prepare_store(store) == "created"
    assert_complete_one_partition(store)


def test_a_zero_byte_partition_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "part-0.sqlite3").touch()  # a kill right after the old init_db_dir created it
    (store / "part-0.sqlite3-wal").write_bytes(b"\0" * 100)  # SQLite drops it: no pages
    with caplog.at_level(logging.WARNING, "privstream.runtime.recovery"):
        assert prepare_store(store) == "rebuilt"
    assert "part-0.sqlite3 is empty (0 bytes)" in caplog.text
    assert "held no snapshot" in caplog.text
    assert not (store / "part-0.sqlite3-wal").exists()  # never replayed into the new file
    assert_complete_one_partition(store)


def test_the_file_bytewax_leaves_after_opening_a_zero_byte_partition_is_rebuilt(
    tmp_path: Path,
) -> None:
    """The audit's store: a 0-byte part-0 that Bytewax opened once (schema, no partition row),
    on which every later start failed with "No recovery partitions found"."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "part-0.sqlite3").touch()
    with pytest.raises(NoPartitionsError):
        run_keep_max(store)
    found = check_store(store)
    assert found.problems == ("part-0.sqlite3 has no partition records, not 1",)
    assert found.empty and found.partitions[0].size > 0
    assert prepare_store(store) == "rebuilt"
    assert_complete_one_partition(store)
    assert run_keep_max(store) == [("a", 4), ("b", 4)]


def test_a_header_only_file_is_rebuilt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    with sqlite3.connect(store / "part-0.sqlite3") as db:  # killed after the first pragma
        db.execute("PRAGMA journal_mode=WAL")
    db.close()
    assert check_store(store).problems == ("part-0.sqlite3 has no partition records, not 1",)
    assert prepare_store(store) == "rebuilt"
    assert_complete_one_partition(store)


def test_a_set_missing_a_partition_without_snapshots_is_rebuilt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    init_db_dir(store, 3)
    (store / "part-1.sqlite3").unlink()
    assert check_store(store).problems == ("partitions [1] of 3 are missing",)
    assert prepare_store(store) == "rebuilt"
    assert_complete_one_partition(store)


def test_partitions_disagreeing_on_their_count_without_snapshots_are_rebuilt(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    init_db_dir(store, 2)
    sql(store / "part-1.sqlite3", "UPDATE parts SET part_count = 3")
    assert check_store(store).problems == ("the partitions disagree on their count: [2, 3]",)
    assert prepare_store(store) == "rebuilt"
    assert_complete_one_partition(store)


def test_a_dead_process_staging_directory_is_removed_a_live_one_kept(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = store / f"{STAGING}{dead.stdout.strip()}-x"
    live = store / f"{STAGING}{os.getpid()}-y"
    for staging in (stale, live):
        staging.mkdir()
        (staging / "part-0.sqlite3").touch()
    assert prepare_store(store) == "created"
    assert not stale.exists() and live.exists()
    assert [p.path.name for p in check_store(store).partitions] == ["part-0.sqlite3"]


def test_a_filesystem_without_hard_links_gets_its_store_by_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(_src: object, _dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = tmp_path / "store"
    assert prepare_store(store) == "created"
    assert_complete_one_partition(store)


# -- stores that are kept -----------------------------------------------------------------------


def test_a_store_with_snapshots_is_kept_and_resumed(tmp_path: Path) -> None:
    store = store_with_snapshots(tmp_path / "store")
    before = digest(store)
    assert prepare_store(store) == "kept"
    assert digest(store) == before
    # resumed: a stays at 4 (a fresh state would say 1), b moves to 5
    assert run_keep_max(store) == [("a", 4), ("b", 5)]


def test_a_complete_store_of_several_partitions_is_kept(tmp_path: Path) -> None:
    """Bytewax's partition count is independent of the workers: any complete set resumes."""
    store = tmp_path / "store"
    store.mkdir()
    init_db_dir(store, 3)
    assert run_keep_max(store) == [("a", 4), ("b", 4)]
    before = digest(store)
    assert prepare_store(store) == "kept"
    assert digest(store) == before
    assert run_keep_max(store) == [("a", 4), ("b", 5)]


# -- stores that are refused --------------------------------------------------------------------


def refused(store: Path) -> str:
    before = digest(store)
    with pytest.raises(RecoveryStoreError) as caught:
        prepare_store(store)
    assert digest(store) == before, "a refused store must not be changed"
    message = str(caught.value)
    assert "may hold snapshots" in message and "reset every user's privacy budget" in message
    assert "Restore all partition files" in message
    return message


def test_a_store_with_snapshots_and_no_partition_record_is_refused(tmp_path: Path) -> None:
    store = store_with_snapshots(tmp_path / "store")
    sql(store / "part-0.sqlite3", "DELETE FROM parts")
    message = refused(store)
    assert "part-0.sqlite3 has no partition records, not 1" in message


def test_a_store_with_snapshots_and_a_missing_partition_is_refused(tmp_path: Path) -> None:
    store = store_with_snapshots(tmp_path / "store")
    sql(store / "part-0.sqlite3", "UPDATE parts SET part_count = 2")
    assert "partitions [1] of 2 are missing" in refused(store)


def test_an_unreadable_partition_is_refused(tmp_path: Path) -> None:
    store = store_with_snapshots(tmp_path / "store")
    part = store / "part-0.sqlite3"
    part.write_bytes(b"garbage!" * 8 + part.read_bytes()[64:])  # header destroyed
    assert "part-0.sqlite3 is unreadable" in refused(store)


def test_a_truncated_store_is_refused(tmp_path: Path) -> None:
    store = store_with_snapshots(tmp_path / "store")
    part = store / "part-0.sqlite3"
    part.write_bytes(part.read_bytes()[:1000])
    assert "part-0.sqlite3 is unreadable" in refused(store)


def test_a_write_ahead_log_without_its_database_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "part-0.sqlite3-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\0" * 60)
    message = refused(store)
    assert "part-0.sqlite3-wal is a write-ahead log without its database" in message


# -- the command line ---------------------------------------------------------------------------


def run_args(tmp_path: Path, store: Path) -> list[str]:
    events = tmp_path / "events.csv"
    rows = "".join(f"u{u},{t},{u % 2}\n" for t in (1, 2, 3) for u in range(20))
    events.write_text("user,slot,value\n" + rows)
    return ["run", "ldp-ids", "--mechanism", "LBU", "--dataset", f"file:{events}", "--users", "20",
            "--window", "2", "--insecure-seed", "1", "--recovery-dir", str(store),
            "--out", str(tmp_path / "r.jsonl"), "--no-progress"]  # fmt: skip


def test_run_on_a_pre_created_empty_directory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    assert main(run_args(tmp_path, store)) == 0
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3
    assert all(p.snapshots for p in check_store(store).partitions)


def test_run_on_a_damaged_store_with_snapshots_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    assert main(run_args(tmp_path, store)) == 0
    sql(store / "part-0.sqlite3", "DELETE FROM parts")
    assert main(run_args(tmp_path, store)) == 2
    err = capsys.readouterr().err
    assert f"privstream: error: recovery store {store} cannot be resumed" in err
    assert "part-0.sqlite3 has no partition records" in err
