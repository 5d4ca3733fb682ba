"""Open a file to read it without writing to the disk: ask for ``O_NOATIME``.

With ``relatime``, the Linux default, the first read of a file after each change updates its
access time, and an access-time update is an inode write through the filesystem journal.
The write path reads files that every write changes (the dirty flag, ``meta.json``,
``index.json``), so each of those reads cost one more journaled inode write, and on ext4 it
waits for a running commit. Nothing here uses access times.

The kernel allows ``O_NOATIME`` only to the file's owner (or CAP_FOWNER): for a file another
user owns (a root restored by someone else) the open is retried without it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from app.storage.core.errors import Corrupt, Unreadable

O_NOATIME: int = getattr(os, "O_NOATIME", 0)
# O_NONBLOCK: opening a FIFO a person put where a file was expected must not wait for a
# writer (it has no effect on a regular file). What was opened is then checked to be one.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_noatime(path: str | os.PathLike[str], flags: int = READ_FLAGS, mode: int = 0o777) -> int:
    """A descriptor for ``path`` (read-only and never following a final symlink, unless
    ``flags`` say otherwise), opened without the access-time update where the kernel
    permits it. Opened to read (``READ_FLAGS``), it is a regular file, else Corrupt."""
    fd = -1
    if O_NOATIME:
        try:
            fd = os.open(path, flags | O_NOATIME, mode)
        except PermissionError as exc:
            if exc.errno != errno.EPERM:  # EACCES: not allowed at all, retrying won't help
                raise
    if fd < 0:
        fd = os.open(path, flags, mode)
    return regular_file(fd, path) if flags == READ_FLAGS else fd


def regular_file(fd: int, path: str | os.PathLike[str]) -> int:
    """``fd`` when it is open on a regular file; otherwise it is closed and the thing is
    Corrupt: a directory, FIFO, socket or device where the service keeps a file is what a
    person (or a damaged filesystem) put there, and reading it could block or never end."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    raise Corrupt(f"{os.fspath(path)}: {kind} where a file belongs")


def read_all(fd: int, *, limit: int | None = None, path: object = None) -> bytes:
    """The rest of the open file ``fd`` (closed here), read without a buffered file object,
    which costs an ioctl and two lseeks more per file on the hot path. The first read asks
    for the file's size (plus one byte, to see the end): a fixed large request would have
    the allocator map and unmap that much memory on every call. A file of more than
    ``limit`` bytes is Corrupt, and never read (``path`` names it)."""
    try:
        chunks = []
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise Corrupt(f"{path}: {size} bytes, more than such a file ever holds ({limit})")
        want = size + 1
        got = 0
        while chunk := os.read(fd, want):
            chunks.append(chunk)
            got += len(chunk)
            if limit is not None and got > limit:  # grown since the fstat
                raise Corrupt(f"{path}: more than such a file ever holds ({limit} bytes)")
            want = 1 << 16
        return b"".join(chunks)
    except OSError as exc:
        raise Unreadable.of(exc, path) from None
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Size and SHA-256 (hex) of the file at ``path``, read 1 MiB at a time."""
    digest = hashlib.sha256()
    size = 0
    try:
        fd = open_noatime(path)
        try:
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                digest.update(chunk)
        finally:
            os.close(fd)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise
        raise Unreadable.of(exc, path) from None
    return size, digest.hexdigest()
