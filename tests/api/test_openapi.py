"""The OpenAPI document: valid OpenAPI 3.1, the seed's paths and schema names, no drift."""

from __future__ import annotations

import re

import yaml
from flask import Flask
from flask.testing import FlaskClient
from openapi_spec_validator import validate

from app.api.openapi import DOCUMENTED_PREFIXES

SEED_SCHEMAS = {
    "TaskList",
    "TaskSummary",
    "TurnRecord",
    "TurnMeta",
    "PutTurnRequest",
    "ArtifactRecord",
    "MemoryArtifact",
    "HTTPValidationError",
    "ValidationError",
}
SEED_OPERATIONS = {
    ("get", "/sandbox/memory/v1/project.md"),
    ("get", "/sandbox/memory/v1/tasks"),
    ("delete", "/sandbox/memory/v1/tasks/{task_id}"),
    ("get", "/sandbox/memory/v1/tasks/{task_id}"),
    ("get", "/sandbox/memory/v1/tasks/{task_id}/turns/{turn}"),
    ("put", "/sandbox/memory/v1/tasks/{task_id}/turns/{turn}"),
    ("get", "/sandbox/memory/v1/tasks/{task_id}/turns/{turn}/artifacts/{name}"),
    ("put", "/sandbox/memory/v1/tasks/{task_id}/turns/{turn}/artifacts/{name}"),
}


def load_spec(client: FlaskClient) -> dict:
    resp = client.get("/sandbox/memory/v1/openapi.yaml")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/yaml")
    return yaml.safe_load(resp.data)


def test_spec_is_valid_openapi(client: FlaskClient) -> None:
    spec = load_spec(client)
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_spec_has_the_seed_operations_schemas_and_security(client: FlaskClient) -> None:
    spec = load_spec(client)
    operations = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert operations >= SEED_OPERATIONS
    assert set(spec["components"]["schemas"]) >= SEED_SCHEMAS
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
    }
    put = spec["paths"]["/sandbox/memory/v1/tasks/{task_id}/turns/{turn}"]["put"]
    assert put["operationId"] == "put_turn"
    assert (
        put["summary"]
        == "Upsert one turn's meta + summary; refreshes the task index and project.md"
    )
    assert put["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PutTurnRequest"
    }
    assert put["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"
    }
    assert "ETag" in put["responses"]["200"]["headers"]
    meta = spec["components"]["schemas"]["TurnMeta"]["properties"]
    assert {
        "agent_id",
        "model",
        "exit_code",
        "started_at",
        "tokens",
        "cost",
        "claude_session_id",
    } <= set(meta)


def test_no_route_is_missing_from_the_spec(app: Flask, client: FlaskClient) -> None:
    spec = load_spec(client)
    documented = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(DOCUMENTED_PREFIXES) or rule.endpoint == "public.get_openapi":
            continue
        if rule.endpoint.startswith("mcp."):
            continue  # /mcp's alias under the API's prefix: JSON-RPC, not a REST operation
        path = re.sub(r"<(?:[a-z]+:)?([a-zA-Z_]+)>", r"{\1}", rule.rule)
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            assert (method.lower(), path) in documented, f"{method} {path} is not in openapi.yaml"
