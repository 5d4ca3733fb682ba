"""Vectors beside the search text, and the queue of what still needs embedding, in the same
SQLite file as the search index (a project's listing, a store's index)::

    search_vectors   (doc, ordinal) -> model key, float32 bytes: one row per chunk
    search_embedded  doc -> the model key its vectors were made with (a text with no chunk
                     has a row here and none in search_vectors)
    embed_queue      doc -> gen: the doc's text changed and is not embedded yet; gen counts
                     the changes, so a worker that embedded an older text stores nothing

**A write never loses embedding work.** Every change of a row's text (fts.put_text) queues
the row and drops its old vectors in the same transaction as the text itself, and every
removal (fts.delete_text) drops its vectors and queue entry there too: a process killed
after the commit leaves the row queued, and a killed worker stores nothing (its write
transaction never committed), so the next drain embeds it. Removed vectors leave the file
as removed text does: ``secure_delete`` zeroes their pages and the index's purge truncates
the WAL (fts.removed marks the purge owed in the same transaction).

**A change log for the resident matrices** (core/resident.py): every statement that stores
or drops a row's vectors appends the row's doc to ``vector_log`` in its transaction; its
AUTOINCREMENT counter is the index's change counter, and ``vector_epoch`` changes when the
tables are cleared. The log holds doc numbers only (no text, no vector) and keeps its last
:data:`LOG_KEEP` entries: a process further behind loads the index's vectors again.

The worker stores a row's vectors only if its queue entry still has the generation it read,
inside one write transaction: a row changed or removed while it was being embedded keeps its
newer state.
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

# The search index's own tables (fts.DOCS, fts.TEXT, which imports this module).
DOCS = "search_docs"
TEXT = "search_text"
VECTORS = "search_vectors"
EMBEDDED = "search_embedded"
QUEUE = "embed_queue"
LOG = "vector_log"
EPOCH = "vector_epoch"
# Change log entries kept: a resident matrix further behind is loaded again.
LOG_KEEP = 50_000
SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {VECTORS} (doc INTEGER NOT NULL, ordinal INTEGER NOT NULL,"
    " model TEXT NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (doc, ordinal)) WITHOUT ROWID",
    f"CREATE TABLE IF NOT EXISTS {EMBEDDED} (doc INTEGER PRIMARY KEY, model TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {QUEUE} (doc INTEGER PRIMARY KEY, gen INTEGER NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {LOG} (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " doc INTEGER NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {EPOCH} (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " epoch TEXT NOT NULL)",
    f"INSERT OR IGNORE INTO {EPOCH} (id, epoch) VALUES (1, lower(hex(randomblob(8))))",
)


def has_schema(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (QUEUE,))
    return row.fetchone() is not None


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables (inside the caller's write transaction)."""
    for statement in SCHEMA:
        conn.execute(statement)


# -- writes inside the text's own transaction (fts.put_text, fts.delete_text) ----------------
def queue(conn: sqlite3.Connection, doc: int) -> None:
    """Row ``doc`` has new text: its old vectors go, and it waits to be embedded."""
    if not has_schema(conn):
        return
    _drop_vectors(conn, doc)
    conn.execute(
        f"INSERT INTO {QUEUE} (doc, gen) VALUES (?, 1)"
        " ON CONFLICT (doc) DO UPDATE SET gen = gen + 1",
        (doc,),
    )


def drop(conn: sqlite3.Connection, doc: int) -> None:
    """Row ``doc``'s text is removed: its vectors go with it. Its queue entry stays (a text
    replaced is removed, then put: the entry's generation moves on); :func:`forget` drops it
    with the row."""
    if not has_schema(conn):
        return
    _drop_vectors(conn, doc)


def forget(conn: sqlite3.Connection, doc: int) -> None:
    """Row ``doc`` is gone: its queue entry goes too."""
    if has_schema(conn):
        conn.execute(f"DELETE FROM {QUEUE} WHERE doc = ?", (doc,))


