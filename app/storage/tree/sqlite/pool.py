"""Open SQLite connections a worker keeps between uses, shared by its threads, bounded.

Opening an index connection (its settings, the schema check) costs more than the statements of
a write, and closing the last connection to a database checkpoints its WAL with two fsyncs and
deletes it, for the next open to make again: so connections stay open between uses. What they
hold (each its page cache, its schema, its prepared statements) is bounded by their number,
and that number is the pool's, not the threads': a worker of any thread count keeps at most
``limit`` idle connections of a kind, plus the ones its threads are using at the moment.

A thread takes a connection for the length of one use and gives it back; a use nested in
another of the same thread, for the same file, gets the same connection (a read inside a
write sees the write). Connections cross threads only through the pool, one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Tag = TypeVar("Tag")


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of the file now at ``path``, None when there is none: the tag of a
    connection that must not outlive its file (a store deleted, a file replaced by hand)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class _Held(threading.local):
    def __init__(self) -> None:
        self.by_key: dict[str, sqlite3.Connection] = {}


class Pool(Generic[Tag]):
    """Idle connections by key (a database's path), the least recently used first.

    Each carries a tag, what its opener knew of the file (its identity, say): ``accept(tag)``
    decides whether an idle one may still serve; one that may not is closed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle: list[tuple[str, sqlite3.Connection, Tag]] = []
        self._held = _Held()

    def _forked(self) -> None:
        # A connection must never cross a fork: the child starts with none (the parent's are
        # left unclosed, for the parent to use), and with a lock no thread of the parent holds.
        if self._pid != os.getpid():
            self._pid, self._lock, self._idle = os.getpid(), threading.Lock(), []
            self._held = _Held()

    @contextlib.contextmanager
    def use(
        self,
        key: str,
        open_: Callable[[], tuple[sqlite3.Connection, Tag]],
        *,
        accept: Callable[[Tag], bool] = lambda _tag: True,
        keep_on_error: bool = True,
    ) -> Iterator[sqlite3.Connection]:
        """A connection to ``key`` for the length of the block: an idle one ``accept`` takes,
        or a new one from ``open_`` (the connection and its tag). Given back after, unless it
        is in a transaction still, or the block raised and not ``keep_on_error``."""
        self._forked()
        held = self._held.by_key
        mine = held.get(key)
        if mine is not None:  # nested: the outer use gives it back
            yield mine
            return
        conn, tag = self._take(key, accept) or open_()
        held[key] = conn
        keep = False
        try:
            yield conn
            keep = True
        except BaseException:
            keep = keep_on_error
            raise
        finally:
            del held[key]
            if keep and not conn.in_transaction:
                self._give(key, conn, tag)
            else:
                conn.close()

    def _take(
        self, key: str, accept: Callable[[Tag], bool]
    ) -> tuple[sqlite3.Connection, Tag] | None:
        stale: list[sqlite3.Connection] = []
        found = None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                k, conn, tag = self._idle[i]
                if k != key:
                    continue
                del self._idle[i]
                if accept(tag):
                    found = conn, tag
                    break
                stale.append(conn)
        for conn in stale:
            conn.close()
        return found

    def _give(self, key: str, conn: sqlite3.Connection, tag: Tag) -> None:
        with self._lock:
            if self._pid != os.getpid():
                return
            self._idle.append((key, conn, tag))
            evicted = self._idle[: max(0, len(self._idle) - self.limit)]
            del self._idle[: len(evicted)]
        # Outside the lock: closing the last connection to a database checkpoints its WAL.
        for _key, old, _tag in evicted:
            old.close()

    def forget(self, match: Callable[[str], bool]) -> None:
        """Close the idle connections whose key ``match`` takes (the ones in use are left to
        their users)."""
        self._forked()
        with self._lock:
            gone = [e for e in self._idle if match(e[0])]
            self._idle = [e for e in self._idle if not match(e[0])]
        for _key, conn, _tag in gone:
            conn.close()

    def idle(self) -> int:
        """How many connections the pool keeps open now."""
        self._forked()
        with self._lock:
            return len(self._idle)
