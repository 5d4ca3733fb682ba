"""What a project's listing and ledger hold, read from the records alone: how a listing whose
schema version is not this code's is rebuilt (tree/sqlite/listing.py, ``Listing._make``), and
how a ledger is made (tree/sqlite/ledger.py, ``Ledger._make``).

Every task directory of the project gives its listing rows, digest section, search text and
usage rows (``task.json`` and each turn's ``meta.json``, as fsck reads them), and every
memory store its usage row (its index's counters). Nothing is written but the listing, and
no lock is taken: the rebuild holds the listing's write lock, which each writer takes after
its record's commit (see listing.py). A task that cannot be read now (an I/O or permission
error, a planted link) is left out, and fsck reports it, as it reports any row that differs
from the records.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from app.storage.core import digest
from app.storage.core.clock import Clock, to_us
from app.storage.core.errors import StorageError
from app.storage.core.ledger import entry_of
from app.storage.core.names import STORE_ID_RE, Scope, is_id
from app.storage.core.records import turn_usage
from app.storage.tree.fs.layout import Layout
from app.storage.tree.records import index_of, index_rows, read_records
from app.storage.tree.sqlite import ledger as ledger_db, listing_sql, listing_usage
from app.storage.tree.sqlite.ledger import Ledger
from app.storage.tree.sqlite.listing import Fill, Listing
from app.storage.tree.sqlite.store_index import StoreIndex
from app.storage.tree.sqlite.turn_search import turn_text

log = logging.getLogger("app.storage")


def open_listing(
    layout: Layout, scope: Scope, *, timeout: float, clock: Clock, below: Path | None = None
) -> Listing:
    """The project's listing, rebuilt from its records if it is of another schema version;
    ``below``: the project dir, when the caller just checked it."""
    # SQLite follows symlinks: refuse a linked tenant/project dir or listing file here.
    path = layout.check_inside(layout.listing(scope), below=below)
    return Listing(
        path,
        timeout=timeout,
        fill=filler(layout, scope, clock, timeout),
        has_tasks=partial(_has_tasks, layout, scope),
    )


def _is_task_name(name: str) -> bool:
    return is_id(name) and not name.startswith((".", "_"))


def _task_names(layout: Layout, scope: Scope) -> Iterator[str]:
    """The names of the project's task directories, in sorted order."""
    return filter(_is_task_name, layout.tree.sorted_subdir_names(layout.project_dir(scope)))


def _has_tasks(layout: Layout, scope: Scope) -> bool:
    """Whether the project holds a task directory. A project directory that is or passes
    through a link is not entered (UnsafePath): a listing would be made through it."""
    try:
        return any(map(_is_task_name, layout.tree.subdir_names(layout.project_dir(scope))))
    except (StorageError, OSError):
        return False


def open_ledger(
    layout: Layout, scope: Scope, *, timeout: float, below: Path | None = None
) -> Ledger:
    """The project's ledger, made from its records when it is new or of another schema
    version; ``below``: the project dir, when the caller just checked it."""
    # SQLite follows symlinks: refuse a linked tenant/project dir or ledger file here.
    path = layout.check_inside(layout.ledger(scope), below=below)
    return Ledger(path, timeout=timeout, fill=partial(_fill_ledger, layout, scope))


def _fill_ledger(layout: Layout, scope: Scope, conn: sqlite3.Connection) -> int:
    """Every task's ledger entries from its records (a task that cannot be read now is left
    out, and fsck reports it)."""
    count = 0
    for name in _task_names(layout, scope):
        try:
            task_dir = layout.check_inside(layout.task_dir(scope, name))
            records = read_records(layout.tree, task_dir)
        except (StorageError, OSError) as exc:
            log.warning("%s/%s/%s: not in the ledger (%s)", scope.tenant, scope.project, name, exc)
            continue
        entries = [entry_of(r) for r in records if r.task_id == name]
        if entries:
            ledger_db.fill_entries(conn, entries)
            count += 1
    return count


def filler(layout: Layout, scope: Scope, clock: Clock, timeout: float) -> Fill:
    """The listing's ``fill``: every task's rows and every store's usage row, from the records
    (``clock``: which turns live, for the digest sections)."""

    def fill(conn: sqlite3.Connection) -> int:
        now_us = to_us(clock())
        count = 0
        for name in _task_names(layout, scope):
            if _fill_task(layout, scope, name, now_us, conn):
                count += 1
        _fill_stores(layout, scope, conn, timeout)
        return count

    return fill


def _fill_task(
    layout: Layout, scope: Scope, task_id: str, now_us: int, conn: sqlite3.Connection
) -> bool:
    """Write one task's rows as its records say; whether it has any."""
    try:
        task_dir = layout.check_inside(layout.task_dir(scope, task_id))
        records = read_records(layout.tree, task_dir)
        if not records:
            return False
        index = index_of(task_dir, task_id, records)
    except (StorageError, OSError) as exc:
        where = f"{scope.tenant}/{scope.project}/{task_id}"
        log.warning("%s: not in the rebuilt listing (%s)", where, exc)
        return False
    listing_sql.set_task(
        conn,
        task_id,
        index_rows(index),
        digest.live_section(task_id, index, now_us, {r.turn: r for r in records}.get),
        {r.turn: turn_text(r) for r in records},
        [turn_usage(r) for r in sorted(records, key=lambda r: r.turn)],
    )
    return True


def _fill_stores(layout: Layout, scope: Scope, conn: sqlite3.Connection, timeout: float) -> None:
    """Each memory store's usage row: its index's counters (a store's own writer copies them
    again after its next write)."""
    stores_dir = layout.stores_dir(scope)
    try:
        entries = layout.tree.entries(stores_dir)
    except (StorageError, OSError) as exc:
        log.warning("%s: no store usage in the rebuilt listing (%s)", stores_dir, exc)
        return
    for entry in entries:
        if entry.is_link or not entry.is_dir or not STORE_ID_RE.fullmatch(entry.name):
            continue
        path = layout.store_index(entry.path)
        if layout.tree.lstat(path) is None:
            continue
        try:
            with StoreIndex(layout.check_inside(path), timeout=timeout).read() as reader:
                usage = reader.store_usage()
        except (StorageError, OSError, sqlite3.Error) as exc:
            log.warning("%s: no usage row in the rebuilt listing (%s)", path, exc)
            continue
        listing_usage.set_store(conn, entry.name, usage)
