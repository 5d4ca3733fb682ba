"""Open a file below the storage root, following no symlink, in one system call.

Linux 5.6+ has ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``: the kernel
refuses a path that leaves the directory or passes through any symlink, during the same
lookup that opens the file. That replaces the containment walk of ``Layout.check_inside``
(one ``lstat`` per component, then the open) on the hottest read, at a third of its cost, and
without the walk's window between checking a component and opening through it. Python has no
binding for it, so it is called through ``ctypes``; where the kernel or a seccomp filter
refuses it (``ENOSYS``, ``EPERM``) the caller falls back to the walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import sys
import weakref

from app.storage.core.errors import Unreadable, UnsafePath
from app.storage.tree.fs.noatime import O_NOATIME, READ_FLAGS, regular_file

_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_how = _OpenHow(READ_FLAGS, 0, _RESOLVE)
# O_NOATIME (see noatime.py) is refused with EPERM on a file someone else owns: then the
# plain open is tried, and only its EPERM (a seccomp filter) means openat2 is unavailable.
_how_noatime = _OpenHow(READ_FLAGS | O_NOATIME, 0, _RESOLVE)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_how_dir = _OpenHow(DIR_FLAGS, 0, _RESOLVE)
_syscall = None
if sys.platform == "linux":
    try:
        _syscall = ctypes.CDLL(None, use_errno=True).syscall
        _syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        _syscall = None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):  # closed already
        os.close(fd)


class Unavailable(Exception):
    """openat2 cannot be used here (old kernel, seccomp filter): use the containment walk."""


class Beneath:
    """Opens files below one directory; ``available`` is False once the kernel said no."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.available = _syscall is not None
        self._fd = -1
        self._key: tuple[int, int, int] = (-1, -1, -1)  # pid, st_dev, st_ino of the fd

    def _root_fd(self) -> int:
        """A descriptor of the root as the path names it now.

        Re-opened in a new process (a descriptor must not cross a fork) and whenever the
        path names another directory than the one held: an operator who moves the root aside
        and restores a backup in its place must not have reads served from the old one.
        """
        st = os.stat(self.root)
        key = (os.getpid(), st.st_dev, st.st_ino)
        if key != self._key:
            # The replaced descriptor is left open (one per replacement of the root): another
            # thread may be inside openat2 with it, and a closed number can be reused by an
            # unrelated directory.
            self._fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self._key = key
            weakref.finalize(self, _close_quietly, self._fd)
        return self._fd

    def open_read(self, relative: str) -> int | None:
        """A read-only descriptor for ``relative`` (no leading slash), None when it is absent.

        Raises UnsafePath when the path passes through a symlink or leaves the root, and
        Unavailable (from then on ``available`` is False) when openat2 cannot be used here.
        """
        if _syscall is None:
            raise Unavailable
        root_fd, name, size = self._root_fd(), relative.encode(), ctypes.sizeof(_how)
        fd = int(_syscall(_SYS_OPENAT2, root_fd, name, ctypes.byref(_how_noatime), size))
        if fd >= 0:
            return regular_file(fd, relative)
        err = ctypes.get_errno()
        if err == errno.EPERM and O_NOATIME:
            fd = int(_syscall(_SYS_OPENAT2, root_fd, name, ctypes.byref(_how), size))
            if fd >= 0:
                return regular_file(fd, relative)
            err = ctypes.get_errno()
        self._failed(err, relative)
        return None

    def open_dir(self, relative: str) -> int | None:
        """A descriptor of the directory ``relative`` ("." for the root), None when absent.

        Raises UnsafePath for a symlink anywhere on the way (the last component included) and
        NotADirectoryError when the last component is not a directory.
        """
        if _syscall is None:
            raise Unavailable
        root_fd, name = self._root_fd(), relative.encode()
        fd = int(_syscall(_SYS_OPENAT2, root_fd, name, ctypes.byref(_how_dir), ctypes.sizeof(_how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err == errno.ENOTDIR:
            # O_DIRECTORY | O_NOFOLLOW answers ENOTDIR for a link as the last component too.
            not_a_directory(root_fd, relative, f"{self.root}/{relative}")
        self._failed(err, relative)
        return None

    def _failed(self, err: int, relative: str) -> None:
        """Raise for ``err`` unless it means the path is absent."""
        if err in (errno.ENOENT, errno.ENOTDIR):
            return
        if err in (errno.ELOOP, errno.EXDEV):
            raise UnsafePath(f"{self.root}/{relative} passes through a symlink or leaves the root")
        if err in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
            self.available = False
            raise Unavailable
        raise Unreadable(err, os.strerror(err), f"{self.root}/{relative}")


def not_a_directory(dir_fd: int, relative: str, shown: str) -> None:
    """Explain an ENOTDIR met opening ``relative`` as a directory without following links.

    No link came before the failing component (that would have been ELOOP), so an ``lstat``
    of the path follows none: a link there is UnsafePath, a file is NotADirectoryError, and
    a file further up (the path cannot exist) returns quietly.
    """
    try:
        st = os.stat(relative, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{shown} is a symlink; the service never follows one")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", shown)
