"""When the tree's writes reach the disk: directory fsyncs, batched per write, and group commit.

**Group commit** (:func:`group_commit`). Inside a group-commit block, on a filesystem whose
``syncfs`` is a durability barrier (:data:`GROUP_COMMIT_FILESYSTEMS`), a thread's durable
writes are written and renamed without their fsyncs; when the block ends the thread waits
for one ``syncfs`` of the filesystem that *started after* its writes. ``syncfs`` makes
durable everything written to the filesystem before it began (file data, renames, links,
new directories), so one call, run by one thread for all the threads of the process waiting
at that moment, stands for every fsync they skipped. The rules:

* a write is acknowledged only after its flush returned without error;
* whatever must be durable before a later step (an artifact's bytes before the ``meta.json``
  that names them) takes a flush of its own in between (:func:`flush_now`);
* the flush covers every earlier write to the filesystem, by any thread or process: a writer
  may let go of its lock before it waits, and a writer that read its predecessor's write
  (and built on it) is acknowledged only after a flush that covers both;
* a flush that reports an error fails every writer of this process whose block began before
  the error was seen (:class:`_Flusher`): each ``syncfs`` reports the writeback errors since
  the previous one on the same descriptor, which may have been anyone's.

Elsewhere (no block, another filesystem, FUSE, NFS, no ``syncfs``) every durable write fsyncs
its file and directory itself, as it always did.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from app.storage.core.files import fsync_dir_now, os_errors

if TYPE_CHECKING:
    from app.storage.tree.fs.walk import Tree

_batch = threading.local()


def fsync_dir(path: Path) -> None:
    if _deferred(path):
        return
    dirs = getattr(_batch, "dirs", None)
    if dirs is not None:
        dirs[path] = None  # inside batched_dir_syncs(): synced once, when the block ends
        return
    fsync_dir_now(path)


def fsync_dir_fd(fd: int) -> None:
    """fsync the directory open as ``fd``, or leave it to this thread's group flush."""
    if not deferred_fd(fd):
        with os_errors():
            os.fsync(fd)


@contextlib.contextmanager
def batched_dir_syncs() -> Iterator[None]:
    """Defer this thread's directory fsyncs to the end of the block, once per directory.

    A turn renames and creates several entries in the same two directories; one fsync of
    each at the end (before the caller answers) makes all of them durable, where an fsync
    after every rename was a third of a turn's fsyncs. File contents are still fsynced
    before their rename. If the block fails, the fsyncs are attempted and the block's own
    error is raised. Nested blocks join the outer one.
    """
    if getattr(_batch, "dirs", None) is not None:
        yield
        return
    dirs: dict[Path, None] = {}
    _batch.dirs = dirs
    try:
        yield
    except BaseException:
        _batch.dirs = None
        for path in dirs:
            with contextlib.suppress(OSError):
                fsync_dir_now(path)
        raise
    _batch.dirs = None
    with os_errors():
        for path in dirs:
            fsync_dir_now(path)


def sync_pending_dirs() -> None:
    """Make this thread's batched directory changes durable now; batching goes on after.

    Called at the commit point: the record (and the bytes it names) must be durable before
    any derived file can be, or a power loss could keep an index.json or listing row that
    points at a record which never reached the disk.
    """
    dirs = getattr(_batch, "dirs", None)
    if not dirs:
        return
    with os_errors():
        for path in list(dirs):
            fsync_dir_now(path)
            del dirs[path]


