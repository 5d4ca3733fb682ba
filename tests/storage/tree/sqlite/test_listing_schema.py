"""A listing written by the previous version (no per-task aggregates) is upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.storage import Scope
from app.storage.tree.fsck import fsck
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import VERSION as _VERSION
from app.storage.tree.tasks import TaskStore
from tests.conftest import FixedClock

# The listing schema of version 1, as session-1 roots have it on disk.
V1_SCHEMA = """
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX tasks_recent ON tasks (updated_us DESC, task_id DESC);
CREATE INDEX tasks_expiry ON tasks (retain_until_us);
CREATE TABLE turns (
    task_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL,
    PRIMARY KEY (task_id, turn)
) WITHOUT ROWID;
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters VALUES ('tasks', 0), ('generation', 0),
    ('digest_generation', -1), ('digest_valid_until_us', 0), ('digest_rendered_us', 0);
"""


def _downgrade(path: Path) -> None:
    """Rewrite ``path`` with the version-1 schema and the same rows."""
    with sqlite3.connect(path) as conn:
        turns = conn.execute(
            "SELECT task_id, turn, updated_us, retain_until_us FROM turns"
        ).fetchall()
        tasks = conn.execute("SELECT task_id, updated_us, retain_until_us FROM tasks").fetchall()
        counters = conn.execute("SELECT * FROM counters").fetchall()
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SCHEMA)
        conn.executemany("INSERT INTO turns VALUES (?, ?, ?, ?)", turns)
        conn.executemany("INSERT INTO tasks VALUES (?, ?, ?)", tasks)
        conn.executemany("INSERT OR REPLACE INTO counters VALUES (?, ?)", counters)
    conn.close()


def test_a_version_1_listing_is_upgraded_and_lists_the_same(
    tmp_path: Path, clock: FixedClock
) -> None:
    store = TaskStore(tmp_path / "root", clock=clock)
    scope = Scope("acme", "web")
    for task, turns in [("a", 3), ("b", 1), ("c", 2)]:
        for turn in range(turns):
            store.put_turn(scope, task, turn, meta={}, summary_md=f"{task}{turn}")
            clock.advance(seconds=1)
    before = store.list_tasks(scope)
    path = store.layout.listing(scope)
    Listing.forget(path)  # this thread's cached connection
    _downgrade(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()

    after = store.list_tasks(scope)
    assert [(t.task_id, t.turn_count, t.latest_turn) for t in after.tasks] == [
        (t.task_id, t.turn_count, t.latest_turn) for t in before.tasks
    ]
    assert {t.task_id: t.turn_count for t in after.tasks} == {"a": 3, "b": 1, "c": 2}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _VERSION
        columns = {r[1] for r in conn.execute("PRAGMA table_info(tasks)")}
    conn.close()
    assert {"turn_count", "latest_turn", "min_retain_us", "owner", "model", "exit_code"} <= columns
    store.put_turn(scope, "b", 1, meta={}, summary_md="b1")
    assert {t.task_id: t.turn_count for t in store.list_tasks(scope).tasks}["b"] == 2
    assert store.backfill_listing(scope) == 3  # the start-up upgrade: search rows, facts
    assert fsck(store).problems == []


def test_a_task_with_an_expired_turn_counts_only_its_live_turns(
    tmp_path: Path, clock: FixedClock
) -> None:
    """The stored aggregates hold until the task's first turn expires; then the page counts
    the live turns itself, until the sweeper removes the expired rows."""
    store = TaskStore(tmp_path / "root", clock=clock)
    scope = Scope("acme", "web")
    store.put_turn(scope, "t", 0, meta={}, summary_md="old")
    clock.advance(days=20)
    store.put_turn(scope, "t", 1, meta={}, summary_md="newer")
    clock.advance(days=11)  # turn 0 is past its 30 days, turn 1 is not
    (task,) = store.list_tasks(scope).tasks
    assert (task.turn_count, task.latest_turn) == (1, 1)


def test_processes_opening_an_old_listing_at_once_upgrade_it_once(tmp_path: Path) -> None:
    """Four processes race to open a version-1 listing and write: one migrates (BEGIN
    IMMEDIATE), the others wait and see the current version; no write is lost, no error."""
    from tests.storage import _workers
    from tests.storage._helpers import run_released

    root = tmp_path / "root"
    store = TaskStore(root)  # the system clock, as the workers use
    scope = Scope("acme", "web")
    for turn in range(3):
        store.put_turn(scope, "old", turn, meta={}, summary_md=f"old{turn}")
    path = store.layout.listing(scope)
    Listing.forget(path)
    _downgrade(path)

    run_released(_workers.write_after_upgrade, [(str(root), w) for w in range(4)])
    final = {t.task_id: t.turn_count for t in TaskStore(root).list_tasks(scope).tasks}
    assert final == {"old": 3, "new-0": 1, "new-1": 1, "new-2": 1, "new-3": 1}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == _VERSION
    conn.close()
    store.backfill_listing(scope)  # the start-up upgrade: search rows, facts
    assert fsck(TaskStore(root)).problems == []


def test_rows_from_before_the_meta_columns_are_reported_and_repaired(
    tmp_path: Path, clock: FixedClock
) -> None:
    """A listing upgraded from a version without owner/model/agent_id/exit_code has them
    unknown: the filters do not match those tasks until fsck --repair rebuilds their rows."""
    store = TaskStore(tmp_path / "root", clock=clock)
    scope = Scope("acme", "web")
    store.put_turn(scope, "a", 0, meta={"model": "m", "exit_code": 3}, summary_md="a", actor="tok")
    store.put_turn(scope, "b", 0, meta={}, summary_md="b")
    path = store.layout.listing(scope)
    Listing.forget(path)
    _downgrade(path)

    assert [t.task_id for t in store.list_tasks(scope, model="m").tasks] == []
    report = fsck(store)
    assert any("rows of task a differ" in p for p in report.problems), report.problems
    assert not any("task b" in p for p in report.problems)  # nothing to know about b
    assert fsck(store, repair=True).repaired
    (a,) = store.list_tasks(scope, model="m", failed=True).tasks
    assert (a.task_id, a.owner, a.model, a.exit_code) == ("a", "tok", "m", 3)
    assert fsck(store).problems == []
