"""The project's turn ledger on the tree: ``<t>/<p>/_ledger.sqlite3``, a derived SQLite file
(WAL) beside the listing (core/ledger.py says what it holds and how it is read).

It is written by the holder of a task's lock, after the turn's record committed and after
the listing's transaction, before the write in flight is cleared (tree/tasks.py
``write_derived``, repair.py, removal.py, retention.py): a writer killed in between leaves
its write in flight, and the task's repair sets its entries from the records again. Each
change is one transaction that sets the entries of ``ledger_turns`` and moves the rollups
(core/ledger.py ROLLUPS) and the session homes (``ledger_sessions``) by the difference, so
the file agrees with itself whatever the moment a process dies.

A file that is new, of another schema version, or was replaced or removed by hand since a
connection opened it, is made again and filled from the records by the first connection that
opens it, in one write transaction (as the listing is, listing.py): writers of other tasks
wait for it, then write their own entries over what it read.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from app.storage.core import ledger as lg
from app.storage.core.errors import Corrupt, LockTimeout
from app.storage.core.ledger import LedgerTurn
from app.storage.tree.sqlite.db import create_file, is_busy, open_index, read_txn, write_txn
from app.storage.tree.sqlite.pool import Pool, file_identity

log = logging.getLogger("app.storage")

VERSION = 3
_FIGURES_DDL = ", ".join(f"{f} INTEGER NOT NULL DEFAULT 0" for f in lg.FIGURES)
SCHEMA = (
    """CREATE TABLE ledger_turns (
    task_id TEXT NOT NULL, turn INTEGER NOT NULL, at_us INTEGER NOT NULL, day INTEGER NOT NULL,
    agent TEXT NOT NULL, model TEXT NOT NULL, branch TEXT NOT NULL, session TEXT NOT NULL,
    git_commit TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL, cache_creation_tokens INTEGER NOT NULL,
    cost_nusd INTEGER, wall_us INTEGER NOT NULL, exit_code INTEGER,
    PRIMARY KEY (task_id, turn)) WITHOUT ROWID""",
    # The timeline: newest first, whole or of one agent, model or branch (a page is one
    # index range read from its end, however many turns the others have).
    "CREATE INDEX ledger_turns_recent ON ledger_turns (at_us, task_id, turn)",
    "CREATE INDEX ledger_turns_agent ON ledger_turns (agent, at_us, task_id, turn)",
    "CREATE INDEX ledger_turns_model ON ledger_turns (model, at_us, task_id, turn)",
    "CREATE INDEX ledger_turns_branch ON ledger_turns (branch, at_us, task_id, turn)",
    # A session's first turn, when one of its turns changes.
    "CREATE INDEX ledger_turns_session ON ledger_turns (session, at_us, task_id, turn)"
    " WHERE session <> ''",
    f"""CREATE TABLE ledger_models (day INTEGER NOT NULL, agent TEXT NOT NULL,
    model TEXT NOT NULL, {_FIGURES_DDL}, PRIMARY KEY (day DESC, model, agent)) WITHOUT ROWID""",
    f"""CREATE TABLE ledger (day INTEGER NOT NULL, agent TEXT NOT NULL, model TEXT NOT NULL,
    branch TEXT NOT NULL, {_FIGURES_DDL}, PRIMARY KEY (day, agent, model, branch)) WITHOUT ROWID""",
    f"""CREATE TABLE ledger_tasks (task_id TEXT NOT NULL, session TEXT NOT NULL,
    day INTEGER NOT NULL, agent TEXT NOT NULL, model TEXT NOT NULL, branch TEXT NOT NULL,
    {_FIGURES_DDL}, PRIMARY KEY (task_id, session, day, agent, model, branch)) WITHOUT ROWID""",
    "CREATE INDEX ledger_tasks_day ON ledger_tasks (day)",
    "CREATE INDEX ledger_tasks_session ON ledger_tasks (session, task_id)",
    """CREATE TABLE ledger_sessions (session TEXT PRIMARY KEY, at_us INTEGER NOT NULL,
    task_id TEXT NOT NULL, turn INTEGER NOT NULL, day INTEGER NOT NULL, agent TEXT NOT NULL,
    model TEXT NOT NULL, branch TEXT NOT NULL) WITHOUT ROWID""",
)
_TURN_COLUMNS = ", ".join(("task_id", "turn", *lg.TURN_COLUMNS))
_INSERT_TURN = f"INSERT INTO ledger_turns ({_TURN_COLUMNS}) VALUES ({', '.join('?' * 16)})"
_ADD = ", ".join(f"{f} = {f} + excluded.{f}" for f in lg.ADDED)


def _upsert(table: str, keys: Sequence[str]) -> str:
    columns = (*keys, *lg.ADDED)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {_ADD}"
    )


def _matching(key: Sequence[str]) -> str:
    return " AND ".join(f"{k} = ?" for k in key)


_UPSERTS = {table: _upsert(table, key) for table, key in lg.ROLLUPS.items()}
# A row of each rollup left with no turn goes (a session is counted only where it has one).
_EMPTIED = {t: f"DELETE FROM {t} WHERE {_matching(k)} AND turns = 0" for t, k in lg.ROLLUPS.items()}
_SESSIONS = {
    t: f"UPDATE {t} SET sessions = sessions + ? WHERE {_matching(k)}" for t, k in lg.ROLLUPS.items()
}
_HOME = "at_us, task_id, turn, day, agent, model, branch"
_HOME_COLUMNS = ("at_us", "task_id", "turn", "day", "agent", "model", "branch")

# Writes every task's entries into a ledger made just now, through the connection given,
# inside its write transaction (tree/listing_fill.py); the number of tasks written.
Fill = Callable[[sqlite3.Connection], int]
POOL_LIMIT = 16


class Ledger:
    """Open the ledger of one project; cheap to construct (connections are pooled)."""

    _pool: Pool[tuple[int, int] | None] = Pool(POOL_LIMIT)

    def __init__(self, path: Path, *, timeout: float, fill: Fill | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self.fill = fill
        self.made: int | None = None  # the tasks filled in, when this object made the file

    def ready(self) -> int | None:
        """Open the file, making it from the records if it has to be (see the module); how
        many tasks that filled in, None when it was there already."""
        with self._damaged(), self._use():
            pass
        return self.made

    # -- connections -----------------------------------------------------------------------
    def _open(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        key = str(self.path)
        create_file(key)
        conn = open_index(key, timeout=self.timeout)
        try:
            if _version(conn) != VERSION:
                self._make(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if is_busy(exc):
                raise LockTimeout(f"ledger is busy: {exc}") from None
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise Corrupt(f"{self.path}: damaged ({exc}): run fsck --repair") from None
        except BaseException:
            conn.close()
            raise
        return conn, file_identity(key)

    def _make(self, conn: sqlite3.Connection) -> None:
        """Make the ledger of the current version and fill it from the records (see the
        module), once, by the first process there."""
        with write_txn(conn, "ledger"):
            found = _version(conn)
            if found == VERSION:
                return  # made by another process while this one waited
            _drop_all(conn)
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {VERSION}")
            count = self.fill(conn) if self.fill is not None else 0
            rebuild_rollups(conn)
        self.made = count
        # A new project's ledger holds the task being written; any other was lost or stale.
        log.log(
            logging.WARNING if found or count > 1 else logging.DEBUG,
            "%s: ledger of schema version %s made again from the records (%d task(s))",
            self.path,
            found,
            count,
        )

    def _use(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        key = str(self.path)
        # A file replaced or removed by hand since a connection opened it is made again.
        return self._pool.use(key, self._open, accept=lambda tag: tag == file_identity(key))

    @classmethod
    def forget(cls, path: Path) -> None:
        key = str(path)
        cls._pool.forget(lambda k: k == key)

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        with self._damaged(), self._use() as conn, write_txn(conn, "ledger"):
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._damaged(), self._use() as conn, read_txn(conn):
            yield conn

    @contextlib.contextmanager
    def _damaged(self) -> Iterator[None]:
        """A file SQLite finds damaged is Corrupt (a 500 naming fsck, which makes it again
        from the records); a busy or full one stays what it is (503, 507)."""
        try:
            yield
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            raise Corrupt(f"{self.path}: damaged ({exc}): run fsck --repair") from None

    # -- writes ----------------------------------------------------------------------------
    def put_turn(self, task_id: str, turn: int, entry: LedgerTurn | None) -> None:
        """Make one turn's entry ``entry`` (None: the turn is gone)."""
        with self.write() as conn:
            old = _entries(conn, task_id, turn)
            change(conn, old, [] if entry is None else [entry])

    def set_task(self, task_id: str, entries: Iterable[LedgerTurn]) -> None:
        """Make the task's entries exactly ``entries`` (none: the task is gone)."""
        with self.write() as conn:
            change(conn, _entries(conn, task_id), list(entries))

    def set_tasks(self, tasks: Mapping[str, list[LedgerTurn]], batch: int = 1000) -> None:
        """:meth:`set_task` for many tasks, ``batch`` of them per transaction (an import)."""
        items = list(tasks.items())
        for start in range(0, len(items), batch):
            with self.write() as conn:
                for task_id, entries in items[start : start + batch]:
                    change(conn, _entries(conn, task_id), entries)

    # -- reads -----------------------------------------------------------------------------
    def query(self, sql: lg.Sql) -> list[tuple[Any, ...]]:
        with self.read() as conn:
            return conn.execute(sql.text, sql.params).fetchall()

    def queries(self, *sqls: lg.Sql) -> list[list[tuple[Any, ...]]]:
        """Each query's rows, from one snapshot."""
        with self.read() as conn:
            return [conn.execute(s.text, s.params).fetchall() if s.text else [] for s in sqls]

    # -- fsck ------------------------------------------------------------------------------
    def task_entries(self, task_id: str) -> list[LedgerTurn]:
        with self.read() as conn:
            return _entries(conn, task_id)

    def task_ids(self) -> list[str]:
        """Every task id with entries, in id order."""
        with self.read() as conn:
            rows = conn.execute("SELECT DISTINCT task_id FROM ledger_turns ORDER BY 1").fetchall()
        return [str(task_id) for (task_id,) in rows]

    def rollup_faults(self) -> list[str]:
        """How the rollups and session homes differ from a recount of the entries (one
        snapshot); none when they agree. SQLite compares them, in its sorter (which spills
        to a temporary file), so fsck's memory does not grow with the project."""
        faults = []
        with self.read() as conn:
            for table, keys in lg.ROLLUPS.items():
                columns = (*keys, *lg.FIGURES)
                have = f"SELECT {', '.join(columns)} FROM {table}"
                differ = _differing(conn, columns, have, lg.recount_sql(table))
                if differ:
                    faults.append(f"{table}: {differ} row(s) differ from a recount")
            have = f"SELECT session, {_HOME} FROM ledger_sessions"
            differ = _differing(conn, ("session", *_HOME_COLUMNS), have, lg.homes_sql())
            if differ:
                faults.append(f"ledger_sessions: {differ} session(s) misplaced")
        return faults

    def rebuild_rollups(self) -> None:
        """Set the rollups and session homes to a recount of the entries (fsck repair)."""
        with self.write() as conn:
            rebuild_rollups(conn)

    def checkpoint(self) -> bool:
        """Move the WAL into the file and empty it: what a delete removed leaves the disk
        (secure_delete zeroed the file's pages; the WAL held their old images). False when a
        reader's snapshot kept it."""
        with self._use() as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _drop_all(conn: sqlite3.Connection) -> None:
    """Drop every table of the file, whatever its version (freed pages are zeroed)."""
    names = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for (name,) in names:
        conn.execute('DROP TABLE IF EXISTS "' + str(name).replace('"', '""') + '"')


