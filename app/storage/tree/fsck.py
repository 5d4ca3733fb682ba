"""Consistency check of the whole storage root, and its repair from the records.

Records are ``task.json`` and each turn's ``meta.json`` (plus the artifact bytes it lists);
everything else (``summary.md``, ``index.json``, the listing index, ``_project.md``) is
derived and must equal a rebuild from the records. fsck reports every difference and, with
``repair``, rebuilds the derived files under the same locks writers take. This module walks
the tree and reports; each task is checked by fsck_tasks.py, each project's listing
database by fsck_listing.py, its ledger by fsck_ledger.py, the usage counters by
fsck_usage.py.

What cannot be rebuilt is never guessed at: a torn ``meta.json`` moves its turn directory
to ``<root>/.lost+found/`` (so the tree is consistent again and a person can inspect the
bytes), and a symlink is reported, never followed and never touched.

A file that cannot be read now (an I/O or permission error: :class:`Unreadable`) is not a
torn one: the fault may pass and the bytes be whole. It is reported, the check goes on with
the rest of the tree, and nothing that depends on it is repaired: the task of an unreadable
turn or ``task.json`` is left exactly as it is (its rows too), an unreadable artifact keeps
its entry. The report is then never clean.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import partial
from pathlib import Path

from ulid import ULID

from app.storage.core.errors import (
    InsufficientStorage,
    StorageError,
    Unreadable,
    UnsafePath,
)
from app.storage.core.models import DEFAULT_GRACE, FsckReport
from app.storage.core.names import (
    LOCKS_DIR,
    PROJECT_DIGEST,
    PROJECT_LEDGER,
    PROJECT_LISTING,
    TMP_PREFIX,
    TRASH_DIR,
    Scope,
    is_id,
)
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.fs.txn import Key
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.fsck_ledger import LedgerCheck
from app.storage.tree.fsck_listing import ListingCheck
from app.storage.tree.fsck_tasks import NOT_READ, Expected, TaskCheck
from app.storage.tree.recovery import Recovery
from app.storage.tree.tasks import TaskStore

LOST_FOUND = ".lost+found"
# With no server on the root, a temp file in a task older than this is a leftover, however
# long the grace period: only a CLI command writing in process (an import, the memory tool
# in a test) could still own one, and none takes that long.
NO_SERVER_GRACE = 60.0
_LISTING_FILES = frozenset(
    name + suffix
    for name in (PROJECT_LISTING, PROJECT_LEDGER)
    for suffix in ("", "-wal", "-shm", "-journal")
)


def age_seconds(tree: Tree, path: Path, wall_now: float) -> float:
    """Seconds since anything at or under ``path`` last changed (mtime; no link followed).

    A directory counts as young while any file in it is: a long import stages files deep
    inside one temp directory whose own mtime stops changing early.
    """
    st = tree.lstat(path)
    if st is None:
        return 0.0
    newest = st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        for step in tree.walk(path):
            for entry in step.entries:
                newest = max(newest, entry.mtime)
    return wall_now - newest


def trash_age_seconds(tree: Tree, path: Path, wall_now: float) -> float:
    """Age of a trash entry from the ULID its name starts with (rename keeps old mtimes)."""
    try:
        return wall_now - ULID.from_str(path.name[:26]).timestamp
    except ValueError:
        return age_seconds(tree, path, wall_now)


def quarantine(tree: Tree, path: Path) -> Path:
    """Move ``path`` to ``<root>/.lost+found/<ulid>/<its path under root>`` in one rename."""
    target = tree.root / LOST_FOUND / str(ULID()) / path.relative_to(tree.root)
    make_dirs(target.parent, tree.root)
    tree.rename(path, target)
    fsync_dir(path.parent)
    fsync_dir(target.parent)
    return target


class _Fsck:
    def __init__(self, store: TaskStore, repair: bool, grace: timedelta, report: FsckReport):
        self.store = store
        self.layout = store.layout
        self.tree = store.layout.tree
        self.root = store.layout.root
        self.repair = repair
        self.grace = grace.total_seconds()
        self.report = report
        self.wall_now = time.time()
        self.listings = ListingCheck(self)
        self.ledgers = LedgerCheck(self)
        self.tasks = TaskCheck(self)
        # With no server on the root, no write is in flight inside a task (every other
        # writer takes the task's lock, which the check holds there): a temp file in it is
        # a leftover (NO_SERVER_GRACE).
        try:
            self.serving = Recovery(self.layout).held_elsewhere() is not None
        except UnsafePath:
            self.serving = True  # a linked lock tree (reported): nothing to tell by

    # -- reporting ---------------------------------------------------------------------------
    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def fault(self, message: str, fix: Callable[[], object] | None = None) -> bool:
        """Record a problem; with repair, run ``fix`` now. Return whether it was fixed."""
        self.report.problems.append(message)
        if not self.repair:
            return False
        if fix is None:
            self.report.unrepairable.append(message)
            return False
        try:
            fix()
        except (OSError, StorageError, sqlite3.Error) as exc:
            self.report.unrepairable.append(f"{message} (repair failed: {exc})")
            return False
        self.report.repaired.append(message)
        return True

    def note(self, message: str) -> None:
        self.report.notes.append(message)

    def done(self, past: str, future: str) -> str:
        """What a repair does, said as done (with repair) or as what ``--repair`` would do."""
        return past if self.repair else future

    def unreadable(self, exc: Unreadable, what: str = "") -> None:
        """A file that cannot be read now: reported, never repaired (see the module's doc)."""
        path = Path(exc.filename)
        self.not_read(
            f"{self.rel(path)}: cannot be read now ({exc.strerror}): an I/O or permission"
            f" error, not damage; {what or 'nothing that depends on it was checked or changed'}"
        )

    def not_read(self, message: str) -> None:
        """Something fsck could not look at now: reported, never repaired, never clean."""
        self.report.problems.append(message)
        self.report.unreadable.append(message)
        if self.repair:
            self.report.unrepairable.append(message)

    def entries(self, directory: Path) -> list[Entry]:
        """The entries of a directory reached without a link ([] and a fault otherwise)."""
        try:
            return self.tree.entries(directory)
        except UnsafePath:
            self.symlink(directory)
            return []
        except NotADirectoryError:
            return []

    def entry(self, path: Path) -> Entry | None:
        """``path`` typed as Tree.entries types it (None: removed since it was listed)."""
        return self.tree.entry(path)

    def is_link(self, path: Path) -> bool:
        st = self.tree.lstat(path)
        return st is not None and stat.S_ISLNK(st.st_mode)

    def symlink(self, path: Path) -> None:
        self.fault(f"{self.rel(path)}: symlink (never followed; remove it by hand)")

    def temp(self, path: Path, *, in_task: bool = False) -> None:
        """A temp file; ``in_task``: found in a task directory, under the task's lock."""
        age = age_seconds(self.tree, path, self.wall_now)
        unserved = in_task and not self.serving and age >= NO_SERVER_GRACE
        if age < self.grace and not unserved:
            self.note(f"{self.rel(path)}: temp file of a write in flight ({age:.0f}s old)")
            return
        why = f"{age:.0f}s old"
        if age < self.grace:
            why += "; no server holds the root, so no write is in flight"
        self.fault(
            f"{self.rel(path)}: stale temp file ({why}; {self.done('removed', '--repair removes it')})",
            lambda: self.tree.remove(path),
        )

    def quarantine(self, path: Path) -> Path:
        return quarantine(self.tree, path)

    def unindexed(self, path: Path, why: str = "not part of the layout") -> None:
        where = self.done(f"moved to {LOST_FOUND}", f"--repair moves it to {LOST_FOUND}")
        self.fault(
            f"{self.rel(path)}: unindexed entry, {why} ({where})",
            lambda: quarantine(self.tree, path),
        )

    def common(self, entry: Entry, *, in_task: bool = False) -> bool:
        """Handle symlinks and temp files; return True when ``entry`` needs nothing else."""
        if entry.is_link:
            self.symlink(entry.path)
            return True
        if entry.name.startswith(TMP_PREFIX):
            self.temp(entry.path, in_task=in_task)
            return True
        return False

    # -- walk --------------------------------------------------------------------------------
    def run(self) -> None:
        if not os.path.isdir(self.root):
            self.fault(f"{self.root}: storage root does not exist")
            return
        for entry in self.entries(self.root):
            path = entry.path
            if self.common(entry):
                continue
            name = entry.name
            if name == LOCKS_DIR:
                continue  # checked last, after every task was visited
            if name == TRASH_DIR:
                self.trash(path)
            elif name == LOST_FOUND:
                count = len(self.entries(path))
                if count:
                    self.note(f"{LOST_FOUND}: {count} quarantined item(s) to inspect by hand")
            elif name.startswith((".", "_")):
                # Names no id can take: side files of the engine (cursor key, sweeper state)
                # or of the memory-stores engine, which checks its own tree.
                continue
            elif is_id(name) and entry.is_dir:
                self.tenant(name, path)
            else:
                self.unindexed(path)
        self.locks()

    def trash(self, path: Path) -> None:
        for entry in self.entries(path):
            item = entry.path
            if entry.is_link:
                self.symlink(item)
                continue
            age = trash_age_seconds(self.tree, item, self.wall_now)
            if age < self.grace:
                self.note(f"{self.rel(item)}: deletion in progress")
            else:
                self.fault(
                    f"{self.rel(item)}: unfinished deletion ({age:.0f}s old)",
                    partial(self.tree.remove, item),
                )

    def tenant(self, tenant: str, path: Path) -> None:
        for entry in self.entries(path):
            if self.common(entry) or entry.name.startswith((".", "_")):
                continue
            if is_id(entry.name) and entry.is_dir:
                self.project(Scope(tenant, entry.name), entry.path)
            else:
                self.unindexed(entry.path)

    def project(self, scope: Scope, path: Path) -> None:
        """Each task against the records and at once against its listing and search rows, then
        what the listing has that no task directory does, then the digest: one task in memory
        at a time, and the task names streamed in sorted order (_TaskNames), whatever the
        project's size."""
        try:
            self._project(scope, path)
        except UnsafePath:
            # The project directory is a link, or was swapped for one between two walks of
            # its task names: reported, and nothing behind it is checked or repaired.
            self.symlink(path)
        except InsufficientStorage as exc:
            # Its listing cannot be opened on this full disk (tree/sqlite/db.py, _SHM_ROOM):
            # the project is not checked now, and fsck is not clean while that lasts.
            self.not_read(f"{self.rel(path)}: not checked now: {exc}")

    def _project(self, scope: Scope, path: Path) -> None:
        for other in self.tree.non_dirs(path):
            self.project_entry(other)
        names = _TaskNames(self.tree, path)
        listing = self.listings.open_listing(scope)
        ledger = self.ledgers.open(scope)
        searched = listing is not None and self.listings.search_ready(scope, listing)
        with_rows = False
        # One walk of every subdirectory: the tasks, and the directories that are none.
        for name in self.tree.sorted_subdir_names(path):
            if name.startswith(TMP_PREFIX) or not is_id(name):
                odd = self.entry(path / name)
                if odd is not None:
                    self.project_entry(odd)
                continue
            if not _TaskNames.holds(name):
                continue
            rows, texts, entries = self.task(scope, name)
            if rows is NOT_READ:
                continue  # reported; its rows are left as they are
            with_rows = with_rows or bool(rows)
            if ledger is not None:
                self.ledgers.task(scope, ledger, name, entries)
            if listing is not None:
                self.listings.listing_task(scope, listing, name, rows)
                if searched:
                    self.listings.search_task(scope, listing, name, texts)
        if ledger is not None:
            self.ledgers.rest(scope, ledger, names)
        elif with_rows:
            self.ledgers.missing(scope)
        if listing is None:
            path = self.layout.listing(scope)
            if with_rows and self.tree.lstat(path) is None:
                self.fault(f"{self.rel(path)}: missing", partial(self.rebuild_all, scope, names))
            return
        self.listings.listing_rest(scope, listing, names)
        if searched:
            self.listings.search_rest(scope, listing, names)
        self.listings.digest(scope, names)

    def project_entry(self, entry: Entry) -> None:
        """An entry of a project directory other than a task."""
        name = entry.name
        if self.common(entry):
            return
        if name in _LISTING_FILES or name == PROJECT_DIGEST:
            if not entry.is_file:
                self.unindexed(entry.path, "expected a regular file")
            return
        if not name.startswith((".", "_")):
            self.unindexed(entry.path)

    # -- one task, under its lock (fsck_tasks.py) ---------------------------------------------
    def task_locked(self, scope: Scope, task_id: str) -> AbstractContextManager[None]:
        # A write a dead writer left in flight is reported (and repaired) by the check.
        return self.store.txns.locked(Key(scope, task_id), repair=False)

    def task(self, scope: Scope, task_id: str) -> Expected:
        """The task's listing rows, search-text digests and ledger entries as its records
        say."""
        return self.tasks.task(scope, task_id)

    def rebuild_all(self, scope: Scope, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            self.task_rebuild(scope, task_id)

    def task_rebuild(self, scope: Scope, task_id: str) -> None:
        with self.task_locked(scope, task_id):
            self.tasks.rebuild(scope, task_id)

    # -- lock tree ---------------------------------------------------------------------------
    def locks(self) -> None:
        """Report links in the lock tree; repair writes left in flight on tasks that are gone."""
        base = self.layout.locks_dir()
        try:
            steps = list(self.tree.walk(base))
        except UnsafePath:
            return  # a linked lock tree: reported by the walk of the root, never entered
        for step in steps:
            for entry in step.entries:
                if entry.is_link:
                    self.symlink(entry.path)
        txns = self.store.txns
        try:
            pending = txns.journal.pending()
        except UnsafePath:
            return  # a linked journal: reported by the walk above; the next write replaces it
        for _, key in pending:
            if self.tree.lstat(self.layout.task_dir(key.scope, key.id)) is not None:
                continue  # a task the walk checked (or one created since, by a live writer)
            with txns.locked(key, repair=False):
                if txns.is_pending(key):
                    self.fault(
                        f"{key.scope.tenant}/{key.scope.project}/{key.id}: write in flight"
                        " left by a writer that died, on a task that is gone",
                        partial(self.tasks.rebuild, key.scope, key.id),
                    )


def fsck(
    store: TaskStore,
    *,
    repair: bool = False,
    grace: timedelta = DEFAULT_GRACE,
    report: FsckReport | None = None,
) -> FsckReport:
    """Check every file under the root against the records; with ``repair``, rebuild.

    Temp files and trash younger than ``grace`` belong to writes in flight: noted, not
    flagged. Safe to run while the service serves: each task is checked under its lock.
    """
    report = report if report is not None else FsckReport()
    _Fsck(store, repair, grace, report).run()
    return report


class _TaskNames:
    """A project's task directory names in sorted order, streamed again for each use
    (:meth:`Tree.sorted_subdir_names`: bounded memory whatever the project's size). Each
    walk sees the directory as it is then; every use rechecks a task under its lock."""

    def __init__(self, tree: Tree, path: Path) -> None:
        self.tree = tree
        self.path = path

    @staticmethod
    def holds(name: str) -> bool:
        """Whether the directory ``name`` is a task (the service's own start with . or _)."""
        return is_id(name) and not name.startswith((".", "_"))

    def __iter__(self) -> Iterator[str]:
        return filter(self.holds, self.tree.sorted_subdir_names(self.path))
