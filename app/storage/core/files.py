"""Crash-safe writes of one local file, for every backend: temp file in the same directory,
write, fsync, rename over the target, fsync the directory; on any failure the temp file is
removed and the target is as it was. The tree's writes (tree/fs/atomic.py) add
group commit to this; PostgreSQL's backup writes its archive with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from app.storage.core.errors import Corrupt, InsufficientStorage
from app.storage.core.names import TMP_PREFIX

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


# What the service creates is not for other local users: the owner reads and writes, its
# group reads (a team grants itself access through the group: docs/operations.md). The
# process umask can only narrow these further.
FILE_MODE = 0o640
DIR_MODE = 0o750


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk (or quota), translated or not."""
    if isinstance(exc, InsufficientStorage):
        return True
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def translate_os_error(exc: OSError) -> Exception:
    """Turn a full disk into InsufficientStorage, and a directory met where the service
    writes a file (a rename over it: EISDIR) into Corrupt; leave every other OSError as
    it is."""
    if exc.errno in _NO_SPACE:
        return InsufficientStorage(f"no space left on the storage device ({exc.strerror})")
    if exc.errno == errno.EISDIR:
        where = exc.filename2 or exc.filename
        return Corrupt(f"{where}: a directory where a file belongs")
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


def fsync_dir_now(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_temp(directory: Path) -> tuple[int, Path]:
    # O_EXCL on a random name: two writers never share a temp file.
    for _ in range(16):
        tmp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(f"could not create a temp file in {directory}")


_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)


def unnamed_temp(directory: Path) -> int | None:
    """A file with no name yet in ``directory`` (Linux's ``O_TMPFILE``), or None where the
    filesystem has none (FUSE, old kernels): see :func:`new_temp` then.

    Nothing can be left of it by a process that dies before :func:`link_unnamed` names it:
    the kernel frees it with its last descriptor. For the large files a kill would otherwise
    leave for the sweeper (an upload's staged bytes, a rewritten project.md)."""
    if not _O_TMPFILE:
        return None
    try:
        return os.open(directory, _O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOSYS):
            return None
        raise


def link_unnamed(fd: int, path: Path) -> None:
    """Give the unnamed file ``fd`` the name ``path`` (FileExistsError when it is taken).

    Through /proc/self/fd: ``linkat(AT_EMPTY_PATH)`` needs CAP_DAC_READ_SEARCH, which the
    service's user has not. A directory descriptor makes os.link call linkat (with
    AT_SYMLINK_FOLLOW) rather than link(2), which would link the magic link itself."""
    fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def replace_with_unnamed(fd: int, path: Path) -> None:
    """Put the unnamed file ``fd`` in place of ``path`` in one rename (readers see the old
    file or the new): named first in the same directory, for the moment of the rename."""
    for _ in range(16):
        tmp = path.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            link_unnamed(fd, tmp)
        except FileExistsError:
            continue
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return
    raise FileExistsError(f"could not name a temp file in {path.parent}")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FdWriter:
    """An unbuffered binary writer over ``fd``: every write is an os.write, so nothing sits in
    a user-space buffer when the fsync runs (and fault-injection tests see every write)."""

    mode = "wb"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        write_all(self._fd, data)
        return len(data)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd


@contextlib.contextmanager
def atomic_file(
    path: Path,
    *,
    durable: bool = True,
    sync_file: Callable[[int], None] = os.fsync,
    sync_dir: Callable[[Path], None] = fsync_dir_now,
    unnamed: bool = False,
) -> Iterator[IO[bytes]]:
    """Write ``path`` through a file object; publish it only if the block ends normally.

    Readers see the old file or the new one, never a mix: the bytes go to a temp file in the
    same directory, which is synced (``sync_file``), renamed over ``path``, and the directory
    synced (``sync_dir``). On any exception (a failed write or fsync included) the temp file
    is removed. ``durable=False`` skips both syncs. ``unnamed``: the temp file has no name
    until it is complete (:func:`unnamed_temp`), so that a kill leaves none of a large file.
    """
    fd = unnamed_temp(path.parent) if unnamed else None
    if fd is not None:
        with os_errors():
            try:
                yield FdWriter(fd)  # type: ignore[misc]
                if durable:
                    sync_file(fd)
                replace_with_unnamed(fd, path)
            finally:
                os.close(fd)
            if durable:
                sync_dir(path.parent)
        return
    with os_errors():
        fd, tmp = new_temp(path.parent)
        try:
            try:
                yield FdWriter(fd)  # type: ignore[misc]
                if durable:
                    sync_file(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if durable:
            sync_dir(path.parent)


def make_config_dirs(path: Path, *, sync_dir: Callable[[Path], None] = fsync_dir_now) -> None:
    """Create the configured directory ``path`` and its missing parents, syncing each new
    entry's parent (``sync_dir``). A configured path may pass through links (``/var/run``, a
    mount made a link by its admin): they are the admin's, and followed."""
    missing: list[Path] = []
    current = path
    while current != current.parent and not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with os_errors():
            try:
                os.mkdir(directory, DIR_MODE)
            except FileExistsError:
                continue
            sync_dir(directory.parent)
