"""Export the tree: every task and every store, each as of one moment, while writers run.

Each task (and each store) is taken under its lock for as long as it takes to hard-link its
records and artifacts into a snapshot directory under ``.trash/`` (a link per file, no copy);
the lock is released before a byte is read. Writers replace files by rename, never in place,
so the snapshot keeps the bytes of that moment however long the export of a 50 MiB artifact
takes, and writers wait only for the links. A snapshot left by an export that died is old
trash: the sweeper and fsck remove it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ulid import ULID

from ..atomic import DIR_MODE, atomic_file
from ..clock import iso
from ..errors import StorageError, UnsafePath
from ..layout import (
    ARTIFACTS_DIR,
    CURSOR_KEY,
    STORE_ID_RE,
    STORE_RECORD,
    TASK_RECORD,
    TURN_DIR_RE,
    TURN_META,
    VERSION_ID_RE,
    Scope,
    turn_dirname,
    validate_id,
)
from ..records import read_turn
from ..txn import Key
from .format import (
    CURSOR_KEY_MEMBER,
    ArchiveError,
    BackupWriter,
    ExportSummary,
    store_member,
    task_member,
)

if TYPE_CHECKING:
    from ..facade import TreeStorage


def _refuse_link(storage: TreeStorage, path: Path) -> None:
    raise ArchiveError(
        f"{path.relative_to(storage.layout.root)} is a symlink; a backup never follows one"
        " (fsck lists every link: remove them and export again)"
    )


class _Snapshot:
    """Hard links of one task's or store's files, taken under its lock."""

    def __init__(self, storage: TreeStorage, tag: str) -> None:
        self.storage = storage
        trash = storage.layout.check_inside(storage.layout.trash_dir())
        os.makedirs(trash, DIR_MODE, exist_ok=True)
        self.dir = trash / f"{ULID()}-snapshot-{tag}"
        os.mkdir(self.dir, DIR_MODE)

    def link(self, source: Path, relative: str) -> Path:
        target = self.dir / relative
        target.parent.mkdir(DIR_MODE, parents=True, exist_ok=True)
        os.link(source, target, follow_symlinks=False)
        return target

    def remove(self) -> None:
        self.storage.layout.tree.remove(self.dir)


def _snapshot_task(
    storage: TreeStorage, scope: Scope, task_id: str
) -> tuple[_Snapshot, list[str]] | None:
    """Link a task's records and the artifacts they list; return the member tails in order."""
    tree = storage.layout.tree
    task_dir = storage.layout.task_dir(scope, task_id)
    with storage.tasks.txns.locked(Key(scope, task_id)):
        if not tree.is_dir(task_dir):
            return None  # deleted since the listing
        snapshot = _Snapshot(storage, task_id)
        tails: list[str] = []
        try:
            for entry in tree.entries(task_dir):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
                if entry.name == TASK_RECORD and entry.is_file:
                    snapshot.link(entry.path, TASK_RECORD)
                    tails.append(TASK_RECORD)
            for entry in tree.entries(task_dir):
                match = TURN_DIR_RE.fullmatch(entry.name)
                if match and entry.is_dir:
                    tails += _snapshot_turn(storage, snapshot, entry.path, int(match.group(1)))
        except BaseException:
            snapshot.remove()
            raise
    if not any(tail.endswith(TURN_META) for tail in tails):
        snapshot.remove()  # no committed turn: not a task yet (a first write that died)
        return None
    return snapshot, tails


