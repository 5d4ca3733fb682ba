"""Consistency check of the whole storage root, and its repair from the records.

Records are ``task.json`` and each turn's ``meta.json`` (plus the artifact bytes it lists);
everything else (``summary.md``, ``index.json``, the listing index, ``_project.md``) is
derived and must equal a rebuild from the records. fsck reports every difference and, with
``repair``, rebuilds the derived files under the same locks writers take.

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
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path

from ulid import ULID

from app.storage.core.errors import (
    Corrupt,
    InsufficientStorage,
    InvalidName,
    LockTimeout,
    StorageError,
    Unreadable,
    UnsafePath,
)
from app.storage.core.models import DEFAULT_GRACE, FsckReport, TurnRecord
from app.storage.core.names import (
    ARTIFACTS_DIR,
    LOCKS_DIR,
    PREV_PREFIX,
    PROJECT_DIGEST,
    PROJECT_LISTING,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    TRASH_DIR,
    TURN_DIR_RE,
    TURN_META,
    TURN_SUMMARY,
    Scope,
    is_id,
    turn_dirname,
    validate_artifact_name,
)
from app.storage.core.record_rules import check_turn_record
from app.storage.core.records import turn_to_json
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.fs.noatime import sha256_file
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.fs.txn import Key
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.fsck_listing import ListingCheck
from app.storage.tree.records import (
    build_index,
    index_rows,
    read_json,
    read_task_record,
    read_turn,
    rebuild_index,
    write_json,
)
from app.storage.tree.recovery import Recovery
from app.storage.tree.sqlite import turn_search
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore

LOST_FOUND = ".lost+found"
# What a task's check returns when something in it could not be read: nothing about it is
# compared or repaired, its listing and search rows included.
NOT_READ: list[TurnRow] = []
# With no server on the root, a temp file in a task older than this is a leftover, however
# long the grace period: only a CLI command writing in process (an import, the memory tool
# in a test) could still own one, and none takes that long.
NO_SERVER_GRACE = 60.0
_LISTING_FILES = frozenset(PROJECT_LISTING + suffix for suffix in ("", "-wal", "-shm", "-journal"))


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
            rows, texts = self.task(scope, name)
            if rows is NOT_READ:
                continue  # reported; its rows are left as they are
            with_rows = with_rows or bool(rows)
            if listing is not None:
                self.listings.listing_task(scope, listing, name, rows)
                if searched:
                    self.listings.search_task(scope, listing, name, texts)
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

    # -- one task, under its lock ------------------------------------------------------------
    def task_locked(self, scope: Scope, task_id: str) -> AbstractContextManager[None]:
        # A write a dead writer left in flight is reported (and repaired) by the check.
        return self.store.txns.locked(Key(scope, task_id), repair=False)

    def task(self, scope: Scope, task_id: str) -> tuple[list[TurnRow] | None, dict[int, str]]:
        """The task's listing rows and search-text digests as its records say."""
        try:
            with self.task_locked(scope, task_id):
                return self._task_locked(scope, task_id)
        except LockTimeout:
            # Held for longer than any write takes: report it rather than stop the check.
            self.fault(f"{scope.tenant}/{scope.project}/{task_id}: lock busy, not checked")
        except UnsafePath as exc:
            self.fault(f"{scope.tenant}/{scope.project}/{task_id}: not checked ({exc})")
        except Unreadable as exc:
            self.unreadable(exc, f"task {task_id} was neither checked nor changed")
            return NOT_READ, {}
        return None, {}

    def _rebuild(self, scope: Scope, task_id: str) -> None:
        task_dir = self.layout.task_dir(scope, task_id)
        try:
            read_json(task_dir / TASK_INDEX)
        except Corrupt:
            # repair_task compares with the current index.json and cannot parse a torn one.
            index = rebuild_index(self.tree, task_dir, task_id)
            if index is not None:
                write_json(task_dir / TASK_INDEX, index)
        self.store.repair_task(scope, task_id)
        self.store.txns.settle(Key(scope, task_id))

    def _task_locked(
        self, scope: Scope, task_id: str
    ) -> tuple[list[TurnRow] | None, dict[int, str]]:
        task_dir = self.layout.task_dir(scope, task_id)
        if not self.tree.is_dir(task_dir):
            return None, {}
        rel = self.rel(task_dir)
        rebuild = lambda: self._rebuild(scope, task_id)  # noqa: E731
        if self.store.txns.is_pending(Key(scope, task_id)):
            # Before anything collects temp files: the dead writer's kept copy of a committed
            # artifact (.~tmp-prev-*) is a temp file, and the rebuild puts it back in place.
            self.fault(f"{rel}: write in flight left by a writer that died", rebuild)
        records: list[TurnRecord] = []
        for entry in self.entries(task_dir):
            if self.common(entry, in_task=True):
                continue
            name = entry.name
            if name in (TASK_RECORD, TASK_INDEX) and entry.is_file:
                continue
            match = TURN_DIR_RE.fullmatch(name)
            if match and entry.is_dir:
                record = self.turn(task_id, int(match.group(1)), entry.path)
                if record is not None:
                    records.append(record)
            else:
                self.unindexed(entry.path)
        task_record = self.task_record(task_id, task_dir, records)
        if not records:
            self.unindexed(task_dir, "a task directory without any turn record")
            if self.repair:
                self._rebuild(scope, task_id)  # drop its listing rows
            return None, {}
        index = build_index(task_id, task_record, records)
        try:
            current = read_json(task_dir / TASK_INDEX)
        except Corrupt:
            current = "torn"
        if current != index:
            state = "missing" if current is None else "torn" if current == "torn" else "stale"
            self.fault(f"{rel}/{TASK_INDEX}: {state}, differs from a rebuild", rebuild)
        for record in records:
            turn_dir = task_dir / turn_dirname(record.turn)
            try:
                summary = self.layout.read_bytes(turn_dir / TURN_SUMMARY)
            except UnsafePath:
                continue  # a planted link, reported where the turn's entries were read
            if summary != record.summary_md.encode("utf-8"):
                self.fault(f"{self.rel(turn_dir)}/{TURN_SUMMARY}: differs from meta.json", rebuild)
        return index_rows(index), {r.turn: turn_search.turn_text(r).digest() for r in records}

    def task_record(
        self, task_id: str, task_dir: Path, records: list[TurnRecord]
    ) -> dict[str, object] | None:
        path = task_dir / TASK_RECORD
        try:
            record = read_task_record(task_dir)
        except UnsafePath:
            return None  # a planted link, reported with the task's entries; never read
        except Corrupt as exc:
            record, problem = None, f"{self.rel(path)}: torn ({exc})"
        else:
            if record is not None or not records:
                return record
            problem = f"{self.rel(path)}: missing"
        rebuilt = {
            "version": 1,
            "task_id": task_id,
            "owner": None,  # unknown: only admins may delete the task from now on
            "created_at": min(r.created_at for r in records) if records else "",
        }

        def fix() -> None:
            if self.tree.lstat(path) is not None:
                quarantine(self.tree, path)
            write_json(path, rebuilt)

        if records:
            rewritten = self.done("rewritten", "--repair rewrites it")
            self.fault(f"{problem}; {rewritten} from the turns with no owner", fix)
        return rebuilt if records else record

    def turn(self, task_id: str, turn: int, turn_dir: Path) -> TurnRecord | None:
        rel = self.rel(turn_dir)
        move = lambda: quarantine(self.tree, turn_dir)  # noqa: E731
        entries = self.entries(turn_dir)
        if any(e.name == TURN_META and e.is_link for e in entries):
            self.symlink(turn_dir / TURN_META)
            return None  # the turn cannot be checked until a person removes the link
        try:
            record = read_turn(turn_dir)
        except Corrupt as exc:
            moved = self.done("turn quarantined", "--repair quarantines the turn")
            self.fault(f"{rel}/{TURN_META}: cannot be rebuilt ({exc}); {moved}", move)
            return None
        if record is None:
            if self.only_temp_files(turn_dir):
                # A put_turn killed before its commit: nothing in it was ever acknowledged,
                # so there is nothing for a person to inspect in lost+found.
                self.fault(
                    f"{rel}: unfinished turn of a writer that died"
                    f" ({self.done('removed', '--repair removes it')})",
                    lambda: self.tree.remove(turn_dir),
                )
            else:
                self.unindexed(turn_dir, "a turn directory without meta.json")
            return None
        if record.turn != turn or record.task_id != task_id:
            self.fault(f"{rel}/{TURN_META}: names task {record.task_id} turn {record.turn}", move)
            return None
        try:
            check_turn_record(record, max_artifact_bytes=self.store.max_artifact_bytes)
        except InvalidName as exc:
            # Brought in by hand or by an older import: reported, never rewritten or moved (a
            # person decides what it should say); the rest is checked as for any record.
            self.fault(f"{rel}/{TURN_META}: {exc} (not a record the API would write)")
        files: dict[str, Path] = {}
        kept: dict[str, Path] = {}
        for entry in entries:
            if self.common(entry, in_task=True):
                continue
            if entry.name in (TURN_META, TURN_SUMMARY) and entry.is_file:
                continue
            if entry.name == ARTIFACTS_DIR and entry.is_dir:
                for art in self.entries(entry.path):
                    if art.name.startswith(PREV_PREFIX) and art.is_file and not art.is_link:
                        kept[art.name[len(PREV_PREFIX) :]] = art.path
                    elif self.common(art, in_task=True):
                        continue
                    elif entry_is_artifact(art):
                        files[art.name] = art.path
                    else:
                        self.unindexed(art.path)
                continue
            self.unindexed(entry.path)
        return self.artifacts(record, turn_dir, files, kept)

    def artifacts(
        self, record: TurnRecord, turn_dir: Path, files: dict[str, Path], kept: dict[str, Path]
    ) -> TurnRecord:
        """Check each artifact's bytes against meta.json. ``kept``: the previous copies an
        artifact replacement keeps until its commit; when the commit was lost (a kill, or a
        power cut that also took the journal slot saying a write was in flight) the file holds
        bytes never acknowledged and the kept copy the acknowledged ones, which go back."""
        bad: set[str] = set()
        for info in record.artifacts:
            path = files.pop(info.name, None)
            where = f"{self.rel(turn_dir)}/{ARTIFACTS_DIR}/{info.name}"
            wanted = (info.size, info.sha256)
            try:
                if path is not None and sha256_file(path) == wanted:
                    continue
                backup = kept.pop(info.name, None)
                restore = backup is not None and sha256_file(backup) == wanted
            except Unreadable as exc:
                self.unreadable(exc, "its entry and its bytes are kept as they are")
                continue
            if backup is not None and restore:
                target = turn_dir / ARTIFACTS_DIR / info.name
                self.fault(
                    f"{where}: bytes of a replacement never committed; the acknowledged copy "
                    "kept beside it is put back",
                    partial(_put_back, backup, target),
                )
                continue
            if path is None:
                dropped = self.done("entry dropped", "--repair drops the entry")
                self.fault(f"{where}: listed in meta.json but missing; {dropped}", lambda: None)
            else:
                moved = self.done("file quarantined", "--repair quarantines the file")
                self.fault(
                    f"{where}: size/sha256 differ from meta.json; {moved}",
                    partial(quarantine, self.tree, path),
                )
            bad.add(info.name)
        for backup in kept.values():
            self.temp(backup, in_task=True)
        for path in files.values():
            self.unindexed(path, "an artifact file meta.json does not list")
        if not bad or not self.repair:
            return record
        fixed = replace(record, artifacts=tuple(a for a in record.artifacts if a.name not in bad))
        write_json(turn_dir / TURN_META, turn_to_json(fixed))
        return fixed

    def rebuild_all(self, scope: Scope, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            self.task_rebuild(scope, task_id)

    def task_rebuild(self, scope: Scope, task_id: str) -> None:
        with self.task_locked(scope, task_id):
            self._rebuild(scope, task_id)

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
                        partial(self._rebuild, key.scope, key.id),
                    )

    def only_temp_files(self, directory: Path) -> bool:
        """True when ``directory`` holds nothing but temp files and empty directories."""
        for step in self.tree.walk(directory):
            for entry in step.entries:
                if entry.is_link or (not entry.is_dir and not entry.name.startswith(TMP_PREFIX)):
                    return False
        return True


def entry_is_artifact(entry: Entry) -> bool:
    try:
        validate_artifact_name(entry.name)
    except InvalidName:
        return False
    return entry.is_file


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


def _put_back(backup: Path, target: Path) -> None:
    os.replace(backup, target)
    fsync_dir(target.parent)


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
