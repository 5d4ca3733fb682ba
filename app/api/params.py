"""The OpenAPI parameters, responses and links the views of both APIs declare with ``@doc``.

Each is written once here and shared by the operations that take it, so two operations
cannot describe the same parameter two ways. The error maps differ by API: project memory
answers the seed's ``HTTPError``/``HTTPValidationError``, memory stores its own envelope.
"""

from __future__ import annotations

from typing import Any

from app.api.docs import links
from app.schemas import rules
from app.storage.core.names import (
    ARTIFACT_NAME_PATTERN,
    ID_PATTERN,
    MAX_TURN,
    MEMORY_ID_PATTERN,
    STORE_ID_PATTERN,
    VERSION_ID_PATTERN,
)


def path_param(name: str, pattern: str) -> dict[str, Any]:
    """A required path parameter that matches ``pattern`` whole."""
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{pattern}$"},
    }


def query_param(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    """An optional query parameter."""
    param = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        param["description"] = description
    return param


# -- project memory ------------------------------------------------------------------------
TASK_ID = {
    "name": "task_id",
    "in": "path",
    "required": True,
    "description": f"Task id: {ID_PATTERN}",
    "schema": rules.identifier(),
}
TURN = {
    "name": "turn",
    "in": "path",
    "required": True,
    "description": f"Turn number (stored zero-padded, 0000-{MAX_TURN})",
    "schema": rules.turn(),
}
NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": f"Artifact name: {ARTIFACT_NAME_PATTERN} ('.' and '..' alone excepted)",
    "schema": rules.artifact_name(),
}


def cursor_param(what: str) -> dict[str, Any]:
    """A page cursor: opaque, only ever one the server gave (a 422 otherwise)."""
    return {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": f"The {what} of the previous page, as it was given (anything else is"
        " a 422); absent or empty: the first page.",
        "schema": {"type": "string"},
    }


CONDITIONAL = [
    {
        "name": "If-Match",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "Write only if the current ETag matches (412 otherwise).",
    },
    {
        "name": "If-None-Match",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "enum": ["*"]},
        "description": "'*': write only if the resource does not exist yet (412 otherwise).",
    },
]
# A write's preconditions: 412 when one does not hold, 400 for an If-None-Match other than '*'.
CONDITIONAL_ERRORS: dict[int, object] = {400: "HTTPError", 412: "HTTPError"}
IF_MATCH = {
    **CONDITIONAL[0],
    "description": "Delete only if the current ETag matches (412 otherwise).",
}
# What a write masked (docs/secrets.md): on the answer of one that masked any secret.
SECRETS_MASKED = {
    "Memory-Secrets-Masked": {
        "schema": {"type": "string", "example": "github-token=1, jwt=2"},
        "description": "The secrets this write masked as [secret:<kind>], by kind and count"
        " (absent when it masked none).",
    }
}
ETAG_HEADER = {
    200: {"ETag": {"schema": {"type": "string"}, "description": "Version of the resource."}}
}
WRITE_HEADERS = {200: {**ETAG_HEADER[200], **SECRETS_MASKED}}
ERRORS: dict[int, object] = {
    401: "HTTPError",
    403: "HTTPError",
    422: "HTTPValidationError",
    503: "HTTPError",
}
# Writes that add bytes: over a quota, or at the disk's free-space floor (docs/operations.md).
FULL: dict[int, object] = {507: "HTTPError"}

# -- memory stores -------------------------------------------------------------------------
STORE_TAGS = ["memory-stores"]
STORE_ID = path_param("memory_store_id", STORE_ID_PATTERN)
MEMORY_ID = path_param("memory_id", MEMORY_ID_PATTERN)
VERSION_ID = path_param("memory_version_id", VERSION_ID_PATTERN)
LIMIT = query_param("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20})
PAGE = query_param(
    "page",
    {"type": "string"},
    "The next_page value of the previous response, as it was given (anything else is a 400);"
    " absent or empty: the first page.",
)
TIME_RULE = (
    "An RFC 3339 time (a date alone, or one without an offset (UTC), too; an unencoded '+'"
    " that arrives as a space is read as '+')."
)
CREATED_RANGE = [
    query_param(bound, {"type": "string", **rules.time(query=True)}, f"Inclusive. {TIME_RULE}")
    for bound in ("created_at[gte]", "created_at[lte]")
]


def view_param(default: str) -> dict[str, Any]:
    """``view``: whether the answer carries content."""
    return query_param(
        "view",
        {"type": "string", "enum": ["basic", "full"], "default": default},
        "basic: content is null; full: content included (lists then hold at most 20 items).",
    )


STORE_ERRORS: dict[int, object] = {
    400: "MemoryStoresError",
    401: "MemoryStoresError",
    403: "MemoryStoresError",
    404: "MemoryStoresError",
    503: "MemoryStoresError",
}
STORE_CONFLICTS: dict[int, object] = {**STORE_ERRORS, 409: "MemoryStoresError"}
# Writes that add bytes: over a quota, or at the disk's free-space floor (docs/operations.md).
STORE_FULL: dict[int, object] = {507: "MemoryStoresError"}

# What a store's or a memory's answer addresses: its own operations.
STORE_LINKS = links(
    "get_memory_store",
    "update_memory_store",
    "delete_memory_store",
    "archive_memory_store",
    "create_memory",
    "list_memories",
    "list_memory_versions",
    "run_memory_tool",
    memory_store_id="/id",
)
MEMORY_LINKS = {
    **links(
        "get_memory",
        "update_memory",
        "patch_memory",
        "delete_memory",
        memory_store_id="/memory_store_id",
        memory_id="/id",
    ),
    **links(
        "get_memory_version",
        "redact_memory_version",
        memory_store_id="/memory_store_id",
        memory_version_id="/memory_version_id",
    ),
}
