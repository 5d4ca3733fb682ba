"""Serve, compact and rebuild each project's ``_project.md`` (the design: digestdb.py)."""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from app.storage.core import digest as text
from app.storage.core.background import Later
from app.storage.core.clock import parse_iso_us
from app.storage.core.digest import Section
from app.storage.core.errors import Corrupt, LockTimeout, StorageError, Unreadable, UnsafePath
from app.storage.core.files import os_errors
from app.storage.core.models import TurnRecord
from app.storage.core.names import TURN_META, Scope
from app.storage.tree.fs.atomic import atomic_file
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.records import read_turn
from app.storage.tree.sqlite import digestdb
from app.storage.tree.sqlite.db import read_txn
from app.storage.tree.sqlite.digestdb import BaseMismatch, Spliced
from app.storage.tree.sqlite.listing import Listing


class ProjectListings(Protocol):
    """What the digests need of the task engine (TaskStore): each project's listing, the
    clock, the lock timeout and a thread for the compactions a read asks for."""

    layout: Layout
    lock_timeout: float
    later: Later

    def listing(self, scope: Scope, *, below: Path | None = None) -> Listing: ...

    def now_us(self) -> int: ...


log = logging.getLogger(__name__)

# A read that finds the base replaced under it tries again this many times (a compaction
# renames the new base a moment before it commits), then rebuilds it under the project lock.
_ATTEMPTS = 20


