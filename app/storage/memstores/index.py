"""The per-store index: a derived SQLite file (WAL) beside the version records.

It answers "which memory lives at this path", the occupancy checks, ordered pages of
memories and filtered pages of versions without reading every record. It is derived:
``rows_from_records`` computes its whole content from the version files, which is what
repair and fsck use. Only the holder of the store lock writes it; readers open it without
any lock and see a consistent snapshot inside one read transaction.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import contextlib
import json
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sqlitedb import open_wal, read_txn, write_txn

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

MEMORY_COLUMNS = "id, path, head, sha, size, created_at, updated_at, path_since"
VERSION_COLUMNS = (
    "id, memory_id, operation, path, sha, size, created_by, actor_type, actor_id,"
    " created_us, created_at, redacted_at, redacted_by"
)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    id: str
    path: str
    head: str
    sha: str
    size: int
    created_at: str
    updated_at: str
    path_since: str


@dataclass(frozen=True, slots=True)
class VersionRow:
    id: str
    memory_id: str
    operation: str
    path: str | None
    sha: str | None
    size: int | None
    created_by: str | None
    actor_type: str | None
    actor_id: str | None
    created_us: int
    created_at: str
    redacted_at: str | None
    redacted_by: str | None


def _actor_json(actor: Any) -> str | None:
    return None if actor is None else json.dumps(actor, separators=(",", ":"))


def _actor_key(actor: Any) -> tuple[str | None, str | None]:
    if not isinstance(actor, dict):
        return None, None
    kind = actor.get("type")
    ident = {
        "api_actor": "api_key_id",
        "session_actor": "session_id",
        "user_actor": "user_id",
        "service_account_actor": "service_account_id",
    }.get(str(kind))
    return kind, (actor.get(ident) if ident else None)


def version_row(record: dict[str, Any]) -> VersionRow:
    actor_type, actor_id = _actor_key(record.get("created_by"))
    return VersionRow(
        id=record["id"],
        memory_id=record["memory_id"],
        operation=record["operation"],
        path=record.get("path"),
        sha=record.get("content_sha256"),
        size=record.get("content_size_bytes"),
        created_by=_actor_json(record.get("created_by")),
        actor_type=actor_type,
        actor_id=actor_id,
        created_us=int(record["created_us"]),
        created_at=record["created_at"],
        redacted_at=record.get("redacted_at"),
        redacted_by=_actor_json(record.get("redacted_by")),
    )


def memory_row(record: dict[str, Any]) -> MemoryRow:
    """The live memory whose head version is ``record`` (not a ``deleted`` version)."""
    return MemoryRow(
        id=record["memory_id"],
        path=record["path"],
        head=record["id"],
        sha=record["content_sha256"],
        size=int(record["content_size_bytes"]),
        created_at=record["memory_created_at"],
        updated_at=record["created_at"],
        path_since=record["path_since"],
    )


@dataclass(frozen=True, slots=True)
class IndexContent:
    memories: list[MemoryRow]
    versions: list[VersionRow]
    last_id: str
    last_us: int


def rows_from_records(records: Iterable[dict[str, Any]]) -> IndexContent:
    """The whole index as a rebuild from the version records computes it."""
    ordered = sorted(records, key=lambda r: r["id"])
    heads: dict[str, dict[str, Any]] = {}
    for record in ordered:
        heads[record["memory_id"]] = record
    memories = sorted(
        (memory_row(r) for r in heads.values() if r["operation"] != "deleted"),
        key=lambda m: m.id,
    )
    versions = [version_row(r) for r in ordered]
    last = ordered[-1] if ordered else None
    return IndexContent(
        memories=memories,
        versions=versions,
        last_id=last["id"] if last else "",
        last_us=int(last["created_us"]) if last else 0,
    )


class StoreIndex:
    """One store's ``index.sqlite3``; a connection per use, closed when the block ends."""

    def __init__(self, path: Path, *, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        mode = "rwc" if create else "rw"
        # mode=rw: a reader racing a store rename or delete gets an error instead of
        # silently creating an empty database at the old place.
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode={mode}"
        conn = open_wal(uri, uri=True, timeout=self.timeout)
        try:
            if create:
                conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees the same snapshot."""
        conn = self._connect(create=False)
        try:
            with read_txn(conn):
                yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def write(self, *, create: bool = False) -> Iterator[sqlite3.Connection]:
        conn = self._connect(create=create)
        try:
            with write_txn(conn, "memory store index"):
                yield conn
        finally:
            conn.close()

    # -- writes (caller holds the store lock) ------------------------------------------
    @staticmethod
    def put_version(conn: sqlite3.Connection, record: dict[str, Any]) -> None:
        row = version_row(record)
        conn.execute(
            f"INSERT OR REPLACE INTO versions ({VERSION_COLUMNS}) VALUES"
            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.memory_id,
                row.operation,
                row.path,
                row.sha,
                row.size,
                row.created_by,
                row.actor_type,
                row.actor_id,
                row.created_us,
                row.created_at,
                row.redacted_at,
                row.redacted_by,
            ),
        )
        if record["operation"] == "deleted":
            conn.execute("DELETE FROM memories WHERE id = ?", (record["memory_id"],))
        elif record.get("redacted_at") is None:
            m = memory_row(record)
            conn.execute("DELETE FROM memories WHERE id = ?", (m.id,))
            conn.execute(
                f"INSERT INTO memories ({MEMORY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (m.id, m.path, m.head, m.sha, m.size, m.created_at, m.updated_at, m.path_since),
            )
        set_state(conn, record["id"], int(record["created_us"]))

    @staticmethod
    def replace_all(conn: sqlite3.Connection, content: IndexContent) -> None:
        conn.execute("DELETE FROM memories")
        conn.execute("DELETE FROM versions")
        conn.executemany(
            f"INSERT INTO memories ({MEMORY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (m.id, m.path, m.head, m.sha, m.size, m.created_at, m.updated_at, m.path_since)
                for m in content.memories
            ],
        )
        conn.executemany(
            f"INSERT INTO versions ({VERSION_COLUMNS}) VALUES"
            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
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
                for v in content.versions
            ],
        )
        conn.execute("DELETE FROM state")
        set_state(conn, content.last_id, content.last_us)


def set_state(conn: sqlite3.Connection, last_id: str, last_us: int) -> None:
    conn.execute(
        "INSERT INTO state VALUES ('last_id', ?) ON CONFLICT (key) DO UPDATE SET value ="
        " max(value, excluded.value)",
        (last_id,),
    )
    conn.execute(
        "INSERT INTO state VALUES ('last_us', ?) ON CONFLICT (key) DO UPDATE SET value ="
        " max(value, excluded.value)",
        (last_us,),
    )


def get_state(conn: sqlite3.Connection) -> tuple[str, int]:
    rows = dict(conn.execute("SELECT key, value FROM state").fetchall())
    return str(rows.get("last_id", "")), int(rows.get("last_us", 0))


def fetch_memory(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> MemoryRow | None:
    row = conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where}", args).fetchone()
    return None if row is None else MemoryRow(*row)


def fetch_version(conn: sqlite3.Connection, version_id: str) -> VersionRow | None:
    row = conn.execute(
        f"SELECT {VERSION_COLUMNS} FROM versions WHERE id = ?", (version_id,)
    ).fetchone()
    return None if row is None else VersionRow(*row)


def dump(conn: sqlite3.Connection) -> IndexContent:
    """The index as it is, in the order ``rows_from_records`` produces."""
    memories = [
        MemoryRow(*r)
        for r in conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories ORDER BY id").fetchall()
    ]
    versions = [
        VersionRow(*r)
        for r in conn.execute(f"SELECT {VERSION_COLUMNS} FROM versions ORDER BY id").fetchall()
    ]
    last_id, last_us = get_state(conn)
    return IndexContent(memories, versions, last_id, last_us)
