"""The audit log on PostgreSQL: the ``audit_events`` table (core/audit.py; the tree's is
tree/audit.py)."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

from typing import Any

from app.storage.core import audit
from app.storage.core.audit import AuditEvent
from app.storage.pg.db import Database

_COLUMNS = ", ".join(audit.COLUMNS)


class PgAudit:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, event: AuditEvent) -> None:
        marks = ", ".join(["%s"] * len(audit.COLUMNS))
        with self.db.transaction("audit log") as conn:
            conn.execute(
                f"INSERT INTO audit_events ({_COLUMNS}) VALUES ({marks})", audit.values(event)
            )

    def rows(
        self,
        tenant: str,
        project: str,
        *,
        actor: str | None,
        kind: str | None,
        key: tuple[int, str] | None,
        backward: bool,
        limit: int,
    ) -> list[tuple[Any, ...]]:
        params: dict[str, object] = {"tenant": tenant, "project": project, "limit": limit}
        terms, order = audit.where(
            actor, kind, key, backward=backward, mark=lambda n: f"%({n})s", params=params
        )
        with self.db.snapshot("audit log") as conn:
            return conn.execute(
                f"SELECT {_COLUMNS} FROM audit_events WHERE tenant = %(tenant)s"
                f" AND project = %(project)s{terms} ORDER BY {order} LIMIT %(limit)s",
                params,
            ).fetchall()

    def prune(self, before_us: int) -> int:
        with self.db.transaction("audit log") as conn:
            return int(
                conn.execute("DELETE FROM audit_events WHERE at_us < %s", (before_us,)).rowcount
            )
