"""The two records of a memory store, typed: ``store.json`` and one file per version.

Both are plain indented JSON a person can read with ``cat``; the keys on disk are the API's
own field names, plus a few the index needs to be rebuilt from the records alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from app.storage.core.encoding import whole_number
from app.storage.core.errors import Corrupt
from app.storage.core.store_models import Memory, MemoryStore, MemoryVersion

FORMAT = 1
OPERATIONS = ("created", "modified", "deleted")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class StoreRecord:
    """``store.json``: what a store is. Rewritten in place (atomically) by updates."""

    id: str
    name: str
    description: str
    metadata: dict[str, str]
    created_at: str
    created_us: int
    updated_at: str
    archived_at: str | None
    tenant: str
    project: str
    # The token id that created the store (None for stores of an older version): it may
    # update, archive and delete it, as may a project_admin.
    created_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "type": "memory_store",
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "created_us": self.created_us,
            "updated_at": self.updated_at,
            "archived_at": self.archived_at,
            "tenant": self.tenant,
            "project": self.project,
            "created_by": self.created_by,
        }

    @staticmethod
    def from_json(obj: Any, path: Path) -> StoreRecord:
        try:
            return StoreRecord(
                id=str(obj["id"]),
                name=str(obj["name"]),
                description=str(obj.get("description") or ""),
                metadata={str(k): str(v) for k, v in (obj.get("metadata") or {}).items()},
                created_at=str(obj["created_at"]),
                created_us=whole_number(obj, "created_us"),
                updated_at=str(obj["updated_at"]),
                archived_at=obj.get("archived_at"),
                tenant=str(obj["tenant"]),
                project=str(obj["project"]),
                created_by=obj.get("created_by"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corrupt(f"{path}: not a store record ({exc!r})") from None

    def view(self) -> MemoryStore:
        return MemoryStore(
            id=self.id,
            name=self.name,
            description=self.description,
            metadata=dict(self.metadata),
            created_at=self.created_at,
            updated_at=self.updated_at,
            archived_at=self.archived_at,
        )


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """``versions/<id>.json``: one immutable version (only redaction rewrites it).

    ``content`` is None for a ``deleted`` version, a redacted one, and a record loaded
    without its content (``has_content`` tells which); ``memory_created_at``,
    ``path_since`` and ``previous_version_id`` are internal: with them the index and the
    version chain can be rebuilt from the records alone.
    """

    id: str
    memory_store_id: str
    memory_id: str
    operation: str
    path: str | None
    content: str | None
    content_sha256: str | None
    content_size_bytes: int | None
    created_by: dict[str, Any] | None
    created_at: str
    created_us: int
    redacted_at: str | None
    redacted_by: dict[str, Any] | None
    memory_created_at: str | None
    path_since: str | None
    previous_version_id: str | None
    has_content: bool = field(default=False, compare=False)

    @staticmethod
    def new(
        *,
        id: str,
        store_id: str,
        memory_id: str,
        operation: str,
        path: str,
        content: str | None,
        actor: dict[str, Any] | None,
        created_us: int,
        created_at: str,
        memory_created_at: str,
        path_since: str,
        previous: str | None,
    ) -> VersionRecord:
        data = None if content is None else content.encode("utf-8")
        return VersionRecord(
            id=id,
            memory_store_id=store_id,
            memory_id=memory_id,
            operation=operation,
            path=path,
            content=content,
            content_sha256=None if data is None else sha256_hex(data),
            content_size_bytes=None if data is None else len(data),
            created_by=actor,
            created_at=created_at,
            created_us=created_us,
            redacted_at=None,
            redacted_by=None,
            memory_created_at=memory_created_at,
            path_since=path_since,
            previous_version_id=previous,
            has_content=content is not None,
        )

    @property
    def live(self) -> bool:
        """Whether this version, as a head, is a live memory (not deleted, not redacted)."""
        return self.operation != "deleted" and self.redacted_at is None

    def redacted(self, at: str, by: dict[str, Any] | None) -> VersionRecord:
        return replace(
            self,
            path=None,
            content=None,
            content_sha256=None,
            content_size_bytes=None,
            redacted_at=at,
            redacted_by=by,
            has_content=False,
        )

    def without_content(self) -> VersionRecord:
        return replace(self, content=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "type": "memory_version",
            "id": self.id,
            "memory_store_id": self.memory_store_id,
            "memory_id": self.memory_id,
            "operation": self.operation,
            "path": self.path,
            "content": self.content,
            "content_sha256": self.content_sha256,
            "content_size_bytes": self.content_size_bytes,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "created_us": self.created_us,
            "redacted_at": self.redacted_at,
            "redacted_by": self.redacted_by,
            "memory_created_at": self.memory_created_at,
            "path_since": self.path_since,
            "previous_version_id": self.previous_version_id,
        }

    @staticmethod
    def from_json(obj: Any, path: Path) -> VersionRecord:
        """Parse a version record; Corrupt when it lacks what the index needs."""
        try:
            operation = str(obj["operation"])
            if operation not in OPERATIONS:
                raise ValueError(f"unknown operation {operation!r}")
            content = obj.get("content")
            record = VersionRecord(
                id=str(obj["id"]),
                memory_store_id=str(obj.get("memory_store_id") or ""),
                memory_id=str(obj["memory_id"]),
                operation=operation,
                path=obj.get("path"),
                content=content if isinstance(content, str) else None,
                content_sha256=obj.get("content_sha256"),
                content_size_bytes=obj.get("content_size_bytes"),
                created_by=obj.get("created_by"),
                created_at=str(obj["created_at"]),
                created_us=whole_number(obj, "created_us"),
                redacted_at=obj.get("redacted_at"),
                redacted_by=obj.get("redacted_by"),
                memory_created_at=obj.get("memory_created_at"),
                path_since=obj.get("path_since"),
                previous_version_id=obj.get("previous_version_id"),
                has_content=isinstance(content, str),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corrupt(f"{path}: not a version record ({exc!r})") from None
        if record.operation != "deleted" and record.redacted_at is None:
            for name in (
                "path",
                "content_sha256",
                "content_size_bytes",
                "memory_created_at",
                "path_since",
            ):
                if getattr(record, name) is None:
                    raise Corrupt(f"{path}: not a version record (no {name})")
        return record

    def memory(self, full: bool) -> Memory:
        """The live memory whose head this version is."""
        assert self.path is not None and self.content_sha256 is not None
        return Memory(
            id=self.memory_id,
            memory_store_id=self.memory_store_id,
            path=self.path,
            content=self.content if full else None,
            content_size_bytes=int(self.content_size_bytes or 0),
            content_sha256=self.content_sha256,
            memory_version_id=self.id,
            created_at=str(self.memory_created_at),
            updated_at=self.created_at,
        )

    def view(self, full: bool) -> MemoryVersion:
        return MemoryVersion(
            id=self.id,
            memory_store_id=self.memory_store_id,
            memory_id=self.memory_id,
            operation=self.operation,
            path=self.path,
            content=self.content if full else None,
            content_size_bytes=self.content_size_bytes,
            content_sha256=self.content_sha256,
            created_by=self.created_by,
            created_at=self.created_at,
            redacted_at=self.redacted_at,
            redacted_by=self.redacted_by,
        )


_ACTOR_ID_FIELDS = {
    "api_actor": "api_key_id",
    "session_actor": "session_id",
    "user_actor": "user_id",
    "service_account_actor": "service_account_id",
}


@dataclass(frozen=True, slots=True)
class MemoryRow:
    id: str
    path: str
    head: str
    sha: str
    size: int
    created_at: str
    updated_at: str
    path_since: str

    def view(self, store_id: str, content: str | None) -> Memory:
        """The memory this row describes, with ``content`` (None: without it)."""
        return Memory(
            id=self.id,
            memory_store_id=store_id,
            path=self.path,
            content=content,
            content_size_bytes=self.size,
            content_sha256=self.sha,
            memory_version_id=self.head,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


@dataclass(frozen=True, slots=True)
class VersionRow:
    id: str
    memory_id: str
    operation: str
    path: str | None
    sha: str | None
    size: int | None
    created_by: str | None
    actor_type: str | None
    actor_id: str | None
    created_us: int
    created_at: str
    redacted_at: str | None
    redacted_by: str | None

    def actor(self) -> dict[str, Any] | None:
        return None if self.created_by is None else dict(json.loads(self.created_by))

    def redactor(self) -> dict[str, Any] | None:
        return None if self.redacted_by is None else dict(json.loads(self.redacted_by))

    def view(self, store_id: str) -> MemoryVersion:
        """The version this row describes, without its content (a row does not hold it)."""
        return MemoryVersion(
            id=self.id,
            memory_store_id=store_id,
            memory_id=self.memory_id,
            operation=self.operation,
            path=self.path,
            content=None,
            content_size_bytes=self.size,
            content_sha256=self.sha,
            created_by=self.actor(),
            created_at=self.created_at,
            redacted_at=self.redacted_at,
            redacted_by=self.redactor(),
        )


def _actor_json(actor: Any) -> str | None:
    return None if actor is None else json.dumps(actor, separators=(",", ":"))


def version_row(record: VersionRecord) -> VersionRow:
    actor = record.created_by if isinstance(record.created_by, dict) else {}
    kind = actor.get("type")
    ident = _ACTOR_ID_FIELDS.get(str(kind))
    return VersionRow(
        id=record.id,
        memory_id=record.memory_id,
        operation=record.operation,
        path=record.path,
        sha=record.content_sha256,
        size=record.content_size_bytes,
        created_by=_actor_json(record.created_by),
        actor_type=kind,
        actor_id=actor.get(ident) if ident else None,
        created_us=record.created_us,
        created_at=record.created_at,
        redacted_at=record.redacted_at,
        redacted_by=_actor_json(record.redacted_by),
    )


def memory_row(record: VersionRecord) -> MemoryRow:
    """The live memory whose head version is ``record`` (a live version)."""
    return MemoryRow(
        id=record.memory_id,
        path=str(record.path),
        head=record.id,
        sha=str(record.content_sha256),
        size=int(record.content_size_bytes or 0),
        created_at=str(record.memory_created_at),
        updated_at=record.created_at,
        path_since=str(record.path_since),
    )


class MemoryLookup(Protocol):
    """The queries the rules every backend shares (store_paging.py, store_semantics.py) ask
    of a store: the tree's SQLite index (tree/sqlite/store_index.py) and PostgreSQL's rows
    (pg/store_index.py)."""

    def state(self) -> tuple[str, int]: ...

    def memory(self, memory_id: str) -> MemoryRow | None: ...

    def count(self) -> int: ...

    def occupant(self, path: str, exclude: str | None) -> tuple[str, str] | None: ...

    def memories_page(self, low: str, high: str, as_of: str, limit: int) -> list[MemoryRow]: ...