class Digests:
    """The digests of every project of one tree (TaskStore.open_digest and friends)."""

    def __init__(self, store: ProjectListings) -> None:
        self.store = store
        self.layout = store.layout
        # Bytes this process served spliced since each project's base (generation, bytes).
        self._copied: dict[Scope, tuple[int, int]] = {}

    # -- sections ------------------------------------------------------------------------------
    def record(self, scope: Scope, task_id: str, turn: int, now_us: int) -> TurnRecord | None:
        """A live turn's record (None: gone, unreadable, expired, or behind a planted link,
        which is never followed: fsck reports it)."""
        turn_dir = self.layout.turn_dir(scope, task_id, turn)
        try:
            self.layout.check_inside(turn_dir / TURN_META)
            record = read_turn(turn_dir)
        except (Corrupt, UnsafePath):
            return None
        if record is None or parse_iso_us(record.retain_until) <= now_us:
            return None
        return record

    def reader(self, scope: Scope, now_us: int) -> Callable[[str, int], Section | None]:
        """Read a task's section showing ``turn`` from its records (None: gone or expired)."""

        def read(task_id: str, turn: int) -> Section | None:
            record = self.record(scope, task_id, turn, now_us)
            if record is None:
                return None
            return text.section_of(task_id, record, parse_iso_us(record.retain_until))

        return read

    # -- reads ---------------------------------------------------------------------------------
    def open(self, scope: Scope) -> tuple[BinaryIO, int]:
        """``project.md`` as a file and its size; the caller closes it."""
        listing = self.store.listing(scope)
        if not listing.exists():
            data = text.title(scope) + text.EMPTY
            return io.BytesIO(data), len(data)
        compacted = False
        for attempt in range(_ATTEMPTS + 2):
            try:
                opened = self._open(scope, listing, may_compact=not compacted)
            except BaseMismatch:
                self._after_mismatch(scope, attempt)
                continue
            if opened is not None:
                return opened
            compacted = True
        raise LockTimeout("project.md is being rebuilt; retry shortly")

    def open_head(
        self, scope: Scope, *, limit: int | None, since_us: int | None
    ) -> tuple[BinaryIO, int]:
        """The title and the newest sections of ``project.md`` (``limit`` at most, of tasks
        updated at ``since_us`` or later) and their size, from one snapshot, as ``open``
        serves them: the same bytes as the start of the whole digest. It costs what it
        returns (digestdb.head), and never compacts."""
        listing = self.store.listing(scope)
        if not listing.exists():
            data = text.title(scope) + text.EMPTY
            return io.BytesIO(data), len(data)
        for attempt in range(_ATTEMPTS + 2):
            now_us = self.store.now_us()
            with listing.read() as conn:
                base = digestdb.base_of(conn)
                parts = None
                if digestdb.count_changed(conn, base) <= digestdb.HARD_LIMIT:
                    result = digestdb.plan(conn, now_us, self.reader(scope, now_us))
                    parts = digestdb.head(conn, result, limit=limit, since_us=since_us)
            if parts is None:  # more changed than a read holds in memory
                self.compact(scope, wait=True)
                continue
            try:
                fd = (
                    self._open_base(scope, base)
                    if any(isinstance(p, tuple) for p in parts)
                    else None
                )
            except BaseMismatch:
                self._after_mismatch(scope, attempt)
                continue
            spliced = Spliced(-1 if fd is None else fd, [text.title(scope), *parts])
            return spliced, spliced.size  # type: ignore[return-value]
        raise LockTimeout("project.md is being rebuilt; retry shortly")

    def _after_mismatch(self, scope: Scope, attempt: int) -> None:
        """A read found the base replaced under it (a compaction renames the new base a
        moment before it commits): wait a little and plan again; after _ATTEMPTS, rebuild."""
        if attempt < _ATTEMPTS:
            time.sleep(0.001 * (attempt + 1))
        elif attempt == _ATTEMPTS:
            self.rebuild(scope, only_if_broken=True)

    def view(self, scope: Scope) -> tuple[BinaryIO, int] | None:
        """What a read would serve, changing nothing (fsck): None when there is no listing or
        too much changed to splice; BaseMismatch when the base is not the recorded one."""
        listing = self.store.listing(scope)
        if not listing.exists():
            return None
        for attempt in range(_ATTEMPTS + 1):
            try:
                return self._open(scope, listing, may_compact=False, passive=True)
            except BaseMismatch:
                if attempt == _ATTEMPTS:
                    raise
                time.sleep(0.001 * (attempt + 1))
        return None

    def _open(
        self, scope: Scope, listing: Listing, *, may_compact: bool, passive: bool = False
    ) -> tuple[BinaryIO, int] | None:
        """Serve from one snapshot; None: a compaction ran first, plan again (or, passive:
        too much changed to splice)."""
        now_us = self.store.now_us()
        with listing.read() as conn:
            base = digestdb.base_of(conn)
            if digestdb.count_changed(conn, base) > digestdb.HARD_LIMIT:
                result = None  # more changed sections than a read holds in memory
            else:
                result = digestdb.plan(conn, now_us, self.reader(scope, now_us))
                (tasks,) = conn.execute(
                    "SELECT value FROM counters WHERE name = 'tasks'"
                ).fetchone()
        if result is None:
            if not passive and not self._try_compact(scope, wait=True):
                return self._rendered(scope, listing)
            return None
        many = max(result.changes, len(result.expired)) >= digestdb.COMPACT_AFTER
        copied = self._copied.get(scope, (base.gen, 0))
        copied = copied if copied[0] == base.gen else (base.gen, 0)
        if may_compact and (result.changes or many):
            if base.size <= digestdb.INLINE_BYTES:
                # A millisecond or two: the file a person reads stays current too.
                if self._try_compact(scope, wait=False):
                    return None
            elif (
                many
                or result.changes * digestdb.SPREAD >= tasks
                or copied[1] >= digestdb.COPIES * base.size
            ):
                self._compact_later(scope)
        fd = self._open_base(scope, base)
        if fd is not None and not result.pending:
            return os.fdopen(fd, "rb"), base.size  # the base as it is: sendfile
        spliced = Spliced(-1 if fd is None else fd, [text.title(scope), *digestdb.pieces(result)])
        # A spliced read is copied through the worker where the base goes by sendfile: once
        # the copies cost what a compaction does, compacting is the cheaper way on.
        self._copied[scope] = (base.gen, copied[1] + spliced.size)
        return spliced, spliced.size  # type: ignore[return-value]

    def _open_base(self, scope: Scope, base: digestdb.Base) -> int | None:
        if base.gen < 0:
            return None
        try:
            fd = self.layout.open_read(os.fspath(self.layout.digest(scope)))
        except Corrupt as exc:  # not a file: rebuilt, as a missing one is
            raise BaseMismatch(str(exc)) from None
        if fd is None:
            raise BaseMismatch("the digest base is missing")
        try:
            digestdb.check_base(fd, base)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _rendered(self, scope: Scope, listing: Listing) -> tuple[BinaryIO, int]:
        """The whole digest rendered from the listing and the records (more changed than a
        read holds in memory, and no compaction could run)."""
        now_us = self.store.now_us()
        out = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
        for chunk in text.render(
            scope,
            listing.digest_rows(now_us),
            lambda task_id, turn: self.record(scope, task_id, turn, now_us),
        ):
            out.write(chunk)
        size = out.tell()
        out.seek(0)
        return out, size

    # -- compaction ----------------------------------------------------------------------------
    def _try_compact(self, scope: Scope, *, wait: bool) -> bool:
        """Compact for a read; False when it did not run, or could not write (a full disk,
        a failing one): a read is served from what is stored whatever a write meets."""
        try:
            return self.compact(scope, wait=wait)
        except LockTimeout:
            if wait:
                raise
            return False
        except Unreadable:
            raise  # the read itself cannot be served: 503
        except (StorageError, OSError, sqlite3.Error) as exc:
            log.warning(
                "project.md of %s/%s not compacted (%s); served from the base and the changes",
                scope.tenant,
                scope.project,
                exc,
            )
            return False

    def compact(self, scope: Scope, *, wait: bool) -> bool:
        """Rewrite the base if anything changed since it; ``wait``: for the project lock
        (else give up at once when another compaction holds it). Return whether it ran."""
        lock = self.layout.check_inside(self.layout.project_lock(scope))
        try:
            with locked(lock, self.store.lock_timeout if wait else 0.0), os_errors():
                return self._compact(scope, force=False)
        except LockTimeout:
            if wait:
                raise
            return False

    def _compact_later(self, scope: Scope) -> None:
        self.store.later.run(
            ("digest", scope),
            lambda: self.compact(scope, wait=False),
            f"compacting project.md of {scope.tenant}/{scope.project}",
        )

    def _compact(self, scope: Scope, *, force: bool) -> bool:
        """The compaction itself; the caller holds the project lock."""
        listing = self.store.listing(scope)
        if not listing.exists():
            return False
        now_us = self.store.now_us()
        with listing.read() as conn:
            base = digestdb.base_of(conn)
            expired = digestdb.expired_sections(conn, now_us, self.reader(scope, now_us))
            if len(expired) < digestdb.COMPACT_AFTER:
                # Few: reads leave them out as they go, and a clock stepped back still
                # brings them back. Many (no sweeper, or one far behind): written down.
                expired = []
            idle = (
                not expired
                and not digestdb.count_changed(conn, base)
                and not conn.execute(
                    "SELECT 1 FROM digest_gone WHERE seq > ? LIMIT 1", (base.gen,)
                ).fetchone()
            )
        if idle and not force and base.gen >= 0:
            return False
        # A write transaction first: the new base's generation is then one no earlier base
        # (or dead compaction) used.
        with listing.write() as conn:
            digestdb.persist_expired(conn, expired)
        path = self.layout.check_inside(self.layout.digest(scope))
        reader = listing.connect()
        try:
            with read_txn(reader):
                base = digestdb.base_of(reader)
                (gen,) = reader.execute(
                    "SELECT value FROM counters WHERE name = 'generation'"
                ).fetchone()
                old = self._open_base(scope, base)
                try:
                    # fsynced: the base holds sections' only copy. Unnamed until complete: a
                    # kill halfway through a large project.md leaves nothing of it behind.
                    with atomic_file(path, unnamed=True) as out:
                        written = digestdb.write_base(
                            reader,
                            lambda rows: self._insert(listing, rows),
                            out,
                            old,
                            text.title(scope),
                            int(gen),
                            self.reader(scope, 0),  # expired or not: reads leave them out
                        )
                finally:
                    if old is not None:
                        os.close(old)
            with listing.write() as conn:
                digestdb.switch(conn, base, written)
        finally:
            reader.close()
        self._drop_stale(listing)
        return True

    @staticmethod
    def _insert(listing: Listing, rows: list[tuple[int, str, int, int, int]]) -> None:
        with listing.maintain() as conn:
            conn.executemany("INSERT OR REPLACE INTO digest_base VALUES (?, ?, ?, ?, ?)", rows)

    @staticmethod
    def _drop_stale(listing: Listing) -> None:
        with listing.read() as conn:
            stale = digestdb.stale_bases(conn)
        for gen in stale:
            while True:
                with listing.maintain() as conn:
                    if not digestdb.drop_base_rows(conn, gen):
                        break

    # -- repair --------------------------------------------------------------------------------
    def rebuild(self, scope: Scope, *, only_if_broken: bool = False) -> None:
        """Write the base again from the database and the records (fsck --repair, or a base
        that no longer matches its counters)."""
        listing = self.store.listing(scope)
        lock = self.layout.check_inside(self.layout.project_lock(scope))
        with locked(lock, self.store.lock_timeout), os_errors():
            if only_if_broken:
                with listing.read() as conn:
                    base = digestdb.base_of(conn)
                try:
                    fd = self._open_base(scope, base)
                except BaseMismatch:
                    pass
                else:
                    if fd is not None:
                        os.close(fd)
                    return  # fixed by a compaction meanwhile
            with listing.write() as conn:
                digestdb.reset(conn)
            self._compact(scope, force=True)
