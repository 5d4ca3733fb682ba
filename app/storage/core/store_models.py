"""Frozen values the memory-stores engine returns; the HTTP layer serializes them as they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.storage.core.errors import Conflict, PreconditionFailed, StorageError


@dataclass(frozen=True, slots=True)
class MemoryStore:
    id: str
    name: str
    description: str
    metadata: dict[str, str]
    created_at: str
    updated_at: str
    archived_at: str | None
    type: str = "memory_store"


@dataclass(frozen=True, slots=True)
class Memory:
    id: str
    memory_store_id: str
    path: str
    content: str | None
    content_size_bytes: int
    content_sha256: str
    memory_version_id: str
    created_at: str
    updated_at: str
    type: str = "memory"


@dataclass(frozen=True, slots=True)
class MemoryPrefix:
    path: str
    type: str = "memory_prefix"


@dataclass(frozen=True, slots=True)
class MemoryVersion:
    id: str
    memory_store_id: str
    memory_id: str
    operation: str
    path: str | None
    content: str | None
    content_size_bytes: int | None
    content_sha256: str | None
    created_by: dict[str, Any] | None
    created_at: str
    redacted_at: str | None
    redacted_by: dict[str, Any] | None
    type: str = "memory_version"


@dataclass(frozen=True, slots=True)
class Page:
    data: tuple[Any, ...]
    next_page: str | None


@dataclass(frozen=True, slots=True)
class Deleted:
    id: str
    type: str


@dataclass(frozen=True, slots=True)
class VersionFilter:
    memory_id: str | None = None
    operation: str | None = None
    api_key_id: str | None = None
    session_id: str | None = None
    service_account_id: str | None = None
    created_gte_us: int | None = None
    created_lte_us: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class PathConflict(Conflict):
    """The path, an ancestor or a descendant of it is held by another memory."""

    def __init__(self, path: str, memory_id: str, conflicting_path: str) -> None:
        super().__init__(
            f"path {path!r} conflicts with memory {memory_id} at {conflicting_path!r}"
            " (a memory's path cannot also be the ancestor or descendant of another's)"
        )
        self.memory_id = memory_id
        self.conflicting_path = conflicting_path


class ContentPreconditionFailed(PreconditionFailed):
    """The memory's content_sha256 is not the one the caller expected."""


class StoreArchived(Conflict):
    """The store is archived, which makes its memories read-only (they may still be deleted)."""


class ArchivedStoreUpdate(StoreArchived):
    """An archived store's name, description and metadata never change again: the request
    itself is invalid (the reference API answers 400 ``invalid_request_error``), where a memory
    write into the store is a conflict with its state."""


class StoreFull(StorageError):
    """The store holds its maximum number of memories."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the memory store holds its limit of {limit} memories; delete one before"
            " creating another"
        )
        self.limit = limit


class HeadVersion(Conflict):
    """The version is the head of a live memory and cannot be redacted."""
