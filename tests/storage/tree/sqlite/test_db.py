"""open_index: a busy database is a LockTimeout (503), never a bare OperationalError (500)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from app.storage.core.errors import LockTimeout
from app.storage.tree.sqlite.db import open_index


def _rollback_db_locked_exclusively(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # rollback-journal mode: readers are shut out too
    holder.execute("INSERT INTO t VALUES (1)")
    return holder


def test_a_database_busy_past_the_timeout_is_a_lock_timeout(tmp_path: Path) -> None:
    holder = _rollback_db_locked_exclusively(tmp_path / "x.sqlite3")
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            open_index(str(tmp_path / "x.sqlite3"), timeout=0.2)
        assert time.monotonic() - started < 5
    finally:
        holder.execute("COMMIT")
        holder.close()


def test_a_database_busy_for_a_moment_is_waited_for_and_switched_to_wal(tmp_path: Path) -> None:
    holder = _rollback_db_locked_exclusively(tmp_path / "x.sqlite3")

    def release() -> None:
        time.sleep(0.3)
        holder.execute("COMMIT")

    t = threading.Thread(target=release)
    t.start()
    try:
        conn = open_index(str(tmp_path / "x.sqlite3"), timeout=10)
    finally:
        t.join()
        holder.close()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    conn.close()
