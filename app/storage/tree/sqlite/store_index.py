"""The per-store index: a derived SQLite file (WAL) beside the version records.

It answers "which memory lives at this path", the occupancy checks, ordered pages of
memories and filtered pages of versions without reading every record. It is derived:
``rows_from_records`` computes its whole content from the version files, which is what
repair and fsck use. Only the holder of the store lock writes it; readers open it without
any lock and see a consistent snapshot inside one read transaction.

It also holds the store's search index (tree/sqlite/fts.py): one FTS5 row per live memory,
its path and content, written in the same transaction as the memory's row, so a memory is
found exactly while it lives at its path with that content.

Every SQL statement of the memory-store engine is here, as a named query of
:class:`IndexReader` / :class:`IndexWriter`.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import contextlib
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.storage.core.query import SearchBudget
from app.storage.core.store_models import VersionFilter
from app.storage.core.store_paging import filter_clause
from app.storage.core.store_records import (
    MemoryRow,
    VersionRecord,
    VersionRow,
    memory_row,
    version_row,
)
from app.storage.core.usage import StoreUsage
from app.storage.tree.sqlite import fts, fts_purge
from app.storage.tree.sqlite.db import (
    create_file,
    open_index,
    read_txn,
    write_txn,
)
from app.storage.tree.sqlite.fts import DOCS, TEXT
from app.storage.tree.sqlite.pool import Pool, file_identity

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    head TEXT NOT NULL,
    sha TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    path_since TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions (
    id TEXT PRIMARY KEY,
    memory_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    path TEXT,
    sha TEXT,
    size INTEGER,
    created_by TEXT,
    actor_type TEXT,
    actor_id TEXT,
    created_us INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    redacted_at TEXT,
    redacted_by TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS versions_by_memory ON versions (memory_id, id);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
"""
# What the store holds (core/usage.py), moved by every write in the transaction of its rows.
_USAGE_TABLE = "usage_counters"
_USAGE_NAMES = ("memories", "memory_bytes", "versions", "version_bytes")
_USAGE_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {_USAGE_TABLE} (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
    " WITHOUT ROWID"
)
_USAGE_FROM_ROWS = (
    "SELECT (SELECT count(*) FROM memories), (SELECT coalesce(sum(size), 0) FROM memories),"
    " (SELECT count(*) FROM versions), (SELECT coalesce(sum(size), 0) FROM versions)"
)
_USAGE_ADD = f"UPDATE {_USAGE_TABLE} SET value = value + ? WHERE name = ?"

MEMORY_COLUMNS = "id, path, head, sha, size, created_at, updated_at, path_since"
VERSION_COLUMNS = (
    "id, memory_id, operation, path, sha, size, created_by, actor_type, actor_id,"
    " created_us, created_at, redacted_at, redacted_by"
)
# bm25 weights of path and content: a word in the path (its name) counts most.
SEARCH_WEIGHTS = "3.0, 1.0"
_SEARCH_DOCS = "doc INTEGER PRIMARY KEY, memory_id TEXT NOT NULL UNIQUE"
_SEARCH_COLUMNS = "path, content"
_TEXT_COLUMNS = ("path", "content")
_SEARCH_HITS = fts.ranked_sql(
    "m.id, m.path",
    SEARCH_WEIGHTS,
    f"JOIN {DOCS} d ON d.doc = f.doc JOIN memories m ON m.id = d.memory_id",
    "1 = 1",
)


@dataclass(frozen=True, slots=True)
class IndexContent:
    memories: list[MemoryRow]
    versions: list[VersionRow]
    last_id: str
    last_us: int


def rows_from_records(records: Iterable[VersionRecord]) -> IndexContent:
    """The whole index as a rebuild from the version records computes it."""
    ordered = sorted(records, key=lambda r: r.id)
    heads: dict[str, VersionRecord] = {}
    for record in ordered:
        heads[record.memory_id] = record
    memories = sorted(
        (memory_row(r) for r in heads.values() if r.operation != "deleted"), key=lambda m: m.id
    )
    last = ordered[-1] if ordered else None
    return IndexContent(
        memories=memories,
        versions=[version_row(r) for r in ordered],
        last_id=last.id if last else "",
        last_us=last.created_us if last else 0,
    )


