"""Versions: list, read and redact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.storage.core import store_semantics as semantics
from app.storage.core.clock import iso_us
from app.storage.core.cursor import cut_page
from app.storage.core.errors import NotFound
from app.storage.core.names import Scope
from app.storage.core.store_models import MemoryVersion, Page, VersionFilter
from app.storage.core.store_paging import versions_next, versions_query
from app.storage.tree.stores.memories import MemoryOps


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
            semantics.check_redactable(version_id, live)
            redacted = record.redacted(iso_us(max(self.now_us(), last_us)), actor)
            txn.begin()
            path = self.layout.check_inside(self.layout.version_file(txn.dir, version_id))
            self.write_version_in_place(path, redacted)
            with self.index(txn.dir).write() as writer:
                writer.put_version(redacted)
                # Its content may be an older one of a live memory, replaced in the search
                # index but still in its merged-away entries: owed a purge now, not at the
                # next sweep.
                writer.owe_purge()
                usage = writer.store_usage()
            self.publish_usage(txn, usage)
            # An older content of a live memory may still sit in the search index's merged-away
            # entries: redaction is how a secret is removed, so it leaves that file too.
            self.purge_search(txn)
        return redacted.view(True)
