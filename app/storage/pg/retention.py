"""The retention sweep on PostgreSQL and its object store: expired turns and emptied tasks,
versions past their retention, stale uploads and objects no row names (the orphans).

Each task and each store is swept in a transaction of its own, under the lock its writers
take, and the decision is taken again there: a rewrite may have moved the deadline. An object
leaves the store only once no row names it and it is older than the grace (an upload between
its bytes and its commit is younger), and never while a backup runs.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from app.storage.core.clock import iso_us, to_us
from app.storage.core.errors import NotFound, StorageError
from app.storage.core.names import Scope
from app.storage.core.sweep import Census, ProjectSweep, SweepOutcome, SweepReport, VersionSweep
from app.storage.pg import digest as pgd, ledger as pgl, usage as pgu
from app.storage.pg.blobs import BlobStore
from app.storage.pg.db import Database, backup_running

if TYPE_CHECKING:
    from app.storage.pg.stores import PgMemoryStores
    from app.storage.pg.tasks import PgTaskStore

_ORPHAN_BATCH = 500


@dataclass(frozen=True, slots=True)
class _TaskSweep:
    turns: int
    tasks: int
    bytes: int
    blobs: list[str]


class PgRetention:
    """The sweep of one database and its bucket (PgStorage.sweep)."""

    def __init__(
        self, db: Database, blobs: BlobStore, tasks: PgTaskStore, stores: PgMemoryStores
    ) -> None:
        self.db = db
        self.blobs = blobs
        self.tasks = tasks
        self.stores = stores

    def census(self, now_us: int, since_us: int) -> Census:
        """What the turns say about the clock at ``now_us`` against the last sweep's
        ``since_us`` (core/sweep.py Census)."""
        with self.db.snapshot("retention") as conn:
            row = conn.execute(
                "SELECT coalesce(max(updated_us) FILTER (WHERE updated_us <= %(since)s), 0),"
                " count(*) FILTER (WHERE updated_us <= %(since)s OR retain_until_us <= %(now)s),"
                " count(*) FILTER (WHERE retain_until_us <= %(now)s) FROM turns",
                {"now": now_us, "since": since_us},
            ).fetchone()
        newest, turns, expiring = row if row is not None else (0, 0, 0)
        return Census(int(newest), int(turns), int(expiring))

    def sweep(self, *, now: datetime, dry_run: bool, grace: timedelta) -> SweepOutcome:
        """Remove expired turns, versions past their retention and orphaned bytes."""
        return SweepOutcome(
            self._sweep_tasks(now, dry_run, grace),
            self.sweep_versions(now=now, dry_run=dry_run),
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
                self.tasks.forget_blobs(done.blobs)
            totals = per_project.setdefault((tenant, project), [0, 0, 0])
            totals[0] += done.turns
            totals[1] += done.tasks
            totals[2] += done.bytes
        uploads, orphans, orphan_bytes = self._sweep_orphans(now, dry_run, grace, errors)
        if not dry_run:
            self._fill_sections(errors)
            self._fill_ledger(errors)
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

    def _fill_ledger(self, errors: list[str]) -> None:
        """Write the ledger entries that turns loaded without them lack (an import stopped
        short, a database from before the ledger: pg/ledger.py fill)."""
        try:
            pgl.fill_lacking(self.db)
        except StorageError as exc:
            errors.append(f"ledger: {exc}")

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
            change = tasks.settle_task(conn, scope, task_id)
            tasks.add_tasks(conn, scope, change)
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

    def sweep_versions(self, *, now: datetime, dry_run: bool = False) -> VersionSweep:
        """Remove versions past their retention, except the recent ones of live memories."""
        cutoff = to_us(now - self.stores.version_retention)
        with self.db.snapshot("memory stores") as conn:
            stores = [
                (Scope(t, p), i)
                for t, p, i in conn.execute("SELECT tenant, project, id FROM stores ORDER BY id")
            ]
        scanned = removed = size = 0
        errors: list[str] = []
        for scope, store_id in stores:
            try:
                with self.stores.transaction(scope, store_id) as (conn, _, _):
                    scanned += 1
                    live = {
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM memories WHERE store_id = %s", (store_id,)
                        )
                    }
                    kept: dict[str, int] = {}
                    doomed: list[str] = []
                    for vid, memory_id, created_us in conn.execute(
                        "SELECT id, memory_id, created_us FROM versions WHERE store_id = %s"
                        " ORDER BY id DESC",
                        (store_id,),
                    ):
                        if (
                            memory_id in live
                            and kept.get(memory_id, 0) < self.stores.keep_recent_versions
                        ):
                            kept[memory_id] = kept.get(memory_id, 0) + 1
                            continue
                        if created_us < cutoff:
                            doomed.append(vid)
                    if not doomed:
                        continue
                    row = conn.execute(
                        "SELECT coalesce(sum(octet_length(coalesce(content, ''::bytea))), 0),"
                        " coalesce(sum(size), 0) FROM versions WHERE store_id = %s"
                        " AND id = ANY(%s)",
                        (store_id, doomed),
                    ).fetchone()
                    size += int(row[0]) if row else 0
                    removed += len(doomed)
                    if not dry_run:
                        conn.execute(
                            "DELETE FROM versions WHERE store_id = %s AND id = ANY(%s)",
                            (store_id, doomed),
                        )
                        pgu.add(
                            conn,
                            scope,
                            versions=-len(doomed),
                            version_bytes=-(int(row[1]) if row else 0),
                        )
            except NotFound:
                continue  # deleted while we swept
            except Exception as exc:  # noqa: BLE001 - one store's failure must not stop the rest
                errors.append(f"{scope.tenant}/{scope.project}/{store_id}: {exc}")
        return VersionSweep(
            stores_scanned=scanned,
            versions_removed=removed,
            bytes_removed=size,
            errors=tuple(errors),
        )
