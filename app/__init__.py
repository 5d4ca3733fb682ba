"""Project Memory: durable memory for AI coding agents, in a filesystem tree or PostgreSQL + S3."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing app.storage must not import Flask
    from flask import Flask


def create_app(overrides: Mapping[str, Any] | None = None, *, http: bool = True) -> Flask:
    """Create the WSGI app: config, storage, blueprints, error handlers, CLI.

    ``http=False``: an app for an admin command, which serves nothing: the storage, the
    token registry, the rate limits and the CLI, without the routes and request hooks (nor
    the imports behind them: the schemas, the console, the metrics)."""
    from flask import Flask

    from app.config import load_config
    from app.ops import cli
    from app.storage.backends import open_backend
    from app.web import ratelimit
    from app.web.json_provider import JSONProvider
    from app.web.routing import CONVERTERS, Rule

    app = Flask(__name__)
    app.json = JSONProvider(app)
    app.url_rule_class = Rule  # URL builders compiled once per process (app/web/routing.py)
    # "a//b" is a 404 like any other unknown path, not a redirect to a normalised one.
    app.url_map.merge_slashes = False
    app.url_map.converters.update(CONVERTERS)
    load_config(app, overrides)
    # The tree, or PostgreSQL and an object store (MEMORY_DATABASE_URL, MEMORY_BLOB_URL).
    storage = app.extensions["storage"] = open_backend(app.config)
    app.extensions["token_registry"] = storage.token_registry(Path(app.config["TOKENS_FILE"]))
    ratelimit.init_app(app)
    if http:
        _serve_http(app)
    cli.init_app(app)
    return app


def _serve_http(app: Flask) -> None:
    """The routes of both APIs and the console, and what every request passes through."""
    from app import console
    from app.api import (
        ledger as _ledger,  # noqa: F401 - its routes join project_memory's blueprint
        mcp,
        memory_stores,
        memory_tool,
        metrics,
        oauth,
        project_memory,
        public,
    )
    from app.schemas.memory_stores import OPENAPI_SCHEMAS as MEMORY_STORES_SCHEMAS
    from app.schemas.usage import OPENAPI_SCHEMAS as USAGE_SCHEMAS
    from app.web import body, oauth_server, ratelimit, requestlog, traffic
    from app.web.errors import register_error_handlers

    app.extensions.setdefault("openapi_schemas", []).extend(MEMORY_STORES_SCHEMAS)
    app.extensions["openapi_schemas"].extend(USAGE_SCHEMAS)
    app.config["MAX_CONTENT_LENGTH"] = app.config["MAX_JSON_BYTES"]
    # Every request body is read through one counter (traffic, upload budgets), and an
    # answer that leaves some of it unread closes the connection.
    app.before_request(body.count_body)
    app.after_request(body.close_if_body_unread)
    requestlog.init_app(app)
    ratelimit.init_after_request(app)
    traffic.init_app(app)
    register_error_handlers(app)
    # Every API blueprint; health checks, the OpenAPI document and metrics are never limited.
    ratelimit.limit_blueprints(project_memory.bp, memory_stores.bp, memory_tool.bp, mcp.bp)
    app.register_blueprint(public.bp)
    if app.config["METRICS"] == "token":
        app.register_blueprint(metrics.bp)  # off: no /metrics route at all
    app.register_blueprint(project_memory.bp)
    app.register_blueprint(memory_stores.bp)
    app.register_blueprint(memory_tool.bp, url_prefix="/v1/memory_stores")
    # The MCP endpoint (Streamable HTTP) at the server's root: ${PROJECT_MEMORY_URL}/mcp.
    app.register_blueprint(mcp.bp)
    # OAuth 2.1 for /mcp: its metadata, token, revocation and registration endpoints; the
    # authorization endpoint is a console page.
    oauth_server.init_app(app)
    app.register_blueprint(oauth.bp)
    console.init_app(app)