def _differing(conn: sqlite3.Connection, columns: Sequence[str], have: str, want: str) -> int:
    """How many rows are in one of the queries ``have`` and ``want`` (each of ``columns``,
    no row twice) and not in the other."""
    names = ", ".join(columns)
    (count,) = conn.execute(
        f"SELECT count(*) FROM (SELECT {names} FROM"
        f" (SELECT * FROM ({have}) UNION ALL SELECT * FROM ({want}))"
        f" GROUP BY {names} HAVING count(*) = 1)"
    ).fetchone()
    return int(count)


def _entries(conn: sqlite3.Connection, task_id: str, turn: int | None = None) -> list[LedgerTurn]:
    sql = f"SELECT {_TURN_COLUMNS} FROM ledger_turns WHERE task_id = ?"
    args: tuple[Any, ...] = (task_id,)
    if turn is not None:
        sql += " AND turn = ?"
        args += (turn,)
    return [lg.row_of(r[0], r[1], r[2:]) for r in conn.execute(sql + " ORDER BY turn", args)]


def change(conn: sqlite3.Connection, old: list[LedgerTurn], new: list[LedgerTurn]) -> None:
    """Replace the entries ``old`` (as stored) by ``new`` (inside a write transaction): the
    rollups move by the difference, then each session whose turns changed finds its first
    turn again, then rollup rows left with no turn go."""
    before = {(e.task_id, e.turn): e for e in old}
    after = {(e.task_id, e.turn): e for e in new}
    gone = [e for k, e in before.items() if after.get(k) != e]
    made = [e for k, e in after.items() if before.get(k) != e]
    if not gone and not made:
        return
    for entry in gone:
        conn.execute(
            "DELETE FROM ledger_turns WHERE task_id = ? AND turn = ?", (entry.task_id, entry.turn)
        )
        _move(conn, entry, -1)
    for entry in made:
        conn.execute(_INSERT_TURN, (entry.task_id, entry.turn, *entry.values()))
        _move(conn, entry, 1)
    for session in sorted({e.session for e in (*gone, *made) if e.session}):
        _settle_home(conn, session)
    for entry in gone:
        for table, key in lg.ROLLUPS.items():
            conn.execute(_EMPTIED[table], _key_of(entry, key))


