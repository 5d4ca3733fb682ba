"""fsck's part over each task directory, under the task's lock: its records (``task.json``,
each turn's ``meta.json``), the artifact bytes they list, and the derived files beside them
(``index.json``, ``summary.md``) against a rebuild from the records. The walk of the tree
and the reporting are fsck.py's; the task's listing and search rows are compared by
fsck_listing.py with the rows and texts this returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Protocol

from app.storage.core.errors import Corrupt, InvalidName, LockTimeout, Unreadable, UnsafePath
from app.storage.core.ledger import LedgerTurn, entry_of
from app.storage.core.models import TurnRecord
from app.storage.core.names import (
    ARTIFACTS_DIR,
    PREV_PREFIX,
    TASK_INDEX,
    TASK_RECORD,
    TMP_PREFIX,
    TURN_DIR_RE,
    TURN_META,
    TURN_SUMMARY,
    Scope,
    turn_dirname,
    validate_artifact_name,
)
from app.storage.core.record_rules import check_turn_record
from app.storage.core.records import turn_to_json
from app.storage.tree.fs.layout import Layout
from app.storage.tree.fs.noatime import sha256_file
from app.storage.tree.fs.sync import fsync_dir
from app.storage.tree.fs.txn import Key
from app.storage.tree.fs.walk import Entry, Tree
from app.storage.tree.records import (
    build_index,
    index_rows,
    read_json,
    read_task_record,
    read_turn,
    rebuild_index,
    write_json,
)
from app.storage.tree.sqlite import turn_search
from app.storage.tree.sqlite.listing_sql import TurnRow
from app.storage.tree.tasks import TaskStore

# What a task's check returns when something in it could not be read: nothing about it is
# compared or repaired, its listing and search rows included.
NOT_READ: list[TurnRow] = []
# What a task's records say its derived rows are: listing rows (None: no task), search-text
# digests by turn, ledger entries in turn order.
Expected = tuple[list[TurnRow] | None, dict[int, str], list[LedgerTurn]]


class TaskWalk(Protocol):
    """What the task checks need of fsck's walk (fsck.py ``_Fsck``): the tree, the task
    engine, whether it repairs, and how a fault, a temp file, an unknown entry, a link and
    an unreadable file are reported (and repaired)."""

    layout: Layout
    tree: Tree
    store: TaskStore
    repair: bool

    def rel(self, path: Path) -> str: ...

    def fault(self, message: str, fix: Callable[[], object] | None = None) -> bool: ...

    def done(self, past: str, future: str) -> str: ...

    def unreadable(self, exc: Unreadable, what: str = "") -> None: ...

    def entries(self, directory: Path) -> list[Entry]: ...

    def common(self, entry: Entry, *, in_task: bool = False) -> bool: ...

    def temp(self, path: Path, *, in_task: bool = False) -> None: ...

    def unindexed(self, path: Path, why: str = "not part of the layout") -> None: ...

    def symlink(self, path: Path) -> None: ...

    def quarantine(self, path: Path) -> Path: ...

    def task_locked(self, scope: Scope, task_id: str) -> AbstractContextManager[None]: ...


class TaskCheck:
    """The task checks of one fsck run."""

    def __init__(self, check: TaskWalk) -> None:
        self.check = check
        self.layout = check.layout
        self.tree = check.tree
        self.store = check.store

    def task(self, scope: Scope, task_id: str) -> Expected:
        """The task's listing rows, search-text digests and ledger entries as its records
        say."""
        try:
            with self.check.task_locked(scope, task_id):
                return self._check_locked(scope, task_id)
        except LockTimeout:
            # Held for longer than any write takes: report it rather than stop the check.
            self.check.fault(f"{scope.tenant}/{scope.project}/{task_id}: lock busy, not checked")
        except UnsafePath as exc:
            self.check.fault(f"{scope.tenant}/{scope.project}/{task_id}: not checked ({exc})")
        except Unreadable as exc:
            self.check.unreadable(exc, f"task {task_id} was neither checked nor changed")
            return NOT_READ, {}, []
        return None, {}, []

    def rebuild(self, scope: Scope, task_id: str) -> None:
        """Rebuild the task's derived files from its records and clear a write a dead writer
        left in flight on it (the caller holds the task's lock)."""
        task_dir = self.layout.task_dir(scope, task_id)
        try:
            read_json(task_dir / TASK_INDEX)
        except Corrupt:
            # repair_task compares with the current index.json and cannot parse a torn one.
            index = rebuild_index(self.tree, task_dir, task_id)
            if index is not None:
                write_json(task_dir / TASK_INDEX, index)
        self.store.repair_task(scope, task_id)
        self.store.txns.settle(Key(scope, task_id))

    def _check_locked(self, scope: Scope, task_id: str) -> Expected:
        task_dir = self.layout.task_dir(scope, task_id)
        if not self.tree.is_dir(task_dir):
            return None, {}, []
        rel = self.check.rel(task_dir)
        rebuild = lambda: self.rebuild(scope, task_id)  # noqa: E731
        if self.store.txns.is_pending(Key(scope, task_id)):
            # Before anything collects temp files: the dead writer's kept copy of a committed
            # artifact (.~tmp-prev-*) is a temp file, and the rebuild puts it back in place.
            self.check.fault(f"{rel}: write in flight left by a writer that died", rebuild)
        records: list[TurnRecord] = []
        for entry in self.check.entries(task_dir):
            if self.check.common(entry, in_task=True):
                continue
            name = entry.name
            if name in (TASK_RECORD, TASK_INDEX) and entry.is_file:
                continue
            match = TURN_DIR_RE.fullmatch(name)
            if match and entry.is_dir:
                record = self.turn(task_id, int(match.group(1)), entry.path)
                if record is not None:
                    records.append(record)
            else:
                self.check.unindexed(entry.path)
        task_record = self.task_record(task_id, task_dir, records)
        if not records:
            self.check.unindexed(task_dir, "a task directory without any turn record")
            if self.check.repair:
                self.rebuild(scope, task_id)  # drop its listing rows
            return None, {}, []
        index = build_index(task_id, task_record, records)
        try:
            current = read_json(task_dir / TASK_INDEX)
        except Corrupt:
            current = "torn"
        if current != index:
            state = "missing" if current is None else "torn" if current == "torn" else "stale"
            self.check.fault(f"{rel}/{TASK_INDEX}: {state}, differs from a rebuild", rebuild)
        for record in records:
            turn_dir = task_dir / turn_dirname(record.turn)
            try:
                summary = self.layout.read_bytes(turn_dir / TURN_SUMMARY)
            except UnsafePath:
                continue  # a planted link, reported where the turn's entries were read
            if summary != record.summary_md.encode("utf-8"):
                self.check.fault(
                    f"{self.check.rel(turn_dir)}/{TURN_SUMMARY}: differs from meta.json", rebuild
                )
        return (
            index_rows(index),
            {r.turn: turn_search.turn_text(r).digest() for r in records},
            [entry_of(r) for r in sorted(records, key=lambda r: r.turn)],
        )

    def task_record(
        self, task_id: str, task_dir: Path, records: list[TurnRecord]
    ) -> dict[str, object] | None:
        path = task_dir / TASK_RECORD
        try:
            record = read_task_record(task_dir)
        except UnsafePath:
            return None  # a planted link, reported with the task's entries; never read
        except Corrupt as exc:
            record, problem = None, f"{self.check.rel(path)}: torn ({exc})"
        else:
            if record is not None or not records:
                return record
            problem = f"{self.check.rel(path)}: missing"
        rebuilt = {
            "version": 1,
            "task_id": task_id,
            "owner": None,  # unknown: only admins may delete the task from now on
            "created_at": min(r.created_at for r in records) if records else "",
        }

        def fix() -> None:
            if self.tree.lstat(path) is not None:
                self.check.quarantine(path)
            write_json(path, rebuilt)

        if records:
            rewritten = self.check.done("rewritten", "--repair rewrites it")
            self.check.fault(f"{problem}; {rewritten} from the turns with no owner", fix)
        return rebuilt if records else record

    def turn(self, task_id: str, turn: int, turn_dir: Path) -> TurnRecord | None:
        rel = self.check.rel(turn_dir)
        move = lambda: self.check.quarantine(turn_dir)  # noqa: E731
        entries = self.check.entries(turn_dir)
        if any(e.name == TURN_META and e.is_link for e in entries):
            self.check.symlink(turn_dir / TURN_META)
            return None  # the turn cannot be checked until a person removes the link
        try:
            record = read_turn(turn_dir)
        except Corrupt as exc:
            moved = self.check.done("turn quarantined", "--repair quarantines the turn")
            self.check.fault(f"{rel}/{TURN_META}: cannot be rebuilt ({exc}); {moved}", move)
            return None
        if record is None:
            if self.only_temp_files(turn_dir):
                # A put_turn killed before its commit: nothing in it was ever acknowledged,
                # so there is nothing for a person to inspect in lost+found.
                self.check.fault(
                    f"{rel}: unfinished turn of a writer that died"
                    f" ({self.check.done('removed', '--repair removes it')})",
                    lambda: self.tree.remove(turn_dir),
                )
            else:
                self.check.unindexed(turn_dir, "a turn directory without meta.json")
            return None
        if record.turn != turn or record.task_id != task_id:
            self.check.fault(
                f"{rel}/{TURN_META}: names task {record.task_id} turn {record.turn}", move
            )
            return None
        try:
            check_turn_record(record, max_artifact_bytes=self.store.max_artifact_bytes)
        except InvalidName as exc:
            # Brought in by hand or by an older import: reported, never rewritten or moved (a
            # person decides what it should say); the rest is checked as for any record.
            self.check.fault(f"{rel}/{TURN_META}: {exc} (not a record the API would write)")
        files: dict[str, Path] = {}
        kept: dict[str, Path] = {}
        for entry in entries:
            if self.check.common(entry, in_task=True):
                continue
            if entry.name in (TURN_META, TURN_SUMMARY) and entry.is_file:
                continue
            if entry.name == ARTIFACTS_DIR and entry.is_dir:
                for art in self.check.entries(entry.path):
                    if art.name.startswith(PREV_PREFIX) and art.is_file and not art.is_link:
                        kept[art.name[len(PREV_PREFIX) :]] = art.path
                    elif self.check.common(art, in_task=True):
                        continue
                    elif entry_is_artifact(art):
                        files[art.name] = art.path
                    else:
                        self.check.unindexed(art.path)
                continue
            self.check.unindexed(entry.path)
        return self.artifacts(record, turn_dir, files, kept)

    def artifacts(
        self, record: TurnRecord, turn_dir: Path, files: dict[str, Path], kept: dict[str, Path]
    ) -> TurnRecord:
        """Check each artifact's bytes against meta.json. ``kept``: the previous copies an
        artifact replacement keeps until its commit; when the commit was lost (a kill, or a
        power cut that also took the journal slot saying a write was in flight) the file holds
        bytes never acknowledged and the kept copy the acknowledged ones, which go back."""
        bad: set[str] = set()
        for info in record.artifacts:
            path = files.pop(info.name, None)
            where = f"{self.check.rel(turn_dir)}/{ARTIFACTS_DIR}/{info.name}"
            wanted = (info.size, info.sha256)
            try:
                if path is not None and sha256_file(path) == wanted:
                    continue
                backup = kept.pop(info.name, None)
                restore = backup is not None and sha256_file(backup) == wanted
            except Unreadable as exc:
                self.check.unreadable(exc, "its entry and its bytes are kept as they are")
                continue
            if backup is not None and restore:
                target = turn_dir / ARTIFACTS_DIR / info.name
                self.check.fault(
                    f"{where}: bytes of a replacement never committed; the acknowledged copy "
                    "kept beside it is put back",
                    partial(_put_back, backup, target),
                )
                continue
            if path is None:
                dropped = self.check.done("entry dropped", "--repair drops the entry")
                self.check.fault(
                    f"{where}: listed in meta.json but missing; {dropped}", lambda: None
                )
            else:
                moved = self.check.done("file quarantined", "--repair quarantines the file")
                self.check.fault(
                    f"{where}: size/sha256 differ from meta.json; {moved}",
                    partial(self.check.quarantine, path),
                )
            bad.add(info.name)
        for backup in kept.values():
            self.check.temp(backup, in_task=True)
        for path in files.values():
            self.check.unindexed(path, "an artifact file meta.json does not list")
        if not bad or not self.check.repair:
            return record
        fixed = replace(record, artifacts=tuple(a for a in record.artifacts if a.name not in bad))
        write_json(turn_dir / TURN_META, turn_to_json(fixed))
        return fixed

    def only_temp_files(self, directory: Path) -> bool:
        """True when ``directory`` holds nothing but temp files and empty directories."""
        for step in self.tree.walk(directory):
            for entry in step.entries:
                if entry.is_link or (not entry.is_dir and not entry.name.startswith(TMP_PREFIX)):
                    return False
        return True


def entry_is_artifact(entry: Entry) -> bool:
    try:
        validate_artifact_name(entry.name)
    except InvalidName:
        return False
    return entry.is_file


def _put_back(backup: Path, target: Path) -> None:
    os.replace(backup, target)
    fsync_dir(target.parent)
