"""The turn ledger on PostgreSQL (core/ledger.py says what it holds): each turn's entry in
``ledger_turns``, written in the turn's own transaction and removed with its turn (a foreign
key's cascade); a trigger on that table (schema.py, migration 10) moves the rollups
(``ledger``, ``ledger_tasks``) and the session homes (``ledger_sessions``) by the difference
in the same transaction, whichever statement changed the entry. What the tree keeps in
``_ledger.sqlite3`` (tree/sqlite/ledger.py), in tables of the same names."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import psycopg

from app.storage.core import ledger as lg
from app.storage.core.ledger import LedgerTurn
from app.storage.core.names import Scope
from app.storage.pg.db import Database, advisory_xact_lock

_KEY = ("tenant", "project", "task_id", "turn")
_COLUMNS = (*_KEY, *lg.TURN_COLUMNS)
_PUT = (
    f"INSERT INTO ledger_turns ({', '.join(_COLUMNS)})"
    f" VALUES ({', '.join(['%s'] * len(_COLUMNS))})"
    f" ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET"
    f" {', '.join(f'{c} = excluded.{c}' for c in lg.TURN_COLUMNS)}"
    # An entry written again as it was moves nothing (a hook that sent a turn twice).
    f" WHERE ({', '.join(f'ledger_turns.{c}' for c in lg.TURN_COLUMNS)})"
    f" IS DISTINCT FROM ({', '.join(f'excluded.{c}' for c in lg.TURN_COLUMNS)})"
)
SCOPE_WHERE = "c.tenant = %(tenant)s AND c.project = %(project)s"
SCOPE_COLUMNS = ("tenant", "project")
HOME = ("session", "at_us", "task_id", "turn", "day", "agent", "model", "branch")


def mark(name: str) -> str:
    """A named parameter as psycopg spells it."""
    return f"%({name})s"


def scope_params(scope: Scope) -> dict[str, str]:
    return {"tenant": scope.tenant, "project": scope.project}


def put(conn: psycopg.Connection[Any], scope: Scope, entry: LedgerTurn) -> None:
    """Make one turn's entry (in the turn's transaction, after its row)."""
    conn.execute(_PUT, (scope.tenant, scope.project, entry.task_id, entry.turn, *entry.values()))


def set_task(
    conn: psycopg.Connection[Any], scope: Scope, task_id: str, entries: Iterable[LedgerTurn]
) -> None:
    """Make the task's entries exactly ``entries`` (under the task's lock)."""
    wanted = list(entries)
    conn.execute(
        "DELETE FROM ledger_turns WHERE tenant = %s AND project = %s AND task_id = %s"
        " AND NOT (turn = ANY(%s))",
        (scope.tenant, scope.project, task_id, [e.turn for e in wanted]),
    )
    for entry in wanted:
        put(conn, scope, entry)


def task_entries(conn: psycopg.Connection[Any], scope: Scope, task_id: str) -> list[LedgerTurn]:
    rows = conn.execute(
        f"SELECT task_id, turn, {', '.join(lg.TURN_COLUMNS)} FROM ledger_turns"
        " WHERE tenant = %s AND project = %s AND task_id = %s ORDER BY turn",
        (scope.tenant, scope.project, task_id),
    ).fetchall()
    return [lg.row_of(r[0], r[1], r[2:]) for r in rows]


# -- fsck ---------------------------------------------------------------------------------
def differing_entries(conn: psycopg.Connection[Any]) -> list[tuple[Scope, str]]:
    """The tasks whose entries differ from what their turns say (every turn read once, in
    key order, on a server-side cursor)."""
    found: set[tuple[Scope, str]] = set()
    columns = ", ".join(f"l.{c}" for c in lg.TURN_COLUMNS)
    with conn.cursor(name="ledger_fsck") as cur:
        cur.itersize = 2000
        cur.execute(
            f"SELECT t.tenant, t.project, t.task_id, t.turn, t.meta, t.created_at,"
            f" l.turn IS NOT NULL, {columns} FROM turns t LEFT JOIN ledger_turns l"
            " ON l.tenant = t.tenant AND l.project = t.project AND l.task_id = t.task_id"
            " AND l.turn = t.turn ORDER BY t.tenant, t.project, t.task_id, t.turn"
        )
        for tenant, project, task_id, turn, meta, created_at, has, *values in cur:
            want = lg.entry_from(task_id, int(turn), json.loads(meta), created_at)
            have = lg.row_of(task_id, turn, values) if has else None
            if have != want:
                found.add((Scope(tenant, project), task_id))
    return sorted(found, key=lambda k: (k[0].tenant, k[0].project, k[1]))


def _rows(table: str, keys: tuple[str, ...]) -> str:
    return f"SELECT {', '.join((*SCOPE_COLUMNS, *keys, *lg.FIGURES))} FROM {table}"


def differing_rollups(conn: psycopg.Connection[Any]) -> list[tuple[Scope, str, int]]:
    """(project, table, rows that differ) where the rollups or session homes differ from a
    recount of the entries."""
    found: list[tuple[Scope, str, int]] = []
    home_columns = ", ".join((*SCOPE_COLUMNS, *HOME))
    checks = [
        (table, _rows(table, keys), lg.recount_sql(table, SCOPE_COLUMNS))
        for table, keys in lg.ROLLUPS.items()
    ]
    checks.append(
        (
            "ledger_sessions",
            f"SELECT {home_columns} FROM ledger_sessions",
            lg.homes_sql(SCOPE_COLUMNS),
        )
    )
    for table, have, want in checks:
        for tenant, project, count in conn.execute(
            f"SELECT tenant, project, count(*) FROM ((({have}) EXCEPT ({want}))"
            f" UNION ALL (({want}) EXCEPT ({have}))) d GROUP BY tenant, project ORDER BY 1, 2"
        ):
            found.append((Scope(tenant, project), table, int(count)))
    return found


def rebuild_rollups(conn: psycopg.Connection[Any], scope: Scope) -> None:
    """Set a project's rollups and session homes to a recount of its entries (fsck repair;
    the caller's transaction)."""
    params = scope_params(scope)
    conn.execute(
        "SELECT 1 FROM projects WHERE tenant = %(tenant)s AND project = %(project)s"
        " FOR NO KEY UPDATE",
        params,
    )
    scoped = "tenant = %(tenant)s AND project = %(project)s"
    conn.execute(f"DELETE FROM ledger_sessions WHERE {scoped}", params)
    conn.execute(
        f"INSERT INTO ledger_sessions ({', '.join((*SCOPE_COLUMNS, *HOME))})"
        f" {lg.homes_sql(SCOPE_COLUMNS, SCOPE_WHERE)}",
        params,
    )
    for table, keys in lg.ROLLUPS.items():
        conn.execute(f"DELETE FROM {table} WHERE {scoped}", params)
        conn.execute(
            f"INSERT INTO {table} ({', '.join((*SCOPE_COLUMNS, *keys, *lg.FIGURES))})"
            f" {lg.recount_sql(table, SCOPE_COLUMNS, SCOPE_WHERE)}",
            params,
        )