class IndexReader:
    """Named queries over one open connection (inside one read or write transaction)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def _memory(self, where: str, args: tuple[Any, ...]) -> MemoryRow | None:
        row = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where}", args
        ).fetchone()
        return None if row is None else MemoryRow(*row)

    def memory(self, memory_id: str) -> MemoryRow | None:
        return self._memory("id = ?", (memory_id,))

    def memory_at(self, path: str) -> MemoryRow | None:
        return self._memory("path = ?", (path,))

    def count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM memories").fetchone()[0])

    def state(self) -> tuple[str, int]:
        """The id and time of the store's last version."""
        rows = dict(self.conn.execute("SELECT key, value FROM state").fetchall())
        return str(rows.get("last_id", "")), int(rows.get("last_us", 0))

    def occupant(self, path: str, exclude: str | None) -> tuple[str, str] | None:
        """(id, path) of a memory other than ``exclude`` at ``path``, at an ancestor of it,
        or below it; None when the path is free."""
        segments = path[1:].split("/")
        candidates = [path] + ["/" + "/".join(segments[:i]) for i in range(1, len(segments))]
        marks = ",".join("?" * len(candidates))
        row = self.conn.execute(
            f"SELECT id, path FROM memories WHERE path IN ({marks}) AND id != ?"
            " ORDER BY length(path) LIMIT 1",
            (*candidates, exclude or ""),
        ).fetchone()
        if row is None:
            # '0' follows '/': every path below ``path`` sorts between the two bounds.
            row = self.conn.execute(
                "SELECT id, path FROM memories WHERE path >= ? AND path < ? AND id != ?"
                " ORDER BY path LIMIT 1",
                (path + "/", path + "0", exclude or ""),
            ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def memories_page(self, low: str, high: str, as_of: str, limit: int) -> list[MemoryRow]:
        """Memories with ``low <= path < high`` whose path was set by ``as_of``, in path order."""
        rows = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE path >= ? AND path < ?"
            " AND path_since <= ? ORDER BY path LIMIT ?",
            (low, high, as_of, limit),
        ).fetchall()
        return [MemoryRow(*r) for r in rows]

    def version(self, version_id: str) -> VersionRow | None:
        row = self.conn.execute(
            f"SELECT {VERSION_COLUMNS} FROM versions WHERE id = ?", (version_id,)
        ).fetchone()
        return None if row is None else VersionRow(*row)

    def versions_page(
        self, filters: VersionFilter, before: str | None, limit: int
    ) -> list[VersionRow]:
        """Versions matching ``filters``, newest first, with ids below ``before``."""
        where, args = filter_clause(filters, "?")
        if before is not None:
            where.append("id < ?")
            args.append(before)
        rows = self.conn.execute(
            f"SELECT {VERSION_COLUMNS} FROM versions WHERE {' AND '.join(where)}"
            " ORDER BY id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [VersionRow(*r) for r in rows]

    def store_usage(self) -> StoreUsage:
        """What the store holds: its counters."""
        values = dict(self.conn.execute(f"SELECT name, value FROM {_USAGE_TABLE}").fetchall())
        return StoreUsage(*(int(values.get(n, 0)) for n in _USAGE_NAMES))

    def counted_usage(self) -> StoreUsage:
        """What the store holds, counted from its rows (fsck's comparison)."""
        return StoreUsage(*(int(v) for v in self.conn.execute(_USAGE_FROM_ROWS).fetchone()))

    def live_ids(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT id FROM memories")}

    def version_ages(self) -> list[tuple[str, str, int]]:
        """(id, memory_id, created_us) of every version, newest first (retention)."""
        return [
            (str(r[0]), str(r[1]), int(r[2]))
            for r in self.conn.execute(
                "SELECT id, memory_id, created_us FROM versions ORDER BY id DESC"
            )
        ]

    # -- search -------------------------------------------------------------------------
    def search_ready(self) -> bool:
        """Whether the search index holds every live memory: built, not being filled from the
        records, not marked damaged."""
        if not fts.has_schema(self.conn):
            return False
        marks = fts.upkeep(self.conn)
        return not (marks.backfill or marks.damaged)

    def search_stats(self, terms: list[str]) -> tuple[int, list[int]] | None:
        """fts.stats: None when the search index is not built yet."""
        return fts.stats(self.conn, terms)

    def search_hits(self, params: dict[str, object]) -> list[tuple[float, int, str, str]]:
        """(key, doc, memory id, path) of the best matches (fts.ranked_sql's parameters)."""
        return [
            (float(k), int(doc), str(memory_id), str(path))
            for k, doc, memory_id, path in self.conn.execute(_SEARCH_HITS, params)
        ]

    def search_texts(self, docs: list[int]) -> dict[int, tuple[str, ...]]:
        """What a snippet of each row is cut from: its content, else its path."""
        return fts.texts(self.conn, docs, ("content", "path"))

    def search_fields(self, docs: list[int]) -> dict[int, tuple[str, str]]:
        """doc -> (memory id, path) of the rows ``docs`` (a semantic hit's memory)."""
        if not docs:
            return {}
        marks = ", ".join("?" * len(docs))
        return {
            int(doc): (str(memory_id), str(path))
            for doc, memory_id, path in self.conn.execute(
                f"SELECT d.doc, m.id, m.path FROM {DOCS} d JOIN memories m ON m.id = d.memory_id"
                f" WHERE d.doc IN ({marks})",
                docs,
            )
        }

    def search_rows(self) -> dict[str, tuple[str, str]]:
        """memory id -> (path, content) as indexed (fsck's comparison with the records)."""
        return {
            str(memory_id): (str(path), str(content))
            for memory_id, path, content in self.conn.execute(
                f"SELECT d.memory_id, t.path, t.content FROM {DOCS} d"
                f" JOIN {TEXT} t ON t.rowid = d.doc"
            )
        }

    def search_orphans(self) -> int:
        return fts.orphans(self.conn)

    def dump(self) -> IndexContent:
        """The index as it is, in the order ``rows_from_records`` produces."""
        memories = [
            MemoryRow(*r)
            for r in self.conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories ORDER BY id")
        ]
        versions = [
            VersionRow(*r)
            for r in self.conn.execute(f"SELECT {VERSION_COLUMNS} FROM versions ORDER BY id")
        ]
        last_id, last_us = self.state()
        return IndexContent(memories, versions, last_id, last_us)


_INSERT_VERSION = (
    f"INSERT OR REPLACE INTO versions ({VERSION_COLUMNS}) VALUES"
    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_MEMORY = f"INSERT INTO memories ({MEMORY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_SET_STATE = (
    "INSERT INTO state VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value ="
    " max(value, excluded.value)"
)


def _version_values(v: VersionRow) -> tuple[Any, ...]:
    return (
        v.id,
        v.memory_id,
        v.operation,
        v.path,
        v.sha,
        v.size,
        v.created_by,
        v.actor_type,
        v.actor_id,
        v.created_us,
        v.created_at,
        v.redacted_at,
        v.redacted_by,
    )


def _memory_values(m: MemoryRow) -> tuple[Any, ...]:
    return (m.id, m.path, m.head, m.sha, m.size, m.created_at, m.updated_at, m.path_since)


class IndexWriter(IndexReader):
    """The writes, for the holder of the store lock, inside one write transaction."""

    def upkeep(self) -> fts.Upkeep:
        """What the search index is owed after this write (fts.upkeep)."""
        return fts.upkeep(self.conn)

    def owe_purge(self) -> None:
        """Mark text removed here as due to leave the file now (a redaction: fts.py)."""
        if fts.has_schema(self.conn):
            fts.removed(self.conn)

    def put_version(self, record: VersionRecord) -> None:
        """Record a new (or redacted) version and move its memory's head (and its search
        row) with it."""
        old_version = self._size("versions", record.id)
        old_memory = self._size("memories", record.memory_id)
        self.conn.execute(_INSERT_VERSION, _version_values(version_row(record)))
        if record.operation == "deleted":
            self.conn.execute("DELETE FROM memories WHERE id = ?", (record.memory_id,))
            fts.guarded(self.conn, lambda: self._search_drop(record.memory_id))
        elif record.redacted_at is None:
            self.conn.execute("DELETE FROM memories WHERE id = ?", (record.memory_id,))
            self.conn.execute(_INSERT_MEMORY, _memory_values(memory_row(record)))
            path, content = str(record.path), str(record.content)
            fts.guarded(self.conn, lambda: self._search_put(record.memory_id, path, content))
        self._set_state(record.id, record.created_us)
        new_memory = self._size("memories", record.memory_id)
        self._count(
            memories=(new_memory is not None) - (old_memory is not None),
            memory_bytes=(new_memory or 0) - (old_memory or 0),
            versions=int(old_version is None),
            version_bytes=int(record.content_size_bytes or 0) - (old_version or 0),
        )

    def _size(self, table: str, ident: str) -> int | None:
        """The size column of row ``ident`` (0 for a NULL size); None when there is no row."""
        row = self.conn.execute(f"SELECT size FROM {table} WHERE id = ?", (ident,)).fetchone()
        return None if row is None else int(row[0] or 0)

    def _count(self, **change: int) -> None:
        self.conn.executemany(_USAGE_ADD, [(v, k) for k, v in change.items() if v])

    def _search_doc(self, memory_id: str) -> int | None:
        row = self.conn.execute(
            f"SELECT doc FROM {DOCS} WHERE memory_id = ?", (memory_id,)
        ).fetchone()
        return None if row is None else int(row[0])

    def _search_put(self, memory_id: str, path: str, content: str) -> None:
        doc = self._search_doc(memory_id)
        if doc is None:
            (doc,) = self.conn.execute(
                f"INSERT INTO {DOCS} (memory_id) VALUES (?) RETURNING doc", (memory_id,)
            ).fetchone()
        else:
            old = self.conn.execute(
                f"SELECT path, content FROM {TEXT} WHERE rowid = ?", (doc,)
            ).fetchone()
            if old == (path, content):
                return
            if old is not None:
                fts.delete_text(self.conn, doc)
                fts.removed(self.conn, owed=False)  # replaced: the next sweep purges it
        fts.put_text(self.conn, doc, _TEXT_COLUMNS, (path, content))

    def memories_after(self, after: str, limit: int) -> list[MemoryRow]:
        """Up to ``limit`` live memories with ids after ``after``, in id order."""
        rows = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id > ? ORDER BY id LIMIT ?",
            (after, limit),
        ).fetchall()
        return [MemoryRow(*r) for r in rows]

    def fill_search(self, memory_id: str, path: str, content: str) -> None:
        """The search row of one live memory (a rebuild's fill, under the store lock)."""
        self._search_put(memory_id, path, content)

    def search_filled(self, token: int) -> None:
        fts.filled(self.conn, token)

    def _search_drop(self, memory_id: str) -> None:
        doc = self._search_doc(memory_id)
        if doc is not None:
            fts.delete_doc(self.conn, doc)

    def _set_state(self, last_id: str, last_us: int) -> None:
        self.conn.execute(_SET_STATE, ("last_id", last_id))
        self.conn.execute(_SET_STATE, ("last_us", last_us))

    def replace_all(self, content: IndexContent, texts: dict[str, str]) -> None:
        """Make the index ``content`` and the search rows the live memories with ``texts``
        (memory id -> content)."""
        self.conn.execute("DELETE FROM memories")
        self.conn.execute("DELETE FROM versions")
        self.conn.executemany(_INSERT_MEMORY, [_memory_values(m) for m in content.memories])
        self.conn.executemany(_INSERT_VERSION, [_version_values(v) for v in content.versions])
        self.conn.execute("DELETE FROM state")
        self._set_state(content.last_id, content.last_us)
        fts.recreate(self.conn, _SEARCH_COLUMNS)
        for m in content.memories:
            self._search_put(m.id, m.path, texts.get(m.id, ""))
        fts.set_state(self.conn, "backfill", 0)
        self._recount()

    def _recount(self) -> None:
        """Set the counters from the rows (a new index, a rebuild)."""
        values = self.conn.execute(_USAGE_FROM_ROWS).fetchone()
        self.conn.executemany(
            f"INSERT OR REPLACE INTO {_USAGE_TABLE} VALUES (?, ?)",
            [(n, int(v)) for n, v in zip(_USAGE_NAMES, values, strict=True)],
        )

    def delete_versions(self, version_ids: list[str]) -> None:
        sizes = [self._size("versions", v) for v in version_ids]
        gone = [s for s in sizes if s is not None]
        self.conn.executemany("DELETE FROM versions WHERE id = ?", [(v,) for v in version_ids])
        self._count(versions=-len(gone), version_bytes=-sum(gone))


# Store-index connections a worker keeps open between uses, shared by its threads (pool.py),
# each tagged with the identity of the file it opened and whether it checked the schema: a
# deleted store or a rebuilt index is a new file, and a connection to the old one is closed.
POOL_LIMIT = 64


class StoreIndex:
    """One store's ``index.sqlite3``; a connection to it stays open between uses (pool.py)
    while the file at ``path`` is the one it opened."""

    _pool: Pool[tuple[tuple[int, int] | None, bool]] = Pool(POOL_LIMIT)

    def __init__(self, path: Path, *, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def _use(self, *, create: bool) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A connection to the file now at ``path`` for the length of a block: a kept one
        opened to that same file (with the schema checked, to create), or a new one. After
        an error it is closed: the next use opens afresh."""
        identity = file_identity(self.path)

        def accept(tag: tuple[tuple[int, int] | None, bool]) -> bool:
            opened, has_schema = tag
            return opened is not None and opened == identity and (has_schema or not create)

        def open_() -> tuple[sqlite3.Connection, tuple[tuple[int, int] | None, bool]]:
            conn = self._connect(create=create)
            # None: removed while it was being opened, so no later use accepts it.
            return conn, (file_identity(self.path), create)

        return self._pool.use(str(self.path), open_, accept=accept, keep_on_error=False)

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        mode = "rwc" if create else "rw"
        # mode=rw: a reader racing a store delete gets an error instead of silently
        # creating an empty database at the old place.
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode={mode}"
        if create:
            create_file(str(self.path))
        conn = open_index(uri, uri=True, timeout=self.timeout)
        try:
            if create and not fts.has_schema(conn):
                # A new index: every table in one transaction (the search state last, so
                # that an index with it is whole).
                with write_txn(conn, "memory store index"):
                    if not fts.has_schema(conn):  # else made by another writer meanwhile
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                conn.execute(statement)
                        conn.execute(_USAGE_SCHEMA)
                        IndexWriter(conn)._recount()
                        fts.create_schema(conn, _SEARCH_DOCS, _SEARCH_COLUMNS)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def search_read(self) -> Iterator[IndexReader]:
        """A kept connection for a search, each statement its own snapshot: a search reads
        every store of a project, and a transaction around its one or two statements would
        cost as much as the reading."""
        with self._use(create=False) as conn:
            yield IndexReader(conn)

    @contextlib.contextmanager
    def read(self) -> Iterator[IndexReader]:
        """A read transaction: every query inside sees the same snapshot."""
        with self._use(create=False) as conn, read_txn(conn):
            yield IndexReader(conn)

    def _own(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A connection of its own to the index as it is (upkeep: purges, checks, rebuilds)."""
        return contextlib.closing(self._connect(create=False))

    def purge(self, *, only_pending: bool = False) -> bool:
        """Make removed search text leave the file and its WAL (fts_purge.purge)."""
        with self._own() as conn:
            if not fts.has_schema(conn):
                return True  # nothing indexed yet, nothing to purge
            return fts_purge.purge(
                conn, "memory store index", _SEARCH_COLUMNS, only_pending=only_pending
            )

    def purge_owed(self) -> bool:
        """Whether text a delete removed may still be in the file or its WAL (fts.owed)."""
        return self.search_upkeep().owed

    def search_upkeep(self) -> fts.Upkeep:
        """What the search index is owed: a rebuild, a purge, a compaction (one read)."""
        with self._own() as conn:
            return fts.upkeep(conn)

    def search_damage(self, budget: SearchBudget | None = None) -> str | None:
        """What is wrong with the search index (fts.damage), None when it is sound."""
        with self._own() as conn:
            return fts.damage(conn, budget) if fts.has_schema(conn) else None

    def search_opens(self) -> str | None:
        """The cheap check of fts.opens: whether the search index opens and reads."""
        with self._own() as conn:
            return fts.opens(conn) if fts.has_schema(conn) else None

    def mark_search_damaged(self, why: Exception) -> None:
        with self._own() as conn:
            fts.mark_damaged(conn, "memory store index", why)

    def start_search_rebuild(self) -> int | None:
        """A damaged search index is dropped and started empty, to be filled from the records
        (fts.start_rebuild): the fill's token, None when there is nothing to fill. The caller
        holds the store lock."""
        with self.write(create=False) as writer:
            return fts.start_rebuild(writer.conn, _SEARCH_COLUMNS)

    def search_levels(self) -> int:
        """The level count of the search index's structure (fts.levels)."""
        with self._own() as conn:
            return fts.levels(conn)

    @contextlib.contextmanager
    def write(self, *, create: bool = True) -> Iterator[IndexWriter]:
        with self._use(create=create) as conn, write_txn(conn, "memory store index"):
            yield IndexWriter(conn)
