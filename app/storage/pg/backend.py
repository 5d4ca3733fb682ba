"""The PostgreSQL + object store backend: both engines, and the operations on all they hold.

Built once per process by the app (app/storage/backends.py) from ``MEMORY_DATABASE_URL``
and ``MEMORY_BLOB_URL``; docs/scaling.md says which data lives where and why.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import psycopg

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.storage.core import audit
from app.storage.core.archive import ExportSummary, ImportSummary
from app.storage.core.clock import Clock, iso_us, system_clock, to_us
from app.storage.core.cursor import CursorCodec
from app.storage.core.errors import InvalidName
from app.storage.core.models import DEFAULT_GRACE, FsckReport, SearchPage
from app.storage.core.names import CURSOR_KEY, Scope
from app.storage.core.query import DEFAULT_SEARCH_TIMEOUT, nothing_to_find
from app.storage.core.quota import PriceSource, QuotaSource, SecretPolicySource
from app.storage.core.recovery import Plan, Report
from app.storage.core.secret_policy import DEFAULT_POLICY
from app.storage.core.sweep import (
    DEFAULT_CLOCK_GUARD,
    ClockGuard,
    SweepClock,
    SweepOutcome,
    SweepReport,
    VersionSweep,
)
from app.storage.core.task_rules import DEFAULT_MAX_ARTIFACT_BYTES
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import Usage
from app.storage.core.vectors import MODES
from app.storage.pg import ledger as pgl, usage as pgu
from app.storage.pg.audit import PgAudit
from app.storage.pg.backup import export_pg
from app.storage.pg.blobs import BlobStore
from app.storage.pg.control import Lease, database_key, load_state, save_state
from app.storage.pg.db import Database, backup_running, translated
from app.storage.pg.fsck import PgFsck
from app.storage.pg.limits import PgLimits
from app.storage.pg.oauth import PgOAuth
from app.storage.pg.recovery import DatabaseRecovery
from app.storage.pg.restore import import_pg
from app.storage.pg.retention import PgRetention
from app.storage.pg.schema import migrate
from app.storage.pg.search import PgSearch
from app.storage.pg.stores import PgMemoryStores
from app.storage.pg.tasks import PgTaskStore
from app.storage.pg.tokens import PgTokenRegistry
from app.storage.pg.users import PgUsers
from app.storage.pg.vectors import PgEmbedding


def redacted_url(url: str) -> str:
    """``url`` without its password (for logs and ``describe``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


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
        clock_guard: ClockGuard = DEFAULT_CLOCK_GUARD,
        search_timeout: float = DEFAULT_SEARCH_TIMEOUT,
        search_slots: int = 4,
        search_waiting: int = 0,
        resident_bytes: int = 256 << 20,
        secrets_policy: str = DEFAULT_POLICY,
        embedder: Embedder | None = None,
    ) -> None:
        self.database_url = database_url
        self.clock_guard = clock_guard
        self.sweep_clock = SweepClock(self.load_state, self.save_state)
        self.db = Database(database_url, lock_timeout=lock_timeout, pool_size=pool_size)
        self.blobs = BlobStore(blob_url, endpoint_url=s3_endpoint_url)
        self.blobs.check_bucket()
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.migrations = self._migrate()
        self._tokens: PgTokenRegistry | None = None
        self._limits: PgLimits | None = None
        self.recovery = DatabaseRecovery(self.close)
        cursors = CursorCodec(self.key(CURSOR_KEY))
        self.usage_counters = pgu.PgUsage(self.db, QuotaSource(self.limits()))
        # What each project does with the secrets of a write (services/secrets.py).
        self.secret_policies = SecretPolicySource(self.limits(), default=secrets_policy)
        # What each project's ledger prices tokens at (core/ledger.py).
        self.ledger_prices = PriceSource(self.limits())
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
        # The embedding queue's worker (pg/vectors.py): None, keyword search only.
        self.embedding = None if embedder is None else PgEmbedding(self.db, embedder)
        if self.embedding is not None:
            self.tasks.text_written = self.stores.text_written = self.embedding.later
        self.searcher = PgSearch(
            self.db,
            cursors,
            self.tasks.now_us,
            timeout=search_timeout,
            slots=search_slots,
            waiting=search_waiting,
            embedding=self.embedding,
            resident_bytes=resident_bytes,
        )
        self.retention = PgRetention(self.db, self.blobs, self.tasks, self.stores)
        # Turns written before the ledger (a database of an earlier release) get their
        # entries now, before this process serves a read of it.
        with translated("ledger"):
            self.migrations += pgl.fill_lacking(self.db)
        self.checks = PgFsck(self.db, self.blobs, self.tasks)
        self.audit_log = audit.AuditLog(PgAudit(self.db), cursors, self.tasks.now_us)
        self.oauth = PgOAuth(self.db)
        self.users = PgUsers(self.db)

    # -- the database ----------------------------------------------------------------------
    def recover(self, plan: Plan) -> Report:
        """Nothing to repair: a killed writer's transaction was rolled back by the database.
        The report names the schema migrations this process applied when it opened it."""
        applied, self.migrations = self.migrations, []
        return Report(plan, schema=applied)

    def repair_dead_writers(self) -> list[str]:
        """Nothing to repair: a dead process's transaction was rolled back by the database."""
        return []

    def full_check(self) -> FsckReport | None:
        return None

    def flush_derived(self) -> None:
        """Nothing to flush: every write is a committed transaction or a stored object."""

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
        self,
        scope: Scope,
        query: str,
        *,
        limit: int = 20,
        cursor: str | None = None,
        any_term: bool = False,
        mode: str | None = None,
    ) -> SearchPage:
        """Search the project's live turns and memories (pg/search.py)."""
        nothing = nothing_to_find(query, limit)
        if nothing is not None:
            if mode is not None and mode not in MODES:
                raise InvalidName("mode", mode, f"must be one of {', '.join(MODES)}")
            return nothing
        return self.searcher.search(
            scope, query, limit=limit, cursor=cursor, any_term=any_term, mode=mode
        )

    def search_modes(self) -> tuple[str, ...]:
        """The modes a search may ask for, the default first."""
        return ("keyword",) if self.embedding is None else ("hybrid", "keyword", "semantic")

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
        """Back up one project, one tenant or everything to ``out`` (core/archive.py)."""
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
        of one project). A backup carries no vectors: what it brought is queued, and
        embedded now in the background."""
        summary = import_pg(self, archive, tenant=tenant, project=project, overwrite=overwrite)
        if self.embedding is not None:
            for scope in self.projects():
                self.embedding.later(scope)
        return summary

    # -- retention -------------------------------------------------------------------------
    def scrub_replaced(self, scope: Scope) -> bool:
        """The objects of the project's replaced artifacts go now rather than at the sweeper's
        orphan pass (a download still reading one fails); a replaced row's text is gone from
        every answer and index at once, its dead tuple left to autovacuum as every update's
        is. False while a backup runs: it may still be reading them."""
        with self.db.transaction("objects") as conn:
            if backup_running(conn):
                return False
            keys = [
                str(row[0])
                for row in conn.execute(
                    "DELETE FROM superseded_blobs WHERE tenant = %(tenant)s"
                    " AND project = %(project)s RETURNING blob",
                    {"tenant": scope.tenant, "project": scope.project},
                )
            ]
        self.blobs.delete(keys)
        return True

    def sweep(
        self,
        *,
        now: datetime,
        dry_run: bool = False,
        force: bool = False,
        grace: timedelta = DEFAULT_GRACE,
    ) -> SweepOutcome:
        """Remove expired turns, versions past their retention and orphaned bytes; unless
        ``force``, nothing when the clock looks stepped forward (core/sweep.py ClockGuard)."""
        now_us = to_us(now)
        why = self.sweep_clock.admit(
            self.clock_guard, self.retention.census, now_us, dry_run=dry_run, force=force
        )
        if why:
            return SweepOutcome(SweepReport(iso_us(now_us), dry_run), VersionSweep(), why)
        outcome = self.retention.sweep(now=now, dry_run=dry_run, grace=grace)
        if self.embedding is not None and not dry_run:
            # What a killed process left queued, and rows a changed model re-embeds.
            for scope in self.projects():
                self.embedding.later(scope)
        return outcome

    def mark_sweep_clock(self, now: datetime) -> None:
        """A server's start: the clock the sweep's guard compares with, when none is kept yet
        (core/sweep.py SweepClock)."""
        self.sweep_clock.start(to_us(now), self.retention.census)

    def serve_read_only(self, plan: Plan, exc: BaseException) -> list[str]:
        # Nothing of the start-up recovery writes to a disk of this server's.
        raise exc

    def resume_writes(self) -> bool:
        return True

    # -- checks ----------------------------------------------------------------------------
    def fsck(self, *, repair: bool = False, grace: timedelta = DEFAULT_GRACE) -> FsckReport:
        """Check the derived columns against the rows they derive from, and that every
        artifact row's bytes are in the object store with the recorded size."""
        report = self.checks.fsck(repair=repair, grace=grace)
        if self.embedding is not None:
            self._fsck_vectors(report, repair=repair)
        return report

    def _fsck_vectors(self, report: FsckReport, *, repair: bool) -> None:
        """Texts without a queue entry or vectors (lost), and those waiting for a drain;
        ``repair`` queues and embeds them (pg/vectors.py)."""
        assert self.embedding is not None
        for scope in self.projects():
            try:
                state = self.embedding.check(scope, repair=repair)
            except EmbedderUnavailable as exc:
                report.notes.append(f"{scope.tenant}/{scope.project}: vectors not checked: {exc}")
                continue
            where = f"{scope.tenant}/{scope.project}"
            if state.waiting:
                report.notes.append(
                    f"{where}: {state.waiting} text(s) wait to be embedded with"
                    f" {self.embedding.model}"
                )
            if not state.missing:
                continue
            what = f"{where}: {state.missing} text(s) without vectors and not queued"
            report.problems.append(what)
            if repair:
                left = self.embedding.check(scope, repair=False).missing
                (report.unrepairable if left else report.repaired).append(what)

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
