"""The task tables on PostgreSQL, as the task engine, its artifacts and the backup read them:
their columns and rows, the task's listing row recomputed from its turns, and the pages of the
task list with their filters (the tree's is tree/sqlite/listing.py).

The listing row of a task keeps the columns of its highest turn, its turn count and its
earliest and latest expiry, recomputed in the transaction that changes its turns; a page reads
them, and falls back to the live turns only for a task one of whose turns has expired."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.storage.core.models import (
    ArtifactInfo,
    TaskFilter,
    TurnRecord,
)
from app.storage.core.names import (
    Scope,
)
from app.storage.core.task_list import needle

TURN_COLUMNS = (
    "turn, meta, summary, created_at, updated_at, retain_until, updated_us, retain_until_us"
)
ARTIFACT_COLUMNS = "turn, name, content_type, size, sha256, updated_at, blob"
KEY = "tenant = %(tenant)s AND project = %(project)s AND task_id = %(task_id)s"
# The task's listing row from its turn rows, in the transaction that changed them: the
# columns of its highest turn, its turn count, its earliest and latest expiry and its bytes
# (its turns' meta and summaries and its artifacts, as the usage counters count them).
RECOMPUTE = f"""
UPDATE tasks t SET
    updated_us = a.updated_us, retain_until_us = a.retain_until_us, turn_count = a.n,
    latest_turn = a.latest, min_retain_us = a.min_retain,
    model = l.model, agent_id = l.agent_id, exit_code = l.exit_code,
    bytes = a.turn_bytes + (SELECT coalesce(sum(size), 0) FROM artifacts WHERE {KEY})
FROM (SELECT max(updated_us) AS updated_us, max(retain_until_us) AS retain_until_us,
             count(*) AS n, max(turn) AS latest, min(retain_until_us) AS min_retain,
             coalesce(sum(octet_length(meta) + octet_length(summary)), 0) AS turn_bytes
      FROM turns WHERE {KEY}) a,
     (SELECT model, agent_id, exit_code FROM turns WHERE {KEY}
      ORDER BY turn DESC LIMIT 1) l
WHERE t.tenant = %(tenant)s AND t.project = %(project)s AND t.task_id = %(task_id)s
"""
_ALIVE_TURNS = (
    "FROM turns u WHERE u.tenant = t.tenant AND u.project = t.project"
    " AND u.task_id = t.task_id AND u.retain_until_us > %(now)s"
)
_ALL_ALIVE = "t.min_retain_us > %(now)s"


def live(column: str) -> str:
    """``column`` of the task's highest live turn: the stored one while every turn lives."""
    return (
        f"CASE WHEN {_ALL_ALIVE} THEN t.{column} ELSE"
        f" (SELECT u.{column} {_ALIVE_TURNS} ORDER BY u.turn DESC LIMIT 1) END"
    )


PAGE_COLUMNS = (
    "SELECT t.task_id, t.updated_us, t.retain_until_us,"
    f" CASE WHEN {_ALL_ALIVE} THEN t.turn_count ELSE (SELECT count(*) {_ALIVE_TURNS}) END,"
    f" CASE WHEN {_ALL_ALIVE} THEN t.latest_turn ELSE (SELECT max(turn) {_ALIVE_TURNS}) END,"
    f" t.owner, {live('model')}, {live('agent_id')}, {live('exit_code')}, t.bytes"
    " FROM tasks t"
)


def task_key(scope: Scope, task_id: str, **more: object) -> dict[str, object]:
    return {"tenant": scope.tenant, "project": scope.project, "task_id": task_id, **more}


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A turn row as read, with its artifacts (in the order the record lists them)."""

    turn: int
    meta: dict[str, Any]
    summary_md: str
    created_at: str
    updated_at: str
    retain_until: str
    updated_us: int
    retain_until_us: int

    def record(self, task_id: str, artifacts: tuple[ArtifactInfo, ...]) -> TurnRecord:
        return TurnRecord(
            task_id=task_id,
            turn=self.turn,
            meta=self.meta,
            summary_md=self.summary_md,
            artifacts=artifacts,
            created_at=self.created_at,
            updated_at=self.updated_at,
            retain_until=self.retain_until,
            updated_us=self.updated_us,
        )


def turn_row(row: tuple[Any, ...]) -> TurnRow:
    turn, meta, summary, created_at, updated_at, retain_until, updated_us, retain_us = row
    return TurnRow(
        turn=int(turn),
        meta=json.loads(meta),
        summary_md=bytes(summary).decode("utf-8"),
        created_at=created_at,
        updated_at=updated_at,
        retain_until=retain_until,
        updated_us=int(updated_us),
        retain_until_us=int(retain_us),
    )


def artifact_row(row: tuple[Any, ...]) -> tuple[int, ArtifactInfo, str]:
    turn, name, content_type, size, sha256, updated_at, blob = row
    return int(turn), ArtifactInfo(name, content_type, int(size), sha256, updated_at), blob


def filter_terms(
    only: TaskFilter,
    params: dict[str, object],
    values: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The WHERE terms of ``only``, its values added to ``params``. The prefix and the exit
    code are index ranges; a model or agent substring is an index lookup of the ``values``
    that hold it when they are given (core/task_list.py), else a test on each row the page's
    order walks. The stored columns are those of the task's highest turn; once a turn has
    expired (until the sweeper drops it) the highest live turn's value is checked as well."""
    where = ""
    if only.prefix:
        where += " AND t.task_id >= %(lo)s AND t.task_id < %(hi)s"
        params["lo"], params["hi"] = only.prefix_range()
    for column, value in (("model", only.model), ("agent_id", only.agent_id)):
        found = needle(value)
        if found is None:
            continue
        exact = None if values is None else values.get(column)
        if exact is not None:
            params[f"{column}_in"] = list(exact)
            where += (
                f" AND t.{column} = ANY(%({column}_in)s)"
                f" AND ({live(column)}) = ANY(%({column}_in)s)"
            )
            continue
        # Under the "C" collation lower() changes ASCII letters only, as SQLite's does
        # (core/task_list.py): both engines find the same tasks.
        where += (
            f' AND strpos(lower(t.{column} COLLATE "C"), %({column})s) > 0'
            f' AND strpos(lower(({live(column)}) COLLATE "C"), %({column})s) > 0'
        )
        params[column] = found
    if only.failed:
        where += f" AND t.exit_code <> 0 AND ({live('exit_code')}) <> 0"
    return where


def distinct_values(
    conn: psycopg.Connection[Any], scope: Scope, column: str, limit: int
) -> list[str]:
    """Up to ``limit`` distinct values of a project's tasks ``column``, each one index seek
    (tasks_model / tasks_agent, skipped value to value)."""
    of = "tenant = %(tenant)s AND project = %(project)s"
    rows = conn.execute(
        f"WITH RECURSIVE v(x) AS (SELECT min({column}) FROM tasks WHERE {of} UNION ALL"
        f" SELECT (SELECT min({column}) FROM tasks WHERE {of} AND {column} > v.x) FROM v"
        " WHERE v.x IS NOT NULL) SELECT x FROM v WHERE x IS NOT NULL LIMIT %(limit)s",
        {"tenant": scope.tenant, "project": scope.project, "limit": limit},
    ).fetchall()
    return [r[0] for r in rows]
