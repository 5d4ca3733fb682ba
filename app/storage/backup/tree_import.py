"""Import a backup into the tree: all of it, or nothing.

The backup is read once, as a stream (app/storage/backup/format.py checks every member and
the manifest). Each member is written under a staging directory of the root
(``<root>/.~tmp-import-<ulid>/``), checked again by what it is (a turn record names its own
task and turn and lists exactly the artifacts that follow it; a version record names its
own id and store), and each task's and store's derived files are built there as soon as
its last member has passed. Only when the whole backup has passed, and one ``syncfs`` has
made the staged tree durable, are tasks and stores renamed into place, one lock at a time,
and the listings updated in one transaction per project. A refusal at any point before that
removes the staging directory: nothing of the backup was ever visible. A crash leaves only
the staging directory, which the sweeper and fsck remove once it is older than their grace.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ulid import ULID

from ..atomic import DIR_MODE, FILE_MODE, make_dirs, sync_filesystem, write_atomic
from ..errors import Corrupt, StorageError
from ..layout import (
    ARTIFACTS_DIR,
    TASK_INDEX,
    TMP_PREFIX,
    TURN_META,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
)
from ..memstores.records import StoreRecord, VersionRecord
from ..records import (
    build_index,
    index_rows,
    read_json,
    read_task_record,
    read_turn,
    turn_from_json,
    turn_usage,
    write_json,
)
from ..txn import Key
from ..usage import TurnUsage
from .format import CHUNK, ArchiveError, BackupReader, Member, MemberName

if TYPE_CHECKING:
    from ..facade import TreeStorage

_KIND_RANK = {"task": 0, "turn": 0, "artifact": 0, "store": 1, "version": 1}


@dataclass(frozen=True, slots=True)
class ImportSummary:
    tasks: int
    stores: int
    counts: dict[str, int]


@dataclass
class _Group:
    """The task or store whose members are streaming past (they arrive together)."""

    key: tuple[str, str, int, str]
    kind: str
    scope: Scope
    owner: str
    dir: Path
    turns: dict[int, dict[str, tuple[int, str]]] = field(default_factory=dict)
    artifacts: dict[int, dict[str, tuple[int, str]]] = field(default_factory=dict)
    has_record: bool = False


class _Importer:
    def __init__(
        self, storage: TreeStorage, *, tenant: str | None, project: str | None, overwrite: bool
    ) -> None:
        self.storage = storage
        self.layout = storage.layout
        self.target = None if tenant is None else Scope(tenant, project or "")
        if (tenant is None) != (project is None):
            raise ArchiveError("--tenant and --project go together")
        self.overwrite = overwrite
        self.source: Scope | None = None
        self.group: _Group | None = None
        self.tasks: list[tuple[Scope, str]] = []
        self.stores: list[tuple[Scope, str]] = []
        root = self.layout.check_inside(self.layout.root)
        self.staging = root / f"{TMP_PREFIX}import-{ULID()}"
        self.key: bytes | None = None
        self.empty_root = not any(True for _ in self.layout.projects([]))

    # -- staging --------------------------------------------------------------------------
    def scope_of(self, name: MemberName) -> Scope:
        source = Scope(name.tenant, name.project)
        if self.target is None:
            return source
        if self.source is not None and source != self.source:
            raise ArchiveError(
                "the backup holds more than one project: --tenant/--project only apply to a"
                " backup of one project"
            )
        self.source = source
        return self.target

    def member(self, member: Member) -> None:
        name = member.name
        if name.kind == "key":
            self.key = member.stream.read(member.size)
            return
        scope = self.scope_of(name)
        key = (scope.tenant, scope.project, _KIND_RANK[name.kind], name.owner)
        if self.group is None or self.group.key != key:
            if self.group is not None and key < self.group.key:
                raise ArchiveError(f"{name.name}: members out of order (a task or store is split)")
            self.finish_group()
            self.group = self.start_group(name, scope, key)
        self.stage(self.group, member)

    def start_group(self, name: MemberName, scope: Scope, key: tuple[str, str, int, str]) -> _Group:
        if name.kind in ("store", "version"):
            directory = self.staging / "stores" / scope.tenant / scope.project / name.owner
        else:
            directory = self.staging / "tasks" / scope.tenant / scope.project / name.owner
        make_dirs(directory, self.staging)
        kind = "store" if name.kind in ("store", "version") else "task"
        return _Group(key, kind, scope, name.owner, directory)

    def stage(self, group: _Group, member: Member) -> None:
        name = member.name
        if name.kind == "task":
            path = group.dir / "task.json"
        elif name.kind == "turn":
            path = group.dir / turn_dirname(name.turn) / TURN_META
        elif name.kind == "artifact":
            path = group.dir / turn_dirname(name.turn) / ARTIFACTS_DIR / name.leaf
        elif name.kind == "store":
            path = group.dir / "store.json"
        else:
            path = group.dir / "versions" / f"{name.leaf}.json"
        if path.parent != group.dir:
            os.makedirs(path.parent, DIR_MODE, exist_ok=True)
        data = _write_new(path, member)
        if name.kind == "artifact":
            group.artifacts.setdefault(name.turn, {})[name.leaf] = (member.size, member.sha256)
        elif data is not None:
            self.check_record(group, name, data)

    def check_record(self, group: _Group, name: MemberName, data: bytes) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            raise ArchiveError(f"{name.name}: not valid JSON") from None
        try:
            if name.kind == "task":
                if not isinstance(obj, dict) or obj.get("task_id", group.owner) != group.owner:
                    raise ArchiveError(f"{name.name}: not the record of task {group.owner}")
                group.has_record = True
            elif name.kind == "turn":
                record = turn_from_json(obj, name.name)
                if record.task_id != group.owner or record.turn != name.turn:
                    raise ArchiveError(
                        f"{name.name}: names task {record.task_id} turn {record.turn}"
                    )
                group.turns[name.turn] = {a.name: (a.size, a.sha256) for a in record.artifacts}
            elif name.kind == "store":
                store = StoreRecord.from_json(obj, Path(name.name))
                if store.id != group.owner:
                    raise ArchiveError(f"{name.name}: names store {store.id}")
                group.has_record = True
            else:
                version = VersionRecord.from_json(obj, Path(name.name))
                if version.id != name.leaf or version.memory_store_id not in ("", group.owner):
                    raise ArchiveError(f"{name.name}: names version {version.id}")
        except Corrupt as exc:
            raise ArchiveError(str(exc)) from None

    def finish_group(self) -> None:
        group = self.group
        if group is None:
            return
        self.group = None
        if group.kind == "store":
            if not group.has_record:
                raise ArchiveError(f"store {group.owner}: no store.json")
            self.storage.stores.rebuild(group.dir)
            self.stores.append((group.scope, group.owner))
            return
        for turn, listed in sorted(group.turns.items()):
            if group.artifacts.get(turn, {}) != listed:
                raise ArchiveError(
                    f"task {group.owner} turn {turn}: its artifacts differ from what meta.json"
                    " lists"
                )
        stray = set(group.artifacts) - set(group.turns)
        if stray:
            raise ArchiveError(f"task {group.owner}: artifacts of a turn with no meta.json")
        if not group.turns:
            raise ArchiveError(f"task {group.owner}: no turn")
        if not group.has_record:
            raise ArchiveError(f"task {group.owner}: no task.json")
        self.build_derived(group)
        self.tasks.append((group.scope, group.owner))

    def build_derived(self, group: _Group) -> None:
        """index.json and each turn's summary.md, from the staged records."""
        records = []
        for turn in sorted(group.turns):
            turn_dir = group.dir / turn_dirname(turn)
            record = read_turn(turn_dir)
            assert record is not None
            records.append(record)
            write_atomic(turn_dir / TURN_SUMMARY, record.summary_md.encode("utf-8"), durable=False)
        index = build_index(group.owner, read_task_record(group.dir), records)
        write_json(group.dir / TASK_INDEX, index, durable=False)

    # -- publishing -----------------------------------------------------------------------
    def conflicts(self) -> None:
        layout, tree = self.layout, self.layout.tree
        for scope in {s for s, _ in self.tasks} | {s for s, _ in self.stores}:
            try:
                layout.check_inside(layout.stores_dir(scope))
            except StorageError:
                raise ArchiveError(
                    f"{scope.tenant}/{scope.project}: a symlink is on the way; the import never"
                    " follows one (remove it and import again). Nothing was imported."
                ) from None
        linked = [
            p
            for p in (
                *(layout.task_dir(s, t) for s, t in self.tasks),
                *(layout.store_dir(s, i) for s, i in self.stores),
            )
            if (st := tree.lstat(p)) is not None and stat.S_ISLNK(st.st_mode)
        ]
        if linked:
            raise ArchiveError(
                f"{linked[0].relative_to(layout.root)} is a symlink; the import never replaces"
                " or follows one (remove it and import again). Nothing was imported."
            )
        taken = [
            f"{s.tenant}/{s.project}/{t}"
            for s, t in self.tasks
            if tree.lstat(layout.task_dir(s, t))
        ]
        taken += [
            f"{s.tenant}/{s.project}/{i}"
            for s, i in self.stores
            if tree.lstat(layout.store_dir(s, i))
        ]
        if taken and not self.overwrite:
            raise ArchiveError(
                f"{len(taken)} task(s) or store(s) already exist: {', '.join(taken[:10])}; pass"
                " --overwrite to replace them. Nothing was imported."
            )

    def publish(self) -> None:
        by_project: dict[Scope, list[str]] = {}
        for scope, task_id in self.tasks:
            by_project.setdefault(scope, []).append(task_id)
        for scope, task_ids in by_project.items():
            self.publish_tasks(scope, task_ids)
        for scope, store_id in self.stores:
            self.publish_store(scope, store_id)

    def publish_tasks(self, scope: Scope, task_ids: list[str]) -> None:
        tasks, layout = self.storage.tasks, self.layout
        project_dir = layout.check_inside(layout.project_dir(scope))
        make_dirs(project_dir, layout.root)
        rows = {}
        usage: dict[str, list[TurnUsage]] = {}
        staged_project = self.staging / "tasks" / scope.tenant / scope.project
        for task_id in task_ids:
            target = layout.task_dir(scope, task_id)
            with tasks.txns(Key(scope, task_id)) as txn:
                txn.begin()
                trashed = tasks.trash(target) if layout.tree.lstat(target) else None
                layout.tree.rename(staged_project / task_id, target)
                index = read_json(target / TASK_INDEX)
                assert isinstance(index, dict)  # built by build_derived before the rename
                rows[task_id] = index_rows(index)
                usage[task_id] = [
                    turn_usage(record)
                    for t in index["turns"]
                    if (record := read_turn(target / turn_dirname(t["turn"]))) is not None
                ]
            if trashed is not None:
                layout.tree.remove(trashed)
        tasks.listing(scope).set_tasks(rows, usage=usage)

    def publish_store(self, scope: Scope, store_id: str) -> None:
        layout = self.layout
        stores_dir = layout.check_inside(layout.stores_dir(scope))
        make_dirs(stores_dir, layout.root)
        target = layout.store_dir(scope, store_id)
        staged = self.staging / "stores" / scope.tenant / scope.project / store_id
        with self.storage.stores.txns.locked(Key(scope, store_id)):
            trashed = self.storage.tasks.trash(target) if layout.tree.lstat(target) else None
            layout.tree.rename(staged, target)
        if trashed is not None:
            layout.tree.remove(trashed)
        self.storage.stores.refresh_usage(scope, store_id)

    def restore_key(self) -> None:
        """A whole-root backup's cursor key, into a root that held nothing before (so the
        cursors the restored server issues are the ones the original issued)."""
        if self.key is not None and self.target is None and self.empty_root:
            write_atomic(self.layout.check_inside(self.layout.cursor_key()), self.key)


