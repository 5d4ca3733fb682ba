"""Version retention: versions older than the retention go, except the recent ones of live
memories (every live memory keeps its ``keep_recent_versions`` newest versions, the head
among them, whatever their age); versions of deleted memories go once they are old."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

from app.storage.core.clock import to_us
from app.storage.core.errors import NotFound, StorageError
from app.storage.core.names import Scope
from app.storage.core.sweep import VersionSweep
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.stores.fsck import all_stores
from app.storage.tree.stores.writes import StoreTxn


def sweep_versions(
    engine: MemoryStoreEngine, *, now: datetime, dry_run: bool = False
) -> VersionSweep:
    """Remove the versions of every store past their retention; report what went."""
    links: list[Path] = []
    stores = all_stores(engine, links)
    scanned, removed, size, errors = sweep_stores(engine, stores, now=now, dry_run=dry_run)
    return VersionSweep(
        stores_scanned=scanned,
        versions_removed=removed,
        bytes_removed=size,
        errors=tuple(errors),
        links=tuple(sorted(engine.rel(p) for p in links)),
    )


def doomed_versions(engine: MemoryStoreEngine, txn: StoreTxn, cutoff_us: int) -> list[str]:
    """The version ids of a store that retention removes at ``cutoff_us``."""
    with engine.index(txn.dir).read() as reader:
        live = reader.live_ids()
        ages = reader.version_ages()
    kept: dict[str, int] = {}
    doomed = []
    for version_id, memory_id, created_us in ages:
        if memory_id in live and kept.get(memory_id, 0) < engine.keep_recent_versions:
            kept[memory_id] = kept.get(memory_id, 0) + 1
            continue
        if created_us < cutoff_us:
            doomed.append(version_id)
    return doomed


def sweep_stores(
    engine: MemoryStoreEngine, stores: list[tuple[Scope, str]], *, now: datetime, dry_run: bool
) -> tuple[int, int, int, list[str]]:
    """Sweep ``stores``; return (stores scanned, versions removed, bytes removed, errors)."""
    cutoff = to_us(now - engine.version_retention)
    scanned = removed = size = 0
    errors: list[str] = []
    for scope, store_id in stores:
        try:
            if not dry_run:
                # A damaged search index is rebuilt from the records (a no-op when sound).
                engine.heal_search(scope, store_id)
            with engine.transaction(scope, store_id) as txn:
                scanned += 1
                if not dry_run:
                    # Contents replaced since the last sweep leave the search index's file.
                    engine.index(txn.dir).purge(only_pending=True)
                doomed = doomed_versions(engine, txn, cutoff)
                if not doomed:
                    continue
                files = [engine.layout.version_file(txn.dir, v) for v in doomed]
                size += sum(st.st_size for p in files if (st := engine.tree.lstat(p)))
                removed += len(doomed)
                if dry_run:
                    continue
                txn.begin()
                for path in files:
                    engine.tree.unlink(path)
                fsync_dir(engine.layout.versions_dir(txn.dir))
                with engine.index(txn.dir).write() as writer:
                    writer.delete_versions(doomed)
                    usage = writer.store_usage()
                engine.writer.publish_usage(txn, usage)
        except NotFound:
            continue  # deleted while we swept
        except (StorageError, OSError, sqlite3.Error) as exc:
            errors.append(f"{scope.tenant}/{scope.project}/{store_id}: {exc}")
    return scanned, removed, size, errors
