"""A FUSE passthrough that forgets every write nobody fsynced, on command: a power cut.

    python -m tests.powerloss.simfs BACKING MOUNTPOINT --fifo CMD --done-fifo DONE

It speaks LazyFS's control protocol (one command per line on ``CMD``):
``lazyfs::clear-cache`` drops every unsynced change and answers ``finished::clear-cache``
on ``DONE``; ``lazyfs::cache-checkpoint`` writes them all to the backing directory.

What survives a clear is what LazyFS keeps (tests/powerloss/test_semantics.py runs the
same table against both):

- file contents (write, truncate, O_TRUNC) live in this process's memory, page by page,
  until an fsync or fdatasync of that file writes them to the backing file; reads and stat
  see them at once, as they would see the page cache;
- names reach the backing directory at once: create (an empty file), mkdir, rename, link,
  unlink, rmdir, symlink, chmod, utimens. A directory fsync succeeds and does nothing, so a
  missing directory fsync is not caught here, nor by LazyFS;
- locks (flock, fcntl) are not implemented here, so the kernel keeps them itself, which is
  right for processes on one machine; mmap works through the kernel's page cache (no
  direct_io), which SQLite's WAL index (``-shm``) needs.

Unsynced state is keyed by the backing file's inode, so it follows a file through renames
and hard links, as a page cache does.

It also fails operations on command, as a failing disk would: ``simfs::fail OP PATH`` makes
every ``OP`` (``open``, ``read`` or ``write``; ``write`` covers fsync too) of a file at or
under ``PATH`` (a path of the mount, ``/`` first) fail with EIO, until ``simfs::fail clear``;
each is answered ``finished::fail`` on ``DONE`` once in force.

With ``--ext4`` it keeps two promises of ext4 in its default ``data=ordered`` mode, the ones
group commit (app/storage/tree/fs/atomic.py) relies on: a rename over an existing file takes the
renamed file's data to the disk with it (``auto_da_alloc``), and ``simfs::syncfs MARKER``
stands for syncfs(2), which FUSE does not pass on: every unsynced change is written to the
backing files, then the file ``MARKER`` (outside the mount) is created to say so. A new file
renamed into a free name keeps its data in memory: a cut leaves it empty, as ext4's delayed
allocation may.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import resource
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy

PAGE = 4096
CLEAR = "lazyfs::clear-cache"
CHECKPOINT = "lazyfs::cache-checkpoint"
SYNCFS = "simfs::syncfs "  # + the marker file to create once done (--ext4 only)
FAIL = "simfs::fail "  # + "open|read|write PATH", or "clear"
CLEARED = "finished::clear-cache\n"
FAILING = "finished::fail\n"
FAULT_OPS = ("open", "read", "write")
# Flags that make no sense on the backing descriptor: appends and truncation are applied
# here (FUSE hands us the offset of an O_APPEND write), creation is the create op's.
_NOT_PASSED = os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL | os.O_ACCMODE | os.O_DIRECT

Key = tuple[int, int]  # the backing file's (st_dev, st_ino)


@dataclass
class Unsynced:
    """What one file holds that its backing file does not: the power cut takes all of it."""

    fd: int  # a read-write descriptor of the backing file, closed when this state ends
    size: int  # the size readers see
    # Backing bytes at or past this offset are not the file's (a truncate cut them): they
    # read as zeros until written again. Never above ``size``.
    valid: int
    pages: dict[int, bytearray] = field(default_factory=dict)

    @staticmethod
    def of(fd: int) -> Unsynced:
        size = os.fstat(fd).st_size
        return Unsynced(os.dup(fd), size, size)

    def load(self, index: int) -> bytearray:
        start = index * PAGE
        page = bytearray(os.pread(self.fd, max(0, min(PAGE, self.valid - start)), start))
        page.extend(bytes(PAGE - len(page)))
        return page

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        out = bytearray(os.pread(self.fd, max(0, min(end, self.valid) - offset), offset))
        out.extend(bytes(end - offset - len(out)))
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is not None:
                lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
                out[lo - offset : hi - offset] = page[lo - index * PAGE : hi - index * PAGE]
        return bytes(out)

    def write(self, data: bytes, offset: int) -> None:
        end = offset + len(data)
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
            page = self.pages.get(index)
            if page is None:
                page = bytearray(PAGE) if hi - lo == PAGE else self.load(index)
                self.pages[index] = page
            page[lo - index * PAGE : hi - index * PAGE] = data[lo - offset : hi - offset]
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        if length < self.size:
            self.valid = min(self.valid, length)
            for index in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[index]
            last = self.pages.get(length // PAGE)
            if last is not None:
                last[length % PAGE :] = bytes(PAGE - length % PAGE)
        self.size = length

    def flush(self) -> None:
        """Write this state to the backing file (the fsync) and end it."""
        os.ftruncate(self.fd, self.valid)  # the stale tail is gone; the rest reads as zeros
        os.ftruncate(self.fd, self.size)
        for index in sorted(self.pages):
            count = min(PAGE, self.size - index * PAGE)
            if count > 0:
                os.pwrite(self.fd, memoryview(self.pages[index])[:count], index * PAGE)
        self.drop()

    def drop(self) -> None:
        os.close(self.fd)


@dataclass
class Handle:
    fd: int
    key: Key
    sync_writes: bool  # O_SYNC / O_DSYNC: every write is also an fsync
    path: str = ""  # the mount's path it was opened by (what a fault names)


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino)


def _attrs(st: os.stat_result, unsynced: Unsynced | None) -> dict[str, Any]:
    attrs = {
        name: getattr(st, name)
        for name in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_blksize")
    }
    attrs.update(
        st_size=st.st_size,
        st_blocks=st.st_blocks,
        st_atime=st.st_atime_ns,
        st_mtime=st.st_mtime_ns,
        st_ctime=st.st_ctime_ns,
    )
    if unsynced is not None:
        attrs["st_size"] = unsynced.size
        attrs["st_blocks"] = (unsynced.size + 511) // 512
    return attrs


class PowerLossFS(mfusepy.Operations):
    """The passthrough over ``backing``; :meth:`clear` is the power cut."""

    use_ns = True

    def __init__(self, backing: Path, *, ext4: bool = False) -> None:
        self.backing = str(backing.resolve())
        self.ext4 = ext4
        # One lock for the unsynced state and the handles: every operation is short, and
        # one order of events is what makes "what was synced before the cut" well defined.
        self.mu = threading.Lock()
        self.unsynced: dict[Key, Unsynced] = {}
        self.handles: dict[int, Handle] = {}
        self.dirs: dict[int, int] = {}  # handle -> descriptor of an open backing directory
        self.next_fh = 1
        self.faults: dict[str, set[str]] = {op: set() for op in FAULT_OPS}

    # -- a failing disk ---------------------------------------------------------------------------
    def set_fault(self, command: str) -> None:
        """``open|read|write PATH``: that operation fails with EIO at or under PATH;
        ``clear``: none does."""
        with self.mu:
            if command.strip() == "clear":
                for paths in self.faults.values():
                    paths.clear()
                return
            op, _, path = command.partition(" ")
            if op not in self.faults or not path.startswith("/"):
                raise ValueError(f"not a fault: {command!r}")
            self.faults[op].add(path.rstrip("/") or "/")

    def _failing(self, op: str, path: str | None) -> None:
        """Raise EIO when ``op`` on ``path`` is to fail (the caller holds mu)."""
        if not path:
            return
        for prefix in self.faults[op]:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                raise mfusepy.FuseOSError(errno.EIO)

    def real(self, path: str | None) -> str:
        if path is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        return self.backing + path

    # -- the power cut -------------------------------------------------------------------------
    def clear(self) -> int:
        """Drop every unsynced change; return how many files lost something."""
        with self.mu:
            lost = len(self.unsynced)
            for state in self.unsynced.values():
                state.drop()
            self.unsynced.clear()
        return lost

    def checkpoint(self) -> None:
        """Write every unsynced change to the backing files."""
        with self.mu:
            for state in self.unsynced.values():
                state.flush()
            self.unsynced.clear()

    # -- helpers (caller holds mu) ---------------------------------------------------------------
    def _state(self, key: Key, fd: int) -> Unsynced:
        state = self.unsynced.get(key)
        if state is None:
            state = self.unsynced[key] = Unsynced.of(fd)
        return state

    def _sync(self, key: Key) -> None:
        state = self.unsynced.pop(key, None)
        if state is not None:
            state.flush()

    def _forget(self, key: Key) -> None:
        state = self.unsynced.pop(key, None)
        if state is not None:
            state.drop()

    def _forget_if_gone(self, key: Key, nlink: int) -> None:
        """A file with no name and no open handle can never be synced: drop its state."""
        if nlink == 0 and not any(h.key == key for h in self.handles.values()):
            self._forget(key)

    def _lost_name(self, real: str) -> None:
        """``real`` is about to be unlinked or renamed over: forget its state if it dies."""
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            self._forget_if_gone(_key(st), st.st_nlink - 1)

    def _open(self, fd: int, flags: int, *, created: bool, path: str = "") -> int:
        key = _key(os.fstat(fd))
        if created:
            # A new file may reuse the inode number of one that died with unsynced state.
            self._forget(key)
        handle = Handle(fd, key, bool(flags & (os.O_SYNC | os.O_DSYNC)), path)
        fh = self._new_fh()
        self.handles[fh] = handle
        if flags & os.O_TRUNC:
            self._state(key, fd).truncate(0)
        return fh

    def _new_fh(self) -> int:
        fh = self.next_fh
        self.next_fh += 1
        return fh

    def _fd_or_path(self, path: str | None, fh: int | None) -> int | str:
        """The open backing descriptor of ``fh``, else the backing path of ``path``."""
        handle = self.handles.get(fh) if fh is not None else None
        return handle.fd if handle is not None else self.real(path)

    @staticmethod
    def _backing_flags(flags: int) -> int:
        # Read-write even for a reader: an fsync through a read-only descriptor must still
        # be able to write the file's unsynced pages.
        return (flags & ~_NOT_PASSED) | os.O_RDWR

    # -- files -----------------------------------------------------------------------------------
    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        if config_3 is not None:
            # The kernel must ask again each time: sizes change under it at a clear.
            config_3.entry_timeout = 0
            config_3.negative_timeout = 0
            config_3.attr_timeout = 0
            config_3.use_ino = 1  # SQLite tells files apart by inode
            config_3.hard_remove = 1  # no .fuse_hidden files in the tree fsck walks
            config_3.nullpath_ok = 1  # operations on an unlinked open file come by handle

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.mu:
            handle = self.handles.get(fh) if fh is not None else None
            st = os.fstat(handle.fd) if handle is not None else os.lstat(self.real(path))
            unsynced = self.unsynced.get(_key(st)) if stat.S_ISREG(st.st_mode) else None
            return _attrs(st, unsynced)

    def open(self, path: str, flags: int) -> int:
        with self.mu:
            self._failing("open", path)
        real = self.real(path)
        try:
            fd = os.open(real, self._backing_flags(flags))
        except PermissionError:
            fd = os.open(real, (flags & ~_NOT_PASSED) | (flags & os.O_ACCMODE))
        with self.mu:
            return self._open(fd, flags, created=False, path=path)

    def create(self, path: str, mode: int, flags: int) -> int:
        real = self.real(path)
        base = self._backing_flags(flags)
        try:
            fd = os.open(real, base | os.O_CREAT | os.O_EXCL, mode)
            created = True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            fd, created = os.open(real, base), False
        with self.mu:
            return self._open(fd, flags, created=created, path=path)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mu:
            handle = self.handles[fh]
            self._failing("read", handle.path)
            state = self.unsynced.get(handle.key)
            if state is None:
                return os.pread(handle.fd, size, offset)
            return state.read(size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mu:
            handle = self.handles[fh]
            self._failing("write", handle.path)
            self._state(handle.key, handle.fd).write(data, offset)
            if handle.sync_writes:
                self._sync(handle.key)
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mu:
            handle = self.handles.get(fh) if fh is not None else None
            if handle is not None:
                self._state(handle.key, handle.fd).truncate(length)
                return 0
        fd = os.open(self.real(path), os.O_RDWR | os.O_NOFOLLOW)
        try:
            with self.mu:
                self._state(_key(os.fstat(fd)), fd).truncate(length)
        finally:
            os.close(fd)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mu:
            self._failing("write", self.handles[fh].path)
            self._sync(self.handles[fh].key)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close(2) makes nothing durable

    def release(self, path: str | None, fh: int) -> int:
        with self.mu:
            handle = self.handles.pop(fh)
            nlink = os.fstat(handle.fd).st_nlink
            os.close(handle.fd)
            self._forget_if_gone(handle.key, nlink)
        return 0

    # -- names: straight to the backing directory --------------------------------------------
    def unlink(self, path: str) -> int:
        real = self.real(path)
        with self.mu:
            self._lost_name(real)
            os.unlink(real)
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags:
            # renameat2 flags (NOREPLACE, EXCHANGE) are refused, as LazyFS refuses them,
            # rather than quietly turned into a plain rename.
            raise mfusepy.FuseOSError(errno.EINVAL)
        src, dst = self.real(old), self.real(new)
        with self.mu:
            try:
                same = os.path.samestat(os.lstat(src), os.lstat(dst))
            except FileNotFoundError:
                same = False
            if not same:
                if self.ext4 and os.path.isfile(dst) and not os.path.islink(dst):
                    # auto_da_alloc: the replacement's data commits with the rename.
                    st = os.lstat(src)
                    self._sync((st.st_dev, st.st_ino))
                self._lost_name(dst)
            os.rename(src, dst)
        return 0

    def link(self, target: str, source: str) -> int:
        os.link(self.real(source), self.real(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self.real(target))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self.real(path))

    def mknod(self, path: str, mode: int, dev: int) -> int:
        # gunicorn binds its control socket in the storage root (LazyFS has no mknod).
        os.mknod(self.real(path), mode, dev)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self.real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self.real(path))
        return 0

    def opendir(self, path: str) -> int:
        # Read by descriptor: readdir gets no path (nullpath_ok), and a rename must not
        # change what an open directory lists.
        fd = os.open(self.real(path), os.O_RDONLY | os.O_DIRECTORY)
        with self.mu:
            fh = self._new_fh()
            self.dirs[fh] = fd
        return fh

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # Each entry carries its inode number: with use_ino the kernel passes it on, and a
        # directory entry with inode 0 is skipped by readdir(3).
        fd = self.dirs[fh]
        here = os.fstat(fd)
        out = [(".", {"st_mode": stat.S_IFDIR, "st_ino": here.st_ino}, 0)]
        out.append(("..", {"st_mode": stat.S_IFDIR, "st_ino": here.st_ino}, 0))
        with os.scandir(fd) as it:
            for entry in it:
                if entry.is_symlink():
                    mode = stat.S_IFLNK
                elif entry.is_dir(follow_symlinks=False):
                    mode = stat.S_IFDIR
                elif entry.is_file(follow_symlinks=False):
                    mode = stat.S_IFREG
                else:
                    try:
                        mode = stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
                    except FileNotFoundError:
                        continue
                out.append((entry.name, {"st_mode": mode, "st_ino": entry.inode()}, 0))
        return out

    def releasedir(self, path: str | None, fh: int) -> int:
        with self.mu:
            os.close(self.dirs.pop(fh))
        return 0

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        target = self._fd_or_path(path, fh)
        if isinstance(target, int):
            os.fchmod(target, mode)
        else:
            os.chmod(target, mode, follow_symlinks=False)
        return 0

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        target = self._fd_or_path(path, fh)
        if isinstance(target, int):
            os.fchown(target, uid, gid)
        else:
            os.chown(target, uid, gid, follow_symlinks=False)
        return 0

    def utimens(
        self, path: str | None, times: tuple[int, int] | None = None, fh: int | None = None
    ) -> int:
        target = self._fd_or_path(path, fh)
        follow = {} if isinstance(target, int) else {"follow_symlinks": False}
        if times is None:
            os.utime(target, **follow)
        else:
            os.utime(target, ns=times, **follow)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.real(path))
        return {
            name: getattr(sv, name)
            for name in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_flag",
                "f_namemax",
            )
        }


class _FUSE(mfusepy.FUSE):
    """mfusepy's FUSE, passing on what its libfuse 3 wrappers drop."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(
            old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags
        )

    def _path(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    # These four get no path for an open file (nullpath_ok): pass its handle on.
    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return self.operations.truncate(self._path(path), length, fip.contents.fh if fip else None)

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        return self.operations.chmod(self._path(path), mode, fip.contents.fh if fip else None)

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
        uid = -1 if uid == 0xFFFFFFFF else uid  # "leave unchanged", as the kernel sends it
        gid = -1 if gid == 0xFFFFFFFF else gid
        return self.operations.chown(self._path(path), uid, gid, fip.contents.fh if fip else None)

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            times = tuple(
                mfusepy.time_of_timespec(t, use_ns=True)
                for t in (buf.contents.actime, buf.contents.modtime)
            )
        return self.operations.utimens(self._path(path), times, fip.contents.fh if fip else None)


def _serve_commands(fs: PowerLossFS, fifo: Path, done: Path) -> None:
    # Read-write opens: neither blocks waiting for the other end, and the command fifo
    # never reports end-of-file when a writer goes away.
    commands = os.open(fifo, os.O_RDWR)
    answers = os.open(done, os.O_RDWR)
    pending = b""
    while True:
        pending += os.read(commands, 4096)
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            command = line.decode(errors="replace").strip()
            if command == CLEAR:
                lost = fs.clear()
                logging.warning("clear-cache: dropped the unsynced data of %d file(s)", lost)
                os.write(answers, CLEARED.encode())
            elif command == CHECKPOINT:
                fs.checkpoint()
                logging.warning("cache-checkpoint: done")
            elif command.startswith(FAIL):
                try:
                    fs.set_fault(command[len(FAIL) :])
                except ValueError as exc:
                    logging.warning("%s", exc)
                os.write(answers, FAILING.encode())
            elif fs.ext4 and command.startswith(SYNCFS):
                fs.checkpoint()
                with contextlib.suppress(OSError):  # the server may have been killed since
                    Path(command[len(SYNCFS) :]).touch()
            elif command:
                logging.warning("unknown command %r", command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--fifo", type=Path, required=True)
    parser.add_argument("--done-fifo", type=Path, required=True)
    parser.add_argument(
        "--ext4", action="store_true", help="ext4's ordering and a syncfs command (see above)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="simfs: %(message)s")
    for path in (args.fifo, args.done_fifo):
        if not path.exists():
            os.mkfifo(path)
    os.umask(0)  # the kernel applied the caller's umask to every mode we are given
    # One descriptor per file with unsynced data, until it is synced or dropped.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fs = PowerLossFS(args.backing, ext4=args.ext4)
    threading.Thread(
        target=_serve_commands, args=(fs, args.fifo, args.done_fifo), daemon=True
    ).start()
    _FUSE(fs, str(args.mountpoint), foreground=True, fsname="powerloss-sim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
