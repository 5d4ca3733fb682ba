"""The SQL of a project's listing index (listing.py): its schema, the migration of a listing
an older version wrote, and the statements that set a task's rows, each in the caller's
transaction.

A task's ``tasks`` row keeps its turn count, latest turn and earliest turn expiry, and the
owner, model, agent_id and exit_code of its highest turn, recomputed from its ``turns`` rows
in the transaction that writes them: a page reads them and falls back to the live turns only
for a task one of whose turns has expired (until the sweeper removes the expired rows).
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from app.storage.core.digest import Section
from app.storage.core.models import TaskFilter
from app.storage.core.usage import TurnUsage
from app.storage.tree.sqlite import digestdb, listing_usage as lu, turn_search
from app.storage.tree.sqlite.db import write_txn
from app.storage.tree.sqlite.turn_search import TurnText

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL,
    turn_count INTEGER NOT NULL DEFAULT 0,
    latest_turn INTEGER,
    min_retain_us INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    model TEXT,
    agent_id TEXT,
    exit_code INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_recent ON tasks (updated_us DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS tasks_expiry ON tasks (retain_until_us);
CREATE TABLE IF NOT EXISTS turns (
    task_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    retain_until_us INTEGER NOT NULL,
    owner TEXT,
    model TEXT,
    agent_id TEXT,
    exit_code INTEGER,
    PRIMARY KEY (task_id, turn)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO counters VALUES ('tasks', 0), ('generation', 0);
"""
    + digestdb.SCHEMA
    + lu.SCHEMA
)

