"""Requests and bytes per hour, per project and per token: the tree keeps them in
``<root>/.traffic.sqlite3`` (PostgreSQL: the ``traffic`` table, app/storage/pg/).

Nothing here runs per request: each worker adds up its requests in memory and adds its sums
to their hours every few seconds (app/web/traffic.py), one transaction per flush. The hours are
kept as long as the turns are (``MEMORY_RETENTION_DAYS``), then pruned.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from app.storage.tree.fs.layout import Layout
from app.storage.tree.sqlite.db import create_file, open_wal, read_txn, write_txn

_SCHEMA = """
CREATE TABLE IF NOT EXISTS traffic (
    hour INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    token_id TEXT NOT NULL,
    requests INTEGER NOT NULL,
    bytes_in INTEGER NOT NULL,
    bytes_out INTEGER NOT NULL,
    PRIMARY KEY (hour, tenant, project, token_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS traffic_by_project ON traffic (tenant, project, hour);
"""
_COLUMNS = "hour, tenant, project, token_id, requests, bytes_in, bytes_out"
_ADD = (
    f"INSERT INTO traffic ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (hour, tenant, project, token_id) DO UPDATE SET"
    " requests = requests + excluded.requests, bytes_in = bytes_in + excluded.bytes_in,"
    " bytes_out = bytes_out + excluded.bytes_out"
)


@dataclass(frozen=True, slots=True)
class TrafficRow:
    """One hour (since the epoch, UTC) of one token in one project."""

    hour: int
    tenant: str
    project: str
    token_id: str
    requests: int
    bytes_in: int
    bytes_out: int


class TreeTraffic:
    """The hours of every project and token of one storage root."""

    def __init__(self, layout: Layout, *, lock_timeout: float) -> None:
        self.layout = layout
        self.timeout = lock_timeout

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # SQLite follows symlinks: refuse a planted one in place of the file.
        path = self.layout.check_inside(self.layout.traffic())
        create_file(str(path))
        conn = open_wal(str(path), timeout=self.timeout)
        try:
            conn.executescript(_SCHEMA)
            yield conn
        finally:
            conn.close()

    def add(self, rows: Iterable[TrafficRow]) -> None:
        batch = [
            (r.hour, r.tenant, r.project, r.token_id, r.requests, r.bytes_in, r.bytes_out)
            for r in rows
        ]
        if not batch:
            return
        with self._connect() as conn, write_txn(conn, "traffic"):
            conn.executemany(_ADD, batch)

    def rows(
        self, tenant: str, project: str | None = None, *, since_hour: int = 0
    ) -> list[TrafficRow]:
        if self.layout.tree.lstat(self.layout.traffic()) is None:
            return []
        where = "tenant = ? AND hour >= ?"
        args: list[object] = [tenant, since_hour]
        if project is not None:
            where += " AND project = ?"
            args.append(project)
        with self._connect() as conn, read_txn(conn):
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM traffic WHERE {where} ORDER BY hour, project, token_id",
                args,
            ).fetchall()
        return [TrafficRow(*r) for r in found]

    def prune(self, before_hour: int) -> int:
        if self.layout.tree.lstat(self.layout.traffic()) is None:
            return 0
        with self._connect() as conn, write_txn(conn, "traffic"):
            return conn.execute("DELETE FROM traffic WHERE hour < ?", (before_hour,)).rowcount
