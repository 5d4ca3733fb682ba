"""The retention sweep: free the disk of turns past their ``retain_until``.

Every read already hides an expired turn; the sweep only reclaims the space, so it may run
late or be killed at any point without anyone seeing a difference:

* candidates come from the listing index (turn rows with ``retain_until_us <= now``), but
  the decision is taken again from ``meta.json`` under the task lock writers take, so a
  turn re-written just before its deadline survives;
* a turn (or a task whose turns are all gone) leaves by one rename into ``<root>/.trash/``,
  the derived files are rebuilt, and only then is the trash emptied, outside the lock;
  a sweep killed in between leaves its write in flight (repaired by the next lock holder) and
  trash that the next sweep empties first;
* two sweeps at once serialize on each task lock and the loser finds nothing left to do;
* temp files and leftovers of writes that died (a turn directory without ``meta.json``, an
  artifact file ``meta.json`` does not list, a task without records) go once they are older
  than ``grace``, so nothing a write in flight still needs is touched;
* lock files are never deleted.

``now`` is a parameter: tests and ``flask sweep --now`` control time without patching.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

from app.storage.core.clock import iso_us, parse_iso_us, to_us
from app.storage.core.errors import Corrupt, StorageError, UnsafePath
from app.storage.core.models import DEFAULT_GRACE
from app.storage.core.names import (
    ARTIFACTS_DIR,
    PROJECT_LISTING,
    TMP_PREFIX,
    TRASH_SNAPSHOT,
    TURN_DIR_RE,
    TURN_META,
    Scope,
    is_id,
)
from app.storage.core.sweep import ProjectSweep, SweepReport
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.txn import Key
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.fsck import age_seconds, trash_age_seconds
from app.storage.tree.fsck_tasks import entry_is_artifact
from app.storage.tree.records import read_turn, turn_dirs
from app.storage.tree.tasks import TaskStore


def project_dirs(tree: Tree, links: list[Path]) -> Iterator[Scope]:
    """Every tenant/project directory, in name order; links met on the way go to ``links``."""
    for tenant in _dirs(tree, tree.root, links):
        for project in _dirs(tree, tenant.path, links):
            yield Scope(tenant.name, project.name)


def _dirs(tree: Tree, directory: Path, links: list[Path]) -> Iterator[Entry]:
    """The id-named subdirectories of ``directory``; id-named links go to ``links``."""
    for entry in tree.entries(directory):
        if not is_id(entry.name):
            continue
        if entry.is_link:
            links.append(entry.path)
        elif entry.is_dir:
            yield entry


class _Sweep:
    def __init__(self, store: TaskStore, now_us: int, dry_run: bool, grace: float) -> None:
        self.store = store
        self.layout = store.layout
        self.tree = store.layout.tree
        self.now_us = now_us
        self.dry_run = dry_run
        self.grace = grace
        self.wall_now = time.time()
        self.temp_files = 0
        self.leftovers = 0
        self.leftover_bytes = 0
        self.errors: list[str] = []
        self.links: list[Path] = []

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.layout.root))

    def error(self, where: Path, exc: BaseException) -> None:
        self.errors.append(f"{self.rel(where)}: {exc}")

    # -- expired turns -----------------------------------------------------------------------
    def expired(self, task_dir: Path) -> tuple[list[Path], int]:
        """The expired turn directories of a task and how many live (or unreadable) remain."""
        gone: list[Path] = []
        # A turn directory swapped for a link is reported and counts as remaining: the task
        # is never removed around something a person has to look at.
        links = [e.path for e in self.tree.entries(task_dir) if e.is_link]
        self.links += links
        remaining = len(links)
        for _, turn_dir in turn_dirs(self.tree, task_dir):
            try:
                record = read_turn(turn_dir)
            except (Corrupt, UnsafePath):
                remaining += 1  # fsck reports it; never delete what we cannot read
                continue
            if record is None:
                continue  # no commit point: a leftover, handled with the grace period
            if parse_iso_us(record.retain_until) <= self.now_us:
                gone.append(turn_dir)
            else:
                remaining += 1
        return gone, remaining

    def task(self, scope: Scope, task_id: str) -> tuple[int, int, int]:
        """Sweep one task; return (turns, tasks, bytes) removed."""
        task_dir = self.layout.task_dir(scope, task_id)
        if self.dry_run:
            if not self.tree.is_dir(task_dir):
                return 0, 0, 0
            gone, remaining = self.expired(task_dir)
            size = sum(self.tree.size(d) for d in gone)
            if gone and not remaining:
                return len(gone), 1, self.tree.size(task_dir)
            return len(gone), 0, size
        trashed: list[Path] = []
        result = self.task_locked(scope, task_id, task_dir, trashed)
        # Emptied outside the lock, and only after the derived files were rebuilt; if we die
        # first, the entries wait in the trash for the next sweep.
        for path in trashed:
            self.tree.remove(path)
        return result

    def task_locked(
        self, scope: Scope, task_id: str, task_dir: Path, trashed: list[Path]
    ) -> tuple[int, int, int]:
        with self.store.transaction(scope, task_id) as txn:
            if not self.tree.is_dir(task_dir):
                # A listing row without a task: bring the listing back to the records.
                txn.begin()
                self.store.repair_task(scope, task_id)
                return 0, 0, 0
            # Re-checked here, under the writers' lock: a rewrite may have moved the deadline.
            gone, remaining = self.expired(task_dir)
            if not gone:
                # The listing named it but the records say otherwise (a rewrite won the
                # race, or the listing lags): bring the listing back to the records.
                txn.begin()
                self.store.repair_task(scope, task_id)
                return 0, 0, 0
            txn.begin()
            if not remaining:
                size = self.tree.size(task_dir)
                trashed.append(self.store.trash(task_dir))
                self.store.listing(scope).set_task(task_id, [])
                self.store.ledger_task(scope, task_id, [], only_if_made=True)
                return len(gone), 1, size
            size = 0
            for turn_dir in gone:
                size += self.tree.size(turn_dir)
                trashed.append(self.store.trash(turn_dir))
            self.store.repair_task(scope, task_id)
            return len(gone), 0, size

    def project(self, scope: Scope, batch: int) -> ProjectSweep:
        turns = tasks = size = 0
        project_dir = self.layout.project_dir(scope)
        try:
            for task_id in self.candidates(scope, batch):
                try:
                    t, k, b = self.task(scope, task_id)
                except (StorageError, OSError) as exc:
                    self.error(project_dir / task_id, exc)
                    continue
                turns, tasks, size = turns + t, tasks + k, size + b
        except (sqlite3.Error, StorageError) as exc:
            # A listing index that cannot be read (or a linked one): fsck reports it; other
            # projects go on.
            self.error(project_dir / PROJECT_LISTING, exc)
        if not self.dry_run:
            try:  # the file a person reads catches up with the writes (a no-op when idle)
                self.store.compact_digest(scope)
            except (StorageError, OSError) as exc:
                self.error(project_dir, exc)
        if not self.dry_run:
            self.purge_search(scope)
        return ProjectSweep(scope.tenant, scope.project, turns, tasks, size)

    def purge_search(self, scope: Scope) -> None:
        """Expired, deleted and replaced text leaves the search index's file (fts.py); an
        index that is damaged is rebuilt from the records, one grown past its bound is
        compacted (TaskRemovals.purge)."""
        listing_path = self.layout.project_dir(scope) / PROJECT_LISTING
        if self.tree.lstat(listing_path) is None:
            return
        try:
            if not self.store.removals.purge(scope, only_pending=True):
                self.error(listing_path, StorageError("WAL not truncated: a reader held it"))
        except (sqlite3.Error, StorageError) as exc:
            self.error(listing_path, exc)

    def candidates(self, scope: Scope, batch: int) -> Iterator[str]:
        project_dir = self.layout.project_dir(scope)
        if self.dry_run:
            # Opening the SQLite index would create its -wal/-shm files; a dry run changes
            # nothing, so it reads the records instead.
            for entry in _dirs(self.tree, project_dir, self.links):
                yield entry.name
            return
        if self.tree.lstat(project_dir / PROJECT_LISTING) is None:
            return
        listing = self.store.listing(scope)
        after = ""
        while True:
            ids = listing.expired_task_ids(now_us=self.now_us, limit=batch, after=after)
            yield from ids
            if len(ids) < batch:
                return
            after = ids[-1]

    # -- trash and leftovers -----------------------------------------------------------------
    def trash(self) -> int:
        """Empty the trash a killed sweep (or delete) left behind."""

        def young(path: Path) -> bool:
            # A deletion in progress, or an export's snapshot in use.
            return trash_age_seconds(self.tree, path, self.wall_now) < self.grace

        count, links = empty_trash(self.layout, keep=young, dry_run=self.dry_run)
        self.links += links
        return count

    def stale(self, path: Path) -> bool:
        return age_seconds(self.tree, path, self.wall_now) >= self.grace

    def drop(self, path: Path, *, temp: bool) -> None:
        if temp:
            self.temp_files += 1
        else:
            self.leftovers += 1
        self.leftover_bytes += self.tree.size(path)
        if not self.dry_run:
            self.tree.remove(path)

    def temps(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.name.startswith(TMP_PREFIX) and not entry.is_link and self.stale(entry.path):
                self.drop(entry.path, temp=True)

    def leftovers_pass(self) -> None:
        root = self.layout.root
        self.temps(self.tree.entries(root))
        for tenant in _dirs(self.tree, root, self.links):
            self.temps(self.tree.entries(tenant.path))
            for project in _dirs(self.tree, tenant.path, self.links):
                scope = Scope(tenant.name, project.name)
                entries = self.tree.entries(project.path)
                self.temps(entries)
                for task in entries:
                    if not is_id(task.name):
                        continue
                    if task.is_link:
                        self.links.append(task.path)
                        continue
                    if not task.is_dir:
                        continue
                    try:
                        self.task_leftovers(scope, task.name, task.path)
                    except (StorageError, OSError) as exc:
                        self.error(task.path, exc)

    def task_leftovers(self, scope: Scope, task_id: str, task_dir: Path) -> None:
        if not self.find_leftovers(task_dir):
            return
        if self.dry_run:
            for path, temp in self.find_leftovers(task_dir):
                self.drop(path, temp=temp)
            return
        # Taking the lock repairs a write a dead writer left in flight first: its kept copy
        # of a committed artifact is a temp file, which the repair puts back in place.
        with self.store.txns.locked(Key(scope, task_id)):
            # Found without the lock; decided again with it, where no write is half-done.
            for path, temp in self.find_leftovers(task_dir, report=False):
                self.drop(path, temp=temp)
            if self.tree.lstat(task_dir) is None:
                self.store.repair_task(scope, task_id)  # drop its listing rows, if any

    def find_leftovers(self, task_dir: Path, *, report: bool = True) -> list[tuple[Path, bool]]:
        """Stale leftovers of a task; links found are recorded (once) and never entered."""
        links: list[Path] = []
        try:
            entries = self.tree.entries(task_dir)
        except UnsafePath:
            return []  # the task directory was swapped for a link since it was listed
        turns = [e for e in entries if TURN_DIR_RE.fullmatch(e.name)]
        links += [e.path for e in turns if e.is_link]
        turn_dirs = [e.path for e in turns if e.is_dir]
        if not turn_dirs and not links:
            # No turn at all: a write died before its first commit point.
            found = [(task_dir, False)]
        else:
            found = [
                (e.path, True) for e in entries if e.name.startswith(TMP_PREFIX) and not e.is_link
            ]
            for turn_dir in turn_dirs:
                found += self.turn_leftovers(turn_dir, links)
        if report:
            self.links += links
        return [(path, temp) for path, temp in found if self.stale(path)]

    def turn_leftovers(self, turn_dir: Path, links: list[Path]) -> list[tuple[Path, bool]]:
        # Runs over every turn at every sweep: list, and parse meta.json only for a turn
        # whose artifacts directory holds something.
        entries = {e.name: e for e in self.tree.entries(turn_dir)}
        meta = entries.get(TURN_META)
        if meta is None:
            return [(turn_dir, False)]
        links += [e.path for e in entries.values() if e.is_link]
        if meta.is_link:
            return []  # cannot tell what the turn lists: leave it all to a person
        found = [
            (e.path, True)
            for e in entries.values()
            if e.name.startswith(TMP_PREFIX) and not e.is_link
        ]
        artifacts = entries.get(ARTIFACTS_DIR)
        if artifacts is None or not artifacts.is_dir:
            return found
        arts = self.tree.entries(artifacts.path)
        links += [e.path for e in arts if e.is_link]
        found += [(e.path, True) for e in arts if e.name.startswith(TMP_PREFIX) and not e.is_link]
        files = [e for e in arts if entry_is_artifact(e)]
        if not files:
            return found
        try:
            record = read_turn(turn_dir)
        except (Corrupt, UnsafePath):
            return found  # fsck's job
        listed = {a.name for a in record.artifacts} if record else set()
        return found + [(e.path, False) for e in files if e.name not in listed]


def empty_trash(
    layout: Layout, *, keep: Callable[[Path], bool], dry_run: bool = False
) -> tuple[int, list[Path]]:
    """Remove every entry of the trash but those ``keep`` names (and links, which are never
    followed nor removed: a person put them there); how many went (or would go), and the
    links found."""
    tree = layout.tree
    try:
        entries = tree.entries(layout.trash_dir())
    except UnsafePath:
        return 0, [layout.trash_dir()]
    count, links = 0, []
    for entry in entries:
        if entry.is_link:
            links.append(entry.path)
            continue
        if keep(entry.path):
            continue
        count += 1
        if not dry_run:
            tree.remove(entry.path)
    return count, links


def empty_trash_at_start(
    layout: Layout, grace: timedelta = DEFAULT_GRACE
) -> tuple[int, list[Path]]:
    """Empty the trash when a server starts (it holds the root lock, and none of its
    processes is deleting yet): what is there is a deletion a killed process did not finish,
    or an export's snapshot. An export may run beside the server, so a snapshot younger than
    ``grace`` is kept for the sweeper."""
    tree, wall_now = layout.tree, time.time()

    def in_use(path: Path) -> bool:
        snapshot = path.name.partition("-")[2].startswith(TRASH_SNAPSHOT)  # <ULID>-snapshot-
        return snapshot and trash_age_seconds(tree, path, wall_now) < grace.total_seconds()

    return empty_trash(layout, keep=in_use)


def sweep(
    store: TaskStore,
    *,
    now: datetime,
    dry_run: bool = False,
    grace: timedelta = DEFAULT_GRACE,
    batch: int = 100,
) -> SweepReport:
    """Delete every turn expired at ``now`` and every stale leftover; report what went."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    now_us = to_us(now)
    run = _Sweep(store, now_us, dry_run, grace.total_seconds())
    trash_entries = run.trash()
    projects = []
    for scope in list(project_dirs(store.layout.tree, [])):
        result = run.project(scope, batch)
        if result.turns or result.tasks:
            projects.append(result)
    run.leftovers_pass()  # records the tenant and project links project_dirs skipped
    # Trash of this run was emptied task by task; a racing delete's may remain until next time.
    return SweepReport(
        now=iso_us(now_us),
        dry_run=dry_run,
        projects=tuple(projects),
        temp_files=run.temp_files,
        leftovers=run.leftovers,
        leftover_bytes=run.leftover_bytes,
        trash_entries=trash_entries,
        errors=tuple(run.errors),
        links=tuple(sorted({run.rel(p) for p in run.links})),
    )
