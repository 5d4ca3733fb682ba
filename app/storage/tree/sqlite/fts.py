"""What the two search indexes share: an FTS5 table beside the rows it belongs to, how removed
text leaves the database file, and bm25's inverse document frequency.

Each index (the turns' in a project's listing, the memories' in each store's index) has::

    search_docs   doc INTEGER PRIMARY KEY -> what the text belongs to (a turn, a memory)
    search_text   FTS5 (rowid = doc): the searchable text, stored, so snippets need no file
    search_state  name -> value: 'pending' (text removed since the last purge), 'backfill'

**Removed text leaves the file.** Deleting an FTS5 row removes it from every match at once,
but FTS5 (SQLite 3.40 here; its ``secure-delete`` option needs 3.42) only records the
deletion: the words stay in the index's older segments until those are merged, and SQLite
leaves freed bytes in the file and old page images in the WAL. So:

* every connection runs with ``PRAGMA secure_delete=ON`` (tree/sqlite/db.py): deleted
  rows and freed pages are overwritten with zeros;
* :func:`purge` merges the index into one segment ('merge' with a negative page budget, in
  short transactions so writers are never held up for long), which drops every deleted
  entry, then checkpoints the WAL with TRUNCATE, so no page image with the old bytes stays
  in the WAL either. Deletes purge at once; a replaced text is counted as 'pending' and
  the next retention sweep purges it.

The filesystem's free blocks are not wiped (as for any file the service removes).
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable

from app.storage.core.query import SNIPPET_TOKENS, Sentinels
from app.storage.tree.sqlite.db import is_busy, write_txn

DOCS = "search_docs"
TEXT = "search_text"
STATE = "search_state"
TOKENIZER = "unicode61 remove_diacritics 2"
# Pages one merge step may write (4 KiB each): ~10 ms of work per short write transaction.
PURGE_STEP_PAGES = 256
STATE_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {STATE} (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
    " WITHOUT ROWID"
)
_MERGE = f"INSERT INTO {TEXT} ({TEXT}, rank) VALUES ('merge', ?)"
_REBUILD = f"INSERT INTO {TEXT} ({TEXT}) VALUES ('rebuild')"
_INTEGRITY = f"INSERT INTO {TEXT} ({TEXT}) VALUES ('integrity-check')"
_SET = f"INSERT OR REPLACE INTO {STATE} VALUES (?, ?)"
_GET = f"SELECT value FROM {STATE} WHERE name = ?"
_BUMP = f"UPDATE {STATE} SET value = value + 1 WHERE name = 'pending'"


def has_schema(conn: sqlite3.Connection) -> bool:
    """Whether this database has its search tables (``search_state`` is created last)."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (STATE,))
    return row.fetchone() is not None


def create_schema(conn: sqlite3.Connection, docs: str, columns: str, *, backfill: bool) -> None:
    """Create the three tables (inside the caller's write transaction)."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {DOCS} ({docs})")
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {TEXT} USING fts5({columns}, tokenize = '{TOKENIZER}')"
    )
    conn.execute(STATE_SCHEMA)
    conn.execute(_SET, ("pending", 0))
    conn.execute(_SET, ("backfill", int(backfill)))


def state(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(_GET, (name,)).fetchone()
    return 0 if row is None else int(row[0])


def set_state(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute(_SET, (name, value))


def removed(conn: sqlite3.Connection) -> None:
    """Count text removed from the index (inside the write transaction that removed it)."""
    conn.execute(_BUMP)


def delete_doc(conn: sqlite3.Connection, doc: int) -> None:
    conn.execute(f"DELETE FROM {TEXT} WHERE rowid = ?", (doc,))
    conn.execute(f"DELETE FROM {DOCS} WHERE doc = ?", (doc,))
    removed(conn)


def recreate(conn: sqlite3.Connection, columns: str) -> None:
    """Drop every row and the index itself, however damaged, and start an empty one (its
    freed pages are zeroed; the caller purges the WAL)."""
    conn.execute(f"DROP TABLE IF EXISTS {TEXT}")
    conn.execute(f"DELETE FROM {DOCS}")
    conn.execute(f"CREATE VIRTUAL TABLE {TEXT} USING fts5({columns}, tokenize = '{TOKENIZER}')")
    removed(conn)


def purge(conn: sqlite3.Connection, what: str, *, only_pending: bool = False) -> bool:
    """Merge the index until no removed entry is left in it, then empty the WAL.

    Each merge step is its own short write transaction. Returns whether the WAL could be
    truncated (a reader holding an old snapshot for longer than the busy timeout stops it;
    the next purge tries again, since 'pending' is cleared only with the last step).
    """
    if only_pending and not state(conn, "pending"):
        return True
    while True:
        with write_txn(conn, what):
            before = conn.total_changes
            conn.execute(_MERGE, (-PURGE_STEP_PAGES,))
            # A merge that found nothing to do changes (almost) nothing: FTS5's documented test.
            done = conn.total_changes - before < 2
            if done:
                set_state(conn, "pending", 0)
        if done:
            break
    return checkpoint(conn)


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


def damage(conn: sqlite3.Connection) -> str | None:
    """What FTS5's integrity check says of the index (None: it matches its stored text)."""
    try:
        conn.execute(_INTEGRITY)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None