def sync_filesystem(path: Path) -> None:
    """Make everything written to the filesystem holding ``path`` durable: one ``syncfs``
    for many files (an import's staged tree) instead of one fsync per file and directory."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        error = _syncfs_error(fd)
    finally:
        os.close(fd)
    if error is not None:
        raise error


def sync_is_barrier(path: Path) -> bool:
    """Whether ``syncfs`` (and so ``sync``) makes everything written to the filesystem holding
    ``path`` durable: the filesystems group commit trusts (:data:`GROUP_COMMIT_FILESYSTEMS`).
    FUSE passes neither on to its server (virtiofs aside); NFS and the rest are not known to."""
    return _flusher_for(path) is not None


def sync_tree(path: Path, tree: Tree) -> None:
    """Make the directory ``path``, and every file and directory below it, durable: one
    ``syncfs`` where that is a barrier (:func:`sync_is_barrier`), else an fsync of each, walked
    by ``tree`` (:meth:`Tree.fsync_all`: never through a link)."""
    if sync_is_barrier(path):
        sync_filesystem(path)
    else:
        tree.fsync_all(path)


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        func: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return func


_syncfs = _load_syncfs()


def _syncfs_error(fd: int) -> OSError | None:
    """``syncfs`` the filesystem of ``fd``; the error it reports, if any.

    Without ``syncfs`` (ENOSYS, or no such libc call) every filesystem is synced instead:
    sync(2) reports nothing, so that is the fallback for a missing call only, never for a
    failed one.
    """
    if _syncfs is not None:
        if _syncfs(fd) == 0:
            return None
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            return OSError(err, f"syncfs: {os.strerror(err)}")
    os.sync()
    return None


# -- group commit ---------------------------------------------------------------------------

# Filesystems where skipping a record's own fsync is safe until the shared flush. syncfs(2)
# must make every earlier write durable (a journal commit and a cache flush), and a power
# loss *before* that flush must never leave a replaced record's name pointing at data that
# did not reach the disk, which would lose the previous, acknowledged version. ext4 (and
# ext3 on its driver) promise both in their default data=ordered mode: a rename over an
# existing file commits only with the new file's data (auto_da_alloc), and the journal
# commits operations in order, so an artifact's kept copy is never gone before the
# meta.json that replaced it. data=writeback and noauto_da_alloc drop that promise; xfs and
# btrfs do not make it (a rename may reach the disk before the data it names). FUSE passes
# syncfs on to its server only for virtiofs, so on LazyFS or any FUSE filesystem it would
# not reach the server's cache; NFS and the rest are not known to flush. All of them keep
# per-file fsync. tmpfs keeps nothing across a power loss anyway.
GROUP_COMMIT_FILESYSTEMS = frozenset({"ext4", "ext3", "tmpfs"})
# Mount options under which ext4 no longer orders a replacement's data before its rename.
UNORDERED_OPTIONS = frozenset({"data=writeback", "noauto_da_alloc"})


class _Flusher:
    """Group commit on one filesystem: one ``syncfs`` for every thread of this process waiting.

    A writer needs a flush that *started* after its writes: the one running when it arrives
    may have begun before them. So it waits for the next round to start and finish; the first
    waiter that finds no round running runs it for all, and whoever arrives meanwhile waits
    for the round after. ``fd`` stays open for the process's lifetime: ``syncfs`` reports the
    writeback errors of the whole filesystem since the previous call on the same descriptor,
    so none raised after it was opened (before any deferred write) goes unseen.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._cond = threading.Condition(threading.Lock())
        self._started = 0
        self._finished = 0
        self._running = False
        self._failures = 0
        self._error: OSError | None = None

    def ticket(self) -> int:
        """Taken before a writer's first deferred write: the failures seen so far."""
        with self._cond:
            return self._failures

    def wait(self, ticket: int) -> None:
        """Return once a flush that started after this call has finished; raise OSError if
        any flush finished since ``ticket`` was taken reported an error (it may have been
        the writeback of this writer's pages, whoever's flush saw it)."""
        with self._cond:
            target = self._started + 1
            while self._finished < target:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                number = self._started
                error: OSError | None = OSError(errno.EIO, "flush interrupted")
                self._cond.release()
                try:
                    error = _syncfs_error(self.fd)
                except OSError as exc:
                    error = exc
                finally:
                    # Whatever ended the round (an error, even an interrupt) without a clean
                    # flush fails everyone who was waiting for it.
                    self._cond.acquire()
                    self._running = False
                    self._finished = number
                    if error is not None:
                        self._failures += 1
                        self._error = error
                    self._cond.notify_all()
            if self._failures != ticket:
                failed = self._error or OSError(errno.EIO, "flush failed")
                raise OSError(failed.errno, f"flushing the filesystem failed: {failed.strerror}")


_flushers: dict[int, _Flusher | None] = {}  # st_dev -> its flusher, None: per-file fsync
_flushers_mutex = threading.Lock()


def _forget_flushers() -> None:
    global _flushers_mutex
    for flusher in _flushers.values():
        if flusher is not None:
            with contextlib.suppress(OSError):
                os.close(flusher.fd)
    _flushers.clear()
    _flushers_mutex = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_flushers)


def _filesystem_type(dev: int) -> str | None:
    """The type of the mounted filesystem whose device number is ``dev``, as group commit
    sees it: ``"ext4"`` mounted with an option in :data:`UNORDERED_OPTIONS` is reported as
    ``"ext4 (data=writeback)"`` (say), which is not in :data:`GROUP_COMMIT_FILESYSTEMS`."""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        return _mount_type(fh, f"{os.major(dev)}:{os.minor(dev)}")
    return None


def _mount_type(mountinfo: Iterable[str], wanted: str) -> str | None:
    """:func:`_filesystem_type` of the device ``wanted`` (``major:minor``) in ``mountinfo``."""
    with contextlib.suppress(ValueError, IndexError):
        for line in mountinfo:
            fields = line.split()
            if fields[2] == wanted:
                dash = fields.index("-", 6)
                fstype = fields[dash + 1]
                options = set(fields[5].split(","))  # the mount's
                if len(fields) > dash + 3:
                    options |= set(fields[dash + 3].split(","))  # the superblock's
                unordered = sorted(options & UNORDERED_OPTIONS)
                return f"{fstype} ({', '.join(unordered)})" if unordered else fstype
    return None


