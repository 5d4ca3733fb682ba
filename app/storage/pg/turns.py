"""Writing a turn on PostgreSQL: its artifacts to the object store first, then one
transaction under the task's lock for the turn's row, its artifacts' rows, the task's
listing row and project.md section and the counters (PgTaskStore.put_turn; the lock and the
rows it reads: tasks.py).

Objects staged for a write that then fails are deleted (the sweeper's orphan pass collects
what that misses); bytes a rewrite of an expired turn drops go after the commit.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Protocol

import psycopg

from app.storage.core import task_rules
from app.storage.core.clock import iso_us
from app.storage.core.encoding import dumps_compact
from app.storage.core.ledger import entry_of
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactUpload,
    StagedUpload,
    TurnRecord,
    turn_etag,
)
from app.storage.core.names import Scope
from app.storage.core.task_rules import (
    check_preconditions,
    meta_facts,
    next_updated_us,
    written_turn,
)
from app.storage.core.usage import Ticket
from app.storage.pg import ledger as pgl, usage as pgu
from app.storage.pg.artifacts import PgArtifacts, TaskRows, forget_superseded, name_artifact
from app.storage.pg.blobs import Written
from app.storage.pg.listing import KEY, task_key


class TurnWrites(TaskRows, Protocol):
    """What a turn's write needs of the task engine (PgTaskStore) besides an artifact's: the
    artifacts it stages, a turn's artifact rows, and the steps that keep the task count and
    the objects right."""

    artifacts: PgArtifacts

    def artifact_rows(
        self, conn: psycopg.Connection[Any], scope: Scope, task_id: str, turn: int | None = None
    ) -> dict[int, list[tuple[ArtifactInfo, str]]]: ...

    def add_tasks(self, conn: psycopg.Connection[Any], scope: Scope, tasks: int) -> None: ...

    def forget_blobs(self, keys: list[str]) -> None: ...


def put_turn(
    store: TurnWrites,
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
    """Create or replace one turn's meta and summary; keep created_at and artifacts.

    ``artifacts`` (app/storage/interface.py) go to the object store first and are named
    in the turn's transaction, as put_artifact does one."""
    summary = task_rules.check_turn(task_id, turn, meta, summary_md)
    uploads = iter(artifacts)
    first = next(uploads, None)
    if first is None:  # the seed's write
        return _put_turn(store, scope, task_id, turn, meta, summary_md, summary, actor,
                              if_match, if_none_match, [], None)  # fmt: skip
    with store.db.snapshot("turn") as conn:
        row = store.turn_row(conn, scope, task_id, turn)
        alive = row if row and row.retain_until_us > store.now_us() else None
        found = store.artifact_rows(conn, scope, task_id, turn).get(turn, []) if alive else []
    # Checked again in the transaction; a write that cannot succeed reads no body.
    check_preconditions(turn_etag(alive.updated_us) if alive else None, if_match, if_none_match)
    ticket = store.usage.admit(scope)
    staged: list[StagedUpload[Written]] = []
    try:
        credits = {info.name: info.size for info, _ in found}
        chained = itertools.chain((first,), uploads)
        store.artifacts.stage_uploads(scope, task_id, turn, chained, credits, ticket, staged)
        record = _put_turn(store, scope, task_id, turn, meta, summary_md, summary, actor,
                                if_match, if_none_match, staged, ticket)  # fmt: skip
        ticket.settled()
        return record
    except BaseException:
        store.forget_blobs([u.handle.key for u in staged])
        raise
    finally:
        ticket.release()  # nothing to release once the write settled it


