"""The background worker that embeds what writes queued (tree/sqlite/vectors.py), off the
request path.

A write that changed a project's text asks for a drain of that project (:meth:`Embedding.later`)
after it committed; the sweep, a search that finds rows queued and ``fsck --repair`` ask too,
so what a killed process left queued is embedded by the next of them. One drain per project
runs at a time across every process: in a process, one thread per project (background.Later);
across the workers, the project's embed lock, taken without waiting (a worker that finds it
held leaves the work to the holder, which looks at the queue again after it let go, so a row
queued while it was finishing is not left behind).

A drain embeds each index's queue :data:`~app.storage.core.vectors.EMBED_BATCH` rows at a
time: it reads the texts, embeds them with no lock held, then stores the vectors in one short
write transaction (under the store's lock for a store index, as every write of it is), keeping
only rows that did not change meanwhile. The first drain of an index in a process queues every
row not embedded with the current model (new tables, a changed model): the re-embedding after
a model change runs here, and searches rank only the current model's vectors until it is done.
When the embedder is unavailable the drain stops; the rows stay queued for the next one.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.storage.core.background import Later
from app.storage.core.errors import StorageError
from app.storage.core.names import STORE_ID_RE, Scope
from app.storage.core.vectors import (
    EMBED_BATCH,
    EMBED_SETTLE,
    embed_documents,
    embed_text,
    model_key,
)
from app.storage.tree.fs.locks import try_locked
from app.storage.tree.fs.txn import Key
from app.storage.tree.sqlite import vectors
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore

log = logging.getLogger("app.storage.embedding")

# What is embedded of each row: a turn's meta values and summary, a memory's path and content.
TURN_COLUMNS = ("meta", "summary")
MEMORY_COLUMNS = ("path", "content")
# Drains of one project back to back at most when rows keep arriving while it finishes.
_ROUNDS = 8


@dataclass(frozen=True)
class _Index:
    """One SQLite file with a queue: how to read it and how to write it."""

    name: str
    columns: tuple[str, ...]
    read: Callable[[], AbstractContextManager[sqlite3.Connection]]
    write: Callable[[], AbstractContextManager[sqlite3.Connection]]


@dataclass(frozen=True, slots=True)
class VectorState:
    """What fsck says of one index's vectors."""

    name: str
    missing: int  # neither queued nor embedded: lost (a fault)
    orphans: int
    waiting: int = 0  # queued, or embedded with another model: the next drain's


