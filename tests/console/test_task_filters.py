"""TaskStore.list_tasks filters (the console's task list): owner, latest-turn meta, id prefix.

Real files and a real listing index; each filter must be answered by an index, never by a
scan of every task row.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.storage import InvalidName, Scope
from app.storage.core.models import TaskFilter
from app.storage.tree.retention import sweep
from app.storage.tree.sqlite import listing as listing_mod
from app.storage.tree.sqlite.listing_sql import PAGE_COLUMNS, filter_terms
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock


def ids(store: TaskStore, scope: Scope, **filters: object) -> list[str]:
    return [t.task_id for t in store.list_tasks(scope, limit=1000, **filters).tasks]  # type: ignore[arg-type]


@pytest.fixture
def project(store: TaskStore, scope: Scope, clock: FixedClock) -> Iterator[TaskStore]:
    rows = [
        ("build-1", {"model": "opus", "agent_id": "ci", "exit_code": 0}, "tok_a"),
        ("build-2", {"model": "opus", "agent_id": "ci", "exit_code": 2}, "tok_b"),
        ("build-10", {"model": "haiku", "exit_code": -1}, "tok_a"),
        ("docs", {"model": "haiku", "agent_id": "ci", "exit_code": None}, None),
        ("odd", {"model": 7, "agent_id": ["x"], "exit_code": True}, "tok_a"),
        ("huge", {"exit_code": 2**80}, "tok_a"),
    ]
    for task, meta, owner in rows:
        store.put_turn(scope, task, 0, meta=meta, summary_md=task, actor=owner)
        clock.advance(seconds=1)
    yield store


def test_each_filter_and_their_combination(project: TaskStore, scope: Scope) -> None:
    assert ids(project, scope) == ["huge", "odd", "docs", "build-10", "build-2", "build-1"]
    assert ids(project, scope, prefix="build-1") == ["build-10", "build-1"]
    assert ids(project, scope, prefix="build-") == ["build-10", "build-2", "build-1"]
    assert ids(project, scope, prefix="zz") == []
    assert ids(project, scope, model="opus") == ["build-2", "build-1"]
    assert ids(project, scope, agent_id="ci") == ["docs", "build-2", "build-1"]
    # Non-zero and known: None (unknown) and a JSON boolean are not exit codes.
    assert ids(project, scope, failed=True) == ["huge", "build-10", "build-2"]
    assert ids(project, scope, model="opus", failed=True) == ["build-2"]
    assert ids(project, scope, prefix="build", agent_id="ci", model="haiku") == []


def test_summaries_carry_owner_and_latest_meta(project: TaskStore, scope: Scope) -> None:
    by_id = {t.task_id: t for t in project.list_tasks(scope).tasks}
    assert (by_id["build-2"].owner, by_id["build-2"].model, by_id["build-2"].exit_code) == (
        "tok_b",
        "opus",
        2,
    )
    assert by_id["docs"].owner is None and by_id["docs"].exit_code is None
    assert (by_id["odd"].model, by_id["odd"].agent_id, by_id["odd"].exit_code) == (None, None, None)
    assert by_id["huge"].exit_code == 2**63 - 1  # clamped to SQLite's integer, still non-zero


def test_filters_follow_the_latest_turn(
    project: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    project.put_turn(scope, "build-1", 1, meta={"model": "sonnet", "exit_code": 1}, summary_md="")
    assert "build-1" not in ids(project, scope, model="opus")
    assert ids(project, scope, model="sonnet", failed=True) == ["build-1"]
    # Rewriting an earlier turn does not change what the latest turn says.
    project.put_turn(scope, "build-1", 0, meta={"model": "opus", "exit_code": 0}, summary_md="")
    assert ids(project, scope, model="sonnet") == ["build-1"]
    # The owner stays the task's creator whoever writes later turns.
    project.put_turn(scope, "build-1", 2, meta={}, summary_md="", actor="tok_other")
    by_id = {t.task_id: t for t in project.list_tasks(scope).tasks}
    assert by_id["build-1"].owner == "tok_a"


def test_an_expired_highest_turn_no_longer_speaks_for_the_task(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    store.put_turn(scope, "t", 5, meta={"model": "old", "exit_code": 1}, summary_md="")
    clock.advance(days=20)
    store.put_turn(scope, "t", 0, meta={"model": "new", "exit_code": 0}, summary_md="")
    clock.advance(days=11)  # turn 5 (the highest) expired, turn 0 lives
    (task,) = store.list_tasks(scope).tasks
    assert (task.latest_turn, task.model, task.exit_code) == (0, "new", 0)
    assert ids(store, scope, model="old") == []
    assert ids(store, scope, failed=True) == []
    sweep(store, now=clock())
    assert ids(store, scope, model="new") == ["t"]


def test_filtered_pages_follow_the_cursor(
    store: TaskStore, scope: Scope, clock: FixedClock
) -> None:
    for i in range(25):
        meta = {"model": "m", "exit_code": i % 2}
        store.put_turn(scope, f"task-{i:02d}", 0, meta=meta, summary_md="")
        clock.advance(seconds=1)
    seen: list[str] = []
    cursor = None
    while True:
        page = store.list_tasks(scope, limit=4, cursor=cursor, failed=True, model="m")
        assert page.total == 25  # the project's live tasks, not the matches
        seen += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [f"task-{i:02d}" for i in range(23, 0, -2)]


def test_a_dense_prefix_walks_the_page_order_and_answers_the_same(
    store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(30):
        store.put_turn(scope, f"{'ab'[i % 2]}{i:03d}", 0, meta={}, summary_md="")
        clock.advance(seconds=1)
    sparse = [ids(store, scope, prefix=p) for p in ("a", "b0", "a01", "c")]
    monkeypatch.setattr(listing_mod, "_DENSE_PREFIX", 3)
    assert [ids(store, scope, prefix=p) for p in ("a", "b0", "a01", "c")] == sparse
    assert sparse[0] == [f"a{i:03d}" for i in range(28, -1, -2)]


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "a b", "é", "x" * 129])
def test_a_prefix_that_no_task_id_starts_with_is_refused(
    store: TaskStore, scope: Scope, bad: str
) -> None:
    with pytest.raises(InvalidName):
        store.list_tasks(scope, prefix=bad)


@pytest.mark.parametrize(
    "only, index",
    [
        (TaskFilter(prefix="build"), "PRIMARY KEY (task_id>? AND task_id<?)"),
        (TaskFilter(model="m"), "INDEX tasks_model (model=?)"),
        (TaskFilter(agent_id="a"), "INDEX tasks_agent (agent_id=?)"),
        (TaskFilter(failed=True), "INDEX tasks_failed"),
        (TaskFilter(prefix="b", model="m", failed=True), "INDEX tasks_model (model=?)"),
    ],
)
def test_every_filter_is_an_index_lookup(
    project: TaskStore, scope: Scope, only: TaskFilter, index: str
) -> None:
    listing = project.listing(scope)
    params: dict[str, object] = {"now": 0, "limit": 51}
    where = "t.retain_until_us > :now" + filter_terms(only, params)
    plan = [
        row[3]
        for row in listing._conn().execute(
            f"EXPLAIN QUERY PLAN {PAGE_COLUMNS} WHERE {where}"
            " ORDER BY t.updated_us DESC, t.task_id DESC LIMIT :limit",
            params,
        )
    ]
    outer = [step for step in plan if " t " in f" {step} "]
    assert outer and all(index in step for step in outer), plan
    assert not any(step.startswith("SCAN t") and "INDEX" not in step for step in plan), plan