def _snapshot_turn(
    storage: TreeStorage, snapshot: _Snapshot, turn_dir: Path, turn: int
) -> list[str]:
    for entry in storage.layout.tree.entries(turn_dir):
        if entry.is_link:
            _refuse_link(storage, entry.path)
    record = read_turn(turn_dir)
    if record is None:
        return []  # no commit point: not part of the task
    prefix = turn_dirname(turn)
    tails = [f"{prefix}/{TURN_META}"]
    snapshot.link(turn_dir / TURN_META, tails[0])
    artifacts = turn_dir / ARTIFACTS_DIR
    if record.artifacts:
        for entry in storage.layout.tree.entries(artifacts):
            if entry.is_link:
                _refuse_link(storage, entry.path)
    for info in record.artifacts:
        tail = f"{prefix}/{ARTIFACTS_DIR}/{info.name}"
        st = storage.layout.tree.lstat(artifacts / info.name)
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ArchiveError(
                f"{turn_dir.relative_to(storage.layout.root)}: artifact {info.name} is listed"
                " but missing; run `flask --app wsgi fsck --repair` first"
            )
        snapshot.link(artifacts / info.name, tail)
        tails.append(tail)
    return tails


def _export_task(storage: TreeStorage, writer: BackupWriter, scope: Scope, task_id: str) -> None:
    taken = _snapshot_task(storage, scope, task_id)
    if taken is None:
        return
    snapshot, tails = taken
    try:
        turn_records = {}
        for tail in tails:
            name = task_member(scope.tenant, scope.project, task_id, tail)
            path = snapshot.dir / tail
            if "/artifacts/" not in tail:
                data = path.read_bytes()
                writer.add(name, data)
                if tail.endswith(TURN_META):
                    turn_records[tail.split("/")[0]] = read_turn(path.parent)
                continue
            turn_prefix, _, artifact = tail.partition(f"/{ARTIFACTS_DIR}/")
            record = turn_records[turn_prefix]
            assert record is not None
            info = next(a for a in record.artifacts if a.name == artifact)
            with open(path, "rb") as fh:
                writer.add_stream(name, fh, info.size, info.sha256)
    finally:
        snapshot.remove()


def _export_store(storage: TreeStorage, writer: BackupWriter, scope: Scope, store_id: str) -> None:
    layout, tree = storage.layout, storage.layout.tree
    store_dir = layout.store_dir(scope, store_id)
    with storage.stores.txns.locked(Key(scope, store_id)):
        if not tree.is_dir(store_dir):
            return
        snapshot = _Snapshot(storage, store_id)
        tails = []
        try:
            for entry in tree.entries(store_dir):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
            record = layout.store_record(store_dir)
            snapshot.link(record, STORE_RECORD)
            tails.append(STORE_RECORD)
            for entry in tree.entries(layout.versions_dir(store_dir)):
                if entry.is_link:
                    _refuse_link(storage, entry.path)
                stem = entry.name.removesuffix(".json")
                if entry.is_file and VERSION_ID_RE.fullmatch(stem) and entry.name.endswith(".json"):
                    tail = f"versions/{entry.name}"
                    snapshot.link(entry.path, tail)
                    tails.append(tail)
        except BaseException:
            snapshot.remove()
            raise
    try:
        for tail in tails:
            writer.add(
                store_member(scope.tenant, scope.project, store_id, tail),
                (snapshot.dir / tail).read_bytes(),
            )
    finally:
        snapshot.remove()


def _scopes(storage: TreeStorage, tenant: str | None, project: str | None) -> Iterator[Scope]:
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


def _ids(storage: TreeStorage, directory: Path) -> list[str]:
    found = []
    for entry in storage.layout.tree.entries(directory):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_link:
            _refuse_link(storage, entry.path)
        if not entry.is_dir:
            continue
        try:
            found.append(validate_id("id", entry.name))
        except StorageError:
            continue
    return found


def export_tree(
    storage: TreeStorage, out: Path, *, tenant: str | None = None, project: str | None = None
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
            except BaseException:
                writer.abandon()
                raise
    except UnsafePath as exc:
        raise ArchiveError(f"{exc} (fsck lists every link: remove them and export again)") from None
    return ExportSummary(out, manifest["counts"], manifest["members"])


def _write(
    storage: TreeStorage, writer: BackupWriter, tenant: str | None, project: str | None
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
