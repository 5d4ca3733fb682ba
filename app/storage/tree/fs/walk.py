"""List, walk, remove and rename under the storage root without ever following a symlink.

People and their tools touch the tree: any entry may have been replaced by a link since the
service last looked, and following one could list, delete or overwrite files outside the
root (the service often runs as root). Every listing, walk, removal and rename under the
root goes through :class:`Tree`:

* a directory is opened by descriptor, in one ``openat2(RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS)`` call (or component by component with ``O_NOFOLLOW`` where the
  kernel lacks it), so a link anywhere on the way, the last component included, is refused
  before anything is read through it (:class:`UnsafePath`);
* everything after that works relative to the descriptor (``scandir(fd)``,
  ``unlink(name, dir_fd=fd)``, ``rmtree(name, dir_fd=fd)``), so the check and the use cannot
  be separated by someone swapping a directory for a link in between;
* an entry that is a link is reported as one (``Entry.is_link``) and never entered; what to
  do about it (report, skip) is the caller's decision, and removing a directory never
  removes or enters a link found in place of that directory.

``os.scandir(path)``, ``os.walk(top)``, ``Path.iterdir()`` and ``shutil.rmtree(path)`` all
follow a link at (or on the way to) their starting point; nothing in the engine calls them
on a path under the root.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.storage.core.errors import UnsafePath
from app.storage.tree.fs.beneath import DIR_FLAGS, Beneath, Unavailable, not_a_directory

log = logging.getLogger("app.storage")

# The names :meth:`Tree.sorted_subdir_names` holds per pass (twice this, while it selects).
NAME_BATCH = 16384


@dataclass(frozen=True, slots=True)
class Entry:
    """One directory entry, typed by ``lstat`` (a link is a link, whatever it points to)."""

    name: str
    path: Path
    mode: int
    size: int
    mtime: float

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


@dataclass(frozen=True, slots=True)
class WalkStep:
    """One directory of a walk: its path and its entries (links listed, never entered)."""

    path: Path
    entries: tuple[Entry, ...]

    @property
    def links(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.is_link)


class Tree:
    """Descriptor-based operations below one root directory."""

    def __init__(self, root: Path, beneath: Beneath | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self._root_text = os.fspath(self.root)
        self._prefix = self._root_text.rstrip(os.sep) + os.sep
        self._beneath = beneath or Beneath(self._root_text)

    # -- paths -------------------------------------------------------------------------------
    def relative(self, path: str | os.PathLike[str]) -> str:
        """``path`` relative to the root ("." for the root); UnsafePath when it is outside."""
        text = os.fspath(path)
        if text == self._root_text:
            return "."
        if not text.startswith(self._prefix):
            raise UnsafePath(f"{text} is not under the storage root")
        rest = text[len(self._prefix) :]
        if any(part in ("", ".", "..") for part in rest.split(os.sep)):
            raise UnsafePath(f"{text} has an empty, '.' or '..' component")
        return rest

    # -- directories -------------------------------------------------------------------------
    def open_dir(self, path: str | os.PathLike[str]) -> int | None:
        """A descriptor of the directory ``path``; None when it (or a parent) is absent.

        UnsafePath when a link is anywhere on the way; NotADirectoryError when ``path`` is a
        file. The caller closes the descriptor.
        """
        relative = self.relative(path)
        if self._beneath.available:
            try:
                return self._beneath.open_dir(relative)
            except Unavailable:
                pass
        return self._open_dir_walk(relative)

    def _open_dir_walk(self, relative: str) -> int | None:
        fd = os.open(self._root_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if relative == ".":
            return fd
        parts = relative.split(os.sep)
        try:
            for index, part in enumerate(parts):
                shown = os.path.join(self._root_text, *parts[: index + 1])
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise UnsafePath(f"{shown} passes through a symlink") from None
                    if exc.errno != errno.ENOTDIR:
                        raise
                    try:
                        not_a_directory(fd, part, shown)
                    except NotADirectoryError:
                        if index == len(parts) - 1:
                            raise
                    return None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def opened(self, path: str | os.PathLike[str]) -> Iterator[int | None]:
        """:meth:`open_dir` for the block; the descriptor is closed after it."""
        fd = self.open_dir(path)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def entries(self, path: str | os.PathLike[str]) -> list[Entry]:
        """The entries of the directory ``path`` sorted by name; [] when it is absent.

        UnsafePath when ``path`` is or passes through a link.
        """
        base = Path(path)
        with self.opened(base) as fd:
            return [] if fd is None else _scan(fd, base)

    def subdir_names(self, path: str | os.PathLike[str]) -> Iterator[str]:
        """The names of the plain subdirectories of ``path``, streamed in directory order
        (nothing when it is absent; UnsafePath when it is or passes through a link)."""
        with self.opened(path) as fd:
            if fd is None:
                return
            with os.scandir(fd) as it:
                for item in it:
                    if item.is_dir(follow_symlinks=False):
                        yield item.name

    def sorted_subdir_names(
        self, path: str | os.PathLike[str], *, batch: int | None = None
    ) -> Iterator[str]:
        """The names of the plain subdirectories of ``path`` in sorted order, holding at most
        2 x ``batch`` names (default :data:`NAME_BATCH`) whatever the directory's size
        (nothing when it is absent).

        Each pass scans the directory for the next ``batch`` names after the last one given,
        so a directory of n names costs n / ``batch`` scans (a 100,000-task project: 7 scans
        without a stat) and no list of n names. The directory is not held open between
        passes: a name created behind the last one given is not seen, a name removed after
        it is not given. UnsafePath when ``path`` is or passes through a link, at any pass.
        """
        batch = batch or NAME_BATCH
        after: str | None = None
        while True:
            chunk: list[str] = []
            bound: str | None = None  # once ``chunk`` is full, only names below it qualify
            with self.opened(path) as fd:
                if fd is None:
                    return
                with os.scandir(fd) as it:
                    for item in it:
                        name = item.name
                        if (after is not None and name <= after) or (
                            bound is not None and name >= bound
                        ):
                            continue
                        if not item.is_dir(follow_symlinks=False):
                            continue
                        chunk.append(name)
                        if len(chunk) >= 2 * batch:
                            chunk.sort()
                            del chunk[batch:]
                            bound = chunk[-1]
            chunk.sort()
            del chunk[batch:]
            yield from chunk
            if len(chunk) < batch:
                return
            after = chunk[-1]

    def non_dirs(self, path: str | os.PathLike[str]) -> list[Entry]:
        """Every entry of the directory ``path`` that is not a plain subdirectory (links,
        files, anything else), typed as :meth:`entries` does and sorted by name: a directory
        of 100,000 tasks costs no stat and no entry for them ([] when it is absent)."""
        base = Path(path)
        others: list[Entry] = []
        with self.opened(base) as fd:
            if fd is None:
                return others
            with os.scandir(fd) as it:
                for item in it:
                    if item.is_dir(follow_symlinks=False):
                        continue
                    try:
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while we listed
                    others.append(
                        Entry(item.name, base / item.name, st.st_mode, st.st_size, st.st_mtime)
                    )
        others.sort(key=lambda e: e.name)
        return others

    def fsync_all(self, path: str | os.PathLike[str]) -> None:
        """fsync the directory ``path`` and every file and directory below it, each directory
        after its entries: opened by descriptor, a link never entered or opened (UnsafePath
        when ``path`` is or passes through one), one open directory per level."""
        with self.opened(path) as fd:
            if fd is None:
                raise FileNotFoundError(errno.ENOENT, "no such directory", os.fspath(path))
            _fsync_below(fd)

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        """True when ``path`` is a directory reached without a link (UnsafePath otherwise)."""
        try:
            with self.opened(path) as fd:
                return fd is not None
        except NotADirectoryError:
            return False

    def entry(self, path: Path) -> Entry | None:
        """``path`` typed as :meth:`entries` types it (None: absent)."""
        st = self.lstat(path)
        return None if st is None else Entry(path.name, path, st.st_mode, st.st_size, st.st_mtime)

    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result | None:
        """``lstat`` of ``path`` through its checked parent; None when absent."""
        target = Path(path)
        with self.opened(target.parent) as fd:
            if fd is None:
                return None
            try:
                return os.stat(target.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None

    def walk(self, path: str | os.PathLike[str]) -> Iterator[WalkStep]:
        """Every directory under ``path``, top-down, each listed by descriptor.

        Links are listed in their directory's entries and never entered. A subdirectory
        swapped for a link between its listing and its visit is skipped, not followed.
        """
        base = Path(path)
        fd = self.open_dir(base)
        if fd is None:
            return
        yield from _walk_fd(fd, base)

    # -- removal and renames -----------------------------------------------------------------
    def remove(self, path: str | os.PathLike[str]) -> bool:
        """Remove the file or directory tree ``path``; links inside a removed tree are removed
        as links. A link found at ``path`` itself is left alone (False): it was planted, and
        what it points to is not ours. True when something was removed (or nothing was there).
        """
        target = Path(path)
        with self.opened(target.parent) as fd:
            if fd is None:
                return True
            try:
                st = os.stat(target.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if stat.S_ISLNK(st.st_mode):
                return False
            if stat.S_ISDIR(st.st_mode):
                # With a dir_fd, rmtree works by descriptors and unlinks links it finds
                # inside instead of entering them (shutil.rmtree.avoids_symlink_attacks).
                shutil.rmtree(target.name, ignore_errors=True, dir_fd=fd)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target.name, dir_fd=fd)
            return True

    def unlink(self, path: str | os.PathLike[str]) -> None:
        """Remove the file (or link) ``path`` itself, reached through its checked parent."""
        target = Path(path)
        with self.opened(target.parent) as fd:
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target.name, dir_fd=fd)

    def rmdir(self, path: str | os.PathLike[str]) -> bool:
        """Remove the directory ``path`` if it is empty; False when it is not (or is absent)."""
        target = Path(path)
        with self.opened(target.parent) as fd:
            if fd is None:
                return False
            try:
                os.rmdir(target.name, dir_fd=fd)
            except OSError:
                return False
            return True

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Rename ``src`` to ``dst``; both parents are reached without a link."""
        source, target = Path(src), Path(dst)
        with self.opened(source.parent) as sfd, self.opened(target.parent) as dfd:
            if sfd is None:
                raise FileNotFoundError(errno.ENOENT, "no such directory", str(source.parent))
            if dfd is None:
                raise FileNotFoundError(errno.ENOENT, "no such directory", str(target.parent))
            os.rename(source.name, target.name, src_dir_fd=sfd, dst_dir_fd=dfd)

    def size(self, path: str | os.PathLike[str]) -> int:
        """Bytes of the file or of every file under the directory ``path`` (links: their own
        size, never followed); 0 when absent."""
        st = self.lstat(path)
        if st is None:
            return 0
        if not stat.S_ISDIR(st.st_mode):
            return st.st_size
        return sum(e.size for step in self.walk(path) for e in step.entries if not e.is_dir)


