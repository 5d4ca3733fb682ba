"""Usage, quotas and the free-space floor on the tree (core/usage.py says what they are).

Where the counters live: each project's listing index (``_listing.sqlite3``) holds a usage
row per turn and the counters of its tasks, turns and artifacts, written in the same
SQLite transaction as the turn's listing row (tree/sqlite/listing_usage.py); each store's
index holds the counters of its memories and versions, written in the same transaction as
its version rows (tree/sqlite/store_index.py), and the holder of the store's lock copies
them to the store's row in the project's listing after each write. So a project's usage is
one read of one file, and a tenant's the sum over its projects.

How a write is admitted (:meth:`TreeUsage.admit`): the floor first, then, when a quota
applies, a reservation in the project's listing, made in one SQLite write transaction that
reads what is stored and reserved and refuses what would not fit; a tenant quota is checked
under a lock file per tenant (``.locks/<tenant>/_usage.lock``), held for that check only.
The write drops its reservation in the transaction that writes its counters.

A reservation names its process (boot, pid, start time) and carries a lease the write renews
while its body streams in: the reservation of a process that died, or one not renewed for
``LEASE_SECONDS``, stops counting at once and is deleted by the next reservation made in
its project. No crash leaves quota taken.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from urllib.parse import quote

from ulid import ULID

from app.storage.core.clock import Clock, system_clock
from app.storage.core.names import Scope
from app.storage.core.quota import FreeSpace, QuotaSource
from app.storage.core.traffic import TrafficRow
from app.storage.core.usage import (
    NO_TICKET,
    ZERO,
    HeldTicket,
    Reserved,
    StoreUsage,
    Ticket,
    Usage,
    lease_until,
    over_quota,
    owner_identity,
    wall_us,
)
from app.storage.tree.fs.atomic import make_dirs
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.listing_fill import open_listing
from app.storage.tree.sqlite.db import (
    create_file,
    is_busy,
    open_index,
    remove_side_links,
    shm_room,
    write_txn,
)
from app.storage.tree.sqlite.listing import Listing


class TreeTicket(HeldTicket):
    """A reservation of one write in one project's listing."""

    def __init__(self, owner: TreeUsage, scope: Scope) -> None:
        super().__init__(scope)
        self._owner = owner

    def _reserve(self, add_bytes: int, add_tasks: int) -> None:
        if self._id is None:
            self._id = str(ULID())
        self._owner.reserve(self._scope, self._id, add_bytes, add_tasks)  # never negative
        self.bytes += add_bytes
        self.tasks += add_tasks

    def renew(self) -> None:
        if self._id is not None and not self._done:
            self._owner.listing(self._scope).renew_reservation(self._id, lease_until())

    def _drop(self, ident: str) -> None:
        self._owner.listing(self._scope).release_reservation(ident)


