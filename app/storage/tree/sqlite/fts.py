"""What the two search indexes share: an FTS5 table beside the rows it belongs to, its marks,
how a write that fails on it is kept from failing, its structure's level count, and bm25's
inverse document frequency. How removed text leaves the database file and how the index
stays within FTS5's limits (the purge and the compaction) is fts_purge.py's.

Each index (the turns' in a project's listing, the memories' in each store's index) has::

    search_docs   doc INTEGER PRIMARY KEY -> what the text belongs to (a turn, a memory)
    search_text   FTS5 (rowid = doc): the searchable text, stored, so snippets need no file
    search_state  name -> value: 'pending' (text removed or replaced since the last purge),
                  'owed' (text a delete removed since then: its purge is due now),
                  'backfill' (nonzero: the index is being filled from the records),
                  'damaged' (a write could not update the index: it is rebuilt from the
                  records), 'copied' (present while a compaction runs: fts_purge.py)

Every change to ``search_text`` goes through :func:`put_text` and :func:`delete_text`.

**Damage never takes a write down.** A write changes the index inside a savepoint of its
transaction (:func:`guarded`): when that fails for any reason of the index's own (not a full
disk, not a busy database), only the index's part is undone, the index is marked 'damaged'
and the write goes on. A damaged index is never written again; it is dropped however it is
damaged (:func:`drop_table`) and rebuilt from the records, and searches answer 503 until it
is whole again.

The filesystem's free blocks are not wiped (as for any file the service removes).
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from app.storage.core.query import SearchBudget
from app.storage.tree.sqlite import vectors
from app.storage.tree.sqlite.db import full_disk, is_busy, write_txn

log = logging.getLogger("app.storage.search")

DOCS = vectors.DOCS
TEXT = vectors.TEXT
STATE = "search_state"
# The compaction's copy, renamed to TEXT once it holds every row.
NEXT = "search_next"
# The ordinary tables an FTS5 table named T keeps its data in: T_data, T_idx, ...
SHADOW_TABLES = ("data", "idx", "content", "docsize", "config")
TOKENIZER = "unicode61 remove_diacritics 2"
# Levels a purge lets the structure keep before it compacts the index instead of merging it
# (fts_purge.py): FTS5's own cap in the versions that have one, far below the 2,000 SQLite
# 3.40 can read.
LEVEL_BOUND = 64
# The id of the structure record in T_data (FTS5_STRUCTURE_ROWID).
_STRUCTURE_ROW = 10
STATE_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {STATE} (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
    " WITHOUT ROWID"
)
_REBUILD = f"INSERT INTO {TEXT} ({TEXT}) VALUES ('rebuild')"
_INTEGRITY = f"INSERT INTO {TEXT} ({TEXT}) VALUES ('integrity-check')"
_SET = f"INSERT OR REPLACE INTO {STATE} VALUES (?, ?)"
_GET = f"SELECT value FROM {STATE} WHERE name = ?"
_BUMP = f"UPDATE {STATE} SET value = value + 1 WHERE name = 'pending'"
# Indexes made before 'owed' existed have no row for it: the first delete adds one.
_OWE = f"INSERT INTO {STATE} VALUES ('owed', 1) ON CONFLICT (name) DO UPDATE SET value = value + 1"
# What fsck says of an index whose 'owed' mark is set.
REMOVED_TEXT = (
    "removed text may still be in the file or its WAL: its purge has not finished (a reader's"
    " snapshot or a failed write stopped it; the next write, the sweep or fsck --repair"
    " purges it)"
)
_MARKS = f"SELECT name, value FROM {STATE} WHERE name IN ('damaged', 'backfill', 'owed', 'copied')"


def has_schema(conn: sqlite3.Connection) -> bool:
    """Whether this database has its search tables (``search_state`` is created last)."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (STATE,))
    return row.fetchone() is not None


def create_text(conn: sqlite3.Connection, table: str, columns: str) -> None:
    conn.execute(f"CREATE VIRTUAL TABLE {table} USING fts5({columns}, tokenize = '{TOKENIZER}')")