def _drop_vectors(conn: sqlite3.Connection, doc: int) -> None:
    if conn.execute(f"DELETE FROM {VECTORS} WHERE doc = ?", (doc,)).rowcount:
        conn.execute(f"INSERT INTO {LOG} (doc) VALUES (?)", (doc,))
    conn.execute(f"DELETE FROM {EMBEDDED} WHERE doc = ?", (doc,))


def clear(conn: sqlite3.Connection) -> None:
    """Every vector and queue entry goes (the index is recreated empty): a new epoch."""
    if not has_schema(conn):
        return
    for table in (VECTORS, EMBEDDED, QUEUE, LOG):
        conn.execute(f"DELETE FROM {table}")
    conn.execute(f"UPDATE {EPOCH} SET epoch = lower(hex(randomblob(8)))")


def queue_stale(conn: sqlite3.Connection, model: str) -> int:
    """Queue every row not embedded with ``model`` (new tables, a changed model, vectors
    lost); how many were queued. Their vectors of another model stay, never ranked with
    ``model``'s, until each row is embedded again."""
    before = conn.total_changes
    conn.execute(
        f"INSERT INTO {QUEUE} (doc, gen) SELECT d.doc, 1 FROM {DOCS} d"
        f" WHERE NOT EXISTS (SELECT 1 FROM {EMBEDDED} e WHERE e.doc = d.doc AND e.model = ?)"
        f" AND NOT EXISTS (SELECT 1 FROM {QUEUE} q WHERE q.doc = d.doc)",
        (model,),
    )
    return conn.total_changes - before


# -- the worker --------------------------------------------------------------------------------
def batch(
    conn: sqlite3.Connection, columns: Sequence[str], limit: int
) -> list[tuple[int, int, tuple[str, ...]]]:
    """(doc, gen, text values of ``columns``) of up to ``limit`` queued rows, in doc order
    (one read transaction: the caller's). A queued doc without text is dropped from the queue
    by :func:`store` (its gen check still holds, and it stores no vector)."""
    rows = conn.execute(
        f"SELECT q.doc, q.gen, {', '.join('t.' + c for c in columns)} FROM {QUEUE} q"
        f" LEFT JOIN {TEXT} t ON t.rowid = q.doc ORDER BY q.doc LIMIT ?",
        (limit,),
    ).fetchall()
    return [(int(r[0]), int(r[1]), tuple("" if v is None else str(v) for v in r[2:])) for r in rows]


def store(
    conn: sqlite3.Connection,
    model: str,
    done: Iterable[tuple[int, int, list[tuple[int, bytes]]]],
) -> int:
    """Store each (doc, gen, chunks) whose queue entry still has ``gen`` and whose text is
    still there (inside the caller's write transaction); how many were stored."""
    stored = 0
    for doc, gen, chunks in done:
        row = conn.execute(f"SELECT gen FROM {QUEUE} WHERE doc = ?", (doc,)).fetchone()
        if row is None or int(row[0]) != gen:
            continue  # changed or removed meanwhile: its newer state stands
        conn.execute(f"DELETE FROM {QUEUE} WHERE doc = ?", (doc,))
        alive = conn.execute(f"SELECT 1 FROM {DOCS} WHERE doc = ?", (doc,)).fetchone()
        if alive is None:
            continue
        _drop_vectors(conn, doc)
        conn.executemany(
            f"INSERT INTO {VECTORS} (doc, ordinal, model, vec) VALUES (?, ?, ?, ?)",
            [(doc, ordinal, model, vec) for ordinal, vec in chunks],
        )
        conn.execute(f"INSERT INTO {EMBEDDED} (doc, model) VALUES (?, ?)", (doc, model))
        conn.execute(f"INSERT INTO {LOG} (doc) VALUES (?)", (doc,))
        stored += 1
    if stored:
        conn.execute(
            f"DELETE FROM {LOG} WHERE seq <= (SELECT max(seq) FROM {LOG}) - ?", (LOG_KEEP,)
        )
    return stored


def queued(conn: sqlite3.Connection) -> int:
    if not has_schema(conn):
        return 0
    (count,) = conn.execute(f"SELECT count(*) FROM {QUEUE}").fetchone()
    return int(count)


