"""Task index, listing (order, limit, total, cursor) and delete."""

from __future__ import annotations

import io
import os
from datetime import timedelta

import pytest

from app.storage import InvalidName, NotFound, NotOwner, Scope, TaskStore
from app.storage.clock import iso
from tests.conftest import T0, FixedClock
from tests.storage._helpers import assert_consistent, read_digest, temp_files


def test_task_index_has_turns_meta_artifacts_owner_and_times(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 2, meta={"m": 2}, summary_md="two", actor="tok-a")
    clock.advance(hours=1)
    store.put_turn(scope, "t1", 0, meta={"m": 0}, summary_md="zero", actor="tok-b")
    clock.advance(hours=1)
    store.put_artifact(scope, "t1", 2, "log.txt", io.BytesIO(b"log"), content_type="text/plain")
    index = store.get_task(scope, "t1")
    assert index.task_id == "t1"
    assert index.owner == "tok-a"  # the creator, not the last writer
    assert index.created_at == iso(T0)
    assert index.updated_at == iso(T0 + timedelta(hours=2))
    assert index.retain_until == iso(T0 + timedelta(days=30, hours=2))
    assert [t.turn for t in index.turns] == [0, 2]
    assert [t.meta for t in index.turns] == [{"m": 0}, {"m": 2}]
    assert [t.artifacts for t in index.turns] == [(), ("log.txt",)]
    assert index.turns[1].created_at == iso(T0)
    assert index.turns[1].updated_at == iso(T0 + timedelta(hours=2))
    assert index.latest_turn == 2 and index.turn_count == 2
    assert store.owner_of(scope, "t1") == "tok-a"
    assert_consistent(store, scope)


def test_get_task_not_found(store: TaskStore, scope: Scope) -> None:
    with pytest.raises(NotFound):
        store.get_task(scope, "nope")


def test_list_most_recent_first_with_limit_total_and_cursor(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    ids = [f"task-{i:02d}" for i in range(7)]
    for task_id in ids:
        store.put_turn(scope, task_id, 0, meta={}, summary_md=task_id)
        clock.advance(seconds=1)
    store.put_turn(scope, "task-02", 1, meta={}, summary_md="again")  # now the newest
    expected = ["task-02", "task-06", "task-05", "task-04", "task-03", "task-01", "task-00"]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = store.list_tasks(scope, limit=3, cursor=cursor)
        assert page.total == 7
        assert len(page.tasks) <= 3
        seen += [t.task_id for t in page.tasks]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected
    assert pages == 3
    first = store.list_tasks(scope, limit=1).tasks[0]
    assert first.task_id == "task-02" and first.latest_turn == 1 and first.turn_count == 2
    assert first.updated_at == iso(clock.now)
    assert store.list_tasks(scope, limit=7).next_cursor is None
    assert store.list_tasks(scope, limit=1000).total == 7


def test_list_of_an_empty_project(store: TaskStore, scope: Scope) -> None:
    page = store.list_tasks(scope)
    assert page.tasks == () and page.total == 0 and page.next_cursor is None
    assert not store.layout.project_dir(scope).exists()


@pytest.mark.parametrize("limit", [0, -1, 1001])
def test_list_refuses_bad_limits(store: TaskStore, scope: Scope, limit: int) -> None:
    with pytest.raises(InvalidName):
        store.list_tasks(scope, limit=limit)


def test_projects_and_tenants_are_isolated(store: TaskStore) -> None:
    a, b, c = Scope("acme", "web"), Scope("acme", "mobile"), Scope("globex", "web")
    store.put_turn(a, "t1", 0, meta={}, summary_md="a")
    store.put_turn(b, "t2", 0, meta={}, summary_md="b")
    assert [t.task_id for t in store.list_tasks(a).tasks] == ["t1"]
    assert [t.task_id for t in store.list_tasks(b).tasks] == ["t2"]
    assert store.list_tasks(c).total == 0
    with pytest.raises(NotFound):
        store.get_task(b, "t1")
    assert "## t2" not in read_digest(store, a)


def test_delete_leaves_nothing_readable_listable_or_digested(
    store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_turn(scope, "doomed", 0, meta={}, summary_md="doomed summary")
    store.put_artifact(scope, "doomed", 0, "a.bin", io.BytesIO(b"abc"), content_type="x/y")
    clock.advance(seconds=1)
    store.put_turn(scope, "kept", 0, meta={}, summary_md="kept summary")
    assert "doomed summary" in read_digest(store, scope)
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
    with pytest.raises(NotFound):
        store.get_task(scope, "doomed")
    with pytest.raises(NotFound):
        store.get_turn(scope, "doomed", 0)
    with pytest.raises(NotFound):
        store.open_artifact(scope, "doomed", 0, "a.bin")
    page = store.list_tasks(scope)
    assert [t.task_id for t in page.tasks] == ["kept"] and page.total == 1
    digest = read_digest(store, scope)
    assert "doomed" not in digest and "kept summary" in digest
    with pytest.raises(NotFound):
        store.delete_task(scope, "doomed")
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


def test_delete_by_owner_only(store: TaskStore, scope: Scope) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="x", actor="alice")
    with pytest.raises(NotOwner):
        store.delete_task(scope, "t1", only_owner="bob")
    assert store.get_task(scope, "t1").owner == "alice"
    store.delete_task(scope, "t1", only_owner="alice")
    with pytest.raises(NotFound):
        store.get_task(scope, "t1")


def test_a_deleted_task_can_be_written_again_from_scratch(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t1", 0, meta={}, summary_md="first life", actor="a")
    store.put_turn(scope, "t1", 1, meta={}, summary_md="first life 1", actor="a")
    store.delete_task(scope, "t1")
    clock.advance(seconds=5)
    rec = store.put_turn(scope, "t1", 0, meta={}, summary_md="second life", actor="b")
    assert rec.created_at == iso(clock.now)
    index = store.get_task(scope, "t1")
    assert [t.turn for t in index.turns] == [0] and index.owner == "b"
    page = store.list_tasks(scope)
    assert page.total == 1 and page.tasks[0].turn_count == 1
    assert_consistent(store, scope)