def _key_of(entry: LedgerTurn | dict[str, Any], key: Sequence[str]) -> tuple[Any, ...]:
    get = entry.get if isinstance(entry, dict) else partial(getattr, entry)
    return tuple(get(k) for k in key)


def _move(conn: sqlite3.Connection, entry: LedgerTurn, sign: int) -> None:
    figures = [sign * v for v in entry.contribution()]
    for table, key in lg.ROLLUPS.items():
        conn.execute(_UPSERTS[table], (*_key_of(entry, key), *figures))


def _settle_home(conn: sqlite3.Connection, session: str) -> None:
    """Count ``session`` in the rows of its first turn (none when it has no turn left)."""
    home = conn.execute(
        f"SELECT {_HOME} FROM ledger_turns WHERE session = ? ORDER BY at_us, task_id, turn LIMIT 1",
        (session,),
    ).fetchone()
    was = conn.execute(f"SELECT {_HOME} FROM ledger_sessions WHERE session = ?", (session,))
    was = was.fetchone()
    if was == home:
        return
    for found, sign in ((was, -1), (home, 1)):
        if found is None:
            continue
        place = {"session": session, **dict(zip(_HOME_COLUMNS, found, strict=True))}
        for table, key in lg.ROLLUPS.items():
            conn.execute(_SESSIONS[table], (sign, *_key_of(place, key)))
    if home is None:
        conn.execute("DELETE FROM ledger_sessions WHERE session = ?", (session,))
    else:
        conn.execute(
            f"INSERT OR REPLACE INTO ledger_sessions (session, {_HOME}) VALUES (?, ?, ?, ?, ?,"
            " ?, ?, ?)",
            (session, *home),
        )


def rebuild_rollups(conn: sqlite3.Connection) -> None:
    """Set ``ledger``, ``ledger_tasks`` and ``ledger_sessions`` to a recount of
    ``ledger_turns`` (inside a write transaction)."""
    conn.execute("DELETE FROM ledger_sessions")
    conn.execute(f"INSERT INTO ledger_sessions (session, {_HOME}) {lg.homes_sql()}")
    for table, keys in lg.ROLLUPS.items():
        conn.execute(f"DELETE FROM {table}")
        conn.execute(
            f"INSERT INTO {table} ({', '.join(keys)}, {', '.join(lg.FIGURES)})"
            f" {lg.recount_sql(table)}"
        )


def fill_entries(conn: sqlite3.Connection, entries: Iterable[LedgerTurn]) -> None:
    """Add the entries of a task to a ledger being filled (the rollups are recounted once
    every task is in: :func:`rebuild_rollups`)."""
    conn.executemany(_INSERT_TURN, [(e.task_id, e.turn, *e.values()) for e in entries])
