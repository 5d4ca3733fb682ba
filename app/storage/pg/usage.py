"""Usage counters, quotas and traffic on PostgreSQL (core/usage.py says what they are).

The counters are columns of the ``projects`` row, moved by every write in its own
transaction, by what it changed. A write that adds bytes checks its quotas in that same
transaction, under an advisory lock per project (and one per tenant when the tenant has a
quota) that every such check takes: what it reads is what is committed, and no other writer
of the quota can check in between. An artifact's bytes go to the object store before its
transaction, so it reserves first, in a transaction of its own (a ``usage_reservations``
row with a lease it renews while the body streams in), and drops the reservation in the
transaction that names the bytes. A node that dies leaves its reservations to their lease.

The project-level SQL is here, as named queries; the engines call them with their connection.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from ulid import ULID

from app.storage.core.names import Scope
from app.storage.core.quota import QuotaSource
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import (
    KINDS,
    NO_TICKET,
    ZERO,
    HeldTicket,
    Reserved,
    Ticket,
    Usage,
    lease_until,
    over_quota,
    wall_us,
)
from app.storage.pg.db import Database, advisory_xact_lock

_COLUMNS = ", ".join(KINDS)
# What the rows say, per project: fsck's recount.
RECOUNT = f"""
SELECT p.tenant, p.project, {", ".join(f"p.{k}" for k in KINDS)},
    (SELECT count(*) FROM tasks t WHERE t.tenant = p.tenant AND t.project = p.project),
    (SELECT count(*) FROM turns t WHERE t.tenant = p.tenant AND t.project = p.project),
    (SELECT count(*) FROM artifacts a WHERE a.tenant = p.tenant AND a.project = p.project),
    (SELECT coalesce(sum(a.size), 0) FROM artifacts a
     WHERE a.tenant = p.tenant AND a.project = p.project),
    (SELECT coalesce(sum(octet_length(t.meta) + octet_length(t.summary)), 0) FROM turns t
     WHERE t.tenant = p.tenant AND t.project = p.project),
    (SELECT count(*) FROM stores s WHERE s.tenant = p.tenant AND s.project = p.project),
    (SELECT count(*) FROM memories m JOIN stores s ON s.id = m.store_id
     WHERE s.tenant = p.tenant AND s.project = p.project),
    (SELECT coalesce(sum(m.size), 0) FROM memories m JOIN stores s ON s.id = m.store_id
     WHERE s.tenant = p.tenant AND s.project = p.project),
    (SELECT count(*) FROM versions v JOIN stores s ON s.id = v.store_id
     WHERE s.tenant = p.tenant AND s.project = p.project),
    (SELECT coalesce(sum(v.size), 0) FROM versions v JOIN stores s ON s.id = v.store_id
     WHERE s.tenant = p.tenant AND s.project = p.project)