# -- turns written before the ledger ---------------------------------------------------------
def lacking_projects(conn: psycopg.Connection[Any]) -> list[Scope]:
    """The projects whose turn counter differs from the turns their ledger counts (a database
    from before the ledger, an import stopped short): a sum of rollup rows per project."""
    rows = conn.execute(
        "SELECT p.tenant, p.project FROM projects p WHERE p.turns <> coalesce((SELECT"
        " sum(l.turns) FROM ledger_models l WHERE l.tenant = p.tenant AND l.project = p.project), 0)"
        " ORDER BY 1, 2"
    ).fetchall()
    return [Scope(t, p) for t, p in rows]


def fill(db: Database, scope: Scope, batch: int = 200) -> int:
    """Write the entries the project's turns lack, ``batch`` tasks per transaction, each
    task's from its turns under its lock; how many tasks were filled. Every task lock of a
    batch is taken (in key order) before its first entry moves a sum, which holds the
    project's row: a writer holds one task lock before that row too, so none waits in a
    circle."""
    filled, after = 0, ""
    while True:
        with db.snapshot("ledger") as conn:
            lacking = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT t.task_id FROM turns t WHERE t.tenant = %(tenant)s"
                    " AND t.project = %(project)s AND t.task_id > %(after)s AND NOT EXISTS"
                    " (SELECT 1 FROM ledger_turns l WHERE l.tenant = t.tenant"
                    " AND l.project = t.project AND l.task_id = t.task_id AND l.turn = t.turn)"
                    " ORDER BY 1 LIMIT %(batch)s",
                    {**scope_params(scope), "after": after, "batch": batch},
                )
            ]
        if not lacking:
            return filled
        with db.transaction("ledger") as conn:
            for task_id in lacking:
                advisory_xact_lock(conn, "task", scope.tenant, scope.project, task_id)
            for task_id in lacking:
                rows = conn.execute(
                    "SELECT turn, meta, created_at FROM turns WHERE tenant = %s AND project = %s"
                    " AND task_id = %s ORDER BY turn",
                    (scope.tenant, scope.project, task_id),
                ).fetchall()
                set_task(
                    conn,
                    scope,
                    task_id,
                    [lg.entry_from(task_id, int(t), json.loads(m), c) for t, m, c in rows],
                )
        filled += len(lacking)
        after = lacking[-1]


def fill_lacking(db: Database) -> list[str]:
    """:func:`fill` every project :func:`lacking_projects` names; a line for each one."""
    with db.snapshot("ledger") as conn:
        scopes = lacking_projects(conn)
    lines = []
    for scope in scopes:
        count = fill(db, scope)
        if count:
            lines.append(
                f"ledger: {count} task(s) of {scope.tenant}/{scope.project} written before it"
                " filled from their turns"
            )
    return lines
