"""The task list's orders, its pages in both directions, its substring filters, each task's
bytes and its listing row (core/task_list.py), on every backend through the interface."""

from __future__ import annotations

import io

import pytest

from app.storage.core.errors import InvalidName, NotFound
from app.storage.core.names import Scope
from app.storage.core.records import usage_of_turn
from app.storage.interface import StorageBackend, TaskBackend
from tests.conftest import FixedClock

PLAN = {  # task: (turns, summary length, artifact bytes); written in this order
    "c": (1, 900, 0),
    "a": (4, 10, 0),
    "f": (2, 50, 5000),
    "b": (3, 300, 0),
    "g": (5, 50, 0),
    "e": (6, 2000, 0),
    "d": (7, 100, 0),
}


@pytest.fixture
def planned(tasks: TaskBackend, scope: Scope, clock: FixedClock) -> dict[str, int]:
    """The tasks of PLAN, one second apart; each task's bytes as the usage counts them."""
    sizes = {}
    for task, (turns, length, artifact) in PLAN.items():
        size = 0
        for n in range(turns):
            summary = "x" * (length if n == 0 else 1)
            tasks.put_turn(scope, task, n, meta={"n": n}, summary_md=summary)
            size += usage_of_turn(n, {"n": n}, summary, ()).turn_bytes
        if artifact:
            data = io.BytesIO(b"z" * artifact)
            tasks.put_artifact(scope, task, 0, "blob", data, content_type="text/plain")
            size += artifact
        sizes[task] = size
        clock.advance(seconds=1)
    return sizes


def walk(tasks: TaskBackend, scope: Scope, **order: object) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = tasks.list_tasks(scope, limit=3, cursor=cursor, **order)  # type: ignore[arg-type]
        pages.append([t.task_id for t in page.tasks])
        cursor = page.next_cursor
        if cursor is None:
            return pages


def expected(sizes: dict[str, int], sort: str, descending: bool) -> list[str]:
    written = list(PLAN)
    keys = {
        "updated": lambda t: written.index(t),
        "task_id": lambda t: t,
        "size": lambda t: (sizes[t], t),
        "turns": lambda t: (PLAN[t][0], t),
    }
    return sorted(PLAN, key=keys[sort], reverse=descending)


@pytest.mark.all_backends
@pytest.mark.parametrize("sort", ["updated", "task_id", "size", "turns"])
@pytest.mark.parametrize("descending", [True, False])
def test_each_order_pages_forward_then_back(
    tasks: TaskBackend, scope: Scope, planned: dict[str, int], sort: str, descending: bool
) -> None:
    want = expected(planned, sort, descending)
    pages = walk(tasks, scope, sort=sort, descending=descending)
    assert pages == [want[:3], want[3:6], want[6:]]
    # From the last page, back through prev_cursor to the first.
    last = tasks.list_tasks(scope, limit=3, sort=sort, descending=descending)
    while last.next_cursor:
        last = tasks.list_tasks(
            scope, limit=3, cursor=last.next_cursor, sort=sort, descending=descending
        )
    assert last.prev_cursor is not None and last.next_cursor is None
    back, cursor = [], last.prev_cursor
    while cursor:
        page = tasks.list_tasks(
            scope, limit=3, cursor=cursor, backward=True, sort=sort, descending=descending
        )
        back.append([t.task_id for t in page.tasks])
        assert page.next_cursor is not None  # a page read backward has one after it
        cursor = page.prev_cursor
    assert back == [want[3:6], want[:3]]
    first = tasks.list_tasks(scope, limit=3, sort=sort, descending=descending)
    assert first.prev_cursor is None and first.total == first.matched == 7


@pytest.mark.all_backends
def test_each_task_carries_its_bytes_and_the_summary_row(
    tasks: TaskBackend, scope: Scope, planned: dict[str, int]
) -> None:
    page = tasks.list_tasks(scope, limit=10)
    assert {t.task_id: t.bytes for t in page.tasks} == planned
    assert sum(planned.values()) == tasks_usage(tasks, scope)
    one = tasks.task_summary(scope, "f")
    assert (one.task_id, one.bytes, one.turn_count, one.latest_turn) == ("f", planned["f"], 2, 1)
    assert one == next(t for t in page.tasks if t.task_id == "f")
    with pytest.raises(NotFound):
        tasks.task_summary(scope, "nope")
    with pytest.raises(InvalidName):
        tasks.task_summary(scope, "../x")