FROM projects p ORDER BY p.tenant, p.project
"""
_SET = ", ".join(f"{k} = %({k})s" for k in KINDS)


def add(conn: psycopg.Connection[Any], scope: Scope, **delta: int) -> None:
    """Move the project's counters by ``delta`` (kind -> change) in the caller's transaction."""
    changes = {k: int(v) for k, v in delta.items() if v}
    if not changes:
        return
    sets = ", ".join(f"{k} = {k} + %({k})s" for k in changes)
    conn.execute(
        f"UPDATE projects SET {sets} WHERE tenant = %(tenant)s AND project = %(project)s",
        {**changes, "tenant": scope.tenant, "project": scope.project},
    )


def read(conn: psycopg.Connection[Any], scope: Scope) -> Usage:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE tenant = %s AND project = %s",
        (scope.tenant, scope.project),
    ).fetchone()
    return ZERO if row is None else Usage(*(int(v) for v in row))


def recount(conn: psycopg.Connection[Any]) -> list[tuple[Scope, Usage, Usage]]:
    """(project, its counters, what its rows say) of every project."""
    found = []
    for row in conn.execute(RECOUNT):
        n = len(KINDS)
        found.append(
            (
                Scope(row[0], row[1]),
                Usage(*(int(v) for v in row[2 : 2 + n])),
                Usage(*(int(v) for v in row[2 + n :])),
            )
        )
    return found


def set_counters(conn: psycopg.Connection[Any], scope: Scope, usage: Usage) -> None:
    conn.execute(
        f"UPDATE projects SET {_SET} WHERE tenant = %(tenant)s AND project = %(project)s",
        {**{k: getattr(usage, k) for k in KINDS}, "tenant": scope.tenant, "project": scope.project},
    )


def ensure_project(conn: psycopg.Connection[Any], scope: Scope) -> None:
    """The project's row (its usage counters), made if missing, in ``conn``'s transaction."""
    conn.execute(
        "INSERT INTO projects (tenant, project) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (scope.tenant, scope.project),
    )


def _reserved(
    conn: psycopg.Connection[Any], where: str, args: tuple[Any, ...], exclude: str | None
) -> Reserved:
    row = conn.execute(
        "SELECT coalesce(sum(bytes), 0), coalesce(sum(tasks), 0) FROM usage_reservations"
        f" WHERE {where} AND expires_us > %s AND id <> %s",
        (*args, wall_us(), exclude or ""),
    ).fetchone()
    return Reserved(0, 0) if row is None else Reserved(int(row[0]), int(row[1]))


class PgUsage:
    """Read usage and admit writes, for both engines of one database."""

    def __init__(self, db: Database, quotas: QuotaSource) -> None:
        self.db = db
        self.quotas = quotas

    def applies(self, scope: Scope) -> bool:
        project_quota, tenant_quota = self.quotas.of(scope)
        return project_quota is not None or tenant_quota is not None

    def check(
        self,
        conn: psycopg.Connection[Any],
        scope: Scope,
        add_bytes: int,
        add_tasks: int = 0,
        *,
        exclude: str | None = None,
    ) -> None:
        """Refuse (QuotaExceeded) what would go over a quota, in the write's transaction;
        ``exclude``: the write's own reservation, which what it adds replaces."""
        project_quota, tenant_quota = self.quotas.of(scope)
        if project_quota is None and tenant_quota is None:
            return
        if add_bytes <= 0 and add_tasks <= 0:
            return
        if tenant_quota is not None:
            advisory_xact_lock(conn, "usage", scope.tenant)
        advisory_xact_lock(conn, "usage", scope.tenant, scope.project)
        stored = read(conn, scope)
        held = _reserved(
            conn, "tenant = %s AND project = %s", (scope.tenant, scope.project), exclude
        )
        refused = over_quota(
            "project",
            f"{scope.tenant}/{scope.project}",
            project_quota,
            stored,
            held,
            add_bytes,
            add_tasks,
        )
        if refused is None and tenant_quota is not None:
            row = conn.execute(
                f"SELECT {', '.join(f'coalesce(sum({k}), 0)' for k in KINDS)} FROM projects"
                " WHERE tenant = %s",
                (scope.tenant,),
            ).fetchone()
            everything = ZERO if row is None else Usage(*(int(v) for v in row))
            held_all = _reserved(conn, "tenant = %s", (scope.tenant,), exclude)
            refused = over_quota(
                "tenant", scope.tenant, tenant_quota, everything, held_all, add_bytes, add_tasks
            )
        if refused is not None:
            raise refused

    def admit(
        self, scope: Scope, *, gross: int = 0, add_bytes: int = 0, add_tasks: int = 0
    ) -> Ticket:
        """A reservation for a write made outside one transaction (an artifact's bytes);
        :data:`NO_TICKET` when no quota applies. No floor here: the database and the object
        store keep their own disks."""
        del gross
        if not self.applies(scope):
            return NO_TICKET
        ticket = PgTicket(self, scope)
        if add_bytes > 0 or add_tasks > 0:
            ticket.cover(add_bytes, add_tasks)
        return ticket

    # -- reading --------------------------------------------------------------------------
    def project(self, scope: Scope) -> Usage:
        with self.db.snapshot("usage") as conn:
            return read(conn, scope)

    def projects(self, tenants: Iterable[str] | None) -> dict[Scope, Usage]:
        wanted = None if tenants is None else list(tenants)
        with self.db.snapshot("usage") as conn:
            rows = conn.execute(
                f"SELECT tenant, project, {_COLUMNS} FROM projects"
                + ("" if wanted is None else " WHERE tenant = ANY(%s)")
                + " ORDER BY tenant, project",
                () if wanted is None else (wanted,),
            ).fetchall()
        return {Scope(r[0], r[1]): Usage(*(int(v) for v in r[2:])) for r in rows}

    # -- traffic --------------------------------------------------------------------------
    def add_traffic(self, rows: Iterable[TrafficRow]) -> None:
        batch = [
            (r.hour, r.tenant, r.project, r.token_id, r.requests, r.bytes_in, r.bytes_out)
            for r in rows
        ]
        if not batch:
            return
        # Ordered: two flushes adding to the same hours take their row locks in one order.
        batch.sort()
        with self.db.transaction("traffic") as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO traffic (hour, tenant, project, token_id, requests, bytes_in,"
                " bytes_out) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (hour, tenant, project, token_id) DO UPDATE SET"
                " requests = traffic.requests + excluded.requests,"
                " bytes_in = traffic.bytes_in + excluded.bytes_in,"
                " bytes_out = traffic.bytes_out + excluded.bytes_out",
                batch,
            )

    def traffic(self, tenant: str, project: str | None, since_hour: int) -> list[TrafficRow]:
        where = "tenant = %s AND hour >= %s"
        args: list[object] = [tenant, since_hour]
        if project is not None:
            where += " AND project = %s"
            args.append(project)
        with self.db.snapshot("traffic") as conn:
            rows = conn.execute(
                "SELECT hour, tenant, project, token_id, requests, bytes_in, bytes_out"
                f" FROM traffic WHERE {where} ORDER BY hour, project, token_id",
                args,
            ).fetchall()
        return [TrafficRow(*(int(r[0]), r[1], r[2], r[3], *(int(v) for v in r[4:]))) for r in rows]

    def prune_traffic(self, before_hour: int) -> int:
        with self.db.transaction("traffic") as conn:
            gone = conn.execute("DELETE FROM traffic WHERE hour < %s", (before_hour,)).rowcount
            conn.execute("DELETE FROM usage_reservations WHERE expires_us <= %s", (wall_us(),))
        return int(gone)


