"""A listing of another schema version is rebuilt from the records on its first use, never
changed in place, and answers as before: pages in every order and filter, search, the digest
and the usage counters."""

from __future__ import annotations

import io
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from app.storage.core.errors import Corrupt
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from app.storage.tree.fsck import fsck
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import VERSION
from app.storage.tree.sqlite.store_index import StoreIndex
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock
from tests.storage._helpers import assert_consistent, upkeep_done

SCOPE = Scope("acme", "web")

# A listing schema of an older version (no per-task aggregates, no digest, no search, no
# usage rows): its rows say little, and none of it is read once it is rebuilt.
V1_SCHEMA = """
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE turns (
    task_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL,
    PRIMARY KEY (task_id, turn)
) WITHOUT ROWID;
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters VALUES ('tasks', 1), ('generation', 40), ('backfill', 1);
INSERT INTO tasks VALUES ('stale', 1, 2);
INSERT INTO turns VALUES ('stale', 0, 1, 2);
"""


def _user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def _set_version(path: Path, version: int) -> None:
    """What another version of the code leaves: the same file with its own version number."""
    Listing.forget(path)
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
    finally:
        conn.close()


def _replace_with_v1(path: Path) -> None:
    """An older listing at ``path``: another schema, and rows that differ from the records."""
    Listing.forget(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(V1_SCHEMA)
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    finally:
        conn.close()


def _fill(storage: TreeStorage, clock: FixedClock) -> str:
    """Tasks of every kind a page tells apart (owners, models, agents, exit codes, sizes, an
    expired turn, a deleted task) and a memory store; the store's id."""
    tasks = storage.tasks
    tasks.put_turn(SCOPE, "alpha", 0, meta={"model": "opus", "exit_code": 0}, summary_md="a0")
    clock.advance(days=20)
    tasks.put_turn(SCOPE, "alpha", 1, meta={"model": "opus", "agent_id": "ci-7"}, summary_md="a1")
    for n, task in enumerate(("beta", "gamma", "delta", "gone")):
        clock.advance(seconds=1)
        tasks.put_turn(
            SCOPE,
            task,
            0,
            meta={"model": f"m{n}", "exit_code": n, "agent_id": f"agent-{n}"},
            summary_md=f"## {task}\nThe wombat number {n} Qqzxfill.",
            actor=f"tok{n}",
        )
    tasks.put_artifact(
        SCOPE, "gamma", 0, "log.txt", io.BytesIO(b"x" * 5000), content_type="text/plain"
    )
    tasks.put_turn(SCOPE, "beta", 1, meta={}, summary_md="beta again Qqzxfill")
    tasks.delete_task(SCOPE, "gone")
    clock.advance(days=11)  # alpha's turn 0 is past its 30 days, its turn 1 is not
    store_id = storage.stores.create_store(SCOPE, name="notes").id
    for n in range(3):
        storage.stores.create_memory(
            SCOPE, store_id, path=f"/m{n}.md", content=f"{n} Qqzxfill memory", actor=None
        )
    upkeep_done(tasks)
    return store_id


def _answers(storage: TreeStorage) -> dict[str, Any]:
    """What a client sees of the project: pages, filters, a task, search, usage, project.md."""
    tasks = storage.tasks
    found: dict[str, Any] = {}
    for sort in ("updated", "task_id", "size", "turns"):
        for descending in (True, False):
            page = tasks.list_tasks(SCOPE, sort=sort, descending=descending, limit=3)
            found[f"{sort} {descending}"] = page.tasks, page.total
            if page.next_cursor:
                following = tasks.list_tasks(
                    SCOPE, sort=sort, descending=descending, limit=3, cursor=page.next_cursor
                )
                found[f"{sort} {descending} 2"] = following.tasks
    found["model"] = tasks.list_tasks(SCOPE, model="M2").tasks
    found["agent"] = tasks.list_tasks(SCOPE, agent_id="ci").tasks
    found["failed"] = tasks.list_tasks(SCOPE, failed=True).tasks
    found["prefix"] = tasks.list_tasks(SCOPE, prefix="g").tasks
    found["summary"] = tasks.task_summary(SCOPE, "gamma")
    found["task"] = tasks.get_task(SCOPE, "alpha")
    hits = storage.search(SCOPE, "Qqzxfill", limit=50).hits
    found["search"] = sorted((h.kind, h.task_id, h.turn, h.path) for h in hits)
    found["usage"] = storage.usage(SCOPE)
    file, size = tasks.open_digest(SCOPE)
    with file:
        found["digest"] = file.read(), size
    return found


def test_a_listing_of_another_version_is_rebuilt_and_answers_the_same(
    tmp_path: Path, clock: FixedClock
) -> None:
    root = tmp_path / "root"
    storage = TreeStorage(root, clock=clock, lock_timeout=5.0)
    _fill(storage, clock)
    before = _answers(storage)
    assert before["search"] and before["usage"].memories == 3  # the fixture holds what it should
    path = storage.layout.listing(SCOPE)
    upkeep_done(storage.tasks)
    storage.close()
    _set_version(path, VERSION - 1)

    again = TreeStorage(root, clock=clock, lock_timeout=5.0)
    assert _answers(again) == before
    assert _user_version(path) == VERSION
    assert again.fsck().problems == []
    assert_consistent(again.tasks, SCOPE)
    again.tasks.put_turn(SCOPE, "beta", 2, meta={}, summary_md="after the rebuild")
    assert again.tasks.task_summary(SCOPE, "beta").turn_count == 3
    assert again.fsck().problems == []


def test_an_older_listing_is_rebuilt_from_the_records_not_from_its_rows(
    tmp_path: Path, clock: FixedClock
) -> None:
    """Rows the old file holds that the records do not (and marks it carries) are gone; what
    the records hold, the old file did not, is there."""
    root = tmp_path / "root"
    storage = TreeStorage(root, clock=clock, lock_timeout=5.0)
    _fill(storage, clock)
    before = _answers(storage)
    path = storage.layout.listing(SCOPE)
    upkeep_done(storage.tasks)
    storage.close()
    _replace_with_v1(path)

    again = TreeStorage(root, clock=clock, lock_timeout=5.0)
    assert _answers(again) == before
    assert "stale" not in {t.task_id for t in again.tasks.list_tasks(SCOPE, limit=50).tasks}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM counters WHERE name = 'backfill'").fetchall() == []
        # Numbered past the old file's writes: no section of it is taken for a new one.
        assert (
            conn.execute("SELECT value FROM counters WHERE name = 'generation'").fetchone()[0] > 40
        )
    finally:
        conn.close()
    assert again.fsck().problems == []


def test_a_store_written_first_rebuilds_the_listing_with_every_task(
    tmp_path: Path, clock: FixedClock
) -> None:
    """The first use may be a memory write (it copies the store's usage to the listing): the
    rebuild then writes every task too, and the store's own row."""
    root = tmp_path / "root"
    storage = TreeStorage(root, clock=clock, lock_timeout=5.0)
    store_id = _fill(storage, clock)
    before = _answers(storage)
    path = storage.layout.listing(SCOPE)
    upkeep_done(storage.tasks)
    storage.close()
    _set_version(path, VERSION + 1)  # a newer version's file, as after a rollback

    again = TreeStorage(root, clock=clock, lock_timeout=5.0)
    again.stores.create_memory(SCOPE, store_id, path="/m9.md", content="later", actor=None)
    answers = _answers(again)
    assert answers["usage"].memories == before["usage"].memories + 1
    assert answers["digest"] == before["digest"]
    assert answers["updated True"] == before["updated True"]
    assert again.fsck().problems == []


def test_the_rebuild_never_follows_a_link(tmp_path: Path, clock: FixedClock) -> None:
    """A link planted among the tasks (or the stores) is neither listed nor entered."""
    root = tmp_path / "root"
    storage = TreeStorage(root, clock=clock, lock_timeout=5.0)
    _fill(storage, clock)
    outside = tmp_path / "outside"
    elsewhere = TreeStorage(outside, clock=clock, lock_timeout=5.0)
    elsewhere.tasks.put_turn(SCOPE, "secret", 0, meta={}, summary_md="Qqzxfill outside")
    elsewhere.stores.create_store(SCOPE, name="theirs")
    elsewhere.close()
    project = storage.layout.project_dir(SCOPE)
    os.symlink(outside / "acme" / "web" / "secret", project / "planted")
    stores = storage.layout.stores_dir(SCOPE)
    (theirs,) = (outside / "acme" / "web" / "_stores").iterdir()
    os.symlink(theirs, stores / theirs.name)
    path = storage.layout.listing(SCOPE)
    upkeep_done(storage.tasks)
    storage.close()
    _set_version(path, VERSION - 1)
    StoreIndex._pool.forget(lambda _key: True)

    again = TreeStorage(root, clock=clock, lock_timeout=5.0)
    ids = {t.task_id for t in again.tasks.list_tasks(SCOPE, limit=50).tasks}
    assert ids == {"alpha", "beta", "gamma", "delta"}
    assert all(h.task_id != "secret" for h in again.search(SCOPE, "Qqzxfill", limit=50).hits)
    assert theirs.name not in again.tasks.listing(SCOPE).usage_store_rows()


def test_a_listing_opened_without_its_records_is_refused_and_left_alone(
    tmp_path: Path, clock: FixedClock
) -> None:
    store = TaskStore(tmp_path / "root", clock=clock)
    store.put_turn(SCOPE, "a", 0, meta={}, summary_md="a")
    path = store.layout.listing(SCOPE)
    _set_version(path, VERSION - 1)
    with pytest.raises(Corrupt, match="schema version"):
        Listing(path, timeout=1.0).counts()
    assert _user_version(path) == VERSION - 1
    assert [t.task_id for t in store.list_tasks(SCOPE).tasks] == ["a"]
    assert _user_version(path) == VERSION


def test_a_task_with_an_expired_turn_counts_only_its_live_turns(
    tmp_path: Path, clock: FixedClock
) -> None:
    """The stored aggregates hold until the task's first turn expires; then the page counts
    the live turns itself, until the sweeper removes the expired rows."""
    store = TaskStore(tmp_path / "root", clock=clock)
    store.put_turn(SCOPE, "t", 0, meta={}, summary_md="old")
    clock.advance(days=20)
    store.put_turn(SCOPE, "t", 1, meta={}, summary_md="newer")
    clock.advance(days=11)  # turn 0 is past its 30 days, turn 1 is not
    (task,) = store.list_tasks(SCOPE).tasks
    assert (task.turn_count, task.latest_turn) == (1, 1)


def test_processes_opening_an_older_listing_at_once_rebuild_it_once(tmp_path: Path) -> None:
    """Four processes race to open a listing of another version and write: one rebuilds it
    (its write transaction), the others wait and find the current version; no write is lost,
    no error."""
    from tests.storage import _workers
    from tests.storage._helpers import run_released

    root = tmp_path / "root"
    store = TaskStore(root)  # the system clock, as the workers use
    for turn in range(3):
        store.put_turn(SCOPE, "old", turn, meta={}, summary_md=f"old{turn}")
    path = store.layout.listing(SCOPE)
    _replace_with_v1(path)

    run_released(_workers.write_after_rebuild, [(str(root), w) for w in range(4)])
    final = {t.task_id: t.turn_count for t in TaskStore(root).list_tasks(SCOPE).tasks}
    assert final == {"old": 3, "new-0": 1, "new-1": 1, "new-2": 1, "new-3": 1}
    assert _user_version(path) == VERSION
    assert fsck(TaskStore(root)).problems == []
