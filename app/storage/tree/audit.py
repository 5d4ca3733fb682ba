"""The audit log of every project of one storage root: ``<root>/.audit.sqlite3``
(core/audit.py says what an event is). Like the traffic hours it is no record of what is
stored, so fsck neither checks nor rebuilds it; a person reads it with ``sqlite3``."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from app.storage.core import audit
from app.storage.core.audit import AuditEvent
from app.storage.tree.fs.layout import Layout
from app.storage.tree.sqlite.db import create_file, open_index, read_txn, write_txn
from app.storage.tree.sqlite.pool import Pool, file_identity

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY,
    at_us INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    project TEXT,
    actor TEXT,
    kind TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    store_id TEXT,
    detail TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_by_project ON events (tenant, project, at_us DESC, id DESC);
CREATE INDEX IF NOT EXISTS events_by_age ON events (at_us);
"""
_COLUMNS = ", ".join(audit.COLUMNS)


# Connections a worker keeps to the audit log between events (pool.py): every audited write
# adds a row, and opening the file, checking its schema and closing it (the last close
# checkpoints the WAL and deletes it) cost more than the insert.
POOL_LIMIT = 4


class TreeAudit:
    # Tagged with the identity of the file each opened: one replaced or removed by hand is
    # opened afresh, never written through a connection to the old one.
    _pool: Pool[tuple[int, int] | None] = Pool(POOL_LIMIT)

    def __init__(self, layout: Layout, *, lock_timeout: float) -> None:
        self.layout = layout
        self.timeout = lock_timeout

    def _connect(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        # SQLite follows symlinks: refuse a planted one in place of the file.
        path = self.layout.check_inside(self.layout.audit())
        now = file_identity(path)

        def open_() -> tuple[sqlite3.Connection, tuple[int, int] | None]:
            create_file(str(path))
            before = file_identity(path)
            conn = open_index(str(path), timeout=self.timeout)
            try:
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
            # None: replaced while it was being opened, so no later use accepts it.
            return conn, before if before == file_identity(path) else None

        return self._pool.use(
            str(path),
            open_,
            accept=lambda tag: tag is not None and tag == now,
            keep_on_error=False,
        )

    def add(self, event: AuditEvent) -> None:
        with self._connect() as conn, write_txn(conn, "audit log"):
            marks = ", ".join("?" * len(audit.COLUMNS))
            conn.execute(f"INSERT INTO events ({_COLUMNS}) VALUES ({marks})", audit.values(event))

    def rows(
        self,
        tenant: str,
        project: str,
        *,
        actor: str | None,
        kind: str | None,
        key: tuple[int, str] | None,
        backward: bool,
        limit: int,
    ) -> list[tuple[Any, ...]]:
        if self.layout.tree.lstat(self.layout.audit()) is None:
            return []
        params: dict[str, object] = {"tenant": tenant, "project": project, "limit": limit}
        terms, order = audit.where(
            actor, kind, key, backward=backward, mark=lambda n: f":{n}", params=params
        )
        with self._connect() as conn, read_txn(conn):
            return conn.execute(
                f"SELECT {_COLUMNS} FROM events WHERE tenant = :tenant AND project = :project"
                f"{terms} ORDER BY {order} LIMIT :limit",
                params,
            ).fetchall()

    def prune(self, before_us: int) -> int:
        if self.layout.tree.lstat(self.layout.audit()) is None:
            return 0
        with self._connect() as conn, write_txn(conn, "audit log"):
            return conn.execute("DELETE FROM events WHERE at_us < ?", (before_us,)).rowcount