# The schema's version (PRAGMA user_version). migrate() brings a listing of any older one up
# to it in one transaction: the aggregate columns of ``tasks`` (turn count, latest turn,
# earliest expiry, and the owner, model, agent_id and exit_code of the highest turn, so that
# a page and the console's filters are index lookups) are added and recomputed from the turn
# rows, and a listing holding tasks without the turn facts, digest sections (digestdb.py) or
# usage rows (listing_usage.py) is marked for the start-up upgrade's backfill, which writes
# them from the records. Until then fsck reports the rows as differing from the records, the
# digest is rendered whole and the usage reads low.
VERSION = 5
_OF_TASK = "FROM turns u WHERE u.task_id = tasks.task_id"
_LATEST = f"{_OF_TASK} ORDER BY u.turn DESC LIMIT 1"
_AGGREGATES = (
    ("turn_count", "INTEGER NOT NULL DEFAULT 0", f"SELECT count(*) {_OF_TASK}"),
    ("latest_turn", "INTEGER", f"SELECT max(turn) {_OF_TASK}"),
    (
        "min_retain_us",
        "INTEGER NOT NULL DEFAULT 0",
        f"SELECT coalesce(min(retain_until_us), 0) {_OF_TASK}",
    ),
    ("owner", "TEXT", f"SELECT u.owner {_LATEST}"),
    ("model", "TEXT", f"SELECT u.model {_LATEST}"),
    ("agent_id", "TEXT", f"SELECT u.agent_id {_LATEST}"),
    ("exit_code", "INTEGER", f"SELECT u.exit_code {_LATEST}"),
)
_TURN_FACTS = ("owner", "model", "agent_id", "exit_code")
RECOMPUTE = "UPDATE tasks SET " + ", ".join(f"{column} = ({sub})" for column, _, sub in _AGGREGATES)
STALE = "SELECT task_id FROM tasks WHERE " + " OR ".join(
    f"{column} IS NOT ({sub})" for column, _, sub in _AGGREGATES
)
# The console's filters: each has an index whose order is the page order, so a filtered
# page walks matching rows only; exit_code <> 0 has a partial one (NULL, unknown, is left out).
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS tasks_model ON tasks (model, updated_us DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS tasks_agent ON tasks (agent_id, updated_us DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS tasks_failed ON tasks (updated_us DESC, task_id DESC)"
    " WHERE exit_code <> 0",
)
_ALIVE_TURNS = "FROM turns u WHERE u.task_id = t.task_id AND u.retain_until_us > :now"
_ALL_ALIVE = "t.min_retain_us > :now"


def _live(column: str) -> str:
    """``column`` of the task's highest live turn: the stored one while every turn lives."""
    return (
        f"CASE WHEN {_ALL_ALIVE} THEN t.{column} ELSE"
        f" (SELECT u.{column} {_ALIVE_TURNS} ORDER BY u.turn DESC LIMIT 1) END"
    )


DIGEST_ROWS = (
    "SELECT t.task_id, t.updated_us, CASE WHEN"
    f" {_ALL_ALIVE} THEN t.latest_turn ELSE (SELECT max(turn) {_ALIVE_TURNS}) END"
    " FROM tasks t WHERE t.retain_until_us > :now ORDER BY t.updated_us DESC, t.task_id DESC"
)
PAGE_COLUMNS = (
    "SELECT t.task_id, t.updated_us, t.retain_until_us,"
    f" CASE WHEN {_ALL_ALIVE} THEN t.turn_count ELSE (SELECT count(*) {_ALIVE_TURNS}) END,"
    f" CASE WHEN {_ALL_ALIVE} THEN t.latest_turn ELSE (SELECT max(turn) {_ALIVE_TURNS}) END,"
    f" t.owner, {_live('model')}, {_live('agent_id')}, {_live('exit_code')}"
    " FROM tasks t"
)


TURN_VALUES = ", ".join("?" * 8)


def filter_terms(only: TaskFilter, params: dict[str, object]) -> str:
    """The WHERE terms of ``only``, its values added to ``params``; each column test can use
    an index.

    The stored columns are those of the task's highest turn; once a turn has expired (until
    the sweeper drops it) the highest live turn's value is checked as well.
    """
    where = ""
    if only.prefix:
        # A range on the primary key: ids are ASCII, compared as bytes.
        where += " AND t.task_id >= :lo AND t.task_id < :hi"
        params["lo"], params["hi"] = only.prefix_range()
    for column, value in (("model", only.model), ("agent_id", only.agent_id)):
        if value is not None:
            where += f" AND t.{column} = :{column} AND ({_live(column)}) = :{column}"
            params[column] = value
    if only.failed:
        where += f" AND t.exit_code <> 0 AND ({_live('exit_code')}) <> 0"
    return where


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a listing written by an older version to ``VERSION`` (once, by one process)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= VERSION:
        return
    with write_txn(conn, "listing index"):
        if conn.execute("PRAGMA user_version").fetchone()[0] >= VERSION:
            return  # another process migrated it while this one waited
        have = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
        for column, declaration, _ in _AGGREGATES:
            if column not in have:
                conn.execute(f"ALTER TABLE tasks ADD COLUMN {column} {declaration}")
        have = {row[1] for row in conn.execute("PRAGMA table_info(turns)")}
        for column, declaration, _ in _AGGREGATES:
            if column in _TURN_FACTS and column not in have:
                conn.execute(f"ALTER TABLE turns ADD COLUMN {column} {declaration}")
                # Rows written before have no facts: the start-up upgrade rebuilds them from
                # the records (TaskStore.backfill_listing).
                conn.execute("INSERT OR REPLACE INTO counters VALUES ('backfill', 1)")
        has_tasks = conn.execute("SELECT 1 FROM tasks LIMIT 1").fetchone()
        if has_tasks and not conn.execute("SELECT 1 FROM digest LIMIT 1").fetchone():
            conn.execute("INSERT OR REPLACE INTO counters VALUES ('backfill', 1)")
        lu.migrate(conn, has_tasks=bool(has_tasks))
        conn.execute(
            "DELETE FROM counters WHERE name IN"
            " ('digest_generation', 'digest_valid_until_us', 'digest_rendered_us')"
        )
        conn.execute(RECOMPUTE)
        for statement in _INDEXES:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {VERSION}")


def set_task(
    conn: sqlite3.Connection,
    task_id: str,
    rows: list[TurnRow],
    section: Section | None,
    texts: Mapping[int, TurnText] | None = None,
    usage: list[TurnUsage] | None = None,
) -> None:
    if usage is not None or not rows:
        lu.set_task(conn, task_id, usage or [])
    existed = conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    conn.execute("DELETE FROM turns WHERE task_id = ?", (task_id,))
    turn_search.set_task(conn, task_id, [r.turn for r in rows], texts)
    if not rows:
        if existed:
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
            conn.execute("UPDATE counters SET value = value - 1 WHERE name = 'tasks'")
        digestdb.put_section(conn, task_id, None)
        return
    conn.executemany(f"INSERT INTO turns VALUES ({TURN_VALUES})", [r.values(task_id) for r in rows])
    conn.execute(
        "INSERT INTO tasks (task_id, updated_us, retain_until_us) VALUES (?, ?, ?)"
        " ON CONFLICT (task_id) DO UPDATE SET"
        " updated_us = excluded.updated_us, retain_until_us = excluded.retain_until_us",
        (task_id, max(r.updated_us for r in rows), max(r.retain_until_us for r in rows)),
    )
    conn.execute(f"{RECOMPUTE} WHERE task_id = ?", (task_id,))
    if not existed:
        conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'tasks'")
    digestdb.put_section(conn, task_id, section)


@dataclass(frozen=True, slots=True)
class TurnRow:
    turn: int
    updated_us: int
    retain_until_us: int
    owner: str | None = None
    model: str | None = None
    agent_id: str | None = None
    exit_code: int | None = None

    def values(self, task_id: str) -> tuple[object, ...]:
        return (
            task_id,
            self.turn,
            self.updated_us,
            self.retain_until_us,
            self.owner,
            self.model,
            self.agent_id,
            self.exit_code,
        )
