"""Python client and remote CLI for a Project Memory server.

    from project_memory_client import Client

    with Client() as pm:  # PROJECT_MEMORY_URL, PROJECT_MEMORY_TOKEN, or the config file
        pm.put_turn("fix-login", "next", meta={"model": "claude"}, summary_md="## Done")
        for task in pm.iter_tasks():
            print(task.task_id, task.latest_turn)

The names below load on first use: ``import project_memory_client`` (and the CLI's start-up)
does not import httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "Client": "client",
    "Upload": "models",
    "Settings": "settings",
    "load_settings": "settings",
    "ApiError": "errors",
    "ClientError": "errors",
    "InvalidArgument": "errors",
    "NotFound": "errors",
    "PreconditionFailed": "errors",
    "ServerUnreachable": "errors",
    "SettingsError": "errors",
    "ArtifactInfo": "models",
    "ArtifactRecord": "models",
    "MemoryArtifact": "models",
    "SearchHit": "models",
    "SearchResults": "models",
    "TaskIndex": "models",
    "TaskList": "models",
    "TaskSummary": "models",
    "TaskTurn": "models",
    "TurnRecord": "models",
    "UsageReport": "models",
    "WhoAmI": "models",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from .client import Client as Client
    from .errors import (
        ApiError as ApiError,
        ClientError as ClientError,
        InvalidArgument as InvalidArgument,
        NotFound as NotFound,
        PreconditionFailed as PreconditionFailed,
        ServerUnreachable as ServerUnreachable,
        SettingsError as SettingsError,
    )
    from .models import (
        ArtifactInfo as ArtifactInfo,
        ArtifactRecord as ArtifactRecord,
        MemoryArtifact as MemoryArtifact,
        SearchHit as SearchHit,
        SearchResults as SearchResults,
        TaskIndex as TaskIndex,
        TaskList as TaskList,
        TaskSummary as TaskSummary,
        TaskTurn as TaskTurn,
        TurnRecord as TurnRecord,
        Upload as Upload,
        UsageReport as UsageReport,
        WhoAmI as WhoAmI,
    )
    from .settings import Settings as Settings, load_settings as load_settings


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
