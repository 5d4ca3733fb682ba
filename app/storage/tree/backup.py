"""Export the tree: every task and every store, each as of one moment, while writers run.

Each task (and each store) is taken under its lock for as long as it takes to read its
records and open its artifacts (hard-linking into a snapshot directory under ``.trash/``
what exceeds a bound, :class:`_Taken`); the lock is released before a byte is written to
the backup. A snapshot directory left by an export that died is old trash: the sweeper and
fsck remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ulid import ULID

from app.storage.core.archive import (
    CURSOR_KEY_MEMBER,
    ArchiveError,
    BackupWriter,
    ExportSummary,
    store_member,
    task_member,
)
from app.storage.core.clock import iso
from app.storage.core.errors import StorageError, UnsafePath
from app.storage.core.files import DIR_MODE
from app.storage.core.names import (
    ARTIFACTS_DIR,
    CURSOR_KEY,
    STORE_ID_RE,
    STORE_RECORD,
    TASK_RECORD,
    TRASH_SNAPSHOT,
    TURN_DIR_RE,
    TURN_META,
    VERSION_ID_RE,
    VERSIONS_DIR,
    Scope,
    turn_dirname,
    validate_id,
)
from app.storage.core.records import turn_from_json
from app.storage.tree.fs.atomic import atomic_file
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.sync import sync_filesystem
from app.storage.tree.fs.txn import Key
from app.storage.tree.records import read_turn
from app.storage.tree.stores.engine import MemoryStoreEngine
from app.storage.tree.tasks import TaskStore


class TreeBackups(Protocol):
    """What a backup is taken from and restored into (TreeStorage): the two engines over
    one layout, and the root's keys."""

    @property
    def layout(self) -> Layout: ...

    @property
    def tasks(self) -> TaskStore: ...

    @property
    def stores(self) -> MemoryStoreEngine: ...

    def key(self, name: str) -> bytes: ...


def _refuse_link(storage: TreeBackups, path: Path) -> None:
    raise ArchiveError(
        f"{path.relative_to(storage.layout.root)} is a symlink; a backup never follows one"
        " (fsck lists every link: remove them and export again)"
    )


# What one task or store may hold open while the backup streams it: its records read into
# memory and its artifacts as open descriptors, up to these bounds; past them the rest is
# hard-linked into a snapshot directory under .trash/ (a task of thousands of turns, a store
# of thousands of versions) so memory and descriptors stay bounded.
_HELD_BYTES = 8 << 20
_HELD_FILES = 64


class _Taken:
    """One task's or store's files as of one moment, taken under its lock.

    Writers replace files by rename, never in place, so a record read, an artifact opened,
    or a file hard-linked while the lock is held keeps the bytes of that moment however long
    the backup then takes to stream them, and writers wait only for the taking.
    """

    def __init__(self, storage: TreeBackups, tag: str) -> None:
        self.storage = storage
        self.tag = tag
        self.items: list[tuple[str, bytes | int | Path]] = []
        self.held = 0
        self.fds = 0
        self.dir: Path | None = None

    def record(self, source: Path, tail: str) -> bytes | None:
        """Take a record; its bytes when they were read (None: hard-linked)."""
        if self.held + os.lstat(source).st_size <= _HELD_BYTES:
            data = self.storage.layout.read_bytes(source)
            if data is None:
                raise FileNotFoundError(source)
            self.held += len(data)
            self.items.append((tail, data))
            return data
        self.items.append((tail, self._link(source, tail)))
        return None

    def artifact(self, source: Path, tail: str) -> None:
        if self.fds < _HELD_FILES:
            fd = self.storage.layout.open_read(os.fspath(source))
            if fd is None:
                raise FileNotFoundError(source)
            self.fds += 1
            self.items.append((tail, fd))
        else:
            self.items.append((tail, self._link(source, tail)))

    def _link(self, source: Path, tail: str) -> Path:
        if self.dir is None:
            trash = self.storage.layout.check_inside(self.storage.layout.trash_dir())
            os.makedirs(trash, DIR_MODE, exist_ok=True)
            self.dir = trash / f"{ULID()}-{TRASH_SNAPSHOT}{self.tag}"
            os.mkdir(self.dir, DIR_MODE)
        target = self.dir / tail
        target.parent.mkdir(DIR_MODE, parents=True, exist_ok=True)
        os.link(source, target, follow_symlinks=False)
        return target

    def release(self) -> None:
        for _, item in self.items:
            if isinstance(item, int):
                with contextlib.suppress(OSError):
                    os.close(item)
        self.items = []
        if self.dir is not None:
            self.storage.layout.tree.remove(self.dir)
            self.dir = None


