"""The write protocol of a memory store: how each mutation reaches the disk.

Every write runs as a transaction on its store (tree/fs/txn.py) under the store's lock: the
records first (a version record is the commit point), the derived files last. A writer that
dies in between leaves its write in flight, and the next holder of the lock rebuilds the
derived files from the records first (the engine's ``rebuild``). A store is created in a
temp directory and published by one rename, and deleted by one rename to the trash.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from ulid import ULID

from app.storage.core.encoding import dumps
from app.storage.core.files import DIR_MODE
from app.storage.core.names import MEMORIES_DIR, TMP_PREFIX, VERSIONS_DIR, Scope
from app.storage.core.store_records import StoreRecord, VersionRecord
from app.storage.core.usage import NO_TICKET, StoreUsage, Ticket
from app.storage.tree.fs.atomic import make_dirs, write_atomic, write_new
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.fs.txn import Key, Transactions, Txn
from app.storage.tree.sqlite.db import check_write_room
from app.storage.tree.stores.files import StoreFiles
from app.storage.tree.stores.search_upkeep import SearchUpkeep
from app.storage.tree.usage import TreeUsage


@dataclass
class StoreTxn:
    """A transaction on one store: its directory and the protocol's :class:`Txn`."""

    txn: Txn
    dir: Path

    def begin(self) -> None:
        self.txn.begin()

    def abandon(self) -> None:
        self.txn.abandon()

    @property
    def scope(self) -> Scope:
        return self.txn.key.scope

    @property
    def store_id(self) -> str:
        return self.txn.key.id


class StoreWriter:
    """The writes of every store: each under the store's lock, in the protocol's order."""

    def __init__(
        self, files: StoreFiles, txns: Transactions, usage: TreeUsage, search: SearchUpkeep
    ) -> None:
        self.files = files
        self.layout = files.layout
        self.tree = files.tree
        self.txns = txns
        self.usage = usage
        self.search = search

    def commit(
        self,
        txn: StoreTxn,
        record: VersionRecord,
        old_path: str | None,
        ticket: Ticket = NO_TICKET,
    ) -> None:
        """Write one version: the record (the commit point), the index, the store's usage in
        its project's listing (which drops ``ticket``'s reservation), then the live file.

        A write that fails before its index row is committed takes its record back: nothing
        else has changed yet (reads go by the index and the records, the live file comes
        last), so its error means what it says, nothing stored, and nothing is left to
        repair. After that, the derived files are the repair's (the slot stays set)."""
        txn.begin()
        path = self.files.version_path(txn.dir, record.id)
        try:
            write_new(path, dumps(record.to_json()))
            with self.files.index(txn.dir).write() as writer:
                writer.put_version(record)
                usage = writer.store_usage()
                # A purge a reader's snapshot stopped (this write is the next chance), a
                # compaction to finish, an index this write found damaged.
                due = writer.upkeep()
        except Exception:
            with contextlib.suppress(OSError):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                txn.abandon()
            raise
        self.publish_usage(txn, usage, ticket)
        if old_path is not None and (record.operation == "deleted" or old_path != record.path):
            self.files.remove_live(txn.dir, old_path)
        if record.operation != "deleted" and record.path is not None:
            self.files.write_live(txn.dir, record)
        if record.operation == "deleted" or due.owed or due.compacting:
            self.search.purge(txn.scope, txn.store_id, txn.dir)
        if due.damaged or due.backfill:
            self.search.rebuild_later(txn.scope, txn.store_id)
        if record.operation != "deleted" and self.search.text_written is not None:
            self.search.text_written(txn.scope)

    def redact(self, txn: StoreTxn, version_id: str, redacted: VersionRecord) -> None:
        """Rewrite version ``version_id`` as ``redacted`` (its content cleared), then its index
        row, and purge the search index of what it held."""
        txn.begin()
        self.files.rewrite_version(txn.dir, version_id, redacted)
        with self.files.index(txn.dir).write() as writer:
            writer.put_version(redacted)
            # Its content may be an older one of a live memory, replaced in the search
            # index but still in its merged-away entries: owed a purge now, not at the
            # next sweep.
            writer.owe_purge()
            usage = writer.store_usage()
        self.publish_usage(txn, usage)
        # An older content of a live memory may still sit in the search index's merged-away
        # entries: redaction is how a secret is removed, so it leaves that file too.
        self.search.purge(txn.scope, txn.store_id, txn.dir)

    def publish_usage(self, txn: StoreTxn, usage: StoreUsage, ticket: Ticket = NO_TICKET) -> None:
        """Copy the store's counters to its project's listing (the holder of its lock does)."""
        self.usage.set_store(txn.scope, txn.store_id, usage, release=ticket.id)
        ticket.settled()

    def create_store(self, scope: Scope, record: StoreRecord) -> None:
        """Create an empty store: built in a temp directory, published by one rename."""
        parent = self.layout.check_inside(self.layout.stores_dir(scope))
        make_dirs(parent, self.files.root)
        tmp = parent / f"{TMP_PREFIX}{record.id}"
        try:
            os.mkdir(tmp, DIR_MODE)
            os.mkdir(tmp / VERSIONS_DIR, DIR_MODE)
            os.mkdir(tmp / MEMORIES_DIR, DIR_MODE)
            with self.files.index(tmp).write():
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

    def trash_store(self, txn: StoreTxn) -> Path:
        """Move a store, with all its memories and versions, to the trash in one rename and drop
        its usage row; return where it went (the caller removes it once the lock is released)."""
        trash = self.layout.check_inside(self.layout.trash_dir())
        make_dirs(trash, self.files.root)
        target = trash / f"{ULID()}-{txn.store_id}"
        # Its usage row is written after the rename: a refusal must come before it.
        check_write_room(str(self.layout.listing(txn.scope)))
        txn.begin()  # a crash after the rename is repaired: the usage row goes too
        self.tree.rename(txn.dir, target)
        fsync_dir(txn.dir.parent)
        fsync_dir(trash)
        self.usage.set_store(txn.scope, txn.store_id, None)
        return target
