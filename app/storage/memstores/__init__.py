"""Memory stores (seed 002): path-addressed text memories with a version history."""

from __future__ import annotations

from .engine import MemoryStoreEngine
from .models import (
    ContentPreconditionFailed,
    Deleted,
    HeadVersion,
    Memory,
    MemoryPrefix,
    MemoryStore,
    MemoryVersion,
    Page,
    PathConflict,
    StoreArchived,
    StoreFull,
    VersionFilter,
)

__all__ = [
    "ContentPreconditionFailed",
    "Deleted",
    "HeadVersion",
    "Memory",
    "MemoryPrefix",
    "MemoryStore",
    "MemoryStoreEngine",
    "MemoryVersion",
    "Page",
    "PathConflict",
    "StoreArchived",
    "StoreFull",
    "VersionFilter",
]
