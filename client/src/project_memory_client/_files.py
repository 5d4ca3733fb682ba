"""Atomic local writes: a temp file in the same directory, fsync, rename, fsync the directory.

A reader of the target (an agent reading a mounted store, a script reading a downloaded
artifact) sees the old file or the new one, never a mix; a failed or interrupted write
leaves no temp file behind and the old file untouched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from .rules import TMP_PREFIX

FILE_MODE = 0o640


def _new_temp(directory: Path) -> tuple[int, Path]:
    # O_EXCL on a random name: two writers never share a temp file; O_NOFOLLOW: a link
    # planted at the name is never written through.
    for _ in range(16):
        tmp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(f"could not create a temp file in {directory}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through a file object; publish it only if the block ends normally."""
    fd, tmp = _new_temp(path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    with atomic_file(path) as fh:
        if isinstance(data, (bytes, bytearray, memoryview)):
            fh.write(data)
        else:
            for chunk in data:
                fh.write(chunk)
