"""The secrets already stored: found (``flask --app wsgi secrets scan``) and masked in place
(``secrets purge``), on either backend, through the storage interface.

The walk reads each project's turns (meta, summary, text artifacts) in task-id order, then
its stores (name, description) and every version of every memory, a page at a time: memory
stays bounded whatever the project's size. Each finding is reported as where it is (project,
task and turn or store, memory and version, the field, the characters) and its kind, never
its value.

``purge`` masks what it finds as the write paths would have (services/secrets.py):

* a turn is rewritten with its meta, summary and text artifacts masked (a put_turn under
  If-Match, so a writer's newer turn is never overwritten; the turn keeps its number and
  its other artifacts). The rewrite replaces the text in project.md, the listing and the
  search index, which purge what they dropped as for any replaced text (docs/guarantees.md);
* a memory version that holds a secret is redacted; when it is the live memory's head, a
  masked version is written over it first (a head is never redacted);
* a store's name or description is updated masked.

Progress is kept, after each page, in a small JSON state file when one is given: a purge or
a scan stopped half-way goes on from its last page when run again with the same file.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.services.secrets import (
    SNIFF_BYTES,
    allowlist_of,
    is_text_type,
    looks_like_text,
    map_strings,
    policy_of,
)
from app.storage.core import secret_scan
from app.storage.core.errors import NotFound, PreconditionFailed, StorageError
from app.storage.core.files import atomic_file
from app.storage.core.models import ArtifactUpload, TurnRecord
from app.storage.core.names import Scope
from app.storage.core.store_models import VersionFilter
from app.storage.interface import StorageBackend

PAGE = 100
DONE = "done"  # a phase of a project the state file says is finished
SWEEP_ACTOR = {"type": "api_actor", "api_key_id": "secrets-purge"}
# An artifact is read whole to be scanned (at most the artifact limit): past this size it is
# reported as not scanned rather than held in memory.
MAX_SCANNED_ARTIFACT = 64 << 20


@dataclass(frozen=True, slots=True)
class Found:
    """A secret where it is stored: never its value."""

    where: str
    kind: str
    start: int
    end: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Stopped(Exception):
    """The sweep reached its deadline or its most findings: what it did so far stands."""


@dataclass
class Tally:
    stopped: bool = False
    turns: int = 0
    artifacts: int = 0
    versions: int = 0
    stores: int = 0
    found: int = 0
    purged: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class State:
    """Where a sweep got to, by project and phase (None: not kept)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[str, Any] = {}
        if path is not None and path.exists():
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                self.done = loaded

    def get(self, key: str) -> Any:
        return self.done.get(key)

    def put(self, key: str, value: Any) -> None:
        self.done[key] = value
        if self.path is None:
            return
        with atomic_file(self.path) as fh:
            fh.write(json.dumps(self.done).encode("utf-8"))


