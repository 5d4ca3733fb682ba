"""Serving ``project.md`` at a cost set by what changed, not by the project.

Writers keep each live task's section (core/digest.py) in the project's listing
database, in the same transaction as the task's listing rows: where it sorts, which turn it
shows and until when that turn lives, and its bytes, stamped with the write's sequence
number (the listing's ``generation``).

The file ``_project.md`` is the *base*: the digest as of one generation, with each
section's position in it recorded in ``digest_base``. A read asks the database, in one read
transaction, what changed since the base (sections written or removed, and sections whose
turn has expired since), and streams the base with those sections cut out and their new
bytes spliced in where they now sort: no lock, no render, O(changes) work however big the
project, and every acknowledged write is in the very next read.

Compaction rewrites the base once enough has changed, under the project lock, while readers
go on streaming the old base (they hold its descriptor and their own snapshot): the new
file is written and fsynced beside it, its positions are inserted in small transactions
under the new generation, and one short transaction points the counters at it after the
rename. The bytes of a section already in the base are dropped from the database then, so
the database holds what changed, and the base file is the digest a person ``cat``s.

A base that no longer matches its counters (edited by hand, or a crash between the rename
and the commit) is rebuilt from the records, under the project lock.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from app.storage.core import digest as text
from app.storage.core.digest import Section

# A read asks for a compaction (in the background) once COMPACT_AFTER sections changed, or
# one in SPREAD of the project's: the copy of the base it costs is then spread over at least
# that many changes. A read never holds more than HARD_LIMIT changed sections in memory
# (past it, the read compacts first). A base up to INLINE_BYTES is compacted on the read
# that finds a change (a millisecond or two), so a small project's file is always current.
COMPACT_AFTER = 256
SPREAD = 64
# Reads that copied this many bases' worth of spliced bytes (in one process) ask for one too.
COPIES = 2
HARD_LIMIT = 4096
INLINE_BYTES = 256 * 1024
_CHUNK = 2000

# ``digest`` is a rowid table: a WITHOUT ROWID row keeps only ~1 KB in its b-tree page and
# spills the rest of a section to an overflow page of its own (4 KiB for a 1.5 KB section).
SCHEMA = """
CREATE TABLE IF NOT EXISTS digest (
    task_id TEXT PRIMARY KEY,
    updated_us INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    valid_until_us INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    section BLOB
);
CREATE INDEX IF NOT EXISTS digest_by_seq ON digest (seq);
CREATE INDEX IF NOT EXISTS digest_by_expiry ON digest (valid_until_us);
CREATE INDEX IF NOT EXISTS digest_order ON digest (updated_us DESC, task_id DESC);
CREATE TABLE IF NOT EXISTS digest_gone (task_id TEXT PRIMARY KEY, seq INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS digest_base (
    gen INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    updated_us INTEGER NOT NULL,
    start INTEGER NOT NULL,
    length INTEGER NOT NULL,
    PRIMARY KEY (gen, task_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS digest_base_order ON digest_base (gen, updated_us DESC, task_id DESC);
INSERT OR IGNORE INTO counters VALUES ('base_gen', -1), ('base_mark', 0), ('base_size', 0),
    ('base_body', 0), ('base_end', 0);
"""
_MARK_BYTES = 4096
_BASE_COUNTERS = ("base_gen", "base_mark", "base_size", "base_body", "base_end")


class BaseMismatch(Exception):
    """``_project.md`` is not the file the counters describe."""


# -- writes (inside a listing write transaction, after the task's rows) ----------------------
def put_section(conn: sqlite3.Connection, task_id: str, section: Section | None) -> None:
    """Make ``section`` the task's (None: the task left the digest), as of this write.

    The section sorts where the task's listing row does (its ``updated_us``), so the caller
    writes that row first, in the same transaction.
    """
    if section is None:
        conn.execute("DELETE FROM digest WHERE task_id = ?", (task_id,))
        conn.execute(
            "INSERT OR REPLACE INTO digest_gone"
            " VALUES (?, (SELECT value FROM counters WHERE name = 'generation'))",
            (task_id,),
        )
        return
    # An upsert, not INSERT OR REPLACE: the row keeps its rowid and its task_id index entry,
    # so a task's next turn rewrites its section in place instead of deleting the row and
    # appending another (with secure_delete, each dropped page is written again as zeros).
    conn.execute(
        "INSERT INTO digest VALUES (?, (SELECT updated_us FROM tasks WHERE task_id = ?), ?, ?,"
        " (SELECT value FROM counters WHERE name = 'generation'), ?) ON CONFLICT (task_id) DO"
        " UPDATE SET updated_us = excluded.updated_us, turn = excluded.turn,"
        " valid_until_us = excluded.valid_until_us, seq = excluded.seq, section = excluded.section",
        (task_id, task_id, section.turn, section.valid_until_us, section.text),
    )
    conn.execute("DELETE FROM digest_gone WHERE task_id = ?", (task_id,))


# -- reads -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Base:
    gen: int  # the generation the base shows; -1: there is none yet
    mark: int  # fingerprint(): which file it is, whatever its inode (a copied root)
    size: int
    body: int  # where its first section starts (after the title)
    end: int  # where its last section ends


@dataclass(frozen=True, slots=True)
class Expired:
    """A section whose turn expired: what it becomes, and the row version it replaces."""

    task_id: str
    seq: int
    updated_us: int
    section: Section | None


# Reads a task's section from its records: (task id, turn) -> the section showing that turn,
# None when the turn is gone or no longer live.
ReadSection = Callable[[str, int], "Section | None"]


@dataclass
class Plan:
    """What a read streams: the base, with ``holes`` cut out and ``inserts`` spliced in."""

    base: Base
    changed: dict[str, tuple[int, bytes] | None] = field(default_factory=dict)
    expired: list[Expired] = field(default_factory=list)
    changes: int = 0  # sections written or removed since the base (expiries not counted)
    empty: bool = False
    holes: list[tuple[int, int]] = field(default_factory=list)  # (start, length) in the base
    inserts: list[tuple[int, int, str, bytes]] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.changed)


def base_of(conn: sqlite3.Connection) -> Base:
    values = dict(
        conn.execute(
            "SELECT name, value FROM counters WHERE name IN"
            " ('base_gen', 'base_mark', 'base_size', 'base_body', 'base_end')"
        ).fetchall()
    )
    return Base(*(int(values[name]) for name in _BASE_COUNTERS))


def count_changed(conn: sqlite3.Connection, base: Base) -> int:
    (changed,) = conn.execute("SELECT count(*) FROM digest WHERE seq > ?", (base.gen,)).fetchone()
    return int(changed)


def plan(conn: sqlite3.Connection, now_us: int, read_section: ReadSection) -> Plan:
    """Everything a read needs, from one read transaction (the caller holds it)."""
    base = base_of(conn)
    result = Plan(base)
    changed = result.changed
    for task_id, updated_us, turn, section in conn.execute(
        "SELECT task_id, updated_us, turn, section FROM digest WHERE seq > ?", (base.gen,)
    ):
        if section is None:  # a rebuild dropped the bytes: they come from the records
            found = read_section(task_id, turn)
            changed[task_id] = None if found is None else (updated_us, found.text)
        else:
            changed[task_id] = (updated_us, bytes(section))
    for (task_id,) in conn.execute("SELECT task_id FROM digest_gone WHERE seq > ?", (base.gen,)):
        changed[task_id] = None
    result.changes = len(changed)
    result.expired = expired_sections(conn, now_us, read_section)
    for item in result.expired:
        changed[item.task_id] = (
            None if item.section is None else (item.updated_us, item.section.text)
        )
    left = sum(1 for e in result.expired if e.section is None)
    (rows,) = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM digest LIMIT ?)", (left + 1,)
    ).fetchone()
    result.empty = rows <= left
    _place(conn, result)
    return result


def expired_sections(
    conn: sqlite3.Connection, now_us: int, read_section: ReadSection
) -> list[Expired]:
    """The sections whose turn has expired, and what each becomes (from the records)."""
    found = []
    for task_id, seq, updated_us, top in conn.execute(
        "SELECT d.task_id, d.seq, d.updated_us, (SELECT max(u.turn) FROM turns u"
        " WHERE u.task_id = d.task_id AND u.retain_until_us > :now)"
        " FROM digest d WHERE d.valid_until_us <= :now",
        {"now": now_us},
    ):
        section = None if top is None else read_section(task_id, top)
        found.append(Expired(task_id, seq, updated_us, section))
    return found


def _place(conn: sqlite3.Connection, result: Plan) -> None:
    """Where each changed section was in the base (holes) and where it goes (inserts)."""
    base = result.base
    if base.gen < 0:
        inserts = [(0, u, t, b) for t, s in result.changed.items() if s for u, b in (s,)]
    else:
        ids = list(result.changed)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            result.holes += conn.execute(
                f"SELECT start, length FROM digest_base WHERE gen = ? AND task_id IN ({marks})",  # noqa: S608
                (base.gen, *chunk),
            ).fetchall()
        result.holes.sort()
        inserts = []
        for task_id, change in result.changed.items():
            if change is None:
                continue
            updated_us, data = change
            row = conn.execute(
                "SELECT start FROM digest_base WHERE gen = ? AND (updated_us, task_id) < (?, ?)"
                " ORDER BY updated_us DESC, task_id DESC LIMIT 1",
                (base.gen, updated_us, task_id),
            ).fetchone()
            inserts.append((base.end if row is None else int(row[0]), updated_us, task_id, data))
    # At one offset, newest first, then by task id descending (ids are ASCII: code point
    # order is SQLite's byte order).
    inserts.sort(key=lambda i: i[2], reverse=True)
    inserts.sort(key=lambda i: (i[0], -i[1]))
    result.inserts = inserts


Piece = tuple[int, int] | bytes  # a (start, length) range of the base, or bytes to splice in


def pieces(result: Plan) -> Iterator[Piece]:
    """The digest after its title, as ranges of the base and spliced-in bytes."""
    base, holes = result.base, result.holes
    cursor = base.body

    def copy(until: int) -> Iterator[Piece]:
        nonlocal cursor
        for start, length in holes:
            if start + length <= cursor or start >= until:
                continue
            if start > cursor:
                yield (cursor, start - cursor)
            cursor = max(cursor, start + length)
        if until > cursor:
            yield (cursor, until - cursor)
        cursor = max(cursor, until)

    for offset, _, _, data in result.inserts:
        yield from copy(offset)
        yield data
    yield from copy(base.end)
    if result.empty:
        yield text.EMPTY


def head(
    conn: sqlite3.Connection, result: Plan, *, limit: int | None, since_us: int | None
) -> list[Piece]:
    """The newest sections of what ``result`` streams, in digest order: ``limit`` of them
    at most, only those of tasks updated at ``since_us`` or later (the caller holds the read
    transaction ``result`` was planned in). The base's sections come from its positions, in
    order through ``digest_base_order``, as far as the head goes: the cost is what is
    returned plus what changed since the base, however many tasks the project has."""
    changed = [(u, t, d) for _, u, t, d in result.inserts]
    changed.sort(key=lambda i: (i[0], i[1]), reverse=True)  # updated_us, then task id, desc
    found: list[Piece] = []
    base: Iterator[Any]
    if result.base.gen >= 0:
        query = "SELECT updated_us, task_id, start, length FROM digest_base WHERE gen = ?"
        args: list[int] = [result.base.gen]
        if since_us is not None:
            query += " AND updated_us >= ?"
            args.append(since_us)
        query += " ORDER BY updated_us DESC, task_id DESC"
        if limit is not None:  # the base rows of changed tasks are skipped, not counted
            query += " LIMIT ?"
            args.append(limit + len(result.changed))
        base = (r for r in conn.execute(query, args) if r[1] not in result.changed)
    else:
        base = iter(())
    shown = 0
    next_base = next(base, None)
    while limit is None or shown < limit:
        fresh = changed[0] if changed and (since_us is None or changed[0][0] >= since_us) else None
        if fresh is None and next_base is None:
            break
        if fresh is not None and (next_base is None or fresh[:2] > tuple(next_base[:2])):
            found.append(changed.pop(0)[2])
        else:
            assert next_base is not None
            start, length = int(next_base[2]), int(next_base[3])
            last = found[-1] if found else None
            if isinstance(last, tuple) and last[0] + last[1] == start:
                found[-1] = (last[0], last[1] + length)  # one read for adjacent sections
            else:
                found.append((start, length))
            next_base = next(base, None)
        shown += 1
    if result.empty:
        found.append(text.EMPTY)
    return found


class Spliced:
    """A read-only file of bytes and ranges of the base: what a read with changes serves.

    It has no ``fileno``: the server copies it through ``read`` (only an unchanged base is
    sent with sendfile).
    """

    def __init__(self, fd: int, parts: list[Piece]) -> None:
        self._fd = fd
        self._parts = parts
        self.size = sum(p[1] if isinstance(p, tuple) else len(p) for p in parts)
        self._index = 0
        self._done = 0  # bytes of the current part already read

    def read(self, n: int | None = -1) -> bytes:
        out: list[bytes] = []
        want = self.size if n is None or n < 0 else n
        while want > 0 and self._index < len(self._parts):
            part = self._parts[self._index]
            if isinstance(part, tuple):
                start, length = part
                take = min(want, length - self._done, 1 << 20)
                data = os.pread(self._fd, take, start + self._done)
                if len(data) < take:
                    raise OSError(f"the digest base shrank while it was read (fd {self._fd})")
                size = length
            else:
                data = part[self._done : self._done + want]
                size = len(part)
            out.append(data)
            want -= len(data)
            self._done += len(data)
            if self._done >= size:
                self._index += 1
                self._done = 0
        return b"".join(out)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Spliced:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_base(fd: int, base: Base) -> None:
    size = os.fstat(fd).st_size
    if size != base.size or fingerprint(fd, size) != base.mark:
        raise BaseMismatch("the digest base is not the one recorded")


def fingerprint(fd: int, size: int) -> int:
    """A file's size and the hash of its first and last 4 KiB, as a signed 64-bit integer.

    Cheap enough for every read, and it survives a copy of the root (an inode would not).
    Every edit that moves a byte changes the size; a same-size edit inside a section is
    what fsck's full comparison finds.
    """
    head = os.pread(fd, _MARK_BYTES, 0)
    tail = os.pread(fd, _MARK_BYTES, max(0, size - _MARK_BYTES))
    return _mark(head, tail, size)


def _mark(head: bytes, tail: bytes, size: int) -> int:
    digest = hashlib.blake2b(digest_size=8, person=b"project.md")
    digest.update(size.to_bytes(8, "big"))
    digest.update(head)
    digest.update(tail)
    return int.from_bytes(digest.digest(), "big", signed=True)


# -- compaction ------------------------------------------------------------------------------
def persist_expired(conn: sqlite3.Connection, expired: list[Expired]) -> None:
    """Write what expired sections became, unless a writer replaced them meanwhile (inside a
    write transaction)."""
    for item in expired:
        if item.section is None:
            gone = conn.execute(
                "DELETE FROM digest WHERE task_id = ? AND seq = ?", (item.task_id, item.seq)
            )
            if gone.rowcount:
                conn.execute(
                    "INSERT OR REPLACE INTO digest_gone"
                    " VALUES (?, (SELECT value FROM counters WHERE name = 'generation'))",
                    (item.task_id,),
                )
        else:
            conn.execute(
                "UPDATE digest SET turn = ?, valid_until_us = ?, seq ="
                " (SELECT value FROM counters WHERE name = 'generation'),"
                " section = ? WHERE task_id = ? AND seq = ?",
                (
                    item.section.turn,
                    item.section.valid_until_us,
                    item.section.text,
                    item.task_id,
                    item.seq,
                ),
            )


@dataclass(frozen=True, slots=True)
class Written:
    gen: int
    mark: int  # fingerprint(): which file it is, whatever its inode (a copied root)
    size: int
    body: int
    end: int


def write_base(
    reader: sqlite3.Connection,
    insert_rows: Callable[[list[tuple[int, str, int, int, int]]], None],
    out: IO[bytes],
    old: int | None,
    head: bytes,
    gen: int,
    read_section: ReadSection,
) -> Written:
    """Write the sections of ``reader``'s snapshot (generation ``gen``) to ``out``, handing
    their positions to ``insert_rows`` in chunks; O(1) memory.

    The base holds the rows as they are, expired turns included: reads leave those out as
    they go (a clock stepped back brings them back until the sweeper removes the turns).
    The sections stream from the database in digest order. A section changed since the old
    base has its bytes there; an unchanged one is copied from the old base (``old``, its
    descriptor), found by a merge with the old base's positions in the same order; what
    neither has (after a reset) is read from the records, expired or not.
    """
    base = base_of(reader)
    position = 0
    head_bytes = bytearray()
    tail_bytes = b""

    def emit(data: bytes) -> None:
        nonlocal position, tail_bytes
        out.write(data)
        position += len(data)
        if len(head_bytes) < _MARK_BYTES:
            head_bytes.extend(data[: _MARK_BYTES - len(head_bytes)])
        tail_bytes = (tail_bytes + data[-_MARK_BYTES:])[-_MARK_BYTES:]

    emit(head)
    body = position
    rows: list[tuple[int, str, int, int, int]] = []
    olds: Iterator[tuple[str, int, int, int]] = iter(())
    if base.gen >= 0 and old is not None:
        olds = reader.execute(
            "SELECT task_id, updated_us, start, length FROM digest_base WHERE gen = ?"
            " ORDER BY updated_us DESC, task_id DESC",
            (base.gen,),
        )
    here = next(olds, None)
    for task_id, updated_us, turn, data in reader.execute(
        "SELECT task_id, updated_us, turn, section FROM digest"
        " ORDER BY updated_us DESC, task_id DESC"
    ):
        if data is None:
            while here is not None and (here[1], here[0]) > (updated_us, task_id):
                here = next(olds, None)
            if here is not None and (here[0], here[1]) == (task_id, updated_us):
                data = _pread_all(old, here[3], here[2])  # type: ignore[arg-type]
            else:
                found = read_section(task_id, turn)
                if found is None:
                    continue
                data = found.text
        rows.append((gen, task_id, updated_us, position, len(data)))
        emit(bytes(data))
        if len(rows) >= _CHUNK:
            insert_rows(rows)
            rows.clear()
    if rows:
        insert_rows(rows)
    end = position
    if end == body:
        emit(text.EMPTY)
    mark = _mark(bytes(head_bytes), tail_bytes, position)
    return Written(gen, mark, position, body, end)


def _pread_all(fd: int, length: int, start: int) -> bytes:
    data = os.pread(fd, length, start)
    if len(data) != length:
        raise BaseMismatch("the digest base is shorter than its recorded sections")
    return data


def switch(conn: sqlite3.Connection, old: Base, new: Written) -> None:
    """Point the counters at the new base and drop what it made redundant (inside a write
    transaction, after the rename)."""
    conn.executemany(
        "UPDATE counters SET value = ? WHERE name = ?",
        [
            (new.gen, "base_gen"),
            (new.mark, "base_mark"),
            (new.size, "base_size"),
            (new.body, "base_body"),
            (new.end, "base_end"),
        ],
    )
    conn.execute(
        "UPDATE digest SET section = NULL WHERE seq > ? AND seq <= ? AND section IS NOT NULL",
        (old.gen, new.gen),
    )
    conn.execute("DELETE FROM digest_gone WHERE seq <= ?", (new.gen,))


def stale_bases(conn: sqlite3.Connection) -> list[int]:
    """Generations of positions no base uses any more (an old base, a compaction that died)."""
    (current,) = conn.execute("SELECT value FROM counters WHERE name = 'base_gen'").fetchone()
    return [
        int(r[0])
        for r in conn.execute("SELECT DISTINCT gen FROM digest_base WHERE gen <> ?", (current,))
    ]


def drop_base_rows(conn: sqlite3.Connection, gen: int, limit: int = _CHUNK * 2) -> int:
    """Delete up to ``limit`` positions of generation ``gen``; return how many."""
    cursor = conn.execute(
        "DELETE FROM digest_base WHERE gen = ? AND task_id IN"
        " (SELECT task_id FROM digest_base WHERE gen = ? LIMIT ?)",
        (gen, gen, limit),
    )
    return cursor.rowcount


def reset(conn: sqlite3.Connection) -> None:
    """Forget the base: every section counts as changed, its bytes read from the records
    where the database dropped them (inside a write transaction)."""
    conn.executemany(
        "UPDATE counters SET value = ? WHERE name = ?",
        [(-1, "base_gen"), (0, "base_mark"), (0, "base_size"), (0, "base_body"), (0, "base_end")],
    )
