"""How removed text leaves a search index's database file, and how the index stays within
FTS5's limits: the purge and the compaction of the FTS5 tables tree/sqlite/fts.py lays out.

**Removed text leaves the file.** Deleting an FTS5 row removes it from every match at once,
but FTS5 (SQLite 3.40 here; its ``secure-delete`` option needs 3.42) only records the
deletion: the words stay in the index's older segments until those are merged, and SQLite
leaves freed bytes in the file and old page images in the WAL. So:

* every connection runs with ``PRAGMA secure_delete=ON`` (tree/sqlite/db.py): deleted
  rows and freed pages are overwritten with zeros;
* :func:`purge` merges every segment the index has into one, which drops every deleted
  entry, then checkpoints the WAL with TRUNCATE, so no page image with the old bytes stays
  in the WAL either. Deletes purge at once; a replaced text is counted as 'pending' and the
  next retention sweep purges it.

Both marks are cleared only once a TRUNCATE checkpoint succeeded after the last merge step,
by the count the purge saw then (a removal made meanwhile keeps its mark): a reader holding
an old snapshot stops the truncation, and its purge is tried again by the next write, the
sweep and fsck --repair, which also reports an 'owed' purge as text that should be gone.

**A bounded structure.** FTS5 keeps its segments in levels, listed in one structure record.
A full merge of segments that lie on different levels (any write since the last purge puts
one on level 0) moves them all to a new level above the others and writes the result one
higher still: two more levels, empty below, which FTS5 never takes back. SQLite 3.40 reads a
structure of at most 2,000 levels; past that every statement on the table fails ("database
disk image is malformed"), and the table no longer opens. (Newer FTS5 caps the count at 64.)
So:

* a purge starts its merge with one step of 'merge' with a negative page count (all
  segments into one merge) and finishes it with positive ones, which carry on the merge
  under way instead of starting another: writers that commit between two steps cannot make
  a purge add more than two levels, nor keep it from ending;
* a purge that finds more than :data:`LEVEL_BOUND` levels compacts the index instead: it
  copies the rows into a fresh table in short write transactions (a writer mirrors its
  change into the copy once the copy is past its row), puts the copy in the old table's
  place in one short transaction (the old one is dropped: its pages are zeroed) and merges
  it. Between two purges an index has at most LEVEL_BOUND + 2 levels.
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import sqlite3
import time

from app.storage.tree.sqlite.db import is_busy, write_txn
from app.storage.tree.sqlite.fts import (
    LEVEL_BOUND,
    NEXT,
    STATE,
    TEXT,
    compaction_copied,
    create_text,
    drop_table,
    levels,
    mark_damaged,
    passes_through,
    set_state,
    state,
)

# Pages one merge step may write (4 KiB each): ~10 ms of work per short write transaction.
PURGE_STEP_PAGES = 256
# Rows a compaction copies per write transaction (a few milliseconds each), fewer when they
# hold more than COPY_CHARS of text (a summary may be a megabyte).
COPY_ROWS = 200
COPY_CHARS = 4 << 20
_SETTLE = f"UPDATE {STATE} SET value = max(0, value - ?) WHERE name = ?"


def compaction_due(conn: sqlite3.Connection) -> bool:
    """Whether a compaction is under way, or the structure has more than LEVEL_BOUND levels."""
    return compaction_copied(conn) is not None or levels(conn) > LEVEL_BOUND


def _merge(conn: sqlite3.Connection, what: str) -> tuple[int, int]:
    """Merge every segment the index has into one, in short write transactions; the marks
    ('pending', 'owed') as the last step saw them."""
    seen = (0, 0)
    pages = -PURGE_STEP_PAGES  # the first step starts the merge of every segment
    while True:
        with write_txn(conn, what):
            before = conn.total_changes
            conn.execute(f"INSERT INTO {TEXT} ({TEXT}, rank) VALUES ('merge', ?)", (pages,))
            # A merge that found nothing to do changes (almost) nothing: FTS5's documented test.
            done = conn.total_changes - before < 2
            if done:
                seen = (state(conn, "pending"), state(conn, "owed"))
        if done:
            return seen
        # Carry on the merge under way: another negative step would start a new one over the
        # segments writers added since, two more levels each time, and might never end.
        pages = PURGE_STEP_PAGES


def compact(conn: sqlite3.Connection, what: str, columns: str) -> None:
    """Copy the index into a fresh table, :data:`COPY_ROWS` rows (or :data:`COPY_CHARS` of
    text) per write transaction, then put the copy in its place: its structure starts again
    with a few levels. Resumes a compaction a killed process left; another process may share
    the copying."""
    parts = [c.strip() for c in columns.split(",")]
    names = ", ".join(parts)
    marks = ", ".join("?" * (len(parts) + 1))
    with write_txn(conn, what):
        if compaction_copied(conn) is None:
            drop_table(conn, NEXT)  # a copy no compaction owns (it cannot be trusted)
            create_text(conn, NEXT, columns)
            set_state(conn, "copied", 0)
    while True:
        with write_txn(conn, what):
            copied = compaction_copied(conn)
            if copied is None:
                return  # another process put its copy in place meanwhile
            rows, size = [], 0
            cursor = conn.execute(
                f"SELECT rowid, {names} FROM {TEXT} WHERE rowid > ? ORDER BY rowid", (copied,)
            )
            for row in cursor:
                rows.append(row)
                size += sum(len(v) for v in row[1:] if isinstance(v, str))
                if len(rows) >= COPY_ROWS or size >= COPY_CHARS:
                    break
            cursor.close()
            if not rows:
                drop_table(conn, TEXT)
                conn.execute(f"ALTER TABLE {NEXT} RENAME TO {TEXT}")
                conn.execute(f"DELETE FROM {STATE} WHERE name = 'copied'")
                return
            conn.executemany(f"INSERT INTO {NEXT} (rowid, {names}) VALUES ({marks})", rows)
            set_state(conn, "copied", int(rows[-1][0]))


def purge(
    conn: sqlite3.Connection,
    what: str,
    columns: str,
    *,
    only_pending: bool = False,
    patience: float = 1.0,
) -> bool:
    """Merge the index until no removed entry is left in it (compacting it first when its
    structure has grown past LEVEL_BOUND levels), then empty the WAL.

    Each step is its own short write transaction. Returns whether the WAL could be
    truncated; the marks are cleared only then (a reader holding an old snapshot for longer
    than ``patience`` stops it, and the next purge tries again).
    """
    try:
        due = compaction_due(conn)
        if only_pending and not (due or state(conn, "pending") or state(conn, "owed")):
            return True
        if due:
            compact(conn, what, columns)
        seen = _merge(conn, what)
    except sqlite3.DatabaseError as exc:
        if passes_through(exc, conn):
            raise
        mark_damaged(conn, what, exc)
        raise
    if not checkpoint(conn, patience=patience):
        return False
    if any(seen):
        # Only now is none of the text removed before the last merge step in the file or
        # the WAL. This write holds no text; the WAL it leaves is emptied when it can be.
        with write_txn(conn, what):
            conn.execute(_SETTLE, (seen[0], "pending"))
            conn.execute(_SETTLE, (seen[1], "owed"))
        checkpoint(conn, patience=0.0)
    return True


def checkpoint(conn: sqlite3.Connection, *, patience: float = 1.0) -> bool:
    """Copy the WAL into the database and truncate it to zero bytes; True when it did.

    A TRUNCATE checkpoint that waits on the busy handler holds the writer lock while it waits
    for readers of an older snapshot: a reader of this process that then writes (a digest
    compaction streams its rows while it inserts) would wait on it until both time out. So
    each attempt does not wait, and writers run between attempts, for up to ``patience``
    seconds.
    """
    (before,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute("PRAGMA busy_timeout = 0")
    deadline = time.monotonic() + patience
    try:
        while True:
            try:
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                busy = 1
            if not busy:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(before)}")
