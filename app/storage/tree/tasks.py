"""The tree's task engine: turns, task indexes, and the listing and digest rows they derive
(artifacts: artifacts.py; the digest itself: digest.py).

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
import itertools
import sqlite3
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, BinaryIO

from ulid import ULID

from app.storage.core import digest as digest_mod, task_list, task_rules
from app.storage.core.clock import Clock, iso_us, parse_iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.digest import Section
from app.storage.core.errors import Corrupt, LockTimeout, NotFound, NotOwner
from app.storage.core.files import os_errors
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    ArtifactUpload,
    StagedUpload,
    TaskFilter,
    TaskIndex,
    TaskPage,
    TaskSummary,
    TurnRecord,
)
from app.storage.core.names import (
    ARTIFACTS_DIR,
    TASK_INDEX,
    TASK_LOCKS,
    TASK_RECORD,
    TMP_PREFIX,
    TURN_META,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
    validate_id,
)
from app.storage.core.query import SearchBudget
from app.storage.core.records import turn_from_json, turn_to_json, turn_usage, usage_of_turn
from app.storage.core.task_list import TaskOrder
from app.storage.core.task_rules import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    NOT_OWNER,
    check_preconditions,
    next_updated_us,
    written_turn,
)
from app.storage.core.usage import NO_TICKET, Ticket, TurnUsage
from app.storage.tree.artifacts import TaskArtifacts, reconcile_artifacts
from app.storage.tree.background import Later
from app.storage.tree.control import load_key
from app.storage.tree.digest import Digests
from app.storage.tree.fs.atomic import StagedFile, make_dirs, remove_quietly, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.sync import (
    batched_dir_syncs,
    commit_point,
    fsync_dir,
    group_commit,
)
from app.storage.tree.fs.txn import Key, Transactions, Txn
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.listing_fill import open_listing
from app.storage.tree.records import (
    index_from_json,
    index_rows,
    index_with_turn,
    load_index,
    parse_json_fd,
    read_json,
    read_task_record,
    read_turn,
    rebuild_index,
    turn_dirs,
    turn_row,
    write_json,
)
from app.storage.tree.removal import TaskRemovals
from app.storage.tree.sqlite.db import check_write_room
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.turn_search import TurnText, turn_text
from app.storage.tree.usage import TreeUsage, settling


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

    def _task_dir_checked(self, scope: Scope, task_id: str) -> Path:
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
        listing.put_turn(task_id, row, section, text, usage, release=ticket.id)
        ticket.settled()
        if listing.search_upkeep().due:
            # A purge a reader's snapshot stopped (this write is the next chance), an index
            # this write found damaged, a rebuild or compaction to finish.
            self.removals.purge_later(scope)

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
        live = [t["turn"] for t in index["turns"] if parse_iso_us(t["retain_until"]) > now_us]
        if not live:
            return None
        top = max(live)
        record = next((r for r in known if r.turn == top), None)
        if record is None:
            record = self.digests.record(scope, task_id, top, now_us)
            if record is None:
                return None
        return digest_mod.section_of(task_id, record, parse_iso_us(record.retain_until))

    # -- turns -------------------------------------------------------------------------------
    def put_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        meta: dict[str, Any],
        summary_md: str,
        actor: str | None = None,
        if_match: str | None = None,
        if_none_match: bool = False,
        artifacts: Iterable[ArtifactUpload] = (),
        size: int | None = None,
    ) -> TurnRecord:
        """Create or replace one turn's meta and summary; keep created_at and artifacts.

        ``artifacts`` (app/storage/interface.py) are staged before the lock, published under
        it before ``meta.json`` (the commit) names them, as put_artifact does one."""
        task_rules.check_turn(task_id, turn, meta, summary_md)
        task_dir = self._task_dir_checked(scope, task_id)
        turn_dir = task_dir / turn_dirname(turn)
        expired_dir: Path | None = None
        with contextlib.ExitStack() as staging:
            uploads, ticket = self._stage_uploads(
                scope, task_id, turn, artifacts, size, if_match, if_none_match, staging
            )
            with (
                self.transaction(scope, task_id) as txn,
                os_errors(),
                contextlib.ExitStack() as stack,
            ):
                now_us = self.now_us()
                self.layout.check_inside(turn_dir / TURN_META, below=task_dir)
                previous = read_turn(turn_dir) if turn_dir.exists() else None
                alive = self.alive(previous, now_us)
                check_preconditions(alive.etag if alive else None, if_match, if_none_match)
                index = (
                    load_index(self.layout.tree, task_dir, task_id) if task_dir.exists() else None
                )
                updated_us = self.next_updated_us(index, now_us)
                # Written at one instant: in name order, as a listing of artifacts by time
                # and then name gives them.
                added = tuple(sorted((u.info(iso_us(updated_us)) for u in uploads), key=_name))
                names = {a.name for a in added}
                kept = alive.artifacts if alive else ()
                kept = tuple(a for a in kept if a.name not in names) + added
                stored = usage_of_turn(turn, meta, summary_md, kept)
                was = turn_usage(previous) if previous is not None else TurnUsage(turn, 0, 0, 0)
                ticket = self.usage.admit_write(
                    scope,
                    ticket,
                    # meta.json holds the summary and meta, summary.md the summary again, and
                    # index.json the meta of every turn: about three times the turn's bytes.
                    gross=3 * stored.turn_bytes + 8192,
                    add_bytes=stored.artifact_bytes
                    + stored.turn_bytes
                    - was.artifact_bytes
                    - was.turn_bytes,
                    add_tasks=int(index is None),
                )
                stack.enter_context(settling(ticket))
                txn.begin()
                new_task = not task_dir.exists()
                new_turn = previous is None and not turn_dir.exists()
                try:
                    if new_task or read_task_record(task_dir) is None:
                        make_dirs(task_dir, self.layout.root)
                        write_json(
                            task_dir / TASK_RECORD,
                            {
                                "version": 1,
                                "task_id": task_id,
                                "owner": actor,
                                "created_at": iso_us(now_us),
                            },
                        )
                    if previous is not None and alive is None:
                        # The old turn expired: it is gone for every reader, so its
                        # artifacts must not come back with the new write.
                        expired_dir = self.trash(turn_dir)
                    # artifacts/ comes with the first artifact: a turn without one costs no inode.
                    make_dirs(turn_dir, self.layout.root)
                    backups = self.artifacts.publish_uploads(turn_dir, uploads)
                    record = written_turn(
                        task_id,
                        turn,
                        meta=meta,
                        summary_md=summary_md,
                        artifacts=kept,
                        created_at=alive.created_at if alive else None,
                        updated_us=updated_us,
                        retention_us=self.retention_us,
                        task_created=index is None,
                    )
                    write_json(turn_dir / TURN_META, turn_to_json(record))
                    commit_point()
                    self.write_derived(
                        scope,
                        task_id,
                        task_dir,
                        record,
                        index,
                        summary=True,
                        ticket=ticket,
                        usage=stored,
                    )
                    for backup in backups:
                        remove_quietly(backup)
                except Exception:
                    # A new turn that failed (a full disk, a failing one) takes itself back, so
                    # that its error means what it says: nothing was stored. The listing is
                    # written last, in one transaction: it holds nothing of it either. A task
                    # this write made goes with it, and then nothing is left to repair.
                    if (
                        new_turn
                        and self._take_back(turn_dir)
                        and new_task
                        and self._take_back(task_dir)
                    ):
                        txn.abandon()
                    raise
        if expired_dir is not None:
            self.layout.tree.remove(expired_dir)
        return record

    def _take_back(self, path: Path) -> bool:
        """Remove what a failed write made at ``path`` (the caller holds its task's lock);
        whether it is gone."""
        try:
            self.layout.tree.remove(path)
        except OSError:
            return False
        return self.layout.tree.lstat(path) is None

    def _stage_uploads(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        artifacts: Iterable[ArtifactUpload],
        size: int | None,
        if_match: str | None,
        if_none_match: bool,
        stack: contextlib.ExitStack,
    ) -> tuple[list[StagedUpload[StagedFile]], Ticket | None]:
        """Stage the artifacts of a put_turn before its lock (none: the seed's write, which
        reads nothing here); their reservation, which the write under the lock settles."""
        uploads = iter(artifacts)
        first = next(uploads, None)
        if first is None:
            return [], None
        # The staged bytes and the write join one group flush (if any).
        stack.enter_context(group_commit(self.layout.root, enabled=self.txns.group_commit))
        credits: dict[str, int] = {}
        if if_match is not None or if_none_match or self.usage.applies(scope):
            turn_dir = self.layout.check_inside(self.layout.turn_dir(scope, task_id, turn))
            found = self.alive(read_turn(turn_dir), self.now_us())
            # Checked again under the lock; a write that cannot succeed reads no body.
            check_preconditions(found.etag if found else None, if_match, if_none_match)
            # What each upload replaces, as read now: a quota counts only what it adds.
            credits = {a.name: a.size for a in found.artifacts} if found else {}
        ticket = stack.enter_context(settling(self.usage.admit(scope, gross=size or 0)))
        staged = self.artifacts.stage_uploads(
            scope, itertools.chain((first,), uploads), credits, ticket, stack
        )
        return staged, ticket

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
        index = self.live_index(self._task_dir_checked(scope, task_id), task_id)
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
        """Delete a task: move it to the trash in one rename, then drop it from the listing."""
        task_dir = self._task_dir_checked(scope, task_id)
        # Its text leaves the files too, not only the answers, right after the answer
        # (app/storage/tree/removal.py).
        with self.removals.then_purge(scope):
            with self.transaction(scope, task_id) as txn, os_errors():
                index = self.live_index(task_dir, task_id)
                if index is None:
                    raise NotFound(f"task {task_id} not found")
                if only_owner is not None and index.owner != only_owner:
                    raise NotOwner(NOT_OWNER)
                self.room_to_delete(scope)
                txn.begin()
                trashed = self.trash(task_dir)
                self.listing(scope).set_task(task_id, [])
            self.layout.tree.remove(trashed)
            self.usage.freed()

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
        record = read_task_record(self._task_dir_checked(scope, task_id))
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

    def heal_search(self, scope: Scope, budget: SearchBudget | None = None) -> int | None:
        """Rebuild the project's search index from the records if it is marked damaged, does
        not open (or, with ``budget``, fails FTS5's integrity check within it: a check that
        runs out of it raises SearchTimeout), or has a rebuild to finish. Return how many
        tasks the rebuild filled; None when nothing was done."""
        if self.layout.tree.lstat(self.layout.listing(scope)) is None:
            return None
        listing = self.listing(scope)
        marks = listing.search_upkeep()
        if not (marks.damaged or marks.backfill):
            why = listing.search_opens() if budget is None else listing.search_damage(budget)
            if why is None:
                return None
            listing.mark_search_damaged(sqlite3.DatabaseError(why))
        return self.rebuild_search(scope)

    def rebuild_search(self, scope: Scope) -> int | None:
        """Rebuild the project's search index from the records when it is marked damaged,
        or finish a rebuild a killed process left: the index is dropped and started empty,
        then every task's rows are written again from its records under its lock, while
        writes go on (each writes its own rows into the new index). Searches answer 503
        until it is full (fts.stats). One process at a time rebuilds a project's index (its
        search lock); return how many tasks it filled, None when there was nothing to do or
        another process is at it."""
        lock = self.layout.check_inside(self.layout.search_lock(scope))
        try:
            with locked(lock, 0.0):
                listing = self.listing(scope)
                token = listing.start_search_rebuild()
                if token is None:
                    return None
                count = self._repair_tasks(scope, listing)
                listing.search_filled(token)
                # The dropped index's pages were zeroed; their old images leave the WAL.
                listing.purge_search()
                return count
        except LockTimeout:
            return None

    def _repair_tasks(self, scope: Scope, listing: Listing, batch: int = 500) -> int:
        """repair_task of every task the listing holds, one task lock at a time, reading
        their ids in short reads (no snapshot held across the walk)."""
        count, after = 0, ""
        while task_ids := listing.task_id_page(after, batch):
            for task_id in task_ids:
                with self.txns.locked(Key(scope, task_id)):
                    self.repair_task(scope, task_id)
            count += len(task_ids)
            after = task_ids[-1]
        return count

    # -- repair ------------------------------------------------------------------------------
    def repair_task(self, scope: Scope, task_id: str) -> None:
        """Rebuild a task's derived files (summaries, index.json, listing and search rows) from its
        records.

        The caller holds the task lock.
        """
        task_dir = self._task_dir_checked(scope, task_id)
        tree = self.layout.tree
        exists = tree.is_dir(task_dir)
        if exists:
            _remove_unfinished_turns(tree, task_dir)
            if _never_committed(tree, task_dir):
                # The first write of a new task died before its commit point: nothing of
                # the task was ever acknowledged, and its directory goes as a failed one's.
                tree.remove(task_dir)
                exists = False
        index = rebuild_index(tree, task_dir, task_id) if exists else None
        if index is None:
            if exists:
                tree.unlink(task_dir / TASK_INDEX)
            if tree.lstat(self.layout.listing(scope)) is not None:
                self.listing(scope).set_task(task_id, [])
            return
        texts: dict[int, TurnText] = {}
        records: list[TurnRecord] = []
        usage: list[TurnUsage] = []
        for entry in index["turns"]:
            turn_dir = task_dir / turn_dirname(entry["turn"])
            record = read_turn(turn_dir)
            if record is None:
                continue
            records.append(record)
            texts[record.turn] = turn_text(record)
            usage.append(turn_usage(record))
            reconcile_artifacts(tree, turn_dir / ARTIFACTS_DIR, record)
            summary = record.summary_md.encode("utf-8")
            if self.layout.read_bytes(turn_dir / TURN_SUMMARY) != summary:
                write_atomic(turn_dir / TURN_SUMMARY, summary, durable=False)
        try:
            current_index = read_json(task_dir / TASK_INDEX)
        except Corrupt:
            current_index = None
        if current_index != index:
            write_json(task_dir / TASK_INDEX, index, durable=False)
        section = self.section(scope, task_id, index, self.now_us(), tuple(records))
        self.listing(scope).set_task(task_id, index_rows(index), section, texts, usage)


def _name(info: ArtifactInfo) -> str:
    return info.name


def _remove_unfinished_turns(tree: Tree, task_dir: Path) -> None:
    """Remove the turn directories a put_turn made and died (or failed) in before its commit:
    no meta.json, nothing but its temp files and the artifacts it published for the record
    it never wrote (files only). Nothing in them was acknowledged, and the caller holds the
    task lock, so no writer is still filling one."""
    for _, turn_dir in turn_dirs(tree, task_dir):
        if all(_unfinished(tree, e) for e in tree.entries(turn_dir)):
            tree.remove(turn_dir)


def _never_committed(tree: Tree, task_dir: Path) -> bool:
    """Whether ``task_dir`` holds no turn at all: only what a new task's first write makes
    before its commit point (``task.json``, temp files) and its index. A link, or anything
    else, is a person's to look at (fsck reports it)."""
    return all(
        entry.is_file
        and (entry.name in (TASK_RECORD, TASK_INDEX) or entry.name.startswith(TMP_PREFIX))
        for entry in tree.entries(task_dir)
    )


def _unfinished(tree: Tree, entry: Entry) -> bool:
    if entry.is_file:
        return entry.name.startswith(TMP_PREFIX)
    if entry.is_dir and entry.name == ARTIFACTS_DIR:
        return all(e.is_file for e in tree.entries(entry.path))
    return False