class TreeUsage:
    """Read usage and admit writes, for both engines of one storage root."""

    def __init__(
        self,
        layout: Layout,
        *,
        lock_timeout: float,
        quotas: QuotaSource | None = None,
        floor: FreeSpace | None = None,
        clock: Clock = system_clock,
    ) -> None:
        """``clock``: the task engine's, which a listing rebuilt from the records needs."""
        self.layout = layout
        self.lock_timeout = lock_timeout
        self.quotas = quotas or QuotaSource(None)
        self.floor = floor
        self.clock = clock

    def listing(self, scope: Scope) -> Listing:
        return open_listing(self.layout, scope, timeout=self.lock_timeout, clock=self.clock)

    def _has_listing(self, scope: Scope) -> bool:
        return self.layout.tree.lstat(self.layout.listing(scope)) is not None

    # -- reading --------------------------------------------------------------------------
    def project(self, scope: Scope) -> tuple[Usage, Reserved]:
        """What a project stores and what its writes in flight hold (zero: no project)."""
        if not self._has_listing(scope):
            return ZERO, Reserved()
        return self.listing(scope).usage(wall_us())

    def tenant(self, tenant: str, *, besides: Scope | None = None) -> tuple[Usage, Reserved]:
        """The sum over a tenant's projects (but ``besides``)."""
        total, held = ZERO, Reserved()
        for scope in list(self.layout.projects([], [tenant])):
            if scope != besides:
                used, reserved = self.project(scope)
                total += used
                held = Reserved(held.bytes + reserved.bytes, held.tasks + reserved.tasks)
        return total, held

    # -- writing --------------------------------------------------------------------------
    def applies(self, scope: Scope) -> bool:
        """Whether a quota applies to ``scope``'s writes (the project's or its tenant's)."""
        project_quota, tenant_quota = self.quotas.of(scope)
        return project_quota is not None or tenant_quota is not None

    def admit(self, scope: Scope, *, gross: int, add_bytes: int = 0, add_tasks: int = 0) -> Ticket:
        """Admit a write that puts about ``gross`` bytes on disk and adds ``add_bytes`` to the
        project's usage (and ``add_tasks`` tasks): InsufficientStorage below the floor,
        QuotaExceeded over a quota; else the write's reservation (:data:`NO_TICKET` when no
        quota applies), which the caller settles or releases."""
        if self.floor is not None:
            self.floor.admit(gross)
        if not self.applies(scope):
            return NO_TICKET
        ticket = TreeTicket(self, scope)
        if add_bytes > 0 or add_tasks > 0:
            ticket.cover(add_bytes, add_tasks)
        return ticket

    def admit_write(
        self,
        scope: Scope,
        ticket: Ticket | None,
        *,
        gross: int,
        add_bytes: int,
        add_tasks: int,
    ) -> Ticket:
        """:meth:`admit` for a write whose bytes may have streamed in already under
        ``ticket`` (None: nothing did): the floor admits ``gross`` more, and the reservation
        becomes what the write, now known exactly, adds."""
        if ticket is None:
            return self.admit(scope, gross=gross, add_bytes=add_bytes, add_tasks=add_tasks)
        if self.floor is not None:
            self.floor.admit(gross)
        ticket.cover(add_bytes, add_tasks)
        return ticket

    def reserve(self, scope: Scope, ident: str, add_bytes: int, add_tasks: int) -> None:
        """Add to reservation ``ident`` of ``scope`` if every quota that applies admits it."""
        project_quota, tenant_quota = self.quotas.of(scope)
        name = f"{scope.tenant}/{scope.project}"
        project_dir = self.layout.check_inside(self.layout.project_dir(scope))
        if not project_dir.exists():
            make_dirs(project_dir, self.layout.root)  # the listing holds the reservation
        gate: AbstractContextManager[None] = (
            nullcontext()
            if tenant_quota is None
            else locked(self.layout.tenant_usage_lock(scope.tenant), self.lock_timeout)
        )
        with gate:
            others, others_held = (
                self.tenant(scope.tenant, besides=scope)
                if tenant_quota is not None
                else (ZERO, Reserved())
            )

            def check(stored: Usage, held: Reserved) -> None:
                refused = over_quota(
                    "project", name, project_quota, stored, held, add_bytes, add_tasks
                ) or over_quota(
                    "tenant",
                    scope.tenant,
                    tenant_quota,
                    stored + others,
                    Reserved(held.bytes + others_held.bytes, held.tasks + others_held.tasks),
                    add_bytes,
                    add_tasks,
                )
                if refused is not None:
                    raise refused

            self.listing(scope).reserve(
                ident,
                add_bytes,
                add_tasks,
                owner=owner_identity(),
                now_us=wall_us(),
                expires_us=lease_until(),
                check=check,
            )

    def freed(self) -> None:
        """Space was freed (a delete, a sweep): the next write looks at the disk again."""
        if self.floor is not None:
            self.floor.forget()

    def set_store(
        self, scope: Scope, store_id: str, usage: StoreUsage | None, release: str | None = None
    ) -> None:
        """Copy a store's counters into its project's listing (None: the store is gone)."""
        if usage is None and not self._has_listing(scope):
            return
        self.listing(scope).set_store_usage(store_id, usage, release)


