"""fsck's part over each project's listing database: the listing rows, the digest a read
serves and the turns' search rows, each against what the records say (the walk of the
records is fsck.py's, which hands each task's rows and texts here as it reads them).

Every difference is confirmed again under the task's lock before it is reported (a writer may
have moved on since the walk looked), and repaired by rebuilding the task's derived rows from
its records, under the same lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import BinaryIO, Protocol

from app.storage.core import digest as digest_mod
from app.storage.core.errors import Corrupt, LockTimeout, Unreadable, UnsafePath
from app.storage.core.models import FsckReport
from app.storage.core.names import Scope
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.walk import Tree
from app.storage.tree.records import index_rows, read_turn, rebuild_index, turn_dirs
from app.storage.tree.sqlite import fts, turn_search
from app.storage.tree.sqlite.digestdb import BaseMismatch
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore


class Walk(Protocol):
    """What the listing checks need of fsck's walk (fsck.py ``_Fsck``): the tree, the task
    engine, the report and how a fault is recorded and repaired."""

    layout: Layout
    tree: Tree
    store: TaskStore
    report: FsckReport

    def rel(self, path: Path) -> str: ...

    def fault(self, message: str, fix: Callable[[], object] | None = None) -> bool: ...

    def note(self, message: str) -> None: ...

    def is_link(self, path: Path) -> bool: ...

    def task_locked(self, scope: Scope, task_id: str) -> AbstractContextManager[None]: ...

    def task_rebuild(self, scope: Scope, task_id: str) -> None: ...

    def rebuild_all(self, scope: Scope, task_ids: Iterable[str]) -> None: ...


class ListingCheck:
    """The listing, digest and search checks of one fsck run."""

    def __init__(self, check: Walk) -> None:
        self.check = check
        self.search_repaired = 0

    # -- project-level derived files ---------------------------------------------------------
    def open_listing(self, scope: Scope) -> Listing | None:
        """The project's listing, None when it is linked (reported with the project's
        entries; SQLite would follow it), absent or unreadable (reported here)."""
        path = self.check.layout.listing(scope)
        if self.check.is_link(path) or not path.exists():
            return None
        listing = self.check.store.listing(scope)
        try:
            listing.counts()
        except sqlite3.DatabaseError as exc:
            self.check.fault(
                f"{self.check.rel(path)}: unreadable ({exc}); stop the server and inspect it"
            )
            return None
        return listing

    def listing_task(
        self, scope: Scope, listing: Listing, task_id: str, want: list[TurnRow] | None
    ) -> None:
        want = want or None
        if (listing.task_rows(task_id) or None) == want:
            return
        self.listing_differs(scope, listing, task_id, want)

    def listing_differs(
        self, scope: Scope, listing: Listing, task_id: str, want: list[TurnRow] | None
    ) -> None:
        where = self.check.rel(listing.path)
        try:
            stale = self.confirm_stale(scope, listing, task_id, want)
        except (LockTimeout, UnsafePath) as exc:
            self.check.fault(f"{where}: task {task_id} listing not checked ({exc})")
            return
        if stale:
            self.check.fault(
                f"{where}: rows of task {task_id} differ from the records",
                partial(self.check.task_rebuild, scope, task_id),
            )

    def listing_rest(self, scope: Scope, listing: Listing, names: Iterable[str]) -> None:
        """Rows of tasks with no directory, aggregates, the task counter."""
        for task_id in absent_from(names, listing.task_ids()):
            self.listing_differs(scope, listing, task_id, None)
        where = self.check.rel(listing.path)
        for task_id in listing.stale_aggregates():  # one snapshot: a write moves them together
            self.check.fault(
                f"{where}: turn count or latest turn of task {task_id} differ from its turn rows",
                partial(self.check.task_rebuild, scope, task_id),
            )
        count, rows = listing.counts()
        if count != rows:
            self.check.fault(
                f"{where}: task counter is {count}, the index holds {rows}",
                listing.recount_tasks,
            )

    def confirm_stale(
        self, scope: Scope, listing: Listing, task_id: str, want: list[TurnRow] | None
    ) -> bool:
        """Re-read the task under its lock: a writer may have moved on since we looked."""
        with self.check.task_locked(scope, task_id):
            try:
                index = rebuild_index(
                    self.check.tree, self.check.layout.task_dir(scope, task_id), task_id
                )
                want = index_rows(index) if index else None
            except (Corrupt, FileNotFoundError):
                pass
            return (listing.task_rows(task_id) or None) != want

    def digest(self, scope: Scope, task_ids: Iterable[str]) -> None:
        """What a read serves against a render of the listing (checked against the records
        above) with each task's latest live turn read from its record, streamed side by side."""
        try:
            self._digest(scope, task_ids)
        except Unreadable:
            path = self.check.rel(self.check.layout.digest(scope))
            self.check.note(f"{path}: not checked, a record it shows cannot be read (above)")

    def _digest(self, scope: Scope, task_ids: Iterable[str]) -> None:
        path = self.check.layout.digest(scope)
        if self.check.is_link(path):
            return  # reported with the project's entries
        now_us = self.check.store.now_us()
        fix = partial(self.rebuild_digest, scope, task_ids)
        try:
            served = self.check.store.digests.view(scope)
        except sqlite3.DatabaseError:
            return  # reported by the listing check
        except BaseMismatch:
            self.check.fault(
                f"{self.check.rel(path)}: differs from the base the listing records (edited or replaced)",
                fix,
            )
            return
        if served is None:
            self.check.note(f"{self.check.rel(path)}: brought up to date on its next read")
            return
        file, _ = served
        listing = self.check.store.listing(scope)
        with file:
            same = same_bytes(
                file,
                digest_mod.render(
                    scope,
                    listing.digest_stream(now_us),
                    lambda task_id, turn: self.check.store.digests.record(
                        scope, task_id, turn, now_us
                    ),
                ),
            )
        if not same:
            self.check.fault(f"{self.check.rel(path)}: differs from a fresh render", fix)

    def rebuild_digest(self, scope: Scope, task_ids: Iterable[str]) -> None:
        """Every task's section from its records, then the base from them."""
        self.check.rebuild_all(scope, task_ids)
        self.check.store.rebuild_digest(scope)

    # -- the turns' search rows (tree/sqlite/turn_search.py) ------------------
    def search_ready(self, scope: Scope, listing: Listing) -> bool:
        """Whether the turns' search rows can be compared task by task: built, and passing
        FTS5's integrity check (else reported, and rebuilt whole from the records on repair,
        however damaged: fts.drop_table)."""
        where = self.check.rel(listing.path)
        try:
            marks = listing.search_upkeep()
            if marks.backfill and not marks.damaged:
                self.check.fault(
                    f"{where}: search index being filled from the records (a rebuild not finished)",
                    partial(self.search_fill, scope),
                )
                return False
            damage = listing.search_damage()
            if damage is not None:
                self.check.fault(
                    f"{where}: search index damaged ({damage})",
                    partial(self.search_rebuild, scope, listing, damage),
                )
                return False
            levels = listing.search_levels()
            if levels > fts.LEVEL_BOUND + 2:
                self.check.fault(
                    f"{where}: search index structure has {levels} levels (a purge keeps at"
                    f" most {fts.LEVEL_BOUND + 2})",
                    partial(self.search_write_purge, listing),
                )
            with listing.search_read() as conn:
                orphans = fts.orphans(conn)
        except sqlite3.DatabaseError:
            return False  # an unreadable listing: reported by the listing check
        if orphans:
            self.check.fault(
                f"{where}: {orphans} search row(s) belong to no turn",
                partial(self.search_write, listing, fts.drop_orphans),
            )
        if listing.purge_owed():  # the repairs above may have removed text
            self.check.fault(f"{where}: {fts.REMOVED_TEXT}", partial(self.purge, scope))
        self.search_repaired = len(self.check.report.repaired)
        return True

    def search_rebuild(self, scope: Scope, listing: Listing, damage: str) -> None:
        """Drop the index however damaged and fill it again from the records."""
        listing.mark_search_damaged(sqlite3.DatabaseError(damage))
        if self.check.store.rebuild_search(scope) is None and listing.search_upkeep().damaged:
            raise LockTimeout("another process is rebuilding it; try again")
        self.purge(scope)  # the dropped index leaves the WAL too

    def search_write_purge(self, listing: Listing) -> None:
        listing.purge_search()  # compacts an index past its bound (fts_purge.purge)

    def purge(self, scope: Scope) -> None:
        if not self.check.store.removals.purge(scope):
            raise LockTimeout("a reader still holds an old snapshot of it; try again")

    def search_task(
        self, scope: Scope, listing: Listing, task_id: str, want: dict[int, str]
    ) -> None:
        with listing.search_read() as conn:
            have = turn_search.digests(conn, task_id).get(task_id, {})
        if have != want:
            self.search_differs(scope, listing, task_id)

    def search_differs(self, scope: Scope, listing: Listing, task_id: str) -> None:
        where = self.check.rel(listing.path)
        try:
            stale = self.search_stale(scope, listing, task_id)
        except (LockTimeout, UnsafePath, Corrupt) as exc:
            self.check.fault(f"{where}: task {task_id} search rows not checked ({exc})")
            return
        if stale:
            self.check.fault(
                f"{where}: search rows of task {task_id} differ from the records",
                partial(self.check.task_rebuild, scope, task_id),
            )

    def search_rest(self, scope: Scope, listing: Listing, names: Iterable[str]) -> None:
        """Search rows of tasks with no directory; then what repairs removed leaves the file."""
        for task_id in absent_from(names, listing.search_task_ids()):
            self.search_differs(scope, listing, task_id)
        if len(self.check.report.repaired) > self.search_repaired:
            listing.purge_search()  # what the repair removed leaves the file too

    def search_stale(self, scope: Scope, listing: Listing, task_id: str) -> bool:
        """Compare again under the task's lock: a writer may have moved on since we looked."""
        with self.check.task_locked(scope, task_id):
            want = {}
            task_dir = self.check.layout.task_dir(scope, task_id)
            for turn, turn_dir in (
                turn_dirs(self.check.tree, task_dir) if self.check.tree.is_dir(task_dir) else []
            ):
                record = read_turn(turn_dir)
                if record is not None and record.turn == turn and record.task_id == task_id:
                    want[turn] = turn_search.turn_text(record).digest()
            with listing.search_read() as conn:
                have = turn_search.digests(conn, task_id).get(task_id, {})
            return have != want

    def search_write(self, listing: Listing, fix: Callable[[sqlite3.Connection], None]) -> None:
        with listing.search_write() as conn:
            fix(conn)

    def search_fill(self, scope: Scope) -> None:
        """Finish the fill of a rebuild a killed process left (TaskStore.rebuild_search)."""
        if self.check.store.rebuild_search(scope) is None:
            raise LockTimeout("another process is rebuilding it; try again")


def absent_from(names: Iterable[str], ids: Iterable[str]) -> Iterator[str]:
    """The ids of ``ids`` that ``names`` does not hold, both in sorted order (a directory's
    names as :meth:`Tree.sorted_subdir_names` gives them, a listing's ids as SQLite orders
    them: code point order and UTF-8 byte order agree), walked side by side."""
    found = iter(names)
    name = next(found, None)
    for task_id in ids:
        while name is not None and name < task_id:
            name = next(found, None)
        if name != task_id:
            yield task_id


def same_bytes(file: BinaryIO, chunks: Iterator[bytes]) -> bool:
    """Whether ``file`` holds exactly the concatenation of ``chunks`` (O(1) memory)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while len(pending) >= CHUNK:
            if file.read(CHUNK) != pending[:CHUNK]:
                return False
            pending = pending[CHUNK:]
    return file.read(len(pending) + 1) == pending


CHUNK = 1 << 16
