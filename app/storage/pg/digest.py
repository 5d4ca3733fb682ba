"""``project.md`` on PostgreSQL: a stored section per task, streamed from one snapshot.

Every write of a task sets, in the write's own transaction, the task's row of
``digest_sections``: the bytes of its section (core/digest.py) showing its highest
live turn, that turn, and until when it lives (NULL bytes: no live turn). A trigger keeps
the project's count of rows, of shown sections and their byte total in ``projects``.

A read takes one snapshot and answers from it alone:

* its length is the title plus that byte total, corrected by the sections that changed
  without a write (a shown turn expired since; a task with no section yet), which are
  rendered in memory: few, the sweeper removes expired turns;
* its body is the sections in digest order, through the listing's own index, with those
  corrections spliced in.

No render of the project, no lock: a read costs what changed plus the copy of the bytes. It
holds its snapshot (one pooled connection, as its thread does) until the client has the body.

Tasks written in bulk (an import, or a database from before sections) have none: the import
itself, the next sweep or the first read that finds some fills them (:func:`fill`), a batch
per transaction under the tasks' locks. ``fsck`` renders every section again and compares
(:func:`differing`), and sets the counters from the rows.
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, cast

import psycopg

from app.storage.core import digest as text
from app.storage.core.errors import LockTimeout
from app.storage.core.names import Scope
from app.storage.pg.db import (
    Database,
    DatabaseError,
    advisory_xact_lock,
    advisory_xact_locks,
    translated,
)

# A section with no live turn never expires (a write gives the task one).
NEVER = 2**62
FILL_BATCH = 500
# A read renders at most this many sections that were never written (tasks a concurrent
# import brought after the read filled the project); past it, it asks the client to retry.
MAX_MISSING = 4096
# Rows per fetch of a read: few first (the first byte waits for them), then more (each
# fetch is a round trip).
_FIRST_FETCH = 64
_MAX_FETCH = 1024
_PROJECT = "tenant = %(tenant)s AND project = %(project)s"
# The highest live turn of each of a set of tasks: per task, the newest end of its range of
# the turns' primary key, whatever plan (a prepared statement's generic one included) runs.
_TOPS = (
    "SELECT u.task_id, x.turn, x.updated_at, x.summary, x.retain_until_us"
    " FROM unnest(%(ids)s::text[]) AS u(task_id) CROSS JOIN LATERAL (SELECT turn, updated_at,"
    " summary, retain_until_us FROM turns WHERE tenant = %(tenant)s AND project = %(project)s"
    " AND task_id = u.task_id AND retain_until_us > %(now)s ORDER BY turn DESC LIMIT 1) x"
)
_INSERT = (
    "INSERT INTO digest_sections (tenant, project, task_id, turn, valid_until_us, section)"
    " VALUES (%s, %s, %s, %s, %s, %s)"
)
_UPSERT = (
    f"{_INSERT} ON CONFLICT (tenant, project, task_id) DO UPDATE SET turn = excluded.turn,"
    " valid_until_us = excluded.valid_until_us, section = excluded.section"
)
# The section as a subquery, not a join: the plan is then an index lookup per row whatever
# the table's statistics say (a join planned on a freshly filled, not yet analyzed table
# rescans the project's sections for every task).
_BODY = (
    "SELECT t.task_id, (SELECT s.section FROM digest_sections s WHERE s.tenant = t.tenant"
    " AND s.project = t.project AND s.task_id = t.task_id) FROM tasks t"
    " WHERE t.tenant = %(tenant)s AND t.project = %(project)s"
    " ORDER BY t.updated_us DESC, t.task_id DESC"
)
# A head's body from ``since`` on: the same walk of the index, stopped at ``since``.
_BODY_SINCE = _BODY.replace(" ORDER BY", " AND t.updated_us >= %(since)s ORDER BY")

Row = tuple[int | None, int, bytes | None]  # turn, valid until, bytes (None: not shown)


def _row(task_id: str, top: tuple[Any, ...] | None) -> Row:
    if top is None:
        return None, NEVER, None
    _, turn, updated_at, summary, retain_us = top
    body = bytes(summary).decode("utf-8")
    return int(turn), int(retain_us), text.section_text(task_id, int(turn), updated_at, body)


def _tops(
    conn: psycopg.Connection[Any], scope: Scope, ids: list[str], now_us: int
) -> dict[str, Row]:
    """What each task's section is at ``now_us``, from its turns."""
    params = {"tenant": scope.tenant, "project": scope.project, "ids": ids, "now": now_us}
    found = {r[0]: r for r in conn.execute(_TOPS, params)}
    return {task_id: _row(task_id, found.get(task_id)) for task_id in ids}


