"""The per-project listing index: a derived SQLite file (WAL) beside the tasks.

Listing must not scan directories (10,000 task directories cost ~240 ms to scan and parse;
a keyed index answers a page in well under a millisecond), and a turn write must cost the
same whatever the project size, which rules out rewriting a whole-project file per write.
SQLite gives an ordered index, transactions across processes and a crash-safe journal from
the standard library. It is derived: fsck rebuilds it from the records.

The task lock serializes writers of one task; SQLite serializes the short transactions of
writers of different tasks. Each write transaction bumps ``generation`` first: it is the
write's sequence number, which stamps the project digest's sections (tree/sqlite/digestdb.py).

A listing whose schema version is not this code's (listing_sql.VERSION) is rebuilt by the
first connection that opens it, never changed in place: in one write transaction (SQLite's
write lock, which every writer of the listing takes) every table is dropped, the current
schema made, and every task's rows written from its records by the ``fill`` the task engine
gives (tree/listing_fill.py). Readers see the old file or the new one, never a mix. Task
writers need no other lock: a write commits its record before its listing write, which
waits for the rebuild's transaction, so a record the fill did not see yet is written after
it. A process that opens the file meanwhile waits for that transaction, then finds the
current version. The start-up recovery opens every project's listing (its search check,
tree/search_health.py), so a server rebuilds them before it serves: a rebuild holds the
write lock while it reads every record (about a second per 2,000 tasks), and writers wait.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from app.storage.core.digest import DigestRow, Section
from app.storage.core.errors import Corrupt, LockTimeout, StorageError
from app.storage.core.models import TaskFilter
from app.storage.core.query import SearchBudget
from app.storage.core.task_list import TaskOrder, substring_values
from app.storage.core.usage import Reserved, StoreUsage, TurnUsage, Usage
from app.storage.tree.sqlite import (
    digestdb,
    fts,
    fts_purge,
    listing_sql as sql,
    listing_usage as lu,
    turn_search,
)
from app.storage.tree.sqlite.db import create_file, is_busy, open_index, read_txn, write_txn
from app.storage.tree.sqlite.listing_sql import (
    DIGEST_ROWS,
    PAGE_COLUMNS,
    RECOMPUTE,
    STALE,
    TURN_VALUES,
    TurnRow,
    distinct_values,
    filter_terms,
    set_task,
)
from app.storage.tree.sqlite.pool import Pool, file_identity
from app.storage.tree.sqlite.turn_search import TurnText

# Filters matching more tasks than this are walked in page order (the order's index) rather
# than read through the filter's index and sorted: the range costs O(matches), the walk
# O(page * tasks / matches) when the matches are spread through the order; a page reads a few
# thousand rows at most.
_DENSE_MATCHES = 2000
_WALK = {
    "updated": " INDEXED BY tasks_recent",
    "task_id": " NOT INDEXED",  # the table itself is in task id order (WITHOUT ROWID)
    "size": " INDEXED BY tasks_size",
    "turns": " INDEXED BY tasks_turns",
}


log = logging.getLogger("app.storage")

# Writes every task's rows into a listing made just now, through the connection given, inside
# its write transaction (tree/listing_fill.py); the number of tasks written.
Fill = Callable[[sqlite3.Connection], int]

# Listing connections a worker keeps open between uses, shared by its threads (pool.py): with
# the store indexes' (store_index.py), each with db.PAGE_CACHE_KIB of pages, what a worker
# holds whatever its thread count.
POOL_LIMIT = 32


class Listing:
    """Open the listing index of one project; cheap to construct (connections are pooled)."""

    _pool: Pool[tuple[int, int] | None] = Pool(POOL_LIMIT)

    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        fill: Fill | None = None,
        has_tasks: Callable[[], bool] | None = None,
    ) -> None:
        """``fill``: how the task engine writes the rows of a listing of another schema
        version from the records; without it such a listing is refused (Corrupt).
        ``has_tasks``: whether the project holds a task directory (a listing removed by hand
        is made again only then)."""
        self.path = path
        self.timeout = timeout
        self.fill = fill
        self.has_tasks = has_tasks

    # -- connections -----------------------------------------------------------------------
    def _open(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        key = str(self.path)
        create_file(key)
        conn = open_index(key, timeout=self.timeout)
        try:
            if sql.version(conn) != sql.VERSION:
                self._make(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if is_busy(exc):
                raise LockTimeout(f"listing index is busy: {exc}") from None
            raise
        except BaseException:
            conn.close()
            raise
        return conn, file_identity(key)

    def _make(self, conn: sqlite3.Connection) -> None:
        """Make the listing of the current version: the schema in a new file; in a file of
        another version, the schema again and every task's rows from the records (see the
        module), once, by the first process there."""
        with write_txn(conn, "listing index"):
            found = sql.version(conn)
            if found == sql.VERSION:
                return  # made by another process while this one waited
            if sql.is_empty(conn):
                # A new file: a new project's (its fill finds the task being written, if
                # any), or one removed by hand, which the records make again.
                sql.create(conn)
                count = self.fill(conn) if self.fill is not None else 0
                if count > 1:
                    log.warning(
                        "%s: listing made again from the records (%d tasks)", self.path, count
                    )
                return
            if self.fill is None:
                raise Corrupt(
                    f"{self.path}: a listing of schema version {found}, not {sql.VERSION}"
                )
            after = sql.generation(conn)
            sql.drop_all(conn)
            sql.create(conn, after_generation=after)
            # The dropped search text may still be in the WAL: owed a purge, as after a delete.
            fts.removed(conn, owed=True)
            count = self.fill(conn)
        log.warning(
            "%s: listing of schema version %s rebuilt from the records (%d task(s))",
            self.path,
            found,
            count,
        )
        with contextlib.suppress(sqlite3.Error, StorageError):
            fts_purge.purge(conn, "listing index", turn_search.TEXT_COLUMNS)

    def _use(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A pooled connection to this index for the length of a block."""
        key = str(self.path)
        # A file replaced or removed by hand since a connection opened it is made again: a
        # pooled connection would go on reading and writing the removed one.
        return self._pool.use(key, self._open, accept=lambda tag: tag == file_identity(key))

    @classmethod
    def forget(cls, path: Path) -> None:
        """Close the idle connections to the index at ``path``."""
        key = str(path)
        cls._pool.forget(lambda k: k == key)

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``generation`` inside it is this write's sequence number."""
        with self._use() as conn, write_txn(conn, "listing index"):
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'generation'")
            yield conn

    def census(self, now_us: int, since_us: int) -> tuple[int, int, int]:
        """(newest turn write at or before ``since_us``, turns written by then or expired at
        ``now_us``, turns expired at ``now_us``): what the sweep's clock guard weighs
        (core/sweep.py Census)."""
        with self.read() as conn:
            newest, turns, expiring = conn.execute(
                "SELECT coalesce(max(CASE WHEN updated_us <= :since THEN updated_us END), 0),"
                " coalesce(sum(updated_us <= :since OR retain_until_us <= :now), 0),"
                " coalesce(sum(retain_until_us <= :now), 0) FROM turns",
                {"now": now_us, "since": since_us},
            ).fetchone()
        return int(newest), int(turns), int(expiring)

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query inside sees the same snapshot."""
        with self._use() as conn, read_txn(conn):
            yield conn

    def connect(self) -> sqlite3.Connection:
        """A connection of the caller's own (one snapshot held while the cached one writes),
        to a listing of the current version (a pooled one makes it so first)."""
        with self._use():
            pass
        return open_index(str(self.path), timeout=self.timeout)

    def exists(self) -> bool:
        """Whether the project has a listing: the file, or one made now from the records when
        the file was removed by hand while the project holds tasks. A project never written
        to has none, and a read does not make one."""
        if self.path.exists():
            return True
        if self.fill is None or self.has_tasks is None or not self.has_tasks():
            return False
        with self._use():  # opening a new file fills it
            pass
        return True

    # -- writes ----------------------------------------------------------------------------
    def set_task(
        self,
        task_id: str,
        turns: Iterable[TurnRow],
        section: Section | None = None,
        texts: Mapping[int, TurnText] | None = None,
        usage: Iterable[TurnUsage] | None = None,
    ) -> None:
        """Make the rows of ``task_id`` exactly ``turns`` (none: remove the task), its digest
        section ``section`` (None: it has no live turn), its search rows those of ``texts``
        (None: keep those of the turns that remain), and its usage rows ``usage`` (None:
        kept, unless no turn is left)."""
        with self.write() as conn:
            set_task(
                conn, task_id, list(turns), section, texts, None if usage is None else list(usage)
            )

    def set_tasks(
        self,
        tasks: dict[str, tuple[list[TurnRow], Section | None]],
        batch: int = 1000,
        texts: Mapping[str, Mapping[int, TurnText]] | None = None,
        usage: Mapping[str, list[TurnUsage]] | None = None,
    ) -> None:
        """:meth:`set_task` for many tasks, ``batch`` of them per transaction (an import)."""
        items = list(tasks.items())
        for start in range(0, len(items), batch):
            with self.write() as conn:
                for task_id, (rows, section) in items[start : start + batch]:
                    set_task(
                        conn,
                        task_id,
                        rows,
                        section,
                        (texts or {}).get(task_id),
                        None if usage is None else usage[task_id],
                    )

    def put_turn(
        self,
        task_id: str,
        row: TurnRow,
        section: Section | None,
        text: TurnText | None = None,
        usage: TurnUsage | None = None,
        release: str | None = None,
    ) -> fts.Upkeep:
        """Record one written turn and the task's digest section (None: the task has no live
        turn): O(log n) whatever the project size; ``text``: what search finds it by (None:
        unchanged); ``usage``: what it stores, counted in the same transaction, which also
        drops the write's reservation ``release`` (core/usage.py). Returns what the search
        index is owed as this write leaves it (:meth:`search_upkeep`, read in its
        transaction)."""
        with self.write() as conn:
            if text is not None:
                turn_search.put(conn, row.turn, text)
            if usage is not None:
                lu.put_turn(conn, task_id, usage)
            lu.release(conn, release)
            existed = conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            conn.execute(
                f"INSERT INTO turns VALUES ({TURN_VALUES}) ON CONFLICT (task_id, turn) DO UPDATE"
                " SET updated_us = excluded.updated_us, retain_until_us = excluded.retain_until_us,"
                " owner = excluded.owner, model = excluded.model, agent_id = excluded.agent_id,"
                " exit_code = excluded.exit_code",
                row.values(task_id),
            )
            conn.execute(
                "INSERT INTO tasks (task_id, updated_us, retain_until_us) VALUES (?, ?, ?)"
                " ON CONFLICT (task_id) DO UPDATE SET"
                " updated_us = max(updated_us, excluded.updated_us),"
                " retain_until_us = max(retain_until_us, excluded.retain_until_us)",
                (task_id, row.updated_us, row.retain_until_us),
            )
            conn.execute(f"{RECOMPUTE} WHERE task_id = ?", (task_id,))
            if not existed:
                conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'tasks'")
            digestdb.put_section(conn, task_id, section)
            return fts.upkeep(conn)

    # -- usage (tree/sqlite/listing_usage.py) ----------------------------------------------
    def usage(self, now_us: int) -> tuple[Usage, Reserved]:
        """What the project stores and what its writes in flight have reserved, one snapshot."""
        with self.read() as conn:
            return lu.usage(conn), lu.reserved(conn, now_us)

    def reserve(
        self,
        ident: str,
        nbytes: int,
        tasks: int,
        *,
        owner: str,
        now_us: int,
        expires_us: int,
        check: Callable[[Usage, Reserved], None],
    ) -> None:
        """Add to reservation ``ident`` if ``check(usage, reserved)`` (of this same write
        transaction: no other writer of the project can reserve in between) does not raise."""
        with self.maintain() as conn:
            check(lu.usage(conn), lu.reserved(conn, now_us, drop_dead=True))
            lu.reserve(conn, ident, nbytes, tasks, owner, expires_us)

    def renew_reservation(self, ident: str, expires_us: int) -> None:
        with self.maintain() as conn:
            lu.renew(conn, ident, expires_us)

    def release_reservation(self, ident: str) -> None:
        with self.maintain() as conn:
            lu.release(conn, ident)

    def set_store_usage(
        self, store_id: str, usage: StoreUsage | None, release: str | None = None
    ) -> None:
        """Record what a store holds (None: it is gone), dropping the reservation ``release``
        of the write that changed it in the same transaction."""
        with self.maintain() as conn:
            lu.set_store(conn, store_id, usage)
            lu.release(conn, release)

    def usage_turn_rows(self) -> Iterator[tuple[str, list[TurnUsage]]]:
        """Each task's turn usage rows, in task id order (streamed: fsck)."""
        rows = self.stream(
            "SELECT task_id, turn, artifacts, artifact_bytes, turn_bytes FROM usage_turns"
            " ORDER BY task_id, turn"
        )
        for task_id, group in itertools.groupby(rows, key=lambda r: r[0]):
            yield str(task_id), [lu.turn_usage_of(r[1:]) for r in group]

    def usage_of_task(self, task_id: str) -> list[TurnUsage]:
        """One task's turn usage rows, in turn order."""
        with self.read() as conn:
            return lu.task_rows(conn, task_id)

    def usage_store_rows(self) -> dict[str, StoreUsage]:
        """Every store's usage row (a project holds few stores)."""
        with self.read() as conn:
            return lu.store_rows(conn)

    def usage_counter_sums(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The project's usage counters, and the sums of its rows."""
        with self.read() as conn:
            return lu.counter_sums(conn)

    def recount_usage(self) -> None:
        """Set the usage counters to the sums of the usage rows (fsck repair)."""
        with self.maintain() as conn:
            lu.recount(conn)

    # -- search (tree/sqlite/turn_search.py) ----------------------------------------------------
    def search_read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A read transaction for turn_search's queries."""
        return self.read()

    @contextlib.contextmanager
    def maintain(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that changes no task (no new sequence number): search and
        digest upkeep."""
        with self._use() as conn, write_txn(conn, "listing index"):
            yield conn

    def search_write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A write transaction for search maintenance."""
        return self.maintain()

    def purge_search(self, *, only_pending: bool = False, patience: float = 1.0) -> bool:
        """Make removed search text leave the file and its WAL (fts_purge.purge)."""
        with self._use() as conn:
            return fts_purge.purge(
                conn,
                "listing index",
                turn_search.TEXT_COLUMNS,
                only_pending=only_pending,
                patience=patience,
            )

    def purge_owed(self) -> bool:
        """Whether text a delete removed may still be in the file or its WAL (fts.owed)."""
        return self.search_upkeep().owed

    def search_upkeep(self) -> fts.Upkeep:
        """What the search index is owed: a rebuild, a purge, a compaction (one read)."""
        with self._use() as conn:
            return fts.upkeep(conn)

    def start_search_rebuild(self) -> int | None:
        """A damaged search index is dropped and started empty, to be filled from the records
        (fts.start_rebuild): the fill's token, None when there is nothing to fill."""
        with self.maintain() as conn:
            return fts.start_rebuild(conn, turn_search.TEXT_COLUMNS)

    def search_filled(self, token: int) -> None:
        with self.maintain() as conn:
            fts.filled(conn, token)

    def search_damage(self, budget: SearchBudget | None = None) -> str | None:
        """What is wrong with the search index (fts.damage), None when it is sound."""
        with self._use() as conn:
            return fts.damage(conn, budget)

    def search_opens(self) -> str | None:
        """The cheap check of fts.opens: whether the search index opens and reads."""
        with self._use() as conn:
            return fts.opens(conn)

    def mark_search_damaged(self, why: Exception) -> None:
        with self._use() as conn:
            fts.mark_damaged(conn, "listing index", why)

    def search_levels(self) -> int:
        """The level count of the search index's structure (fts.levels)."""
        with self._use() as conn:
            return fts.levels(conn)

    def search_task_ids(self) -> Iterator[str]:
        """Every task id with search rows, in id order (streamed)."""
        for (task_id,) in self.stream(f"SELECT DISTINCT task_id FROM {fts.DOCS} ORDER BY 1"):
            yield str(task_id)

    # -- reads -----------------------------------------------------------------------------
    def page(
        self,
        *,
        now_us: int,
        limit: int,
        order: TaskOrder,
        key: list[Any] | None,
        backward: bool = False,
        only: TaskFilter | None = None,
    ) -> tuple[list[tuple[Any, ...]], int, int | None]:
        """Up to ``limit`` live tasks in ``order`` after ``key`` (before it, read backward)
        as rows of ROW_FIELDS; the project's live tasks; and, with filters, how many match
        (a walk over the matches, which a filter of a substring reads in any case)."""
        params: dict[str, object] = {"now": now_us, "limit": limit}
        where = "t.retain_until_us > :now"
        keyset = ""
        if key is not None:
            keyset = order.keyset(key, params, backward=backward, mark=lambda n: f":{n}")
        source = PAGE_COLUMNS
        with self.read() as conn:
            filters = ""
            if only is not None:
                filters = filter_terms(
                    only,
                    params,
                    substring_values(only, lambda c, n: distinct_values(conn, c, n)),
                )
            matched = None
            if filters:
                (matched,) = conn.execute(
                    f"SELECT count(*) FROM tasks t WHERE {where}{filters}", params
                ).fetchone()
                if matched >= _DENSE_MATCHES:
                    # Many matches: walking the order's index finds a page's worth of them
                    # after a few rows each, where the filter's index would sort them all.
                    source += _WALK[order.sort]
            rows = conn.execute(
                f"{source} WHERE {where}{filters}{keyset}"
                f" ORDER BY {order.order_by(backward=backward)} LIMIT :limit",
                params,
            ).fetchall()
            (count,) = conn.execute("SELECT value FROM counters WHERE name = 'tasks'").fetchone()
            # Rows past their retention but not yet swept are few: count those, not the live ones.
            (expired,) = conn.execute(
                "SELECT count(*) FROM tasks WHERE retain_until_us <= ?", (now_us,)
            ).fetchone()
        return rows, count - expired, matched

    def task_row(self, now_us: int, task_id: str) -> tuple[Any, ...] | None:
        """The page row (ROW_FIELDS) of one live task, or None."""
        with self.read() as conn:
            found: tuple[Any, ...] | None = conn.execute(
                f"{PAGE_COLUMNS} WHERE t.task_id = :id AND t.retain_until_us > :now",
                {"id": task_id, "now": now_us},
            ).fetchone()
        return found

    def generation(self) -> int:
        with self._use() as conn:
            (value,) = conn.execute(
                "SELECT value FROM counters WHERE name = 'generation'"
            ).fetchone()
        return int(value)

    def digest_rows(self, now_us: int) -> list[DigestRow]:
        """Every live task with its highest live turn, in digest order (the reference render's
        input, core/digest.py)."""
        return list(self.digest_stream(now_us))

    def all_tasks(self) -> tuple[dict[str, list[TurnRow]], int]:
        """Every row and the task counter (tests and small tools; fsck goes task by task)."""
        with self.read() as conn:
            tasks: dict[str, list[TurnRow]] = {
                r[0]: [] for r in conn.execute("SELECT task_id FROM tasks")
            }
            for task_id, *row in conn.execute(
                "SELECT task_id, turn, updated_us, retain_until_us, owner, model, agent_id,"
                " exit_code FROM turns ORDER BY task_id, turn"
            ):
                tasks.setdefault(task_id, []).append(TurnRow(*row))
            (count,) = conn.execute("SELECT value FROM counters WHERE name = 'tasks'").fetchone()
        return tasks, int(count)

    def task_rows(self, task_id: str) -> list[TurnRow] | None:
        """The turn rows of one task, by turn; None when it has no tasks row."""
        with self.read() as conn:
            if not conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone():
                return None
            return [
                TurnRow(*row)
                for row in conn.execute(
                    "SELECT turn, updated_us, retain_until_us, owner, model, agent_id,"
                    " exit_code FROM turns WHERE task_id = ? ORDER BY turn",
                    (task_id,),
                )
            ]

    def counts(self) -> tuple[int, int]:
        """The task counter and the number of task rows."""
        with self.read() as conn:
            (counter,) = conn.execute("SELECT value FROM counters WHERE name = 'tasks'").fetchone()
            (rows,) = conn.execute("SELECT count(*) FROM tasks").fetchone()
        return int(counter), int(rows)

    def stream(self, sql: str, params: Any = ()) -> Iterator[tuple[Any, ...]]:
        """The rows of one query, from one snapshot on a connection of its own, one at a time:
        a walk over the whole project in O(1) memory (fsck)."""
        conn = self.connect()
        try:
            conn.execute("PRAGMA cache_size = -256")  # KiB: a walk reads each page once
            with read_txn(conn):
                yield from conn.execute(sql, params)
        finally:
            conn.close()

    def task_ids(self) -> Iterator[str]:
        """Every task id with rows, in id order (streamed)."""
        for (task_id,) in self.stream(
            "SELECT task_id FROM tasks UNION SELECT task_id FROM turns ORDER BY 1"
        ):
            yield str(task_id)

    def digest_stream(self, now_us: int) -> Iterator[DigestRow]:
        """:meth:`digest_rows`, streamed."""
        for row in self.stream(DIGEST_ROWS, {"now": now_us}):
            if row[2] is not None:
                yield DigestRow(*row)

    def stale_aggregates(self) -> list[str]:
        """Tasks whose turn count, latest turn or earliest expiry differ from their turn rows
        (fsck; ``set_task`` recomputes them)."""
        with self._use() as conn:
            return [r[0] for r in conn.execute(f"{STALE} ORDER BY task_id")]

    def task_updated_us(self, task_id: str) -> int | None:
        with self._use() as conn:
            row = conn.execute(
                "SELECT updated_us FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    # -- maintenance (fsck, retention sweeper) ----------------------------------------------
    def task_id_page(self, after: str, limit: int) -> list[str]:
        """Up to ``limit`` task ids after ``after``, in id order (a walk in short reads)."""
        with self._use() as conn:
            rows = conn.execute(
                "SELECT task_id FROM tasks WHERE task_id > ? ORDER BY task_id LIMIT ?",
                (after, limit),
            ).fetchall()
        return [r[0] for r in rows]

    def expired_task_ids(self, *, now_us: int, limit: int, after: str = "") -> list[str]:
        """Tasks with at least one turn past ``retain_until`` (keyset-paged by task id)."""
        with self._use() as conn:
            rows = conn.execute(
                "SELECT DISTINCT task_id FROM turns WHERE retain_until_us <= ? AND task_id > ?"
                " ORDER BY task_id LIMIT ?",
                (now_us, after, limit),
            ).fetchall()
        return [r[0] for r in rows]

    def recount_tasks(self) -> None:
        """Reset the task counter to the number of task rows (fsck repair)."""
        with self.write() as conn:
            conn.execute(
                "UPDATE counters SET value = (SELECT count(*) FROM tasks) WHERE name = 'tasks'"
            )
