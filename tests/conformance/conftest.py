"""The conformance suite: what every storage backend promises, checked through the Protocols of
app/storage/interface.py only (no file, table or bucket is looked at here).

``backend`` runs each test once per backend ``MEMORY_TEST_BACKENDS`` selects (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage.backends import open_backend
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend, StoreBackend, TaskBackend
from tests.conftest import FixedClock, nested_summary

MiB = 1 << 20
Factory = Callable[..., StorageBackend]


@pytest.fixture
def make_backend(
    backend_config: dict[str, Any], tmp_path: Path, clock: FixedClock
) -> Iterator[Factory]:
    """Build a backend of the selected kind; keyword arguments override its settings."""
    made: list[StorageBackend] = []

    def make(**overrides: Any) -> StorageBackend:
        settings = {
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 5.0,
            "MAX_ARTIFACT_BYTES": 50 * MiB,
            "CLOCK": clock,
            "THREADS": 4,
            # Keyword search unless a test passes an embedder: no model loaded, no drain.
            "EMBEDDER": "off",
            **backend_config,
            **overrides,
        }
        found = open_backend(settings)
        made.append(found)
        return found

    yield make
    for found in made:
        found.close()


@pytest.fixture
def other_backend(
    backend_kind: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FixedClock
) -> Iterator[Factory]:
    """A backend of the same kind for another deployment (its own root, or database schema)."""
    made: list[StorageBackend] = []

    def make(**overrides: Any) -> StorageBackend:
        settings: dict[str, Any] = {
            "STORAGE_ROOT": str(tmp_path / "other-root"),
            "TOKENS_FILE": str(tmp_path / "other-tokens.json"),
            "RETENTION_DAYS": 30.0,
            "LOCK_TIMEOUT": 5.0,
            "MAX_ARTIFACT_BYTES": 50 * MiB,
            "CLOCK": clock,
            "EMBEDDER": "off",
        }
        if backend_kind != "tree":
            settings.update(request.getfixturevalue("services").settings())
        found = open_backend({**settings, **overrides})
        made.append(found)
        return found

    yield make
    for found in made:
        found.close()


@pytest.fixture
def backend(backend_kind: str, make_backend: Factory) -> StorageBackend:
    return make_backend()


@pytest.fixture
def tasks(backend: StorageBackend) -> TaskBackend:
    return backend.tasks


@pytest.fixture
def stores(backend: StorageBackend) -> StoreBackend:
    return backend.stores


def read_digest(tasks: TaskBackend, scope: Scope) -> str:
    fh, size = tasks.open_digest(scope)
    with fh:
        data = fh.read()
    assert len(data) == size
    return data.decode("utf-8")


def all_tasks(tasks: TaskBackend, scope: Scope) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = tasks.list_tasks(scope, limit=7, cursor=cursor)
        seen += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            return seen


def expected_digest(tasks: TaskBackend, scope: Scope) -> str:
    """project.md as the seed specifies it, from the listing order and each task's latest live
    turn as get_turn returns it."""
    text = f"# Project memory: {scope.tenant}/{scope.project}\n"
    ids = all_tasks(tasks, scope)
    if not ids:
        return text + "\nNo tasks yet.\n"
    for task_id in ids:
        index = tasks.get_task(scope, task_id)
        latest = tasks.get_turn(scope, task_id, max(t.turn for t in index.turns))
        summary = nested_summary(latest.summary_md)
        if summary and not summary.endswith("\n"):
            summary += "\n"
        text += (
            f"\n## {task_id}\n\nLatest turn: {latest.turn}, updated {latest.updated_at}\n\n"
            + summary
        )
    return text


def assert_views_agree(tasks: TaskBackend, scope: Scope) -> None:
    """The listing, every task index and project.md agree with the turns as read one by one."""
    page = tasks.list_tasks(scope, limit=1000)
    assert page.total == len(page.tasks)
    for summary in page.tasks:
        index = tasks.get_task(scope, summary.task_id)
        assert summary.turn_count == index.turn_count
        assert summary.latest_turn == index.latest_turn
        assert summary.updated_at == index.updated_at
        for entry in index.turns:
            turn = tasks.get_turn(scope, summary.task_id, entry.turn)
            assert entry.meta == turn.meta
            assert entry.artifacts == tuple(a.name for a in turn.artifacts)
            assert entry.updated_at == turn.updated_at
    assert read_digest(tasks, scope) == expected_digest(tasks, scope)
