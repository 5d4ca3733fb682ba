"""Memory stores: named stores of path-addressed text memories with a version history.

On disk (see docs/memory-stores.md)::

    <root>/<tenant>/<project>/_stores/<slug>-<store_id>/
        store.json                 record: name, description, metadata, times, archived_at
        versions/<memver_id>.json  records: one create-only file per version (commit point);
                                   rewritten only by redaction, removed only by retention
        memories/<path>            derived: the live content of each memory, a plain file
        index.sqlite3              derived: id <-> path, heads, version rows (WAL)
    <root>/.locks/<tenant>/<project>/stores/<store_id>.lock   per-store lock, never deleted
    <root>/.locks/<tenant>/<project>/stores/<store_id>.dirty  dirty flag (locks.set_dirty)

Write protocol for every memory mutation, under the store lock: mark dirty, write the
version record (create-only: the commit point), update the live file, update the index,
clear the mark. A writer that dies in between leaves the mark; the next lock holder
rebuilds the derived files from the records before doing anything else. Readers take no
lock: they read the index in one SQLite read transaction and the content from immutable
version files, retrying when a concurrent rename, redaction or sweep moved things.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from ulid import ULID

from ..atomic import fsync_dir, make_dirs, os_errors, remove_quietly, write_atomic, write_new
from ..clock import Clock, iso_us, system_clock, to_us
from ..errors import Corrupt, InvalidName, NotFound
from ..layout import LOCKS_DIR, TMP_PREFIX, TRASH_DIR, Layout, Scope, validate_id
from ..locks import clear_dirty, is_dirty, locked, set_dirty
from ..models import FsckReport
from ..records import dumps, read_json
from . import rules
from .index import (
    MEMORY_COLUMNS,
    VERSION_COLUMNS,
    IndexContent,
    MemoryRow,
    StoreIndex,
    VersionRow,
    dump,
    fetch_memory,
    get_state,
    rows_from_records,
)
from .models import (
    ContentPreconditionFailed,
    Deleted,
    HeadVersion,
    Memory,
    MemoryPrefix,
    MemoryStore,
    MemoryVersion,
    Page,
    PathConflict,
    StoreArchived,
    StoreFull,
    VersionFilter,
)

STORES_DIR = "_stores"
STORE_RECORD = "store.json"
VERSIONS_DIR = "versions"
MEMORIES_DIR = "memories"
INDEX_FILE = "index.sqlite3"
FORMAT = 1
MAX_LIMIT = 100
FULL_VIEW_LIMIT = 20
DEFAULT_MAX_MEMORIES = 10_000
DEFAULT_KEEP_RECENT = 3
OPERATIONS = ("created", "modified", "deleted")
STALE_TEMP_SECONDS = 3600
_READ_ATTEMPTS = 5

T = TypeVar("T")


class _Retry(Exception):
    """A lock-free read raced a writer (rename, redaction, sweep); read again."""


def _live_memory(conn: sqlite3.Connection, memory_id: str) -> MemoryRow:
    """The live memory ``memory_id`` of an open index, or NotFound (also for a malformed id)."""
    row = fetch_memory(conn, "id = ?", (memory_id,)) if rules.is_memory_id(memory_id) else None
    if row is None:
        raise NotFound(f"memory {memory_id} not found")
    return row


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def encode_cursor(body: dict[str, Any]) -> str:
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return "page_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, fingerprint: str) -> dict[str, Any]:
    bad = InvalidName("page", cursor, "is not a page cursor this server issued for this list")
    if not isinstance(cursor, str) or not cursor.startswith("page_") or len(cursor) > 8192:
        raise bad
    text = cursor[5:]
    try:
        body = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if not isinstance(body, dict) or body.get("q") != fingerprint:
        raise bad
    return body


@dataclass
class _Txn:
    """One locked mutation of a store; :meth:`begin` marks it dirty before the first write."""

    marker: Path
    dir: Path
    dirty: bool = False

    def begin(self) -> None:
        if not self.dirty:
            set_dirty(self.marker)
            self.dirty = True


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
    ) -> None:
        self.layout = Layout(root)
        self.root = self.layout.root
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.version_retention = version_retention
        self.keep_recent_versions = max(1, keep_recent_versions)
        self.max_memories = max_memories

    # -- paths -------------------------------------------------------------------------
    def stores_dir(self, scope: Scope) -> Path:
        return self.layout.project_dir(scope) / STORES_DIR

    def _lock_path(self, scope: Scope, store_id: str) -> Path:
        return self.root / LOCKS_DIR / scope.tenant / scope.project / "stores" / f"{store_id}.lock"

    def _find(self, scope: Scope, store_id: str) -> Path | None:
        """The directory of ``store_id`` in ``scope``; found by the id suffix of its name."""
        if not rules.is_store_id(store_id):
            return None
        parent = self.stores_dir(scope)
        try:
            entries = list(os.scandir(parent))
        except (FileNotFoundError, NotADirectoryError):
            return None
        suffix = "-" + store_id
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not (name == store_id or name.endswith(suffix)):
                continue
            if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                continue
            return self.layout.check_inside(parent / name)
        return None

    def _index(self, store_dir: Path) -> StoreIndex:
        return StoreIndex(store_dir / INDEX_FILE, timeout=self.lock_timeout)

    def now_us(self) -> int:
        return to_us(self.clock())

    # -- lock-free reads ---------------------------------------------------------------
    def _read(self, scope: Scope, store_id: str, fn: Callable[[Path], T]) -> T:
        for _ in range(_READ_ATTEMPTS):
            store_dir = self._find(scope, store_id)
            if store_dir is None:
                raise NotFound(f"memory store {store_id} not found")
            try:
                return fn(store_dir)
            except _Retry:
                continue
            except (sqlite3.OperationalError, FileNotFoundError):
                # The store was renamed or deleted between the lookup and the read.
                if store_dir.exists():
                    raise
                continue
        raise NotFound(f"memory store {store_id} not found")

    def _store_record(self, store_dir: Path) -> dict[str, Any]:
        record = read_json(store_dir / STORE_RECORD)
        if not isinstance(record, dict):
            raise FileNotFoundError(store_dir / STORE_RECORD)
        return record

    def _version_record(self, store_dir: Path, version_id: str) -> dict[str, Any] | None:
        if not rules.is_version_id(version_id):
            return None
        record = read_json(store_dir / VERSIONS_DIR / f"{version_id}.json")
        return record if isinstance(record, dict) else None

    # -- locked writes -----------------------------------------------------------------
    @contextlib.contextmanager
    def _txn(self, scope: Scope, store_id: str) -> Iterator[_Txn]:
        if not rules.is_store_id(store_id):
            raise NotFound(f"memory store {store_id} not found")
        lock = self._lock_path(scope, store_id)
        marker = lock.with_suffix(".dirty")
        with locked(lock, self.lock_timeout), os_errors():
            store_dir = self._find(scope, store_id)
            if store_dir is None:
                raise NotFound(f"memory store {store_id} not found")
            if is_dirty(marker):
                # The previous holder died between its record and its derived files.
                self._rebuild(store_dir)
                clear_dirty(marker)
            txn = _Txn(marker, store_dir)
            try:
                yield txn
            except BaseException:
                if txn.dirty:
                    with contextlib.suppress(Exception):
                        self._rebuild(txn.dir)
                        clear_dirty(marker)
                raise
            if txn.dirty:
                clear_dirty(marker)

    def _next_version(self, last_id: str, last_us: int) -> tuple[str, int]:
        """A version id and time, both strictly after the store's last (clock may stall)."""
        us = max(self.now_us(), last_us)
        candidate = ULID.from_timestamp(us / 1_000_000)
        if last_id and str(candidate) <= last_id.removeprefix("memver_"):
            candidate = ULID.from_int(int(ULID.from_str(last_id.removeprefix("memver_"))) + 1)
        return f"memver_{candidate}", us

    def _commit(self, txn: _Txn, record: dict[str, Any], old_path: str | None) -> None:
        """Write one version: the record (commit point), the live file, then the index."""
        txn.begin()
        write_new(txn.dir / VERSIONS_DIR / f"{record['id']}.json", dumps(record))
        memories = txn.dir / MEMORIES_DIR
        if old_path is not None and (
            record["operation"] == "deleted" or old_path != record["path"]
        ):
            self._remove_live(memories, old_path)
        if record["operation"] != "deleted":
            target = self._live_path(memories, record["path"])
            make_dirs(target.parent, memories)
            # Derived from the version record just written: not fsynced (atomic_file).
            write_atomic(target, record["content"].encode("utf-8"), durable=False)
        with self._index(txn.dir).write(create=True) as conn:
            StoreIndex.put_version(conn, record)

    def _live_path(self, memories: Path, path: str) -> Path:
        return self.layout.check_inside(memories / path.lstrip("/"))

    def _remove_live(self, memories: Path, path: str) -> None:
        """Remove a live file and the parent directories it leaves empty."""
        target = self._live_path(memories, path)
        remove_quietly(target)
        parent = target.parent
        while parent != memories and memories in parent.parents:
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = parent.parent
        fsync_dir(parent)

    # -- stores ------------------------------------------------------------------------
    def _store_view(self, record: dict[str, Any]) -> MemoryStore:
        return MemoryStore(
            id=record["id"],
            name=record["name"],
            description=record.get("description") or "",
            metadata=dict(record.get("metadata") or {}),
            created_at=record["created_at"],
            updated_at=record["updated_at"],
            archived_at=record.get("archived_at"),
        )

    def create_store(
        self,
        scope: Scope,
        *,
        name: object,
        description: object = "",
        metadata: object = None,
    ) -> MemoryStore:
        """Create an empty store: built in a temp directory, published by one rename."""
        name = rules.validate_name(name)
        description = rules.validate_description("" if description is None else description)
        bag = rules.validate_metadata({} if metadata is None else metadata)
        store_id = f"memstore_{ULID()}"
        now = self.now_us()
        record = {
            "format": FORMAT,
            "type": "memory_store",
            "id": store_id,
            "name": name,
            "description": description,
            "metadata": bag,
            "created_at": iso_us(now),
            "created_us": now,
            "updated_at": iso_us(now),
            "archived_at": None,
            "tenant": scope.tenant,
            "project": scope.project,
        }
        parent = self.stores_dir(scope)
        with os_errors():
            make_dirs(parent, Path(self.root.anchor))
            tmp = parent / f"{TMP_PREFIX}{store_id}"
            try:
                os.mkdir(tmp)
                os.mkdir(tmp / VERSIONS_DIR)
                os.mkdir(tmp / MEMORIES_DIR)
                with self._index(tmp).write(create=True):
                    pass
                write_atomic(tmp / STORE_RECORD, dumps(record))
                fsync_dir(tmp)
                os.rename(tmp, parent / rules.store_dirname(name, store_id))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            fsync_dir(parent)
        return self._store_view(record)

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore:
        """Read a store, archived or not."""
        return self._read(scope, store_id, lambda d: self._store_view(self._store_record(d)))

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
        limit = _check_limit(limit)
        fp = _fingerprint("stores", scope.tenant, scope.project, include_archived)
        after: tuple[int, str] | None = None
        if page is not None:
            body = decode_cursor(page, fp)
            key = body.get("k")
            if not (isinstance(key, list) and len(key) == 2 and isinstance(key[0], int)):
                raise InvalidName("page", page, "is not a valid page cursor")
            after = (key[0], str(key[1]))
        records = []
        try:
            entries = [e.name for e in os.scandir(self.stores_dir(scope))]
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        for name in entries:
            if name.startswith("."):
                continue
            try:
                record = read_json(self.stores_dir(scope) / name / STORE_RECORD)
            except Corrupt:
                continue
            if not isinstance(record, dict):
                continue  # deleted or renamed while we looked
            if record.get("archived_at") and not include_archived:
                continue
            try:
                us = int(record["created_us"])
                self._store_view(record)
            except (KeyError, TypeError, ValueError):
                continue  # a damaged record: fsck reports it; the list stays usable
            if created_gte_us is not None and us < created_gte_us:
                continue
            if created_lte_us is not None and us > created_lte_us:
                continue
            if after is not None and (us, record["id"]) >= after:
                continue
            records.append(record)
        records.sort(key=lambda r: (int(r["created_us"]), r["id"]), reverse=True)
        chosen = records[:limit]
        next_page = None
        if len(records) > limit:
            last = chosen[-1]
            next_page = encode_cursor({"q": fp, "k": [int(last["created_us"]), last["id"]]})
        return Page(tuple(self._store_view(r) for r in chosen), next_page)

    def update_store(
        self,
        scope: Scope,
        store_id: str,
        *,
        name: object = None,
        description: object = None,
        metadata: object = None,
    ) -> MemoryStore:
        """Change name, description and/or patch metadata; None leaves a field as it is."""
        if name is not None:
            name = rules.validate_name(name)
        if description is not None:
            description = rules.validate_description(description)
        with self._txn(scope, store_id) as txn:
            record = self._store_record(txn.dir)
            if record.get("archived_at"):
                raise StoreArchived(f"memory store {store_id} is archived and read-only")
            new = dict(record)
            if name is not None:
                new["name"] = name
            if description is not None:
                new["description"] = description
            if metadata is not None:
                new["metadata"] = rules.patch_metadata(record.get("metadata") or {}, metadata)
            if new == record:
                return self._store_view(record)
            new["updated_at"] = iso_us(max(self.now_us(), int(record["created_us"])))
            write_atomic(txn.dir / STORE_RECORD, dumps(new))
            wanted = txn.dir.parent / rules.store_dirname(new["name"], store_id)
            if wanted != txn.dir:
                # The directory follows the mount slug so the tree reads well; readers
                # that looked the old name up retry (see _read).
                os.rename(txn.dir, wanted)
                fsync_dir(wanted.parent)
        return self._store_view(new)

    def archive_store(self, scope: Scope, store_id: str) -> MemoryStore:
        """Archive a store (one-way; archiving an archived store changes nothing)."""
        with self._txn(scope, store_id) as txn:
            record = self._store_record(txn.dir)
            if record.get("archived_at"):
                return self._store_view(record)
            record["archived_at"] = iso_us(max(self.now_us(), int(record["created_us"])))
            write_atomic(txn.dir / STORE_RECORD, dumps(record))
        return self._store_view(record)

    def delete_store(self, scope: Scope, store_id: str) -> Deleted:
        """Delete a store with all its memories and versions: one rename to the trash."""
        with self._txn(scope, store_id) as txn:
            trash = self.root / TRASH_DIR
            make_dirs(trash, self.root)
            target = trash / f"{ULID()}-{txn.dir.name}"
            os.rename(txn.dir, target)
            fsync_dir(txn.dir.parent)
            fsync_dir(trash)
        shutil.rmtree(target, ignore_errors=True)
        return Deleted(store_id, "memory_store_deleted")

    # -- memories ----------------------------------------------------------------------
    def _memory_view(self, store_id: str, row: MemoryRow, content: str | None) -> Memory:
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

    def _head_content(self, store_dir: Path, row: MemoryRow) -> str:
        record = self._version_record(store_dir, row.head)
        if record is None or record.get("content_sha256") != row.sha:
            raise _Retry  # a newer write moved the head and the old one was swept/redacted
        content = record.get("content")
        if not isinstance(content, str):
            raise _Retry
        return content

    def _check_writable(self, store_dir: Path) -> None:
        record = self._store_record(store_dir)
        if record.get("archived_at"):
            raise StoreArchived(f"memory store {record['id']} is archived and read-only")

    def _check_free(self, conn: sqlite3.Connection, path: str, exclude: str | None) -> None:
        """Refuse a path held by another memory, or an ancestor/descendant of one."""
        segments = path[1:].split("/")
        candidates = [path] + ["/" + "/".join(segments[:i]) for i in range(1, len(segments))]
        marks = ",".join("?" * len(candidates))
        row = conn.execute(
            f"SELECT id, path FROM memories WHERE path IN ({marks}) AND id != ?"
            " ORDER BY length(path) LIMIT 1",
            (*candidates, exclude or ""),
        ).fetchone()
        if row is None:
            row = conn.execute(
                "SELECT id, path FROM memories WHERE path >= ? AND path < ? AND id != ?"
                " ORDER BY path LIMIT 1",
                (path + "/", path + "0", exclude or ""),
            ).fetchone()
        if row is not None:
            raise PathConflict(path, row[0], row[1])

    def _version_record_for(
        self,
        store_id: str,
        version: tuple[str, int],
        memory_id: str,
        operation: str,
        path: str,
        content: str | None,
        actor: dict[str, Any] | None,
        *,
        memory_created_at: str,
        path_since: str,
        previous: str | None,
    ) -> dict[str, Any]:
        data = None if content is None else content.encode("utf-8")
        return {
            "format": FORMAT,
            "type": "memory_version",
            "id": version[0],
            "memory_store_id": store_id,
            "memory_id": memory_id,
            "operation": operation,
            "path": path,
            "content": content,
            "content_sha256": None if data is None else _sha256(data),
            "content_size_bytes": None if data is None else len(data),
            "created_by": actor,
            "created_at": iso_us(version[1]),
            "created_us": version[1],
            "redacted_at": None,
            "redacted_by": None,
            # Internal: lets the index be rebuilt from the head version alone.
            "memory_created_at": memory_created_at,
            "path_since": path_since,
            "previous_version_id": previous,
        }

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
        with self._txn(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self._index(txn.dir).read() as conn:
                self._check_free(conn, path, None)
                count = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
                last_id, last_us = get_state(conn)
            if count >= self.max_memories:
                raise StoreFull(self.max_memories)
            version = self._next_version(last_id, last_us)
            record = self._version_record_for(
                store_id,
                version,
                f"mem_{ULID()}",
                "created",
                path,
                content,
                actor,
                memory_created_at=iso_us(version[1]),
                path_since=version[0],
                previous=None,
            )
            self._commit(txn, record, None)
        return self._memory_from_record(record, full)

    def _memory_from_record(self, record: dict[str, Any], full: bool) -> Memory:
        return Memory(
            id=record["memory_id"],
            memory_store_id=record["memory_store_id"],
            path=record["path"],
            content=record["content"] if full else None,
            content_size_bytes=record["content_size_bytes"],
            content_sha256=record["content_sha256"],
            memory_version_id=record["id"],
            created_at=record["memory_created_at"],
            updated_at=record["created_at"],
        )

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory:
        """Read one live memory (its head version)."""

        def read(store_dir: Path) -> Memory:
            with self._index(store_dir).read() as conn:
                row = _live_memory(conn, memory_id)
            content = self._head_content(store_dir, row) if full else None
            return self._memory_view(store_id, row, content)

        return self._read(scope, store_id, read)

    def find_memory(self, scope: Scope, store_id: str, path: str, *, full: bool) -> Memory | None:
        """The live memory at exactly ``path``, or None (the memory tool addresses by path)."""
        path = rules.validate_memory_path(path)

        def read(store_dir: Path) -> Memory | None:
            with self._index(store_dir).read() as conn:
                row = fetch_memory(conn, "path = ?", (path,))
            if row is None:
                return None
            content = self._head_content(store_dir, row) if full else None
            return self._memory_view(store_id, row, content)

        return self._read(scope, store_id, read)

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
        if path is not None:
            path = rules.validate_memory_path(path)
        if content is not None:
            content = rules.validate_content(content)
        if precondition_sha256 is not None:
            precondition_sha256 = rules.validate_sha256(
                precondition_sha256, "precondition.content_sha256"
            )
        with self._txn(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self._index(txn.dir).read() as conn:
                row = _live_memory(conn, memory_id)
                new_path = row.path if path is None else path
                new_sha = row.sha if content is None else _sha256(content.encode("utf-8"))
                unchanged = new_path == row.path and new_sha == row.sha
                if (
                    precondition_sha256 is not None
                    and precondition_sha256 != row.sha
                    and not unchanged
                ):
                    # A failed precondition whose requested state already holds is a success.
                    raise ContentPreconditionFailed(
                        f"memory {memory_id} has content_sha256 {row.sha}, not"
                        f" {precondition_sha256}; re-read it and retry"
                    )
                if unchanged:
                    current = self._head_content(txn.dir, row) if full else None
                    return self._memory_view(store_id, row, current)
                if new_path != row.path:
                    self._check_free(conn, new_path, row.id)
                last_id, last_us = get_state(conn)
            if content is None:
                content = self._head_content(txn.dir, row)
            version = self._next_version(last_id, last_us)
            record = self._version_record_for(
                store_id,
                version,
                row.id,
                "modified",
                new_path,
                content,
                actor,
                memory_created_at=row.created_at,
                path_since=version[0] if new_path != row.path else row.path_since,
                previous=row.head,
            )
            self._commit(txn, record, row.path)
        return self._memory_from_record(record, full)

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
        if expected_sha256 is not None:
            expected_sha256 = rules.validate_sha256(expected_sha256, "expected_content_sha256")
        with self._txn(scope, store_id) as txn:
            self._check_writable(txn.dir)
            with self._index(txn.dir).read() as conn:
                row = _live_memory(conn, memory_id)
                last_id, last_us = get_state(conn)
            if expected_sha256 is not None and expected_sha256 != row.sha:
                raise ContentPreconditionFailed(
                    f"memory {memory_id} has content_sha256 {row.sha}, not {expected_sha256};"
                    " nothing was deleted"
                )
            record = self._version_record_for(
                store_id,
                self._next_version(last_id, last_us),
                row.id,
                "deleted",
                row.path,
                None,
                actor,
                memory_created_at=row.created_at,
                path_since=row.path_since,
                previous=row.head,
            )
            self._commit(txn, record, row.path)
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
        limit = min(_check_limit(limit), FULL_VIEW_LIMIT) if full else _check_limit(limit)
        fp = _fingerprint("memories", store_id, prefix, depth)
        body = decode_cursor(page, fp) if page is not None else None
        if body is not None and not (
            isinstance(body.get("k"), str) and isinstance(body.get("a"), str)
        ):
            raise InvalidName("page", page, "is not a valid page cursor")
        high = prefix[:-1] + "0"  # '0' follows '/': every path below the prefix sorts before

        def read(store_dir: Path) -> Page:
            with self._index(store_dir).read() as conn:
                if body is None:
                    as_of, low = get_state(conn)[0], prefix
                else:
                    as_of, key = body["a"], body["k"]
                    low = key[:-1] + "0" if key.endswith("/") else key + "\x00"
                items: list[MemoryRow | MemoryPrefix] = []
                sql = (
                    f"SELECT {MEMORY_COLUMNS} FROM memories WHERE path >= ? AND path < ?"
                    " AND path_since <= ? ORDER BY path LIMIT ?"
                )
                if depth == 0:
                    rows = conn.execute(sql, (low, high, as_of, limit + 1)).fetchall()
                    items.extend(MemoryRow(*r) for r in rows)
                else:
                    while len(items) <= limit:
                        r = conn.execute(sql, (low, high, as_of, 1)).fetchone()
                        if r is None:
                            break
                        row = MemoryRow(*r)
                        rest = row.path[len(prefix) :]
                        if "/" in rest:
                            child = prefix + rest.split("/", 1)[0] + "/"
                            items.append(MemoryPrefix(child))
                            low = child[:-1] + "0"
                        else:
                            items.append(row)
                            low = row.path + "\x00"
            next_page = None
            if len(items) > limit:
                items = items[:limit]
                last = items[-1]
                next_page = encode_cursor({"q": fp, "a": as_of, "k": last.path})
            data = tuple(
                item
                if isinstance(item, MemoryPrefix)
                else self._memory_view(
                    store_id, item, self._head_content(store_dir, item) if full else None
                )
                for item in items
            )
            return Page(data, next_page)

        return self._read(scope, store_id, read)

    # -- versions ----------------------------------------------------------------------
    def _version_from_record(self, record: dict[str, Any], full: bool) -> MemoryVersion:
        return MemoryVersion(
            id=record["id"],
            memory_store_id=record["memory_store_id"],
            memory_id=record["memory_id"],
            operation=record["operation"],
            path=record.get("path"),
            content=record.get("content") if full else None,
            content_size_bytes=record.get("content_size_bytes"),
            content_sha256=record.get("content_sha256"),
            created_by=record.get("created_by"),
            created_at=record["created_at"],
            redacted_at=record.get("redacted_at"),
            redacted_by=record.get("redacted_by"),
        )

    def _version_from_row(self, store_id: str, row: VersionRow) -> MemoryVersion:
        return MemoryVersion(
            id=row.id,
            memory_store_id=store_id,
            memory_id=row.memory_id,
            operation=row.operation,
            path=row.path,
            content=None,
            content_size_bytes=row.size,
            content_sha256=row.sha,
            created_by=None if row.created_by is None else json.loads(row.created_by),
            created_at=row.created_at,
            redacted_at=row.redacted_at,
            redacted_by=None if row.redacted_by is None else json.loads(row.redacted_by),
        )

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
        limit = min(_check_limit(limit), FULL_VIEW_LIMIT) if full else _check_limit(limit)
        where: list[str] = ["1 = 1"]
        args: list[object] = []
        if filters.memory_id is not None:
            where.append("memory_id = ?")
            args.append(filters.memory_id)
        if filters.operation is not None:
            where.append("operation = ?")
            args.append(filters.operation)
        for kind, value in (
            ("api_actor", filters.api_key_id),
            ("session_actor", filters.session_id),
            ("service_account_actor", filters.service_account_id),
        ):
            if value is not None:
                where.append("actor_type = ? AND actor_id = ?")
                args.extend([kind, value])
        if filters.created_gte_us is not None:
            where.append("created_us >= ?")
            args.append(filters.created_gte_us)
        if filters.created_lte_us is not None:
            where.append("created_us <= ?")
            args.append(filters.created_lte_us)
        fp = _fingerprint("versions", store_id, where, args)
        if page is not None:
            body = decode_cursor(page, fp)
            if not rules.is_version_id(body.get("k")):
                raise InvalidName("page", page, "is not a valid page cursor")
            where.append("id < ?")
            args.append(body["k"])
        sql = (
            f"SELECT {VERSION_COLUMNS} FROM versions WHERE {' AND '.join(where)}"
            " ORDER BY id DESC LIMIT ?"
        )

        def read(store_dir: Path) -> Page:
            with self._index(store_dir).read() as conn:
                rows = [VersionRow(*r) for r in conn.execute(sql, (*args, limit + 1)).fetchall()]
            next_page = None
            if len(rows) > limit:
                rows = rows[:limit]
                next_page = encode_cursor({"q": fp, "k": rows[-1].id})
            data = []
            for row in rows:
                if full:
                    record = self._version_record(store_dir, row.id)
                    if record is None:
                        continue  # removed by retention since the index was read
                    data.append(self._version_from_record(record, True))
                else:
                    data.append(self._version_from_row(store_id, row))
            return Page(tuple(data), next_page)

        return self._read(scope, store_id, read)

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion:
        """Read one version (a redacted one too: its content fields are null)."""

        def read(store_dir: Path) -> MemoryVersion:
            record = self._version_record(store_dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            return self._version_from_record(record, full)

        return self._read(scope, store_id, read)

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion:
        """Clear a version's content, hash, size and path; the head of a live memory refuses."""
        with self._txn(scope, store_id) as txn:
            record = self._version_record(txn.dir, version_id)
            if record is None:
                raise NotFound(f"memory version {version_id} not found")
            if record.get("redacted_at"):
                return self._version_from_record(record, True)
            with self._index(txn.dir).read() as conn:
                live = fetch_memory(conn, "id = ?", (record["memory_id"],))
                last_us = get_state(conn)[1]
            if live is not None and live.head == version_id:
                raise HeadVersion(
                    f"version {version_id} is the head of live memory {live.id}: write a new"
                    " version (or delete the memory) first, then redact this one"
                )
            redacted = dict(
                record,
                path=None,
                content=None,
                content_sha256=None,
                content_size_bytes=None,
                redacted_at=iso_us(max(self.now_us(), last_us)),
                redacted_by=actor,
            )
            txn.begin()
            write_atomic(txn.dir / VERSIONS_DIR / f"{version_id}.json", dumps(redacted))
            with self._index(txn.dir).write(create=True) as wconn:
                StoreIndex.put_version(wconn, redacted)
        return self._version_from_record(redacted, True)

    # -- derived files -----------------------------------------------------------------
    def _load_records(
        self, store_dir: Path, problems: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Every version record of a store, without its content (read on demand)."""
        records = []
        directory = store_dir / VERSIONS_DIR
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            stem = entry.name.removesuffix(".json")
            try:
                record = read_json(directory / entry.name)
                if not isinstance(record, dict) or record.get("id") != stem:
                    raise Corrupt(f"{directory / entry.name}: not a version record")
                record["_has_content"] = isinstance(record.get("content"), str)
                record.pop("content", None)
                version_row_check(record)
            except (Corrupt, KeyError, TypeError, ValueError) as exc:
                if problems is not None:
                    problems.append(f"{directory / entry.name}: unreadable version ({exc})")
                continue
            records.append(record)
        return records

    def _expected_tree(self, store_dir: Path, content: IndexContent) -> dict[str, bytes]:
        tree = {}
        for row in content.memories:
            record = self._version_record(store_dir, row.head) or {}
            tree[row.path] = str(record.get("content") or "").encode("utf-8")
        return tree

    def _sync_tree(self, store_dir: Path, expected: dict[str, bytes], apply: bool) -> list[str]:
        """Compare (and with ``apply`` fix) the live files against ``expected``."""
        memories = store_dir / MEMORIES_DIR
        diffs = []
        if not memories.is_dir():
            diffs.append(f"{memories}: missing")
            if apply:
                make_dirs(memories, store_dir)
        seen = set()
        for dirpath, dirnames, filenames in os.walk(memories, topdown=False):
            base = Path(dirpath)
            for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
                path = base / name
                rel = "/" + path.relative_to(memories).as_posix()
                if rel in expected and not path.is_symlink():
                    seen.add(rel)
                    if path.read_bytes() != expected[rel]:
                        diffs.append(f"{path}: content differs from its head version")
                        if apply:
                            write_atomic(path, expected[rel])
                    continue
                diffs.append(f"{path}: not a live memory")
                if apply:
                    remove_quietly(path)
            if base != memories and apply:
                with contextlib.suppress(OSError):
                    os.rmdir(base)  # only succeeds when it is (now) empty
        for rel, data in expected.items():
            if rel in seen:
                continue
            target = self._live_path(memories, rel)
            diffs.append(f"{target}: live file missing")
            if apply:
                for parent in [target.parent, *target.parent.parents]:
                    if parent == memories:
                        break
                    if parent.exists() and not parent.is_dir():
                        remove_quietly(parent)
                make_dirs(target.parent, memories)
                write_atomic(target, data)
        return diffs

    def _rebuild(self, store_dir: Path) -> IndexContent:
        """Make the index and the live tree equal a rebuild from the version records."""
        content = rows_from_records(self._load_records(store_dir))
        with self._index(store_dir).write(create=True) as conn:
            StoreIndex.replace_all(conn, content)
        self._sync_tree(store_dir, self._expected_tree(store_dir, content), apply=True)
        return content

    # -- operations --------------------------------------------------------------------
    def _all_stores(self) -> Iterator[tuple[Scope, str]]:
        for tenant in _subdirs(self.root):
            for project in _subdirs(self.root / tenant):
                try:
                    validate_id("tenant", tenant)
                    validate_id("project", project)
                except InvalidName:
                    continue
                scope = Scope(tenant, project)
                for name in _subdirs(self.stores_dir(scope)):
                    if name.startswith("."):
                        continue
                    store_id = name[-35:]
                    if rules.is_store_id(store_id):
                        yield scope, store_id

    def sweep_versions(self, *, now: datetime, dry_run: bool = False) -> dict[str, int]:
        """Remove versions older than the retention, except the recent ones of live memories.

        Every live memory keeps its ``keep_recent_versions`` newest versions (the head among
        them) whatever their age; versions of deleted memories go once they are old.
        """
        cutoff = to_us(now - self.version_retention)
        totals = {"stores_scanned": 0, "versions_removed": 0, "bytes_removed": 0}
        for scope, store_id in list(self._all_stores()):
            try:
                with self._txn(scope, store_id) as txn:
                    totals["stores_scanned"] += 1
                    with self._index(txn.dir).read() as conn:
                        live = {r[0] for r in conn.execute("SELECT id FROM memories")}
                        rows = conn.execute(
                            "SELECT id, memory_id, created_us FROM versions ORDER BY id DESC"
                        ).fetchall()
                    kept: dict[str, int] = {}
                    doomed = []
                    for version_id, memory_id, created_us in rows:
                        if memory_id in live and kept.get(memory_id, 0) < self.keep_recent_versions:
                            kept[memory_id] = kept.get(memory_id, 0) + 1
                            continue
                        if created_us < cutoff:
                            doomed.append(version_id)
                    if not doomed:
                        continue
                    directory = txn.dir / VERSIONS_DIR
                    for version_id in doomed:
                        with contextlib.suppress(FileNotFoundError):
                            totals["bytes_removed"] += (
                                (directory / f"{version_id}.json").stat().st_size
                            )
                    totals["versions_removed"] += len(doomed)
                    if dry_run:
                        continue
                    txn.begin()
                    for version_id in doomed:
                        remove_quietly(directory / f"{version_id}.json")
                    fsync_dir(directory)
                    with self._index(txn.dir).write() as wconn:
                        wconn.executemany(
                            "DELETE FROM versions WHERE id = ?", [(v,) for v in doomed]
                        )
            except NotFound:
                continue  # deleted while we swept
        return totals

    def fsck(self, report: FsckReport, *, repair: bool = False) -> None:
        """Check every store's derived files against a rebuild from its records."""
        self._fsck_temp_dirs(report, repair)
        for scope, store_id in list(self._all_stores()):
            try:
                if repair:
                    with self._txn(scope, store_id) as txn:
                        self._fsck_store(report, scope, txn.dir, repair=True, txn=txn)
                else:
                    store_dir = self._find(scope, store_id)
                    if store_dir is not None:
                        self._fsck_store(report, scope, store_dir, repair=False, txn=None)
            except NotFound:
                continue

    def _fsck_temp_dirs(self, report: FsckReport, repair: bool) -> None:
        for tenant in _subdirs(self.root):
            for project in _subdirs(self.root / tenant):
                parent = self.root / tenant / project / STORES_DIR
                for name in _subdirs(parent):
                    path = parent / name
                    if not name.startswith(TMP_PREFIX):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if time.time() - path.stat().st_mtime < STALE_TEMP_SECONDS:
                            continue  # a store creation may be in flight
                        problem = f"{path}: abandoned store creation"
                        report.problems.append(problem)
                        if repair:
                            shutil.rmtree(path, ignore_errors=True)
                            report.repaired.append(problem)

    def _fsck_store(
        self,
        report: FsckReport,
        scope: Scope,
        store_dir: Path,
        *,
        repair: bool,
        txn: _Txn | None,
    ) -> None:
        problems: list[str] = []
        try:
            store = self._store_record(store_dir)
            rules.validate_name(store["name"])
        except (Corrupt, FileNotFoundError, KeyError, InvalidName) as exc:
            problem = f"{store_dir}: store record unreadable ({exc})"
            report.problems.append(problem)
            report.unrepairable.append(problem)
            return
        unreadable: list[str] = []
        records = self._load_records(store_dir, unreadable)
        for item in unreadable:
            report.problems.append(item)
            report.unrepairable.append(item)
        expected = rows_from_records(records)
        try:
            with self._index(store_dir).read() as conn:
                actual: IndexContent | None = dump(conn)
        except sqlite3.Error as exc:
            problems.append(f"{store_dir / INDEX_FILE}: unreadable ({exc})")
            actual = None
        if actual is not None:
            if actual.memories != expected.memories:
                problems.append(f"{store_dir / INDEX_FILE}: memories differ from a rebuild")
            if actual.versions != expected.versions:
                problems.append(f"{store_dir / INDEX_FILE}: versions differ from a rebuild")
            if actual.last_id < expected.last_id or actual.last_us < expected.last_us:
                problems.append(f"{store_dir / INDEX_FILE}: last version behind the records")
        # A fork cannot be rebuilt away: report it for a person to look at.
        forks = self._chain_problems(records)
        report.problems.extend(forks)
        report.unrepairable.extend(forks)
        problems.extend(self._sync_tree(store_dir, self._expected_tree(store_dir, expected), False))
        for name in _subdirs(store_dir / VERSIONS_DIR, files=True):
            if name.startswith(TMP_PREFIX):
                problems.append(f"{store_dir / VERSIONS_DIR / name}: leftover temp file")
        wanted = rules.store_dirname(store["name"], store["id"])
        if store_dir.name != wanted:
            problems.append(f"{store_dir}: directory name does not match the slug ({wanted})")
        report.problems.extend(problems)
        if not repair or not problems:
            return
        for name in _subdirs(store_dir / VERSIONS_DIR, files=True):
            if name.startswith(TMP_PREFIX):
                remove_quietly(store_dir / VERSIONS_DIR / name)
        self._rebuild(store_dir)
        if store_dir.name != wanted:
            os.rename(store_dir, store_dir.parent / wanted)
            fsync_dir(store_dir.parent)
        # The same strings as the problems: the CLI matches them to say what was repaired.
        report.repaired.extend(problems)

    def _chain_problems(self, records: list[dict[str, Any]]) -> list[str]:
        """Each version names the memory's previous one: a fork or a gap shows here."""
        problems = []
        by_memory: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            by_memory.setdefault(record["memory_id"], []).append(record)
        for memory_id, chain in by_memory.items():
            chain.sort(key=lambda r: r["id"])
            present = {r["id"] for r in chain}
            pointed: set[str] = set()
            for before, after in zip(chain, chain[1:], strict=False):
                previous = after.get("previous_version_id")
                if previous in present and previous != before["id"]:
                    problems.append(f"memory {memory_id}: version {after['id']} forks the chain")
                if previous in pointed:
                    problems.append(f"memory {memory_id}: two versions follow {previous}")
                if previous is not None:
                    pointed.add(previous)
        return problems


def version_row_check(record: dict[str, Any]) -> None:
    """Raise if ``record`` lacks a field the index needs."""
    for key in ("id", "memory_id", "operation", "created_at", "created_us"):
        if key not in record:
            raise KeyError(key)
    if record["operation"] not in OPERATIONS:
        raise ValueError(f"unknown operation {record['operation']!r}")
    if record["operation"] != "deleted" and record.get("redacted_at") is None:
        for key in ("path", "content_sha256", "content_size_bytes", "memory_created_at"):
            if record.get(key) is None:
                raise KeyError(key)


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidName("limit", limit, f"must be an integer between 1 and {MAX_LIMIT}")
    return limit


def _subdirs(path: Path, *, files: bool = False) -> list[str]:
    try:
        return sorted(
            e.name
            for e in os.scandir(path)
            if (e.is_file(follow_symlinks=False) if files else e.is_dir(follow_symlinks=False))
        )
    except (FileNotFoundError, NotADirectoryError):
        return []
