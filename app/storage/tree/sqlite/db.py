"""Opening the derived SQLite indexes (the task listing, each memory store's index)."""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator

from app.storage.core.errors import InsufficientStorage, LockTimeout
from app.storage.core.files import FILE_MODE
from app.storage.tree.fs.walk import remove_planted_link


def is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


# The page cache of one connection, in KiB (SQLite's default is 2 MiB): the pages it reads
# again stay in the kernel's page cache besides.
PAGE_CACHE_KIB = 256

_SQLITE_FULL = 13
# SQLite reports a full disk met writing its -wal or -shm as an I/O error (or "unable to
# open"), not as SQLITE_FULL: those are a full disk when the disk has no room left.
_SQLITE_IOERR, _SQLITE_CANTOPEN = 10, 14
_ROOM = 64 << 10


def full_disk(exc: sqlite3.Error, conn: sqlite3.Connection | None = None, path: str = "") -> bool:
    """Whether ``exc`` is SQLite meeting a full disk (of ``path``, or ``conn``'s file)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == _SQLITE_FULL:
        return True
    if code is None or code & 0xFF not in (_SQLITE_IOERR, _SQLITE_CANTOPEN):
        return False
    if not path and conn is not None:
        with contextlib.suppress(sqlite3.Error):
            path = conn.execute("PRAGMA database_list").fetchone()[2]
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _ROOM or (st.f_files > 0 and st.f_favail == 0)


def no_space(what: str, exc: sqlite3.Error) -> InsufficientStorage:
    return InsufficientStorage(f"no space left on the storage device ({what}: {exc})")


def create_file(path: str) -> None:
    """Create a database file that does not exist yet with the service's file mode (SQLite
    would create it 0644 less the umask, and gives its -wal and -shm files the database's
    mode). Never through a link: a planted one is left for the open to refuse or fsck."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # There already, or no directory: the open that follows answers as it would have.
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(path, flags, FILE_MODE))


def journal_mode(path: str) -> str:
    """The journal a database at ``path`` keeps: ``wal``, or ``truncate`` (a rollback journal)
    on a filesystem whose blocks are smaller than a memory page.

    In WAL mode SQLite maps the database's -shm file and, growing it, writes one byte per 4 KiB
    page: on 1 KiB blocks (mke2fs's default below 512 MiB) the page's other blocks are holes,
    filled when first written through the mapping, and on a disk with no block left that write
    is a SIGBUS that kills the process. A rollback journal maps nothing: a full disk is then a
    plain SQLITE_FULL on a write (a 507), and reads need no room at all.
    """
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return "wal"
    return "wal" if st.f_frsize >= mmap.PAGESIZE else "truncate"


# The files SQLite opens by name beside a database, following links.
SIDE_FILES = ("-wal", "-shm", "-journal")


def open_index(target: str, *, timeout: float, uri: bool = False) -> sqlite3.Connection:
    """Connect in the journal mode of :func:`journal_mode` with ``secure_delete``; a database
    kept busy past ``timeout`` raises LockTimeout (HTTP 503), not a bare OperationalError
    (HTTP 500).

    WAL with ``synchronous=NORMAL``: the WAL is fsynced at checkpoints, not at every commit.
    The indexes are derived: a killed process loses nothing committed (the WAL is in the page
    cache), and what a power loss takes back the start-up recovery rebuilds from the records.
    A rollback journal is kept with ``synchronous=FULL``, the setting under which a power loss
    cannot leave it torn.

    Setting the journal mode can answer "database is locked" at once, without waiting on the
    busy handler, while another process recovers the WAL of a worker that was killed (the
    robustness soak found it as a 500): the mode is persistent, so it is only set when the
    file is not in that mode yet, and a busy answer is retried until ``timeout``. Leaving WAL
    needs the only connection to the file: while others hold it the mode stays, and the next
    connection tries again.
    """
    # SQLite opens a database's side files by name and follows links there (the database
    # file itself is refused by the walk before this). What a real WAL held is then gone:
    # the indexes are derived, and fsck rebuilds them from the records.
    path = urllib.parse.unquote(target.removeprefix("file:").split("?", 1)[0]) if uri else target
    for suffix in SIDE_FILES:
        remove_planted_link(path + suffix, "SQLite")
    want = journal_mode(path)
    conn = sqlite3.connect(target, uri=uri, timeout=timeout, isolation_level=None)
    deadline = time.monotonic() + timeout
    try:
        if want != "wal":
            _leave_wal(conn, path, want, timeout)
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != want:
                    mode = conn.execute(f"PRAGMA journal_mode={want}").fetchone()[0]
                sync = "NORMAL" if mode == "wal" else "FULL"
                conn.execute(f"PRAGMA synchronous={sync}")
                # Deleted rows and freed pages are overwritten with zeros: text removed from
                # an index must not stay readable in its file (tree/sqlite/fts.py).
                conn.execute("PRAGMA secure_delete=ON")
                # Each thread keeps connections open (listing.py, store_index.py): what a
                # worker holds is their count times this, whatever it serves for how long.
                conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
                return conn
            except sqlite3.OperationalError as exc:
                if full_disk(exc, path=path):
                    raise no_space(f"index {path}", exc) from None
                if not is_busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"index {target} is busy: {exc}") from None
                time.sleep(0.005)
    except BaseException:
        conn.close()
        raise


def _leave_wal(conn: sqlite3.Connection, path: str, want: str, timeout: float) -> None:
    """Switch a database that is in WAL mode to ``want`` without mapping its -shm.

    Reading a WAL database maps its -shm, the SIGBUS :func:`journal_mode` avoids, unless the
    connection holds the file exclusively from its first read: SQLite then keeps the WAL's
    index in its own memory. That needs the only connection to the file; while another holds
    it the switch waits for a later connection (no wait here: the busy timeout is 0)."""
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    try:
        if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            conn.execute(f"PRAGMA journal_mode={want}")
    except sqlite3.OperationalError as exc:
        # Busy: another connection holds the file. A full disk: the open that follows
        # answers it as a 507.
        if not (is_busy(exc) or full_disk(exc, path=path)):
            raise
    finally:
        conn.execute("PRAGMA locking_mode = NORMAL")
        # The exclusive lock goes at the next access of the file, not at the pragma (which
        # fails as the switch did when the disk is full: the lock was not taken then).
        with contextlib.suppress(sqlite3.OperationalError):
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")


@contextlib.contextmanager
def write_txn(conn: sqlite3.Connection, what: str) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error; a database still locked
    after the busy timeout is LockTimeout (HTTP 503)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if full_disk(exc, conn):
            raise no_space(what, exc) from None
        raise LockTimeout(f"{what} is busy: {exc}") from None
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        # A full disk is a 507 wherever SQLite meets it (a COMMIT after a record's commit
        # point included): never a 500, which clients retry at once by themselves.
        if isinstance(exc, sqlite3.Error) and full_disk(exc, conn):
            raise no_space(what, exc) from exc
        raise


@contextlib.contextmanager
def read_txn(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction: every query inside sees the same snapshot."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")
