"""fsck on PostgreSQL: the derived columns (listing rows, task and usage counters, project.md
sections) against the rows they derive from, and every artifact row's bytes in the object
store with the recorded size; ``repair`` sets each derived value again from its rows, under
the lock its writers take. Missing bytes cannot be rebuilt: they are reported."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from app.storage.core.ledger import entry_from
from app.storage.core.models import FsckReport
from app.storage.core.names import ARTIFACTS_DIR, Scope, turn_dirname
from app.storage.pg import digest as pgd, ledger as pgl, usage as pgu
from app.storage.pg.blobs import BlobStore
from app.storage.pg.db import Database, advisory_xact_lock

if TYPE_CHECKING:
    from app.storage.pg.tasks import PgTaskStore


class PgFsck:
    """The consistency check of one database and its bucket (PgStorage.fsck)."""

    def __init__(self, db: Database, blobs: BlobStore, tasks: PgTaskStore) -> None:
        self.db = db
        self.blobs = blobs
        self.tasks = tasks

    def fsck(self, *, repair: bool, grace: timedelta) -> FsckReport:
        """Check the derived columns against the rows they derive from, and that every
        artifact row's bytes are in the object store with the recorded size."""
        report = FsckReport()
        with self.db.snapshot("fsck") as conn:
            counters = conn.execute(
                "SELECT p.tenant, p.project, p.tasks, (SELECT count(*) FROM tasks t"
                " WHERE t.tenant = p.tenant AND t.project = p.project) FROM projects p"
            ).fetchall()
            stale = conn.execute(
                "SELECT t.tenant, t.project, t.task_id FROM tasks t LEFT JOIN LATERAL"
                " (SELECT count(*)::integer AS n, max(turn) AS latest, max(updated_us) AS up,"
                " min(retain_until_us) AS low FROM turns u WHERE u.tenant = t.tenant"
                " AND u.project = t.project AND u.task_id = t.task_id) a ON true"
                " WHERE (t.turn_count, t.latest_turn, t.updated_us, t.min_retain_us)"
                " IS DISTINCT FROM (a.n, a.latest, a.up, a.low)"
            ).fetchall()
            artifacts = conn.execute(
                "SELECT tenant, project, task_id, turn, name, size, blob FROM artifacts"
                " ORDER BY tenant, project, task_id, turn, name"
            ).fetchall()
            sections = list(pgd.differing(conn, self.tasks.now_us()))
            section_counters = pgd.recount(conn)
        for tenant, project, counted, actual in counters:
            if counted != actual:
                problem = f"{tenant}/{project}: task counter {counted}, {actual} tasks"
                report.problems.append(problem)
                if repair:
                    with self.db.transaction("fsck") as conn:
                        conn.execute(
                            "UPDATE projects p SET tasks = (SELECT count(*) FROM tasks t"
                            " WHERE t.tenant = p.tenant AND t.project = p.project)"
                            " WHERE tenant = %s AND project = %s",
                            (tenant, project),
                        )
                    report.repaired.append(problem)
        self._fsck_usage(report, repair)
        for tenant, project, task_id in stale:
            problem = f"{tenant}/{project}/{task_id}: listing row differs from its turns"
            report.problems.append(problem)
            if repair:
                self._settle(Scope(tenant, project), task_id)
                report.repaired.append(problem)
        for scope, task_id in sections:
            problem = (
                f"{scope.tenant}/{scope.project}/{task_id}: project.md section differs from"
                " its turns"
            )
            report.problems.append(problem)
            if repair:
                self._settle(scope, task_id)
                report.repaired.append(problem)
        for scope, kept, counted in section_counters:
            problem = (
                f"{scope.tenant}/{scope.project}: project.md counters {list(kept)},"
                f" sections {list(counted)}"
            )
            report.problems.append(problem)
            if repair:
                with self.db.transaction("fsck") as conn:
                    pgd.set_counters(conn, scope)
                report.repaired.append(problem)
        self._fsck_ledger(report, repair)
        for tenant, project, task_id, turn, name, size, blob in artifacts:
            found = self.blobs.size(blob)
            if found != size:
                where = f"{tenant}/{project}/{task_id}/{turn_dirname(turn)}/{ARTIFACTS_DIR}/{name}"
                problem = (
                    f"{where}: bytes missing from the object store ({blob})"
                    if found is None
                    else f"{where}: {found} bytes stored, {size} recorded ({blob})"
                )
                report.problems.append(problem)
                report.unrepairable.append(problem)
        del grace
        return report

    def _fsck_ledger(self, report: FsckReport, repair: bool) -> None:
        """Each turn's ledger entry against its turn, then each project's rollups against a
        recount of its entries (after the entries were repaired, which moved them)."""
        with self.db.snapshot("fsck") as conn:
            stale = pgl.differing_entries(conn)
        for scope, task_id in stale:
            problem = (
                f"{scope.tenant}/{scope.project}/{task_id}: ledger entries differ from its turns"
            )
            report.problems.append(problem)
            if repair:
                self._ledger_task(scope, task_id)
                report.repaired.append(problem)
        with self.db.snapshot("fsck") as conn:
            rollups = pgl.differing_rollups(conn)
        for scope, table, count in rollups:
            problem = (
                f"{scope.tenant}/{scope.project}: {table}: {count} row(s) differ from a"
                " recount of the ledger entries"
            )
            report.problems.append(problem)
            if repair:
                with self.db.transaction("fsck") as conn:
                    pgl.rebuild_rollups(conn, scope)
                report.repaired.append(problem)

    def _ledger_task(self, scope: Scope, task_id: str) -> None:
        """Set a task's ledger entries from its turns, under its lock."""
        with self.tasks.transaction(scope, task_id) as conn:
            rows = conn.execute(
                "SELECT turn, meta, created_at FROM turns WHERE tenant = %s AND project = %s"
                " AND task_id = %s ORDER BY turn",
                (scope.tenant, scope.project, task_id),
            ).fetchall()
            pgl.set_task(
                conn,
                scope,
                task_id,
                [entry_from(task_id, int(t), json.loads(m), c) for t, m, c in rows],
            )

    def _settle(self, scope: Scope, task_id: str) -> None:
        """Set a task's listing row and project.md section from its turns, under its lock
        (a task whose turns are gone meanwhile is dropped, as a write would)."""
        with self.tasks.transaction(scope, task_id) as conn:
            change = self.tasks.settle_task(conn, scope, task_id)
            self.tasks.add_tasks(conn, scope, change)

    def _fsck_usage(self, report: FsckReport, repair: bool) -> None:
        """Each project's usage counters against a recount of its rows."""
        with self.db.snapshot("fsck") as conn:
            found = pgu.recount(conn)
        for scope, kept, counted in found:
            # The task counter has a check of its own (above).
            if replace(kept, tasks=0) == replace(counted, tasks=0):
                continue
            problem = (
                f"{scope.tenant}/{scope.project}: usage counters {kept.to_json()} differ from"
                f" the rows {counted.to_json()}"
            )
            report.problems.append(problem)
            if repair:
                with self.db.transaction("fsck") as conn:
                    # Under every lock a writer of the project's counters takes, then counted
                    # again: what is set is what the rows hold at that moment.
                    advisory_xact_lock(conn, "usage", scope.tenant)
                    advisory_xact_lock(conn, "usage", scope.tenant, scope.project)
                    conn.execute(
                        "SELECT 1 FROM projects WHERE tenant = %s AND project = %s FOR UPDATE",
                        (scope.tenant, scope.project),
                    )
                    now = {s: c for s, _, c in pgu.recount(conn)}
                    kept_tasks = pgu.read(conn, scope).tasks
                    pgu.set_counters(conn, scope, replace(now[scope], tasks=kept_tasks))
                report.repaired.append(problem)
