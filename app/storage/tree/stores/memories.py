"""Memories: create, read, find, update, delete and list, each write one new version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.storage.core import store_rules as rules, store_semantics as semantics
from app.storage.core.names import Scope
from app.storage.core.store_models import Deleted, Memory, Page
from app.storage.core.store_paging import memories_page, memories_query, memory_items
from app.storage.core.store_records import VersionRecord
from app.storage.core.store_semantics import live_memory
from app.storage.core.usage import Ticket
from app.storage.tree.stores.stores import StoreOps


class MemoryOps(StoreOps):
    """The memory-level operations of the engine."""

    def _check_writable(self, store_dir: Path) -> None:
        semantics.check_writable(self.store_record(store_dir))

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
                self.commit(txn, record, None, ticket)
            finally:
                ticket.release()
        return record.memory(full)

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory:
        """Read one live memory (its head version)."""

        def read(store_dir: Path) -> Memory:
            with self.index(store_dir).read() as reader:
                row = live_memory(reader, memory_id)
            return row.view(store_id, self.head_content(store_dir, row) if full else None)

        return self.read(scope, store_id, read)

    def find_memory(self, scope: Scope, store_id: str, path: str, *, full: bool) -> Memory | None:
        """The live memory at exactly ``path``, or None (the memory tool addresses by path)."""
        path = rules.validate_memory_path(path)

        def read(store_dir: Path) -> Memory | None:
            with self.index(store_dir).read() as reader:
                row = reader.memory_at(path)
            if row is None:
                return None
            return row.view(store_id, self.head_content(store_dir, row) if full else None)

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
                    head_content=lambda found: self.head_content(txn.dir, found),
                )
                if record is None:
                    return row.view(store_id, self.head_content(txn.dir, row) if full else None)
            # The previous version stays (history): the new one is charged whole.
            ticket = self._admit(scope, record)
            try:
                self.commit(txn, record, row.path, ticket)
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
            self.store_record(txn.dir)
            with self.index(txn.dir).read() as reader:
                row, record = semantics.deleted_version(
                    reader, self.now_us, store_id, memory_id, expected, actor=actor
                )
            self.commit(txn, record, row.path)
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
                lambda row: self.head_content(store_dir, row) if full else None,
            )

        return self.read(scope, store_id, read)
