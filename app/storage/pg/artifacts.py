"""Artifacts on PostgreSQL and an object store: the bytes streamed to a key of their own
first (blobs.py), then named in one transaction under the task's lock, which checks the
preconditions, moves the turn's times and counts what the project stores. Readers take no lock;
a download that began before a replacement committed keeps reading the replaced bytes.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import IO, Any, Protocol, cast

import psycopg

from app.storage.core.clock import iso_us
from app.storage.core.errors import LockTimeout, NotFound
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    ArtifactUpload,
    StagedUpload,
    TurnRecord,
    artifact_etag,
)
from app.storage.core.names import Scope, validate_artifact_name, validate_id, validate_turn
from app.storage.core.task_rules import check_preconditions, checked_uploads, next_updated_us
from app.storage.core.usage import ReservingStream, Ticket
from app.storage.pg import usage as pgu
from app.storage.pg.blobs import BlobStore, Written
from app.storage.pg.db import Database
from app.storage.pg.listing import KEY, TurnRow, task_key


class TaskLock(Protocol):
    """What every part of the task engine (PgTaskStore) uses of it: its clock and lock, a
    turn's row, and the step that makes a task's listing row follow its turns."""

    retention_us: int

    def now_us(self) -> int: ...

    def transaction(
        self, scope: Scope, task_id: str
    ) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def turn_row(
        self, conn: psycopg.Connection[Any], scope: Scope, task_id: str, turn: int
    ) -> TurnRow | None: ...

    def task_updated_us(self, conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> int: ...

    def recompute(
        self,
        conn: psycopg.Connection[Any],
        scope: Scope,
        task_id: str,
        written: TurnRecord | None = None,
    ) -> None: ...


class TaskRows(TaskLock, Protocol):
    """What the artifacts need of the task engine: its stores too, and the artifact limit."""

    db: Database
    blobs: BlobStore
    usage: pgu.PgUsage
    max_artifact_bytes: int

    def forget_blobs(self, keys: list[str]) -> None: ...

    def blob_key(self, scope: Scope, task_id: str, turn: int, name: str) -> str: ...


# How long an artifact's superseded object stays listed for its delete. The sweeper's orphan
# pass removes any object no row names once it is older than its grace (hourly by default),
# so a listing older than a day names an object long gone; dropping it keeps the list of a
# much-replaced artifact to a day of uploads.
SUPERSEDED_LISTED_US = 24 * 3600 * 1_000_000


def name_artifact(
    conn: psycopg.Connection[Any],
    scope: Scope,
    task_id: str,
    turn: int,
    info: ArtifactInfo,
    updated_us: int,
    blob: str,
) -> None:
    """Make ``blob`` the bytes of artifact ``info`` of the turn (its row created or replaced).

    The object a replacement supersedes stays for a download that is reading it, until the
    sweeper's orphan pass, and is listed (superseded_blobs), so that a delete of the
    artifact, its turn or its task removes it with the rest (:func:`forget_superseded`)."""
    key = task_key(scope, task_id, turn=turn, name=info.name, now=updated_us)
    where = f"{KEY} AND turn = %(turn)s AND name = %(name)s"
    conn.execute(
        "INSERT INTO superseded_blobs (tenant, project, task_id, turn, name, blob,"
        " superseded_us) SELECT tenant, project, task_id, turn, name, blob, %(now)s"
        f" FROM artifacts WHERE {where} ON CONFLICT (blob) DO NOTHING",
        key,
    )
    conn.execute(
        f"DELETE FROM superseded_blobs WHERE {where} AND superseded_us < %(listed_since)s",
        {**key, "listed_since": updated_us - SUPERSEDED_LISTED_US},
    )
    conn.execute(
        "INSERT INTO artifacts (tenant, project, task_id, turn, name, content_type,"
        " size, sha256, updated_at, updated_us, blob) VALUES (%(tenant)s,"
        " %(project)s, %(task_id)s, %(turn)s, %(name)s, %(content_type)s, %(size)s,"
        " %(sha256)s, %(updated_at)s, %(updated_us)s, %(blob)s)"
        " ON CONFLICT (tenant, project, task_id, turn, name) DO UPDATE SET"
        " content_type = excluded.content_type, size = excluded.size,"
        " sha256 = excluded.sha256, updated_at = excluded.updated_at,"
        " updated_us = excluded.updated_us, blob = excluded.blob",
        task_key(
            scope,
            task_id,
            turn=turn,
            name=info.name,
            content_type=info.content_type,
            size=info.size,
            sha256=info.sha256,
            updated_at=info.updated_at,
            updated_us=updated_us,
            blob=blob,
        ),
    )


def forget_superseded(
    conn: psycopg.Connection[Any],
    scope: Scope,
    task_id: str,
    turn: int | None = None,
    name: str | None = None,
) -> list[str]:
    """Unlist the superseded objects of a task's artifacts (of one turn, of one artifact) and
    return their keys, for the caller to delete after its commit with the artifacts' own.

    Called by every delete before it deletes the artifact rows (which would drop the list
    with them, the objects left to the sweeper): a delete removes all the bytes an artifact
    ever had, also those a racing upload replaced a moment before."""
    where = KEY
    if turn is not None:
        where += " AND turn = %(turn)s"
    if name is not None:
        where += " AND name = %(name)s"
    return [
        str(r[0])
        for r in conn.execute(
            f"DELETE FROM superseded_blobs WHERE {where} RETURNING blob",
            task_key(scope, task_id, turn=turn, name=name),
        )
    ]


class PgArtifacts:
    """The artifacts of every task of one database and bucket (PgTaskStore's)."""

    def __init__(self, tasks: TaskRows) -> None:
        self.tasks = tasks

    def stage_uploads(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        uploads: Iterable[ArtifactUpload],
        credits: dict[str, int],
        ticket: Ticket,
        staged: list[StagedUpload[Written]],
    ) -> None:
        """Stream each upload to a new object, before the transaction that names them, each
        admitted (quotas: ``ticket``) as it streams in past ``credits`` (the size of the live
        artifact of its name, which it replaces); append each to ``staged`` as it is stored,
        so a caller that fails later can remove them all."""
        for upload in checked_uploads(uploads):
            body = ReservingStream(
                upload.stream, ticket, None, known=False, credit=credits.get(upload.name, 0)
            )
            written = self.tasks.blobs.put_new(
                self.tasks.blob_key(scope, task_id, turn, upload.name),
                cast("IO[bytes]", body),
                limit=self.tasks.max_artifact_bytes,
                content_type=upload.content_type,
            )
            staged.append(
                StagedUpload(
                    upload.name, upload.content_type, written.size, written.sha256, written
                )
            )

    def put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        *,
        content_type: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        size: int | None = None,
    ) -> ArtifactInfo:
        """Stream an artifact to the object store, then name it in one transaction.

        ``size``: the body's declared length, admitted (quotas) before a byte is read; a body
        of unknown length is admitted slice by slice as it streams in."""
        validate_id("task_id", task_id)
        validate_turn(turn)
        validate_artifact_name(name)
        with self.tasks.db.snapshot("turn") as conn:
            row = self.tasks.turn_row(conn, scope, task_id, turn)
            found = conn.execute(
                f"SELECT size FROM artifacts WHERE {KEY} AND turn = %(turn)s AND name = %(name)s",
                task_key(scope, task_id, turn=turn, name=name),
            ).fetchone()
        if row is None or row.retain_until_us <= self.tasks.now_us():
            raise NotFound(f"turn {turn} of task {task_id} not found; PUT the turn first")
        # What it replaces, as read now; checked again in the transaction (cover_in).
        before = int(found[0]) if found else 0
        ticket = self.tasks.usage.admit(scope, add_bytes=0 if size is None else size - before)
        try:
            return self._put_artifact(
                scope,
                task_id,
                turn,
                name,
                stream,
                content_type,
                if_match,
                if_none_match,
                size,
                before,
                ticket,
            )
        finally:
            ticket.release()  # nothing to release once the write settled it

    def _put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        content_type: str,
        if_match: str | None,
        if_none_match: bool,
        size: int | None,
        before: int,
        ticket: Ticket,
    ) -> ArtifactInfo:
        body = ReservingStream(stream, ticket, None, known=size is not None, credit=before)
        written = self.tasks.blobs.put_new(
            self.tasks.blob_key(scope, task_id, turn, name),
            cast("IO[bytes]", body),
            limit=self.tasks.max_artifact_bytes,
            content_type=content_type,
        )
        try:
            with self.tasks.transaction(scope, task_id) as conn:
                now_us = self.tasks.now_us()
                record = self.tasks.turn_row(conn, scope, task_id, turn)
                if record is None or record.retain_until_us <= now_us:
                    raise NotFound(f"turn {turn} of task {task_id} not found")
                current = conn.execute(
                    f"SELECT sha256, blob, size FROM artifacts WHERE {KEY} AND turn = %(turn)s"
                    " AND name = %(name)s",
                    task_key(scope, task_id, turn=turn, name=name),
                ).fetchone()
                check_preconditions(
                    artifact_etag(current[0]) if current else None, if_match, if_none_match
                )
                added = written.size - (int(current[2]) if current else 0)
                if isinstance(ticket, pgu.PgTicket):
                    ticket.cover_in(conn, added)
                    ticket.settle_in(conn)
                updated_us = next_updated_us(
                    self.tasks.task_updated_us(conn, scope, task_id), now_us
                )
                info = ArtifactInfo(
                    name=name,
                    content_type=content_type,
                    size=written.size,
                    sha256=written.sha256,
                    updated_at=iso_us(updated_us),
                )
                name_artifact(conn, scope, task_id, turn, info, updated_us, written.key)
                conn.execute(
                    "UPDATE turns SET updated_at = %(updated_at)s, updated_us = %(updated_us)s,"
                    " retain_until = %(retain_until)s, retain_until_us = %(retain_until_us)s"
                    f" WHERE {KEY} AND turn = %(turn)s",
                    task_key(
                        scope,
                        task_id,
                        turn=turn,
                        updated_at=info.updated_at,
                        updated_us=updated_us,
                        retain_until=iso_us(updated_us + self.tasks.retention_us),
                        retain_until_us=updated_us + self.tasks.retention_us,
                    ),
                )
                self.tasks.recompute(conn, scope, task_id)
                pgu.add(conn, scope, artifacts=int(current is None), artifact_bytes=added)
            ticket.settled()
        except BaseException:
            self.tasks.forget_blobs([written.key])
            raise
        # The replaced bytes stay until the sweeper's orphan pass (after the grace period), or
        # a delete of the artifact (name_artifact lists them): a download that began before
        # this commit keeps reading them, as an open file keeps a replaced file's bytes in
        # the tree.
        return info

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream:
        """Open a live artifact for streaming; the caller closes ``file``."""
        validate_id("task_id", task_id)
        validate_turn(turn)
        validate_artifact_name(name)
        missing = f"artifact {name} of turn {turn} of task {task_id} not found"
        gone = None
        for _ in range(8):
            with self.tasks.db.snapshot("artifact") as conn:
                row = conn.execute(
                    "SELECT a.content_type, a.size, a.sha256, a.updated_at, a.blob"
                    " FROM artifacts a JOIN turns u USING (tenant, project, task_id, turn)"
                    " WHERE a.tenant = %(tenant)s AND a.project = %(project)s"
                    " AND a.task_id = %(task_id)s AND a.turn = %(turn)s AND a.name = %(name)s"
                    " AND u.retain_until_us > %(now)s",
                    task_key(scope, task_id, turn=turn, name=name, now=self.tasks.now_us()),
                ).fetchone()
            if row is None:
                raise NotFound(missing)
            content_type, size, sha256, updated_at, blob = row
            info = ArtifactInfo(name, content_type, int(size), sha256, updated_at)
            try:
                file = self.tasks.blobs.open(blob, int(size))
            except FileNotFoundError:
                if blob == gone:
                    # The row still names it: the object was lost (fsck reports it), not
                    # replaced; a missing file in the tree answers the same.
                    raise NotFound(missing) from None
                gone = blob  # deleted since the row was read (a delete or expiry committed)
                continue
            return ArtifactStream(info=info, file=file, size=int(size))  # type: ignore[arg-type]
        raise LockTimeout(f"artifact {name} is being replaced; retry shortly")
