"""The memory-store engine on PostgreSQL: stores, memories and versions as rows.

A store's row is its lock: every mutation is one transaction that first takes it with
``SELECT ... FOR UPDATE`` (waiting at most the lock timeout, then LockTimeout, as the tree's
store lock does), then checks, writes one version row and moves its memory's head. A version
is the commit point and never changes again except by redaction; readers take no lock and
read one snapshot. Memory contents (100 KiB at most) stay in the database, beside the rows
that name them: a memory write is one transaction, with nothing to clean up if it fails.

The rules, ids, cursors, ordering and errors are the ones every backend shares
(core/store_rules.py, store_semantics.py, store_paging.py), so a request gets the same
answer here as from the tree's engine (tree/stores/).
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg

from app.storage.core import store_rules as rules, store_semantics as semantics
from app.storage.core.clock import Clock, iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec, cut_page
from app.storage.core.errors import NotFound
from app.storage.core.names import STORE_ID_RE, VERSION_ID_RE, Scope
from app.storage.core.quota import QuotaSource
from app.storage.core.store_models import (
    Deleted,
    Memory,
    MemoryStore,
    MemoryVersion,
    Page,
    VersionFilter,
)
from app.storage.core.store_paging import (
    check_limit,
    fingerprint,
    memories_page,
    memories_query,
    memory_items,
    stores_after,
    stores_page,
    versions_next,
    versions_query,
)
from app.storage.core.store_records import (
    MemoryRow,
    StoreRecord,
    VersionRecord,
    VersionRow,
)
from app.storage.core.store_rules import DEFAULT_KEEP_RECENT, DEFAULT_MAX_MEMORIES
from app.storage.core.store_semantics import live_memory
from app.storage.pg import usage as pgu
from app.storage.pg.db import Database
from app.storage.pg.store_index import (
    MEMORY_COLUMNS,
    RECORD_COLUMNS,
    ROW_COLUMNS,
    VERSION_COLUMNS,
    StoreReader,
    as_json,
    marks,
    version_filter,
    version_record,
    version_values,
)


class PgMemoryStores:
    """Every memory store of every tenant/project in one database."""

    def __init__(
        self,
        db: Database,
        cursors: CursorCodec,
        *,
        clock: Clock = system_clock,
        version_retention: timedelta = timedelta(days=30),
        keep_recent_versions: int = DEFAULT_KEEP_RECENT,
        max_memories: int = DEFAULT_MAX_MEMORIES,
        usage: pgu.PgUsage | None = None,
    ) -> None:
        self.db = db
        # Called after a write committed: the embedding queue's drain (pg/vectors.py), when
        # an embedder is configured.
        self.text_written: Callable[[Scope], object] | None = None
        # Counters and quotas (pg/usage.py).
        self.usage = usage or pgu.PgUsage(db, QuotaSource(None))
        self.cursors = cursors
        self.clock = clock
        self.version_retention = version_retention
        self.keep_recent_versions = max(1, keep_recent_versions)
        self.max_memories = max_memories

    def now_us(self) -> int:
        return to_us(self.clock())

    # -- rows ------------------------------------------------------------------------------
    def _store(
        self, conn: psycopg.Connection[Any], scope: Scope, store_id: str, *, lock: bool
    ) -> tuple[StoreRecord, tuple[str, int]]:
        if not isinstance(store_id, str) or not STORE_ID_RE.fullmatch(store_id):
            raise NotFound(f"memory store {store_id} not found")
        row = conn.execute(
            "SELECT record, last_version_id, last_version_us FROM stores"
            " WHERE id = %s AND tenant = %s AND project = %s" + (" FOR UPDATE" if lock else ""),
            (store_id, scope.tenant, scope.project),
        ).fetchone()
        if row is None:
            raise NotFound(f"memory store {store_id} not found")
        record = StoreRecord.from_json(json.loads(row[0]), store_id)  # type: ignore[arg-type]
        return record, (str(row[1]), int(row[2]))

    @contextmanager
    def transaction(
        self, scope: Scope, store_id: str
    ) -> Iterator[tuple[psycopg.Connection[Any], StoreRecord, tuple[str, int]]]:
        """One write transaction holding the store's row (its lock): the connection, the
        store's record and its index state (last version id, its microsecond)."""
        with self.db.transaction(f"memory store {store_id}") as conn:
            record, state = self._store(conn, scope, store_id, lock=True)
            yield conn, record, state
        if self.text_written is not None:
            self.text_written(scope)

    @contextmanager
    def _read(
        self, scope: Scope, store_id: str
    ) -> Iterator[tuple[psycopg.Connection[Any], StoreRecord, tuple[str, int]]]:
        with self.db.snapshot(f"memory store {store_id}") as conn:
            record, state = self._store(conn, scope, store_id, lock=False)
            yield conn, record, state

    def _version(
        self, conn: psycopg.Connection[Any], store_id: str, version_id: str
    ) -> VersionRecord | None:
        if not isinstance(version_id, str) or not VERSION_ID_RE.fullmatch(version_id):
            return None
        row = conn.execute(
            f"SELECT {RECORD_COLUMNS} FROM versions WHERE store_id = %s AND id = %s",
            (store_id, version_id),
        ).fetchone()
        return None if row is None else version_record(store_id, row)

    def _head_content(self, conn: psycopg.Connection[Any], store_id: str, row: MemoryRow) -> str:
        found = conn.execute(
            "SELECT content FROM versions WHERE store_id = %s AND id = %s", (store_id, row.head)
        ).fetchone()
        return "" if found is None or found[0] is None else bytes(found[0]).decode("utf-8")

    def _save_store(self, conn: psycopg.Connection[Any], record: StoreRecord) -> None:
        conn.execute(
            "UPDATE stores SET record = %s, archived = %s WHERE id = %s",
            (as_json(record.to_json()), record.archived_at is not None, record.id),
        )

    def _commit(self, conn: psycopg.Connection[Any], scope: Scope, record: VersionRecord) -> None:
        """Write one version and move its memory's head (or drop the memory), and count it."""
        old = conn.execute(
            "SELECT size FROM memories WHERE store_id = %s AND id = %s",
            (record.memory_store_id, record.memory_id),
        ).fetchone()
        conn.execute(
            f"INSERT INTO versions ({VERSION_COLUMNS}) VALUES ({marks(VERSION_COLUMNS)})",
            version_values(record.memory_store_id, record),
        )
        conn.execute(
            "DELETE FROM memories WHERE store_id = %s AND id = %s",
            (record.memory_store_id, record.memory_id),
        )
        if record.operation != "deleted":
            conn.execute(
                f"INSERT INTO memories (store_id, {MEMORY_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    record.memory_store_id,
                    record.memory_id,
                    record.path,
                    record.id,
                    record.content_sha256,
                    record.content_size_bytes,
                    record.memory_created_at,
                    record.created_at,
                    record.path_since,
                ),
            )
        conn.execute(
            "UPDATE stores SET last_version_id = %s, last_version_us = greatest(last_version_us, %s)"
            " WHERE id = %s",
            (record.id, record.created_us, record.memory_store_id),
        )
        live = record.operation != "deleted"
        size = int(record.content_size_bytes or 0)
        pgu.add(
            conn,
            scope,
            versions=1,
            version_bytes=size,
            memories=int(live) - int(old is not None),
            memory_bytes=(size if live else 0) - (int(old[0]) if old else 0),
        )

    # -- stores ----------------------------------------------------------------------------
    def create_store(
        self,
        scope: Scope,
        *,
        name: object,
        description: object = "",
        metadata: object = None,
        creator: str | None = None,
    ) -> MemoryStore:
        """Create an empty store."""
        now = self.now_us()
        record = semantics.new_store(
            scope,
            now,
            name=name,
            description=description,
            metadata=metadata,
            creator=creator,
        )
        with self.db.transaction("memory stores") as conn:
            pgu.ensure_project(conn, scope)
            conn.execute(
                "INSERT INTO stores (id, tenant, project, record, created_us)"
                " VALUES (%s, %s, %s, %s, %s)",
                (record.id, scope.tenant, scope.project, as_json(record.to_json()), now),
            )
            pgu.add(conn, scope, stores=1)
        return record.view()

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore:
        """Read a store, archived or not."""
        with self._read(scope, store_id) as (_, record, _):
            return record.view()

    def store_creator(self, scope: Scope, store_id: str) -> str | None:
        with self._read(scope, store_id) as (_, record, _):
            return record.created_by

    def list_stores(
        self,
        scope: Scope,
        *,
        limit: int = 20,
        page: str | None = None,
        include_archived: bool = False,
        created_gte_us: int | None = None,
        created_lte_us: int | None = None,
    ) -> Page:
        """List the scope's stores, newest first, with a keyset cursor."""
        limit = check_limit(limit)
        fp = fingerprint("stores", scope.tenant, scope.project, include_archived)
        where = "tenant = %s AND project = %s"
        args: list[object] = [scope.tenant, scope.project]
        after = stores_after(self.cursors, page, fp)
        if after is not None:
            where += " AND (created_us < %s OR (created_us = %s AND id < %s))"
            args += [after[0], after[0], after[1]]
        if not include_archived:
            where += " AND NOT archived"
        if created_gte_us is not None:
            where += " AND created_us >= %s"
            args.append(created_gte_us)
        if created_lte_us is not None:
            where += " AND created_us <= %s"
            args.append(created_lte_us)
        with self.db.snapshot("memory stores") as conn:
            rows = conn.execute(
                f"SELECT record FROM stores WHERE {where}"
                " ORDER BY created_us DESC, id DESC LIMIT %s",
                (*args, limit + 1),
            ).fetchall()
        records = [StoreRecord.from_json(json.loads(r[0]), "stores") for r in rows]  # type: ignore[arg-type]
        return stores_page(self.cursors, fp, records, limit)

    def update_store(
        self,
        scope: Scope,
        store_id: str,
        *,
        name: object = None,
        description: object = None,
        metadata: object = None,
        only_creator: str | None = None,
    ) -> MemoryStore:
        """Change name, description and/or patch metadata; None leaves a field as it is."""
        new_name, new_description = semantics.store_update_request(name, description)
        with self.transaction(scope, store_id) as (conn, record, _):
            semantics.check_updatable(record, store_id, only_creator)
            new = semantics.changed_store(
                record, self.now_us(), name=new_name, description=new_description, metadata=metadata
            )
            if new is None:
                return record.view()
            self._save_store(conn, new)
        return new.view()

    def archive_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> MemoryStore:
        """Archive a store (one-way; archiving an archived store changes nothing)."""
        with self.transaction(scope, store_id) as (conn, record, _):
            semantics.check_creator(record, only_creator)
            if record.archived_at:
                return record.view()
            record = semantics.archived_store(record, self.now_us())
            self._save_store(conn, record)
        return record.view()

    def delete_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> Deleted:
        """Delete a store with all its memories and versions, in one transaction."""
        with self.transaction(scope, store_id) as (conn, record, _):
            semantics.check_creator(record, only_creator)
            gone = pgu.store_sums(conn, store_id)
            conn.execute("DELETE FROM stores WHERE id = %s", (store_id,))
            pgu.add(conn, scope, stores=-1, **pgu.negated(gone))
        return Deleted(store_id, "memory_store_deleted")

    # -- memories --------------------------------------------------------------------------
    def create_memory(
        self,
        scope: Scope,
        store_id: str,
        *,
        path: object,
        content: object,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory:
        """Create a memory at an unoccupied path; never overwrites."""
        path = rules.validate_memory_path(path)
        content = rules.validate_content(content)
        with self.transaction(scope, store_id) as (conn, store, state):
            semantics.check_writable(store)
            record = semantics.created_version(
                StoreReader(conn, store_id, state),
                self.now_us,
                store_id,
                path=path,
                content=content,
                actor=actor,
                max_memories=self.max_memories,
            )
            self.usage.check(conn, scope, int(record.content_size_bytes or 0))
            self._commit(conn, scope, record)
        return record.memory(full)

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory:
        """Read one live memory (its head version)."""
        with self._read(scope, store_id) as (conn, _, state):
            row = live_memory(StoreReader(conn, store_id, state), memory_id)
            content = self._head_content(conn, store_id, row) if full else None
        return row.view(store_id, content)

    def find_memory(self, scope: Scope, store_id: str, path: str, *, full: bool) -> Memory | None:
        """The live memory at exactly ``path``, or None."""
        path = rules.validate_memory_path(path)
        with self._read(scope, store_id) as (conn, _, state):
            row = StoreReader(conn, store_id, state).memory_at(path)
            if row is None:
                return None
            content = self._head_content(conn, store_id, row) if full else None
        return row.view(store_id, content)

    def update_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        content: object = None,
        path: object = None,
        precondition_sha256: object = None,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory:
        """Change content and/or path; a no-op writes nothing, a real change one version."""
        request = semantics.update_request(content, path, precondition_sha256)
        with self.transaction(scope, store_id) as (conn, store, state):
            semantics.check_writable(store)
            row, record = semantics.updated_version(
                StoreReader(conn, store_id, state),
                self.now_us,
                store_id,
                memory_id,
                request,
                actor=actor,
                head_content=lambda found: self._head_content(conn, store_id, found),
            )
            if record is None:
                return row.view(store_id, self._head_content(conn, store_id, row) if full else None)
            # The previous version stays (history): the new one is charged whole.
            self.usage.check(conn, scope, int(record.content_size_bytes or 0))
            self._commit(conn, scope, record)
        return record.memory(full)

    def delete_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        expected_sha256: object = None,
        actor: dict[str, Any] | None,
    ) -> Deleted:
        """Delete a live memory (writes a ``deleted`` version; history stays), in an archived
        store too."""
        expected = semantics.delete_request(expected_sha256)
        with self.transaction(scope, store_id) as (conn, _, state):
            row, record = semantics.deleted_version(
                StoreReader(conn, store_id, state),
                self.now_us,
                store_id,
                memory_id,
                expected,
                actor=actor,
            )
            self._commit(conn, scope, record)
        return Deleted(row.id, "memory_deleted")

    def list_memories(
        self,
        scope: Scope,
        store_id: str,
        *,
        path_prefix: object = "/",
        depth: int = 0,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page:
        """Memories (and, with depth 1, ``memory_prefix`` roll-ups) in path order."""
        query = memories_query(self.cursors, store_id, path_prefix, depth, limit, page, full)
        with self._read(scope, store_id) as (conn, _, state):
            as_of, items = memory_items(StoreReader(conn, store_id, state), query)
            return memories_page(
                self.cursors,
                query,
                as_of,
                items,
                lambda row: self._head_content(conn, store_id, row) if full else None,
            )

    # -- versions --------------------------------------------------------------------------
    def list_versions(
        self,
        scope: Scope,
        store_id: str,
        *,
        filters: VersionFilter,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page:
        """Versions newest first (id breaks ties; ids grow with time within a store)."""
        query = versions_query(self.cursors, store_id, filters, limit, page, full)
        where, args = version_filter(filters)
        if query.before is not None:
            where.append("id < %s")
            args.append(query.before)
        with self._read(scope, store_id) as (conn, _, _):
            columns = RECORD_COLUMNS if full else ROW_COLUMNS
            rows = conn.execute(
                f"SELECT {columns} FROM versions WHERE store_id = %s AND {' AND '.join(where)}"
                " ORDER BY id DESC LIMIT %s",
                (store_id, *args, query.limit + 1),
            ).fetchall()
        kept, next_page = cut_page(
            rows, query.limit, lambda last: versions_next(self.cursors, query, last[0])
        )
        if full:
            data = tuple(version_record(store_id, r).view(True) for r in kept)
        else:
            data = tuple(VersionRow(*r).view(store_id) for r in kept)
        return Page(data, next_page)

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion:
        """Read one version (a redacted one too: its content fields are null)."""
        with self._read(scope, store_id) as (conn, _, _):
            record = self._version(conn, store_id, version_id)
        if record is None:
            raise NotFound(f"memory version {version_id} not found")
        return record.view(full)

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion:
        """Clear a version's content, hash, size and path; the head of a live memory refuses."""
        with self.transaction(scope, store_id) as (conn, _, state):
            record = self._version(conn, store_id, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            if record.redacted_at:
                return record.view(True)
            live = StoreReader(conn, store_id, state).memory(record.memory_id)
            semantics.check_redactable(version_id, live)
            redacted = record.redacted(iso_us(max(self.now_us(), state[1])), actor)
            conn.execute(
                "UPDATE versions SET path = NULL, content = NULL, sha = NULL, size = NULL,"
                " redacted_at = %s, redacted_by = %s WHERE store_id = %s AND id = %s",
                (redacted.redacted_at, as_json(actor), store_id, version_id),
            )
            pgu.add(conn, scope, version_bytes=-int(record.content_size_bytes or 0))
        return redacted.view(True)
