"""The keyset cursor: stable while the listing changes, refused when tampered or misplaced."""

from __future__ import annotations

import base64
import io
import itertools
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.interface import TaskBackend
from tests.conformance.conftest import Factory
from tests.conftest import FixedClock

SCOPE = Scope("acme", "web")
_projects = itertools.count()

_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 10**6)),
    st.tuples(st.just("update"), st.integers(0, 10**6)),
    st.tuples(st.just("new_turn"), st.integers(0, 10**6)),
    st.tuples(st.just("artifact"), st.integers(0, 10**6)),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    initial=st.integers(min_value=0, max_value=12),
    limit=st.integers(min_value=1, max_value=6),
    # The clock may stall or step back: order must hold on the backend's own versions.
    ticks=st.lists(st.integers(min_value=-3, max_value=5), min_size=1, max_size=8),
    between=st.lists(st.lists(_op, max_size=3), max_size=8),
)
def test_paging_while_the_listing_changes_never_repeats_or_skips_untouched_tasks(
    tasks: TaskBackend,
    clock: FixedClock,
    initial: int,
    limit: int,
    ticks: list[int],
    between: list[list[tuple[str, int]]],
) -> None:
    scope = Scope("acme", f"paging-{next(_projects)}")  # a fresh project per example
    tick = iter(ticks * 1000)

    def step() -> None:
        clock.advance(microseconds=next(tick))

    alive: list[str] = []
    for i in range(initial):
        step()
        tasks.put_turn(scope, f"task-{i:03d}", 0, meta={}, summary_md="x")
        alive.append(f"task-{i:03d}")
    untouched = set(alive)
    created = initial
    seen: list[str] = []
    cursor: str | None = None
    for page_no in range(10_000):
        page = tasks.list_tasks(scope, limit=limit, cursor=cursor)
        assert len(page.tasks) <= limit
        assert page.total == len(alive)
        seen += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            break
        for kind, pick in between[page_no] if page_no < len(between) else []:
            step()
            if kind == "insert" or not alive:
                task_id = f"task-{created:03d}"
                created += 1
                tasks.put_turn(scope, task_id, 0, meta={}, summary_md="new")
                alive.append(task_id)
                continue
            task_id = alive[pick % len(alive)]
            untouched.discard(task_id)
            if kind == "update":
                tasks.put_turn(scope, task_id, 0, meta={"v": pick}, summary_md="upd")
            elif kind == "new_turn":
                tasks.put_turn(scope, task_id, 1 + pick % 50, meta={}, summary_md="turn")
            elif kind == "artifact":
                tasks.put_artifact(scope, task_id, 0, "a", io.BytesIO(b"x"), content_type="x/y")
            else:
                tasks.delete_task(scope, task_id)
                alive.remove(task_id)
    else:
        pytest.fail("paging never ended")
    assert len(seen) == len(set(seen)), f"a task was listed twice: {seen}"
    missing = untouched - set(seen)
    assert not missing, f"untouched tasks skipped: {sorted(missing)}"


def _valid_cursor(tasks: TaskBackend, scope: Scope = SCOPE) -> str:
    for i in range(3):
        tasks.put_turn(scope, f"t{i}", 0, meta={}, summary_md="x")
    cursor = tasks.list_tasks(scope, limit=1).next_cursor
    assert cursor is not None
    return cursor


def test_a_cursor_from_another_project_or_tenant_is_refused(tasks: TaskBackend) -> None:
    cursor = _valid_cursor(tasks)
    other_project, other_tenant = Scope("acme", "mobile"), Scope("globex", "web")
    _valid_cursor(tasks, other_project)
    for scope in (other_project, other_tenant):
        with pytest.raises(InvalidName):
            tasks.list_tasks(scope, cursor=cursor)
    assert len(tasks.list_tasks(SCOPE, cursor=cursor).tasks) == 2


def test_a_cursor_signed_by_another_deployment_is_refused(
    tasks: TaskBackend, other_backend: Factory
) -> None:
    cursor = _valid_cursor(tasks)
    other = other_backend().tasks
    _valid_cursor(other)
    with pytest.raises(InvalidName):
        other.list_tasks(SCOPE, cursor=cursor)


def test_the_cursor_key_is_shared_by_every_backend_object_of_a_deployment(
    tasks: TaskBackend, make_backend: Factory
) -> None:
    cursor = _valid_cursor(tasks)
    assert len(make_backend().tasks.list_tasks(SCOPE, cursor=cursor).tasks) == 2


def test_forged_cursors_are_refused(tasks: TaskBackend) -> None:
    cursor = _valid_cursor(tasks)
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    body = raw[:-16]
    assert b',"t' in body and b'"k":[1' in body
    forged_bodies = [
        body.replace(b',"t', b',"s'),
        body.replace(b'"k":[1', b'"k":[2'),
        body.replace(b'"v":2', b'"v":3'),
        body.replace(b'"o":"updated"', b'"o":"size"'),
    ]
    for forged in forged_bodies:
        for sig in (raw[-16:], b"\x00" * 16):
            text = base64.urlsafe_b64encode(forged + sig).decode().rstrip("=")
            with pytest.raises(InvalidName):
                tasks.list_tasks(SCOPE, cursor=text)
    for bad in ["x", "=", cursor[:-1], cursor[1:], cursor + "A", cursor[:20], "a" * 2000]:
        with pytest.raises(InvalidName):
            tasks.list_tasks(SCOPE, cursor=bad)


_B64 = string.ascii_letters + string.digits + "-_"


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.one_of(st.text(min_size=1, max_size=300), st.text(_B64, min_size=1, max_size=300)))
def test_arbitrary_text_is_refused_as_a_cursor_never_crashes(tasks: TaskBackend, text: str) -> None:
    with pytest.raises(InvalidName):
        tasks.list_tasks(SCOPE, cursor=text)


def test_a_cursor_survives_expiry_of_the_task_it_points_at(
    tasks: TaskBackend, clock: FixedClock
) -> None:
    for i in range(4):
        tasks.put_turn(SCOPE, f"t{i}", 0, meta={}, summary_md="x")
        clock.advance(days=1)
    page = tasks.list_tasks(SCOPE, limit=2)
    assert [t.task_id for t in page.tasks] == ["t3", "t2"]
    clock.advance(days=26, hours=1)  # t0 expired, t1 alive
    rest = tasks.list_tasks(SCOPE, limit=2, cursor=page.next_cursor)
    assert [t.task_id for t in rest.tasks] == ["t1"] and rest.total == 3
    assert rest.next_cursor is None
    clock.advance(days=5)
    assert tasks.list_tasks(SCOPE, limit=2, cursor=page.next_cursor).tasks == ()
