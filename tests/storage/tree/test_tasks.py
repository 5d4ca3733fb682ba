"""Tasks on the tree: delete is one rename into the trash (behaviour: tests/conformance/)."""

from __future__ import annotations

import io
import os

import pytest

from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import assert_consistent, read_digest, temp_files


def test_an_empty_project_has_no_directory(store: TaskStore, scope: Scope) -> None:
    assert store.list_tasks(scope).total == 0
    assert not store.layout.project_dir(scope).exists()


def test_owner_is_kept_in_task_json(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x", actor="tok-a")
    store.put_turn(scope, "t1", 1, meta={}, summary_md="x", actor="tok-b")
    assert store.owner_of(scope, "t1") == "tok-a"


def test_delete_is_one_rename_into_the_trash(
    store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_turn(scope, "doomed", 0, meta={}, summary_md="doomed summary")
    store.put_artifact(scope, "doomed", 0, "a.bin", io.BytesIO(b"abc"), content_type="x/y")
    clock.advance(seconds=1)
    store.put_turn(scope, "kept", 0, meta={}, summary_md="kept summary")
    task_dir = store.layout.task_dir(scope, "doomed")
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def spy(src: object, dst: object, *args: object, **kwargs: object) -> None:
        renames.append((str(src), str(dst)))
        real_rename(src, dst, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", spy)
    store.delete_task(scope, "doomed")
    monkeypatch.undo()
    # One rename of the whole task directory into the trash (by names relative to the two
    # checked parent directories), then removal.
    assert [src for src, _ in renames] == [task_dir.name]
    assert renames[0][1].endswith(f"-{task_dir.name}")
    assert not task_dir.exists()
    assert list(store.layout.trash_dir().iterdir()) == []
    assert_consistent(store, scope)
    assert temp_files(store.layout.root) == []


def test_delete_is_one_rename_so_a_failure_after_it_leaves_no_half_task(
    store: TaskStore, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_turn(scope, "doomed", 0, meta={}, summary_md="d")
    store.put_turn(scope, "doomed", 1, meta={}, summary_md="d1")
    import shutil

    # The removal after the rename fails (e.g. the process dies): the task is gone anyway.
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    store.delete_task(scope, "doomed")
    monkeypatch.undo()
    with pytest.raises(NotFound):
        store.get_task(scope, "doomed")
    assert store.list_tasks(scope).total == 0
    assert "## doomed" not in read_digest(store, scope)
    leftovers = list(store.layout.trash_dir().iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.endswith("-doomed")