class Embedding:
    """The embedding queue's worker for a tree backend."""

    def __init__(self, tasks: TaskStore, stores: MemoryStoreEngine, embedder: Embedder) -> None:
        self.tasks = tasks
        self.stores = stores
        self.embedder = embedder
        self.later_runs = Later(settle=EMBED_SETTLE)
        # Indexes this process already queued every stale row of (see the module).
        self._swept: set[str] = set()
        self._guard = threading.Lock()

    @property
    def model(self) -> str:
        return model_key(self.embedder)

    def later(self, scope: Scope) -> threading.Event:
        """Drain the project's queue in the background; the event is set once a drain that
        started after this call has ended."""
        return self.later_runs.run(
            ("embed", scope),
            lambda: self.drain(scope),
            f"embedding the queued text of {scope.tenant}/{scope.project}",
        )

    def idle(self) -> bool:
        return not self.later_runs.busy()

    # -- the drain ---------------------------------------------------------------------------
    def drain(self, scope: Scope) -> int | None:
        """Embed every queued row of the project; how many were stored, None when another
        process holds the project's embed lock (it drains them)."""
        lock_path = self.tasks.layout.check_inside(self.tasks.layout.embed_lock(scope))
        total = 0
        for _ in range(_ROUNDS):
            lock = try_locked(lock_path)
            if lock is None:
                return None
            try:
                for index in self._indexes(scope):
                    try:
                        total += self._drain_index(index)
                    except (StorageError, sqlite3.Error, OSError) as exc:
                        # A store deleted meanwhile, a damaged index (its upkeep rebuilds
                        # it and queues every row again): the other indexes go on.
                        log.warning("embedding %s skipped: %s", index.name, exc)
            except EmbedderUnavailable as exc:
                log.warning(
                    "embedding %s/%s stopped (%s); the rows stay queued",
                    scope.tenant,
                    scope.project,
                    exc,
                )
                return total
            finally:
                lock.release()
            # A row queued while this drain finished, whose writer found the lock held.
            if not self.queued(scope):
                break
        return total

    def _drain_index(self, index: _Index) -> int:
        stored = 0
        with self._guard:
            first = index.name not in self._swept
        if first:
            with index.write() as conn:
                vectors.create_schema(conn)
                vectors.queue_stale(conn, self.model)
            with self._guard:
                self._swept.add(index.name)
        while True:
            with index.read() as conn:
                rows = vectors.batch(conn, index.columns, EMBED_BATCH)
            if not rows:
                return stored
            embedded = embed_documents(self.embedder, [embed_text(v) for _, _, v in rows])
            done = [
                (doc, gen, chunks) for (doc, gen, _), chunks in zip(rows, embedded, strict=True)
            ]
            with index.write() as conn:
                stored += vectors.store(conn, self.model, done)

    def queued(self, scope: Scope) -> int:
        """Rows of the project waiting to be embedded."""
        count = 0
        for index in self._indexes(scope):
            try:
                with index.read() as conn:
                    count += vectors.queued(conn)
            except (StorageError, sqlite3.Error):
                continue
        return count

    # -- fsck --------------------------------------------------------------------------------
    def check(self, scope: Scope, *, repair: bool) -> list[VectorState]:
        """Each index of the project with rows that lack vectors of the current model (lost,
        or waiting for a drain) or vectors of rows gone; with ``repair``, orphans are dropped
        and every row without vectors is queued and embedded now (an unavailable embedder:
        they stay queued)."""
        found = []
        for index in self._indexes(scope):
            with index.read() as conn:
                lost, waiting = vectors.missing(conn, self.model)
                state = VectorState(index.name, lost, vectors.orphans(conn), waiting)
            if state.missing or state.orphans or state.waiting:
                found.append(state)
                if repair:
                    with index.write() as conn:
                        vectors.create_schema(conn)
                        vectors.drop_orphans(conn)
                        vectors.queue_stale(conn, self.model)
        if repair and found:
            self.drain(scope)
        return found

    # -- the indexes of a project ------------------------------------------------------------
    def _indexes(self, scope: Scope) -> Iterator[_Index]:
        tasks = self.tasks
        layout = tasks.layout
        if layout.tree.lstat(layout.listing(scope)) is not None:
            listing = tasks.listing(scope)
            yield _Index(str(layout.listing(scope)), TURN_COLUMNS, listing.read, listing.maintain)
        stores_dir = self.stores.layout.stores_dir(scope)
        for entry in sorted(self.stores.tree.entries(stores_dir), key=lambda e: e.name):
            if not (entry.is_dir and STORE_ID_RE.fullmatch(entry.name)):
                continue
            store_dir = self.stores.files.store_dir(scope, entry.name)
            if self.stores.tree.lstat(self.stores.layout.store_index(store_dir)) is None:
                continue
            yield self._store_index(scope, entry.name, store_dir)

    def _store_index(self, scope: Scope, store_id: str, store_dir: Path) -> _Index:
        index = self.stores.index(store_dir)
        key = Key(scope, store_id)

        @contextmanager
        def read() -> Iterator[sqlite3.Connection]:
            with index.read() as reader:
                yield reader.conn

        @contextmanager
        def write() -> Iterator[sqlite3.Connection]:
            # Every write of a store index is its lock holder's (store_index.py).
            with self.stores.txns.locked(key), index.write(create=False) as writer:
                yield writer.conn

        return _Index(str(index.path), MEMORY_COLUMNS, read, write)
