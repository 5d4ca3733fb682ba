"""The memory-store engine: every operation of the memory-stores API over the tree.

Split by concern: base.py (paths, records, the write protocol, derived files), stores.py,
memories.py, versions.py (the operations), tree/sqlite/store_index.py (every SQL query),
retention.py and fsck.py (the operations of the tree).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from app.storage.core.models import FsckReport
from app.storage.core.sweep import VersionSweep
from app.storage.tree.stores.fsck import all_stores, fsck_stores
from app.storage.tree.stores.retention import sweep_versions
from app.storage.tree.stores.versions import VersionOps


class MemoryStoreEngine(VersionOps):
    """Every memory store of every tenant/project under one storage root."""

    def sweep_versions(self, *, now: datetime, dry_run: bool = False) -> VersionSweep:
        """Remove versions past their retention (see retention.py); report what went."""
        links: list[Path] = []
        stores = all_stores(self, links)
        scanned, removed, size, errors = sweep_versions(self, stores, now=now, dry_run=dry_run)
        return VersionSweep(
            stores_scanned=scanned,
            versions_removed=removed,
            bytes_removed=size,
            errors=tuple(errors),
            links=tuple(sorted(self.rel(p) for p in links)),
        )

    def fsck(self, report: FsckReport, *, repair: bool = False) -> None:
        """Check every store's derived files against a rebuild from its records."""
        fsck_stores(self, report, repair=repair)