def put_section(
    conn: psycopg.Connection[Any],
    scope: Scope,
    task_id: str,
    now_us: int,
    top: tuple[int, str, str, int] | None = None,
) -> None:
    """Set the task's section from its turns (in the transaction that changed them, under
    the task's lock, after its listing row). ``top``, when the caller knows it: the highest
    live turn's number, updated_at, summary and expiry, as just written."""
    if top is None:
        row = _tops(conn, scope, [task_id], now_us)[task_id]
    else:
        turn, updated_at, summary, retain_us = top
        row = turn, retain_us, text.section_text(task_id, turn, updated_at, summary)
    conn.execute(_UPSERT, (scope.tenant, scope.project, task_id, *row))


def _without(conn: psycopg.Connection[Any], scope: Scope, after: str) -> tuple[list[str], str]:
    """Of the next tasks of ``scope`` after ``after`` in id order, those with no section,
    and where the next call starts ("" once every task was seen). The section test is a
    subquery, an index lookup per task, for the reason ``_BODY``'s is."""
    rows = conn.execute(
        "SELECT t.task_id, EXISTS (SELECT 1 FROM digest_sections s WHERE s.tenant = t.tenant"
        " AND s.project = t.project AND s.task_id = t.task_id) FROM tasks t"
        " WHERE t.tenant = %(tenant)s AND t.project = %(project)s AND t.task_id > %(after)s"
        f" ORDER BY t.task_id LIMIT {FILL_BATCH}",
        {"tenant": scope.tenant, "project": scope.project, "after": after},
    ).fetchall()
    return [task_id for task_id, has in rows if not has], rows[-1][0] if rows else ""


def fill(db: Database, scope: Scope, now_us: Callable[[], int]) -> int:
    """Write the section of every task of ``scope`` that has none; return how many."""
    filled, after = 0, ""
    while True:
        with db.transaction(f"project.md of {scope.tenant}/{scope.project}") as conn:
            # One filler of a project at a time: a second one waits, then finds each
            # batch done.
            advisory_xact_lock(conn, "digest fill", scope.tenant, scope.project)
            ids, after = _without(conn, scope, after)
            if ids:
                # Every lock first, in id order: a writer holding one of them waits for
                # nothing this transaction holds.
                advisory_xact_locks(
                    conn, [("task", scope.tenant, scope.project, task_id) for task_id in ids]
                )
                rows = _tops(conn, scope, ids, now_us())
                turns, until, sections = zip(*(rows[t] for t in ids), strict=True)
                conn.execute(
                    "INSERT INTO digest_sections (tenant, project, task_id, turn, valid_until_us,"
                    " section) SELECT %s, %s, * FROM unnest(%s::text[], %s::integer[],"
                    " %s::bigint[], %s::bytea[]) ON CONFLICT DO NOTHING",
                    (scope.tenant, scope.project, ids, list(turns), list(until), list(sections)),
                )
                filled += len(ids)
        if not after:
            return filled


