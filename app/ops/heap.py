"""Bound what a worker's allocator keeps: two malloc arenas, trimmed once a minute (glibc only).

glibc's malloc gives each thread an arena of its own (up to eight per core) and returns a freed
page to the system only when it is at the top of its arena. A worker's threads allocate and free
a request's transient buffers all day among the long-lived ones (pooled connections' page
caches, prepared statements), so each arena ends up holding free chunks scattered among live
ones, and that free memory grows with the number of arenas: with sixteen threads, sixteen
arenas' worth.

- ``limit_arenas`` caps a worker at ``ARENAS`` arenas, set before its threads start. Only one
  thread runs Python at a time (the GIL); a second arena serves a thread inside SQLite or I/O
  (which run without it), so a thread rarely waits for an arena's lock, while the free chunks
  one thread leaves are there for the next.
- ``start_trimmer`` calls ``malloc_trim(0)`` every ``INTERVAL`` seconds, which releases every
  wholly free page of every arena (``madvise``); it takes a few milliseconds, each arena locked
  only while it is walked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 60.0
ARENAS = 2
M_ARENA_MAX = -8  # glibc's <malloc.h>

_started: threading.Thread | None = None


def _glibc(symbol: str) -> Any:
    """A function of glibc's malloc, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], object] | None:
    trim = _glibc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let this process's threads share at most ``arenas`` malloc arenas (gunicorn
    ``post_fork``, before the worker loads the app or starts a thread: a thread keeps the arena
    it first allocated in). False where there is no ``mallopt`` or it refused."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


def start_trimmer(interval: float = INTERVAL) -> threading.Thread | None:
    """Start this process's trimming thread (gunicorn ``post_worker_init``); once per process,
    none where malloc_trim does not exist or ``interval`` is not positive."""
    global _started
    trim = _malloc_trim()
    if _started is not None or trim is None or interval <= 0:
        return _started

    def run() -> None:  # a daemon: it ends with its process
        while True:
            time.sleep(interval)
            trim()

    _started = threading.Thread(target=run, name="malloc-trim", daemon=True)
    _started.start()
    return _started
