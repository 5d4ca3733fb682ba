"""Lock side files in a parallel tree under <root>/.locks.

Lock files are never deleted while the service runs: unlinking a lock file that another
process waits on splits the waiters across two inodes and breaks mutual exclusion.
Every acquisition has a finite timeout; a busy lock becomes LockTimeout (HTTP 503).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock

from .atomic import DIR_MODE, FILE_MODE
from .errors import LockTimeout

# Called with (seconds waited, acquired) after each blocking acquisition; app.metrics adds one.
wait_observers: list[Callable[[float, bool], None]] = []


# flock has no timeout, so filelock polls a non-blocking flock; at its default 50 ms between
# polls a waiter that just missed a release sleeps while others take the lock again and
# again, and a few unlucky waiters wait far longer than the rest. So threads of one process
# queue on a threading.Lock per path, which wakes the next waiter at once, and only the
# thread at the head of that queue polls the flock (every millisecond) against other
# processes.
_POLL_SECONDS = 0.001
_gates: dict[str, list[Any]] = {}  # path -> [threading.Lock, users]
_gates_mutex = threading.Lock()

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
    _gates_mutex = threading.Lock()


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
            try:
                lock.acquire(
                    timeout=max(0.0, timeout - (time.monotonic() - started)),
                    poll_interval=_POLL_SECONDS,
                )
            except filelock.Timeout:
                _observe(started, False)
                raise LockTimeout(f"lock {path.name} is busy; retry shortly") from None
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
    for observe in wait_observers:
        observe(time.monotonic() - started, acquired)


def try_locked(path: Path) -> filelock.BaseFileLock | None:
    """Take ``path`` without waiting; return the held lock, or None if another holder has it."""
    _make_parents(path)
    lock = filelock.FileLock(str(path), mode=FILE_MODE, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None
    return lock
