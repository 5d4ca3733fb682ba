"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A failed write or fsync is a failed operation: the temp file is removed and the previous
version of the target stays in place. We never retry an fsync and then report success,
because Linux may drop dirty pages after a failed writeback ("fsyncgate"). Whether a write's
fsyncs run at once or in a later group flush is sync.py's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO

from app.storage.core import files
from app.storage.core.errors import PayloadTooLarge, UnsafePath
from app.storage.core.files import DIR_MODE, new_temp, os_errors, write_all
from app.storage.core.names import TMP_PREFIX
from app.storage.tree.fs.sync import deferred_fd, fsync_dir

CHUNK = 1 << 20


def make_config_dirs(path: Path) -> None:
    """core/files.py's :func:`~app.storage.core.files.make_config_dirs`, its directory fsyncs
    left to this thread's batch or group flush where one is open."""
    files.make_config_dirs(path, sync_dir=fsync_dir)


def make_dirs(path: Path, stop: Path) -> None:
    """Create ``path`` and its missing parents below ``stop``, fsyncing each new entry's
    parent; ``stop`` (the root, or a directory the caller has checked) is made as a
    configured path when it is missing.

    Below ``stop`` nothing is followed: each component is made and opened relative to its
    parent's descriptor, and one that is a link or not a directory is UnsafePath, so a link
    a person planted can never make the service create directories outside the root.
    """
    parts = path.relative_to(stop).parts
    if not stop.is_dir():
        make_config_dirs(stop)
    with os_errors():
        fd = os.open(stop, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            current = stop
            for name in parts:
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                    fsync_dir(current)
                except FileExistsError:
                    pass
                try:
                    child = os.open(name, _BELOW_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePath(
                            f"{current / name} is a link or not a directory; the service never"
                            " follows one"
                        ) from None
                    raise
                os.close(fd)
                fd, current = child, current / name
        finally:
            os.close(fd)


_BELOW_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_file(
    path: Path, *, durable: bool = True, unnamed: bool = False
) -> AbstractContextManager[IO[bytes]]:
    """Write ``path`` through a file object; publish it only if the block ends normally
    (core/files.py), its fsyncs left to this thread's group flush where one is open (sync.py).

    ``durable=False`` skips both fsyncs. Only for derived files (summary.md, index.json,
    project.md), which are rebuilt from the records: readers still see the old or the new
    file (the rename is atomic, and a killed process leaves its writes in the page cache),
    and what a power loss could leave stale, the startup recovery rebuilds (fsck --repair
    after an unclean shutdown; a clean shutdown syncs the filesystem first, see
    :func:`~app.storage.tree.fs.sync.flush_derived`).
    """
    return files.atomic_file(
        path, durable=durable, sync_file=_sync_file, sync_dir=fsync_dir, unnamed=unnamed
    )


def _sync_file(fd: int) -> None:
    if not deferred_fd(fd):
        os.fsync(fd)


def write_atomic(path: Path, data: bytes | Iterable[bytes], *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    with atomic_file(path, durable=durable) as fh:
        if isinstance(data, bytes | bytearray | memoryview):
            fh.write(data)
        else:
            for chunk in data:
                fh.write(chunk)


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
    """A fully written, fsynced file waiting to be published by :meth:`publish`.

    Used for uploads: the bytes are streamed and synced before any lock is taken, and the
    lock is held only for the rename. The file has no name until then where the filesystem
    allows (``unnamed_temp``): a killed upload then leaves nothing, its bytes freed with the
    process; elsewhere it is a temp file, removed on close if never published (and by the
    sweeper after a kill).
    """

    def __init__(
        self,
        directory: Path,
        directory_id: tuple[int, int],
        fd: int | None,
        tmp: Path | None,
        size: int,
        sha256: str,
    ) -> None:
        self.directory = directory
        self._directory_id = directory_id  # as it was when the staging began
        self.fd = fd
        self.tmp = tmp
        self.size = size
        self.sha256 = sha256
        self._published = False

    def still_staged(self) -> bool:
        """Whether the staged bytes are still in the directory they were staged in (the turn
        may have been replaced meanwhile, its directory moved to the trash)."""
        if self.tmp is not None:
            return self.tmp.exists()
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._directory_id

    def publish(self, path: Path) -> None:
        with os_errors():
            if self.fd is not None:
                files.replace_with_unnamed(self.fd, path)
            else:
                assert self.tmp is not None
                os.replace(self.tmp, path)
            self._published = True
            fsync_dir(path.parent)

    def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if not self._published and self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
        self._published = True

    def __enter__(self) -> StagedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def stage_stream(directory: Path, stream: IO[bytes], *, limit: int) -> StagedFile:
    """Copy ``stream`` into a synced file in ``directory``, refusing more than ``limit`` bytes.

    Reads 1 MiB at a time, so memory stays flat whatever the body size; the size is counted
    here rather than trusted from Content-Length.
    """
    digest = hashlib.sha256()
    size = 0
    with os_errors():
        fd = files.unnamed_temp(directory)
        tmp = None
        if fd is None:
            fd, tmp = new_temp(directory)
        st = os.stat(directory)
        directory_id = (st.st_dev, st.st_ino)
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
                write_all(fd, chunk)
            if not deferred_fd(fd):
                os.fsync(fd)
            staged = StagedFile(
                directory, directory_id, fd if tmp is None else None, tmp, size, digest.hexdigest()
            )
        except BaseException:
            os.close(fd)
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        if tmp is not None:
            os.close(fd)
    return staged


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
