"""Lock side files in a parallel tree under <root>/.locks.

Lock files are never deleted while the service runs: unlinking a lock file that another
process waits on splits the waiters across two inodes and breaks mutual exclusion.
Every acquisition has a finite timeout; a busy lock becomes LockTimeout (HTTP 503).

Each lock directory also holds ``_waiting``: which process has a thread waiting for each of
its locks (see :class:`_Waiting`), so that processes take turns on a busy lock.
"""

from __future__ import annotations

import collections
import contextlib
import os
import stat
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from app.storage.core.errors import LockTimeout
from app.storage.core.files import DIR_MODE, FILE_MODE
from app.storage.core.observers import lock_waited
from app.storage.tree.fs.noatime import open_noatime

# flock has no timeout, so filelock polls a non-blocking flock; at its default 50 ms between
# polls a waiter that just missed a release sleeps while others take the lock again and
# again, and a few unlucky waiters wait far longer than the rest. So threads of one process
# queue on a threading.Lock per path, which wakes the next waiter at once, and only the
# thread at the head of that queue polls the flock (every millisecond) against other
# processes.
_POLL_SECONDS = 0.001
_gates: dict[str, list[Any]] = {}  # path -> [threading.Lock, users]
_gates_mutex = threading.Lock()

# Threads of one process hand the lock on at once, while a thread of another process only
# sees it free when its poll happens to fall between a release and the next local take: under
# steady load it could wait until the local queue ran dry. So a process whose thread finds
# the lock taken says so in the lock directory's ``_waiting`` file, and a thread of any
# other process that is about to take the lock first lets it go ahead, for at most
# _DEFER_SECONDS (a hint left by a process that died or gave up costs no more than that).
_DEFER_SECONDS = 0.005
_WAITING_NAME = "_waiting"
_WAITING_SLOTS = 4096  # 8 bytes each; two locks sharing a slot only defer to each other
_SLOT = struct.Struct("<q")

# One FileLock object per lock path and process, reused: building one resolves its path (an
# lstat per component) and registers it for filelock's fork tracking, a large share of an
# acquisition. Only the thread holding the path's gate uses it, so it
# is not thread-local. Bounded: a long-running worker sees every task it ever wrote.
_FILE_LOCKS_LIMIT = 1024
_file_locks: collections.OrderedDict[str, filelock.BaseFileLock] = collections.OrderedDict()


def _reset_gates_after_fork() -> None:
    global _gates_mutex
    _gates.clear()
    _file_locks.clear()  # objects must not cross a fork (gunicorn preload)
    _Waiting.forget()
    _gates_mutex = threading.Lock()


class _Waiting:
    """A lock's slot in its directory's ``_waiting`` file: the pid of a process with a thread
    waiting for that lock, or 0. A hint, read and written without a lock (each access is one
    pread or pwrite of 8 bytes): whatever it says, mutual exclusion is the flock's alone.
    Where the file cannot be used (a link or anything else put in its place by hand) there is
    no hint, and processes compete for the lock as they would without one."""

    _fds: dict[str, int | None] = {}  # lock directory -> its _waiting file, once per process
    _mutex = threading.Lock()
    pid = os.getpid()  # this process's (reset by forget() in a forked child)

    def __init__(self, path: Path) -> None:
        self.fd = self._open(str(path.parent))
        self.offset = zlib.crc32(path.name.encode()) % _WAITING_SLOTS * _SLOT.size
        self.announced = False

    @classmethod
    def _open(cls, directory: str) -> int | None:
        if directory in cls._fds:
            return cls._fds[directory]
        with cls._mutex:
            if directory not in cls._fds:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd: int | None = None
                path = os.path.join(directory, _WAITING_NAME)
                with contextlib.suppress(OSError):
                    # Read on every take: an access-time update would be one more journaled
                    # inode write each time (noatime.py).
                    fd = open_noatime(path, flags, 0o600)
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)
                        fd = None
                cls._fds[directory] = fd
            return cls._fds[directory]

    @classmethod
    def forget(cls) -> None:
        for fd in cls._fds.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        cls._fds = {}
        cls._mutex = threading.Lock()
        cls.pid = os.getpid()

    def get(self) -> int:
        if self.fd is None:
            return 0
        try:
            data = os.pread(self.fd, _SLOT.size, self.offset)
        except OSError:
            return 0
        return int(_SLOT.unpack(data)[0]) if len(data) == _SLOT.size else 0

    def put(self, pid: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self.fd, _SLOT.pack(pid), self.offset)

    def defer(self) -> None:
        """Let a waiting thread of another process take the lock first (for a while)."""
        other = self.get()
        if other in (0, self.pid):
            return
        deadline = time.monotonic() + _DEFER_SECONDS
        while time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS / 4)
            if self.get() != other:
                return
        if self.get() == other:
            self.put(0)  # it did not come: its process died or gave up

    def announce(self) -> None:
        self.put(self.pid)
        self.announced = True

    def withdraw(self) -> None:
        if self.announced and self.get() == self.pid:
            self.put(0)


def _file_lock(key: str) -> filelock.BaseFileLock:
    with _gates_mutex:
        lock = _file_locks.pop(key, None)
        if lock is None:
            lock = filelock.FileLock(key, mode=FILE_MODE, thread_local=False)
        _file_locks[key] = lock  # most recently used last
        while len(_file_locks) > _FILE_LOCKS_LIMIT:
            _file_locks.popitem(last=False)
        return lock


os.register_at_fork(after_in_child=_reset_gates_after_fork)


@contextlib.contextmanager
def _gate(key: str) -> Iterator[threading.Lock]:
    with _gates_mutex:
        entry = _gates.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _gates_mutex:
            entry[1] -= 1
            if entry[1] == 0:
                del _gates[key]


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created with its parents) for the block."""
    if not os.path.exists(path):  # a stat, where mkdir(exist_ok) is a failing mkdir each time
        _make_parents(path)
    key = str(path)
    started = time.monotonic()
    with _gate(key) as gate:
        if not gate.acquire(timeout=timeout):
            _observe(started, False)
            raise LockTimeout(f"lock {path.name} is busy; retry shortly")
        try:
            lock = _file_lock(key)
            waiting = _Waiting(path)
            waiting.defer()
            try:
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    waiting.announce()
                    lock.acquire(
                        timeout=max(0.0, timeout - (time.monotonic() - started)),
                        poll_interval=_POLL_SECONDS,
                    )
            except filelock.Timeout:
                waiting.withdraw()
                _observe(started, False)
                raise LockTimeout(f"lock {path.name} is busy; retry shortly") from None
            waiting.withdraw()
            _observe(started, True)
            try:
                yield
            finally:
                lock.release()
        finally:
            gate.release()


def _make_parents(path: Path) -> None:
    """The lock file's missing directories, each with DIR_MODE (``Path.mkdir(parents=True)``
    gives the levels above the last the umask's default). Locks hold no data: no fsync."""
    missing = []
    current = path.parent
    while not os.path.isdir(current):
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)


def _observe(started: float, acquired: bool) -> None:
    lock_waited(time.monotonic() - started, acquired)


def try_locked(path: Path) -> filelock.BaseFileLock | None:
    """Take ``path`` without waiting; return the held lock, or None if another holder has it."""
    _make_parents(path)
    lock = filelock.FileLock(str(path), mode=FILE_MODE, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None
    return lock