@contextlib.contextmanager
def settling(ticket: Ticket) -> Iterator[Ticket]:
    """Release ``ticket`` when the block fails before the write settled it."""
    try:
        yield ticket
    finally:
        ticket.release()


_TRAFFIC_SCHEMA = """
CREATE TABLE IF NOT EXISTS traffic (
    hour INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    token_id TEXT NOT NULL,
    requests INTEGER NOT NULL,
    bytes_in INTEGER NOT NULL,
    bytes_out INTEGER NOT NULL,
    PRIMARY KEY (hour, tenant, project, token_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS traffic_by_project ON traffic (tenant, project, hour);
"""
_TRAFFIC_COLUMNS = "hour, tenant, project, token_id, requests, bytes_in, bytes_out"
_TRAFFIC_ADD = (
    f"INSERT INTO traffic ({_TRAFFIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (hour, tenant, project, token_id) DO UPDATE SET"
    " requests = requests + excluded.requests, bytes_in = bytes_in + excluded.bytes_in,"
    " bytes_out = bytes_out + excluded.bytes_out"
)


class TreeTraffic:
    """The hours of every project and token of one storage root."""

    def __init__(self, layout: Layout, *, lock_timeout: float) -> None:
        self.layout = layout
        self.timeout = lock_timeout

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to write with: the file and its tables made if they are missing."""
        # SQLite follows symlinks: refuse a planted one in place of the file.
        path = self.layout.check_inside(self.layout.traffic())
        create_file(str(path))
        conn = open_index(str(path), timeout=self.timeout)
        try:
            conn.executescript(_TRAFFIC_SCHEMA)
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection | None]:
        """A connection to read with, that writes nothing of its own (None: no table yet).

        On a full disk SQLite cannot create the -wal and -shm a reader of a WAL database
        needs once every connection has closed: the file is then read as it is (``immutable``:
        without what a WAL still holds, at most the last flush of counts). A report of the
        traffic must not fail because the disk is full."""
        path = str(self.layout.check_inside(self.layout.traffic()))
        remove_side_links(path)
        uris = [f"file:{quote(path)}?mode=ro", f"file:{quote(path)}?immutable=1"]
        if not shm_room(path):  # mode=ro would map a -shm with no blocks for it
            del uris[0]
        for uri in uris:
            try:
                conn = sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None)
            except sqlite3.OperationalError:
                continue
            try:
                try:
                    found = conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE name = 'traffic'"
                    ).fetchone()
                except sqlite3.OperationalError as exc:
                    if is_busy(exc):
                        raise
                    continue
                yield conn if found else None
                return
            finally:
                conn.close()
        yield None

    def add(self, rows: Iterable[TrafficRow]) -> None:
        batch = [
            (r.hour, r.tenant, r.project, r.token_id, r.requests, r.bytes_in, r.bytes_out)
            for r in rows
        ]
        if not batch:
            return
        with self._connect() as conn, write_txn(conn, "traffic"):
            conn.executemany(_TRAFFIC_ADD, batch)

    def rows(
        self, tenant: str, project: str | None = None, *, since_hour: int = 0
    ) -> list[TrafficRow]:
        if self.layout.tree.lstat(self.layout.traffic()) is None:
            return []
        where = "tenant = ? AND hour >= ?"
        args: list[object] = [tenant, since_hour]
        if project is not None:
            where += " AND project = ?"
            args.append(project)
        with self._read() as conn:
            if conn is None:
                return []
            found = conn.execute(
                f"SELECT {_TRAFFIC_COLUMNS} FROM traffic WHERE {where} ORDER BY hour, project, token_id",
                args,
            ).fetchall()
        return [TrafficRow(*r) for r in found]

    def prune(self, before_hour: int) -> int:
        if self.layout.tree.lstat(self.layout.traffic()) is None:
            return 0
        with self._connect() as conn, write_txn(conn, "traffic"):
            return conn.execute("DELETE FROM traffic WHERE hour < ?", (before_hour,)).rowcount