def _put_turn(
    store: TurnWrites,
    scope: Scope,
    task_id: str,
    turn: int,
    meta: dict[str, Any],
    summary_md: str,
    summary: bytes,
    actor: str | None,
    if_match: str | None,
    if_none_match: bool,
    staged: list[StagedUpload[Written]],
    ticket: Ticket | None,
) -> TurnRecord:
    """The transaction of a put_turn whose turn was checked (``summary``: its summary's
    bytes) and whose artifacts, if any, are ``staged``."""
    meta_json = dumps_compact(meta)
    meta_text = meta_json.decode("utf-8")
    model, agent_id, exit_code = meta_facts(meta)
    stale: list[str] = []
    with store.transaction(scope, task_id) as conn:
        now_us = store.now_us()
        previous = store.turn_row(conn, scope, task_id, turn)
        alive = previous if previous and previous.retain_until_us > now_us else None
        check_preconditions(turn_etag(alive.updated_us) if alive else None, if_match, if_none_match)
        last_us = store.task_updated_us(conn, scope, task_id)
        updated_us = next_updated_us(last_us, now_us)
        key = task_key(scope, task_id)
        new_bytes = len(meta_json) + len(summary)  # core/records.py usage_of_turn's count
        old_bytes = pgu.turn_bytes(conn, key, turn) or 0
        # An expired turn's artifacts go with the rewrite.
        gone = pgu.task_sums(conn, key, [turn]) if previous is not None and alive is None else {}
        kept: list[ArtifactInfo] = []
        if alive is not None:
            kept = [
                info for info, _ in store.artifact_rows(conn, scope, task_id, turn).get(turn, [])
            ]
        # Written at one instant: in name order, as the artifacts are listed.
        added = sorted((u.info(iso_us(updated_us)) for u in staged), key=lambda a: a.name)
        names = {a.name for a in added}
        replaced = [a for a in kept if a.name in names]
        artifact_bytes = sum(a.size for a in added) - sum(a.size for a in replaced)
        # In this transaction, under the project's advisory lock: no project row needed.
        store.usage.check(
            conn,
            scope,
            new_bytes - old_bytes - gone.get("artifact_bytes", 0) + artifact_bytes,
            int(last_us == 0),
            exclude=ticket.id if ticket is not None else None,
        )
        pgu.ensure_project(conn, scope)
        created = conn.execute(
            "INSERT INTO tasks (tenant, project, task_id, owner, created_at)"
            " VALUES (%(tenant)s, %(project)s, %(task_id)s, %(owner)s, %(created_at)s)"
            " ON CONFLICT DO NOTHING",
            task_key(scope, task_id, owner=actor, created_at=iso_us(now_us)),
        ).rowcount
        if previous is not None and alive is None:
            # The old turn expired: it is gone for every reader, so its artifacts must
            # not come back with the new write.
            stale = forget_superseded(conn, scope, task_id, turn) + [
                r[0]
                for r in conn.execute(
                    f"DELETE FROM artifacts WHERE {KEY} AND turn = %(turn)s RETURNING blob",
                    task_key(scope, task_id, turn=turn),
                )
            ]
        record = written_turn(
            task_id,
            turn,
            meta=meta,
            summary_md=summary_md,
            artifacts=tuple(a for a in kept if a.name not in names) + tuple(added),
            created_at=alive.created_at if alive else None,
            updated_us=updated_us,
            retention_us=store.retention_us,
            task_created=bool(created),
        )
        conn.execute(
            "INSERT INTO turns (tenant, project, task_id, turn, meta, summary, created_at,"
            " updated_at, retain_until, updated_us, retain_until_us, model, agent_id,"
            " exit_code) VALUES (%(tenant)s, %(project)s, %(task_id)s, %(turn)s, %(meta)s,"
            " %(summary)s, %(created_at)s, %(updated_at)s, %(retain_until)s,"
            " %(updated_us)s, %(retain_until_us)s, %(model)s, %(agent_id)s, %(exit_code)s)"
            " ON CONFLICT (tenant, project, task_id, turn) DO UPDATE SET"
            " meta = excluded.meta, summary = excluded.summary,"
            " created_at = excluded.created_at, updated_at = excluded.updated_at,"
            " retain_until = excluded.retain_until, updated_us = excluded.updated_us,"
            " retain_until_us = excluded.retain_until_us, model = excluded.model,"
            " agent_id = excluded.agent_id, exit_code = excluded.exit_code",
            task_key(
                scope,
                task_id,
                turn=turn,
                meta=meta_text,
                summary=summary,
                created_at=record.created_at,
                updated_at=record.updated_at,
                retain_until=record.retain_until,
                updated_us=updated_us,
                retain_until_us=updated_us + store.retention_us,
                model=model,
                agent_id=agent_id,
                exit_code=exit_code,
            ),
        )
        for upload, info in zip(sorted(staged, key=lambda u: u.name), added, strict=True):
            name_artifact(conn, scope, task_id, turn, info, updated_us, upload.handle.key)
        pgl.put(conn, scope, entry_of(record))
        store.recompute(conn, scope, task_id, record)
        store.add_tasks(conn, scope, created)
        pgu.add(
            conn,
            scope,
            turns=int(previous is None),
            turn_bytes=new_bytes - old_bytes,
            artifacts=len(added) - len(replaced) - gone.get("artifacts", 0),
            artifact_bytes=artifact_bytes - gone.get("artifact_bytes", 0),
        )
        if isinstance(ticket, pgu.PgTicket):
            ticket.settle_in(conn)
    # Replaced bytes stay for the sweeper's orphan pass or a delete, as put_artifact
    # leaves them (name_artifact).
    store.forget_blobs(stale)
    return record
