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

O_NOATIME: int = getattr(os, "O_NOATIME", 0)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_noatime(path: str | os.PathLike[str], flags: int = READ_FLAGS, mode: int = 0o777) -> int:
    """A descriptor for ``path`` (read-only and never following a final symlink, unless
    ``flags`` say otherwise), opened without the access-time update where the kernel
    permits it."""
    if O_NOATIME:
        try:
            return os.open(path, flags | O_NOATIME, mode)
        except PermissionError as exc:
            if exc.errno != errno.EPERM:  # EACCES: not allowed at all, retrying won't help
                raise
    return os.open(path, flags, mode)


def read_all(fd: int) -> bytes:
    """The rest of the open file ``fd`` (closed here), read without a buffered file object,
    which costs an ioctl and two lseeks more per file on the hot path. The first read asks
    for the file's size (plus one byte, to see the end): a fixed large request would have
    the allocator map and unmap that much memory on every call."""
    try:
        chunks = []
        want = os.fstat(fd).st_size + 1
        while chunk := os.read(fd, want):
            chunks.append(chunk)
            want = 1 << 16
        return b"".join(chunks)
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Size and SHA-256 (hex) of the file at ``path``, read 1 MiB at a time."""
    digest = hashlib.sha256()
    size = 0
    fd = open_noatime(path)
    try:
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            digest.update(chunk)
    finally:
        os.close(fd)
    return size, digest.hexdigest()
