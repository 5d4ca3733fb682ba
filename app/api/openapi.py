"""The OpenAPI 3.1 document, generated from the marshmallow schemas and the url_map."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import yaml
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Flask
from marshmallow import Schema

from app.schemas import memory_stores as ms, project_memory as pm, rules
from app.web.requestlog import CORRELATION_RULE

_CONVERTER = re.compile(r"<(?:[a-z]+:)?([a-zA-Z_]+)>")
DOCUMENTED_PREFIXES = ("/sandbox/memory/v1", "/v1/memory_stores")
_SKIP_METHODS = {"HEAD", "OPTIONS"}


def _scope_header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": rules.identifier(),
        "description": description,
    }


COMMON_HEADERS = [
    {
        "name": "x-correlation-id",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        # Not a pattern: a value beyond the rule is replaced, never refused.
        "description": "End-to-end correlation id, echoed verbatim on the response (and as"
        f" the memory-stores API's request-id, prefixed req_) when it is {CORRELATION_RULE};"
        " when it is omitted or anything else, the server generates a ULID in its place (and"
        " logs the one it replaced).",
    },
    _scope_header(
        "X-Sandbox-Project-Id",
        "Project for this request, an id like a task's; a project-scoped token may only name"
        " its own (403).",
    ),
    _scope_header(
        "X-Sandbox-Tenant-Id",
        "Tenant for this request, an id like a task's; must match the credential's tenant (403).",
    ),
]

ERROR_RESPONSES = {
    401: "Missing, invalid, expired or revoked credential",
    403: "The credential may not do this in this tenant/project",
    404: "Not found",
    422: "Validation Error",
    501: "Not offered by this storage backend",
    503: "A lock stayed busy; retry after Retry-After seconds",
    507: "Over a storage quota, or the server's disk is at its free-space floor; nothing was"
    " written (docs/operations.md)",
}


def _path_of(rule: str) -> str:
    return _CONVERTER.sub(r"{\1}", rule)


def _response(spec: APISpec, status: int, target: Any) -> dict[str, Any]:
    description = {200: "Successful Response", 204: "Successful Response"}.get(
        status, ERROR_RESPONSES.get(status, "Response")
    )
    if target is None:
        return {"description": description}
    if isinstance(target, tuple):
        content_type, schema = target
        return {"description": description, "content": {content_type: {"schema": schema}}}
    name = target if isinstance(target, str) else target.__name__
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
    }


def build_spec(app: Flask) -> dict[str, Any]:
    plugin = MarshmallowPlugin()
    spec = APISpec(
        title="Project Memory",
        version="1.0.0",
        openapi_version="3.1.0",
        plugins=[plugin],
        info={
            "description": "Durable per-task turn history (meta, summary, artifacts) and a project "
            "digest, scoped to tenant/project, plus memory stores. Every request needs a credential."
        },
    )
    assert plugin.converter is not None
    plugin.converter.add_attribute_function(rules.field_rule)  # type: ignore[no-untyped-call]
    spec.components.security_scheme("bearerAuth", {"type": "http", "scheme": "bearer"})
    spec.components.security_scheme(
        "apiKey", {"type": "apiKey", "in": "header", "name": "x-api-key"}
    )
    for schema in (
        pm.HTTPValidationError,
        pm.HTTPError,
        pm.TaskList,
        pm.TaskSummary,
        pm.TurnRecord,
        pm.TurnMeta,
        pm.PutTurnRequest,
        pm.ArtifactRecord,
        pm.MemoryArtifact,
        pm.TaskIndex,
        pm.SearchResults,
        pm.SearchHit,
    ):
        if schema.__name__ not in spec.components.schemas:
            spec.components.schema(schema.__name__, schema=schema)
    for extra in app.extensions.get("openapi_schemas", []):
        if extra.__name__ not in spec.components.schemas:
            spec.components.schema(extra.__name__, schema=extra)
    # A schema's rule across its fields (app/schemas/: OPENAPI_RULE), e.g. "content or path".
    classes = _schema_classes(app)
    for name, component in spec.components.schemas.items():
        if name in classes:
            component.update(getattr(classes[name], "OPENAPI_RULE", {}))

    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if not rule.rule.startswith(DOCUMENTED_PREFIXES) or rule.endpoint == "public.get_openapi":
            continue
        if rule.endpoint.startswith("mcp."):
            continue  # /mcp's alias under the API's prefix: JSON-RPC, not a REST operation
        view = app.view_functions[rule.endpoint]
        info = getattr(view, "__openapi__", None)
        if info is None:
            raise RuntimeError(f"route {rule.rule} ({rule.endpoint}) has no @doc(...) for OpenAPI")
        path = _path_of(rule.rule)
        for method in sorted((rule.methods or set()) - _SKIP_METHODS):
            lines = (view.__doc__ or "").strip().splitlines()
            # A callable parameter reads the app's settings (hours: the retention) or takes a
            # moment to spell (patterns from Unicode's tables): built with the document.
            params = [p(app) if callable(p) else p for p in info["params"]]
            operation: dict[str, Any] = {
                "operationId": view.__name__,
                "summary": lines[0] if lines else "",
                "parameters": [*params, *COMMON_HEADERS],
                "responses": {},
                "security": [{"bearerAuth": []}, {"apiKey": []}],
            }
            # The docstring after its first line is the operation's description.
            description = " ".join(line.strip() for line in lines[1:] if line.strip())
            if description:
                operation["description"] = description
            if info["tags"]:
                operation["tags"] = info["tags"]
            if info.get("beyond_seed"):
                operation["x-beyond-seed"] = True
            if info["body"] is not None:
                body = info["body"]
                body_schema: Any = (
                    {"$ref": f"#/components/schemas/{body.__name__}"}
                    if isinstance(body, type)
                    else body
                )
                operation["requestBody"] = {
                    "required": True,
                    "content": {
                        info["body_content_type"]: {"schema": body_schema},
                        **info["other_bodies"],
                    },
                }
            for status, target in info["responses"].items():
                operation["responses"][str(status)] = _response(spec, status, target)
                if status in info["headers"]:
                    operation["responses"][str(status)]["headers"] = info["headers"][status]
                if status in info["links"]:
                    operation["responses"][str(status)]["links"] = info["links"][status]
            paths.setdefault(path, {})[method.lower()] = operation
    for path, operations in paths.items():
        spec.path(path=path, operations=operations)
    return spec.to_dict()


@lru_cache(maxsize=4)
def _cached_yaml(app_id: int, app: Flask) -> str:
    text: str = yaml.safe_dump(build_spec(app), sort_keys=False, allow_unicode=True)
    return text


def _schema_classes(app: Flask) -> dict[str, type]:
    """The schema classes of the document, by component name."""
    found: dict[str, type] = {}
    for module in (pm, ms):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Schema):
                found.setdefault(value.__name__, value)
    for extra in app.extensions.get("openapi_schemas", []):
        found.setdefault(extra.__name__, extra)
    return found


def spec_yaml(app: Flask) -> str:
    return _cached_yaml(id(app), app)
