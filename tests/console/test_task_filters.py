"""TaskStore.list_tasks filters (the console's task list): owner, latest-turn meta, id prefix.

Real files and a real listing index; each filter and each order must be answered from an
index, never by a scan of every task row or a sort of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.storage.core import task_list
from app.storage.core.errors import InvalidName
from app.storage.core.models import TaskFilter
from app.storage.core.names import Scope
from app.storage.core.task_list import SORT_KEYS, TaskOrder
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
    monkeypatch.setattr(listing_mod, "_DENSE_MATCHES", 3)
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
        # A substring is tested on the rows the page order walks, from its index.
        (TaskFilter(model="m"), "INDEX tasks_recent"),
        (TaskFilter(agent_id="a"), "INDEX tasks_recent"),
        (TaskFilter(failed=True), "INDEX tasks_failed"),
        (TaskFilter(prefix="b", model="m", failed=True), "PRIMARY KEY (task_id>? AND task_id<?)"),
    ],
)
def test_every_filter_is_an_index_lookup(
    project: TaskStore, scope: Scope, only: TaskFilter, index: str
) -> None:
    listing = project.listing(scope)
    params: dict[str, object] = {"now": 0, "limit": 51}
    where = "t.retain_until_us > :now" + filter_terms(only, params)
    with listing.read() as conn:
        plan = [
            row[3]
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN {PAGE_COLUMNS} WHERE {where}"
                " ORDER BY t.updated_us DESC, t.task_id DESC LIMIT :limit",
                params,
            )
        ]
    outer = [step for step in plan if " t " in f" {step} "]
    assert outer and all(index in step for step in outer), plan
    assert not any(step.startswith("SCAN t") and "INDEX" not in step for step in plan), plan


@pytest.mark.parametrize("sort", list(SORT_KEYS))
@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("backward", [False, True])
def test_every_order_reads_its_index_in_page_order(
    project: TaskStore, scope: Scope, sort: str, descending: bool, backward: bool
) -> None:
    order = TaskOrder(sort, descending)
    params: dict[str, object] = {"now": 0, "limit": 51}
    keyset = order.keyset(
        [0 if c != "task_id" else "m" for c in order.columns],
        params,
        backward=backward,
        mark=lambda n: f":{n}",
    )
    with project.listing(scope).read() as conn:
        plan = [
            row[3]
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN {PAGE_COLUMNS} WHERE t.retain_until_us > :now{keyset}"
                f" ORDER BY {order.order_by(backward=backward)} LIMIT :limit",
                params,
            )
        ]
    assert not any("TEMP B-TREE" in step for step in plan), plan
    assert not any(step.startswith("SCAN t") and "INDEX" not in step for step in plan) or (
        sort == "task_id"
    ), plan


def test_a_substring_of_few_values_is_an_index_lookup(project: TaskStore, scope: Scope) -> None:
    params: dict[str, object] = {"now": 0, "limit": 51}
    values = {"model": ["opus", "opus-4"]}
    where = "t.retain_until_us > :now" + filter_terms(TaskFilter(model="opus"), params, values)
    with project.listing(scope).read() as conn:
        plan = [
            row[3]
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT count(*) FROM tasks t WHERE {where}",  # noqa: S608
                params,
            )
        ]
    assert any("INDEX tasks_model (model=?)" in step for step in plan), plan


@pytest.mark.parametrize("scan", [1, 1000])
def test_substrings_find_the_same_whether_resolved_to_values_or_walked(
    project: TaskStore, scope: Scope, monkeypatch: pytest.MonkeyPatch, scan: int
) -> None:
    # 1: more distinct models than are read, so each row is tested; 1000: resolved to values.
    monkeypatch.setattr(task_list, "DISTINCT_SCAN", scan)
    assert ids(project, scope, model="PU") == ["build-2", "build-1"]
    assert ids(project, scope, model="a") == ["docs", "build-10"]
    assert ids(project, scope, agent_id="C") == ["docs", "build-2", "build-1"]
    assert ids(project, scope, model="zz") == []
    page = project.list_tasks(scope, model="o")
    assert page.matched == 2 and page.total == 6


@pytest.mark.parametrize("sort", list(SORT_KEYS))
def test_a_dense_filter_walks_each_order_and_answers_the_same(
    store: TaskStore, scope: Scope, clock: FixedClock, monkeypatch: pytest.MonkeyPatch, sort: str
) -> None:
    for i in range(30):
        meta = {"model": f"m-{i % 3}", "agent_id": f"a{i % 4}", "exit_code": i % 2}
        store.put_turn(scope, f"t{(i * 7) % 30:03d}", 0, meta=meta, summary_md="x" * i)
        clock.advance(seconds=1)
    filters = [{"model": "M-"}, {"model": "1", "failed": True}, {"agent_id": "A"}, {}]
    sparse = [ids(store, scope, sort=sort, **f) for f in filters]
    monkeypatch.setattr(listing_mod, "_DENSE_MATCHES", 3)
    assert [ids(store, scope, sort=sort, **f) for f in filters] == sparse
    assert len(sparse[0]) == 30 and len(sparse[2]) == 30