def _scan(fd: int, base: Path) -> list[Entry]:
    found = []
    with os.scandir(fd) as it:
        for item in it:
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            found.append(Entry(item.name, base / item.name, st.st_mode, st.st_size, st.st_mtime))
    found.sort(key=lambda e: e.name)
    return found


def _fsync_below(fd: int) -> None:
    with os.scandir(fd) as it:
        for item in it:
            if item.is_dir(follow_symlinks=False):
                child = os.open(item.name, DIR_FLAGS, dir_fd=fd)
                try:
                    _fsync_below(child)
                finally:
                    os.close(child)
            elif item.is_file(follow_symlinks=False):
                child = os.open(item.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.fsync(child)
                finally:
                    os.close(child)
    os.fsync(fd)


def _walk_fd(fd: int, base: Path) -> Iterator[WalkStep]:
    try:
        entries = _scan(fd, base)
        yield WalkStep(base, tuple(entries))
        for entry in entries:
            if not entry.is_dir:
                continue
            try:
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link or a file since the listing
            yield from _walk_fd(child, entry.path)
    finally:
        os.close(fd)


def remove_planted_link(path: str | os.PathLike[str], whose: str) -> None:
    """Remove a link at ``path``, where ``whose`` (the service, SQLite) keeps a file of its
    own: the link itself, never its target, so the owner makes its file there again. Nothing
    else is touched: a plain file or no file at all is left as it is."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            log.warning("%s is a symlink where %s keeps its own file: removed", path, whose)
            with contextlib.suppress(FileNotFoundError):  # another process was first
                os.unlink(path)