def tasks_usage(tasks: TaskBackend, scope: Scope) -> int:
    return sum(t.bytes for t in tasks.list_tasks(scope, limit=100).tasks)


@pytest.mark.all_backends
def test_bytes_follow_writes_replacements_and_deletes(
    backend: StorageBackend, tasks: TaskBackend, scope: Scope
) -> None:
    tasks.put_turn(scope, "t", 0, meta={}, summary_md="a" * 100)
    tasks.put_artifact(scope, "t", 0, "x", io.BytesIO(b"1" * 50), content_type="text/plain")
    tasks.put_artifact(scope, "t", 0, "x", io.BytesIO(b"1" * 20), content_type="text/plain")
    tasks.put_turn(scope, "t", 1, meta={}, summary_md="b")
    assert tasks.task_summary(scope, "t").bytes == backend.usage(scope).bytes
    tasks.put_turn(scope, "u", 0, meta={}, summary_md="c")
    tasks.delete_task(scope, "u")
    assert tasks.task_summary(scope, "t").bytes == backend.usage(scope).bytes


@pytest.mark.all_backends
@pytest.mark.parametrize(
    "filters, found",
    [
        ({"model": "claude"}, ["opus", "sonnet"]),
        ({"model": "SONNET"}, ["sonnet"]),
        ({"model": "%"}, []),
        ({"model": "_"}, []),
        ({"agent_id": "ci"}, ["opus", "sonnet"]),
        ({"model": "claude", "agent_id": "NIGHT"}, ["opus"]),
        ({"model": ""}, ["none", "gpt", "opus", "sonnet"]),  # empty: no filter
    ],
)
def test_model_and_agent_match_substrings_in_any_ascii_case(
    tasks: TaskBackend,
    scope: Scope,
    clock: FixedClock,
    filters: dict[str, str],
    found: list[str],
) -> None:
    for task, meta in (
        ("sonnet", {"model": "claude-sonnet-4-5", "agent_id": "ci-runner"}),
        ("opus", {"model": "Claude-Opus-4", "agent_id": "CI-nightly"}),
        ("gpt", {"model": "gpt-5", "agent_id": "laptop"}),
        ("none", {}),
    ):
        tasks.put_turn(scope, task, 0, meta=meta, summary_md="")
        clock.advance(seconds=1)
    page = tasks.list_tasks(scope, **filters)  # type: ignore[arg-type]
    assert [t.task_id for t in page.tasks] == found
    assert page.total == 4 and page.matched == len(found)


@pytest.mark.all_backends
def test_a_nul_in_a_model_or_agent_is_kept_by_the_turn_and_found_by_the_filters(
    tasks: TaskBackend, scope: Scope, clock: FixedClock
) -> None:
    """The turn keeps its meta as sent; the listing keeps each NUL of a model or agent as
    U+FFFD (PostgreSQL's text holds no NUL), and a filter looks for it the same way."""
    meta = {"model": "Claude\x00x", "agent_id": "\x00"}
    tasks.put_turn(scope, "nul", 0, meta=meta, summary_md="")
    clock.advance(seconds=1)
    tasks.put_turn(scope, "plain", 0, meta={"model": "claude"}, summary_md="")
    assert tasks.get_turn(scope, "nul", 0).meta == meta
    row = tasks.task_summary(scope, "nul")
    assert (row.model, row.agent_id) == ("Claude\ufffdx", "\ufffd")
    for filters, found in (
        ({"model": "claude\x00"}, ["nul"]),
        ({"model": "\ufffdX"}, ["nul"]),
        ({"model": "claude"}, ["plain", "nul"]),
        ({"agent_id": "\x00"}, ["nul"]),
        ({"model": "\x00\x00"}, []),
    ):
        page = tasks.list_tasks(scope, **filters)  # type: ignore[arg-type]
        assert [t.task_id for t in page.tasks] == found, filters


@pytest.mark.all_backends
def test_a_cursor_of_another_order_or_project_is_refused(
    tasks: TaskBackend, scope: Scope, planned: dict[str, int]
) -> None:
    cursor = tasks.list_tasks(scope, limit=2, sort="size").next_cursor
    assert cursor
    for other in ({"sort": "turns"}, {"sort": "size", "descending": False}, {}):
        with pytest.raises(InvalidName):
            tasks.list_tasks(scope, limit=2, cursor=cursor, **other)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        tasks.list_tasks(Scope("acme", "other"), limit=2, cursor=cursor, sort="size")
    with pytest.raises(InvalidName):
        tasks.list_tasks(scope, sort="bytes")
