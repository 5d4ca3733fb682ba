"""The storage interface: what the API, the console, the CLI and the memory tool may call.

Two engines, one Protocol each, and :class:`StorageBackend`, the object the app builds once
(app/storage/facade.py for the tree). A second backend implements the same three and
passes the same conformance suite (tests/conformance/); nothing above the storage layer
knows which one runs. Errors are the ones of app/storage/errors.py (and memstores/models.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from .clock import Clock
from .layout import Scope
from .memstores.models import Deleted, Memory, MemoryStore, MemoryVersion, Page, VersionFilter
from .models import ArtifactInfo, ArtifactStream, FsckReport, TaskIndex, TaskPage, TurnRecord


class TaskBackend(Protocol):
    """Turn history, artifacts and the digest of every tenant/project."""

    max_artifact_bytes: int
    clock: Clock

    def put_turn(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        *,
        meta: dict[str, Any],
        summary_md: str,
        actor: str | None = None,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> TurnRecord: ...

    def get_turn(self, scope: Scope, task_id: str, turn: int) -> TurnRecord: ...

    def get_task(self, scope: Scope, task_id: str) -> TaskIndex: ...

    def list_tasks(
        self,
        scope: Scope,
        *,
        limit: int = 50,
        cursor: str | None = None,
        prefix: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        failed: bool = False,
    ) -> TaskPage: ...

    def delete_task(self, scope: Scope, task_id: str, *, only_owner: str | None = None) -> None: ...

    def put_artifact(
        self,
        scope: Scope,
        task_id: str,
        turn: int,
        name: str,
        stream: IO[bytes],
        *,
        content_type: str,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ArtifactInfo: ...

    def open_artifact(self, scope: Scope, task_id: str, turn: int, name: str) -> ArtifactStream: ...

    def open_digest(self, scope: Scope) -> tuple[BinaryIO, int]: ...


class StoreBackend(Protocol):
    """Memory stores: path-addressed memories with versions, of every tenant/project."""

    def create_store(
        self,
        scope: Scope,
        *,
        name: object,
        description: object = "",
        metadata: object = None,
        creator: str | None = None,
    ) -> MemoryStore: ...

    def get_store(self, scope: Scope, store_id: str) -> MemoryStore: ...

    def list_stores(
        self,
        scope: Scope,
        *,
        limit: int = 20,
        page: str | None = None,
        include_archived: bool = False,
        created_gte_us: int | None = None,
        created_lte_us: int | None = None,
    ) -> Page: ...

    def update_store(
        self,
        scope: Scope,
        store_id: str,
        *,
        name: object = None,
        description: object = None,
        metadata: object = None,
        only_creator: str | None = None,
    ) -> MemoryStore: ...

    def archive_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> MemoryStore: ...

    def delete_store(
        self, scope: Scope, store_id: str, *, only_creator: str | None = None
    ) -> Deleted: ...

    def create_memory(
        self,
        scope: Scope,
        store_id: str,
        *,
        path: object,
        content: object,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory: ...

    def get_memory(self, scope: Scope, store_id: str, memory_id: str, *, full: bool) -> Memory: ...

    def find_memory(
        self, scope: Scope, store_id: str, path: str, *, full: bool
    ) -> Memory | None: ...

    def update_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        content: object = None,
        path: object = None,
        precondition_sha256: object = None,
        actor: dict[str, Any] | None,
        full: bool = False,
    ) -> Memory: ...

    def delete_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        expected_sha256: object = None,
        actor: dict[str, Any] | None,
    ) -> Deleted: ...

    def list_memories(
        self,
        scope: Scope,
        store_id: str,
        *,
        path_prefix: object = "/",
        depth: int = 0,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page: ...

    def list_versions(
        self,
        scope: Scope,
        store_id: str,
        *,
        filters: VersionFilter,
        limit: int = 20,
        page: str | None = None,
        full: bool = False,
    ) -> Page: ...

    def get_version(
        self, scope: Scope, store_id: str, version_id: str, *, full: bool
    ) -> MemoryVersion: ...

    def redact_version(
        self, scope: Scope, store_id: str, version_id: str, *, actor: dict[str, Any] | None
    ) -> MemoryVersion: ...


class SweepResult(Protocol):
    """What one retention sweep did (or, in a dry run, would do)."""

    errors: tuple[str, ...]

    def to_dict(self) -> dict[str, object]: ...

    def lines(self) -> list[str]: ...


class StorageBackend(Protocol):
    """Both engines and the operations on everything they hold."""

    tasks: TaskBackend
    stores: StoreBackend

    def sweep(self, *, now: datetime, dry_run: bool = False) -> SweepResult: ...

    def fsck(self, *, repair: bool = False, grace: timedelta = ...) -> FsckReport: ...

    def ready(self) -> tuple[bool, str]: ...

    def export(self, out: Path, *, tenant: str | None = None, project: str | None = None) -> Any:
        """Write a backup (app/storage/backup/format.py) of one project, one tenant or all."""
        ...

    def import_(
        self,
        archive: BinaryIO,
        *,
        tenant: str | None = None,
        project: str | None = None,
        overwrite: bool = False,
    ) -> Any:
        """Restore a backup, all of it or nothing."""
        ...

    def projects(self, tenants: Iterable[str] | None = None) -> list[Scope]:
        """The projects that hold anything, of ``tenants`` (None: of every tenant)."""
        ...

    def key(self, name: str) -> bytes:
        """A per-deployment secret (``CURSOR_KEY``, ``CONSOLE_KEY``), made on first use."""
        ...

    def describe(self) -> dict[str, Path | str]: ...
