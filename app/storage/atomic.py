"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A failed write or fsync is a failed operation: the temp file is removed and the previous
version of the target stays in place. We never retry an fsync and then report success,
because Linux may drop dirty pages after a failed writeback ("fsyncgate").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from .errors import InsufficientStorage, PayloadTooLarge
from .layout import TMP_PREFIX

CHUNK = 1 << 20
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


# What the service creates is not for other local users: the owner reads and writes, its
# group reads (a team grants itself access through the group: docs/operations.md). The
# process umask can only narrow these further.
FILE_MODE = 0o640
DIR_MODE = 0o750


def translate_os_error(exc: OSError) -> Exception:
    """Turn a full disk into InsufficientStorage; leave every other OSError as it is."""
    if exc.errno in _NO_SPACE:
        return InsufficientStorage(f"no space left on the storage device ({exc.strerror})")
    return exc


@contextlib.contextmanager
def os_errors() -> Iterator[None]:
    """Re-raise ENOSPC/EDQUOT as InsufficientStorage."""
    try:
        yield
    except OSError as exc:
        translated = translate_os_error(exc)
        if translated is exc:
            raise
        raise translated from exc


_batch = threading.local()


def fsync_dir(path: Path) -> None:
    dirs = getattr(_batch, "dirs", None)
    if dirs is not None:
        dirs[path] = None  # inside batched_dir_syncs(): synced once, when the block ends
        return
    _fsync_dir_now(path)


def _fsync_dir_now(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
                _fsync_dir_now(path)
        raise
    _batch.dirs = None
    with os_errors():
        for path in dirs:
            _fsync_dir_now(path)


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
            _fsync_dir_now(path)
            del dirs[path]


def make_dirs(path: Path, stop: Path) -> None:
    """Create ``path`` and missing parents below ``stop``, fsyncing each new entry's parent."""
    missing: list[Path] = []
    current = path
    while current != stop and not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with os_errors():
            try:
                os.mkdir(directory, DIR_MODE)
            except FileExistsError:
                continue
            fsync_dir(directory.parent)


def _new_temp(directory: Path) -> tuple[int, Path]:
    # O_EXCL on a random name: two writers never share a temp file.
    for _ in range(16):
        tmp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(f"could not create a temp file in {directory}")


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _FdWriter:
    """An unbuffered binary writer over ``fd``: every write is an os.write, so nothing sits in
    a user-space buffer when the fsync runs (and fault-injection tests see every write)."""

    mode = "wb"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        _write_all(self._fd, data)
        return len(data)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd


@contextlib.contextmanager
def atomic_file(path: Path, *, durable: bool = True) -> Iterator[IO[bytes]]:
    """Write ``path`` through a file object; publish it only if the block ends normally.

    Readers see the old file or the new one, never a mix: the bytes go to a temp file in the
    same directory, which is fsynced, renamed over ``path``, and the directory fsynced. On
    any exception (a failed write or fsync included) the temp file is removed.

    ``durable=False`` skips both fsyncs. Only for derived files (summary.md, index.json,
    project.md), which are rebuilt from the records: readers still see the old or the new
    file (the rename is atomic, and a killed process leaves its writes in the page cache),
    and what a power loss could leave stale, the startup recovery rebuilds (fsck --repair
    after an unclean shutdown; a clean shutdown syncs the filesystem first, see
    :func:`flush_derived`).
    """
    with os_errors():
        fd, tmp = _new_temp(path.parent)
        try:
            try:
                yield _FdWriter(fd)  # type: ignore[misc]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if durable:
            fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | Iterable[bytes], *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    with atomic_file(path, durable=durable) as fh:
        if isinstance(data, bytes | bytearray | memoryview):
            fh.write(data)
        else:
            for chunk in data:
                fh.write(chunk)


def sync_filesystem(path: Path) -> None:
    """Make everything written to the filesystem holding ``path`` durable: one ``syncfs``
    for many files (an import's staged tree) instead of one fsync per file and directory."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs is None or _syncfs(fd) != 0:
            os.sync()  # no syncfs here: sync every filesystem instead
    finally:
        os.close(fd)


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        func: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return func


_syncfs = _load_syncfs()


def flush_derived() -> None:
    """Make every earlier ``durable=False`` write durable (a whole-filesystem sync).

    For whoever wrote derived files outside a running server, whose startup recovery would
    rebuild them after a power loss: a clean server shutdown, and the CLI's repairs.
    """
    os.sync()


def write_new(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` durably, never replacing a file already there.

    The bytes are written and synced under a temp name, then hard-linked into place:
    link() fails with FileExistsError when ``path`` exists, so of two racing creators
    exactly one wins and nobody ever sees a partial file.
    """
    tmp = path.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}"
    try:
        # Inside the try: write_atomic may fail after it renamed into ``tmp`` (the directory
        # fsync), which would otherwise leave ``tmp`` behind.
        write_atomic(tmp, data)
        with os_errors():
            os.link(tmp, path)
    finally:
        remove_quietly(tmp)
    fsync_dir(path.parent)


class StagedFile:
    """A fully written, fsynced temp file waiting to be published by :meth:`publish`.

    Used for uploads: the bytes are streamed and synced before any lock is taken, and the
    lock is held only for the rename. Unpublished staged files are removed on close.
    """

    def __init__(self, tmp: Path, size: int, sha256: str) -> None:
        self.tmp = tmp
        self.size = size
        self.sha256 = sha256
        self._published = False

    def publish(self, path: Path) -> None:
        with os_errors():
            os.replace(self.tmp, path)
            self._published = True
            fsync_dir(path.parent)

    def discard(self) -> None:
        if not self._published:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            self._published = True

    def __enter__(self) -> StagedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def stage_stream(directory: Path, stream: IO[bytes], *, limit: int) -> StagedFile:
    """Copy ``stream`` into a synced temp file in ``directory``, refusing more than ``limit`` bytes.

    Reads 1 MiB at a time, so memory stays flat whatever the body size; the size is counted
    here rather than trusted from Content-Length.
    """
    digest = hashlib.sha256()
    size = 0
    with os_errors():
        fd, tmp = _new_temp(directory)
        try:
            try:
                while True:
                    chunk = stream.read(CHUNK)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(
                            f"artifact exceeds the limit of {limit} bytes", limit=limit
                        )
                    digest.update(chunk)
                    _write_all(fd, chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    return StagedFile(tmp, size, digest.hexdigest())


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
