"""The PostgreSQL + object store backend: both engines, and the operations on all they hold.

Built once per process by the app (app/storage/backends.py) from ``MEMORY_DATABASE_URL``
and ``MEMORY_BLOB_URL``; docs/scaling.md says which data lives where and why.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import psycopg

from app.storage.core.archive import ExportSummary, ImportSummary
from app.storage.core.clock import Clock, iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import StorageError
from app.storage.core.models import DEFAULT_GRACE, FsckReport, SearchPage
from app.storage.core.names import ARTIFACTS_DIR, CURSOR_KEY, Scope, turn_dirname
from app.storage.core.quota import QuotaSource
from app.storage.core.sweep import ProjectSweep, SweepOutcome, SweepReport
from app.storage.core.task_rules import DEFAULT_MAX_ARTIFACT_BYTES
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import Usage
from app.storage.pg import digest as pgd, usage as pgu
from app.storage.pg.backup import export_pg, import_pg
from app.storage.pg.blobs import BlobStore
from app.storage.pg.control import (
    Lease,
    PgLimits,
    PgTokenRegistry,
    database_key,
    load_state,
    save_state,
)
from app.storage.pg.db import Database, advisory_xact_lock, backup_running, translated
from app.storage.pg.schema import migrate
from app.storage.pg.search import PgSearch
from app.storage.pg.stores import PgMemoryStores
from app.storage.pg.tasks import PgTaskStore

_ORPHAN_BATCH = 500


def redacted_url(url: str) -> str:
    """``url`` without its password (for logs and ``describe``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class _Recovered:
    """Nothing to recover: a killed writer's transaction is rolled back by the database."""

    def lines(self) -> list[str]:
        return []


class DatabaseRecovery:
    """The start-up recovery's side of this backend (app/storage/recovery.py for the tree).

    There is no root to take and no sentinel to keep: several nodes serve one database at
    once, every write is one transaction, and bytes a killed upload left in the object store
    are orphans the sweeper collects.
    """

    def __init__(self, storage: PgStorage) -> None:
        self._storage = storage

    def acquire(self) -> None: ...

    def plan(self) -> None:
        return None

    def mark_recovering(self, reason: str) -> None: ...

    def recovering_reason(self) -> str | None:
        return None

    def running(self) -> bool:
        return False

    def renew(self) -> None: ...

    def stopped_cleanly(self) -> None:
        self._storage.close()


@dataclass(frozen=True, slots=True)
class _TaskSweep:
    turns: int
    tasks: int
    bytes: int
    blobs: list[str]


class PgStorage:
    """Both engines over one PostgreSQL database and one bucket of an S3-compatible store."""

    def __init__(
        self,
        database_url: str,
        blob_url: str,
        *,
        s3_endpoint_url: str | None = None,
        retention: timedelta = timedelta(days=30),
        lock_timeout: float = 10.0,
        clock: Clock = system_clock,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        pool_size: int = 8,
    ) -> None:
        self.database_url = database_url
        self.db = Database(database_url, lock_timeout=lock_timeout, pool_size=pool_size)
        self.blobs = BlobStore(blob_url, endpoint_url=s3_endpoint_url)
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.migrations = self._migrate()
        self._tokens: PgTokenRegistry | None = None
        self._limits: PgLimits | None = None
        self.recovery = DatabaseRecovery(self)
        cursors = CursorCodec(self.key(CURSOR_KEY))
        self.usage_counters = pgu.PgUsage(self.db, QuotaSource(self.limits()))
        self.tasks = PgTaskStore(
            self.db,
            self.blobs,
            cursors,
            retention=retention,
            clock=clock,
            max_artifact_bytes=max_artifact_bytes,
            usage=self.usage_counters,
        )
        self.stores = PgMemoryStores(self.db, cursors, clock=clock, usage=self.usage_counters)
        self.searcher = PgSearch(self.db, cursors, self.tasks.now_us)

    # -- the database ----------------------------------------------------------------------
    def upgrade(self) -> list[str]:
        """The schema migrations this process applied (at start-up), and any still missing."""
        applied, self.migrations = self.migrations + self._migrate(), []
        return applied

    def recover(self, plan: object) -> _Recovered:
        return _Recovered()

    def full_check(self) -> FsckReport | None:
        return None

    def _migrate(self) -> list[str]:
        """Apply the schema migrations the database lacks (idempotent; one node at a time)."""
        with (
            translated("database schema"),
            psycopg.connect(self.database_url, autocommit=True) as conn,
        ):
            return migrate(conn)

    def close(self) -> None:
        """Close this process's connections (gunicorn's master, before it forks the workers)."""
        self.db.close()

    # -- what every node shares ------------------------------------------------------------
    def token_registry(self, tokens_file: Path | None = None) -> PgTokenRegistry:
        """The token registry (in the database; ``tokens_file`` is the tree's and unused)."""
        if self._tokens is None:
            self._tokens = PgTokenRegistry(self.db, clock=self.clock)
        return self._tokens

    def limits(self) -> PgLimits:
        if self._limits is None:
            self._limits = PgLimits(self.db)
        return self._limits

    def key(self, name: str) -> bytes:
        return database_key(self.db, name)

    def lead(self, name: str) -> Lease | None:
        return Lease.acquire(self.db, name)

    def load_state(self, name: str) -> dict[str, Any] | None:
        return load_state(self.db, name)

    def save_state(self, name: str, state: dict[str, Any]) -> None:
        save_state(self.db, name, state)

    def ready(self) -> tuple[bool, str]:
        try:
            with self.db.transaction("readiness") as conn:
                conn.execute("SELECT 1 FROM schema_migrations LIMIT 1")
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return False, f"database not usable: {type(exc).__name__}"
        try:
            self.blobs.ready()
        except Exception as exc:  # noqa: BLE001
            return False, f"object store not usable: {type(exc).__name__}"
        return True, "database and object store reachable"

    def search(
        self, scope: Scope, query: str, *, limit: int = 20, cursor: str | None = None
    ) -> SearchPage:
        """Search the project's live turns and memories (app/storage/pg/search.py)."""
        return self.searcher.search(scope, query, limit=limit, cursor=cursor)

    def projects(self, tenants: Iterable[str] | None = None) -> list[Scope]:
        wanted = None if tenants is None else list(tenants)
        with self.db.snapshot("projects") as conn:
            rows = conn.execute(
                "SELECT tenant, project FROM projects"
                + ("" if wanted is None else " WHERE tenant = ANY(%s)")
                + " ORDER BY tenant, project",
                () if wanted is None else (wanted,),
            ).fetchall()
        return [Scope(t, p) for t, p in rows]

    def describe(self) -> dict[str, Path | str]:
        return {
            "backend": "postgresql+s3",
            "database": redacted_url(self.database_url),
            "blobs": f"s3://{self.blobs.bucket}/{self.blobs.url.prefix}",
        }

    # -- backups ---------------------------------------------------------------------------
    def export(
        self, out: Path, *, tenant: str | None = None, project: str | None = None
    ) -> ExportSummary:
        """Back up one project, one tenant or everything to ``out`` (backup/format.py)."""
        return export_pg(self, out, tenant=tenant, project=project)

    def import_(
        self,
        archive: BinaryIO,
        *,
        tenant: str | None = None,
        project: str | None = None,
        overwrite: bool = False,
    ) -> ImportSummary:
        """Restore a backup, all of it or nothing (into ``tenant``/``project`` for a backup
        of one project)."""
        return import_pg(self, archive, tenant=tenant, project=project, overwrite=overwrite)

    # -- retention -------------------------------------------------------------------------
    def sweep(
        self, *, now: datetime, dry_run: bool = False, grace: timedelta = DEFAULT_GRACE
    ) -> SweepOutcome:
        """Remove expired turns, versions past their retention and orphaned bytes."""
        return SweepOutcome(
            self._sweep_tasks(now, dry_run, grace),
            self.stores.sweep_versions(now=now, dry_run=dry_run),
        )

    def _sweep_tasks(self, now: datetime, dry_run: bool, grace: timedelta) -> SweepReport:
        now_us = to_us(now)
        with self.db.snapshot("retention") as conn:
            candidates = conn.execute(
                "SELECT DISTINCT tenant, project, task_id FROM turns"
                " WHERE retain_until_us <= %s ORDER BY tenant, project, task_id",
                (now_us,),
            ).fetchall()
        per_project: dict[tuple[str, str], list[int]] = {}
        errors: list[str] = []
        for tenant, project, task_id in candidates:
            scope = Scope(tenant, project)
            try:
                done = self._sweep_task(scope, task_id, now_us, dry_run)
            except StorageError as exc:
                errors.append(f"{tenant}/{project}/{task_id}: {exc}")
                continue
            if not dry_run:
                self.tasks._forget_blobs(done.blobs)
            totals = per_project.setdefault((tenant, project), [0, 0, 0])
            totals[0] += done.turns
            totals[1] += done.tasks
            totals[2] += done.bytes
        uploads, orphans, orphan_bytes = self._sweep_orphans(now, dry_run, grace, errors)
        if not dry_run:
            self._fill_sections(errors)
        return SweepReport(
            now=iso_us(now_us),
            dry_run=dry_run,
            projects=tuple(
                ProjectSweep(t, p, *totals)
                for (t, p), totals in sorted(per_project.items())
                if totals[0] or totals[1]
            ),
            temp_files=uploads,
            leftovers=orphans,
            leftover_bytes=orphan_bytes,
            errors=tuple(errors),
        )

    def _fill_sections(self, errors: list[str]) -> None:
        """Write the project.md sections that tasks loaded in bulk lack (an import that
        stopped short of it, a database from before sections), so that no reader waits for
        them."""
        with self.db.snapshot("retention") as conn:
            lacking = conn.execute(
                "SELECT tenant, project FROM projects WHERE tasks <> digest_rows"
            ).fetchall()
        for tenant, project in lacking:
            try:
                pgd.fill(self.db, Scope(tenant, project), self.tasks.now_us)
            except StorageError as exc:
                errors.append(f"{tenant}/{project}: project.md sections: {exc}")

    def _sweep_task(self, scope: Scope, task_id: str, now_us: int, dry_run: bool) -> _TaskSweep:
        tasks = self.tasks
        key = {"tenant": scope.tenant, "project": scope.project, "task_id": task_id}
        where = "tenant = %(tenant)s AND project = %(project)s AND task_id = %(task_id)s"
        with tasks.transaction(scope, task_id) as conn:
            # Decided again here, under the writers' lock: a rewrite may have moved the deadline.
            expired = conn.execute(
                "SELECT turn, octet_length(meta) + octet_length(summary) FROM turns"
                f" WHERE {where} AND retain_until_us <= %(now)s",
                {**key, "now": now_us},
            ).fetchall()
            if not expired:
                return _TaskSweep(0, 0, 0, [])
            numbers = [r[0] for r in expired]
            arts = conn.execute(
                f"SELECT blob, size FROM artifacts WHERE {where} AND turn = ANY(%(turns)s)",
                {**key, "turns": numbers},
            ).fetchall()
            size = sum(int(r[1]) for r in expired) + sum(int(r[1]) for r in arts)
            remaining = conn.execute(
                f"SELECT count(*) FROM turns WHERE {where} AND retain_until_us > %(now)s",
                {**key, "now": now_us},
            ).fetchone()
            gone_task = int(remaining[0] if remaining else 0) == 0
            if dry_run:
                conn.rollback()
                return _TaskSweep(len(numbers), int(gone_task), size, [])
            gone = pgu.task_sums(conn, key, numbers)
            conn.execute(
                f"DELETE FROM turns WHERE {where} AND turn = ANY(%(turns)s)",
                {**key, "turns": numbers},
            )
            change = tasks._settle_task(conn, scope, task_id)
            tasks._add_tasks(conn, scope, change)
            pgu.add(conn, scope, **pgu.negated(gone))
        return _TaskSweep(len(numbers), int(gone_task), size, [str(r[0]) for r in arts])

    def _sweep_orphans(
        self, now: datetime, dry_run: bool, grace: timedelta, errors: list[str]
    ) -> tuple[int, int, int]:
        """Abort stale multipart uploads; remove objects no row names, once older than
        ``grace`` (an upload between its bytes and its commit is younger than that)."""
        cutoff = datetime.now(UTC) - grace
        uploads = orphans = size = 0
        try:
            for key, upload_id in self.blobs.stale_uploads(cutoff):
                uploads += 1
                if not dry_run:
                    self.blobs.abort_upload(key, upload_id)
            batch: list[tuple[str, int]] = []
            for key, modified, nbytes in self.blobs.listing():
                if modified < cutoff:
                    batch.append((key, nbytes))
                if len(batch) >= _ORPHAN_BATCH:
                    o, s = self._drop_unreferenced(batch, dry_run)
                    orphans, size, batch = orphans + o, size + s, []
            if batch:
                o, s = self._drop_unreferenced(batch, dry_run)
                orphans, size = orphans + o, size + s
        except StorageError as exc:
            errors.append(f"object store: {exc}")
        del now
        return uploads, orphans, size

    def _drop_unreferenced(self, batch: list[tuple[str, int]], dry_run: bool) -> tuple[int, int]:
        keys = [k for k, _ in batch]
        with self.db.snapshot("retention") as conn:
            named = {
                r[0]
                for r in conn.execute("SELECT blob FROM artifacts WHERE blob = ANY(%s)", (keys,))
            }
            # Asked after the rows were read: a backup that began before sees the rows gone.
            running = backup_running(conn)
        doomed = [(k, n) for k, n in batch if k not in named]
        if running:
            return 0, 0  # an export may be reading them, an import's wait for its commit
        if doomed and not dry_run:
            self.blobs.delete(k for k, _ in doomed)
        return len(doomed), sum(n for _, n in doomed)

    # -- checks ----------------------------------------------------------------------------
    def fsck(self, *, repair: bool = False, grace: timedelta = DEFAULT_GRACE) -> FsckReport:
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

    def _settle(self, scope: Scope, task_id: str) -> None:
        """Set a task's listing row and project.md section from its turns, under its lock
        (a task whose turns are gone meanwhile is dropped, as a write would)."""
        with self.tasks.transaction(scope, task_id) as conn:
            change = self.tasks._settle_task(conn, scope, task_id)
            self.tasks._add_tasks(conn, scope, change)

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

    # -- usage and traffic -----------------------------------------------------------------
    def usage(self, scope: Scope) -> Usage:
        return self.usage_counters.project(scope)

    def usages(self, tenants: Iterable[str] | None = None) -> dict[Scope, Usage]:
        return self.usage_counters.projects(tenants)

    def free_space(self) -> tuple[int, int] | None:
        return None  # the database and the object store keep their own disks

    def record_traffic(self, rows: Iterable[TrafficRow]) -> None:
        self.usage_counters.add_traffic(rows)

    def traffic(
        self, tenant: str, project: str | None = None, *, since_hour: int = 0
    ) -> list[TrafficRow]:
        return self.usage_counters.traffic(tenant, project, since_hour)

    def prune_traffic(self, before_hour: int) -> int:
        return self.usage_counters.prune_traffic(before_hour)