class DigestStream:
    """``project.md`` read from one snapshot, as a file: sections in digest order, with the
    corrected ones (``fixes``: task id -> bytes, or None when not shown) spliced in."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        conn: psycopg.Connection[Any],
        scope: Scope,
        fixes: dict[str, bytes | None],
        empty: bool,
        size: int | None,
        *,
        limit: int | None = None,
        since_us: int | None = None,
    ) -> None:
        self._stack = stack
        self._fixes = fixes
        self._empty = empty
        self._size = size  # None: a head, whose length is not known before the end
        self._left = limit  # sections still to show (None: every one)
        self._buffer = bytearray(text.title(scope))
        self._made = len(self._buffer)
        self._fetch = _FIRST_FETCH if limit is None else min(_FIRST_FETCH, limit + 8)
        self._cursor: psycopg.ServerCursor[Any] | None = conn.cursor(name="project_md", binary=True)
        params = {"tenant": scope.tenant, "project": scope.project, "since": since_us}
        with translated("project.md"):
            self._cursor.execute(_BODY if since_us is None else _BODY_SINCE, params)

    def _more(self) -> bool:
        """Add the next rows' bytes to the buffer; False once the body is done."""
        if self._cursor is None:
            return False
        with translated("project.md"):
            rows = self._cursor.fetchmany(self._fetch)
        self._fetch = min(2 * self._fetch, _MAX_FETCH)
        if not rows:
            self._finish()
            return True
        for task_id, section in rows:
            data = self._fixes.get(task_id, section)
            if data is not None:
                self._buffer += data
                self._made += len(data)
                if self._left is not None:
                    self._left -= 1
                    if not self._left:
                        self._finish()  # the head is whole: the rest is never fetched
                        break
        return True

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            while self._more():
                pass
            n = len(self._buffer)
        while len(self._buffer) < n and self._more():
            pass
        with memoryview(self._buffer) as view:
            out = bytes(view[:n])
        del self._buffer[:n]
        return out

    def readable(self) -> bool:
        return True

    def _finish(self) -> None:
        """The body is read: end the snapshot and give its connection back to the pool.

        The length announced comes from the project's counters, the body from the rows: they
        differ only when the counters were changed by hand, and the read then fails rather
        than end short or long of its Content-Length."""
        if self._empty:
            self._buffer += text.EMPTY
            self._made += len(text.EMPTY)
        self.close()
        if self._size is not None and self._made != self._size:
            raise DatabaseError(
                f"project.md: {self._made} bytes of sections, {self._size} counted;"
                " `flask --app wsgi fsck --repair` sets the counters from the sections"
            )

    def close(self) -> None:
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            with contextlib.suppress(psycopg.Error):
                cursor.close()
        self._stack.close()

    def __enter__(self) -> DigestStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(db: Database, scope: Scope, now_us: Callable[[], int]) -> tuple[BinaryIO, int]:
    """``project.md`` of ``scope`` and its length, from one snapshot."""
    stream, size = _open(db, scope, now_us, head=None)
    assert size is not None
    return stream, size


def open_head(
    db: Database,
    scope: Scope,
    now_us: Callable[[], int],
    *,
    limit: int | None,
    since_us: int | None,
) -> tuple[BinaryIO, int | None]:
    """The title and the newest sections of ``project.md``: the rows of the listing's index
    as far as the head goes, so it costs what it returns however big the project."""
    return _open(db, scope, now_us, head=(limit, since_us))


def _open(
    db: Database,
    scope: Scope,
    now_us: Callable[[], int],
    *,
    head: tuple[int | None, int | None] | None,
) -> tuple[BinaryIO, int | None]:
    """The digest (``head``: its start, (limit, since_us)) from one snapshot."""
    for attempt in range(2):
        stack = contextlib.ExitStack()
        try:
            conn = stack.enter_context(db.snapshot("project.md"))
            # The body's plan costs as much as the project is big, and past jit_above_cost
            # PostgreSQL compiles it first: tens of milliseconds before the first row, for a
            # query that only walks an index.
            conn.execute("SET LOCAL jit = off")
            now = now_us()
            found = conn.execute(
                f"SELECT tasks, digest_rows, digest_shown, digest_bytes FROM projects"
                f" WHERE {_PROJECT}",
                {"tenant": scope.tenant, "project": scope.project},
            ).fetchone()
            if found is None:
                stack.close()
                data = text.title(scope) + text.EMPTY
                return io.BytesIO(data), len(data)
            tasks, rows, shown, size = (int(v) for v in found)
            if tasks != rows and attempt == 0:
                stack.close()
                fill(db, scope, now_us)
                continue
            fixes: dict[str, bytes | None] = {}
            for task_id, old, new in _fixes(conn, scope, now, missing=tasks != rows):
                fixes[task_id] = new
                shown += int(new is not None) - int(old is not None)
                size += len(new or b"") - (old or 0)
            size += len(text.title(scope)) + (len(text.EMPTY) if shown == 0 else 0)
            if head is None:
                stream = DigestStream(stack, conn, scope, fixes, empty=shown == 0, size=size)
                return cast(BinaryIO, stream), size
            limit, since_us = head
            stream = DigestStream(
                stack, conn, scope, fixes, shown == 0, None, limit=limit, since_us=since_us
            )
            return cast(BinaryIO, stream), None
        except BaseException:
            stack.close()
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _fixes(
    conn: psycopg.Connection[Any], scope: Scope, now_us: int, *, missing: bool
) -> Iterator[tuple[str, int | None, bytes | None]]:
    """(task id, length stored or None, bytes now) of each section that changed without
    a write."""
    params = {"tenant": scope.tenant, "project": scope.project, "now": now_us}
    stale: dict[str, int | None] = {
        r[0]: int(r[1])
        for r in conn.execute(
            f"SELECT task_id, octet_length(section) FROM digest_sections WHERE {_PROJECT}"
            " AND section IS NOT NULL AND valid_until_us <= %(now)s",
            params,
        )
    }
    after = "" if missing else None
    lacking = 0
    while after is not None:
        ids, after = _without(conn, scope, after)
        lacking += len(ids)
        if lacking > MAX_MISSING:
            raise LockTimeout(
                f"project.md of {scope.tenant}/{scope.project}: the sections of tasks written"
                " in bulk are being written; retry shortly"
            )
        stale.update(dict.fromkeys(ids))
        after = after or None
    ids = list(stale)
    for start in range(0, len(ids), FILL_BATCH):
        chunk = ids[start : start + FILL_BATCH]
        for task_id, (_, _, new) in _tops(conn, scope, chunk, now_us).items():
            yield task_id, stale[task_id], new