class PgTicket(HeldTicket):
    """A reservation row of one write (an artifact), in transactions of its own; the write's
    transaction re-checks what it adds (:meth:`cover_in`) and drops it (:meth:`settle_in`)."""

    def __init__(self, owner: PgUsage, scope: Scope) -> None:
        super().__init__(scope)
        self._owner = owner

    def _reserve(self, add_bytes: int, add_tasks: int) -> None:
        scope, owner = self._scope, self._owner
        first = self._id is None
        if first:
            self._id = str(ULID())
        with owner.db.transaction("usage") as conn:
            if first:  # the advisory locks need no project row; the counters do
                ensure_project(conn, scope)
            owner.check(conn, scope, add_bytes, add_tasks)
            conn.execute(
                "INSERT INTO usage_reservations (id, tenant, project, bytes, tasks, expires_us)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                " bytes = usage_reservations.bytes + excluded.bytes,"
                " tasks = usage_reservations.tasks + excluded.tasks,"
                " expires_us = excluded.expires_us",
                (self._id, scope.tenant, scope.project, add_bytes, add_tasks, lease_until()),
            )
        self.bytes += add_bytes
        self.tasks += add_tasks

    def cover_in(self, conn: psycopg.Connection[Any], add_bytes: int) -> None:
        """In the write's transaction: refuse what it adds beyond what it reserved."""
        if add_bytes > self.bytes:
            self._owner.check(conn, self._scope, add_bytes, exclude=self._id)

    def settle_in(self, conn: psycopg.Connection[Any]) -> None:
        if self._id is not None:
            conn.execute("DELETE FROM usage_reservations WHERE id = %s", (self._id,))

    def renew(self) -> None:
        if self._id is not None and not self._done:
            with self._owner.db.transaction("usage") as conn:
                conn.execute(
                    "UPDATE usage_reservations SET expires_us = %s WHERE id = %s",
                    (lease_until(), self._id),
                )

    def _drop(self, ident: str) -> None:
        with self._owner.db.transaction("usage") as conn:
            conn.execute("DELETE FROM usage_reservations WHERE id = %s", (ident,))


# -- what a task's rows hold (the engines' deltas) ---------------------------------------------
_TASK = "tenant = %(tenant)s AND project = %(project)s AND task_id = %(task_id)s"


def turn_bytes(conn: psycopg.Connection[Any], key: Mapping[str, object], turn: int) -> int | None:
    """A turn row's meta and summary bytes (None: no such row)."""
    row = conn.execute(
        f"SELECT octet_length(meta) + octet_length(summary) FROM turns WHERE {_TASK}"
        " AND turn = %(turn)s",
        {**key, "turn": turn},
    ).fetchone()
    return None if row is None else int(row[0])


def task_sums(
    conn: psycopg.Connection[Any], key: Mapping[str, object], turns: list[int] | None = None
) -> dict[str, int]:
    """What a task's turns (all, or ``turns``) hold: turns, turn_bytes, artifacts and
    artifact_bytes, to subtract before they are deleted."""
    only = "" if turns is None else " AND turn = ANY(%(turns)s)"
    args = {**key, "turns": turns}
    t = conn.execute(
        "SELECT count(*), coalesce(sum(octet_length(meta) + octet_length(summary)), 0)"
        f" FROM turns WHERE {_TASK}{only}",
        args,
    ).fetchone()
    a = conn.execute(
        f"SELECT count(*), coalesce(sum(size), 0) FROM artifacts WHERE {_TASK}{only}", args
    ).fetchone()
    assert t is not None and a is not None
    return {
        "turns": int(t[0]),
        "turn_bytes": int(t[1]),
        "artifacts": int(a[0]),
        "artifact_bytes": int(a[1]),
    }


def store_sums(conn: psycopg.Connection[Any], store_id: str) -> dict[str, int]:
    """What a store's rows hold, to subtract before it is deleted."""
    m = conn.execute(
        "SELECT count(*), coalesce(sum(size), 0) FROM memories WHERE store_id = %s", (store_id,)
    ).fetchone()
    v = conn.execute(
        "SELECT count(*), coalesce(sum(size), 0) FROM versions WHERE store_id = %s", (store_id,)
    ).fetchone()
    assert m is not None and v is not None
    return {
        "memories": int(m[0]),
        "memory_bytes": int(m[1]),
        "versions": int(v[0]),
        "version_bytes": int(v[1]),
    }


def negated(sums: dict[str, int]) -> dict[str, int]:
    return {k: -v for k, v in sums.items()}
