"""Lock side files in a parallel tree under <root>/.locks.

Lock files are never deleted while the service runs: unlinking a lock file that another
process waits on splits the waiters across two inodes and breaks mutual exclusion.
Every acquisition has a finite timeout; a busy lock becomes LockTimeout (HTTP 503).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock

from .errors import LockTimeout

# Called with (seconds waited, acquired) after each blocking acquisition; app.metrics adds one.
wait_observers: list[Callable[[float, bool], None]] = []


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created with its parents) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A new FileLock per acquisition: objects must not cross a fork (gunicorn preload), and
    # the default thread_local=True keeps gthread workers' threads excluding each other.
    lock = filelock.FileLock(str(path), timeout=timeout)
    started = time.monotonic()
    try:
        lock.acquire()
    except filelock.Timeout:
        for observe in wait_observers:
            observe(time.monotonic() - started, False)
        raise LockTimeout(f"lock {path.name} is busy; retry shortly") from None
    for observe in wait_observers:
        observe(time.monotonic() - started, True)
    try:
        yield
    finally:
        lock.release()


def try_locked(path: Path) -> filelock.BaseFileLock | None:
    """Take ``path`` without waiting; return the held lock, or None if another holder has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None
    return lock


def touch(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.close(fd)
