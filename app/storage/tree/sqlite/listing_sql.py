"""The SQL of a project's listing index (listing.py): its schema, how a listing of another
schema version is cleared to be rebuilt, and the statements that set a task's rows, each in
the caller's transaction.

A task's ``tasks`` row keeps its turn count, latest turn and earliest turn expiry, and the
owner, model, agent_id and exit_code of its highest turn, recomputed from its ``turns`` rows
in the transaction that writes them: a page reads them and falls back to the live turns only
for a task one of whose turns has expired (until the sweeper removes the expired rows).
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.storage.core.digest import Section
from app.storage.core.models import TaskFilter
from app.storage.core.task_list import needle
from app.storage.core.usage import TurnUsage
from app.storage.tree.sqlite import digestdb, fts, listing_usage as lu, turn_search
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
    exit_code INTEGER,
    bytes INTEGER NOT NULL DEFAULT 0
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

# The schema's version (PRAGMA user_version). A listing of any other version is not changed
# in place: it is dropped and made again, and its rows written from the records, in one
# transaction (listing.py). Each task row keeps aggregates of its turn rows (turn count,
# latest turn, earliest expiry, bytes, and the owner, model, agent_id and exit_code of the
# highest turn), so that a page, the console's orders and its filters are index lookups.
VERSION = 8
_OF_TASK = "FROM turns u WHERE u.task_id = tasks.task_id"
_LATEST = f"{_OF_TASK} ORDER BY u.turn DESC LIMIT 1"
_AGGREGATES = (
    ("turn_count", f"SELECT count(*) {_OF_TASK}"),
    ("latest_turn", f"SELECT max(turn) {_OF_TASK}"),
    ("min_retain_us", f"SELECT coalesce(min(retain_until_us), 0) {_OF_TASK}"),
    ("owner", f"SELECT u.owner {_LATEST}"),
    ("model", f"SELECT u.model {_LATEST}"),
    ("agent_id", f"SELECT u.agent_id {_LATEST}"),
    ("exit_code", f"SELECT u.exit_code {_LATEST}"),
    (
        "bytes",
        "SELECT coalesce(sum(x.artifact_bytes + x.turn_bytes), 0) FROM usage_turns x"
        " WHERE x.task_id = tasks.task_id",
    ),
)
RECOMPUTE = "UPDATE tasks SET " + ", ".join(f"{column} = ({sub})" for column, sub in _AGGREGATES)
STALE = "SELECT task_id FROM tasks WHERE " + " OR ".join(
    f"{column} IS NOT ({sub})" for column, sub in _AGGREGATES
)
# The console's filters and orders: exit_code <> 0 has a partial index in the page order
# (NULL, unknown, is left out); model and agent substrings resolve to values through theirs.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS tasks_failed ON tasks (updated_us DESC, task_id DESC)"
    " WHERE exit_code <> 0",
    # The distinct models and agents a substring filter resolves to (core/task_list.py).
    "CREATE INDEX IF NOT EXISTS tasks_model ON tasks (model, updated_us DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS tasks_agent ON tasks (agent_id, updated_us DESC, task_id DESC)",
    # The other orders of a page (the task id's is the primary key's).
    "CREATE INDEX IF NOT EXISTS tasks_size ON tasks (bytes DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS tasks_turns ON tasks (turn_count DESC, task_id DESC)",
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
    f" t.owner, {_live('model')}, {_live('agent_id')}, {_live('exit_code')}, t.bytes"
    " FROM tasks t"
)


TURN_VALUES = ", ".join("?" * 8)


def filter_terms(
    only: TaskFilter,
    params: dict[str, object],
    values: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The WHERE terms of ``only``, its values added to ``params``. The prefix and the exit
    code are index ranges; a model or agent substring is an index lookup of the ``values``
    that hold it when they are given (core/task_list.py), else a test on each row the
    page's order walks.

    The stored columns are those of the task's highest turn; once a turn has expired (until
    the sweeper drops it) the highest live turn's value is checked as well.
    """
    where = ""
    if only.prefix:
        # A range on the primary key: ids are ASCII, compared as bytes.
        where += " AND t.task_id >= :lo AND t.task_id < :hi"
        params["lo"], params["hi"] = only.prefix_range()
    for column, value in (("model", only.model), ("agent_id", only.agent_id)):
        found = needle(value)
        if found is None:
            continue
        exact = None if values is None else values.get(column)
        if exact is not None:
            names = [f"{column}_{i}" for i in range(len(exact))]
            params.update(zip(names, exact, strict=True))
            listed = ", ".join(f":{n}" for n in names) or "NULL"
            where += f" AND t.{column} IN ({listed}) AND ({_live(column)}) IN ({listed})"
            continue
        # A substring of the value, ASCII letters in any case: SQLite's lower() and instr()
        # work on exactly those (core/task_list.py).
        where += (
            f" AND instr(lower(t.{column}), :{column}) > 0"
            f" AND instr(lower({_live(column)}), :{column}) > 0"
        )
        params[column] = found
    if only.failed:
        where += f" AND t.exit_code <> 0 AND ({_live('exit_code')}) <> 0"
    return where