def _bytes(item: bytes | int | Path) -> bytes:
    """A taken record's bytes (read under the lock, or from its hard link)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, int):
        raise TypeError("an artifact descriptor is not a record")
    return item.read_bytes()


def _take_task(storage: TreeBackups, scope: Scope, task_id: str) -> _Taken | None:
    """Take a task's records and the artifacts they list, in member order."""
    tree = storage.layout.tree
    task_dir = storage.layout.task_dir(scope, task_id)
    with storage.tasks.txns.locked(Key(scope, task_id)):
        if not tree.is_dir(task_dir):
            return None  # deleted since the listing
        taken = _Taken(storage, task_id)
        try:
            turns = []
            for entry in tree.entries(task_dir):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
                if entry.name == TASK_RECORD and entry.is_file:
                    taken.record(entry.path, TASK_RECORD)
                match = TURN_DIR_RE.fullmatch(entry.name)
                if match and entry.is_dir:
                    turns.append((int(match.group(1)), entry.path))
            committed = sum(_take_turn(storage, taken, path, turn) for turn, path in turns)
        except BaseException:
            taken.release()
            raise
    if not committed:
        taken.release()  # no committed turn: not a task yet (a first write that died)
        return None
    return taken


def _take_turn(storage: TreeBackups, taken: _Taken, turn_dir: Path, turn: int) -> bool:
    """Take one turn's meta.json and artifacts; False when it has no commit point."""
    for entry in storage.layout.tree.entries(turn_dir):
        if entry.is_link:
            _refuse_link(storage, entry.path)
    meta = turn_dir / TURN_META
    if storage.layout.tree.lstat(meta) is None:
        return False
    prefix = turn_dirname(turn)
    data = taken.record(meta, f"{prefix}/{TURN_META}")
    record = turn_from_json(json.loads(data), meta) if data is not None else read_turn(turn_dir)
    if record is None:
        return False
    artifacts = turn_dir / ARTIFACTS_DIR
    if record.artifacts:
        for entry in storage.layout.tree.entries(artifacts):
            if entry.is_link:
                _refuse_link(storage, entry.path)
    for info in record.artifacts:
        st = storage.layout.tree.lstat(artifacts / info.name)
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ArchiveError(
                f"{turn_dir.relative_to(storage.layout.root)}: artifact {info.name} is listed"
                " but missing; run `flask --app wsgi fsck --repair` first"
            )
        taken.artifact(artifacts / info.name, f"{prefix}/{ARTIFACTS_DIR}/{info.name}")
    return True


def _export_task(storage: TreeBackups, writer: BackupWriter, scope: Scope, task_id: str) -> None:
    taken = _take_task(storage, scope, task_id)
    if taken is None:
        return
    try:
        infos = {}
        for tail, item in taken.items:
            name = task_member(scope.tenant, scope.project, task_id, tail)
            if f"/{ARTIFACTS_DIR}/" not in tail:
                data = _bytes(item)
                writer.add(name, data)
                if tail.endswith(TURN_META):
                    record = turn_from_json(json.loads(data), tail)
                    for info in record.artifacts:
                        infos[f"{tail.split('/')[0]}/{ARTIFACTS_DIR}/{info.name}"] = info
                continue
            info = infos[tail]
            with (
                os.fdopen(item, "rb", closefd=False) if isinstance(item, int) else open(item, "rb")  # noqa: SIM115
            ) as fh:
                writer.add_stream(name, fh, info.size, info.sha256)
    finally:
        taken.release()


