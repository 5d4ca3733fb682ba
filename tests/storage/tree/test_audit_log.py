"""The tree's audit log keeps its connection between events, and never writes through one to a
file that was replaced or removed by hand."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from app.storage.core.names import Scope
from app.storage.tree.audit import TreeAudit
from app.storage.tree.backend import TreeStorage
from tests.conftest import FixedClock
from tests.storage._helpers import open_fds


@pytest.fixture
def store(tmp_path: Path, clock: FixedClock) -> TreeStorage:
    return TreeStorage(tmp_path / "root", clock=clock, lock_timeout=5.0)


def _record(store: TreeStorage, scope: Scope, subject: str) -> None:
    store.audit_log.record(
        scope.tenant,
        scope.project,
        actor="tok",
        kind="task",
        action="created",
        subject=subject,
        detail={},
    )


def _subjects(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [s for (s,) in conn.execute("SELECT subject FROM events ORDER BY at_us, id")]
    finally:
        conn.close()


def _opened(path: Path) -> set[tuple[str, str]]:
    """This process's descriptors of ``path`` itself (not its -wal or -shm)."""
    return open_fds(path, path.name)


def test_events_reuse_one_connection(store: TreeStorage, scope: Scope) -> None:
    TreeAudit._pool.forget(lambda _key: True)
    path = store.layout.audit()
    _record(store, scope, "first")
    held = _opened(path)
    assert len(held) == 1
    for n in range(20):
        _record(store, scope, f"e{n}")
    assert _opened(path) == held
    assert (path.parent / f"{path.name}-wal").exists()  # no close between events checkpointed it
    assert len(store.audit_log.page(scope, limit=50).events) == 21


def test_a_file_replaced_or_removed_by_hand_is_opened_afresh(
    store: TreeStorage, scope: Scope, tmp_path: Path
) -> None:
    path = store.layout.audit()
    _record(store, scope, "before")
    # A person copies the log aside and back (a new inode), as a restore would.
    aside = tmp_path / "aside.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"VACUUM INTO '{aside}'")
    conn.close()
    shutil.move(str(aside), str(path))
    _record(store, scope, "after the copy")
    assert _subjects(path) == ["before", "after the copy"]
    path.unlink()
    _record(store, scope, "after the removal")
    assert _subjects(path) == ["after the removal"]
