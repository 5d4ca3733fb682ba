"""Stores: create, read, list, update, archive and delete."""

from __future__ import annotations

import os

from ulid import ULID

from app.storage.core import store_semantics as semantics
from app.storage.core.encoding import dumps
from app.storage.core.errors import Corrupt, NotFound, UnsafePath
from app.storage.core.files import DIR_MODE
from app.storage.core.names import MEMORIES_DIR, STORE_ID_RE, TMP_PREFIX, VERSIONS_DIR, Scope
from app.storage.core.store_models import Deleted, MemoryStore, Page
from app.storage.core.store_paging import (
    check_limit,
    fingerprint,
    stores_after,
    stores_page,
)
from app.storage.core.usage import StoreUsage
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.fs.txn import Key
from app.storage.tree.sqlite.db import check_write_room
from app.storage.tree.stores.base import StoresBase


class StoreOps(StoresBase):
    """The store-level operations of the engine."""

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
        parent = self.layout.check_inside(self.layout.stores_dir(scope))
        make_dirs(parent, self.root)
        tmp = parent / f"{TMP_PREFIX}{record.id}"
        try:
            os.mkdir(tmp, DIR_MODE)
            os.mkdir(tmp / VERSIONS_DIR, DIR_MODE)
            os.mkdir(tmp / MEMORIES_DIR, DIR_MODE)
            with self.index(tmp).write():
                pass
            write_atomic(self.layout.store_record(tmp), dumps(record.to_json()))
            fsync_dir(tmp)
            # Published in a transaction on the new store, so that a crash between the rename
            # and its usage row is repaired (the row written) like any other write.
            with self.txns(Key(scope, record.id)) as txn:
                txn.begin()
                published = self.layout.store_dir(scope, record.id)
                self.tree.rename(tmp, published)
                try:
                    self.usage.set_store(scope, record.id, StoreUsage())
                except Exception:
                    # The store was never answered for: take it back whole (no version is in
                    # it yet), so the error means nothing was made and nothing is to repair.
                    self.tree.rename(published, tmp)
                    txn.abandon()
                    raise
        except BaseException:
            self.tree.remove(tmp)
            raise
        fsync_dir(parent)
        return record.view()

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore:
        """Read a store, archived or not."""
        return self.read(scope, store_id, lambda d: self.store_record(d).view())

    def store_creator(self, scope: Scope, store_id: str) -> str | None:
        """The token id that created the store (None when unknown)."""
        return self.read(scope, store_id, lambda d: self.store_record(d).created_by)

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
        for entry in self.tree.entries(self.layout.stores_dir(scope)):
            if not entry.is_dir or not STORE_ID_RE.fullmatch(entry.name):
                continue
            try:
                record = self.store_record(entry.path)
            except (Corrupt, UnsafePath, NotFound):
                # Damaged, linked (fsck reports both) or deleted while we looked: the list
                # stays usable.
                continue
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
            record = self.store_record(txn.dir)
            semantics.check_updatable(record, store_id, only_creator)
            self.usage.admit(scope, gross=16 << 10)  # the store record: the floor only
            new = semantics.changed_store(
                record, self.now_us(), name=new_name, description=new_description, metadata=metadata
            )
            if new is None:
                return record.view()
            self.write_store_record(txn.dir, new)
        return new.view()

    def archive_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> MemoryStore:
        """Archive a store (one-way; archiving an archived store changes nothing)."""
        with self.transaction(scope, store_id) as txn:
            record = self.store_record(txn.dir)
            semantics.check_creator(record, only_creator)
            if record.archived_at:
                return record.view()
            record = semantics.archived_store(record, self.now_us())
            self.write_store_record(txn.dir, record)
        return record.view()

    def delete_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> Deleted:
        """Delete a store with all its memories and versions: one rename to the trash."""
        with self.transaction(scope, store_id) as txn:
            semantics.check_creator(self.store_record(txn.dir), only_creator)
            trash = self.layout.check_inside(self.layout.trash_dir())
            make_dirs(trash, self.root)
            target = trash / f"{ULID()}-{store_id}"
            # Its usage row is written after the rename: a refusal must come before it.
            check_write_room(str(self.layout.listing(scope)))
            txn.begin()  # a crash after the rename is repaired: the usage row goes too
            self.tree.rename(txn.dir, target)
            fsync_dir(txn.dir.parent)
            fsync_dir(trash)
            self.usage.set_store(scope, store_id, None)
        self.tree.remove(target)
        self.usage.freed()
        return Deleted(store_id, "memory_store_deleted")
