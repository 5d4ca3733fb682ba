"""The project-memory engine on PostgreSQL (records, listing) and an object store (artifacts).

Every mutation of a task is one transaction holding the task's advisory lock (the tree's
task lock, with the same timeout): read, check preconditions, write the turn and artifact
rows, recompute the task's listing row and its project.md section from its turns, count a
task created or removed in the project. Readers take no lock. Artifact bytes go to the object store before
the transaction that names them (blobs.py); bytes that lose their row (a replacement, a
deletion, an expiry) are removed after the commit or, at the latest, by the sweeper's orphan
pass.

What the API sees is what the tree engine returns: the same ETags (``"t<updated_us>"`` for a
turn, the sha256 for an artifact), the same strictly increasing ``updated_us`` per task, the
same listing order and signed cursors, the same ``project.md`` bytes.

This module holds the reads and the steps every write shares (the task's lock, its listing
row and section, the counters); a turn's write is turns.py's, artifacts are artifacts.py's,
deletes removal.py's, as on the tree.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import IO, Any, BinaryIO

import psycopg
from ulid import ULID

from app.storage.core import ledger as lg, task_list, task_rules
from app.storage.core.clock import Clock, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import NotFound
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    ArtifactUpload,
    TaskFilter,
    TaskIndex,
    TaskPage,
    TaskSummary,
    TurnEntry,
    TurnRecord,
)
from app.storage.core.names import (
    Scope,
    turn_dirname,
    validate_id,
    validate_turn,
)
from app.storage.core.quota import QuotaSource
from app.storage.core.task_list import TaskOrder, substring_values
from app.storage.core.task_rules import (
    DEFAULT_MAX_ARTIFACT_BYTES,
)
from app.storage.pg import digest as pgd, ledger as pgl, turns, usage as pgu
from app.storage.pg.artifacts import PgArtifacts
from app.storage.pg.blobs import BlobStore
from app.storage.pg.db import Database, advisory_xact_lock, backup_running
from app.storage.pg.listing import (
    ARTIFACT_COLUMNS,
    KEY,
    PAGE_COLUMNS,
    RECOMPUTE,
    TURN_COLUMNS,
    TurnRow,
    artifact_row,
    distinct_values,
    filter_terms,
    task_key,
    turn_row,
)
from app.storage.pg.removal import PgRemovals


class PgTaskStore:
    """Durable per-task turn history of every tenant/project in one database and bucket."""

    def __init__(
        self,
        db: Database,
        blobs: BlobStore,
        cursors: CursorCodec,
        *,
        retention: timedelta = timedelta(days=30),
        clock: Clock = system_clock,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        usage: pgu.PgUsage | None = None,
    ) -> None:
        self.db = db
        # Called after a turn write committed: the embedding queue's drain (pg/vectors.py),
        # when an embedder is configured.
        self.text_written: Callable[[Scope], object] | None = None
        # Counters and quotas (pg/usage.py).
        self.usage = usage or pgu.PgUsage(db, QuotaSource(None))
        self.blobs = blobs
        self.cursors = cursors
        self.retention = retention
        self.clock = clock
        self.max_artifact_bytes = max_artifact_bytes
        self.retention_us = retention // timedelta(microseconds=1)
        self.artifacts = PgArtifacts(self)
        self.removals = PgRemovals(self)

    def now_us(self) -> int:
        return to_us(self.clock())

    # -- helpers ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, scope: Scope, task_id: str) -> Iterator[psycopg.Connection[Any]]:
        """One transaction holding the task's lock."""
        validate_id("task_id", task_id)
        with self.db.transaction(f"task {task_id}") as conn:
            advisory_xact_lock(conn, "task", scope.tenant, scope.project, task_id)
            yield conn

    def turn_row(
        self, conn: psycopg.Connection[Any], scope: Scope, task_id: str, turn: int
    ) -> TurnRow | None:
        row = conn.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE {KEY} AND turn = %(turn)s",
            task_key(scope, task_id, turn=turn),
        ).fetchone()
        return None if row is None else turn_row(row)

    def artifact_rows(
        self, conn: psycopg.Connection[Any], scope: Scope, task_id: str, turn: int | None = None
    ) -> dict[int, list[tuple[ArtifactInfo, str]]]:
        where = KEY + ("" if turn is None else " AND turn = %(turn)s")
        rows = conn.execute(
            f"SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE {where}"
            " ORDER BY turn, updated_us, name",
            task_key(scope, task_id, turn=turn),
        ).fetchall()
        found: dict[int, list[tuple[ArtifactInfo, str]]] = {}
        for row in rows:
            number, info, blob = artifact_row(row)
            found.setdefault(number, []).append((info, blob))
        return found

    def task_updated_us(self, conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> int:
        row = conn.execute(
            f"SELECT updated_us FROM tasks WHERE {KEY}", task_key(scope, task_id)
        ).fetchone()
        return 0 if row is None else int(row[0])

    def add_tasks(self, conn: psycopg.Connection[Any], scope: Scope, tasks: int) -> None:
        """Change the project's task count by ``tasks`` (in the transaction that created or
        removed them)."""
        if tasks:
            conn.execute(
                "UPDATE projects SET tasks = tasks + %s WHERE tenant = %s AND project = %s",
                (tasks, scope.tenant, scope.project),
            )

    def recompute(
        self,
        conn: psycopg.Connection[Any],
        scope: Scope,
        task_id: str,
        written: TurnRecord | None = None,
    ) -> None:
        """Set the task's listing row and digest section from its turns. ``written``: the
        turn this transaction wrote, which the section shows if it is the highest and every
        turn lives (its turns are not read again then)."""
        row = conn.execute(
            f"{RECOMPUTE} RETURNING t.latest_turn, t.min_retain_us", task_key(scope, task_id)
        ).fetchone()
        now_us = self.now_us()
        top = None
        if written is not None and row and row[0] == written.turn and row[1] > now_us:
            until = written.updated_us + self.retention_us
            top = (written.turn, written.updated_at, written.summary_md, until)
        pgd.put_section(conn, scope, task_id, now_us, top)

    def settle_task(self, conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> int:
        """Recompute the task's listing row, or drop the task when no turn is left; return the
        change to the project's task count."""
        left = conn.execute(
            f"SELECT count(*) FROM turns WHERE {KEY}", task_key(scope, task_id)
        ).fetchone()
        if left and int(left[0]):
            self.recompute(conn, scope, task_id)
            return 0
        gone = conn.execute(f"DELETE FROM tasks WHERE {KEY}", task_key(scope, task_id))
        return -gone.rowcount

    def forget_blobs(self, keys: list[str]) -> None:
        """Remove objects no row names any more (best effort: the sweeper collects the rest,
        and everything while a backup runs, which may still be reading them)."""
        if keys:
            with contextlib.suppress(Exception):
                with self.db.transaction("objects") as conn:
                    if backup_running(conn):
                        return
                self.blobs.delete(keys)

    # -- turns -----------------------------------------------------------------------------
    # The write of a turn, with its artifacts, is pg/turns.py's.
    def put_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        meta: dict[str, Any],
        summary_md: str,
        actor: str | None = None,
        if_match: str | None = None,
        if_none_match: bool = False,
        artifacts: Iterable[ArtifactUpload] = (),
        size: int | None = None,
    ) -> TurnRecord:
        """Create or replace one turn (pg/turns.py); its text waits to be embedded."""
        record = turns.put_turn(
            self,
            scope,
            task_id,
            turn,
            meta=meta,
            summary_md=summary_md,
            actor=actor,
            if_match=if_match,
            if_none_match=if_none_match,
            artifacts=artifacts,
            size=size,
        )
        if self.text_written is not None:
            self.text_written(scope)
        return record

    def get_turn(self, scope: Scope, task_id: str, turn: int) -> TurnRecord:
        """Read one live turn."""
        validate_id("task_id", task_id)
        validate_turn(turn)
        with self.db.snapshot("turn") as conn:
            row = self.turn_row(conn, scope, task_id, turn)
            if row is None or row.retain_until_us <= self.now_us():
                raise NotFound(f"turn {turn} of task {task_id} not found")
            found = self.artifact_rows(conn, scope, task_id, turn).get(turn, [])
        return row.record(task_id, tuple(info for info, _ in found))

    # -- tasks -----------------------------------------------------------------------------
    def get_task(self, scope: Scope, task_id: str) -> TaskIndex:
        """Read a task's index with only its live turns."""
        validate_id("task_id", task_id)
        now_us = self.now_us()
        with self.db.snapshot("task") as conn:
            task = conn.execute(
                f"SELECT owner, created_at FROM tasks WHERE {KEY}", task_key(scope, task_id)
            ).fetchone()
            rows = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns WHERE {KEY}"
                " AND retain_until_us > %(now)s ORDER BY turn",
                task_key(scope, task_id, now=now_us),
            ).fetchall()
            artifacts = self.artifact_rows(conn, scope, task_id) if rows else {}
        if task is None or not rows:
            raise NotFound(f"task {task_id} not found")
        turns = [turn_row(r) for r in rows]
        entries = tuple(
            TurnEntry(
                turn=t.turn,
                meta=t.meta,
                artifacts=tuple(info.name for info, _ in artifacts.get(t.turn, [])),
                created_at=t.created_at,
                updated_at=t.updated_at,
                retain_until=t.retain_until,
            )
            for t in turns
        )
        return TaskIndex(
            task_id=task_id,
            owner=task[0],
            created_at=task[1],
            updated_at=max(e.updated_at for e in entries),
            retain_until=max(e.retain_until for e in entries),
            turns=entries,
        )

    def owner_of(self, scope: Scope, task_id: str) -> str | None:
        """The token id that created the task (None when unknown or absent)."""
        with self.db.snapshot("task") as conn:
            row = conn.execute(
                f"SELECT owner FROM tasks WHERE {KEY}", task_key(scope, task_id)
            ).fetchone()
        return None if row is None else row[0]

    # -- the ledger (core/ledger.py, pg/ledger.py) --------------------------------------------
    def read_ledger(
        self, scope: Scope, query: lg.LedgerQuery, prices: lg.PriceTable
    ) -> lg.LedgerPage:
        """The project's ledger: totals and a page of rows summed from its rollups."""
        issued = lg.ledger_issued_for(query)
        after = lg.decode_cursor(self.cursors, scope, "ledger", issued, query.cursor)
        if lg.by_owner(query):
            return self._ledger_by_owner(scope, query, prices, issued, after)
        totals, rows = lg.ledger_sql(
            query,
            prices,
            after,
            mark=pgl.mark,
            scope_where=pgl.SCOPE_WHERE,
            scope_params=pgl.scope_params(scope),
        )
        found_totals = None
        with self.db.snapshot("ledger") as conn:
            found_rows = conn.execute(rows.text, rows.params).fetchall() if rows.text else []
            if lg.needs_totals(query, found_rows):
                found_totals = conn.execute(totals.text, totals.params).fetchone()
        return lg.ledger_page(
            query,
            found_totals,
            found_rows,
            lambda key: lg.encode_cursor(self.cursors, scope, "ledger", issued, key),
        )

    def _ledger_by_owner(
        self,
        scope: Scope,
        query: lg.LedgerQuery,
        prices: lg.PriceTable,
        issued: list[Any],
        after: Sequence[Any] | None,
    ) -> lg.LedgerPage:
        """A grouping by owner: the rows by task, then each task's owner, in one snapshot
        (core/ledger.py owner_page)."""
        by_task = lg.by_task_for_owners(query)
        _, rows = lg.ledger_sql(
            by_task,
            prices,
            None,
            mark=pgl.mark,
            scope_where=pgl.SCOPE_WHERE,
            scope_params=pgl.scope_params(scope),
        )
        with self.db.snapshot("ledger") as conn:
            found = conn.execute(rows.text, rows.params).fetchall()
            at = by_task.group_by.index("task")
            tasks = sorted({row[at] for row in found})
            owners = dict(
                conn.execute(
                    "SELECT task_id, owner FROM tasks"
                    " WHERE tenant = %s AND project = %s AND task_id = ANY(%s)",
                    (scope.tenant, scope.project, tasks),
                ).fetchall()
            )
        return lg.owner_page(
            query,
            found,
            owners,
            after,
            lambda key: lg.encode_cursor(self.cursors, scope, "ledger", issued, key),
        )

    def read_timeline(
        self, scope: Scope, query: lg.TimelineQuery, prices: lg.PriceTable
    ) -> lg.TimelinePage:
        """A page of the project's turns across tasks, newest first."""
        issued = query.filters.selecting()
        after = lg.decode_cursor(self.cursors, scope, "timeline", issued, query.cursor)
        sql = lg.timeline_sql(
            query,
            after,
            mark=pgl.mark,
            scope_where=pgl.SCOPE_WHERE,
            scope_params=pgl.scope_params(scope),
        )
        with self.db.snapshot("timeline") as conn:
            rows = conn.execute(sql.text, sql.params).fetchall()
        return lg.timeline_page(
            query,
            rows,
            prices,
            lambda key: lg.encode_cursor(self.cursors, scope, "timeline", issued, key),
        )

    def list_tasks(
        self,
        scope: Scope,
        *,
        limit: int = 50,
        cursor: str | None = None,
        prefix: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        failed: bool = False,
        sort: str = "updated",
        descending: bool = True,
        backward: bool = False,
    ) -> TaskPage:
        """A page of live tasks in an order of core/task_list.py, with signed keyset cursors
        to the pages after and before it (the tree's TaskStore.list_tasks)."""
        task_rules.check_list(limit, prefix)
        order = TaskOrder(sort, descending)
        key = task_list.decode_cursor(self.cursors, scope, order, cursor) if cursor else None
        backward = backward and key is not None
        now_us = self.now_us()
        params: dict[str, object] = {
            "tenant": scope.tenant,
            "project": scope.project,
            "now": now_us,
            "limit": limit + 1,
        }
        where = "t.tenant = %(tenant)s AND t.project = %(project)s AND t.retain_until_us > %(now)s"
        only = TaskFilter(prefix, model or None, agent_id or None, failed)
        keyset = ""
        if key is not None:
            keyset = order.keyset(key, params, backward=backward, mark=lambda n: f"%({n})s")
        with self.db.snapshot("listing") as conn:
            exact = substring_values(only, lambda c, n: distinct_values(conn, scope, c, n))
            filters = filter_terms(only, params, exact)
            rows = conn.execute(
                f"{PAGE_COLUMNS} WHERE {where}{filters}{keyset}"
                f" ORDER BY {order.order_by(backward=backward)} LIMIT %(limit)s",
                params,
            ).fetchall()
            total_row = conn.execute(
                "SELECT p.tasks - (SELECT count(*) FROM tasks t WHERE t.tenant = p.tenant"
                " AND t.project = p.project AND t.retain_until_us <= %(now)s)"
                " FROM projects p WHERE p.tenant = %(tenant)s AND p.project = %(project)s",
                params,
            ).fetchone()
            matched = None
            if filters:
                found = conn.execute(
                    f"SELECT count(*) FROM tasks t WHERE {where}{filters}", params
                ).fetchone()
                matched = int(found[0]) if found else 0
        return task_list.task_page(
            rows,
            limit=limit,
            order=order,
            backward=backward,
            from_cursor=key is not None,
            codec=self.cursors,
            scope=scope,
            total=int(total_row[0]) if total_row else 0,
            matched=matched,
        )

    def task_summary(self, scope: Scope, task_id: str) -> TaskSummary:
        """A live task as the task list shows it (its listing row); NotFound otherwise."""
        validate_id("task_id", task_id)
        with self.db.snapshot("listing") as conn:
            row = conn.execute(
                f"{PAGE_COLUMNS} WHERE t.tenant = %(tenant)s AND t.project = %(project)s"
                " AND t.task_id = %(task_id)s AND t.retain_until_us > %(now)s",
                task_key(scope, task_id, now=self.now_us()),
            ).fetchone()
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return task_list.summary(row)

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None:
        """Delete a task with its turns and artifacts (app/storage/pg/removal.py)."""
        self.removals.delete_task(scope, task_id, only_owner=only_owner)

    def delete_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one live turn with its artifacts (app/storage/pg/removal.py)."""
        self.removals.delete_turn(scope, task_id, turn, only_owner=only_owner, if_match=if_match)

    def delete_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one artifact of a live turn (app/storage/pg/removal.py)."""
        self.removals.delete_artifact(
            scope, task_id, turn, name, only_owner=only_owner, if_match=if_match
        )

    # -- artifacts (pg/artifacts.py) --------------------------------------------
    def blob_key(self, scope: Scope, task_id: str, turn: int, name: str) -> str:
        """A new object key for one upload of an artifact (the tree's path, then an id)."""
        return self.blobs.key(
            scope.tenant, scope.project, task_id, turn_dirname(turn), "artifacts", name, str(ULID())
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
        """Stream an artifact to the object store, then name it in one transaction."""
        return self.artifacts.put_artifact(
            scope,
            task_id,
            turn,
            name,
            stream,
            content_type=content_type,
            if_match=if_match,
            if_none_match=if_none_match,
            size=size,
        )

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream:
        """Open a live artifact for streaming; the caller closes ``file``."""
        return self.artifacts.open_artifact(scope, task_id, turn, name)

    # -- project digest --------------------------------------------------------------------
    def open_digest(self, scope: Scope) -> tuple[BinaryIO, int]:
        """``project.md`` from one snapshot of the stored sections (pg/digest.py)."""
        return pgd.open_stream(self.db, scope, self.now_us)

    def open_digest_head(
        self, scope: Scope, *, limit: int | None = None, since_us: int | None = None
    ) -> tuple[BinaryIO, int | None]:
        """The title and the newest sections of ``project.md`` (app/storage/pg/digest.py)."""
        return pgd.open_head(self.db, scope, self.now_us, limit=limit, since_us=since_us)
