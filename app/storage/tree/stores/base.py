"""What every part of the memory-store engine shares: paths, records, the index, the write
protocol, and the derived files' rebuild.

On disk (tree/fs/layout.py names every path)::

    <root>/<tenant>/<project>/_stores/<store_id>/
        store.json                 record: name, description, metadata, times, archived_at
        versions/<version_id>.json records: one create-only file per version (commit point);
                                   rewritten only by redaction, removed only by retention
        memories/<path>            derived: the live content of each memory, a plain file
        index.sqlite3              derived: id <-> path, heads, version rows (WAL)

A store's directory is named by its id, so finding a store is a path computation. Writes
run as transactions on the store (tree/fs/txn.py): write the version record (the commit
point), then the live file, then the index. A writer that dies in between leaves its write
in flight; the next holder of the lock rebuilds the derived files from the records first.
Readers take no lock: they read the index in one SQLite read transaction and the content
from immutable version files, retrying when a concurrent redaction or sweep moved a head.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from app.storage.core.clock import Clock, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.encoding import dumps
from app.storage.core.errors import Corrupt, InvalidName, NotFound, StorageError, UnsafePath
from app.storage.core.names import STORE_LOCKS, TMP_PREFIX, VERSION_ID_RE, Scope
from app.storage.core.query import SearchBudget
from app.storage.core.record_rules import check_version_record
from app.storage.core.store_records import MemoryRow, StoreRecord, VersionRecord
from app.storage.core.store_rules import DEFAULT_KEEP_RECENT, DEFAULT_MAX_MEMORIES
from app.storage.core.usage import NO_TICKET, StoreUsage, Ticket
from app.storage.tree.background import Later
from app.storage.tree.control import load_key
from app.storage.tree.fs.atomic import make_dirs, write_atomic, write_new
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.txn import Key, Transactions, Txn
from app.storage.tree.records import read_json_bytes
from app.storage.tree.sqlite.store_index import IndexContent, StoreIndex, rows_from_records
from app.storage.tree.usage import TreeUsage

_READ_ATTEMPTS = 5
# Memories a search rebuild writes per hold of the store's lock.
FILL_BATCH = 200

T = TypeVar("T")


class Retry(Exception):
    """A lock-free read raced a writer (a redaction or a sweep moved a head); read again."""


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


class StoresBase:
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
        # Upkeep a request asks for but need not wait for: search index rebuilds.
        self.later = Later()
        self.txns = Transactions(
            self.layout,
            STORE_LOCKS,
            timeout=lock_timeout,
            repair=self._repair_key,
            group_commit=group_commit,
        )

    def now_us(self) -> int:
        return to_us(self.clock())

    # -- paths and records -------------------------------------------------------------
    def store_dir(self, scope: Scope, store_id: str) -> Path:
        """The directory of ``store_id`` (NotFound for an id no store can have)."""
        try:
            return self.layout.store_dir(scope, store_id)
        except StorageError:
            raise NotFound(f"memory store {store_id} not found") from None

    def store_record(self, store_dir: Path) -> StoreRecord:
        path = self.layout.store_record(store_dir)
        obj = read_json_bytes(self.layout.read_bytes(path), path)
        if obj is None:
            raise NotFound(f"memory store {store_dir.name} not found")
        return StoreRecord.from_json(obj, path)

    def version_record(self, store_dir: Path, version_id: str) -> VersionRecord | None:
        if not isinstance(version_id, str) or not VERSION_ID_RE.fullmatch(version_id):
            return None
        path = self.layout.version_file(store_dir, version_id)
        obj = read_json_bytes(self.layout.read_bytes(path), path)
        return None if obj is None else VersionRecord.from_json(obj, path)

    def index(self, store_dir: Path) -> StoreIndex:
        # SQLite follows links: refuse a linked store directory or index file first.
        path = self.layout.check_inside(self.layout.store_index(store_dir))
        return StoreIndex(path, timeout=self.lock_timeout)

    def head_content(self, store_dir: Path, row: MemoryRow) -> str:
        """The content of a live memory's head version (Retry when the head moved)."""
        record = self.version_record(store_dir, row.head)
        if record is None or record.content_sha256 != row.sha or record.content is None:
            raise Retry
        return record.content

    # -- lock-free reads ---------------------------------------------------------------
    def read(self, scope: Scope, store_id: str, fn: Callable[[Path], T]) -> T:
        """Run ``fn(store_dir)``, again when it raced a writer; NotFound when there is no store."""
        store_dir = self.store_dir(scope, store_id)
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

    # -- locked writes -----------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, scope: Scope, store_id: str) -> Iterator[StoreTxn]:
        """Hold the store's lock for one mutation; NotFound when there is no such store."""
        store_dir = self.store_dir(scope, store_id)
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
        path = self.layout.check_inside(self.layout.version_file(txn.dir, record.id))
        try:
            write_new(path, dumps(record.to_json()))
            with self.index(txn.dir).write() as writer:
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
            self.remove_live(txn.dir, old_path)
        if record.operation != "deleted" and record.path is not None:
            target = self.live_path(txn.dir, record.path)
            make_dirs(target.parent, self.layout.memories_dir(txn.dir))
            # Derived from the version record just written: not fsynced (atomic_file).
            write_atomic(target, str(record.content).encode("utf-8"), durable=False)
        if record.operation == "deleted" or due.owed or due.compacting:
            self.purge_search(txn)
        if due.damaged or due.backfill:
            self.rebuild_search_later(txn.scope, txn.store_id)

    def publish_usage(self, txn: StoreTxn, usage: StoreUsage, ticket: Ticket = NO_TICKET) -> None:
        """Copy the store's counters to its project's listing (the holder of its lock does)."""
        self.usage.set_store(txn.scope, txn.store_id, usage, release=ticket.id)
        ticket.settled()

    def refresh_usage(self, scope: Scope, store_id: str) -> None:
        """Copy a store's counters to its project's listing (an upgrade, an import)."""
        with self.transaction(scope, store_id) as txn:
            with self.index(txn.dir).write() as writer:
                usage = writer.store_usage()
            self.publish_usage(txn, usage)

    def purge_search(self, txn: StoreTxn) -> None:
        """Removed text leaves the search index's file too (tree/sqlite/fts.py), not only its
        answers. The write is done whatever happens here: an index that cannot be purged now
        stays 'pending' for the next sweep, one the purge found damaged is rebuilt."""
        try:
            self.index(txn.dir).purge()
        except sqlite3.DatabaseError:
            self.rebuild_search_later(txn.scope, txn.store_id)  # fts.purge marked it damaged
        except (StorageError, sqlite3.Error):
            pass

    # -- the search index's rebuild ----------------------------------------------------
    def rebuild_search_later(self, scope: Scope, store_id: str) -> None:
        """Run :meth:`heal_search` in the background (one run per store at a time)."""
        self.later.run(
            ("store-search", scope, store_id),
            lambda: self.heal_search(scope, store_id),
            f"rebuilding the search index of memory store {store_id}",
        )

    def heal_search(
        self, scope: Scope, store_id: str, budget: SearchBudget | None = None
    ) -> int | None:
        """Rebuild a store's search index from its records if it is marked damaged, does not
        open (or, with ``budget``, fails FTS5's integrity check within it: one that runs out
        raises SearchTimeout), or has a rebuild to finish: under the store's lock the index is
        dropped and started empty, then filled :data:`FILL_BATCH` memories per hold of the
        lock, each from its head version, while writes go on in between (each writes its own
        row); searches answer 503 until it is full. Return how many memories it filled, None
        when nothing was done."""
        store_dir = self.store_dir(scope, store_id)
        key = Key(scope, store_id)
        index = self.index(store_dir)
        with self.txns.locked(key):
            if not self.tree.is_dir(store_dir):
                return None
            marks = index.search_upkeep()
            if not (marks.damaged or marks.backfill):
                why = index.search_opens() if budget is None else index.search_damage(budget)
                if why is None:
                    return None
                index.mark_search_damaged(sqlite3.DatabaseError(why))
            token = index.start_search_rebuild()
        if token is None:
            return None
        count, after = 0, ""
        while True:
            with self.txns.locked(key):
                if not self.tree.is_dir(store_dir):
                    return None  # deleted meanwhile
                with index.write(create=False) as writer:
                    rows = writer.memories_after(after, FILL_BATCH)
                    for row in rows:
                        writer.fill_search(row.id, row.path, self.head_content(store_dir, row))
                    if not rows:
                        writer.search_filled(token)
                        break
            count += len(rows)
            after = rows[-1].id
        # The dropped index's pages were zeroed; their old images leave the WAL.
        with contextlib.suppress(StorageError, sqlite3.Error):
            index.purge()
        return count

    def write_version_in_place(self, path: Path, record: VersionRecord) -> None:
        """Rewrite a version record (redaction, the one change a version ever sees)."""
        write_atomic(path, dumps(record.to_json()))

    def write_store_record(self, store_dir: Path, record: StoreRecord) -> None:
        path = self.layout.check_inside(self.layout.store_record(store_dir))
        write_atomic(path, dumps(record.to_json()))

    def live_path(self, store_dir: Path, path: str) -> Path:
        """The live file of ``path``, refused (UnsafePath) if a link is on the way."""
        return self.layout.check_inside(self.layout.memory_file(store_dir, path))

    def remove_live(self, store_dir: Path, path: str) -> None:
        """Remove a live file and the parent directories it leaves empty."""
        memories = self.layout.memories_dir(store_dir)
        target = self.live_path(store_dir, path)
        self.tree.unlink(target)
        parent = target.parent
        while parent != memories and memories in parent.parents and self.tree.rmdir(parent):
            parent = parent.parent

    # -- derived files -----------------------------------------------------------------
    def load_records(
        self,
        store_dir: Path,
        problems: list[str] | None = None,
        torn: list[Path] | None = None,
        rules: list[str] | None = None,
    ) -> list[VersionRecord]:
        """Every version record of a store, without its content (read on demand); the
        unreadable ones are described in ``problems`` and, unless they are links, their
        paths listed in ``torn``; ``rules``: where the records the API would not have
        written are described (core/record_rules.py)."""
        records = []
        for entry in self.tree.entries(self.layout.versions_dir(store_dir)):
            stem = entry.name.removesuffix(".json")
            if entry.name.startswith(".") or not VERSION_ID_RE.fullmatch(stem):
                continue
            try:
                if entry.is_link:
                    raise UnsafePath("a symlink (never followed; remove it by hand)")
                record = self.version_record(store_dir, stem)
                if record is None or record.id != stem:
                    raise Corrupt("not a version record of this name")
            except (Corrupt, UnsafePath) as exc:
                if problems is not None:
                    problems.append(f"{self.rel(entry.path)}: unreadable version ({exc})")
                if torn is not None and not entry.is_link:
                    torn.append(entry.path)
                continue
            if rules is not None:
                try:
                    check_version_record(record)
                except InvalidName as exc:
                    rules.append(
                        f"{self.rel(entry.path)}: {exc} (not a record the API would write)"
                    )
            records.append(record.without_content())
        return records

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def expected_tree(self, store_dir: Path, content: IndexContent) -> dict[str, bytes]:
        tree = {}
        for row in content.memories:
            record = self.version_record(store_dir, row.head)
            tree[row.path] = str(record.content if record else "").encode("utf-8")
        return tree

    def sync_tree(self, store_dir: Path, expected: dict[str, bytes], apply: bool) -> list[str]:
        """Compare (and with ``apply`` fix) the live files against ``expected``.

        Links are reported and left alone: never entered, read, written through or removed.
        """
        memories = self.layout.memories_dir(store_dir)
        st = self.tree.lstat(memories)
        if st is not None and stat.S_ISLNK(st.st_mode):
            return [f"{self.rel(memories)}: symlink (never followed; remove it by hand)"]
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return [f"{self.rel(memories)}: not a directory"]
        diffs: list[str] = []
        if st is None:
            diffs.append(f"{self.rel(memories)}: missing")
            if apply:
                make_dirs(memories, store_dir)
        steps = list(self.tree.walk(memories))
        seen = set()
        for step in steps:
            for entry in step.entries:
                rel = "/" + entry.path.relative_to(memories).as_posix()
                where = self.rel(entry.path)
                if entry.is_link:
                    diffs.append(f"{where}: symlink (never followed; remove it by hand)")
                elif entry.is_file and rel in expected:
                    seen.add(rel)
                    if self.layout.read_bytes(entry.path) != expected[rel]:
                        diffs.append(f"{where}: content differs from its head version")
                        if apply:
                            write_atomic(entry.path, expected[rel])
                elif not entry.is_dir:
                    # Live files are written under the store lock, which the caller holds: a
                    # temp file here is a dead writer's, never one in flight.
                    kind = "leftover temp file" if entry.name.startswith(TMP_PREFIX) else None
                    diffs.append(f"{where}: {kind or 'not a live memory'}")
                    if apply:
                        self.tree.unlink(entry.path)
        if apply:
            for step in reversed(steps[1:]):
                self.tree.rmdir(step.path)  # only succeeds when it is (now) empty
        for rel, data in expected.items():
            if rel not in seen:
                diffs.append(
                    f"{self.rel(self.layout.memory_file(store_dir, rel))}: live file missing"
                )
                if apply:
                    self._restore_live(store_dir, rel, data)
        return diffs

    def _restore_live(self, store_dir: Path, rel: str, data: bytes) -> None:
        target = self.live_path(store_dir, rel)
        memories = self.layout.memories_dir(store_dir)
        for parent in reversed(target.relative_to(memories).parents[:-1]):
            here = memories / parent
            st = self.tree.lstat(here)
            if st is not None and not self.tree.is_dir(here):
                self.tree.unlink(here)  # a file where the memory needs a directory
        make_dirs(target.parent, memories)
        write_atomic(target, data)

    def rebuild(self, store_dir: Path, key: Key | None = None) -> IndexContent:
        """Make the index (search rows included) and the live tree equal a rebuild from the
        version records, and the store's usage row in its project's listing (``key``: the
        store) its counters.

        The caller holds the store lock: a temp file among the versions is a dead writer's.
        """
        for entry in self.tree.entries(self.layout.versions_dir(store_dir)):
            if entry.name.startswith(TMP_PREFIX) and not entry.is_link:
                self.tree.unlink(entry.path)
        content = rows_from_records(self.load_records(store_dir))
        expected = self.expected_tree(store_dir, content)
        texts = {m.id: expected[m.path].decode("utf-8") for m in content.memories}
        with self.index(store_dir).write() as writer:
            writer.replace_all(content, texts)
            usage = writer.store_usage()
        self.index(store_dir).purge()
        self.sync_tree(store_dir, expected, apply=True)
        if key is not None:
            self.usage.set_store(key.scope, key.id, usage)
        return content
