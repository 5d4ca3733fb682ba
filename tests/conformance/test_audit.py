"""The audit log (core/audit.py): events recorded, read newest first with filters, paged in
both directions, kept per project, refused when they break the rules; on every backend."""

from __future__ import annotations

import pytest

from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.conftest import FixedClock

pytestmark = pytest.mark.all_backends


def record(backend: StorageBackend, scope: Scope, n: int, **kw: object) -> None:
    backend.audit_log.record(
        scope.tenant,
        scope.project,
        actor=str(kw.get("actor", f"tok_{n % 2}")),
        kind=str(kw.get("kind", "task")),
        action=str(kw.get("action", "created")),
        subject=f"task-{n}",
        detail={"n": n},
    )


def subjects(page: object) -> list[str]:
    return [e.subject for e in page.events]  # type: ignore[attr-defined]


def test_events_newest_first_with_filters(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    for n in range(6):
        record(backend, scope, n, kind="task" if n % 3 else "token")
        clock.advance(seconds=1)
    record(backend, Scope(scope.tenant, "other"), 99)
    page = backend.audit_log.page(scope)
    assert subjects(page) == [f"task-{n}" for n in range(5, -1, -1)]
    first = page.events[-1]
    assert (first.actor, first.kind, first.action, first.detail) == (
        "tok_0",
        "token",
        "created",
        {"n": 0},
    )
    assert first.at.startswith("2026-01-01T00:00:00")
    assert subjects(backend.audit_log.page(scope, actor="tok_1")) == ["task-5", "task-3", "task-1"]
    assert subjects(backend.audit_log.page(scope, kind="token")) == ["task-3", "task-0"]
    assert subjects(backend.audit_log.page(scope, actor="tok_1", kind="token")) == ["task-3"]
    assert subjects(backend.audit_log.page(scope, actor="tok_nobody")) == []
    assert subjects(backend.audit_log.page(Scope(scope.tenant, "none-here"))) == []


def test_pages_forward_and_back_and_ties_in_one_microsecond(
    backend: StorageBackend, scope: Scope, clock: FixedClock
) -> None:
    for n in range(7):
        record(backend, scope, n)  # the clock stands still: every event at one instant
    seen, page = [], backend.audit_log.page(scope, limit=3)
    pages = [page]
    seen += subjects(page)
    while page.next_cursor:
        page = backend.audit_log.page(scope, limit=3, cursor=page.next_cursor)
        pages.append(page)
        seen += subjects(page)
    assert len(seen) == 7 == len(set(seen))
    assert pages[0].prev_cursor is None and pages[-1].next_cursor is None
    back = backend.audit_log.page(scope, limit=3, cursor=pages[-1].prev_cursor, backward=True)
    assert subjects(back) == subjects(pages[1])
    assert back.next_cursor is not None and back.prev_cursor is not None


def test_refused_events_and_cursors(backend: StorageBackend, scope: Scope) -> None:
    for kw in (
        {"kind": "nonsense"},
        {"action": "Has Spaces"},
        {"subject": ""},
        {"subject": "x" * 300},
        {"detail": {"big": "x" * 5000}},
    ):
        args = {"actor": "tok_a", "kind": "task", "action": "created", "subject": "s", **kw}
        with pytest.raises(InvalidName):
            backend.audit_log.record(scope.tenant, scope.project, **args)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        backend.audit_log.record(
            "../x", scope.project, actor="a", kind="task", action="a", subject="s"
        )
    assert subjects(backend.audit_log.page(scope)) == []
    record(backend, scope, 1)
    record(backend, scope, 2)
    cursor = backend.audit_log.page(scope, limit=1).next_cursor
    assert cursor
    with pytest.raises(InvalidName):
        backend.audit_log.page(Scope(scope.tenant, "other"), cursor=cursor)
    with pytest.raises(InvalidName):
        backend.audit_log.page(scope, cursor="forged")
    with pytest.raises(InvalidName):
        backend.audit_log.page(scope, kind="nonsense")


def test_old_events_are_pruned(backend: StorageBackend, scope: Scope, clock: FixedClock) -> None:
    record(backend, scope, 1)
    clock.advance(days=2)
    record(backend, scope, 2)
    newest = backend.audit_log.page(scope).events[0]
    assert backend.audit_log.prune(newest.at_us) == 1
    assert subjects(backend.audit_log.page(scope)) == ["task-2"]
