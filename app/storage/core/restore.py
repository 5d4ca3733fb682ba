"""What every backend's restore checks of a backup (core/archive.py), a task or a store at a
time: a turn record names its own task and turn and lists exactly the artifacts that follow
it, a version record names its own id and store, a task or store arrives whole and in order.
Where the members go is the backend's (tree/restore.py, pg/restore.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.storage.core.archive import ArchiveError, Member, MemberName
from app.storage.core.errors import Corrupt
from app.storage.core.models import TurnRecord
from app.storage.core.names import (
    Scope,
)
from app.storage.core.records import turn_from_json
from app.storage.core.store_records import StoreRecord, VersionRecord

# What a task or a store is made of: the order in which their members arrive is (tenant,
# project, tasks before stores, id); a backup whose members go back in that order splits one.
_KIND_RANK = {"task": 0, "turn": 0, "artifact": 0, "store": 1, "version": 1}
Record = dict[str, Any] | TurnRecord | StoreRecord | VersionRecord


@dataclass
class Group:
    """The task or store whose members are streaming past (they arrive together)."""

    key: tuple[str, str, int, str]
    kind: str  # "task" or "store"
    scope: Scope  # where it goes (the backup's own, or --tenant/--project)
    owner: str  # the task id or the store id
    # turn -> artifact name -> (size, sha256): what each meta.json lists, and what arrived.
    turns: dict[int, dict[str, tuple[int, str]]] = field(default_factory=dict)
    artifacts: dict[int, dict[str, tuple[int, str]]] = field(default_factory=dict)
    has_record: bool = False


class Restore:
    """An import's checks of what the members say, a task or a store at a time; where they
    go is the backend's (the hooks at the end).

    Feed it every member of a :class:`BackupReader`, then call :meth:`end`: each task and
    store is handed to :meth:`task_done` / :meth:`store_done` once its last member has passed
    every check, and ArchiveError is raised at the first one that fails.
    """

    def __init__(self, *, tenant: str | None, project: str | None) -> None:
        if (tenant is None) != (project is None):
            raise ArchiveError("--tenant and --project go together")
        self.target = None if tenant is None else Scope(tenant, project or "")
        self.source: Scope | None = None
        self.group: Group | None = None
        self.key: bytes | None = None  # a whole-root backup's cursor key

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
            self.end()
            kind = "store" if name.kind in ("store", "version") else "task"
            self.group = Group(key, kind, scope, name.owner)
            self.begin(self.group)
        group = self.group
        if self._seen(group, name):
            raise ArchiveError(f"{name.name}: appears twice")
        data = self.stage(group, member)
        if name.kind == "artifact":
            group.artifacts.setdefault(name.turn, {})[name.leaf] = (member.size, member.sha256)
        elif data is not None:
            self.record(group, name, self.check_record(group, name, data))

    @staticmethod
    def _seen(group: Group, name: MemberName) -> bool:
        if name.kind in ("task", "store"):
            return group.has_record
        if name.kind == "turn":
            return name.turn in group.turns
        if name.kind == "artifact":
            return name.leaf in group.artifacts.get(name.turn, {})
        return False  # a version: the backend's staging refuses a second one

    def check_record(self, group: Group, name: MemberName, data: bytes) -> Record:
        """Parse a record and check that it is what its name says."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            raise ArchiveError(f"{name.name}: not valid JSON") from None
        try:
            if name.kind == "task":
                if not isinstance(obj, dict) or obj.get("task_id", group.owner) != group.owner:
                    raise ArchiveError(f"{name.name}: not the record of task {group.owner}")
                group.has_record = True
                return obj
            if name.kind == "turn":
                record = turn_from_json(obj, name.name)
                if record.task_id != group.owner or record.turn != name.turn:
                    raise ArchiveError(
                        f"{name.name}: names task {record.task_id} turn {record.turn}"
                    )
                group.turns[name.turn] = {a.name: (a.size, a.sha256) for a in record.artifacts}
                return record
            if name.kind == "store":
                store = StoreRecord.from_json(obj, Path(name.name))
                if store.id != group.owner:
                    raise ArchiveError(f"{name.name}: names store {store.id}")
                group.has_record = True
                return store
            version = VersionRecord.from_json(obj, Path(name.name))
            if version.id != name.leaf or version.memory_store_id not in ("", group.owner):
                raise ArchiveError(f"{name.name}: names version {version.id}")
            return version
        except Corrupt as exc:
            raise ArchiveError(str(exc)) from None

    def end(self) -> None:
        """Check the group in progress is whole and hand it to the backend."""
        group = self.group
        if group is None:
            return
        self.group = None
        if group.kind == "store":
            if not group.has_record:
                raise ArchiveError(f"store {group.owner}: no store.json")
            self.store_done(group)
            return
        for turn, listed in sorted(group.turns.items()):
            if group.artifacts.get(turn, {}) != listed:
                raise ArchiveError(
                    f"task {group.owner} turn {turn}: its artifacts differ from what meta.json"
                    " lists"
                )
        if set(group.artifacts) - set(group.turns):
            raise ArchiveError(f"task {group.owner}: artifacts of a turn with no meta.json")
        if not group.turns:
            raise ArchiveError(f"task {group.owner}: no turn")
        if not group.has_record:
            raise ArchiveError(f"task {group.owner}: no task.json")
        self.task_done(group)

    # -- the backend's side ----------------------------------------------------------------
    def begin(self, group: Group) -> None:
        """A new task or store starts."""

    def stage(self, group: Group, member: Member) -> bytes | None:
        """Keep ``member`` where the backend stages the import; return a record's bytes
        (None for an artifact)."""
        raise NotImplementedError

    def record(self, group: Group, name: MemberName, record: Record) -> None:
        """A record that passed its checks (``check_record``'s result)."""

    def task_done(self, group: Group) -> None:
        raise NotImplementedError

    def store_done(self, group: Group) -> None:
        raise NotImplementedError
