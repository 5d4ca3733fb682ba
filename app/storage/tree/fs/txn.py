"""The one write protocol of both engines: a striped lock and a journal of writes in flight.

Every mutation of a task (task engine) or of a memory store (memory-store engine) runs as
a transaction on its key (tenant, project, id):

1. take the key's lock: one of ``LOCK_STRIPES`` lock files, chosen by a hash of the key;
2. if the stripe's journal slot names a key, the last holder died (or failed) between its
   first write and its last: repair that key from its records first;
3. on the first write, record the key in the slot (:meth:`Txn.begin`);
4. write the records (the commit point), then the derived files;
5. clear the slot and release the lock.

Readers take no lock: every file they read was published by an atomic rename.

A fixed set of lock files costs no inode per task or store, and the journal (one file,
one fixed-size slot per stripe) names exactly the writes a crash interrupted, so the
start-up recovery repairs those instead of walking the tree (:meth:`Transactions.recover`).
Two keys on one stripe only wait for each other. No code path holds two keys of one
engine at once; a thread that tries is stopped (it would wait for itself).

The slot is written without fsync: it is there for a killed process, whose writes the
page cache keeps; what a power loss may take back, the start-up check after a reboot
finds by checking the whole tree (tree/recovery.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.storage.core.errors import LockTimeout, StorageError, UnsafePath
from app.storage.core.files import DIR_MODE
from app.storage.core.names import LOCK_STRIPES, Scope, validate_id
from app.storage.core.quota import FloorReached
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.locks import locked
from app.storage.tree.fs.noatime import open_noatime
from app.storage.tree.fs.sync import await_flush, group_commit

log = logging.getLogger("app.storage")

SLOT_BYTES = 512  # three ids of at most 128 ASCII bytes, two tabs and a newline fit
_EMPTY = b"\0" * SLOT_BYTES


@dataclass(frozen=True, slots=True)
class Key:
    """What a transaction locks: a task or a memory store of one tenant/project."""

    scope: Scope
    id: str

    @property
    def stripe(self) -> int:
        text = f"{self.scope.tenant}/{self.scope.project}/{self.id}".encode()
        return zlib.crc32(text) % LOCK_STRIPES

    def encode(self) -> bytes:
        data = f"{self.scope.tenant}\t{self.scope.project}\t{self.id}\n".encode()
        return data + b"\0" * (SLOT_BYTES - len(data))

    @staticmethod
    def decode(slot: bytes) -> Key | None:
        """The key a slot names; None for a clear slot (or one no writer could have made)."""
        text = slot.split(b"\0", 1)[0]
        if not text.endswith(b"\n"):
            return None
        try:
            tenant, project, ident = text[:-1].decode("ascii").split("\t")
            return Key(Scope(tenant, project), validate_id("id", ident))
        except (UnicodeDecodeError, ValueError, StorageError):
            return None


class Journal:
    """``<root>/.locks/<kind>.inflight``: one slot per stripe, rewritten in place."""

    def __init__(self, path: Path, layout: Layout | None = None) -> None:
        self.path = path
        self.layout = layout
        self._fd = -1
        self._pid = -1
        self._mutex = threading.Lock()

    def _open(self) -> int:
        if self._pid != os.getpid():  # a descriptor must not cross a fork
            with self._mutex:
                if self._pid != os.getpid():
                    if self.layout is not None:
                        # A linked .locks would put the journal outside the root; a link
                        # at the journal itself is replaced by the journal.
                        self.layout.own_file(self.path)
                    self.path.parent.mkdir(DIR_MODE, parents=True, exist_ok=True)
                    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                    # Read on every write: an access-time update would be one more
                    # journaled inode write each time (noatime.py).
                    self._fd = open_noatime(self.path, flags, 0o600)
                    self._pid = os.getpid()
                    weakref.finalize(self, os.close, self._fd)
        return self._fd

    def set(self, stripe: int, key: Key) -> None:
        os.pwrite(self._open(), key.encode(), stripe * SLOT_BYTES)

    def clear(self, stripe: int) -> None:
        os.pwrite(self._open(), _EMPTY, stripe * SLOT_BYTES)

    def get(self, stripe: int) -> Key | None:
        return Key.decode(os.pread(self._open(), SLOT_BYTES, stripe * SLOT_BYTES))

    def pending(self) -> list[tuple[int, Key]]:
        """Every stripe whose slot names a key, in stripe order (one read of the file)."""
        if self.layout is not None:
            self.layout.check_inside(self.path)
        if not os.path.lexists(self.path):
            return []
        data = os.pread(self._open(), SLOT_BYTES * LOCK_STRIPES, 0)
        found = []
        for stripe in range(len(data) // SLOT_BYTES):
            slot = data[stripe * SLOT_BYTES : (stripe + 1) * SLOT_BYTES]
            if slot.strip(b"\0"):
                key = Key.decode(slot)
                if key is not None:
                    found.append((stripe, key))
        return found


@dataclass
class Txn:
    """One locked mutation; :meth:`begin` records it in the journal before the first write."""

    key: Key
    journal: Journal
    dirty: bool = False

    def begin(self) -> None:
        if not self.dirty:
            self.journal.set(self.key.stripe, self.key)
            self.dirty = True

    def abandon(self) -> None:
        """The caller failed and took back everything it wrote: nothing is left to repair
        (its slot is cleared, so no later reader takes the failed write for a dead one)."""
        if self.dirty:
            self.journal.clear(self.key.stripe)
            self.dirty = False


class NestedTransaction(RuntimeError):
    """A thread asked for a second key of an engine while holding one (it would deadlock)."""


class Transactions:
    """The transactions of one engine (``kind``: its lock stripes and journal)."""

    def __init__(
        self,
        layout: Layout,
        kind: str,
        *,
        timeout: float,
        repair: Callable[[Key], None],
        group_commit: bool = True,
    ) -> None:
        self.layout = layout
        self.kind = kind
        self.timeout = timeout
        self.repair = repair
        self.group_commit = group_commit
        self.journal = Journal(layout.inflight(kind), layout)
        self._held = threading.local()
        # Why no write may start now (a start-up recovery a full disk stopped), else "".
        self.refuse: Callable[[], str] = lambda: ""

    def lock_path(self, key: Key) -> Path:
        # locked() creates the lock's parents: refuse a linked .locks before it can.
        return self.layout.check_inside(self.layout.stripe_lock(self.kind, key.stripe))

    @contextlib.contextmanager
    def locked(
        self, key: Key, *, repair: bool = True, timeout: float | None = None
    ) -> Iterator[None]:
        """Hold ``key``'s stripe, with any write a dead holder left on it repaired first
        (``repair=False``: left as it is, for a check that only reports); LockTimeout after
        ``timeout`` seconds (the engine's lock timeout by default)."""
        if getattr(self._held, "key", None) is not None:
            raise NestedTransaction(f"{self.kind}: {key} requested while holding {self._held.key}")
        self.layout.own_file(self.journal.path)
        with locked(self.lock_path(key), self.timeout if timeout is None else timeout):
            self._held.key = key
            try:
                if repair:
                    self._repair_pending(key.stripe)
                yield
            finally:
                self._held.key = None

    @contextlib.contextmanager
    def __call__(self, key: Key) -> Iterator[Txn]:
        """A transaction on ``key``: a failure after :meth:`Txn.begin` repairs it at once.

        Under group commit (tree/fs/atomic.py) the lock is released before the flush
        that makes the transaction durable, and the caller answers only after it: the next
        holder may read this write before it is durable, and its own flush, which starts
        after its writes, covers this one too. Every transaction waits for such a flush, one
        that wrote nothing or failed included: its answer may rest on what it read.
        """
        why = self.refuse()
        if why:
            raise FloorReached(why)
        with group_commit(self.layout.root, enabled=self.group_commit), self.locked(key):
            await_flush()
            txn = Txn(key, self.journal)
            try:
                yield txn
            except BaseException:
                if txn.dirty:
                    # Bring the derived files back in line now; if that fails too, the slot
                    # stays set and the next holder of the stripe (or the recovery) repairs.
                    with contextlib.suppress(Exception):
                        self.repair(key)
                        self.journal.clear(key.stripe)
                raise
            if txn.dirty:
                self.journal.clear(key.stripe)

    def _repair_pending(self, stripe: int) -> Key | None:
        """Repair the write the stripe's slot names, if any (the caller holds the stripe);
        the key it named."""
        pending = self.journal.get(stripe)
        if pending is None:
            return None
        try:
            self.repair(pending)
        except UnsafePath as exc:
            # Something on the way to it was swapped for a link since: nothing behind a link
            # is ever repaired (fsck reports the link), and one planted link must not block
            # every key of its stripe.
            log.warning("write in flight on %s left unrepaired: %s", pending, exc)
        self.journal.clear(stripe)
        return pending

    def is_pending(self, key: Key) -> bool:
        """Whether ``key``'s stripe names it as a write a dead writer left unfinished."""
        return self.journal.get(key.stripe) == key

    def settle(self, key: Key) -> None:
        """Clear ``key``'s slot if it names ``key`` (after a repair made outside a transaction;
        the caller holds the stripe)."""
        if self.is_pending(key):
            self.journal.clear(key.stripe)

    def mark(self, key: Key) -> None:
        """Record ``key`` as in flight without writing (what a writer killed mid-write leaves)."""
        self.journal.set(key.stripe, key)

    def recover(self) -> list[Key]:
        """Repair every write the journal names as in flight; return the keys repaired."""
        repaired = []
        for stripe, key in self.journal.pending():
            with self.locked(key, repair=False):
                done = self._repair_pending(stripe)  # what its slot names by then
            if done is not None:
                repaired.append(done)
        return repaired

    def repair_dead(self) -> list[Key]:
        """Repair the writes in flight on every stripe no process holds now: a slot is set
        only while its writer holds the stripe, so such a slot is a dead writer's (a worker
        its master just reaped). A stripe that is held is left to its holder, which repaired
        the slot when it took the stripe; a repair that fails (a full disk) leaves its slot
        for the next holder. Never waits for a lock: the caller is a server's master."""
        repaired = []
        for stripe, key in self.journal.pending():
            try:
                with self.locked(key, repair=False, timeout=0):
                    done = self._repair_pending(stripe)
            except LockTimeout:
                continue
            except Exception as exc:  # noqa: BLE001 - one failed repair must not stop the rest
                log.warning("write in flight on %s left for the next writer: %s", key, exc)
                continue
            if done is not None:
                repaired.append(done)
        return repaired
