"""The storage interface: what the API, the console, the CLI and the memory tool may call.

Two engines, one Protocol each, and :class:`StorageBackend`, the object the app builds once
(app/storage/backends.py): the tree (tree/backend.py) or PostgreSQL with an
object store (pg/backend.py). Both pass the same conformance suite
(tests/conformance/); nothing above the storage layer knows which one runs. Values and errors
are core/'s (core/errors.py, core/store_models.py, core/models.py). What every node of a
deployment must agree on (tokens, limit overrides, secret keys, the sweeper's leadership and
state) is reached through the backend too, so that a second engine can keep it where all its
nodes see it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from app.storage.core.archive import ExportSummary, ImportSummary
from app.storage.core.audit import AuditLog
from app.storage.core.clock import Clock
from app.storage.core.ledger import (
    LedgerPage,
    LedgerQuery,
    Price,
    PriceSettings,
    PriceTable,
    TimelinePage,
    TimelineQuery,
)
from app.storage.core.limits import QuotaOverride, Quotas, RateOverride, RateOverrides
from app.storage.core.models import (
    ArtifactInfo,
    ArtifactStream,
    ArtifactUpload,
    FsckReport,
    SearchPage,
    TaskIndex,
    TaskPage,
    TaskSummary,
    TurnRecord,
)
from app.storage.core.names import Scope
from app.storage.core.oauth import GrantStore
from app.storage.core.quota import PriceSource, SecretPolicySource
from app.storage.core.recovery import Plan, Report
from app.storage.core.secret_policy import SecretSettings, SecretsOverride
from app.storage.core.store_models import (
    Deleted,
    Memory,
    MemoryStore,
    MemoryVersion,
    Page,
    VersionFilter,
)
from app.storage.core.sweep import SweepOutcome
from app.storage.core.tokens import Token
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import Usage
from app.storage.core.users import UserStore


class TaskBackend(Protocol):
    """Turn history, artifacts and the digest of every tenant/project."""

    max_artifact_bytes: int
    clock: Clock

    def put_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        meta: dict[str, Any],
        summary_md: str,
        actor: str | None = None,
        if_match: str | None = None,
        if_none_match: bool = False,
        artifacts: Iterable[ArtifactUpload] = (),
        size: int | None = None,
    ) -> TurnRecord:
        """Create or replace one turn's meta and summary; keep created_at and artifacts.

        ``artifacts``: artifacts written with the turn, in one write: each created or
        replaced (the turn's others kept), every one committed with the turn or none.
        They are read in order, each to its end, before the preconditions are checked under
        the task's lock; ``size``, when known, bounds all of their bytes together and is
        admitted (floor, quotas) before the first is read."""
        ...

    def get_turn(self, scope: Scope, task_id: str, turn: int) -> TurnRecord: ...

    def get_task(self, scope: Scope, task_id: str) -> TaskIndex: ...

    def list_tasks(
        self,
        scope: Scope,
        *,
        limit: int = 50,
        cursor: str | None = None,
        prefix: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        failed: bool = False,
        sort: str = "updated",
        descending: bool = True,
        backward: bool = False,
    ) -> TaskPage:
        """A page of live tasks in an order of core/task_list.py (``sort``: updated, task_id,
        size or turns; ``descending``), after ``cursor`` (a ``next_cursor``) or, with
        ``backward``, before it (a ``prev_cursor``). Filters: ids starting with ``prefix``;
        ``model`` / ``agent_id`` substrings of the latest live turn's meta, in any case of
        their ASCII letters; a non-zero exit code (``failed``). ``total`` counts the
        project's live tasks, ``matched`` those the filters let through."""
        ...

    def task_summary(self, scope: Scope, task_id: str) -> TaskSummary:
        """A live task as the task list shows it (owner, size, meta facts); NotFound."""
        ...

    def read_ledger(self, scope: Scope, query: LedgerQuery, prices: PriceTable) -> LedgerPage:
        """What the project's turns add up to (core/ledger.py): the totals of the turns
        ``query`` selects and a page of its rows, each a sum of rollup rows kept by every
        write (never a walk of the turns); cost priced with ``prices``. InvalidName on
        ``cursor`` for one issued for another question."""
        ...

    def read_timeline(self, scope: Scope, query: TimelineQuery, prices: PriceTable) -> TimelinePage:
        """A page of the project's turns across tasks, newest first, as the ledger keeps
        them (one index range, whatever the project's size)."""
        ...

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None: ...

    def delete_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one live turn with its artifacts; the last one takes its task with it.

        ``only_owner`` as for delete_task; ``if_match``: the turn's ETag (PreconditionFailed
        otherwise). Its text leaves every file (docs/guarantees.md), not only the answers.
        """
        ...

    def delete_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        *,
        only_owner: str | None = None,
        if_match: str | None = None,
    ) -> None:
        """Delete one artifact of a live turn: a write of that turn (its ETag changes).

        ``only_owner`` as for delete_task; ``if_match``: the artifact's ETag.
        """
        ...

    def put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        *,
        content_type: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        size: int | None = None,
    ) -> ArtifactInfo: ...

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream: ...

    def open_digest(self, scope: Scope) -> tuple[BinaryIO, int]: ...

    def open_digest_head(
        self, scope: Scope, *, limit: int | None = None, since_us: int | None = None
    ) -> tuple[BinaryIO, int | None]:
        """The start of ``open_digest``'s body: its title and its newest sections, at most
        ``limit`` of them, only those of tasks updated at ``since_us`` or later, and the
        length when it is known (None: read to the end). It costs what it returns, whatever
        the project's size; the caller closes the file."""
        ...