class Sweep:
    """One scan (or purge) of ``scopes``; ``report`` hears of each finding as it is made."""

    def __init__(
        self,
        storage: StorageBackend,
        *,
        purge: bool,
        report: Callable[[Found], None],
        state: State | None = None,
        deadline: float | None = None,
        most_found: int | None = None,
        skip_allowed: bool = False,
    ) -> None:
        self.storage = storage
        self.purge = purge
        self.report = report
        self.state = state or State(None)
        self.deadline = deadline  # time.monotonic() past which it stops (None: never)
        self.most_found = most_found
        self.skip_allowed = skip_allowed  # leave alone the projects whose policy is allow
        self.tally = Tally()

    def run(self, scopes: Iterable[Scope]) -> Tally:
        """Walk ``scopes``; a sweep that stops early (its deadline, its most findings) says
        so in ``stopped``, with what it did until then. A purge that walked a whole project
        makes the text it replaced leave every file there (StorageBackend.scrub_replaced)."""
        try:
            for scope in scopes:
                policy = policy_of(self.storage, scope.tenant, scope.project)
                if self.skip_allowed and policy.policy == "allow":
                    continue
                allowlist = allowlist_of(policy)
                purged = self.tally.purged
                # A walk resumed from a state file may follow a purge that stopped before
                # its scrub.
                resumed = self.state.get(f"{scope.tenant}/{scope.project}/tasks") is not None
                self._tasks(scope, allowlist)
                self._stores(scope, allowlist)
                if self.purge and (self.tally.purged > purged or resumed):
                    self._scrub(scope)
        except Stopped:
            self.tally.stopped = True
        return self.tally

    def _scrub(self, scope: Scope) -> None:
        self.storage.flush_derived()
        if not self.storage.scrub_replaced(scope):
            self.tally.skipped.append(
                f"{scope.tenant}/{scope.project}: a reader held the search index; the masked"
                " text leaves it at the next write or sweep"
            )

    def _check(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Stopped
        if self.most_found is not None and self.tally.found >= self.most_found:
            raise Stopped

    # -- helpers ----------------------------------------------------------------------------
    def _scan(
        self, text: str, where: str, allowlist: secret_scan.Allowlist
    ) -> list[secret_scan.Finding]:
        found = secret_scan.scan(text, allowlist=allowlist)
        for f in found:
            self.tally.found += 1
            self.report(Found(where, f.kind, f.start, f.end))
        return found

    def _masked(self, value: Any, where: str, allowlist: secret_scan.Allowlist) -> Any:
        """``value`` (JSON) with every string's secrets reported and masked."""

        def mask(text: str, at: str) -> str:
            found = self._scan(text, at, allowlist)
            return secret_scan.masked(text, found) if found else text

        return map_strings(value, where, mask)

    # -- turns ------------------------------------------------------------------------------
    def _tasks(self, scope: Scope, allowlist: secret_scan.Allowlist) -> None:
        key = f"{scope.tenant}/{scope.project}/tasks"
        cursor = self.state.get(key)
        if cursor == DONE:
            return
        while True:
            page = self.storage.tasks.list_tasks(
                scope, limit=PAGE, cursor=cursor, sort="task_id", descending=False
            )
            for summary in page.tasks:
                self._task(scope, summary.task_id, allowlist)
            cursor = page.next_cursor
            self.state.put(key, cursor or DONE)
            if cursor is None:
                return

    def _task(self, scope: Scope, task_id: str, allowlist: secret_scan.Allowlist) -> None:
        self._check()
        try:
            index = self.storage.tasks.get_task(scope, task_id)
        except NotFound:
            return  # deleted meanwhile
        for entry in index.turns:
            try:
                record = self.storage.tasks.get_turn(scope, task_id, entry.turn)
            except NotFound:
                continue
            self._turn(scope, record, allowlist)

    def _turn(self, scope: Scope, record: TurnRecord, allowlist: secret_scan.Allowlist) -> None:
        self.tally.turns += 1
        where = f"{scope.tenant}/{scope.project} task {record.task_id} turn {record.turn}"
        before = self.tally.found
        meta = self._masked(record.meta, f"{where} meta", allowlist)
        summary = self._masked(record.summary_md, f"{where} summary_md", allowlist)
        rewritten: list[tuple[str, str, bytes]] = []
        for info in record.artifacts:
            self.tally.artifacts += 1
            masked = self._artifact(scope, record, info.name, where, allowlist)
            if masked is not None:
                rewritten.append((info.name, info.content_type, masked))
        if not self.purge or self.tally.found == before:
            return
        try:
            self.storage.tasks.put_turn(
                scope,
                record.task_id,
                record.turn,
                meta=meta,
                summary_md=summary,
                actor=None,  # the task exists: its owner stays
                if_match=record.etag,
                artifacts=[
                    ArtifactUpload(name, kind, io.BytesIO(data)) for name, kind, data in rewritten
                ],
            )
        except PreconditionFailed:
            self.tally.skipped.append(f"{where}: written meanwhile; run the purge again")
            return
        except StorageError as exc:
            self.tally.skipped.append(f"{where}: {exc}")
            return
        self.tally.purged += 1

    def _artifact(
        self,
        scope: Scope,
        record: TurnRecord,
        name: str,
        where: str,
        allowlist: secret_scan.Allowlist,
    ) -> bytes | None:
        """The artifact's bytes masked, when it is text that holds a secret; None otherwise."""
        try:
            opened = self.storage.tasks.open_artifact(scope, record.task_id, record.turn, name)
        except NotFound:
            return None
        try:
            if opened.size > MAX_SCANNED_ARTIFACT:
                self.tally.skipped.append(f"{where} artifact {name}: too large to scan")
                return None
            head = opened.file.read(SNIFF_BYTES)
            if not (is_text_type(opened.info.content_type) or looks_like_text(head)):
                return None
            data = head + opened.file.read()
        finally:
            opened.file.close()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        found = self._scan(text, f"{where} artifact {name}", allowlist)
        return secret_scan.masked(text, found).encode("utf-8") if found else None

    # -- stores -----------------------------------------------------------------------------
    def _stores(self, scope: Scope, allowlist: secret_scan.Allowlist) -> None:
        key = f"{scope.tenant}/{scope.project}/stores"
        page_token = self.state.get(key)
        if page_token == DONE:
            return
        while True:
            page = self.storage.stores.list_stores(
                scope, limit=PAGE, page=page_token, include_archived=True
            )
            for store in page.data:
                self._store(scope, store, allowlist)
            page_token = page.next_page
            self.state.put(key, page_token or DONE)
            if page_token is None:
                return

    def _store(self, scope: Scope, store: Any, allowlist: secret_scan.Allowlist) -> None:
        self.tally.stores += 1
        where = f"{scope.tenant}/{scope.project} store {store.id}"
        before = self.tally.found
        name = self._masked(store.name, f"{where} name", allowlist)
        description = self._masked(store.description or "", f"{where} description", allowlist)
        if self.purge and self.tally.found > before:
            try:
                self.storage.stores.update_store(
                    scope, store.id, name=name, description=description
                )
                self.tally.purged += 1
            except StorageError as exc:
                self.tally.skipped.append(f"{where}: {exc}")
        for version in self._versions(scope, store.id):
            self._version(scope, store.id, version, where, allowlist)

    def _versions(self, scope: Scope, store_id: str) -> Iterator[Any]:
        page_token: str | None = None
        while True:
            page = self.storage.stores.list_versions(
                scope, store_id, filters=VersionFilter(), limit=PAGE, page=page_token, full=True
            )
            yield from page.data
            page_token = page.next_page
            if page_token is None:
                return

    def _version(
        self,
        scope: Scope,
        store_id: str,
        version: Any,
        where: str,
        allowlist: secret_scan.Allowlist,
    ) -> None:
        self._check()
        if version.redacted_at is not None or version.content is None:
            return
        self.tally.versions += 1
        here = f"{where} memory {version.memory_id} version {version.id}"
        before = self.tally.found
        content = self._masked(version.content, f"{here} content", allowlist)
        path = self._masked(version.path or "", f"{here} path", allowlist)
        if not self.purge or self.tally.found == before:
            return
        try:
            try:
                self.storage.stores.redact_version(scope, store_id, version.id, actor=SWEEP_ACTOR)
            except StorageError:
                # The live memory's head is never redacted: write it masked first.
                memory = self.storage.stores.get_memory(
                    scope, store_id, version.memory_id, full=True
                )
                if memory.memory_version_id != version.id:
                    raise
                self.storage.stores.update_memory(
                    scope,
                    store_id,
                    version.memory_id,
                    content=content,
                    path=path if path != version.path else None,
                    precondition_sha256=memory.content_sha256,
                    actor=SWEEP_ACTOR,
                )
                self.storage.stores.redact_version(scope, store_id, version.id, actor=SWEEP_ACTOR)
        except StorageError as exc:
            self.tally.skipped.append(f"{here}: {exc}")
            return
        self.tally.purged += 1


def scopes_named(storage: StorageBackend, tenant: str | None, project: str | None) -> list[Scope]:
    """The project named, or every project of ``tenant`` (of every tenant, without one)."""
    if tenant is not None and project is not None:
        return [Scope(tenant, project)]
    return storage.projects(None if tenant is None else [tenant])