def missing(conn: sqlite3.Connection, model: str) -> tuple[int, int]:
    """Rows with text and no vectors of ``model``: (lost: neither queued nor embedded with
    any model, a fault fsck reports; waiting: queued, or embedded with another model, which
    the next drain embeds)."""
    if not has_schema(conn):
        (count,) = conn.execute(f"SELECT count(*) FROM {DOCS}").fetchone()
        return 0, int(count)
    lost, waiting = conn.execute(
        f"SELECT count(*) FILTER (WHERE q.doc IS NULL AND e.doc IS NULL),"
        f" count(*) FILTER (WHERE q.doc IS NOT NULL OR e.doc IS NOT NULL)"
        f" FROM {DOCS} d LEFT JOIN {QUEUE} q ON q.doc = d.doc"
        f" LEFT JOIN {EMBEDDED} e ON e.doc = d.doc"
        f" WHERE NOT EXISTS (SELECT 1 FROM {EMBEDDED} x WHERE x.doc = d.doc AND x.model = ?)",
        (model,),
    ).fetchone()
    return int(lost or 0), int(waiting or 0)


def orphans(conn: sqlite3.Connection) -> int:
    """Vectors or queue entries of rows that no longer exist (a fault; fsck reports them)."""
    if not has_schema(conn):
        return 0
    (count,) = conn.execute(
        f"SELECT (SELECT count(*) FROM {VECTORS} WHERE doc NOT IN (SELECT doc FROM {DOCS}))"
        f" + (SELECT count(*) FROM {QUEUE} WHERE doc NOT IN (SELECT doc FROM {DOCS}))"
    ).fetchone()
    return int(count)


def drop_orphans(conn: sqlite3.Connection) -> None:
    conn.execute(
        f"INSERT INTO {LOG} (doc) SELECT DISTINCT doc FROM {VECTORS}"
        f" WHERE doc NOT IN (SELECT doc FROM {DOCS})"
    )
    for table in (VECTORS, EMBEDDED, QUEUE):
        conn.execute(f"DELETE FROM {table} WHERE doc NOT IN (SELECT doc FROM {DOCS})")


# -- the resident matrices (core/resident.py) ------------------------------------------------
class LogChanges:
    """An index's change log as core/resident.py reads it, inside the caller's read."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def version(self) -> tuple[str, int]:
        if not has_schema(self.conn) or not _exists(self.conn, EPOCH):
            return "", 0
        row = self.conn.execute(
            f"SELECT (SELECT epoch FROM {EPOCH}),"
            f" (SELECT seq FROM sqlite_sequence WHERE name = '{LOG}')"
        ).fetchone()
        return str(row[0] or ""), int(row[1] or 0)

    def changed(self, since: int) -> list[int] | None:
        (first,) = self.conn.execute(f"SELECT min(seq) FROM {LOG}").fetchone()
        if first is None or int(first) > since + 1:
            return None  # pruned past ``since`` (or cleared): load everything again
        return [
            int(doc)
            for (doc,) in self.conn.execute(
                f"SELECT DISTINCT doc FROM {LOG} WHERE seq > ?", (since,)
            )
        ]

    def rows(self, model: str, docs: Sequence[int] | None) -> list[tuple[int, bytes]]:
        if not has_schema(self.conn):
            return []
        if docs is None:
            found = self.conn.execute(
                f"SELECT doc, vec FROM {VECTORS} WHERE model = ? ORDER BY doc, ordinal", (model,)
            )
            return [(int(d), bytes(v)) for d, v in found]
        out: list[tuple[int, bytes]] = []
        wanted = sorted(set(docs))
        for at in range(0, len(wanted), 500):
            part = wanted[at : at + 500]
            marks = ", ".join("?" * len(part))
            out += [
                (int(d), bytes(v))
                for d, v in self.conn.execute(
                    f"SELECT doc, vec FROM {VECTORS} WHERE model = ? AND doc IN ({marks})"
                    " ORDER BY doc, ordinal",
                    (model, *part),
                )
            ]
        return out


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    return row.fetchone() is not None