def _export_store(storage: TreeBackups, writer: BackupWriter, scope: Scope, store_id: str) -> None:
    layout, tree = storage.layout, storage.layout.tree
    store_dir = layout.store_dir(scope, store_id)
    with storage.stores.txns.locked(Key(scope, store_id)):
        if not tree.is_dir(store_dir):
            return
        taken = _Taken(storage, store_id)
        try:
            for entry in tree.entries(store_dir):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
            taken.record(layout.store_record(store_dir), STORE_RECORD)
            for entry in tree.entries(layout.versions_dir(store_dir)):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
                stem = entry.name.removesuffix(".json")
                if entry.is_file and VERSION_ID_RE.fullmatch(stem) and entry.name.endswith(".json"):
                    taken.record(entry.path, f"{VERSIONS_DIR}/{entry.name}")
        except BaseException:
            taken.release()
            raise
    try:
        for tail, item in taken.items:
            writer.add(store_member(scope.tenant, scope.project, store_id, tail), _bytes(item))
    finally:
        taken.release()


def _scopes(storage: TreeBackups, tenant: str | None, project: str | None) -> Iterator[Scope]:
    if tenant is not None and project is not None:
        scope = Scope(tenant, project)
        if not storage.layout.tree.is_dir(storage.layout.project_dir(scope)):
            raise ArchiveError(f"project {tenant}/{project} does not exist")
        yield scope
        return
    links: list[Path] = []
    for scope in storage.layout.projects(links):
        if tenant is None or scope.tenant == tenant:
            yield scope
    for link in links:
        _refuse_link(storage, link)


def _ids(storage: TreeBackups, directory: Path) -> Iterator[str]:
    """The task ids of a project directory in sorted order (the order a backup's members
    take), streamed in bounded memory whatever the project's size."""
    tree = storage.layout.tree
    for entry in tree.non_dirs(directory):
        if entry.is_link and not entry.name.startswith((".", "_")):
            _refuse_link(storage, entry.path)
    for name in tree.sorted_subdir_names(directory):
        if name.startswith((".", "_")):
            continue
        try:
            yield validate_id("id", name)
        except StorageError:
            continue


def export_tree(
    storage: TreeBackups, out: Path, *, tenant: str | None = None, project: str | None = None
) -> ExportSummary:
    """Write a backup of one project, one tenant or the whole root (None: all) to ``out``."""
    if project is not None and tenant is None:
        raise ArchiveError("--project needs --tenant")
    out = Path(os.path.abspath(out))
    root = storage.layout.root
    if out == root or root in out.parents:
        raise ArchiveError(f"{out} is inside the storage root; write the backup elsewhere")
    try:
        with atomic_file(out) as raw:
            writer = BackupWriter(raw, tenant=tenant, project=project)
            try:
                manifest = _write(storage, writer, tenant, project)
                # Under group commit a writer lets go of its lock before its flush, so a
                # record taken here may not be on disk yet: it is before the backup is.
                sync_filesystem(root)
            except BaseException:
                writer.abandon()
                raise
    except UnsafePath as exc:
        raise ArchiveError(f"{exc} (fsck lists every link: remove them and export again)") from None
    return ExportSummary(out, manifest["counts"], manifest["members"])


def _write(
    storage: TreeBackups, writer: BackupWriter, tenant: str | None, project: str | None
) -> dict[str, Any]:
    for scope in _scopes(storage, tenant, project):
        project_dir = storage.layout.project_dir(scope)
        for task_id in _ids(storage, project_dir):
            _export_task(storage, writer, scope, task_id)
        stores = storage.layout.stores_dir(scope)
        for entry in storage.layout.tree.entries(stores):
            if entry.is_link:
                _refuse_link(storage, entry.path)
            if entry.is_dir and STORE_ID_RE.fullmatch(entry.name):
                _export_store(storage, writer, scope, entry.name)
    if tenant is None:
        writer.add(CURSOR_KEY_MEMBER, storage.key(CURSOR_KEY))
    return writer.finish(iso(storage.tasks.clock()))
