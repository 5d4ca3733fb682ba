"""Rebuilding a task's derived files from its records, and a project's search index from every
task's (TaskStore.repair_task, heal_search, rebuild_search).

A task's repair runs under its lock: by the next holder of the lock after a writer died
mid-write (tree/fs/txn.py), by fsck --repair, by a turn delete and by the retention sweep.
It removes what a write left before its commit point (nothing of it was acknowledged), then
writes ``summary.md``, ``index.json`` and the task's listing, search, usage and digest rows
and its ledger entries again from the turn records.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Protocol

from app.storage.core.digest import Section
from app.storage.core.errors import Corrupt, LockTimeout
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.models import TurnRecord
from app.storage.core.names import (
    ARTIFACTS_DIR,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
)
from app.storage.core.query import SearchBudget
from app.storage.core.records import turn_usage
from app.storage.core.usage import TurnUsage
from app.storage.tree.artifacts import reconcile_artifacts
from app.storage.tree.fs.atomic import write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.txn import Key, Transactions
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.records import (
    index_rows,
    read_json,
    read_turn,
    rebuild_index,
    turn_dirs,
    write_json,
)
from app.storage.tree.sqlite.listing import Listing
from app.storage.tree.sqlite.turn_search import TurnText, turn_text


class TaskRepairs(Protocol):
    """What the repairs need of the task engine (TaskStore): its paths, locks and listings,
    the digest section of a task, and the repair itself (which a test may replace)."""

    layout: Layout
    txns: Transactions

    def now_us(self) -> int: ...

    def listing(self, scope: Scope, *, below: Path | None = None) -> Listing: ...

    def ledger_task(
        self,
        scope: Scope,
        task_id: str,
        entries: list[LedgerTurn],
        *,
        below: Path | None = None,
        only_if_made: bool = False,
    ) -> None: ...

    def task_dir_checked(self, scope: Scope, task_id: str) -> Path: ...

    def section(
        self,
        scope: Scope,
        task_id: str,
        index: dict[str, Any],
        now_us: int,
        known: tuple[TurnRecord, ...] = (),
    ) -> Section | None: ...

    def repair_task(self, scope: Scope, task_id: str) -> None: ...

    def rebuild_search(self, scope: Scope) -> int | None: ...


def repair_task(store: TaskRepairs, scope: Scope, task_id: str) -> None:
    """Rebuild a task's derived files (summaries, index.json, listing and search rows) from
    its records. The caller holds the task lock."""
    layout = store.layout
    task_dir = store.task_dir_checked(scope, task_id)
    tree = layout.tree
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
        if tree.lstat(layout.listing(scope)) is not None:
            store.listing(scope).set_task(task_id, [])
        store.ledger_task(scope, task_id, [], only_if_made=True)
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
        if layout.read_bytes(turn_dir / TURN_SUMMARY) != summary:
            write_atomic(turn_dir / TURN_SUMMARY, summary, durable=False)
    try:
        current_index = read_json(task_dir / TASK_INDEX)
    except Corrupt:
        current_index = None
    if current_index != index:
        write_json(task_dir / TASK_INDEX, index, durable=False)
    section = store.section(scope, task_id, index, store.now_us(), tuple(records))
    store.listing(scope).set_task(task_id, index_rows(index), section, texts, usage)
    store.ledger_task(scope, task_id, [entry_of(r) for r in records])


def heal_search(store: TaskRepairs, scope: Scope, budget: SearchBudget | None = None) -> int | None:
    """Rebuild the project's search index from the records if it is marked damaged, does
    not open (or, with ``budget``, fails FTS5's integrity check within it: a check that
    runs out of it raises SearchTimeout), or has a rebuild to finish. Return how many
    tasks the rebuild filled; None when nothing was done."""
    if store.layout.tree.lstat(store.layout.listing(scope)) is None:
        return None
    listing = store.listing(scope)
    marks = listing.search_upkeep()
    if not (marks.damaged or marks.backfill):
        why = listing.search_opens() if budget is None else listing.search_damage(budget)
        if why is None:
            return None
        listing.mark_search_damaged(sqlite3.DatabaseError(why))
    return store.rebuild_search(scope)


def rebuild_search(store: TaskRepairs, scope: Scope) -> int | None:
    """Rebuild the project's search index from the records when it is marked damaged,
    or finish a rebuild a killed process left: the index is dropped and started empty,
    then every task's rows are written again from its records under its lock, while
    writes go on (each writes its own rows into the new index). Searches answer 503
    until it is full (fts.stats). One process at a time rebuilds a project's index (its
    search lock); return how many tasks it filled, None when there was nothing to do or
    another process is at it."""
    lock = store.layout.check_inside(store.layout.search_lock(scope))
    try:
        with locked(lock, 0.0):
            listing = store.listing(scope)
            token = listing.start_search_rebuild()
            if token is None:
                return None
            count = _repair_tasks(store, scope, listing)
            listing.search_filled(token)
            # The dropped index's pages were zeroed; their old images leave the WAL.
            listing.purge_search()
            return count
    except LockTimeout:
        return None


def _repair_tasks(store: TaskRepairs, scope: Scope, listing: Listing, batch: int = 500) -> int:
    """repair_task of every task the listing holds, one task lock at a time, reading
    their ids in short reads (no snapshot held across the walk)."""
    count, after = 0, ""
    while task_ids := listing.task_id_page(after, batch):
        for task_id in task_ids:
            with store.txns.locked(Key(scope, task_id)):
                store.repair_task(scope, task_id)
        count += len(task_ids)
        after = task_ids[-1]
    return count


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
