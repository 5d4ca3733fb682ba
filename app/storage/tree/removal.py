"""Removing what a task holds on the tree: the whole task, one turn, one artifact, and the
purge that makes the removed text leave every file after the answer.

A task delete moves the task's directory to the trash in one rename under its lock, then
drops its rows from the listing. A turn delete moves the turn's directory to the trash in one rename under the task's lock
(the last live turn takes the whole task, as a task delete does), then rebuilds the task's
derived files from the records that are left (``index.json``, the listing and search rows,
the usage counters, the digest section). An artifact delete is a write of its turn: the
``meta.json`` without the artifact is the commit, then the bytes and any kept previous copy
are unlinked, then the derived files follow as for an upload.

**The purge** (:meth:`TaskRemovals.purge`) runs right after the answer, in the project's
upkeep thread (one purge at a time per project; one asked for meanwhile runs again after
it, never dropped): ``_project.md`` is compacted (a base that still holds a removed section
is rewritten without it), then the listing's search index is merged and its WAL truncated
(app/storage/tree/sqlite/fts.py). A reader holding an old snapshot (a long search, a backup)
stops the truncation; the listing keeps its purge owed until one succeeds, and the next
write to the project, the sweep and ``fsck --repair`` try again. The same upkeep first
rebuilds a search index that is damaged from the records (TaskStore.heal_search), and a
purge compacts one whose structure grew past its bound (fts_purge.purge).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from app.storage.core.background import Later
from app.storage.core.clock import iso_us
from app.storage.core.errors import NotFound, NotOwner, StorageError
from app.storage.core.files import os_errors
from app.storage.core.ledger import LedgerTurn
from app.storage.core.models import TaskIndex, TurnRecord
from app.storage.core.names import (
    PREV_PREFIX,
    TURN_META,
    Scope,
    turn_dirname,
    validate_artifact_name,
    validate_turn,
)
from app.storage.core.query import SearchBudget
from app.storage.core.records import turn_to_json
from app.storage.core.task_rules import NOT_OWNER, check_preconditions
from app.storage.tree.fs.atomic import remove_quietly
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.sync import commit_point
from app.storage.tree.fs.txn import Txn
from app.storage.tree.records import load_index, read_turn, write_json
from app.storage.tree.sqlite.ledger import Ledger
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.usage import TreeUsage

log = logging.getLogger("app.storage.tree.removal")


class TaskParts(Protocol):
    """What the removals need of the task engine (TaskStore): its paths, lock, counters and
    background jobs, and the steps of a write and of a repair."""

    layout: Layout
    usage: TreeUsage
    later: Later
    retention_us: int

    def now_us(self) -> int: ...

    def transaction(self, scope: Scope, task_id: str) -> AbstractContextManager[Txn]: ...

    def listing(self, scope: Scope, *, below: Path | None = None) -> Listing: ...

    def ledger(self, scope: Scope, *, below: Path | None = None) -> Ledger: ...

    def ledger_task(
        self,
        scope: Scope,
        task_id: str,
        entries: list[LedgerTurn],
        *,
        below: Path | None = None,
        only_if_made: bool = False,
    ) -> None: ...

    def live_index(self, task_dir: Path, task_id: str) -> TaskIndex | None: ...

    def alive(self, record: TurnRecord | None, now_us: int) -> TurnRecord | None: ...

    def next_updated_us(self, index: dict[str, Any] | None, now_us: int) -> int: ...

    def room_to_delete(self, scope: Scope) -> None: ...

    def trash(self, directory: Path) -> Path: ...

    def repair_task(self, scope: Scope, task_id: str) -> None: ...

    def compact_digest(self, scope: Scope, *, wait: bool = True) -> bool: ...

    def heal_search(self, scope: Scope, budget: SearchBudget | None = None) -> int | None: ...

    def write_derived(
        self,
        scope: Scope,
        task_id: str,
        task_dir: Path,
        record: TurnRecord,
        index: dict[str, Any] | None,
        *,
        summary: bool,
    ) -> None: ...


class TaskRemovals:
    """The task, turn and artifact deletes of one tree (TaskStore's), and the purge after
    them."""

    def __init__(self, tasks: TaskParts) -> None:
        self.tasks = tasks

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None:
        """Delete a task: move it to the trash in one rename, then drop it from the listing."""
        tasks = self.tasks
        task_dir = tasks.layout.check_inside(tasks.layout.task_dir(scope, task_id))
        # Its text leaves the files too, not only the answers, right after the answer.
        with self.then_purge(scope):
            with tasks.transaction(scope, task_id) as txn, os_errors():
                index = tasks.live_index(task_dir, task_id)
                if index is None:
                    raise NotFound(f"task {task_id} not found")
                if only_owner is not None and index.owner != only_owner:
                    raise NotOwner(NOT_OWNER)
                tasks.room_to_delete(scope)
                txn.begin()
                trashed = tasks.trash(task_dir)
                tasks.listing(scope).set_task(task_id, [])
                tasks.ledger_task(scope, task_id, [], only_if_made=True)
            tasks.layout.tree.remove(trashed)
            tasks.usage.freed()

    def _live_turn(
        self, scope: Scope, task_id: str, turn: int, only_owner: str | None
    ) -> tuple[Path, TurnRecord, int]:
        """The task's directory, the live turn, and how many live turns the task has;
        NotFound or NotOwner (the caller holds the task's lock)."""
        tasks = self.tasks
        task_dir = tasks.layout.check_inside(tasks.layout.task_dir(scope, task_id))
        index = tasks.live_index(task_dir, task_id)
        if index is None:
            raise NotFound(f"task {task_id} not found")
        turn_dir = tasks.layout.check_inside(task_dir / turn_dirname(turn) / TURN_META).parent
        record = tasks.alive(read_turn(turn_dir), tasks.now_us())
        if record is None:
            raise NotFound(f"turn {turn} of task {task_id} not found")
        if only_owner is not None and index.owner != only_owner:
            raise NotOwner(NOT_OWNER)
        return task_dir, record, len(index.turns)

    def delete_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        validate_turn(turn)
        tasks = self.tasks
        with self.then_purge(scope):
            with tasks.transaction(scope, task_id) as txn, os_errors():
                task_dir, record, live = self._live_turn(scope, task_id, turn, only_owner)
                check_preconditions(record.etag, if_match, False)
                tasks.room_to_delete(scope)  # a refusal after the rename would be a lie
                txn.begin()
                if live == 1:
                    # Its last live turn: the task goes whole (expired turns the sweep has
                    # not removed yet go with it), as a task delete.
                    trashed = tasks.trash(task_dir)
                    tasks.listing(scope).set_task(task_id, [])
                    tasks.ledger_task(scope, task_id, [], only_if_made=True)
                else:
                    trashed = tasks.trash(task_dir / turn_dirname(turn))
                    tasks.repair_task(scope, task_id)
            tasks.layout.tree.remove(trashed)
            tasks.usage.freed()

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
        validate_turn(turn)
        validate_artifact_name(name)
        tasks = self.tasks
        path = tasks.layout.check_inside(tasks.layout.artifact(scope, task_id, turn, name))
        # A write of its turn: write_derived retries a purge still owed, as every write does.
        with tasks.transaction(scope, task_id) as txn, os_errors():
            task_dir, record, _ = self._live_turn(scope, task_id, turn, only_owner)
            current = next((a for a in record.artifacts if a.name == name), None)
            if current is None:
                raise NotFound(f"artifact {name} of turn {turn} of task {task_id} not found")
            check_preconditions(current.etag, if_match, False)
            index = load_index(tasks.layout.tree, task_dir, task_id)
            updated_us = tasks.next_updated_us(index, tasks.now_us())
            record = replace(
                record,
                artifacts=tuple(a for a in record.artifacts if a.name != name),
                updated_at=iso_us(updated_us),
                retain_until=iso_us(updated_us + tasks.retention_us),
                updated_us=updated_us,
            )
            tasks.room_to_delete(scope)  # a refusal after meta.json would be a lie
            txn.begin()
            write_json(path.parent.parent / TURN_META, turn_to_json(record))
            commit_point()
            # After the commit: a writer killed before these lines leaves bytes no record
            # names, which the task's repair (the next holder of the lock) removes.
            remove_quietly(path)
            remove_quietly(path.parent / f"{PREV_PREFIX}{name}")
            tasks.write_derived(scope, task_id, task_dir, record, index, summary=False)
        tasks.usage.freed()

    # -- the purge -------------------------------------------------------------------------
    @contextmanager
    def then_purge(self, scope: Scope) -> Iterator[None]:
        """Around a delete: its purge runs after it. A delete that finds nothing to delete
        retries a purge still owed: the client's retry of a delete that failed after the
        listing marked its text owed (a disk fault) purges it, without waiting for the
        project's next write."""
        try:
            yield
        except NotFound:
            self.purge_owed(scope)
            raise
        self.purge_later(scope)

    def purge_later(self, scope: Scope) -> threading.Event:
        """Run :meth:`purge` after the answer, in the project's upkeep thread; the event is
        set once it ran."""
        return self.tasks.later.run(
            ("purge", scope),
            lambda: self.purge(scope),
            f"purging removed text from the files of {scope.tenant}/{scope.project}",
        )

    def purge(self, scope: Scope, *, patience: float = 1.0, only_pending: bool = False) -> bool:
        """Make text removed from the project leave ``_project.md`` and the listing (its
        search index and WAL); True when nothing of it is left on disk. A search index that
        is damaged (marked by a write, found so by this purge, or not opening) is rebuilt
        from the records first; one whose structure grew past its bound is compacted
        (fts_purge.purge). ``only_pending``: the sweep's, which also purges replaced text."""
        tasks = self.tasks
        # The ledger's rows of what was removed leave its WAL too (its file's pages were
        # zeroed by secure_delete): a reader's snapshot may keep it, until the next purge.
        ledger_clear = True
        if tasks.layout.tree.lstat(tasks.layout.ledger(scope)) is not None:
            try:
                ledger_clear = tasks.ledger(scope).checkpoint()
            except (StorageError, sqlite3.Error) as exc:  # damaged: fsck rebuilds it
                log.warning(
                    "cannot purge the ledger of %s/%s: %s", scope.tenant, scope.project, exc
                )
        listing_path = tasks.layout.listing(scope)
        if tasks.layout.tree.lstat(listing_path) is None:
            return ledger_clear
        tasks.heal_search(scope)
        listing = tasks.listing(scope)
        marks = listing.search_upkeep()
        if not (only_pending or marks.owed or marks.compacting):
            return ledger_clear
        if marks.owed:
            # The base file may hold a section that is gone: rewritten without it first, and
            # its rows' writes then leave the WAL with the rest.
            tasks.compact_digest(scope)
        try:
            return (
                listing.purge_search(patience=patience, only_pending=only_pending) and ledger_clear
            )
        except sqlite3.DatabaseError:
            # The purge found the index damaged and marked it: rebuilt (which drops the old
            # one, text and all), then purged.
            tasks.heal_search(scope)
            return listing.purge_search(patience=patience, only_pending=only_pending)

    def purge_owed(self, scope: Scope) -> None:
        """Retry a purge a held reader stopped (a write to the project calls this)."""
        tasks = self.tasks
        if tasks.layout.tree.lstat(tasks.layout.listing(scope)) is None:
            return  # a project with no listing yet owes nothing
        try:
            due = tasks.listing(scope).search_upkeep().due
        except (StorageError, OSError, sqlite3.Error) as exc:
            log.warning(
                "cannot read the purge state of %s/%s: %s", scope.tenant, scope.project, exc
            )
            return
        if due:
            self.purge_later(scope)