def rebuild_index(conn: sqlite3.Connection) -> None:
    """Rebuild the FTS5 index from its stored text (inside a write transaction)."""
    conn.execute(_REBUILD)
    removed(conn)


def orphans(conn: sqlite3.Connection) -> int:
    """Index rows no ``search_docs`` row owns, plus owners without an index row."""
    (count,) = conn.execute(
        f"SELECT (SELECT count(*) FROM {TEXT} WHERE rowid NOT IN (SELECT doc FROM {DOCS}))"
        f" + (SELECT count(*) FROM {DOCS} WHERE doc NOT IN (SELECT rowid FROM {TEXT}))"
    ).fetchone()
    return int(count)


def drop_orphans(conn: sqlite3.Connection) -> None:
    conn.execute(f"DELETE FROM {TEXT} WHERE rowid NOT IN (SELECT doc FROM {DOCS})")
    conn.execute(f"DELETE FROM {DOCS} WHERE doc NOT IN (SELECT rowid FROM {TEXT})")
    removed(conn)


# -- queries ---------------------------------------------------------------------------------
def stats(conn: sqlite3.Connection, terms: list[str]) -> tuple[int, list[int]] | None:
    """The number of indexed rows, and of rows each term (an FTS5 expression) matches: what
    bm25 computes its inverse document frequencies from. None when the index is waiting for
    its backfill (or has no tables yet). One statement: a search asks this of every store."""
    counts = f", (SELECT count(*) FROM {TEXT} WHERE {TEXT} MATCH ?)" * len(terms)
    try:
        backfill, rows, *found = conn.execute(
            f"SELECT (SELECT value FROM {STATE} WHERE name = 'backfill'),"
            f" (SELECT count(*) FROM {DOCS}){counts}",
            terms,
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if backfill else (int(rows), [int(c) for c in found])


def idf(rows: int, hits: int) -> float:
    """bm25's inverse document frequency, exactly as FTS5 computes it (fts5_aux.c): a word
    in more than half the rows gets almost no weight (1e-6)."""
    value = math.log((rows - hits + 0.5) / (hits + 0.5))
    return value if value > 0.0 else 1e-6


def project_idf(rows: int, hits: int) -> float:
    """The inverse document frequency scores are scaled to (Lucene's, never below zero): in a
    small project, where every word is in half the rows, scores still tell hits apart."""
    return math.log(1.0 + (rows - hits + 0.5) / (hits + 0.5))


def ranked_sql(select: str, weights: str, joins: str, where: str) -> str:
    """Rows matching ``:match`` after the ``:key``/``:doc`` position, best first.

    ``k`` is bm25 (negative, lower is better) times ``:scale``; ``:after`` picks the keyset
    predicate: 0 none, 1 strictly after ``:key``, 2 after ``(:key, :doc)``, 3 at or after.
    The inner query ranks (its rowid tiebreak costs nothing: FTS5 streams rows by rowid);
    the outer joins only the ``:limit`` rows it kept.
    """
    return (
        f"SELECT f.k, f.doc, {select} FROM ("
        f" SELECT rowid AS doc, bm25({TEXT}, {weights}) * :scale AS k FROM {TEXT}"
        f" WHERE {TEXT} MATCH :match AND CASE :after WHEN 0 THEN 1"
        " WHEN 1 THEN k > :key WHEN 2 THEN k > :key OR (k = :key AND rowid > :doc)"
        " ELSE k >= :key END"
        " ORDER BY k, doc LIMIT :limit) f"
        f" {joins} WHERE {where} ORDER BY f.k, f.doc"
    )


def snippet(
    conn: sqlite3.Connection, match: str, doc: int, marks: Sentinels, columns: Iterable[int]
) -> str:
    """A fragment of row ``doc`` with the matched words marked: from the first of
    ``columns`` (the body before the name, which the hit shows anyway) that has a match."""
    text = ""
    for column in columns:
        row = conn.execute(
            f"SELECT snippet({TEXT}, ?, ?, ?, '…', {SNIPPET_TOKENS}) FROM {TEXT}"
            f" WHERE {TEXT} MATCH ? AND rowid = ?",
            (column, marks.start, marks.end, match, doc),
        ).fetchone()
        if row is None:
            return ""
        text = str(row[0])
        if marks.start in text:
            break
    return marks.marked(text)