def create_schema(conn: sqlite3.Connection, docs: str, columns: str) -> None:
    """Create the three tables (inside the caller's write transaction)."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {DOCS} ({docs})")
    if not _exists(conn, TEXT):
        create_text(conn, TEXT, columns)
    vectors.create_schema(conn)
    conn.execute(STATE_SCHEMA)
    conn.execute(_SET, ("pending", 0))
    conn.execute(_SET, ("backfill", 0))


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    return row is not None


def state(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(_GET, (name,)).fetchone()
    return 0 if row is None else int(row[0])


def set_state(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute(_SET, (name, value))


@dataclass(frozen=True, slots=True)
class Upkeep:
    """What an index is owed after a write: a rebuild from the records (damaged, or being
    filled), a purge of removed text, a compaction under way."""

    damaged: bool = False
    backfill: int = 0
    owed: bool = False
    compacting: bool = False

    @property
    def due(self) -> bool:
        return self.damaged or bool(self.backfill) or self.owed or self.compacting


def upkeep(conn: sqlite3.Connection) -> Upkeep:
    """The marks of an index, one read (nothing when it has no search tables yet)."""
    if not has_schema(conn):
        return Upkeep()
    marks = dict(conn.execute(_MARKS).fetchall())
    return Upkeep(
        damaged=bool(marks.get("damaged")),
        backfill=int(marks.get("backfill") or 0),
        owed=bool(marks.get("owed")),
        compacting="copied" in marks,
    )


# -- writes ----------------------------------------------------------------------------------
_DAMAGED = "%s: search index damaged (%s); it is rebuilt from the records"


def index_error(exc: sqlite3.Error) -> bool:
    """Whether an error met reading the index may be the index's own (damage), not a busy
    database or an interrupted statement."""
    return not (
        isinstance(exc, sqlite3.OperationalError) and (is_busy(exc) or "interrupt" in str(exc))
    )


def passes_through(exc: sqlite3.Error, conn: sqlite3.Connection) -> bool:
    """Whether an error met writing the index is the write's as a whole, not the index's: a
    full disk (507), a busy database (503), an interrupted statement."""
    return not index_error(exc) or full_disk(exc, conn)


def guarded(conn: sqlite3.Connection, write: Callable[[], object]) -> bool:
    """Run ``write``, the index's part of the caller's write transaction, unless the index
    is marked damaged. When it fails for a reason of the index's own, undo just it, mark the
    index damaged and return False: the rest of the transaction goes on, and the index is
    rebuilt from the records (what the caller's upkeep does once :func:`upkeep` says so)."""
    if state(conn, "damaged"):
        return False
    conn.execute("SAVEPOINT search_write")
    try:
        write()
        # FTS5 writes what it buffered when the savepoint is released: it can fail here too.
        conn.execute("RELEASE search_write")
    except sqlite3.DatabaseError as exc:
        if not conn.in_transaction:
            raise  # SQLite rolled the whole transaction back: the write failed
        try:
            conn.execute("ROLLBACK TO search_write")
            conn.execute("RELEASE search_write")
        except sqlite3.OperationalError as gone:
            # A RELEASE that failed took the savepoint with it (the transaction goes on):
            # what the index part wrote stays, in an index that is rebuilt anyway.
            if "no such savepoint" not in str(gone):
                raise exc from None
        if passes_through(exc, conn):
            raise
        set_state(conn, "damaged", 1)
        log.warning(_DAMAGED, conn.execute("PRAGMA database_list").fetchone()[2], exc)
        return False
    return True


def compaction_copied(conn: sqlite3.Connection) -> int | None:
    """The last row a compaction under way has copied (None: none is under way)."""
    row = conn.execute(_GET, ("copied",)).fetchone()
    return None if row is None else int(row[0])


def _tables(conn: sqlite3.Connection, doc: int) -> tuple[str, ...]:
    """Where a change of row ``doc`` goes: the index, and the compaction's copy once the
    copy is past the row (the copy takes later rows from the index itself)."""
    copied = compaction_copied(conn)
    return (TEXT,) if copied is None or doc > copied else (TEXT, NEXT)


def put_text(
    conn: sqlite3.Connection, doc: int, columns: Sequence[str], values: Sequence[str]
) -> None:
    """Index ``values`` (of ``columns``) as row ``doc``, which holds no text; the row waits to
    be embedded (vectors.py), queued in this same transaction."""
    names = ", ".join(columns)
    marks = ", ".join("?" * len(columns))
    for table in _tables(conn, doc):
        conn.execute(f"INSERT INTO {table} (rowid, {names}) VALUES (?, {marks})", (doc, *values))
    vectors.queue(conn, doc)


def delete_text(conn: sqlite3.Connection, doc: int) -> None:
    """Remove row ``doc``'s text and its vectors (its purge is the caller's to count:
    :func:`removed`)."""
    for table in _tables(conn, doc):
        conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (doc,))
    vectors.drop(conn, doc)