def differing(conn: psycopg.Connection[Any], now_us: int) -> Iterator[tuple[Scope, str]]:
    """Every task whose stored section is not what its turns make it at ``now_us`` (read in
    ``conn``'s snapshot, a batch of rows at a time)."""
    with conn.cursor(name="fsck_sections") as cur:
        cur.itersize = FILL_BATCH
        cur.execute(
            "SELECT s.tenant, s.project, s.task_id, s.turn, s.valid_until_us, s.section"
            " FROM digest_sections s ORDER BY s.tenant, s.project, s.task_id"
        )
        batch: list[tuple[Any, ...]] = []
        for row in cur:
            batch.append(row)
            if len(batch) >= FILL_BATCH:
                yield from _compare(conn, batch, now_us)
                batch = []
        yield from _compare(conn, batch, now_us)


def _compare(
    conn: psycopg.Connection[Any], batch: list[tuple[Any, ...]], now_us: int
) -> Iterator[tuple[Scope, str]]:
    by_scope: dict[Scope, list[tuple[Any, ...]]] = {}
    for row in batch:
        by_scope.setdefault(Scope(row[0], row[1]), []).append(row)
    for scope, rows in by_scope.items():
        want = _tops(conn, scope, [r[2] for r in rows], now_us)
        for _, _, task_id, turn, valid_until, section in rows:
            if section is not None and valid_until <= now_us:
                continue  # its turn expired: every read corrects it, the sweeper rewrites it
            kept = (turn, int(valid_until), None if section is None else bytes(section))
            if kept != want[task_id]:
                yield scope, task_id


# A project's section counters, counted from its rows (``p``: its projects row).
_COUNTED = (
    "SELECT count(*), count(s.section), coalesce(sum(octet_length(s.section)), 0)"
    " FROM digest_sections s WHERE s.tenant = p.tenant AND s.project = p.project"
)
_COUNTERS = "digest_rows, digest_shown, digest_bytes"


def recount(conn: psycopg.Connection[Any]) -> list[tuple[Scope, tuple[int, ...], tuple[int, ...]]]:
    """Each project whose section counters differ from its rows: (scope, kept, counted)."""
    return [
        (Scope(r[0], r[1]), tuple(r[2:5]), tuple(r[5:8]))
        for r in conn.execute(
            f"SELECT p.tenant, p.project, {_COUNTERS}, c.* FROM projects p"
            f" CROSS JOIN LATERAL ({_COUNTED}) c(n, shown, size)"
            f" WHERE ({_COUNTERS}) IS DISTINCT FROM (c.n, c.shown, c.size)"
        )
    ]


def set_counters(conn: psycopg.Connection[Any], scope: Scope) -> None:
    """Set the project's section counters from its rows (under the project row's lock:
    the trigger of a writer that waits for it adds to what is set here)."""
    conn.execute(
        "SELECT 1 FROM projects WHERE tenant = %s AND project = %s FOR UPDATE",
        (scope.tenant, scope.project),
    )
    conn.execute(
        f"UPDATE projects p SET ({_COUNTERS}) = ({_COUNTED})"
        " WHERE p.tenant = %s AND p.project = %s",
        (scope.tenant, scope.project),
    )
