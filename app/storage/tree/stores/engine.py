"""The memory-store engine: every operation of the memory-stores API over the tree.

On disk (tree/fs/layout.py names every path)::

    <root>/<tenant>/<project>/_stores/<store_id>/
        store.json                 record: name, description, metadata, times, archived_at
        versions/<version_id>.json records: one create-only file per version (commit point);
                                   rewritten only by redaction, removed only by retention
        memories/<path>            derived: the live content of each memory, a plain file
        index.sqlite3              derived: id <-> path, heads, version rows (WAL)

A store's directory is named by its id, so finding a store is a path computation. Writes
run as transactions on the store (writes.py): write the version record (the commit point),
then the index, then the live file. A writer that dies in between leaves its write in
flight; the next holder of the lock rebuilds the derived files from the records first.
Readers take no lock: they read the index in one SQLite read transaction and the content
from immutable version files, retrying when a concurrent redaction or sweep moved a head.

The engine holds its collaborators: files.py (a store's records, index and live tree),
writes.py (the write protocol), search_upkeep.py (the search index's purge and rebuild);
tree/sqlite/store_index.py has every SQL query. retention.py and fsck.py take the engine,
as the sweep and fsck call them. The rules and values every backend shares are in
core/store_*.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from app.storage.core import store_rules as rules, store_semantics as semantics
from app.storage.core.clock import Clock, iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec, cut_page
from app.storage.core.errors import NotFound
from app.storage.core.names import STORE_LOCKS, Scope
from app.storage.core.query import SearchBudget
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
from app.storage.core.store_records import VersionRecord
from app.storage.core.store_rules import DEFAULT_KEEP_RECENT, DEFAULT_MAX_MEMORIES
from app.storage.core.store_semantics import live_memory
from app.storage.core.usage import Ticket
from app.storage.tree.control import load_key
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.txn import Key, Transactions
from app.storage.tree.sqlite.store_index import IndexContent, StoreIndex
from app.storage.tree.stores.files import Retry, StoreFiles
from app.storage.tree.stores.search_upkeep import SearchUpkeep
from app.storage.tree.stores.writes import StoreTxn, StoreWriter
from app.storage.tree.usage import TreeUsage

_READ_ATTEMPTS = 5

T = TypeVar("T")


class MemoryStoreEngine:
    """Every memory store of every tenant/project under one storage root."""

    def __init__(
        self,
        root: Path,
        *,
        lock_timeout: float = 10.0,
        clock: Clock = system_clock,
        version_retention: timedelta = timedelta(days=30),
        keep_recent_versions: int = DEFAULT_KEEP_RECENT,
        max_memories: int = DEFAULT_MAX_MEMORIES,
        group_commit: bool = True,
        usage: TreeUsage | None = None,
    ) -> None:
        self.layout = Layout(root)
        self.files = StoreFiles(self.layout, lock_timeout=lock_timeout)
        # Counters, quotas and the free-space floor (tree/usage.py).
        self.usage = usage or TreeUsage(self.layout, lock_timeout=lock_timeout)
        self.tree = self.layout.tree
        self.root = self.layout.root
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.version_retention = version_retention
        self.keep_recent_versions = max(1, keep_recent_versions)
        self.max_memories = max_memories
        self.cursors = CursorCodec(load_key(self.layout))
        self.txns = Transactions(
            self.layout,
            STORE_LOCKS,
            timeout=lock_timeout,
            repair=self._repair_key,
            group_commit=group_commit,
        )
        self.search_upkeep = SearchUpkeep(self.files, self.txns)
        self.writer = StoreWriter(self.files, self.txns, self.usage, self.search_upkeep)

    def now_us(self) -> int:
        return to_us(self.clock())

    def rel(self, path: Path) -> str:
        return self.files.rel(path)

    def index(self, store_dir: Path) -> StoreIndex:
        """The SQLite index of the store in ``store_dir``."""
        return self.files.index(store_dir)

    # -- lock-free reads, locked writes ------------------------------------------------------
    def read(self, scope: Scope, store_id: str, fn: Callable[[Path], T]) -> T:
        """Run ``fn(store_dir)``, again when it raced a writer; NotFound when there is no store."""
        store_dir = self.files.store_dir(scope, store_id)
        for _ in range(_READ_ATTEMPTS):
            try:
                return fn(store_dir)
            except Retry:
                continue
            except (sqlite3.OperationalError, FileNotFoundError):
                if self.tree.is_dir(store_dir):
                    raise
                break  # deleted between the lookup and the read
        raise NotFound(f"memory store {store_id} not found")

    @contextlib.contextmanager
    def transaction(self, scope: Scope, store_id: str) -> Iterator[StoreTxn]:
        """Hold the store's lock for one mutation; NotFound when there is no such store."""
        store_dir = self.files.store_dir(scope, store_id)
        with self.txns(Key(scope, store_id)) as txn:
            if not self.tree.is_dir(store_dir):
                raise NotFound(f"memory store {store_id} not found")
            yield StoreTxn(txn, store_dir)

    def _repair_key(self, key: Key) -> None:
        store_dir = self.layout.store_dir(key.scope, key.id)
        if self.tree.is_dir(store_dir):
            self.rebuild(store_dir, key)
        else:
            self.usage.set_store(key.scope, key.id, None)

    # -- derived files and upkeep ---------------------------------------------------------
    def rebuild(self, store_dir: Path, key: Key | None = None) -> IndexContent:
        """Make the index (search rows included) and the live tree equal a rebuild from the
        version records, and the store's usage row in its project's listing (``key``: the
        store) its counters. The caller holds the store lock."""
        content, usage = self.files.rebuild(store_dir)
        if key is not None:
            self.usage.set_store(key.scope, key.id, usage)
        return content

    def refresh_usage(self, scope: Scope, store_id: str) -> None:
        """Copy a store's counters to its project's listing (an import)."""
        with self.transaction(scope, store_id) as txn:
            with self.index(txn.dir).write() as writer:
                usage = writer.store_usage()
            self.writer.publish_usage(txn, usage)

    def rebuild_search_later(self, scope: Scope, store_id: str) -> None:
        """Rebuild a store's search index in the background (search_upkeep.py)."""
        self.search_upkeep.rebuild_later(scope, store_id)

    def heal_search(
        self, scope: Scope, store_id: str, budget: SearchBudget | None = None
    ) -> int | None:
        """Rebuild a store's search index from its records if it needs it (search_upkeep.py);
        how many memories it filled, None when nothing was done."""
        return self.search_upkeep.heal(scope, store_id, budget)

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
        """Create an empty store: built in a temp directory, published by one rename."""
        record = semantics.new_store(
            scope,
            self.now_us(),
            name=name,
            description=description,
            metadata=metadata,
            creator=creator,
        )
        # A store record and an empty index: no quota counts them, the floor does.
        self.usage.admit(scope, gross=64 << 10)
        self.writer.create_store(scope, record)
        return record.view()

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore:
        """Read a store, archived or not."""
        return self.read(scope, store_id, lambda d: self.files.store_record(d).view())

    def store_creator(self, scope: Scope, store_id: str) -> str | None:
        """The token id that created the store (None when unknown)."""
        return self.read(scope, store_id, lambda d: self.files.store_record(d).created_by)

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
        after = stores_after(self.cursors, page, fp)
        records = []
        for record in self.files.scan_stores(scope):
            if record.archived_at and not include_archived:
                continue
            key = (record.created_us, record.id)
            if created_gte_us is not None and record.created_us < created_gte_us:
                continue
            if created_lte_us is not None and record.created_us > created_lte_us:
                continue
            if after is not None and key >= after:
                continue
            records.append(record)
        records.sort(key=lambda r: (r.created_us, r.id), reverse=True)
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
        with self.transaction(scope, store_id) as txn:
            record = self.files.store_record(txn.dir)
            semantics.check_updatable(record, store_id, only_creator)
            self.usage.admit(scope, gross=16 << 10)  # the store record: the floor only
            new = semantics.changed_store(
                record, self.now_us(), name=new_name, description=new_description, metadata=metadata
            )
            if new is None:
                return record.view()
            self.files.write_store_record(txn.dir, new)
        return new.view()

    def archive_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> MemoryStore:
        """Archive a store (one-way; archiving an archived store changes nothing)."""
        with self.transaction(scope, store_id) as txn:
            record = self.files.store_record(txn.dir)
            semantics.check_creator(record, only_creator)
            if record.archived_at:
                return record.view()
            record = semantics.archived_store(record, self.now_us())
            self.files.write_store_record(txn.dir, record)
        return record.view()

    def delete_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> Deleted:
        """Delete a store with all its memories and versions: one rename to the trash."""
        with self.transaction(scope, store_id) as txn:
            semantics.check_creator(self.files.store_record(txn.dir), only_creator)
            target = self.writer.trash_store(txn)
        self.tree.remove(target)
        self.usage.freed()
        return Deleted(store_id, "memory_store_deleted")

    # -- memories --------------------------------------------------------------------------
    def _check_writable(self, store_dir: Path) -> None:
        semantics.check_writable(self.files.store_record(store_dir))

    def _admit(self, scope: Scope, record: VersionRecord) -> Ticket:
        """Admit a version of ``record``'s content (its record and its live file on disk)."""
        size = int(record.content_size_bytes or 0)
        return self.usage.admit(scope, gross=2 * size + 4096, add_bytes=size)

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
        with self.transaction(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self.index(txn.dir).read() as reader:
                record = semantics.created_version(
                    reader,
                    self.now_us,
                    store_id,
                    path=path,
                    content=content,
                    actor=actor,
                    max_memories=self.max_memories,
                )
            ticket = self._admit(scope, record)
            try:
                self.writer.commit(txn, record, None, ticket)
            finally:
                ticket.release()
        return record.memory(full)

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory:
        """Read one live memory (its head version)."""

        def read(store_dir: Path) -> Memory:
            with self.index(store_dir).read() as reader:
                row = live_memory(reader, memory_id)
            return row.view(store_id, self.files.head_content(store_dir, row) if full else None)

        return self.read(scope, store_id, read)

    def find_memory(self, scope: Scope, store_id: str, path: str, *, full: bool) -> Memory | None:
        """The live memory at exactly ``path``, or None (the memory tool addresses by path)."""
        path = rules.validate_memory_path(path)

        def read(store_dir: Path) -> Memory | None:
            with self.index(store_dir).read() as reader:
                row = reader.memory_at(path)
            if row is None:
                return None
            return row.view(store_id, self.files.head_content(store_dir, row) if full else None)

        return self.read(scope, store_id, read)

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
        with self.transaction(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self.index(txn.dir).read() as reader:
                row, record = semantics.updated_version(
                    reader,
                    self.now_us,
                    store_id,
                    memory_id,
                    request,
                    actor=actor,
                    head_content=lambda found: self.files.head_content(txn.dir, found),
                )
                if record is None:
                    return row.view(
                        store_id, self.files.head_content(txn.dir, row) if full else None
                    )
            # The previous version stays (history): the new one is charged whole.
            ticket = self._admit(scope, record)
            try:
                self.writer.commit(txn, record, row.path, ticket)
            finally:
                ticket.release()
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
        with self.transaction(scope, store_id) as txn:
            # Archived or not, the store must be whole: its record read as every write
            # reads it (a link planted in its place is refused, never followed).
            self.files.store_record(txn.dir)
            with self.index(txn.dir).read() as reader:
                row, record = semantics.deleted_version(
                    reader, self.now_us, store_id, memory_id, expected, actor=actor
                )
            self.writer.commit(txn, record, row.path)
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

        def read(store_dir: Path) -> Page:
            with self.index(store_dir).read() as reader:
                as_of, items = memory_items(reader, query)
            return memories_page(
                self.cursors,
                query,
                as_of,
                items,
                lambda row: self.files.head_content(store_dir, row) if full else None,
            )

        return self.read(scope, store_id, read)

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

        def read(store_dir: Path) -> Page:
            with self.index(store_dir).read() as reader:
                rows = reader.versions_page(filters, query.before, query.limit + 1)
            kept, next_page = cut_page(
                rows, query.limit, lambda last: versions_next(self.cursors, query, last.id)
            )
            data = []
            for row in kept:
                if not full:
                    data.append(row.view(store_id))
                    continue
                record = self.files.version_record(store_dir, row.id)
                if record is not None:  # else removed by retention since the index was read
                    data.append(record.view(True))
            return Page(tuple(data), next_page)

        return self.read(scope, store_id, read)

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion:
        """Read one version (a redacted one too: its content fields are null)."""

        def read(store_dir: Path) -> MemoryVersion:
            record = self.files.version_record(store_dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            return record.view(full)

        return self.read(scope, store_id, read)

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion:
        """Clear a version's content, hash, size and path; the head of a live memory refuses."""
        with self.transaction(scope, store_id) as txn:
            record = self.files.version_record(txn.dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            if record.redacted_at:
                return record.view(True)
            with self.index(txn.dir).read() as reader:
                live = reader.memory(record.memory_id)
                last_us = reader.state()[1]
            semantics.check_redactable(version_id, live)
            redacted = record.redacted(iso_us(max(self.now_us(), last_us)), actor)
            self.writer.redact(txn, version_id, redacted)
        return redacted.view(True)
