"""Import a backup into the tree: all of it, or nothing.

The backup is read once, as a stream (core/archive.py checks every member and
the manifest). Each member is written under a staging directory of the root
(``<root>/.~tmp-import-<ulid>/``), checked again by what it is (a turn record names its own
task and turn and lists exactly the artifacts that follow it; a version record names its
own id and store), and each task's and store's derived files are built there as soon as
its last member has passed. Only when the whole backup has passed, and the staged tree is
durable (one ``syncfs``, or an fsync of each file and directory where ``syncfs`` is no
barrier: tree/fs/atomic.py), are tasks and stores renamed into place, each under its own
lock, a batch of tasks at a time: a batch's renames are made durable by one flush, then its
listing rows are written in one transaction. A refusal at any point before that removes the
staging directory: nothing of the backup was ever visible. A crash before publishing leaves
only the staging directory, which the sweeper and fsck remove once it is older than their
grace; a crash while publishing leaves the tasks and stores renamed so far in place, each
whole, and the last batch's listing rows unwritten, which ``fsck --repair`` writes (or the
import is run again with ``--overwrite``).
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ulid import ULID

from app.storage.core.archive import (
    CHUNK,
    ArchiveError,
    BackupReader,
    ImportSummary,
    Member,
    MemberName,
)
from app.storage.core.digest import Section
from app.storage.core.encoding import dumps
from app.storage.core.errors import StorageError
from app.storage.core.files import DIR_MODE, FILE_MODE
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.models import TurnRecord
from app.storage.core.names import (
    ARTIFACTS_DIR,
    STORE_RECORD,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    TURN_META,
    TURN_SUMMARY,
    VERSIONS_DIR,
    Scope,
    turn_dirname,
)
from app.storage.core.records import turn_usage
from app.storage.core.restore import Group, Record, Restore
from app.storage.core.usage import TurnUsage
from app.storage.tree.backup import TreeBackups
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.sync import fsync_dir_fd, group_commit, sync_tree
from app.storage.tree.fs.txn import Key
from app.storage.tree.records import build_index, index_rows, read_json, read_turn
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.sqlite.turn_search import TurnText, turn_text

_PUBLISH_BATCH = 1000


class _Importer(Restore):
    def __init__(
        self, storage: TreeBackups, *, tenant: str | None, project: str | None, overwrite: bool
    ) -> None:
        super().__init__(
            tenant=tenant, project=project, max_artifact_bytes=storage.tasks.max_artifact_bytes
        )
        self.storage = storage
        self.layout = storage.layout
        self.overwrite = overwrite
        # What was staged is named by the staging directory itself, read back in batches, so
        # memory stays flat whatever the number of tasks: here only the projects and counts.
        self.scopes: dict[str, set[Scope]] = {"tasks": set(), "stores": set()}
        self.counts = {"tasks": 0, "stores": 0}
        self.kept: list[str] = []  # tasks created while the import ran (publish_task)
        root = self.layout.check_inside(self.layout.root)
        self.staging = root / f"{TMP_PREFIX}import-{ULID()}"
        self.dir = self.staging  # the staged directory of the task or store in progress
        self.turns: list[TurnRecord] = []  # its turn records, as they passed
        self.task_record: dict[str, Any] | None = None  # its task.json
        self.empty_root = not any(True for _ in self.layout.projects([]))

    # -- staging --------------------------------------------------------------------------
    def begin(self, group: Group) -> None:
        scope = group.scope
        kind = "stores" if group.kind == "store" else "tasks"
        directory = self.staging / kind / scope.tenant / scope.project / group.owner
        os.makedirs(directory, DIR_MODE, exist_ok=True)  # no fsync: sync_tree() covers it
        self.dir = directory
        self.turns = []
        self.task_record = None

    def stage(self, group: Group, member: Member) -> bytes | None:
        # Paths as strings: a few joins per member, on the import's hottest loop.
        name = member.name
        directory = str(self.dir)
        if name.kind == "task":
            parent, leaf = directory, TASK_RECORD
        elif name.kind == "turn":
            parent, leaf = f"{directory}/{turn_dirname(name.turn)}", TURN_META
        elif name.kind == "artifact":
            parent = f"{directory}/{turn_dirname(name.turn)}/{ARTIFACTS_DIR}"
            leaf = name.leaf
        elif name.kind == "store":
            parent, leaf = directory, STORE_RECORD
        else:
            parent, leaf = f"{directory}/{VERSIONS_DIR}", f"{name.leaf}.json"
        if parent != directory:
            try:
                os.mkdir(parent, DIR_MODE)
            except FileExistsError:
                pass  # a second member of the turn, or a second version
            except FileNotFoundError:  # an artifact's turn directory: made with the meta
                os.makedirs(parent, DIR_MODE, exist_ok=True)
        return _write_new(f"{parent}/{leaf}", member)

    def store_done(self, group: Group) -> None:
        self.storage.stores.rebuild(self.dir)
        self.scopes["stores"].add(group.scope)
        self.counts["stores"] += 1

    def record(self, group: Group, name: MemberName, record: Record) -> None:
        # The task in progress only: its derived files are built from these at its end.
        if isinstance(record, TurnRecord):
            self.turns.append(record)
        elif name.kind == "task" and isinstance(record, dict):
            self.task_record = record

    def task_done(self, group: Group) -> None:
        self.build_derived(group)
        self.scopes["tasks"].add(group.scope)
        self.counts["tasks"] += 1

    def build_derived(self, group: Group) -> None:
        """index.json and each turn's summary.md, from the task's records as they passed.

        New files of the staging directory, written once: nobody reads them before the
        staged tree is synced and renamed into place."""
        directory = str(self.dir)
        for record in self.turns:
            path = f"{directory}/{turn_dirname(record.turn)}/{TURN_SUMMARY}"
            _write_file(path, record.summary_md.encode("utf-8"))
        index = build_index(group.owner, self.task_record, self.turns)
        _write_file(f"{directory}/{TASK_INDEX}", dumps(index))

    # -- publishing -----------------------------------------------------------------------
    def staged_dir(self, kind: str, scope: Scope) -> Path:
        return self.staging / kind / scope.tenant / scope.project

    def staged(self, kind: str, scope: Scope) -> Iterator[str]:
        """The names of the tasks or stores staged for ``scope``, read as a stream (never
        through a link: the staging directory is under the root people touch)."""
        return self.layout.tree.subdir_names(self.staged_dir(kind, scope))

    def targets(self) -> Iterator[tuple[Scope, Path]]:
        layout = self.layout
        for scope in self.scopes["tasks"]:
            for task_id in self.staged("tasks", scope):
                yield scope, layout.task_dir(scope, task_id)
        for scope in self.scopes["stores"]:
            for store_id in self.staged("stores", scope):
                yield scope, layout.store_dir(scope, store_id)

    def conflicts(self) -> None:
        layout, tree = self.layout, self.layout.tree
        for scope in self.scopes["tasks"] | self.scopes["stores"]:
            try:
                layout.check_inside(layout.stores_dir(scope))
            except StorageError:
                raise ArchiveError(
                    f"{scope.tenant}/{scope.project}: a symlink is on the way; the import never"
                    " follows one (remove it and import again). Nothing was imported."
                ) from None
        taken: list[str] = []
        count = 0
        for scope, target in self.targets():
            st = tree.lstat(target)
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise ArchiveError(
                    f"{target.relative_to(layout.root)} is a symlink; the import never replaces"
                    " or follows one (remove it and import again). Nothing was imported."
                )
            count += 1
            if len(taken) < 10:
                taken.append(f"{scope.tenant}/{scope.project}/{target.name}")
        if count and not self.overwrite:
            raise ArchiveError(
                f"{count} task(s) or store(s) already exist: {', '.join(taken)}; pass"
                " --overwrite to replace them. Nothing was imported."
            )

    def publish(self) -> None:
        for scope in self.scopes["tasks"]:
            self.publish_tasks(scope)
        for scope in self.scopes["stores"]:
            for store_id in self.batch("stores", scope):
                self.publish_store(scope, store_id)

    def batch(self, kind: str, scope: Scope) -> Iterator[str]:
        """Every staged name of ``scope``, taken a batch at a time from a fresh read of the
        directory (each batch leaves it as it is published)."""
        while names := list(itertools.islice(self.staged(kind, scope), _PUBLISH_BATCH)):
            yield from names

    def publish_tasks(self, scope: Scope) -> None:
        tasks, layout = self.storage.tasks, self.layout
        project_dir = layout.check_inside(layout.project_dir(scope))
        make_dirs(project_dir, layout.root)
        now_us = tasks.now_us()
        # Listing, search and digest rows a batch at a time: memory stays flat. Each batch's
        # transactions share one flush (they join its group-commit block), made before the
        # batch's listing rows are written.
        staged_project = self.staged_dir("tasks", scope)
        while task_ids := list(itertools.islice(self.staged("tasks", scope), _PUBLISH_BATCH)):
            rows: dict[str, tuple[list[TurnRow], Section | None]] = {}
            texts: dict[str, dict[int, TurnText]] = {}
            usage: dict[str, list[TurnUsage]] = {}
            entries: dict[str, list[LedgerTurn]] = {}
            with (
                group_commit(layout.root),
                layout.tree.opened(staged_project) as src,
                layout.tree.opened(project_dir) as dst,
            ):
                if src is None or dst is None:
                    raise ArchiveError(f"{scope.tenant}/{scope.project}: removed during the import")
                for task_id in task_ids:
                    published = self.publish_task(scope, task_id, now_us, src, dst)
                    if published is None:
                        continue
                    records, rows[task_id] = published
                    # What search finds each turn by and what it stores, written with the
                    # listing rows.
                    texts[task_id] = {r.turn: turn_text(r) for r in records}
                    usage[task_id] = [turn_usage(r) for r in records]
                    entries[task_id] = [entry_of(r) for r in records]
                # The renames are durable before any listing row names them.
                fsync_dir_fd(dst)
            tasks.listing(scope).set_tasks(rows, texts=texts, usage=usage)
            tasks.ledger(scope).set_tasks(entries)
        # Tasks it replaced (--overwrite): their text leaves the files, as after a delete.
        tasks.removals.purge(scope)
        tasks.compact_digest(scope)

    def publish_task(
        self, scope: Scope, task_id: str, now_us: int, src: int, dst: int
    ) -> tuple[tuple[TurnRecord, ...], tuple[list[TurnRow], Section | None]] | None:
        """Rename one staged task from the directory ``src`` into ``dst`` (its project's)
        under its lock, replacing the task of its id under ``--overwrite``.

        Without it, a task of that id was not there when the import checked (conflicts()),
        so one found now was created while the import ran: it is kept, with whatever was
        acknowledged to its writer, and the backup's copy is left out (None)."""
        tasks, layout = self.storage.tasks, self.layout
        target = layout.task_dir(scope, task_id)
        with tasks.txns(Key(scope, task_id)) as txn:
            exists = layout.tree.lstat(target) is not None
            published = None
            if exists and not self.overwrite:
                self.kept.append(f"{scope.tenant}/{scope.project}/{task_id}")
                # The staged copy goes: the batches read the staging until it is empty.
                drop: Path | None = self.staged_dir("tasks", scope) / task_id
            else:
                txn.begin()
                drop = tasks.trash(target) if exists else None
                os.rename(task_id, task_id, src_dir_fd=src, dst_dir_fd=dst)
                published = self.published(scope, task_id, now_us)
        if drop is not None:
            layout.tree.remove(drop)  # outside the lock
        return published

    def published(
        self, scope: Scope, task_id: str, now_us: int
    ) -> tuple[tuple[TurnRecord, ...], tuple[list[TurnRow], Section | None]]:
        """A task just renamed into place: its records, listing rows and digest section."""
        target = self.layout.task_dir(scope, task_id)
        index = read_json(target / TASK_INDEX)
        assert isinstance(index, dict)  # built by build_derived before the rename
        records = tuple(
            record
            for entry in index["turns"]
            if (record := read_turn(target / turn_dirname(entry["turn"])))
        )
        section = self.storage.tasks.section(scope, task_id, index, now_us, records)
        return records, (index_rows(index), section)

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


def _write_new(path: str, member: Member) -> bytes | None:
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


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def import_tree(
    storage: TreeBackups,
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
            importer.end()
            importer.conflicts()
        except StorageError as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise ArchiveError(str(exc)) from None
        # The staged tree is durable before any of it shows.
        sync_tree(importer.staging, storage.layout.tree)
        importer.publish()
        importer.restore_key()
    finally:
        storage.layout.tree.remove(importer.staging)
    return ImportSummary(
        importer.counts["tasks"] - len(importer.kept),
        importer.counts["stores"],
        reader.counts.as_dict(),
        tuple(importer.kept),
    )
