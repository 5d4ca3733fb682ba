"""Removing what a task holds on PostgreSQL: the whole task, one turn, one artifact.

Each is one transaction under the task's lock, as every task mutation: the rows go, the
task's listing row and project.md section are recomputed from the turns that are left (the
last live turn takes its task with it, as a task delete), the counters follow, and the
artifacts' objects are deleted after the commit: their current bytes and those earlier
uploads of the same artifact left (artifacts.py ``forget_superseded``). The database's own words (the generated
search columns) go with their rows; their bytes stay in dead rows until vacuum and in the
WAL until it is recycled (docs/guarantees.md).
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from app.storage.core.clock import iso_us
from app.storage.core.errors import NotFound, NotOwner
from app.storage.core.models import TurnRecord, artifact_etag
from app.storage.core.names import Scope, validate_artifact_name, validate_id, validate_turn
from app.storage.core.task_rules import NOT_OWNER, check_preconditions, next_updated_us
from app.storage.pg import usage as pgu
from app.storage.pg.artifacts import TaskLock, forget_superseded
from app.storage.pg.listing import KEY, task_key


class TaskRows(TaskLock, Protocol):
    """What the removals need of the task engine (PgTaskStore): its lock and rows
    (:class:`TaskLock`) and the steps that keep a task's counters and objects right."""

    def settle_task(self, conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> int: ...

    def add_tasks(self, conn: psycopg.Connection[Any], scope: Scope, tasks: int) -> None: ...

    def forget_blobs(self, keys: list[str]) -> None: ...


class PgRemovals:
    """The task, turn and artifact deletes of one database and bucket (PgTaskStore's)."""

    def __init__(self, tasks: TaskRows) -> None:
        self.tasks = tasks

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None:
        """Delete a task with its turns and artifacts in one transaction, then its bytes."""
        tasks = self.tasks
        with tasks.transaction(scope, task_id) as conn:
            task = conn.execute(
                f"SELECT owner FROM tasks WHERE {KEY}", task_key(scope, task_id)
            ).fetchone()
            live = conn.execute(
                f"SELECT 1 FROM turns WHERE {KEY} AND retain_until_us > %(now)s LIMIT 1",
                task_key(scope, task_id, now=tasks.now_us()),
            ).fetchone()
            if task is None or live is None:
                raise NotFound(f"task {task_id} not found")
            if only_owner is not None and task[0] != only_owner:
                raise NotOwner(NOT_OWNER)
            blobs = self.drop_task(conn, scope, task_id)
        tasks.forget_blobs(blobs)

    def drop_task(self, conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> list[str]:
        """Delete the task's rows and take them off the counters (in the caller's
        transaction, under the task's lock); return the object keys its artifacts had."""
        key = task_key(scope, task_id)
        blobs = forget_superseded(conn, scope, task_id)
        blobs += [r[0] for r in conn.execute(f"SELECT blob FROM artifacts WHERE {KEY}", key)]
        gone = pgu.task_sums(conn, key)
        conn.execute(f"DELETE FROM tasks WHERE {KEY}", key)
        self.tasks.add_tasks(conn, scope, -1)
        pgu.add(conn, scope, **pgu.negated(gone))
        return blobs

    def _live_turn(
        self,
        conn: psycopg.Connection[Any],
        scope: Scope,
        task_id: str,
        turn: int,
        only_owner: str | None,
    ) -> tuple[TurnRecord, int]:
        """The live turn (without its artifacts) and how many live turns its task has;
        NotFound or NotOwner (the caller holds the task's lock)."""
        now_us = self.tasks.now_us()
        key = task_key(scope, task_id, turn=turn, now=now_us)
        task = conn.execute(f"SELECT owner FROM tasks WHERE {KEY}", key).fetchone()
        (live,) = conn.execute(
            f"SELECT count(*) FROM turns WHERE {KEY} AND retain_until_us > %(now)s", key
        ).fetchone() or (0,)
        if task is None or not live:
            raise NotFound(f"task {task_id} not found")
        row = self.tasks.turn_row(conn, scope, task_id, turn)
        if row is None or row.retain_until_us <= now_us:
            raise NotFound(f"turn {turn} of task {task_id} not found")
        if only_owner is not None and task[0] != only_owner:
            raise NotOwner(NOT_OWNER)
        return row.record(task_id, ()), int(live)

    def delete_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        validate_id("task_id", task_id)
        validate_turn(turn)
        tasks = self.tasks
        with tasks.transaction(scope, task_id) as conn:
            record, live = self._live_turn(conn, scope, task_id, turn, only_owner)
            check_preconditions(record.etag, if_match, False)
            if live == 1:
                blobs = self.drop_task(conn, scope, task_id)
            else:
                key = task_key(scope, task_id, turn=turn)
                gone = pgu.task_sums(conn, key, [turn])
                blobs = forget_superseded(conn, scope, task_id, turn) + [
                    r[0]
                    for r in conn.execute(
                        f"DELETE FROM artifacts WHERE {KEY} AND turn = %(turn)s RETURNING blob",
                        key,
                    )
                ]
                conn.execute(f"DELETE FROM turns WHERE {KEY} AND turn = %(turn)s", key)
                tasks.add_tasks(conn, scope, tasks.settle_task(conn, scope, task_id))
                pgu.add(conn, scope, **pgu.negated(gone))
        tasks.forget_blobs(blobs)

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
        validate_id("task_id", task_id)
        validate_turn(turn)
        validate_artifact_name(name)
        tasks = self.tasks
        with tasks.transaction(scope, task_id) as conn:
            self._live_turn(conn, scope, task_id, turn, only_owner)
            key = task_key(scope, task_id, turn=turn, name=name)
            current = conn.execute(
                f"SELECT sha256, blob, size FROM artifacts WHERE {KEY} AND turn = %(turn)s"
                " AND name = %(name)s",
                key,
            ).fetchone()
            if current is None:
                raise NotFound(f"artifact {name} of turn {turn} of task {task_id} not found")
            check_preconditions(artifact_etag(current[0]), if_match, False)
            updated_us = next_updated_us(
                tasks.task_updated_us(conn, scope, task_id), tasks.now_us()
            )
            blobs = [str(current[1]), *forget_superseded(conn, scope, task_id, turn, name)]
            conn.execute(
                f"DELETE FROM artifacts WHERE {KEY} AND turn = %(turn)s AND name = %(name)s", key
            )
            # A write of the turn, as an upload is: its times move, its ETag changes.
            until = updated_us + tasks.retention_us
            conn.execute(
                "UPDATE turns SET updated_at = %(updated_at)s, updated_us = %(updated_us)s,"
                " retain_until = %(retain_until)s, retain_until_us = %(retain_until_us)s"
                f" WHERE {KEY} AND turn = %(turn)s",
                task_key(
                    scope,
                    task_id,
                    turn=turn,
                    updated_at=iso_us(updated_us),
                    updated_us=updated_us,
                    retain_until=iso_us(until),
                    retain_until_us=until,
                ),
            )
            tasks.recompute(conn, scope, task_id)
            pgu.add(conn, scope, artifacts=-1, artifact_bytes=-int(current[2]))
        tasks.forget_blobs(blobs)
