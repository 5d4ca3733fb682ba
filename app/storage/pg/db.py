"""PostgreSQL connections: one pool per process, transactions, and what their errors mean.

A pool is made on first use in the process that uses it, never before a fork: gunicorn
forks its workers from a master that may have used the database (the first-start token,
the start-up migrations), and a connection shared by two processes is two clients writing
one socket. A pool left behind by the parent is kept, unused and unclosed, for the same
reason (closing it would send a Terminate on the parent's sockets).

Every write is one transaction. Locks are waited for at most ``lock_timeout`` seconds
(``SET LOCAL lock_timeout``, which also bounds advisory locks); a wait that runs out, or a
pool with no free connection in that time, is :class:`LockTimeout` (HTTP 503 with
Retry-After), as a busy lock file is for the tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from app.storage.core.errors import LockTimeout, StorageError

log = logging.getLogger("app.storage.pg")

# Pools of a parent process, kept alive in a forked child so that they are never closed there.
_inherited: list[ConnectionPool] = []


class DatabaseError(StorageError):
    """The database refused or lost a statement (not a lock wait: see LockTimeout)."""


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn a lock wait that ran out into LockTimeout, other database failures into
    DatabaseError (the caller's StorageError subclasses pass through)."""
    try:
        yield
    except (pg_errors.LockNotAvailable, pg_errors.QueryCanceled) as exc:
        raise LockTimeout(f"{what} is busy: {exc.diag.message_primary or exc}") from None
    except pg_errors.DeadlockDetected as exc:
        raise LockTimeout(f"{what}: {exc.diag.message_primary or exc}") from None
    except PoolTimeout:
        raise LockTimeout(f"{what}: no database connection free; retry shortly") from None
    except psycopg.OperationalError as exc:
        # libpq's text names hosts and sockets: it stays in the log.
        log.warning("%s: the database is unavailable: %s", what, exc)
        raise LockTimeout(f"{what}: the database is unavailable") from None
    except psycopg.Error as exc:
        raise DatabaseError(f"{what}: {exc}") from None


# A connection the server closed (a restart, an idle timeout) is found and replaced before it
# is lent, not by the request using it. One returned less than this long ago was working then
# and is lent unchecked: a restart takes longer, and the check is a round trip that a read
# of one turn would otherwise pay every time.
CHECK_IDLE_SECONDS = 1.0


def _returned(conn: psycopg.Connection[Any]) -> None:
    conn._pm_returned = time.monotonic()  # type: ignore[attr-defined]


def _check_if_idle(conn: psycopg.Connection[Any]) -> None:
    if time.monotonic() - getattr(conn, "_pm_returned", 0.0) >= CHECK_IDLE_SECONDS:
        ConnectionPool.check_connection(conn)


class Database:
    """A PostgreSQL database reached through ``url`` (libpq URL or key=value string)."""

    def __init__(self, url: str, *, lock_timeout: float, pool_size: int = 8) -> None:
        self.url = url
        self.lock_timeout = lock_timeout
        self.pool_size = max(2, pool_size)
        self._pool: ConnectionPool | None = None
        self._pid = -1
        self._mutex = threading.Lock()

    def pool(self) -> ConnectionPool:
        if self._pid != os.getpid():
            with self._mutex:
                if self._pid != os.getpid():
                    if self._pool is not None:
                        _inherited.append(self._pool)
                    self._pool = ConnectionPool(
                        self.url,
                        check=_check_if_idle,
                        reset=_returned,
                        min_size=1,
                        max_size=self.pool_size,
                        timeout=self.lock_timeout,
                        name="project-memory",
                        open=True,
                    )
                    self._pid = os.getpid()
        assert self._pool is not None
        return self._pool

    def close(self) -> None:
        """Close this process's pool (an inherited one is left alone)."""
        with self._mutex:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close()
            self._pool, self._pid = None, -1

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool (the sweeper's leader lease)."""
        with translated("database"):
            return psycopg.connect(self.url, **kwargs)

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with translated(what), self.pool().connection() as conn:
            # Milliseconds, as an integer: SET takes no bound parameters.
            ms = max(1, int(self.lock_timeout * 1000))
            conn.execute(f"SET LOCAL lock_timeout = {ms}")
            yield conn

    @contextlib.contextmanager
    def snapshot(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A read-only transaction in which every statement sees the same snapshot."""
        with translated(what), self.pool().connection() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn


def lock_key(*parts: str) -> str:
    """The text an advisory lock is taken on (hashed to 64 bits by the database)."""
    return "\x1f".join(parts)


def advisory_xact_lock(conn: psycopg.Connection[Any], *parts: str) -> None:
    """Take the transaction's advisory lock on ``parts`` (released at commit or rollback)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(*parts),))


def advisory_xact_locks(conn: psycopg.Connection[Any], keys: list[tuple[str, ...]]) -> None:
    """Take the transaction's advisory locks on each of ``keys``, in their order, in one
    statement."""
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest(%s::text[]) AS k",
        ([lock_key(*parts) for parts in keys],),
    )


# Backups (export and import) hold this lock in shared mode for as long as they run; a
# deletion of objects asks whether any session holds it (backup_running). The key includes
# the schema: deployments in other schemas of the same database have backups of their own.
_BACKUP_LOCK_TEXT = lock_key("backup", "")


@contextlib.contextmanager
def backup_lock(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Hold the backup lock in shared mode in ``conn``'s session while the block runs.

    While any session holds it, objects that lose their rows are left to the sweeper's
    orphan pass instead of being deleted at once: an export streams the objects its snapshot
    names after the snapshot was taken, and an import's objects are named by no committed
    row until its last transaction, however long the upload takes. It is released
    explicitly at the end: a closed connection's server process lets go of its locks a
    moment after the client has moved on.
    """
    conn.execute(
        "SELECT pg_advisory_lock_shared(hashtextextended(%s || current_schema(), 0))",
        (_BACKUP_LOCK_TEXT,),
    )
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()  # a failed transaction refuses every statement, the unlock too
            conn.execute(
                "SELECT pg_advisory_unlock_shared(hashtextextended(%s || current_schema(), 0))",
                (_BACKUP_LOCK_TEXT,),
            )


def backup_running(conn: psycopg.Connection[Any]) -> bool:
    """Whether another session holds the backup lock (a bigint advisory lock shows in
    pg_locks as its high half in ``classid``, its low half in ``objid``, ``objsubid`` 1)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.objsubid = 1 AND l.classid = ((k.v >> 32) & 4294967295)::oid"
        " AND l.objid = (k.v & 4294967295)::oid AND l.pid <> pg_backend_pid())"
        " FROM (SELECT hashtextextended(%s || current_schema(), 0) AS v) k",
        (_BACKUP_LOCK_TEXT,),
    ).fetchone()
    return bool(row and row[0])
