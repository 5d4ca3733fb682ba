"""Storage: plain Python, no Flask, behind one interface (interface.py).

``core/`` is what every backend shares, ``tree/`` the filesystem backend, ``pg/`` PostgreSQL
with an object store, and ``backends.py`` builds the configured one. The package exports the
neutral names callers use most (the errors, the models, ``Scope``, the clock); they load on
first use, so that importing ``app.storage`` imports no backend and none of the server's
dependencies (ulid, filelock, orjson).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.storage.core.clock import Clock as Clock, system_clock as system_clock
    from app.storage.core.errors import (
        Conflict as Conflict,
        Corrupt as Corrupt,
        InsufficientStorage as InsufficientStorage,
        InvalidName as InvalidName,
        LockTimeout as LockTimeout,
        NotFound as NotFound,
        NotOwner as NotOwner,
        PayloadTooLarge as PayloadTooLarge,
        PreconditionFailed as PreconditionFailed,
        StorageError as StorageError,
        UnsafePath as UnsafePath,
    )
    from app.storage.core.models import (
        ArtifactInfo as ArtifactInfo,
        ArtifactStream as ArtifactStream,
        TaskIndex as TaskIndex,
        TaskPage as TaskPage,
        TaskSummary as TaskSummary,
        TurnRecord as TurnRecord,
    )
    from app.storage.core.names import Scope as Scope
    from app.storage.core.task_rules import MAX_SUMMARY_BYTES as MAX_SUMMARY_BYTES

_EXPORTS = {
    "Clock": ".core.clock",
    "system_clock": ".core.clock",
    "Scope": ".core.names",
    "MAX_SUMMARY_BYTES": ".core.task_rules",
    **dict.fromkeys(
        (
            "Conflict",
            "Corrupt",
            "InsufficientStorage",
            "InvalidName",
            "LockTimeout",
            "NotFound",
            "NotOwner",
            "PayloadTooLarge",
            "PreconditionFailed",
            "StorageError",
            "UnsafePath",
        ),
        ".core.errors",
    ),
    **dict.fromkeys(
        ("ArtifactInfo", "ArtifactStream", "TaskIndex", "TaskPage", "TaskSummary", "TurnRecord"),
        ".core.models",
    ),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
