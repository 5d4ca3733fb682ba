"""Memories: create, read, find, update, delete and list, each write one new version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ulid import ULID

from ..clock import iso_us
from ..errors import InvalidName, NotFound
from ..layout import MEMORY_ID_RE, Scope
from ..usage import Ticket
from . import rules
from .index import IndexReader, MemoryRow
from .models import (
    ContentPreconditionFailed,
    Deleted,
    Memory,
    MemoryPrefix,
    Page,
    PathConflict,
    StoreArchived,
    StoreFull,
)
from .records import VersionRecord, sha256_hex
from .stores import StoreOps, check_limit, fingerprint

FULL_VIEW_LIMIT = 20


def live_memory(reader: IndexReader, memory_id: str) -> MemoryRow:
    """The live memory ``memory_id``, or NotFound (also for a malformed id)."""
    row = reader.memory(memory_id) if MEMORY_ID_RE.fullmatch(str(memory_id)) else None
    if row is None:
        raise NotFound(f"memory {memory_id} not found")
    return row


def check_free(reader: IndexReader, path: str, exclude: str | None) -> None:
    """Refuse a path held by another memory, or an ancestor/descendant of one."""
    found = reader.occupant(path, exclude)
    if found is not None:
        raise PathConflict(path, found[0], found[1])


class MemoryOps(StoreOps):
    """The memory-level operations of the engine."""

    def _check_writable(self, store_dir: Path) -> None:
        record = self.store_record(store_dir)
        if record.archived_at:
            raise StoreArchived(f"memory store {record.id} is archived and read-only")

    def _admit(self, scope: Scope, record: VersionRecord) -> Ticket:
        """Admit a version of ``record``'s content (its record and its live file on disk)."""
        size = int(record.content_size_bytes or 0)
        return self.usage.admit(scope, gross=2 * size + 4096, add_bytes=size)

    def view(self, store_id: str, row: MemoryRow, content: str | None) -> Memory:
        return Memory(
            id=row.id,
            memory_store_id=store_id,
            path=row.path,
            content=content,
            content_size_bytes=row.size,
            content_sha256=row.sha,
            memory_version_id=row.head,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def _new_version(
        self,
        reader: IndexReader,
        store_id: str,
        *,
        memory_id: str,
        operation: str,
        path: str,
        content: str | None,
        actor: dict[str, Any] | None,
        row: MemoryRow | None,
    ) -> VersionRecord:
        version_id, us = self.next_version(reader)
        moved = row is None or row.path != path
        return VersionRecord.new(
            id=version_id,
            store_id=store_id,
            memory_id=memory_id,
            operation=operation,
            path=path,
            content=content,
            actor=actor,
            created_us=us,
            created_at=iso_us(us),
            memory_created_at=row.created_at if row else iso_us(us),
            path_since=version_id if moved or row is None else row.path_since,
            previous=row.head if row else None,
        )

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
                check_free(reader, path, None)
                if reader.count() >= self.max_memories:
                    raise StoreFull(self.max_memories)
                record = self._new_version(
                    reader,
                    store_id,
                    memory_id=f"mem_{ULID()}",
                    operation="created",
                    path=path,
                    content=content,
                    actor=actor,
                    row=None,
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
            return self.view(store_id, row, self.head_content(store_dir, row) if full else None)

        return self.read(scope, store_id, read)

    def find_memory(self, scope: Scope, store_id: str, path: str, *, full: bool) -> Memory | None:
        """The live memory at exactly ``path``, or None (the memory tool addresses by path)."""
        path = rules.validate_memory_path(path)

        def read(store_dir: Path) -> Memory | None:
            with self.index(store_dir).read() as reader:
                row = reader.memory_at(path)
            if row is None:
                return None
            return self.view(store_id, row, self.head_content(store_dir, row) if full else None)

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
        if content is None and path is None:
            raise InvalidName("content", None, "at least one of content or path is required")
        new_path = None if path is None else rules.validate_memory_path(path)
        new_content = None if content is None else rules.validate_content(content)
        expected = (
            None
            if precondition_sha256 is None
            else rules.validate_sha256(precondition_sha256, "precondition.content_sha256")
        )
        with self.transaction(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self.index(txn.dir).read() as reader:
                row = live_memory(reader, memory_id)
                target = row.path if new_path is None else new_path
                sha = row.sha if new_content is None else sha256_hex(new_content.encode("utf-8"))
                unchanged = target == row.path and sha == row.sha
                if expected is not None and expected != row.sha and not unchanged:
                    # A failed precondition whose requested state already holds is a success.
                    raise ContentPreconditionFailed(
                        f"memory {memory_id} has content_sha256 {row.sha}, not {expected};"
                        " re-read it and retry"
                    )
                if unchanged:
                    current = self.head_content(txn.dir, row) if full else None
                    return self.view(store_id, row, current)
                if target != row.path:
                    check_free(reader, target, row.id)
                if new_content is None:
                    new_content = self.head_content(txn.dir, row)
                record = self._new_version(
                    reader,
                    store_id,
                    memory_id=row.id,
                    operation="modified",
                    path=target,
                    content=new_content,
                    actor=actor,
                    row=row,
                )
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
        """Delete a live memory (writes a ``deleted`` version; history stays)."""
        expected = (
            None
            if expected_sha256 is None
            else rules.validate_sha256(expected_sha256, "expected_content_sha256")
        )
        with self.transaction(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self.index(txn.dir).read() as reader:
                row = live_memory(reader, memory_id)
                if expected is not None and expected != row.sha:
                    raise ContentPreconditionFailed(
                        f"memory {memory_id} has content_sha256 {row.sha}, not {expected};"
                        " nothing was deleted"
                    )
                record = self._new_version(
                    reader,
                    store_id,
                    memory_id=row.id,
                    operation="deleted",
                    path=row.path,
                    content=None,
                    actor=actor,
                    row=row,
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
        """Memories (and, with depth 1, ``memory_prefix`` roll-ups) in path order.

        The first page pins the store's last version id; later pages skip memories whose
        current path was set after it (created or renamed since), so a memory renamed
        past the cursor while a client pages is never returned twice.
        """
        prefix = rules.validate_path_prefix(path_prefix)
        if depth not in (0, 1) or isinstance(depth, bool):
            raise InvalidName("depth", depth, "must be 0 or 1")
        limit = min(check_limit(limit), FULL_VIEW_LIMIT) if full else check_limit(limit)
        fp = fingerprint("memories", store_id, prefix, depth)
        body = self.decode_page(page, fp) if page is not None else None
        if body is not None and not (
            isinstance(body.get("k"), str) and isinstance(body.get("a"), str)
        ):
            raise InvalidName("page", page, "is not a valid page cursor")

        def read(store_dir: Path) -> Page:
            with self.index(store_dir).read() as reader:
                as_of, items = _page_items(reader, prefix, depth, limit, body)
            next_page = None
            if len(items) > limit:
                items = items[:limit]
                next_page = self.encode_page({"q": fp, "a": as_of, "k": items[-1].path})
            data = tuple(
                item
                if isinstance(item, MemoryPrefix)
                else self.view(store_id, item, self.head_content(store_dir, item) if full else None)
                for item in items
            )
            return Page(data, next_page)

        return self.read(scope, store_id, read)


def _page_items(
    reader: IndexReader, prefix: str, depth: int, limit: int, body: dict[str, Any] | None
) -> tuple[str, list[MemoryRow | MemoryPrefix]]:
    """Up to ``limit + 1`` items of a page (the extra one says there is a next page)."""
    high = prefix[:-1] + "0"  # '0' follows '/': every path below the prefix sorts before
    if body is None:
        as_of, low = reader.state()[0], prefix
    else:
        as_of, key = str(body["a"]), str(body["k"])
        low = key[:-1] + "0" if key.endswith("/") else key + "\x00"
    items: list[MemoryRow | MemoryPrefix] = []
    if depth == 0:
        items.extend(reader.memories_page(low, high, as_of, limit + 1))
        return as_of, items
    while len(items) <= limit:
        rows = reader.memories_page(low, high, as_of, 1)
        if not rows:
            break
        row = rows[0]
        rest = row.path[len(prefix) :]
        if "/" in rest:
            child = prefix + rest.split("/", 1)[0] + "/"
            items.append(MemoryPrefix(child))
            low = child[:-1] + "0"
        else:
            items.append(row)
            low = row.path + "\x00"
    return as_of, items