def distinct_values(conn: sqlite3.Connection, column: str, limit: int) -> list[str]:
    """Up to ``limit`` distinct values of a tasks ``column``, each one index seek (the
    column's index, skipped value to value)."""
    rows = conn.execute(
        f"WITH RECURSIVE v(x) AS (SELECT min({column}) FROM tasks UNION ALL"
        f" SELECT (SELECT min({column}) FROM tasks WHERE {column} > v.x) FROM v"
        " WHERE v.x IS NOT NULL) SELECT x FROM v WHERE x IS NOT NULL LIMIT ?",
        (limit,),
    ).fetchall()
    return [r[0] for r in rows]


def version(conn: sqlite3.Connection) -> int:
    """The schema version of the listing ``conn`` opened (0: a new, empty file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def is_empty(conn: sqlite3.Connection) -> bool:
    """Whether the file holds no table: a listing made just now, nothing to rebuild."""
    return conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None


def generation(conn: sqlite3.Connection) -> int:
    """The write sequence number a listing of any version reached (0: none can be read)."""
    try:
        row = conn.execute("SELECT value FROM counters WHERE name = 'generation'").fetchone()
    except sqlite3.DatabaseError:
        return 0
    return int(row[0]) if row and isinstance(row[0], int) else 0


def drop_all(conn: sqlite3.Connection) -> None:
    """Drop every table of the listing, whatever its version (inside a write transaction;
    freed pages are zeroed). The search table first, however damaged (fts.drop_table): its
    shadow tables go with it."""
    fts.drop_table(conn, fts.TEXT)
    fts.drop_table(conn, fts.NEXT)
    objects = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')"
        " AND name NOT LIKE 'sqlite_%' ORDER BY type = 'table'"
    ).fetchall()
    for kind, name in objects:
        quoted = '"' + str(name).replace('"', '""') + '"'
        conn.execute(f"DROP {str(kind).upper()} IF EXISTS {quoted}")


def create(conn: sqlite3.Connection, *, after_generation: int = 0) -> None:
    """Create every table and index of ``VERSION`` in an empty listing (inside a write
    transaction). Its write sequence starts past ``after_generation``: the generation of
    the listing it replaces, so that no digest section or base the old file numbered is
    taken for one of the new file."""
    for statement in _statements(SCHEMA):
        conn.execute(statement)
    for statement in _INDEXES:
        conn.execute(statement)
    turn_search.create_schema(conn)
    conn.execute(
        "UPDATE counters SET value = ? WHERE name = 'generation'", (max(0, after_generation),)
    )
    conn.execute(f"PRAGMA user_version = {VERSION}")


def _statements(script: str) -> list[str]:
    """The statements of ``script`` one by one: executescript() would commit the caller's
    transaction first."""
    found, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    if pending.strip():
        found.append(pending.strip())
    return found


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
