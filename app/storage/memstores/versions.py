"""Versions: list, read and redact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..clock import iso_us
from ..errors import InvalidName, NotFound
from ..layout import VERSION_ID_RE, Scope
from .index import VersionRow, filter_clause
from .memories import FULL_VIEW_LIMIT, MemoryOps
from .models import HeadVersion, MemoryVersion, Page, VersionFilter
from .records import OPERATIONS
from .stores import check_limit, fingerprint


def row_view(store_id: str, row: VersionRow) -> MemoryVersion:
    return MemoryVersion(
        id=row.id,
        memory_store_id=store_id,
        memory_id=row.memory_id,
        operation=row.operation,
        path=row.path,
        content=None,
        content_size_bytes=row.size,
        content_sha256=row.sha,
        created_by=row.actor(),
        created_at=row.created_at,
        redacted_at=row.redacted_at,
        redacted_by=row.redactor(),
    )


class VersionOps(MemoryOps):
    """The version-level operations of the engine."""

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
        if filters.operation is not None and filters.operation not in OPERATIONS:
            raise InvalidName("operation", filters.operation, f"must be one of {OPERATIONS}")
        limit = min(check_limit(limit), FULL_VIEW_LIMIT) if full else check_limit(limit)
        fp = fingerprint("versions", store_id, *filter_clause(filters))
        before = None
        if page is not None:
            before = self.decode_page(page, fp).get("k")
            if not isinstance(before, str) or not VERSION_ID_RE.fullmatch(before):
                raise InvalidName("page", page, "is not a valid page cursor")

        def read(store_dir: Path) -> Page:
            with self.index(store_dir).read() as reader:
                rows = reader.versions_page(filters, before, limit + 1)
            next_page = None
            if len(rows) > limit:
                rows = rows[:limit]
                next_page = self.encode_page({"q": fp, "k": rows[-1].id})
            data = []
            for row in rows:
                if not full:
                    data.append(row_view(store_id, row))
                    continue
                record = self.version_record(store_dir, row.id)
                if record is not None:  # else removed by retention since the index was read
                    data.append(record.view(True))
            return Page(tuple(data), next_page)

        return self.read(scope, store_id, read)

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion:
        """Read one version (a redacted one too: its content fields are null)."""

        def read(store_dir: Path) -> MemoryVersion:
            record = self.version_record(store_dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            return record.view(full)

        return self.read(scope, store_id, read)

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion:
        """Clear a version's content, hash, size and path; the head of a live memory refuses."""
        with self.transaction(scope, store_id) as txn:
            record = self.version_record(txn.dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            if record.redacted_at:
                return record.view(True)
            with self.index(txn.dir).read() as reader:
                live = reader.memory(record.memory_id)
                last_us = reader.state()[1]
            if live is not None and live.head == version_id:
                raise HeadVersion(
                    f"version {version_id} is the head of live memory {live.id}: write a new"
                    " version (or delete the memory) first, then redact this one"
                )
            redacted = record.redacted(iso_us(max(self.now_us(), last_us)), actor)
            txn.begin()
            path = self.layout.check_inside(self.layout.version_file(txn.dir, version_id))
            self.write_version_in_place(path, redacted)
            with self.index(txn.dir).write() as writer:
                writer.put_version(redacted)
                usage = writer.store_usage()
            self.publish_usage(txn, usage)
            # An older content of a live memory may still sit in the search index's merged-away
            # entries: redaction is how a secret is removed, so it leaves that file too.
            self.purge_search(txn.dir)
        return redacted.view(True)
