"""Write a store back as files: each memory at its path under DIR, a graph folder as its file.

The paths come from the server, so they are not trusted: one that is not absolute, holds a
NUL, an empty, ``.`` or ``..`` segment (or a name the writes here use for temp files) is
refused, and so is one that meets a link or a file on its way. Each file is written from a
folder opened one level at a time with ``O_NOFOLLOW``, to a temp file beside it, then renamed
over the name (a rename replaces a link planted there, it never writes through it). An
existing file with other bytes is left alone unless ``force``; one with the same bytes is
``unchanged``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..mount.sync import unholdable
from ..rules import TMP_PREFIX
from .graph import GraphError, kind_of, rebuild


@dataclass
class OutFile:
    """One file to write: its path under DIR (``a/b.md``), the memories it comes from."""

    file: str
    paths: list[str]
    data: bytes | None
    action: str = "write"
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "paths": self.paths,
            "action": self.action,
            "bytes": None if self.data is None else len(self.data),
            "message": self.message,
        }


@dataclass
class _Graph:
    paths: list[str] = field(default_factory=list)
    contents: list[str] = field(default_factory=list)


def plan_files(memories: Iterable[dict[str, Any]]) -> list[OutFile]:
    """The files a store's memories (with their content) make, sorted by file."""
    out: list[OutFile] = []
    graphs: dict[str, _Graph] = {}
    for memory in sorted(memories, key=lambda m: str(m.get("path"))):
        path, content = memory.get("path"), memory.get("content")
        fault = unholdable(path)
        if fault is None and "\\" in str(path):
            fault = "its path holds a backslash"
        if fault is not None:
            out.append(OutFile(repr(path), [str(path)], None, "refused", fault))
            continue
        assert isinstance(path, str)
        if not isinstance(content, str):
            out.append(OutFile(path[1:], [path], None, "refused", "the server sent no content"))
            continue
        if kind_of(content) is not None:
            folder = path.rsplit("/", 1)[0]
            graph = graphs.setdefault(folder, _Graph())
            graph.paths.append(path)
            graph.contents.append(content)
            continue
        out.append(OutFile(path[1:], [path], content.encode("utf-8")))
    for folder, graph in graphs.items():
        if not folder:
            out.append(
                OutFile("/", graph.paths, None, "refused", "graph memories must be in a folder")
            )
            continue
        try:
            data = rebuild(graph.contents).encode("utf-8")
        except GraphError as exc:
            out.append(OutFile(folder[1:], graph.paths, None, "refused", f"not a graph: {exc}"))
            continue
        out.append(OutFile(folder[1:], graph.paths, data))
    taken = {f.file for f in out if f.data is not None}
    for f in out:
        # A file and a folder of the same name (a graph folder beside other memories).
        if f.data is not None and any(t.startswith(f.file + "/") for t in taken):
            f.data, f.action = None, "refused"
            f.message = "other memories are in a folder of this name"
    return sorted(out, key=lambda f: f.file)


class _Refused(Exception):
    pass


def _open_dir(fd: int, name: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused(f"{name} is a link or a file, not a folder") from None
        raise


def _folder(top: int, parts: list[str], *, create: bool) -> int | None:
    """A descriptor of the folder ``parts`` below ``top``; None when one is missing and not
    ``create``."""
    fd = os.dup(top)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                child = _open_dir(fd, part)
            except FileNotFoundError:
                os.close(fd)
                return None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _existing(fd: int, name: str) -> tuple[bytes | None, int | None]:
    """The bytes and mode of the file ``name`` in ``fd``, or (None, None) when there is none."""
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    if stat.S_ISLNK(info.st_mode):
        raise _Refused("a symbolic link is there: not written through")
    if not stat.S_ISREG(info.st_mode):
        raise _Refused("something other than a file is there")
    ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    with os.fdopen(ffd, "rb") as fh:
        return fh.read(), stat.S_IMODE(info.st_mode)


def _write(fd: int, name: str, data: bytes, mode: int | None) -> None:
    """Replace ``name`` in ``fd`` with ``data``: temp file, fsync, rename, fsync the folder."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    tmp = f"{TMP_PREFIX}{secrets.token_hex(8)}"
    tfd = os.open(tmp, flags, 0o666, dir_fd=fd)
    try:
        with os.fdopen(tfd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        raise
    os.fsync(fd)


def _write_one(top: int, f: OutFile, *, force: bool) -> None:
    assert f.data is not None
    *folders, name = f.file.split("/")
    fd = _folder(top, folders, create=False)
    try:
        old, mode = (None, None) if fd is None else _existing(fd, name)
        if old == f.data:
            f.action = "unchanged"
            return
        if old is not None and not force:
            f.action = "differs"
            f.message = "a file with other bytes is there (--force overwrites it)"
            return
        if fd is None:
            fd = _folder(top, folders, create=True)
            assert fd is not None
        _write(fd, name, f.data, mode)
        f.action = "write" if old is None else "overwrite"
    finally:
        if fd is not None:
            os.close(fd)


def write_files(dest: str, files: list[OutFile], *, force: bool) -> None:
    """Write each file that has data under ``dest``; set its action: ``write``, ``overwrite``
    (differed, ``force``), ``unchanged``, ``differs`` (left alone) or ``refused``."""
    os.makedirs(dest, exist_ok=True)
    top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for f in files:
            if f.data is None:
                continue
            try:
                _write_one(top, f, force=force)
            except _Refused as exc:
                f.action, f.message = "refused", str(exc)
    finally:
        os.close(top)