def _flusher_for(root: Path) -> tuple[_Flusher, int] | None:
    """The flusher of ``root``'s filesystem and its device number; None where group commit
    does not apply (no ``syncfs``, a filesystem not known to honour it)."""
    if _syncfs is None:
        return None
    dev = os.stat(root).st_dev
    if dev not in _flushers:
        with _flushers_mutex:
            if dev not in _flushers:
                flusher = None
                if _filesystem_type(dev) in GROUP_COMMIT_FILESYSTEMS:
                    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    if os.fstat(fd).st_dev != dev:
                        os.close(fd)  # replaced since the stat: decide on the next call
                        return None
                    flusher = _Flusher(fd)
                _flushers[dev] = flusher
    found = _flushers[dev]
    return None if found is None else (found, dev)


@dataclasses.dataclass
class _Group:
    """This thread's open group-commit block."""

    flusher: _Flusher
    dev: int
    ticket: int
    pending: bool = False  # a deferred write not yet covered by a finished flush


_group = threading.local()


def _deferred_dev(dev: int) -> bool:
    """Whether a durable write on ``dev`` is left to this thread's group flush (noted)."""
    group: _Group | None = getattr(_group, "block", None)
    if group is None or group.dev != dev:
        return False
    group.pending = True
    return True


def deferred_fd(fd: int) -> bool:
    """Whether a durable write to the open file ``fd`` is left to this thread's group flush."""
    if getattr(_group, "block", None) is None:
        return False
    return _deferred_dev(os.fstat(fd).st_dev)


def _deferred(path: Path) -> bool:
    if getattr(_group, "block", None) is None:
        return False
    return _deferred_dev(os.stat(path).st_dev)


def grouped() -> bool:
    """Whether this thread's durable writes are being left to a group flush."""
    return getattr(_group, "block", None) is not None


@contextlib.contextmanager
def group_commit(root: Path, *, enabled: bool = True) -> Iterator[None]:
    """Leave this thread's fsyncs on ``root``'s filesystem to one shared flush at the end.

    When the block ends normally, wait for a flush that started after the block's last write
    (none if it wrote nothing durable); its failure is the block's (OSError, or
    InsufficientStorage). A block that raises still waits for its flush, so whatever its
    failure path repaired is durable, and raises its own error. Nested blocks join the
    outer one. Where group commit does not apply (or ``enabled`` is false), the block
    changes nothing: every durable write inside fsyncs for itself.
    """
    if getattr(_group, "block", None) is not None or not enabled:
        yield
        return
    found = _flusher_for(root)
    if found is None:
        yield
        return
    flusher, dev = found
    group = _Group(flusher, dev, flusher.ticket())
    _group.block = group
    try:
        yield
    except BaseException:
        _group.block = None
        if group.pending:
            with contextlib.suppress(OSError):
                flusher.wait(group.ticket)
        raise
    _group.block = None
    if group.pending:
        with os_errors():
            flusher.wait(group.ticket)


def await_flush() -> None:
    """End this thread's group-commit block with a flush even if it writes nothing durable.

    A transaction calls it once it holds its lock: what it read there may be a predecessor's
    write that is not flushed yet (the lock is released before the flush), and whatever it
    answers, a 2xx that wrote nothing or a 404 or 412 decided by that write, must not rest on
    state a power loss can still take back. Outside a block (per-file fsync) the predecessor
    was durable before it let go of the lock.
    """
    group: _Group | None = getattr(_group, "block", None)
    if group is not None:
        group.pending = True


def flush_now() -> None:
    """Make every durable write this thread made so far durable before going on: a group
    flush inside a group-commit block, the batched directory fsyncs otherwise."""
    group: _Group | None = getattr(_group, "block", None)
    if group is None:
        sync_pending_dirs()
        return
    if group.pending:
        with os_errors():
            group.flusher.wait(group.ticket)
        group.pending = False


def commit_point() -> None:
    """The record is written: make it durable before any derived file, where that matters.

    Without group commit the batched directory fsyncs run here, so a power loss never keeps
    a derived file (an index.json entry, a listing row) of a record that did not reach the
    disk. Inside a group-commit block nothing is flushed: the block's flush covers the record
    and its derived files together before the answer, and after a power loss the start-up
    recovery rebuilds every derived file from the records whatever reached the disk first
    (tree/recovery.py), as it does for derived files that were never flushed.
    """
    if not grouped():
        sync_pending_dirs()


def flush_derived() -> None:
    """Make every earlier ``durable=False`` write durable (a whole-filesystem sync).

    For whoever wrote derived files outside a running server, whose startup recovery would
    rebuild them after a power loss: a clean server shutdown, and the CLI's repairs.
    """
    os.sync()