def _write_new(path: Path, member: Member) -> bytes | None:
    """Write a member's bytes to a new file (a second member of one name is refused); return
    them when the member is a record (small, parsed next)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        raise ArchiveError(f"{member.name.name}: appears twice") from None
    kept = bytearray() if member.name.record else None
    try:
        while chunk := member.stream.read(CHUNK):
            _write_all(fd, chunk)
            if kept is not None:
                kept += chunk
    finally:
        os.close(fd)
    return None if kept is None else bytes(kept)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def import_tree(
    storage: TreeStorage,
    archive: BinaryIO,
    *,
    tenant: str | None = None,
    project: str | None = None,
    overwrite: bool = False,
) -> ImportSummary:
    """Import a backup, all or nothing; ArchiveError (nothing imported) when it is refused."""
    importer = _Importer(storage, tenant=tenant, project=project, overwrite=overwrite)
    reader = BackupReader(archive, max_artifact_bytes=storage.tasks.max_artifact_bytes)
    os.mkdir(importer.staging, DIR_MODE)
    try:
        try:
            for member in reader.members():
                importer.member(member)
            importer.finish_group()
            importer.conflicts()
        except StorageError as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise ArchiveError(str(exc)) from None
        sync_filesystem(importer.staging)  # the staged tree is durable before any of it shows
        importer.publish()
        importer.restore_key()
    finally:
        storage.layout.tree.remove(importer.staging)
    return ImportSummary(len(importer.tasks), len(importer.stores), reader.counts.as_dict())
