"""The tree's task engine (app/storage/interface.py TaskBackend): its reads, and the derived
files every write leaves (``write_derived``). Each write path has a module of its own: a
turn's write in turns.py, artifacts in artifacts.py, deletes and the purge after them in
removal.py, the rebuild from the records in repair.py, the digest in digest.py.

Every task mutation is a transaction on the task (tree/fs/txn.py):

1. take the task's lock and record the write as in flight;
2. write the records (``task.json``, the turn's ``meta.json``: the commit point);
3. write the derived files (``summary.md``, ``index.json``, the listing row);
4. clear the in-flight record and release the lock.

A writer killed between 1 and 4 leaves its write in flight; the next holder of the lock sees
it and rebuilds the task's derived files from the records before doing anything else, so a
crash never leaves a stale index behind for long. Readers take no lock: every file they read
was published by an atomic rename, so it is the old version or the new one.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, BinaryIO

from ulid import ULID

from app.storage.core import digest as digest_mod, ledger as lg, task_list, task_rules
from app.storage.core.background import Later
from app.storage.core.clock import Clock, parse_iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.digest import Section
from app.storage.core.errors import Corrupt, NotFound
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    TaskFilter,
    TaskIndex,
    TaskPage,
    TaskSummary,
    TurnRecord,
)
from app.storage.core.names import (
    TASK_INDEX,
    TASK_LOCKS,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
    validate_id,
)
from app.storage.core.records import turn_from_json, turn_usage
from app.storage.core.task_list import TaskOrder
from app.storage.core.task_rules import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    next_updated_us,
)
from app.storage.core.usage import NO_TICKET, Ticket, TurnUsage
from app.storage.tree import repair, turns
from app.storage.tree.artifacts import TaskArtifacts
from app.storage.tree.control import load_key
from app.storage.tree.digest import Digests
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.sync import (
    batched_dir_syncs,
    fsync_dir,
)
from app.storage.tree.fs.txn import Key, Transactions, Txn
from app.storage.tree.listing_fill import open_ledger, open_listing
from app.storage.tree.records import (
    index_from_json,
    index_with_turn,
    parse_json_fd,
    read_json,
    read_task_record,
    rebuild_index,
    turn_row,
    write_json,
)
from app.storage.tree.removal import TaskRemovals
from app.storage.tree.sqlite.db import check_write_room
from app.storage.tree.sqlite.ledger import Ledger
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.turn_search import turn_text
from app.storage.tree.usage import TreeUsage

log = logging.getLogger("app.storage")


class TaskStore:
    """Durable per-task turn history of every tenant/project under one storage root."""

    def __init__(
        self,
        root: Path,
        *,
        retention: timedelta = timedelta(days=30),
        lock_timeout: float = 10.0,
        clock: Clock = system_clock,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        group_commit: bool = True,
        usage: TreeUsage | None = None,
    ) -> None:
        self.layout = Layout(root)
        # Counters, quotas and the free-space floor (tree/usage.py).
        self.usage = usage or TreeUsage(self.layout, lock_timeout=lock_timeout, clock=clock)
        self.retention = retention
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.max_artifact_bytes = max_artifact_bytes
        self.retention_us = retention // timedelta(microseconds=1)
        self.cursors = CursorCodec(load_key(self.layout))
        self.txns = Transactions(
            self.layout,
            TASK_LOCKS,
            timeout=lock_timeout,
            repair=self._repair_key,
            group_commit=group_commit,
        )
        self.later = Later()
        # Called after a write changed a project's search text: the embedding queue's
        # drain (tree/embedding.py), when an embedder is configured.
        self.text_written: Callable[[Scope], object] | None = None
        self.artifacts = TaskArtifacts(self)
        self.removals = TaskRemovals(self)
        self.digests = Digests(self)

    # -- helpers -----------------------------------------------------------------------------
    def now_us(self) -> int:
        return to_us(self.clock())

    def listing(self, scope: Scope, *, below: Path | None = None) -> Listing:
        """The project's listing (rebuilt from the records if it is of another schema
        version); ``below``: the project dir, when the caller just checked it."""
        return open_listing(
            self.layout, scope, timeout=self.lock_timeout, clock=self.clock, below=below
        )

    def ledger(self, scope: Scope, *, below: Path | None = None) -> Ledger:
        """The project's ledger (made from the records when it is new or of another schema
        version); ``below``: the project dir, when the caller just checked it."""
        return open_ledger(self.layout, scope, timeout=self.lock_timeout, below=below)

    def ledger_task(
        self,
        scope: Scope,
        task_id: str,
        entries: list[LedgerTurn],
        *,
        below: Path | None = None,
        only_if_made: bool = False,
    ) -> None:
        """Make the task's ledger entries ``entries`` (its records' entry_of), under the
        task's lock; ``only_if_made``: not when the project has no ledger yet (a removal:
        the one its first open makes holds nothing of the task). A damaged ledger is left
        for fsck --repair (logged): the records and the other derived files are written."""
        if only_if_made and self.layout.tree.lstat(self.layout.ledger(scope)) is None:
            return
        try:
            self.ledger(scope, below=below).set_task(task_id, entries)
        except Corrupt as exc:
            log.warning("%s/%s: ledger not written (%s)", scope.tenant, scope.project, exc)

    @contextlib.contextmanager
    def transaction(self, scope: Scope, task_id: str) -> Iterator[Txn]:
        """Hold the task's lock for one mutation (tree/fs/txn.py)."""
        # Directory fsyncs once per directory at the end, still before the lock is released.
        with self.txns(Key(scope, validate_id("task_id", task_id))) as txn, batched_dir_syncs():
            yield txn

    def _repair_key(self, key: Key) -> None:
        self.repair_task(key.scope, key.id)

    def alive(self, record: TurnRecord | None, now_us: int) -> TurnRecord | None:
        if record is None or parse_iso_us(record.retain_until) <= now_us:
            return None
        return record

    def task_dir_checked(self, scope: Scope, task_id: str) -> Path:
        """The task's directory, refused (UnsafePath) when a link is on the way."""
        return self.layout.check_inside(self.layout.task_dir(scope, task_id))

    def next_updated_us(self, index: dict[str, Any] | None, now_us: int) -> int:
        """The next write's ``updated_us`` after the task's ``index`` (core/task_rules.py)."""
        return next_updated_us(index["updated_us"] if index else 0, now_us)

    def write_derived(
        self,
        scope: Scope,
        task_id: str,
        task_dir: Path,
        record: TurnRecord,
        index: dict[str, Any] | None,
        *,
        summary: bool,
        ticket: Ticket = NO_TICKET,
        usage: TurnUsage | None = None,
    ) -> None:
        """Write the derived files after ``record`` committed; ``index`` is the task's index.json
        as read earlier under the same lock (the record write does not change it). The listing
        row counts what the turn stores (``usage``, when the caller has it already) and drops
        ``ticket``'s reservation, in one transaction."""
        turn_dir = task_dir / turn_dirname(record.turn)
        # Not fsynced (atomic_file's durable=False): the record they derive from already is.
        if summary:
            write_atomic(turn_dir / TURN_SUMMARY, record.summary_md.encode("utf-8"), durable=False)
        index_path = task_dir / TASK_INDEX
        task_record = read_task_record(task_dir) if index is None else None
        index = index_with_turn(index, task_id, task_record, record)
        write_json(index_path, index, durable=False)
        row = turn_row(record, index.get("owner"))
        # An artifact upload (summary=False) leaves meta and summary, the searched text, alone.
        text = turn_text(record) if summary else None
        # None: only a clock that jumped past the new turn's retention (it leaves the digest).
        section = self.section(scope, task_id, index, self.now_us(), (record,))
        listing = self.listing(scope, below=task_dir.parent)
        if usage is None:
            usage = turn_usage(record)
        owed = listing.put_turn(task_id, row, section, text, usage, release=ticket.id)
        ticket.settled()
        if summary:
            # An artifact's write changes nothing the ledger reads (meta, created_at).
            try:
                self.ledger(scope, below=task_dir.parent).put_turn(
                    task_id, record.turn, entry_of(record)
                )
            except Corrupt as exc:  # the records and the other files are written: fsck
                log.warning("%s/%s: ledger not written (%s)", scope.tenant, scope.project, exc)
        if owed.due:
            # A purge a reader's snapshot stopped (this write is the next chance), an index
            # this write found damaged, a rebuild or compaction to finish.
            self.removals.purge_later(scope)
        if summary and self.text_written is not None:
            self.text_written(scope)

    def section(
        self,
        scope: Scope,
        task_id: str,
        index: dict[str, Any],
        now_us: int,
        known: tuple[TurnRecord, ...] = (),
    ) -> Section | None:
        """The task's digest section: its highest live turn per ``index`` (index.json), read
        from the records unless it is one of ``known``."""
        by_turn = {r.turn: r for r in known}

        def record_of(turn: int) -> TurnRecord | None:
            return by_turn.get(turn) or self.digests.record(scope, task_id, turn, now_us)

        return digest_mod.live_section(task_id, index, now_us, record_of)

    # -- turns -------------------------------------------------------------------------------
    # The write of a turn, with its artifacts, is tree/turns.py's.
    put_turn = turns.put_turn

    def get_turn(self, scope: Scope, task_id: str, turn: int) -> TurnRecord:
        """Read one live turn."""
        # One open that refuses a symlink anywhere on the way (Layout.open_read).
        meta = self.layout.turn_meta_text(scope, task_id, turn)
        fd = self.layout.open_read(meta)
        obj = None if fd is None else parse_json_fd(fd, meta)
        record = self.alive(None if obj is None else turn_from_json(obj, meta), self.now_us())
        if record is None:
            raise NotFound(f"turn {turn} of task {task_id} not found")
        return record

    # -- tasks -------------------------------------------------------------------------------
    def get_task(self, scope: Scope, task_id: str) -> TaskIndex:
        """Read a task's index with only its live turns."""
        index = self.live_index(self.task_dir_checked(scope, task_id), task_id)
        if index is None:
            raise NotFound(f"task {task_id} not found")
        return index

    def live_index(self, task_dir: Path, task_id: str) -> TaskIndex | None:
        """The task's index with its live turns (None: none). An index.json removed, torn
        or edited out of shape is derived, so it is answered from the records; a write or
        fsck --repair writes it back."""
        path = self.layout.check_inside(task_dir / TASK_INDEX)
        try:
            obj = read_json(path)
            if obj is not None:
                return index_from_json(obj, path, self.now_us())
        except Corrupt:
            pass
        obj = rebuild_index(self.layout.tree, task_dir, task_id)
        return None if obj is None else index_from_json(obj, path, self.now_us())

    # -- the ledger (core/ledger.py) -----------------------------------------------------------
    def read_ledger(
        self, scope: Scope, query: lg.LedgerQuery, prices: lg.PriceTable
    ) -> lg.LedgerPage:
        """The project's ledger: totals and a page of rows summed from its rollups."""
        issued = lg.ledger_issued_for(query)
        after = lg.decode_cursor(self.cursors, scope, "ledger", issued, query.cursor)
        if lg.by_owner(query):
            return self._ledger_by_owner(scope, query, prices, issued, after)
        totals, rows = lg.ledger_sql(query, prices, after, mark=_mark)
        found_totals: Sequence[Any] | None = None
        found_rows: list[tuple[Any, ...]] = []
        if self.listing(scope).exists():  # else nothing was ever written to the project
            with self.ledger(scope).read() as conn:  # one snapshot
                if rows.text:
                    found_rows = conn.execute(rows.text, rows.params).fetchall()
                if lg.needs_totals(query, found_rows):
                    found_totals = conn.execute(totals.text, totals.params).fetchone()
        return lg.ledger_page(
            query,
            found_totals,
            found_rows,
            lambda key: lg.encode_cursor(self.cursors, scope, "ledger", issued, key),
        )

    def _ledger_by_owner(
        self,
        scope: Scope,
        query: lg.LedgerQuery,
        prices: lg.PriceTable,
        issued: list[Any],
        after: Sequence[Any] | None,
    ) -> lg.LedgerPage:
        """A grouping by owner: the rows by task, then each task's owner from the listing
        (core/ledger.py owner_page)."""
        by_task = lg.by_task_for_owners(query)
        _, rows = lg.ledger_sql(by_task, prices, None, mark=_mark)
        found: list[tuple[Any, ...]] = []
        owners: dict[str, str | None] = {}
        if self.listing(scope).exists():
            with self.ledger(scope).read() as conn:
                found = conn.execute(rows.text, rows.params).fetchall()
            at = by_task.group_by.index("task")
            tasks = json.dumps(sorted({row[at] for row in found}))
            with self.listing(scope).read() as conn:
                owners = dict(
                    conn.execute(
                        "SELECT task_id, owner FROM tasks"
                        " WHERE task_id IN (SELECT value FROM json_each(?))",
                        (tasks,),
                    ).fetchall()
                )
        return lg.owner_page(
            query,
            found,
            owners,
            after,
            lambda key: lg.encode_cursor(self.cursors, scope, "ledger", issued, key),
        )

    def read_timeline(
        self, scope: Scope, query: lg.TimelineQuery, prices: lg.PriceTable
    ) -> lg.TimelinePage:
        """A page of the project's turns across tasks, newest first."""
        issued = query.filters.selecting()
        after = lg.decode_cursor(self.cursors, scope, "timeline", issued, query.cursor)
        rows: list[tuple[Any, ...]] = []
        if self.listing(scope).exists():
            rows = self.ledger(scope).query(lg.timeline_sql(query, after, mark=_mark))
        return lg.timeline_page(
            query,
            rows,
            prices,
            lambda key: lg.encode_cursor(self.cursors, scope, "timeline", issued, key),
        )

    def list_tasks(
        self,
        scope: Scope,
        *,
        limit: int = 50,
        cursor: str | None = None,
        prefix: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        failed: bool = False,
        sort: str = "updated",
        descending: bool = True,
        backward: bool = False,
    ) -> TaskPage:
        """A page of live tasks in an order of core/task_list.py (most recently updated
        first by default), with signed keyset cursors to the pages after and before it.

        Optional filters: task ids starting with ``prefix``, and the ``model`` / ``agent_id``
        (substrings) / non-zero exit code (``failed``) of the latest turn's meta. ``total``
        counts every live task of the project, ``matched`` those the filters let through.
        """
        task_rules.check_list(limit, prefix)
        order = TaskOrder(sort, descending)
        key = task_list.decode_cursor(self.cursors, scope, order, cursor) if cursor else None
        listing = self.listing(scope)
        if not listing.exists():
            return TaskPage((), 0, None)
        only = TaskFilter(prefix, model or None, agent_id or None, failed)
        rows, total, matched = listing.page(
            now_us=self.now_us(),
            limit=limit + 1,
            order=order,
            key=key,
            backward=backward and key is not None,
            only=only if only != TaskFilter() else None,
        )
        return task_list.task_page(
            rows,
            limit=limit,
            order=order,
            backward=backward and key is not None,
            from_cursor=key is not None,
            codec=self.cursors,
            scope=scope,
            total=total,
            matched=matched,
        )

    def task_summary(self, scope: Scope, task_id: str) -> TaskSummary:
        """A live task as the task list shows it (its listing row); NotFound otherwise."""
        validate_id("task_id", task_id)
        listing = self.listing(scope)
        row = listing.task_row(self.now_us(), task_id) if listing.exists() else None
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return task_list.summary(row)

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None:
        """Delete a task (app/storage/tree/removal.py)."""
        self.removals.delete_task(scope, task_id, only_owner=only_owner)

    def delete_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one live turn with its artifacts (app/storage/tree/removal.py)."""
        self.removals.delete_turn(scope, task_id, turn, only_owner=only_owner, if_match=if_match)

    def delete_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one artifact of a live turn (app/storage/tree/removal.py)."""
        self.removals.delete_artifact(
            scope, task_id, turn, name, only_owner=only_owner, if_match=if_match
        )

    def room_to_delete(self, scope: Scope) -> None:
        """Refuse now (InsufficientStorage, a 507) a delete in ``scope`` that the disk could
        not let finish: its commit point (the rename into the trash, or the turn's new
        ``meta.json``) comes before its listing write, which a disk of small blocks with
        little room refuses (sqlite/db.py, _SHM_ROOM). A refusal must change nothing. The
        trash directory is made here too, so that no full disk fails it after the commit."""
        listing = self.layout.listing(scope)
        if self.layout.tree.lstat(listing) is not None:
            check_write_room(str(listing))
        make_dirs(self.layout.check_inside(self.layout.trash_dir()), self.layout.root)

    def trash(self, directory: Path) -> Path:
        """Rename ``directory`` into the trash (atomic, same filesystem) and return its new path."""
        trash = self.layout.check_inside(self.layout.trash_dir())
        make_dirs(trash, self.layout.root)
        target = trash / f"{ULID()}-{directory.name}"
        self.layout.tree.rename(directory, target)
        fsync_dir(directory.parent)
        fsync_dir(trash)
        return target

    def owner_of(self, scope: Scope, task_id: str) -> str | None:
        """The token id that created the task (None when unknown or absent)."""
        record = read_task_record(self.task_dir_checked(scope, task_id))
        return None if record is None else record.get("owner")

    # -- artifacts (tree/artifacts.py) ------------------------------------------
    def put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        *,
        content_type: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        size: int | None = None,
    ) -> ArtifactInfo:
        """Stream an artifact to disk (fsynced before any lock), then publish it under the lock."""
        return self.artifacts.put_artifact(
            scope,
            task_id,
            turn,
            name,
            stream,
            content_type=content_type,
            if_match=if_match,
            if_none_match=if_none_match,
            size=size,
        )

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream:
        """Open a live artifact for streaming; the caller closes ``file``."""
        return self.artifacts.open_artifact(scope, task_id, turn, name)

    # -- project digest (tree/sqlite/digestdb.py) ----------------------------------------------
    def open_digest(self, scope: Scope) -> tuple[BinaryIO, int]:
        """Open ``project.md``: the base file with what changed since spliced in."""
        return self.digests.open(scope)

    def open_digest_head(
        self, scope: Scope, *, limit: int | None = None, since_us: int | None = None
    ) -> tuple[BinaryIO, int | None]:
        """The title and the newest sections of ``project.md`` (Digests.open_head)."""
        return self.digests.open_head(scope, limit=limit, since_us=since_us)

    def compact_digest(self, scope: Scope, *, wait: bool = True) -> bool:
        """Bring ``_project.md`` up to date if anything changed; return whether it ran."""
        return self.digests.compact(scope, wait=wait)

    def rebuild_digest(self, scope: Scope) -> None:
        """Write ``_project.md`` again from the listing and the records."""
        self.digests.rebuild(scope)

    # -- repair: the rebuilds from the records are tree/repair.py's ------------------------
    repair_task = repair.repair_task
    heal_search = repair.heal_search
    rebuild_search = repair.rebuild_search


def _mark(name: str) -> str:
    """A named parameter as sqlite3 spells it."""
    return f":{name}"
