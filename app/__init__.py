"""Project Memory: durable memory for AI coding agents, over a plain filesystem tree."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing app.storage must not import Flask
    from flask import Flask


def create_app(overrides: Mapping[str, Any] | None = None) -> Flask:
    """Create the WSGI app: config, storage, blueprints, error handlers, CLI."""
    from flask import Flask

    from . import cli, console, ratelimit, requestlog
    from .api import memory_stores, memory_tool, project_memory, public
    from .config import load_config
    from .errors import register_error_handlers
    from .json_provider import JSONProvider
    from .schemas.memory_stores import OPENAPI_SCHEMAS as MEMORY_STORES_SCHEMAS
    from .storage.facade import TreeStorage
    from .storage.tokens import TokenRegistry

    app = Flask(__name__)
    app.json = JSONProvider(app)
    # "a//b" is a 404 like any other unknown path, not a redirect to a normalised one.
    app.url_map.merge_slashes = False
    load_config(app, overrides)
    clock = app.config.get("CLOCK")
    extra = {"clock": clock} if clock else {}
    app.extensions["storage"] = TreeStorage(
        Path(app.config["STORAGE_ROOT"]),
        retention=timedelta(days=app.config["RETENTION_DAYS"]),
        lock_timeout=app.config["LOCK_TIMEOUT"],
        max_artifact_bytes=app.config["MAX_ARTIFACT_BYTES"],
        **extra,
    )
    app.extensions.setdefault("openapi_schemas", []).extend(MEMORY_STORES_SCHEMAS)
    app.extensions["token_registry"] = TokenRegistry(
        Path(app.config["TOKENS_FILE"]), lock_timeout=app.config["LOCK_TIMEOUT"], **extra
    )
    app.config["MAX_CONTENT_LENGTH"] = app.config["MAX_JSON_BYTES"]
    requestlog.init_app(app)
    ratelimit.init_app(app)
    register_error_handlers(app)
    # Every API blueprint; health checks, the OpenAPI document and metrics are never limited.
    ratelimit.limit_blueprints(project_memory.bp, memory_stores.bp, memory_tool.bp)
    app.register_blueprint(public.bp)
    app.register_blueprint(project_memory.bp)
    app.register_blueprint(memory_stores.bp)
    app.register_blueprint(memory_tool.bp, url_prefix="/v1/memory_stores")
    console.init_app(app)
    cli.init_app(app)
    return app
