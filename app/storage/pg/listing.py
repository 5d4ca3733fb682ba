"""The task tables on PostgreSQL, as the task engine, its artifacts and the backup read them:
their columns and rows, the task's listing row recomputed from its turns, and the pages of the
task list with their filters (the tree's is tree/sqlite/listing.py).

The listing row of a task keeps the columns of its highest turn, its turn count and its
earliest and latest expiry, recomputed in the transaction that changes its turns; a page reads
them, and falls back to the live turns only for a task one of whose turns has expired."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.storage.core.models import (
    ArtifactInfo,
    TaskFilter,
    TurnRecord,
)
from app.storage.core.names import (
    Scope,
)

TURN_COLUMNS = (
    "turn, meta, summary, created_at, updated_at, retain_until, updated_us, retain_until_us"
)
ARTIFACT_COLUMNS = "turn, name, content_type, size, sha256, updated_at, blob"
KEY = "tenant = %(tenant)s AND project = %(project)s AND task_id = %(task_id)s"
# The task's listing row from its turn rows, in the transaction that changed them: the
# columns of its highest turn, its turn count and its earliest and latest expiry.
RECOMPUTE = f"""
UPDATE tasks t SET
    updated_us = a.updated_us, retain_until_us = a.retain_until_us, turn_count = a.n,
    latest_turn = a.latest, min_retain_us = a.min_retain,
    model = l.model, agent_id = l.agent_id, exit_code = l.exit_code
FROM (SELECT max(updated_us) AS updated_us, max(retain_until_us) AS retain_until_us,
             count(*) AS n, max(turn) AS latest, min(retain_until_us) AS min_retain
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
    f" t.owner, {live('model')}, {live('agent_id')}, {live('exit_code')}"
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


def filter_terms(only: TaskFilter, params: dict[str, object]) -> str:
    """The WHERE terms of ``only``, its values added to ``params``; each column test can use
    an index. The stored columns are those of the task's highest turn; once a turn has
    expired (until the sweeper drops it) the highest live turn's value is checked as well."""
    where = ""
    if only.prefix:
        where += " AND t.task_id >= %(lo)s AND t.task_id < %(hi)s"
        params["lo"], params["hi"] = only.prefix_range()
    for column, value in (("model", only.model), ("agent_id", only.agent_id)):
        if value is not None:
            where += f" AND t.{column} = %({column})s AND ({live(column)}) = %({column})s"
            params[column] = value
    if only.failed:
        where += f" AND t.exit_code <> 0 AND ({live('exit_code')}) <> 0"
    return where
