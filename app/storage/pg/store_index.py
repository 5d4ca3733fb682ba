"""The rows of a memory store on PostgreSQL, as its engine and the backup read and write them
(the tree's store index is tree/sqlite/store_index.py): the columns of memories and versions,
a version row to its record and back, the queries the paging rules ask of a store
(:class:`StoreReader`), and the version list's filter (the shared one, in psycopg's
placeholders)."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from typing import Any

import psycopg

from app.storage.core.store_models import VersionFilter
from app.storage.core.store_paging import filter_clause
from app.storage.core.store_records import (
    MemoryRow,
    VersionRecord,
    version_row,
)

MEMORY_COLUMNS = "id, path, head, sha, size, created_at, updated_at, path_since"
RECORD_COLUMNS = (
    "id, memory_id, operation, path, content, sha, size, created_by, created_us, created_at,"
    " redacted_at, redacted_by, memory_created_at, path_since, previous_version_id"
)
ROW_COLUMNS = (
    "id, memory_id, operation, path, sha, size, created_by, actor_type, actor_id,"
    " created_us, created_at, redacted_at, redacted_by"
)


def as_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def version_record(store_id: str, row: tuple[Any, ...]) -> VersionRecord:
    (
        vid,
        memory_id,
        operation,
        path,
        content,
        sha,
        size,
        created_by,
        created_us,
        created_at,
        redacted_at,
        redacted_by,
        memory_created_at,
        path_since,
        previous,
    ) = row
    text = None if content is None else bytes(content).decode("utf-8")
    return VersionRecord(
        id=vid,
        memory_store_id=store_id,
        memory_id=memory_id,
        operation=operation,
        path=path,
        content=text,
        content_sha256=sha,
        content_size_bytes=size,
        created_by=None if created_by is None else json.loads(created_by),
        created_at=created_at,
        created_us=int(created_us),
        redacted_at=redacted_at,
        redacted_by=None if redacted_by is None else json.loads(redacted_by),
        memory_created_at=memory_created_at,
        path_since=path_since,
        previous_version_id=previous,
        has_content=text is not None,
    )


class StoreReader:
    """The queries the paging and semantics rules (core/store_paging.py,
    core/store_semantics.py) ask of a store (core/store_records.py ``MemoryLookup``)."""

    def __init__(self, conn: psycopg.Connection[Any], store_id: str, state: tuple[str, int]):
        self.conn = conn
        self.store_id = store_id
        self._state = state

    def state(self) -> tuple[str, int]:
        return self._state

    def memory(self, memory_id: str) -> MemoryRow | None:
        row = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE store_id = %s AND id = %s",
            (self.store_id, memory_id),
        ).fetchone()
        return None if row is None else MemoryRow(*row)

    def memory_at(self, path: str) -> MemoryRow | None:
        row = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE store_id = %s AND path = %s",
            (self.store_id, path),
        ).fetchone()
        return None if row is None else MemoryRow(*row)

    def count(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM memories WHERE store_id = %s", (self.store_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def occupant(self, path: str, exclude: str | None) -> tuple[str, str] | None:
        """(id, path) of a memory other than ``exclude`` at ``path``, an ancestor or below."""
        segments = path[1:].split("/")
        candidates = [path] + ["/" + "/".join(segments[:i]) for i in range(1, len(segments))]
        row = self.conn.execute(
            "SELECT id, path FROM memories WHERE store_id = %s AND path = ANY(%s) AND id <> %s"
            " ORDER BY length(path) LIMIT 1",
            (self.store_id, candidates, exclude or ""),
        ).fetchone()
        if row is None:
            # '0' follows '/': every path below ``path`` sorts between the two bounds.
            row = self.conn.execute(
                "SELECT id, path FROM memories WHERE store_id = %s AND path >= %s"
                " AND path < %s AND id <> %s ORDER BY path LIMIT 1",
                (self.store_id, path + "/", path + "0", exclude or ""),
            ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def memories_page(self, low: str, high: str, as_of: str, limit: int) -> list[MemoryRow]:
        # The shared paging code resumes after a path at ``path + "\x00"``, which PostgreSQL
        # text cannot hold; no path holds a control character, so "\x01" bounds the same set.
        low = low.replace("\x00", "\x01")
        rows = self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE store_id = %s AND path >= %s"
            " AND path < %s AND path_since <= %s ORDER BY path LIMIT %s",
            (self.store_id, low, high, as_of, limit),
        ).fetchall()
        return [MemoryRow(*r) for r in rows]


VERSION_COLUMNS = (
    "store_id, id, memory_id, operation, path, content, sha, size, created_by, actor_type,"
    " actor_id, created_us, created_at, redacted_at, redacted_by, memory_created_at,"
    " path_since, previous_version_id"
)


def version_values(store_id: str, record: VersionRecord) -> tuple[Any, ...]:
    """A version row's values in VERSION_COLUMNS order (a new write, or a restored one)."""
    row = version_row(record)
    return (
        store_id,
        record.id,
        record.memory_id,
        record.operation,
        record.path,
        None if record.content is None else record.content.encode("utf-8"),
        record.content_sha256,
        record.content_size_bytes,
        row.created_by,
        row.actor_type,
        row.actor_id,
        record.created_us,
        record.created_at,
        record.redacted_at,
        row.redacted_by,
        record.memory_created_at,
        record.path_since,
        record.previous_version_id,
    )


def marks(columns: str) -> str:
    """One placeholder per column of ``columns``."""
    return ", ".join(["%s"] * (columns.count(",") + 1))


def version_filter(filters: VersionFilter) -> tuple[list[str], list[object]]:
    """The WHERE terms and arguments of a version filter: core/store_paging.py's
    ``filter_clause`` in psycopg's placeholders."""
    texts = (
        filters.memory_id,
        filters.operation,
        filters.api_key_id,
        filters.session_id,
        filters.service_account_id,
    )
    if any(value is not None and "\x00" in value for value in texts):
        # PostgreSQL refuses a NUL in a text value, and no stored id holds one (text cannot):
        # such a filter matches nothing, as it does on the tree, rather than failing. Its
        # values are not bound at all: the driver would refuse them before the query runs.
        return ["false"], []
    return filter_clause(filters, "%s")
