"""The turns' search index: FTS5 tables in each project's listing database (tree/sqlite/fts.py).

One row per turn: its task id, its meta values flattened to text and its summary. The listing
writes it in the same SQLite transaction as the turn's listing row (Listing.put_turn,
Listing.set_task), so the two never disagree; fsck compares it with the records and
``fsck --repair`` rebuilds it.

Every SQL statement over these tables is here, as a named function.
"""

# ruff: noqa: S608 - table names are module constants; every value is bound.
from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.storage.core.models import TurnRecord
from app.storage.core.query import meta_text
from app.storage.tree.sqlite import fts
from app.storage.tree.sqlite.fts import DOCS, TEXT

# bm25 weights of task_id, meta and summary: a word in the task's name counts most.
WEIGHTS = "3.0, 2.0, 1.0"
# Where a snippet comes from: the summary, else the meta values, else the task id.
SNIPPET_COLUMNS = ("summary", "meta", "task_id")
_DOCS_COLUMNS = (
    "doc INTEGER PRIMARY KEY, task_id TEXT NOT NULL, turn INTEGER NOT NULL, UNIQUE (task_id, turn)"
)
TEXT_COLUMNS = "task_id, meta, summary"
_COLUMNS = ("task_id", "meta", "summary")


@dataclass(frozen=True, slots=True)
class TurnText:
    """What search finds a turn by."""

    task_id: str
    meta: str
    summary: str

    def digest(self) -> str:
        body = "\x00".join((self.task_id, self.meta, self.summary)).encode("utf-8")
        return hashlib.sha256(body).hexdigest()


def turn_text(record: TurnRecord) -> TurnText:
    return TurnText(record.task_id, meta_text(record.meta), record.summary_md)


# -- schema ----------------------------------------------------------------------------------
def create_schema(conn: sqlite3.Connection) -> None:
    """Create the search tables in a new listing (inside its write transaction)."""
    fts.create_schema(conn, _DOCS_COLUMNS, TEXT_COLUMNS)


# -- writes (inside the listing's write transaction, guarded: fts.guarded) --------------------
def _doc(conn: sqlite3.Connection, task_id: str, turn: int) -> int | None:
    row = conn.execute(
        f"SELECT doc FROM {DOCS} WHERE task_id = ? AND turn = ?", (task_id, turn)
    ).fetchone()
    return None if row is None else int(row[0])


def put(conn: sqlite3.Connection, turn: int, text: TurnText) -> None:
    """Make the text of (``text.task_id``, ``turn``) ``text``; nothing is written when it is
    unchanged (an artifact upload, a retried write)."""
    fts.guarded(conn, lambda: _put(conn, turn, text))


def _put(conn: sqlite3.Connection, turn: int, text: TurnText) -> None:
    doc = _doc(conn, text.task_id, turn)
    if doc is None:
        (doc,) = conn.execute(
            f"INSERT INTO {DOCS} (task_id, turn) VALUES (?, ?) RETURNING doc", (text.task_id, turn)
        ).fetchone()
    else:
        old = conn.execute(
            f"SELECT task_id, meta, summary FROM {TEXT} WHERE rowid = ?", (doc,)
        ).fetchone()
        if old == (text.task_id, text.meta, text.summary):
            return
        if old is not None:
            fts.delete_text(conn, doc)
            fts.removed(conn, owed=False)  # replaced: the next sweep purges it
    fts.put_text(conn, doc, _COLUMNS, (text.task_id, text.meta, text.summary))


def set_task(
    conn: sqlite3.Connection,
    task_id: str,
    turns: Iterable[int],
    texts: Mapping[int, TurnText] | None,
) -> None:
    """Keep the rows of ``task_id``'s ``turns`` only; write ``texts`` (None: leave the kept
    rows as they are)."""
    fts.guarded(conn, lambda: _set_task(conn, task_id, set(turns), texts))


def _set_task(
    conn: sqlite3.Connection, task_id: str, keep: set[int], texts: Mapping[int, TurnText] | None
) -> None:
    for doc, turn in conn.execute(
        f"SELECT doc, turn FROM {DOCS} WHERE task_id = ?", (task_id,)
    ).fetchall():
        if turn not in keep:
            fts.delete_doc(conn, int(doc))
    for turn, text in (texts or {}).items():
        if turn in keep:
            _put(conn, turn, text)


# -- reads -----------------------------------------------------------------------------------
_HITS = fts.ranked_sql(
    "d.task_id, d.turn",
    WEIGHTS,
    f"JOIN {DOCS} d ON d.doc = f.doc JOIN turns u ON u.task_id = d.task_id AND u.turn = d.turn",
    "u.retain_until_us > :now",
)


def hits(conn: sqlite3.Connection, params: dict[str, object]) -> list[tuple[float, int, str, int]]:
    """(key, doc, task_id, turn) of the best live turns (fts.ranked_sql's parameters and
    ``:now``): a turn past its retention, not swept yet, is left out."""
    return [
        (float(k), int(doc), str(task_id), int(turn))
        for k, doc, task_id, turn in conn.execute(_HITS, params)
    ]


def fields(conn: sqlite3.Connection, docs: list[int]) -> dict[int, tuple[str, int]]:
    """doc -> (task_id, turn) of the rows ``docs`` (a semantic hit's owner)."""
    if not docs:
        return {}
    marks = ", ".join("?" * len(docs))
    return {
        int(doc): (str(task_id), int(turn))
        for doc, task_id, turn in conn.execute(
            f"SELECT doc, task_id, turn FROM {DOCS} WHERE doc IN ({marks})", docs
        )
    }


def live(conn: sqlite3.Connection, docs: list[int], now_us: int) -> set[int]:
    """The rows of ``docs`` whose turn is still within its retention."""
    if not docs:
        return set()
    marks = ", ".join("?" * len(docs))
    return {
        int(doc)
        for (doc,) in conn.execute(
            f"SELECT d.doc FROM {DOCS} d JOIN turns u ON u.task_id = d.task_id"
            f" AND u.turn = d.turn WHERE d.doc IN ({marks}) AND u.retain_until_us > ?",
            (*docs, now_us),
        )
    }


def digests(conn: sqlite3.Connection, task_id: str | None = None) -> dict[str, dict[int, str]]:
    """task id -> turn -> digest of its indexed text (fsck's comparison with the records)."""
    where, args = ("WHERE d.task_id = ?", (task_id,)) if task_id is not None else ("", ())
    out: dict[str, dict[int, str]] = {}
    for owner, turn, *text in conn.execute(
        f"SELECT d.task_id, d.turn, t.task_id, t.meta, t.summary FROM {DOCS} d"
        f" JOIN {TEXT} t ON t.rowid = d.doc {where}",
        args,
    ):
        out.setdefault(str(owner), {})[int(turn)] = TurnText(*map(str, text)).digest()
    return out