def removed(conn: sqlite3.Connection, *, owed: bool = True) -> None:
    """Count text removed from the index (inside the write transaction that removed it);
    ``owed`` False: replaced by new text, purged by the next sweep."""
    conn.execute(_BUMP)
    if owed:
        conn.execute(_OWE)


def delete_doc(conn: sqlite3.Connection, doc: int) -> None:
    delete_text(conn, doc)
    conn.execute(f"DELETE FROM {DOCS} WHERE doc = ?", (doc,))
    vectors.forget(conn, doc)
    removed(conn)


def owed(conn: sqlite3.Connection) -> bool:
    """Whether text a delete removed may still be in the file or its WAL."""
    return state(conn, "owed") > 0


def drop_table(conn: sqlite3.Connection, table: str) -> None:
    """Drop the FTS5 table ``table`` however damaged (inside a write transaction; its freed
    pages are zeroed). DROP TABLE opens the table first; one that no longer opens (a
    structure record FTS5 cannot read, a lost config) is taken apart instead: its shadow
    tables, then its row in the schema."""
    try:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        return
    except sqlite3.DatabaseError as exc:
        if passes_through(exc, conn):
            raise
        log.warning("search table %s does not open (%s): dropped by its parts", table, exc)
    for suffix in SHADOW_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}_{suffix}")
    (version,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("DELETE FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    # Every connection reads the schema again, without the table.
    conn.execute(f"PRAGMA schema_version = {int(version) + 1}")


def mark_damaged(conn: sqlite3.Connection, what: str, exc: Exception) -> None:
    """Mark the index damaged after ``exc`` (a write transaction of its own)."""
    with write_txn(conn, what):
        set_state(conn, "damaged", 1)
    log.warning(_DAMAGED, conn.execute("PRAGMA database_list").fetchone()[2], exc)


def start_rebuild(conn: sqlite3.Connection, columns: str) -> int | None:
    """Inside a write transaction: when the index is marked damaged, drop it, start an empty
    one and mark it as being filled; return the fill's token (nonzero). Otherwise the token of
    a fill still to finish (one a killed process left), or None: the index is whole."""
    marks = upkeep(conn)
    if marks.damaged:
        recreate(conn, columns)
        token = marks.backfill + 1
        set_state(conn, "backfill", token)
        return token
    return marks.backfill or None


def filled(conn: sqlite3.Connection, token: int) -> None:
    """The fill ``token`` is done: searches use the index again, unless a rebuild started
    after it (which has a fill of its own to finish)."""
    conn.execute(f"UPDATE {STATE} SET value = 0 WHERE name = 'backfill' AND value = ?", (token,))


def recreate(conn: sqlite3.Connection, columns: str) -> None:
    """Drop every row and the index itself, however damaged, with any compaction under way,
    and start an empty, sound one (inside a write transaction; its freed pages are zeroed,
    the caller purges the WAL)."""
    drop_table(conn, TEXT)
    drop_table(conn, NEXT)
    conn.execute(f"DELETE FROM {STATE} WHERE name = 'copied'")
    conn.execute(f"DELETE FROM {DOCS}")
    vectors.clear(conn)
    create_text(conn, TEXT, columns)
    set_state(conn, "damaged", 0)
    removed(conn)


# -- the structure ---------------------------------------------------------------------------
def _varint(blob: bytes, at: int) -> tuple[int, int]:
    """SQLite's varint at ``at`` (big-endian, 7 bits a byte, the ninth byte whole)."""
    value = 0
    for i in range(9):
        byte = blob[at]
        at += 1
        if i == 8:
            return (value << 8) | byte, at
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at
    return value, at


def levels(conn: sqlite3.Connection, table: str = TEXT) -> int:
    """How many levels the FTS5 structure record of ``table`` lists: a 4-byte cookie, the
    4-byte marker of the second format (SQLite 3.44+ with secure-delete), then varints, the
    first the level count (fts5_index.c). A record that is missing or cannot be read is a
    DatabaseError, as FTS5 itself would say."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = ?", (_STRUCTURE_ROW,))
    found = row.fetchone()
    blob = found[0] if found is not None else None
    if not isinstance(blob, bytes) or len(blob) < 5:
        raise sqlite3.DatabaseError(f"{table}: no readable FTS5 structure record")
    at = 8 if blob[4:8] == b"\xff\x00\x00\x01" else 4
    try:
        return _varint(blob, at)[0]
    except IndexError:
        raise sqlite3.DatabaseError(f"{table}: FTS5 structure record cut short") from None


def damage(conn: sqlite3.Connection, budget: SearchBudget | None = None) -> str | None:
    """What is wrong with the index, by its mark, FTS5's integrity check (which opens the
    table first) and its structure record; None: sound. With ``budget``, a check that runs
    out of it raises SearchTimeout (the index is not known to be sound or not)."""
    if _exists(conn, STATE) and state(conn, "damaged"):
        return "a write could not update it"
    try:
        with bounded(conn, budget) if budget is not None else contextlib.nullcontext():
            conn.execute(_INTEGRITY)
        levels(conn)
    except sqlite3.DatabaseError as exc:
        if passes_through(exc, conn):
            raise
        return str(exc)
    return None


def opens(conn: sqlite3.Connection) -> str | None:
    """Whether the index opens and its structure can be read (a cheap check: one row of
    each); the error when not."""
    try:
        conn.execute(f"SELECT rowid FROM {TEXT} LIMIT 1").fetchall()
        levels(conn)
    except sqlite3.DatabaseError as exc:
        if passes_through(exc, conn):
            raise
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
    for (doc,) in conn.execute(
        f"SELECT rowid FROM {TEXT} WHERE rowid NOT IN (SELECT doc FROM {DOCS})"
    ).fetchall():
        delete_text(conn, int(doc))
    conn.execute(f"DELETE FROM {DOCS} WHERE doc NOT IN (SELECT rowid FROM {TEXT})")
    if vectors.has_schema(conn):
        vectors.drop_orphans(conn)
    removed(conn)


# -- queries ---------------------------------------------------------------------------------
def stats(conn: sqlite3.Connection, terms: list[str]) -> tuple[int, list[int]] | None:
    """The number of indexed rows, and of rows each term (an FTS5 expression) matches: what
    bm25 computes its inverse document frequencies from. None when the index cannot answer
    for every row: it is being filled from the records, or marked damaged (or has no tables
    yet). One statement: a search asks this of every store."""
    counts = f", (SELECT count(*) FROM {TEXT} WHERE {TEXT} MATCH ?)" * len(terms)
    try:
        backfill, damaged, rows, *found = conn.execute(
            f"SELECT (SELECT value FROM {STATE} WHERE name = 'backfill'),"
            f" (SELECT value FROM {STATE} WHERE name = 'damaged'),"
            f" (SELECT count(*) FROM {DOCS}){counts}",
            terms,
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if backfill or damaged else (int(rows), [int(c) for c in found])


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


# SQLite VM steps between two looks at a search's budget (about a millisecond of work).
PROGRESS_STEPS = 20_000


@contextlib.contextmanager
def bounded(conn: sqlite3.Connection, budget: SearchBudget) -> Iterator[None]:
    """Stop any statement of ``conn`` once ``budget`` ran out (SearchTimeout): a search
    never holds a worker thread for longer than its budget, whatever the text."""
    conn.set_progress_handler(lambda: int(budget.expired()), PROGRESS_STEPS)
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc) and budget.expired():
            raise budget.timeout() from None
        raise
    finally:
        conn.set_progress_handler(None, 0)


def texts(
    conn: sqlite3.Connection, docs: Iterable[int], columns: tuple[str, ...]
) -> dict[int, tuple[str, ...]]:
    """The stored text of rows ``docs``, ``columns`` in that order (what a snippet is cut
    from: app/storage/core/snippets.py)."""
    wanted = sorted(set(docs))
    if not wanted:
        return {}
    marks = ", ".join("?" * len(wanted))
    return {
        int(row[0]): tuple("" if v is None else str(v) for v in row[1:])
        for row in conn.execute(
            f"SELECT rowid, {', '.join(columns)} FROM {TEXT} WHERE rowid IN ({marks})", wanted
        )
    }