class StoreBackend(Protocol):
    """Memory stores: path-addressed memories with versions, of every tenant/project."""

    def create_store(
        self,
        scope: Scope,
        *,
        name: object,
        description: object = "",
        metadata: object = None,
        creator: str | None = None,
    ) -> MemoryStore: ...

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore: ...

    def list_stores(
        self,
        scope: Scope,
        *,
        limit: int = 20,
        page: str | None = None,
        include_archived: bool = False,
        created_gte_us: int | None = None,
        created_lte_us: int | None = None,
    ) -> Page: ...

    def update_store(
        self,
        scope: Scope,
        store_id: str,
        *,
        name: object = None,
        description: object = None,
        metadata: object = None,
        only_creator: str | None = None,
    ) -> MemoryStore: ...

    def archive_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> MemoryStore: ...

    def delete_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> Deleted: ...

    def create_memory(
        self,
        scope: Scope,
        store_id: str,
        *,
        path: object,
        content: object,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory: ...

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory: ...

    def find_memory(
        self, scope: Scope, store_id: str, path: str, *, full: bool
    ) -> Memory | None: ...

    def update_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        content: object = None,
        path: object = None,
        precondition_sha256: object = None,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory: ...

    def delete_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        expected_sha256: object = None,
        actor: dict[str, Any] | None,
    ) -> Deleted: ...

    def list_memories(
        self,
        scope: Scope,
        store_id: str,
        *,
        path_prefix: object = "/",
        depth: int = 0,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page: ...

    def list_versions(
        self,
        scope: Scope,
        store_id: str,
        *,
        filters: VersionFilter,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page: ...

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion: ...

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion: ...


class TokenStore(Protocol):
    """The token registry: hashed secrets, roles, scope, expiry and revocation."""

    clock: Clock

    def authenticate(self, secret: str) -> Token | None: ...

    def get(self, token_id: str) -> Token | None: ...

    def find_by_secret(self, secret: str) -> Token | None:
        """The token a secret belongs to, revoked or expired ones too (to revoke a leak)."""
        ...

    def all(self) -> list[Token]: ...

    def is_empty(self) -> bool: ...

    def create(
        self,
        *,
        role: str,
        tenant: str | None = None,
        project: str | None = None,
        name: str = "",
        expires_in: timedelta | None = None,
        user: str | None = None,
    ) -> tuple[Token, str]: ...

    def revoke(self, token_id: str) -> Token: ...

    def end_console_sessions(self, token_id: str) -> None:
        """Sign out every console session of the token issued until now."""
        ...


class LimitsStore(Protocol):
    """Per-tenant and per-project limit overrides (core/limits.py's document)."""

    @property
    def path(self) -> Path | str: ...

    def stamp(self) -> tuple[int, int, int]:
        """A value that changes whenever the overrides do (cheap: polled every second)."""
        ...

    def document(self) -> dict[str, Any]: ...

    def rates(self) -> RateOverrides: ...

    def set_rate(self, tenant: str, project: str | None, change: RateOverride) -> RateOverride: ...

    def clear_rate(self, tenant: str, project: str | None) -> bool: ...

    def quotas(self) -> Quotas: ...

    def secrets(self) -> SecretSettings: ...

    def prices(self) -> PriceSettings: ...

    def set_prices(self, tenant: str, project: str, table: object) -> dict[str, Price]: ...

    def set_secrets(
        self, tenant: str, project: str | None, change: SecretsOverride
    ) -> SecretsOverride: ...

    def set_quota(
        self, tenant: str, project: str | None, change: QuotaOverride
    ) -> QuotaOverride: ...

    def clear_quota(
        self, tenant: str, project: str | None, names: tuple[str, ...] = ("bytes", "tasks")
    ) -> bool: ...


class Lease(Protocol):
    """Leadership held by one thread of one process of every node (the sweeper's)."""

    def held(self) -> bool:
        """Whether it still holds (a lost database connection loses it)."""
        ...

    def release(self) -> None: ...


class RecoveryState(Protocol):
    """A backend's side of the start-up recovery: the tree's root lock, running sentinel and
    canary (tree/recovery.py); nothing to hold for a database (pg/recovery.py)."""

    def acquire(self) -> None:
        """Hold the storage for this server (and the workers it forks); RootBusy if taken."""
        ...

    def plan(self) -> Plan:
        """What the last server left to repair (the caller holds what :meth:`acquire` took)."""
        ...

    def mark_recovering(self, reason: str) -> None:
        """Leave the full check pending (``full_check`` runs it), with why."""
        ...

    def recovering_reason(self) -> str | None:
        """Why a full check is pending; None when none is."""
        ...

    def recovered(self) -> None:
        """The full check is done: nothing is pending any more (a clean ``fsck --repair``)."""
        ...

    def running(self) -> bool:
        """Whether this server is marked running (its canary is renewed while it is)."""
        ...

    def renew(self) -> None:
        """Mark the server running, with a fresh canary (tree/recovery.py)."""
        ...

    def stopped_cleanly(self) -> None:
        """Record a clean stop (the caller flushed the derived files first)."""
        ...


class StorageBackend(Protocol):
    """Both engines and the operations on everything they hold."""

    @property
    def tasks(self) -> TaskBackend: ...

    @property
    def stores(self) -> StoreBackend: ...

    @property
    def recovery(self) -> RecoveryState: ...

    @property
    def secret_policies(self) -> SecretPolicySource:
        """What each project does with the secrets of a write (core/secret_policy.py)."""
        ...

    @property
    def ledger_prices(self) -> PriceSource:
        """What each project's ledger prices the tokens of each model at (core/ledger.py)."""
        ...

    def sweep(self, *, now: datetime, dry_run: bool = False, force: bool = False) -> SweepOutcome:
        """Remove what retention lets go; unless ``force``, nothing while the clock looks
        stepped forward past the last sweep (``SweepOutcome.refused`` says why)."""
        ...

    def mark_sweep_clock(self, now: datetime) -> None:
        """At a server's start, keep the clock the sweep's guard compares with, when no sweep
        has kept one yet (core/sweep.py SweepClock)."""
        ...

    def fsck(self, *, repair: bool = False, grace: timedelta = ...) -> FsckReport: ...

    def ready(self) -> tuple[bool, str]: ...

    def recover(self, plan: Plan) -> Report:
        """Repair what the last server left (``plan``: :meth:`RecoveryState.plan`'s); what
        needs a full check is marked for :meth:`full_check`."""
        ...

    def repair_dead_writers(self) -> list[str]:
        """Repair what a process that died left half-written (a worker the master reaped);
        never waits for a lock another process holds. What was repaired."""
        ...

    def full_check(self) -> FsckReport | None:
        """Run the full check a recovery left pending (``fsck --repair``); None when none is."""
        ...

    def serve_read_only(self, plan: Plan, exc: BaseException) -> list[str]:
        """The start-up recovery of ``plan`` met a full disk (``exc``): serve reads, refuse
        writes, until :meth:`resume_writes` finishes it; the lines worth printing."""
        ...

    def resume_writes(self) -> bool:
        """Finish a recovery a full disk stopped, if any; whether writes are allowed now."""
        ...

    def scrub_replaced(self, scope: Scope) -> bool:
        """Make text the project's writes replaced leave every file now, as the sweep does:
        the digest's base, the search index and its WAL. True when nothing of it is left (a
        reader holding an old snapshot can keep it until the next write or sweep)."""
        ...

    def flush_derived(self) -> None:
        """Make durable what was written without an fsync of its own (the tree's derived
        files): before a clean stop, and after the CLI's repairs."""
        ...

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
        """Full-text search over the project's live turns (task id, meta values, summary) and
        the live memories (path, content) of its stores, best first.

        ``query`` is in the syntax of core/query.py (parse_query: InvalidName on ``q``
        when it is not); ``limit`` 1..100; ``cursor`` a ``next_cursor`` of the same search
        (InvalidName on ``cursor`` otherwise); ``any_term``: a hit matches at least one of
        the terms instead of all of them (a recall). Snippets mark matches with
        query.MARK_START / MARK_END. Text of another project is never found; deleted,
        replaced and expired text never matches. ``mode`` (core/vectors.py): ``keyword``,
        ``semantic`` (by vectors alone) or ``hybrid`` (both, fused by RRF); None: hybrid when
        an embedder is configured, else keyword. ``SearchPage.modes`` says which ran and
        ``fallback`` why vectors were not used (never an error). InvalidName on ``mode``
        for another value.
        """
        ...

    def search_modes(self) -> tuple[str, ...]:
        """The modes a search may ask for, the default first."""
        ...

    def export(
        self, out: Path, *, tenant: str | None = None, project: str | None = None
    ) -> ExportSummary:
        """Write a backup (core/archive.py) of one project, one tenant or all."""
        ...

    def import_(
        self,
        archive: BinaryIO,
        *,
        tenant: str | None = None,
        project: str | None = None,
        overwrite: bool = False,
    ) -> ImportSummary:
        """Restore a backup, all of it or nothing."""
        ...

    def projects(self, tenants: Iterable[str] | None = None) -> list[Scope]:
        """The projects that hold anything, of ``tenants`` (None: of every tenant)."""
        ...

    def key(self, name: str) -> bytes:
        """A per-deployment secret (``CURSOR_KEY``, ``CONSOLE_KEY``), made on first use."""
        ...

    def usage(self, scope: Scope) -> Usage:
        """What a project stores (core/usage.py): its counters, never a walk."""
        ...

    def usages(self, tenants: Iterable[str] | None = None) -> dict[Scope, Usage]:
        """What every project of ``tenants`` (None: of every tenant) stores."""
        ...

    def free_space(self) -> tuple[int, int] | None:
        """(bytes free, the floor writes stop at) of the local disk; None when there is none."""
        ...

    def record_traffic(self, rows: Iterable[TrafficRow]) -> None:
        """Add requests and bytes to their hours (one worker's sums since its last flush)."""
        ...

    def traffic(
        self, tenant: str, project: str | None = None, *, since_hour: int = 0
    ) -> list[TrafficRow]:
        """The hours of a tenant (or one project) from ``since_hour``, per project and token."""
        ...

    def prune_traffic(self, before_hour: int) -> int:
        """Forget the hours before ``before_hour`` (hours since the epoch)."""
        ...

    #: The audit log (core/audit.py): ``record``, ``page`` and ``prune`` of its events.
    audit_log: AuditLog

    @property
    def oauth(self) -> GrantStore:
        """OAuth grants and registered clients (core/oauth.py)."""
        ...

    @property
    def users(self) -> UserStore:
        """The people who sign in through an identity provider (core/users.py)."""
        ...

    def describe(self) -> dict[str, Path | str]: ...

    def token_registry(self, tokens_file: Path | None = None) -> TokenStore:
        """The token registry (the tree keeps it in ``tokens_file``, outside its root)."""
        ...

    def limits(self) -> LimitsStore: ...

    def lead(self, name: str) -> Lease | None:
        """Become the one holder of ``name`` across every worker and node, or None at once."""
        ...

    def load_state(self, name: str) -> dict[str, Any] | None:
        """A small JSON object every node shares (the sweeper's last runs)."""
        ...

    def save_state(self, name: str, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release this process's connections (before gunicorn forks its workers)."""
        ...
