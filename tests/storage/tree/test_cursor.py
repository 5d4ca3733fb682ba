"""Cursors on the tree: the key is a file of the root, shared by every store on it
(behaviour: tests/conformance/test_cursor.py)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock

SCOPE = Scope("acme", "web")


def _store(root: Path, clock: FixedClock | None = None) -> TaskStore:
    return TaskStore(root, clock=clock or FixedClock(), lock_timeout=5.0)


def _valid_cursor(store: TaskStore, scope: Scope = SCOPE) -> str:
    for i in range(3):
        store.put_turn(scope, f"t{i}", 0, meta={}, summary_md="x")
    cursor = store.list_tasks(scope, limit=1).next_cursor
    assert cursor is not None
    return cursor


def test_a_cursor_signed_by_another_root_is_refused(tmp_path: Path) -> None:
    cursor = _valid_cursor(_store(tmp_path / "a"))
    other = _store(tmp_path / "b")
    _valid_cursor(other)
    with pytest.raises(InvalidName):
        other.list_tasks(SCOPE, cursor=cursor)


def test_the_cursor_key_is_shared_by_every_store_on_a_root(tmp_path: Path) -> None:
    cursor = _valid_cursor(_store(tmp_path / "root"))
    assert len(_store(tmp_path / "root").list_tasks(SCOPE, cursor=cursor).tasks) == 2


_B64 = string.ascii_letters + string.digits + "-_"
