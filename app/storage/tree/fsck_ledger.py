"""fsck's part over each project's ledger (``_ledger.sqlite3``, tree/sqlite/ledger.py): each
task's entries against its records (which the walk of fsck.py reads once for every check and
hands here), entries of tasks that have no directory, then the rollups and session homes
against a recount of the entries.

A difference in a task's entries is confirmed again under the task's lock (a writer may have
moved on since the walk looked) and repaired by the task's repair, which sets them from its
records. Rollups that differ are recounted from the entries. A file SQLite cannot read, or a
missing one where tasks have records, is made again from every record.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Protocol

from app.storage.core.errors import Corrupt, LockTimeout, StorageError, UnsafePath
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.names import Scope
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.walk import Tree
from app.storage.tree.fsck_listing import absent_from
from app.storage.tree.records import read_records
from app.storage.tree.sqlite.db import SIDE_FILES
from app.storage.tree.sqlite.ledger import Ledger
from app.storage.tree.tasks import TaskStore


class Walk(Protocol):
    """What the ledger checks need of fsck's walk (fsck.py ``_Fsck``)."""

    layout: Layout
    tree: Tree
    store: TaskStore

    def rel(self, path: Path) -> str: ...

    def fault(self, message: str, fix: Callable[[], object] | None = None) -> bool: ...

    def is_link(self, path: Path) -> bool: ...

    def task_locked(self, scope: Scope, task_id: str) -> AbstractContextManager[None]: ...

    def task_rebuild(self, scope: Scope, task_id: str) -> None: ...


class LedgerCheck:
    """The ledger checks of one fsck run."""

    def __init__(self, check: Walk) -> None:
        self.check = check

    def open(self, scope: Scope) -> Ledger | None:
        """The project's ledger; None when it is absent, linked (reported with the project's
        entries) or damaged (reported here, and made again on repair)."""
        path = self.check.layout.ledger(scope)
        if self.check.is_link(path) or self.check.tree.lstat(path) is None:
            return None
        ledger = self.check.store.ledger(scope)
        try:
            ledger.task_ids()
        except (Corrupt, sqlite3.DatabaseError) as exc:
            self.check.fault(
                f"{self.check.rel(path)}: damaged ({exc}); made again from the records on repair",
                partial(self.remake, scope),
            )
            return None
        return ledger

    def missing(self, scope: Scope) -> None:
        """A project with records and no ledger (one written before the ledger was, or one
        a person removed)."""
        path = self.check.layout.ledger(scope)
        if self.check.tree.lstat(path) is None:
            self.check.fault(
                f"{self.check.rel(path)}: missing; made from the records on repair",
                partial(self.remake, scope),
            )

    def task(self, scope: Scope, ledger: Ledger, task_id: str, want: list[LedgerTurn]) -> None:
        if ledger.task_entries(task_id) != want:
            self.differs(scope, ledger, task_id)

    def differs(self, scope: Scope, ledger: Ledger, task_id: str) -> None:
        where = self.check.rel(ledger.path)
        try:
            with self.check.task_locked(scope, task_id):
                task_dir = self.check.layout.task_dir(scope, task_id)
                records = (
                    read_records(self.check.tree, task_dir)
                    if self.check.tree.is_dir(task_dir)
                    else []
                )
                want = [entry_of(r) for r in records if r.task_id == task_id]
                stale = ledger.task_entries(task_id) != want
        except (LockTimeout, UnsafePath, StorageError, OSError) as exc:
            self.check.fault(f"{where}: task {task_id} ledger entries not checked ({exc})")
            return
        if stale:
            self.check.fault(
                f"{where}: ledger entries of task {task_id} differ from the records",
                partial(self.check.task_rebuild, scope, task_id),
            )

    def rest(self, scope: Scope, ledger: Ledger, names: Iterable[str]) -> None:
        """Entries of tasks with no directory; then the rollups against the entries."""
        for task_id in absent_from(names, ledger.task_ids()):
            self.differs(scope, ledger, task_id)
        where = self.check.rel(ledger.path)
        for fault in ledger.rollup_faults():
            self.check.fault(f"{where}: {fault}", ledger.rebuild_rollups)

    def remake(self, scope: Scope) -> None:
        """Remove the file (and SQLite's files beside it) and make it again from every record:
        opening a ledger that is not there makes it (tree/sqlite/ledger.py)."""
        path = self.check.layout.check_inside(self.check.layout.ledger(scope))
        Ledger.forget(path)
        for suffix in ("", *SIDE_FILES):
            self.check.tree.unlink(Path(f"{path}{suffix}"))
        self.check.store.ledger(scope).task_ids()
