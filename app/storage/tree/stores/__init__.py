"""Memory stores: path-addressed text memories with a version history.

The engine and its values load on first use, so that ``rules`` (used by the mount client,
which runs without the server's dependencies) imports nothing heavier than itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.storage.core.store_models import (
        ContentPreconditionFailed as ContentPreconditionFailed,
        Deleted as Deleted,
        HeadVersion as HeadVersion,
        Memory as Memory,
        MemoryPrefix as MemoryPrefix,
        MemoryStore as MemoryStore,
        MemoryVersion as MemoryVersion,
        Page as Page,
        PathConflict as PathConflict,
        StoreArchived as StoreArchived,
        StoreFull as StoreFull,
        VersionFilter as VersionFilter,
    )
    from app.storage.tree.stores.engine import MemoryStoreEngine as MemoryStoreEngine
    from app.storage.tree.stores.retention import VersionSweep as VersionSweep

_EXPORTS = {
    "MemoryStoreEngine": "app.storage.tree.stores.engine",
    "VersionSweep": "app.storage.tree.stores.retention",
    **{
        name: "app.storage.core.store_models"
        for name in (
            "ContentPreconditionFailed",
            "Deleted",
            "HeadVersion",
            "Memory",
            "MemoryPrefix",
            "MemoryStore",
            "MemoryVersion",
            "Page",
            "PathConflict",
            "StoreArchived",
            "StoreFull",
            "VersionFilter",
        )
    },
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
