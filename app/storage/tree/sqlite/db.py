"""Opening the derived SQLite indexes (the task listing, each memory store's index)."""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import stat
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

# Prepared statements one connection keeps (Python's default is 128). A worker keeps dozens of
# connections open (pool.py), and each statement of the listing holds kilobytes: at 128 they
# outweigh the page caches several times over, mostly with the shapes of one-off searches and
# the statements that opened the file. A request uses fewer than this many; the rest are
# prepared again when they come back, which costs microseconds.
STATEMENT_CACHE = 32

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


# SQLite in WAL mode maps each database's -shm and, making or growing it, writes one byte per
# 4 KiB page: on blocks smaller than that (ext4 of 1 KiB blocks, mke2fs's default below
# 512 MiB) the rest of each page is a hole until SQLite writes it through the mapping, and
# with no block left for it that write is a SIGBUS that kills the process. There an index is
# neither opened nor written with less than _SHM_ROOM free (InsufficientStorage, a 507),
# except an open of one whose -shm is whole already: SQLite remakes a -shm only when it is
# the first to open it, out of the blocks its truncation frees.
_SHM_ROOM = 256 << 10


def _room(path: str) -> tuple[bool, bool]:
    """Whether the filesystem of ``path`` has blocks smaller than a memory page, and whether
    it has _SHM_ROOM free (always True on page-sized blocks)."""
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return False, True
    if st.f_frsize >= mmap.PAGESIZE:
        return False, True
    return True, st.f_bavail * st.f_frsize >= _SHM_ROOM


def _shm_whole(path: str) -> bool:
    try:
        st = os.stat(path + "-shm", follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0 and st.st_blocks * 512 >= st.st_size


def shm_room(path: str) -> bool:
    """Whether ``path`` may be opened without mapping holes that may have no block to go to
    (always, on a filesystem of page-sized blocks)."""
    return _shm_check(path)[1]


def check_shm_room(path: str) -> bool:
    """InsufficientStorage rather than an open that could map holes with no block for them;
    return whether ``path`` is on small blocks."""
    small, room = _shm_check(path)
    if not room:
        raise _no_shm_room(path)
    return small


def _shm_check(path: str) -> tuple[bool, bool]:
    small, room = _room(path)
    return small, room or _shm_whole(path)


def check_write_room(path: str) -> None:
    """InsufficientStorage when :func:`write_txn` would refuse a write to the index at
    ``path`` for want of room for its shared memory: for a caller that must refuse before
    it changes anything else (a delete whose rename comes before its index write)."""
    small, room = _room(path)
    if small and not room:
        raise _no_shm_room(path)


def _no_shm_room(path: str) -> InsufficientStorage:
    return InsufficientStorage(
        f"no space left on the storage device (index {path}: less than "
        f"{_SHM_ROOM >> 10} KiB free for its shared memory)"
    )


class IndexConnection(sqlite3.Connection):
    """A connection that knows whether its database is on small blocks (its path, or "")."""

    small_blocks_path = ""


# The files SQLite opens by name beside a database, following links (it looks for a hot
# -journal at every open, whatever the journal mode).
SIDE_FILES = ("-wal", "-shm", "-journal")


def remove_side_links(path: str) -> None:
    """Remove links planted at the side files of the database at ``path``."""
    for suffix in SIDE_FILES:
        remove_planted_link(path + suffix, "SQLite")


def open_index(target: str, *, timeout: float, uri: bool = False) -> sqlite3.Connection:
    """Connect in WAL mode with ``synchronous=NORMAL`` and ``secure_delete``; a database kept
    busy past ``timeout`` raises LockTimeout (HTTP 503), not a bare OperationalError (HTTP 500).

    NORMAL: the WAL is fsynced at checkpoints, not at every commit. The indexes are derived:
    a killed process loses nothing committed (the WAL is in the page cache), and what a power
    loss takes back the start-up recovery rebuilds from the records.

    Setting the journal mode can answer "database is locked" at once, without waiting on the
    busy handler, while another process recovers the WAL of a worker that was killed (the
    robustness soak found it as a 500): the mode is persistent, so it is only set when the
    file is not in WAL mode yet, and a busy answer is retried until ``timeout``.

    On a filesystem of small blocks, see _SHM_ROOM.
    """
    # SQLite opens a database's side files by name and follows links there (the database
    # file itself is refused by the walk before this). What a real WAL held is then gone:
    # the indexes are derived, and fsck rebuilds them from the records.
    path = urllib.parse.unquote(target.removeprefix("file:").split("?", 1)[0]) if uri else target
    remove_side_links(path)
    small = check_shm_room(path)
    # A pooled connection serves one thread at a time, not always the one that opened it
    # (pool.py); SQLite itself is built serialized.
    conn = sqlite3.connect(
        target,
        uri=uri,
        timeout=timeout,
        isolation_level=None,
        factory=IndexConnection,
        check_same_thread=False,
        cached_statements=STATEMENT_CACHE,
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                # Deleted rows and freed pages are overwritten with zeros: text removed from
                # an index must not stay readable in its file (tree/sqlite/fts.py).
                conn.execute("PRAGMA secure_delete=ON")
                # A worker keeps a bounded number of connections open (pool.py): what it
                # holds is their count times this, whatever it serves for how long.
                conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
                if small:
                    conn.small_blocks_path = path
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


@contextlib.contextmanager
def write_txn(conn: sqlite3.Connection, what: str) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error; a database still locked
    after the busy timeout is LockTimeout (HTTP 503)."""
    # A WAL growing past its -shm's first 32 KiB grows the -shm too (see _SHM_ROOM).
    small = getattr(conn, "small_blocks_path", "")
    if small:
        check_write_room(small)
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
