"""The tree's usage counters against a recount from the records: fsck's part.

Each turn's usage row must equal what its ``meta.json`` says (tree/records.py
``turn_usage``), each project's counters the sums of its rows, each store's counters a
count of its index rows, and each store's row in its project's listing the store's counters.
``repair`` rebuilds what differs under the lock its writers take (``repair_task``, a store's
``rebuild``), which rewrites the counters with the rows.
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Callable, Iterable, Iterator
from functools import partial

from app.storage.core.errors import Corrupt, LockTimeout, StorageError, Unreadable, UnsafePath
from app.storage.core.models import FsckReport
from app.storage.core.names import STORE_ID_RE, STORES_DIR, TURN_DIR_RE, Scope, is_id
from app.storage.core.records import turn_usage
from app.storage.core.usage import StoreUsage, TurnUsage
from app.storage.tree.fs.txn import Key
from app.storage.tree.records import read_turn
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore


class _UsageCheck:
    def __init__(
        self, tasks: TaskStore, stores: MemoryStoreEngine, report: FsckReport, repair: bool
    ) -> None:
        self.tasks = tasks
        self.stores = stores
        self.layout = tasks.layout
        self.tree = tasks.layout.tree
        self.report = report
        self.repair = repair

    def fault(self, message: str, fix: Callable[[], object]) -> None:
        self.report.problems.append(message)
        if not self.repair:
            return
        try:
            fix()
        except (OSError, StorageError, sqlite3.Error) as exc:
            self.report.unrepairable.append(f"{message} (repair failed: {exc})")
            return
        self.report.repaired.append(message)

    def run(self) -> None:
        for scope in self.layout.projects([]):
            path = self.layout.listing(scope)
            st = self.tree.lstat(path)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue  # no listing (nothing counted yet), or a link fsck reports
            try:
                self.project(scope)
            except (sqlite3.DatabaseError, StorageError) as exc:
                self.report.problems.append(
                    f"{scope.tenant}/{scope.project}: usage not checked ({exc})"
                )

    # -- tasks ------------------------------------------------------------------------------
    def expected_task(self, scope: Scope, task_id: str) -> list[TurnUsage]:
        """What the records of a task say it stores (turns whose meta.json reads)."""
        task_dir = self.layout.task_dir(scope, task_id)
        found = []
        for entry in self.tree.entries(task_dir):
            if not (entry.is_dir and TURN_DIR_RE.fullmatch(entry.name)):
                continue
            try:
                record = read_turn(entry.path)
            except (Corrupt, UnsafePath):
                continue  # the main check reports (and quarantines) it
            if record is not None:
                found.append(turn_usage(record))
        return sorted(found, key=lambda u: u.turn)

    def project(self, scope: Scope) -> None:
        """Each task's rows against its records, the task directories (sorted names) and the
        listing's rows (streamed in task order) walked side by side: one task in memory at a
        time, whatever the project's size."""
        where = f"{scope.tenant}/{scope.project}"
        listing = self.tasks.listing(scope)
        names = self.tree.sorted_subdir_names(self.layout.project_dir(scope))
        on_disk = (name for name in names if is_id(name))
        for task_id, rows in _merged(on_disk, listing.usage_turn_rows()):
            key = Key(scope, task_id)
            try:
                if self.expected_task(scope, task_id) == rows:
                    continue
                # Again under the task's lock: a writer may have moved on since.
                with self.tasks.txns.locked(key, repair=False):
                    if self.expected_task(scope, task_id) == listing.usage_of_task(task_id):
                        continue
            except (LockTimeout, UnsafePath, NotADirectoryError) as exc:
                self.report.problems.append(f"{where}/{task_id}: usage not checked ({exc})")
                continue
            except Unreadable:
                continue  # reported by the main check; its rows are left as they are
            self.fault(
                f"{where}: usage rows of task {task_id} differ from its records",
                partial(self._rebuild_task, key),
            )
        counters, sums = listing.usage_counter_sums()
        if counters != sums:
            self.fault(
                f"{where}: usage counters {counters} differ from the sums of the rows {sums}",
                listing.recount_usage,
            )
        self.stores_of(scope, listing.usage_store_rows())

    def _rebuild_task(self, key: Key) -> None:
        with self.tasks.txns.locked(key):
            self.tasks.repair_task(key.scope, key.id)

    # -- stores -----------------------------------------------------------------------------
    def stores_of(self, scope: Scope, rows: dict[str, StoreUsage]) -> None:
        where = f"{scope.tenant}/{scope.project}"
        stores_dir = self.layout.stores_dir(scope)
        present = []
        if self.tree.is_dir(stores_dir):
            present = [
                e.name
                for e in self.tree.entries(stores_dir)
                if e.is_dir and STORE_ID_RE.fullmatch(e.name)
            ]
        for store_id in present:
            key = Key(scope, store_id)
            try:
                with self.stores.txns.locked(key, repair=False):
                    store_dir = self.layout.store_dir(scope, store_id)
                    if not self.tree.is_dir(store_dir):
                        continue
                    with self.stores.index(store_dir).read() as reader:
                        counted, kept = reader.counted_usage(), reader.store_usage()
                    if counted != kept:
                        self.fault(
                            f"{where}/{STORES_DIR}/{store_id}: usage counters differ from its index",
                            partial(self.stores.rebuild, store_dir, key),
                        )
                        continue
                    if rows.get(store_id) != kept:
                        self.fault(
                            f"{where}: usage row of store {store_id} differs from its index",
                            partial(self.stores.usage.set_store, scope, store_id, kept),
                        )
            except (LockTimeout, UnsafePath, sqlite3.Error) as exc:
                self.report.problems.append(
                    f"{where}/{STORES_DIR}/{store_id}: usage not checked ({exc})"
                )
        for store_id in sorted(set(rows) - set(present)):
            self.fault(
                f"{where}: usage row of store {store_id}, which does not exist",
                partial(self.stores.usage.set_store, scope, store_id, None),
            )


def _merged(
    names: Iterable[str], rows: Iterator[tuple[str, list[TurnUsage]]]
) -> Iterator[tuple[str, list[TurnUsage]]]:
    """Every task id of ``names`` (sorted) or ``rows`` (in id order), once, in order, with its
    rows ([] for a task without any)."""
    found = iter(names)
    name = next(found, None)
    for task_id, task_rows in rows:
        while name is not None and name < task_id:
            yield name, []
            name = next(found, None)
        if name == task_id:
            name = next(found, None)
        yield task_id, task_rows
    while name is not None:
        yield name, []
        name = next(found, None)


def fsck_usage(
    tasks: TaskStore, stores: MemoryStoreEngine, report: FsckReport, *, repair: bool
) -> None:
    """Check (and with ``repair`` rebuild) every usage row and counter of the tree."""
    _UsageCheck(tasks, stores, report, repair).run()
