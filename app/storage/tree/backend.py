"""The tree backend: both engines over one storage root, built once by the app.

The API, the console, the CLI and the sweeper reach storage only through this object
(app/storage/interface.py): ``tasks``, ``stores``, and the operations on the whole tree.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.storage.core import audit
from app.storage.core.archive import ExportSummary, ImportSummary
from app.storage.core.clock import Clock, iso_us, system_clock, to_us
from app.storage.core.errors import InvalidName, StorageError
from app.storage.core.files import is_no_space
from app.storage.core.models import DEFAULT_GRACE, FsckReport, SearchPage
from app.storage.core.names import TMP_PREFIX, Scope
from app.storage.core.query import DEFAULT_SEARCH_TIMEOUT, nothing_to_find
from app.storage.core.quota import (
    DEFAULT_MIN_FREE_INODES,
    FreeSpace,
    PriceSource,
    QuotaSource,
    SecretPolicySource,
)
from app.storage.core.recovery import Plan, Report
from app.storage.core.secret_policy import DEFAULT_POLICY
from app.storage.core.sweep import (
    DEFAULT_CLOCK_GUARD,
    Census,
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
from app.storage.tree.audit import TreeAudit
from app.storage.tree.backup import export_tree
from app.storage.tree.control import Lease, load_state, root_key, save_state
from app.storage.tree.embedding import Embedding
from app.storage.tree.fs.atomic import remove_quietly, write_atomic
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.sync import flush_derived
from app.storage.tree.fsck import fsck
from app.storage.tree.fsck_usage import fsck_usage
from app.storage.tree.limits import LimitsFile
from app.storage.tree.oauth import OAuthFiles
from app.storage.tree.recovery import Recovery, check_failed
from app.storage.tree.restore import import_tree
from app.storage.tree.retention import empty_trash_at_start, sweep
from app.storage.tree.search import TreeSearch
from app.storage.tree.search_health import heal_search_indexes
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.stores.fsck import fsck_stores
from app.storage.tree.stores.retention import sweep_versions
from app.storage.tree.tasks import TaskStore
from app.storage.tree.tokens import TokenRegistry
from app.storage.tree.usage import TreeTraffic, TreeUsage
from app.storage.tree.users import UserFiles


class TreeStorage:
    """Both engines over one storage root (a local filesystem)."""

    def __init__(
        self,
        root: Path,
        *,
        retention: timedelta = timedelta(days=30),
        lock_timeout: float = 10.0,
        clock: Clock = system_clock,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        tokens_file: Path | None = None,
        group_commit: bool = True,
        min_free: str | int | None = None,
        min_free_inodes: str | int = DEFAULT_MIN_FREE_INODES,
        clock_guard: ClockGuard = DEFAULT_CLOCK_GUARD,
        search_timeout: float = DEFAULT_SEARCH_TIMEOUT,
        search_slots: int = 4,
        search_waiting: int = 0,
        resident_bytes: int = 256 << 20,
        secrets_policy: str = DEFAULT_POLICY,
        embedder: Embedder | None = None,
    ) -> None:
        self.clock_guard = clock_guard
        self.sweep_clock = SweepClock(self.load_state, self.save_state)
        self.tokens_file = tokens_file
        self._registry: TokenRegistry | None = None
        limits = self._limits = LimitsFile(root, lock_timeout=lock_timeout)
        # What each project does with the secrets of a write (services/secrets.py).
        self.secret_policies = SecretPolicySource(limits, default=secrets_policy)
        # What each project's ledger prices tokens at (core/ledger.py).
        self.ledger_prices = PriceSource(limits)
        usage = TreeUsage(
            limits.layout,
            lock_timeout=lock_timeout,
            clock=clock,
            quotas=QuotaSource(limits),
            floor=None
            if min_free is None
            else FreeSpace(limits.layout.root, min_free, inodes=min_free_inodes),
        )
        self.tasks = TaskStore(
            root,
            retention=retention,
            lock_timeout=lock_timeout,
            clock=clock,
            max_artifact_bytes=max_artifact_bytes,
            group_commit=group_commit,
            usage=usage,
        )
        self.stores = MemoryStoreEngine(
            root, lock_timeout=lock_timeout, clock=clock, group_commit=group_commit, usage=usage
        )
        self.usage_counters = usage
        self.layout = self.tasks.layout
        self.oauth = OAuthFiles(self.layout, lock_timeout=lock_timeout)
        self.users = UserFiles(self.layout, lock_timeout=lock_timeout)
        self.traffic_log = TreeTraffic(self.layout, lock_timeout=lock_timeout)
        self.audit_log = audit.AuditLog(
            TreeAudit(self.layout, lock_timeout=lock_timeout), self.tasks.cursors, self.tasks.now_us
        )
        # The embedding queue's worker (tree/embedding.py): None, keyword search only.
        self.embedding = None if embedder is None else Embedding(self.tasks, self.stores, embedder)
        if self.embedding is not None:
            self.tasks.text_written = self.embedding.later
            self.stores.search_upkeep.text_written = self.embedding.later
        self.searcher = TreeSearch(
            self.tasks,
            self.stores,
            timeout=search_timeout,
            slots=search_slots,
            waiting=search_waiting,
            embedding=self.embedding,
            resident_bytes=resident_bytes,
        )
        self.recovery = Recovery(self.layout)
        self.tasks.txns.refuse = self.stores.txns.refuse = self._read_only

    def census(self, now_us: int, since_us: int) -> Census:
        """What the turns of every project's listing say about the clock at ``now_us``
        against the last sweep's ``since_us`` (core/sweep.py Census; a listing that cannot
        be read counts nothing)."""
        total = Census()
        for scope in self.layout.projects([]):
            st = self.layout.tree.lstat(self.layout.listing(scope))
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            try:
                total += Census(*self.tasks.listing(scope).census(now_us, since_us))
            except (StorageError, sqlite3.Error):
                continue
        return total

    def scrub_replaced(self, scope: Scope) -> bool:
        self.tasks.compact_digest(scope)
        return self.tasks.removals.purge(scope, only_pending=True)

    def sweep(self, *, now: datetime, dry_run: bool = False, force: bool = False) -> SweepOutcome:
        """Remove expired turns and versions past their retention (both engines); unless
        ``force``, nothing when the clock looks stepped forward (core/sweep.py ClockGuard)."""
        now_us = to_us(now)
        why = self.sweep_clock.admit(
            self.clock_guard, self.census, now_us, dry_run=dry_run, force=force
        )
        if why:
            return SweepOutcome(SweepReport(iso_us(now_us), dry_run), VersionSweep(), why)
        outcome = SweepOutcome(
            sweep(self.tasks, now=now, dry_run=dry_run),
            sweep_versions(self.stores, now=now, dry_run=dry_run),
        )
        self.usage_counters.freed()
        if self.embedding is not None and not dry_run:
            # What a killed process left queued, and rows a changed model re-embeds.
            for scope in self.layout.projects([]):
                self.embedding.later(scope)
        return outcome

    def mark_sweep_clock(self, now: datetime) -> None:
        """A server's start: the clock the sweep's guard compares with, when none is kept yet
        (core/sweep.py SweepClock)."""
        self.sweep_clock.start(to_us(now), self.census)

    def fsck(self, *, repair: bool = False, grace: timedelta = DEFAULT_GRACE) -> FsckReport:
        """Check (and with ``repair`` rebuild) every derived file of both engines."""
        report = fsck(self.tasks, repair=repair, grace=grace)
        fsck_stores(self.stores, report, repair=repair)
        fsck_usage(self.tasks, self.stores, report, repair=repair)
        if self.embedding is not None:
            self._fsck_vectors(report, repair=repair)
        return report

    def _fsck_vectors(self, report: FsckReport, *, repair: bool) -> None:
        """Rows without vectors of the current model (queued or lost), vectors of rows gone;
        ``repair`` embeds them now (tree/embedding.py)."""
        assert self.embedding is not None
        for scope in self.layout.projects([]):
            try:
                found = self.embedding.check(scope, repair=repair)
            except EmbedderUnavailable as exc:
                report.notes.append(f"{scope.tenant}/{scope.project}: vectors not checked: {exc}")
                continue
            except (StorageError, sqlite3.Error, OSError) as exc:
                report.problems.append(f"{scope.tenant}/{scope.project}: vectors unreadable: {exc}")
                continue
            for state in found:
                where = os.path.relpath(state.name, self.layout.root)
                if state.waiting:
                    report.notes.append(
                        f"{where}: {state.waiting} row(s) wait to be embedded with"
                        f" {self.embedding.model}"
                    )
                if not (state.missing or state.orphans):
                    continue
                what = (
                    f"{where}: {state.missing} row(s) without vectors and not queued,"
                    f" {state.orphans} vector(s) or queue entries of rows gone"
                )
                report.problems.append(what)
                if repair:
                    left = [
                        s
                        for s in self.embedding.check(scope, repair=False)
                        if s.name == state.name and (s.missing or s.orphans)
                    ]
                    if left:
                        report.unrepairable.append(what)
                    else:
                        report.repaired.append(what)

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
        """Search the project's turns and memories (tree/search.py)."""
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

    def recover(self, plan: Plan) -> Report:
        """Repair what the last server left (the caller holds the root lock): the deletions a
        killed process left in the trash (first: they free room), then the writes the
        journals name. Both also after a clean stop: a worker killed under a server that then
        stopped cleanly leaves them too. Then heal every search index (tree/search_health.py).
        When unsynced data may have been lost, mark the full check that :meth:`full_check`
        runs in the background."""
        report = Report(plan)
        report.trash, links = empty_trash_at_start(self.layout)
        report.notes += [
            f"{link.relative_to(self.layout.root)} is a symlink: left alone" for link in links
        ]
        for key in (*self.tasks.txns.recover(), *self.stores.txns.recover()):
            report.repaired.append(f"{key.scope.tenant}/{key.scope.project}/{key.id}")
        # A crash may have cut an index's write short where SQLite cannot see it (FTS5's
        # structure against its segments): after one, each gets FTS5's own check too.
        report.search = heal_search_indexes(self.tasks, self.stores, thorough=not plan.clean)
        report.schema += self._ledgers_ready()
        if plan.full:
            self.recovery.mark_recovering(plan.reason)
        return report

    def _ledgers_ready(self) -> list[str]:
        """Open every project's ledger before serving: one a release brings, or one of
        another schema version, is made from the records now rather than under a project's
        first write (whose writers would wait for it). A line for each one made, or that
        cannot be opened (fsck reports and remakes it)."""
        lines = []
        for scope in self.layout.projects([]):
            if self.layout.tree.lstat(self.layout.listing(scope)) is None:
                continue  # nothing written yet
            try:
                made = self.tasks.ledger(scope).ready()
            except (StorageError, sqlite3.Error) as exc:
                lines.append(f"{scope.tenant}/{scope.project}: ledger not opened ({exc})")
                continue
            if made is not None:
                lines.append(
                    f"{scope.tenant}/{scope.project}: ledger made from the records ({made} task(s))"
                )
        return lines

    def repair_dead_writers(self) -> list[str]:
        """Repair the writes a process that died left in flight (a worker its master just
        reaped), on every lock stripe no live process holds; the keys repaired."""
        return [
            f"{key.scope.tenant}/{key.scope.project}/{key.id}"
            for key in (*self.tasks.txns.repair_dead(), *self.stores.txns.repair_dead())
        ]

    def full_check(self) -> FsckReport | None:
        """Run the full check a possible loss of unsynced data asked for, if one is pending
        (and did not fail already: a failed one waits for an operator's ``fsck --repair``).

        The marker goes once it ran through; it stays, as failed and saying why, when it
        could not read some file (an I/O or permission error: what depends on it was left as
        it is, unchecked) or when an error stopped it. What it found and could not repair
        (a planted link) is in its report and the log, as fsck's always is."""
        reason = self.recovery.recovering_reason()
        if reason is None or check_failed(reason) is not None:
            return None
        try:
            report = self.fsck(repair=True)
            flush_derived()
        except Exception as exc:
            self.recovery.mark_failed(f"it stopped at an error ({type(exc).__name__}: {exc})")
            raise
        if report.unreadable:
            self.recovery.mark_failed(
                f"{len(report.unreadable)} file(s) could not be read (I/O or permission"
                f" errors; left as they are), the first: {report.unreadable[0]}"
            )
        else:
            self.recovery.recovered()
        return report

    # -- a start on a full disk -------------------------------------------------------------
    def serve_read_only(self, plan: Plan, exc: BaseException) -> list[str]:
        """The start-up recovery of ``plan`` met a full disk: serve reads, refuse writes
        (507) and say why on /readyz, until :meth:`resume_writes` finishes the recovery."""
        why = (
            "the storage root's disk is full, so the start-up recovery could not write"
            f" ({exc}); the server is read-only until space is freed"
        )
        self.recovery.stopped_by_full_disk(plan, why)
        return [f"{why}: reads are served, writes answer 507, and the recovery finishes by itself"]

    def resume_writes(self) -> bool:
        """Finish a recovery a full disk stopped, if there is one (the housekeeper's leader,
        every few seconds); whether writes are allowed now."""
        pending = self.recovery.unfinished()
        if pending is None:
            return True
        try:
            self.recover(pending.plan)
            self.recovery.renew()
        except Exception as exc:
            if is_no_space(exc):
                return False
            raise
        self.recovery.finished()
        return True

    def _read_only(self) -> str:
        pending = self.recovery.unfinished()
        return "" if pending is None else pending.why

    def flush_derived(self) -> None:
        """Sync the filesystem: derived files are written without fsync (atomic_file)."""
        flush_derived()

    def ready(self) -> tuple[bool, str]:
        read_only = self._read_only()
        if read_only:
            return False, (
                f"read-only: {read_only}. Reads are served and writes answer 507; the start-up"
                " recovery finishes, and writes resume, by themselves once space is freed"
            )
        pending = self.recovery.recovering_reason()
        failed = check_failed(pending)
        if failed is not None:
            return False, (
                f"the full check after an unclean stop failed: {failed}. Fix the cause"
                " (the disk, or the files' owner and mode), then run `flask --app wsgi fsck"
                " --repair`; this answers 200 once that ends clean. Reads and writes are served"
                " meanwhile"
            )
        if pending is not None:
            return False, f"recovering: a full check is running ({pending})"
        probe = self.layout.root / f"{TMP_PREFIX}ready-{secrets.token_hex(4)}"
        try:
            with locked(self.layout.locks_dir() / "ready.lock", timeout=2.0):
                write_atomic(probe, b"ok")
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return False, f"storage not writable: {type(exc).__name__}"
        finally:
            remove_quietly(probe)
        return True, "storage writable, locks usable"

    def export(
        self, out: Path, *, tenant: str | None = None, project: str | None = None
    ) -> ExportSummary:
        """Back up one project, one tenant or everything to ``out`` (core/archive.py)."""
        return export_tree(self, out, tenant=tenant, project=project)

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
        summary = import_tree(self, archive, tenant=tenant, project=project, overwrite=overwrite)
        if self.embedding is not None:
            for scope in self.projects():
                self.embedding.later(scope)
        return summary

    def projects(self, tenants: Iterable[str] | None = None) -> list[Scope]:
        return list(self.layout.projects([], tenants))

    # -- usage, quotas, traffic (core/usage.py, core/traffic.py, tree/usage.py) ------
    def usage(self, scope: Scope) -> Usage:
        """What a project stores (zero for a project that does not exist)."""
        return self.usage_counters.project(scope)[0]

    def usages(self, tenants: Iterable[str] | None = None) -> dict[Scope, Usage]:
        """What every project of ``tenants`` (None: of every tenant) stores."""
        return {s: self.usage(s) for s in self.projects(tenants)}

    def free_space(self) -> tuple[int, int] | None:
        """(bytes free on the root's filesystem, the floor writes stop at); None: no floor."""
        floor = self.usage_counters.floor
        return None if floor is None else (floor.free(), floor.floor())

    def record_traffic(self, rows: Iterable[TrafficRow]) -> None:
        """Add requests and bytes to their hours (what one worker counted since its last)."""
        self.traffic_log.add(rows)

    def traffic(
        self, tenant: str, project: str | None = None, *, since_hour: int = 0
    ) -> list[TrafficRow]:
        """The hours of a tenant (or one of its projects) from ``since_hour`` (hours since
        the epoch), per project and token."""
        return self.traffic_log.rows(tenant, project, since_hour=since_hour)

    def prune_traffic(self, before_hour: int) -> int:
        """Forget the hours before ``before_hour``; return how many rows went."""
        return self.traffic_log.prune(before_hour)

    def key(self, name: str) -> bytes:
        return root_key(self.layout, name)

    def describe(self) -> dict[str, Path | str]:
        return {"backend": "tree", "storage root": self.layout.root}

    # -- what every worker shares: files beside (or, for tokens, outside) the root ----------
    def token_registry(self, tokens_file: Path | None = None) -> TokenRegistry:
        """The registry file (MEMORY_TOKENS_FILE, outside the root), one object per backend."""
        path = tokens_file or self.tokens_file
        if path is None:
            raise ValueError("the tree keeps tokens in a file: give its path")
        if self._registry is None or self._registry.path != Path(os.path.abspath(path)):
            self._registry = TokenRegistry(
                path, clock=self.tasks.clock, lock_timeout=self.tasks.lock_timeout
            )
        return self._registry

    def limits(self) -> LimitsFile:
        return self._limits

    def lead(self, name: str) -> Lease | None:
        return Lease.acquire(self.layout, name)

    def load_state(self, name: str) -> dict[str, Any] | None:
        return load_state(self.layout, name)

    def save_state(self, name: str, state: dict[str, Any]) -> None:
        save_state(self.layout, name, state)

    def close(self) -> None:
        """Nothing to release: files are opened per use."""
