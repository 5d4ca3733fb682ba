"""Task index, listing (order, limit, total, filters, cursor) and delete."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest

from app.storage.core.clock import iso
from app.storage.core.errors import InvalidName, NotFound, NotOwner
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend
from tests.conformance.conftest import assert_views_agree, read_digest
from tests.conftest import T0, FixedClock


def test_task_index_has_turns_meta_artifacts_owner_and_times(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "t1", 2, meta={"m": 2}, summary_md="two", actor="tok-a")
    clock.advance(hours=1)
    tasks.put_turn(scope, "t1", 0, meta={"m": 0}, summary_md="zero", actor="tok-b")
    clock.advance(hours=1)
    tasks.put_artifact(scope, "t1", 2, "log.txt", io.BytesIO(b"log"), content_type="text/plain")
    index = tasks.get_task(scope, "t1")
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
    assert_views_agree(tasks, scope)


def test_get_task_not_found(tasks: TaskBackend, scope: Scope) -> None:
    with pytest.raises(NotFound):
        tasks.get_task(scope, "nope")


def test_list_most_recent_first_with_limit_total_and_cursor(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    ids = [f"task-{i:02d}" for i in range(7)]
    for task_id in ids:
        tasks.put_turn(scope, task_id, 0, meta={}, summary_md=task_id)
        clock.advance(seconds=1)
    tasks.put_turn(scope, "task-02", 1, meta={}, summary_md="again")  # now the newest
    expected = ["task-02", "task-06", "task-05", "task-04", "task-03", "task-01", "task-00"]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = tasks.list_tasks(scope, limit=3, cursor=cursor)
        assert page.total == 7
        assert len(page.tasks) <= 3
        seen += [t.task_id for t in page.tasks]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected
    assert pages == 3
    first = tasks.list_tasks(scope, limit=1).tasks[0]
    assert first.task_id == "task-02" and first.latest_turn == 1 and first.turn_count == 2
    assert first.updated_at == iso(clock.now)
    assert tasks.list_tasks(scope, limit=7).next_cursor is None
    assert tasks.list_tasks(scope, limit=1000).total == 7


def test_ties_on_updated_at_are_broken_by_task_id_descending(
    tasks: TaskBackend, scope: Scope
) -> None:
    for task_id in ("b", "a", "c"):
        tasks.put_turn(scope, task_id, 0, meta={}, summary_md=task_id)  # the clock stands still
    assert [t.task_id for t in tasks.list_tasks(scope).tasks] == ["c", "b", "a"]
    page = tasks.list_tasks(scope, limit=2)
    rest = tasks.list_tasks(scope, limit=2, cursor=page.next_cursor)
    assert [t.task_id for t in page.tasks + rest.tasks] == ["c", "b", "a"]


def test_list_filters(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> None:
    tasks.put_turn(scope, "fix-a", 0, meta={"model": "m1", "exit_code": 0}, summary_md="")
    clock.advance(seconds=1)
    tasks.put_turn(scope, "fix-b", 0, meta={"model": "m2", "exit_code": 2}, summary_md="")
    clock.advance(seconds=1)
    tasks.put_turn(scope, "other", 0, meta={"agent_id": "ag", "exit_code": 1}, summary_md="")
    clock.advance(seconds=1)
    tasks.put_turn(scope, "fix-a", 1, meta={"model": "m2"}, summary_md="")

    def ids(**only: object) -> list[str]:
        return [t.task_id for t in tasks.list_tasks(scope, **only).tasks]  # type: ignore[arg-type]

    assert ids(prefix="fix-") == ["fix-a", "fix-b"]
    assert ids(model="m2") == ["fix-a", "fix-b"]
    assert ids(model="m1") == []  # the latest turn's model counts
    assert ids(agent_id="ag") == ["other"]
    assert ids(failed=True) == ["other", "fix-b"]
    summary = tasks.list_tasks(scope, prefix="fix-b").tasks[0]
    assert (summary.model, summary.exit_code) == ("m2", 2)
    assert tasks.list_tasks(scope, prefix="fix-").total == 3  # total is unfiltered
    with pytest.raises(InvalidName):
        tasks.list_tasks(scope, prefix="../x")


def test_list_of_an_empty_project(tasks: TaskBackend, scope: Scope) -> None:
    page = tasks.list_tasks(scope)
    assert page.tasks == () and page.total == 0 and page.next_cursor is None


@pytest.mark.parametrize("limit", [0, -1, 1001])
def test_list_refuses_bad_limits(tasks: TaskBackend, scope: Scope, limit: int) -> None:
    with pytest.raises(InvalidName):
        tasks.list_tasks(scope, limit=limit)


def test_projects_and_tenants_are_isolated(tasks: TaskBackend) -> None:
    a, b, c = Scope("acme", "web"), Scope("acme", "mobile"), Scope("globex", "web")
    tasks.put_turn(a, "t1", 0, meta={}, summary_md="a")
    tasks.put_turn(b, "t2", 0, meta={}, summary_md="b")
    assert [t.task_id for t in tasks.list_tasks(a).tasks] == ["t1"]
    assert [t.task_id for t in tasks.list_tasks(b).tasks] == ["t2"]
    assert tasks.list_tasks(c).total == 0
    with pytest.raises(NotFound):
        tasks.get_task(b, "t1")
    with pytest.raises(NotFound):
        tasks.delete_task(c, "t1")
    assert "## t2" not in read_digest(tasks, a)


def test_delete_leaves_nothing_readable_listable_or_digested(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "doomed", 0, meta={}, summary_md="doomed summary")
    tasks.put_artifact(scope, "doomed", 0, "a.bin", io.BytesIO(b"abc"), content_type="x/y")
    clock.advance(seconds=1)
    tasks.put_turn(scope, "kept", 0, meta={}, summary_md="kept summary")
    assert "doomed summary" in read_digest(tasks, scope)
    tasks.delete_task(scope, "doomed")
    with pytest.raises(NotFound):
        tasks.get_task(scope, "doomed")
    with pytest.raises(NotFound):
        tasks.get_turn(scope, "doomed", 0)
    with pytest.raises(NotFound):
        tasks.open_artifact(scope, "doomed", 0, "a.bin")
    page = tasks.list_tasks(scope)
    assert [t.task_id for t in page.tasks] == ["kept"] and page.total == 1
    digest = read_digest(tasks, scope)
    assert "doomed" not in digest and "kept summary" in digest
    with pytest.raises(NotFound):
        tasks.delete_task(scope, "doomed")
    assert_views_agree(tasks, scope)


def test_delete_by_owner_only(tasks: TaskBackend, scope: Scope) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="x", actor="alice")
    with pytest.raises(NotOwner):
        tasks.delete_task(scope, "t1", only_owner="bob")
    assert tasks.get_task(scope, "t1").owner == "alice"
    tasks.delete_task(scope, "t1", only_owner="alice")
    with pytest.raises(NotFound):
        tasks.get_task(scope, "t1")


def test_a_deleted_task_can_be_written_again_from_scratch(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    tasks.put_turn(scope, "t1", 0, meta={}, summary_md="first life", actor="a")
    tasks.put_turn(scope, "t1", 1, meta={}, summary_md="first life 1", actor="a")
    tasks.delete_task(scope, "t1")
    clock.advance(seconds=5)
    rec = tasks.put_turn(scope, "t1", 0, meta={}, summary_md="second life", actor="b")
    assert rec.created_at == iso(clock.now)
    index = tasks.get_task(scope, "t1")
    assert [t.turn for t in index.turns] == [0] and index.owner == "b"
    page = tasks.list_tasks(scope)
    assert page.total == 1 and page.tasks[0].turn_count == 1
    assert_views_agree(tasks, scope)
