"""The storage engine: plain Python over a filesystem tree. No Flask in here."""

from __future__ import annotations

from .clock import Clock, system_clock
from .errors import (
    Conflict,
    Corrupt,
    InsufficientStorage,
    InvalidName,
    LockTimeout,
    NotFound,
    NotOwner,
    PayloadTooLarge,
    PreconditionFailed,
    StorageError,
    UnsafePath,
)
from .layout import Layout, Scope
from .models import ArtifactInfo, ArtifactStream, TaskIndex, TaskPage, TaskSummary, TurnRecord
from .tasks import MAX_SUMMARY_BYTES, TaskStore

__all__ = [
    "MAX_SUMMARY_BYTES",
    "ArtifactInfo",
    "ArtifactStream",
    "Clock",
    "Conflict",
    "Corrupt",
    "InsufficientStorage",
    "InvalidName",
    "Layout",
    "LockTimeout",
    "NotFound",
    "NotOwner",
    "PayloadTooLarge",
    "PreconditionFailed",
    "Scope",
    "StorageError",
    "TaskIndex",
    "TaskPage",
    "TaskSummary",
    "TaskStore",
    "TurnRecord",
    "UnsafePath",
    "system_clock",
]
