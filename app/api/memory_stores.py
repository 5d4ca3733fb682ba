"""The memory-stores API under /v1/memory_stores, wire-compatible with the SDKs.

``anthropic-version``, ``anthropic-beta`` and ``?beta=true`` are accepted and ignored.
Errors use the envelope ``{"type": "error", "error": {"type", "message"}, "request_id"}``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request

from app.api.common import (
    json_body,
    json_response,
    masked_headers,
    optional_json_body,
    storage,
)
from app.api.docs import doc
from app.api.params import (
    CREATED_RANGE,
    LIMIT,
    MEMORY_ID,
    MEMORY_LINKS,
    PAGE,
    SECRETS_MASKED,
    STORE_CONFLICTS,
    STORE_ERRORS,
    STORE_FULL,
    STORE_ID,
    STORE_LINKS,
    STORE_TAGS,
    VERSION_ID,
    query_param,
    view_param,
)
from app.api.query import (
    STORES,
    query_bool,
    query_choice,
    query_full,
    query_time_us,
    store_page_limit,
)
from app.schemas import memory_stores as s, rules
from app.services import stores
from app.services.secrets import Screen
from app.storage.core.store_models import MemoryPrefix, Page, VersionFilter
from app.storage.interface import StoreBackend
from app.web.auth import current_principal, require_principal

PREFIX = "/v1/memory_stores"
bp = Blueprint("memory_stores", __name__, url_prefix=PREFIX)

store_create_in = s.MemoryStoreCreateRequest()
store_update_in = s.MemoryStoreUpdateRequest()
empty_in = s.EmptyRequest()
memory_create_in = s.MemoryCreateRequest()
memory_update_in = s.MemoryUpdateRequest()
store_out = s.MemoryStore()
store_list_out = s.MemoryStoreList()
deleted_store_out = s.DeletedMemoryStore()
memory_out = s.Memory()
prefix_out = s.MemoryPrefix()
deleted_memory_out = s.DeletedMemory()
version_out = s.MemoryVersion()
version_list_out = s.MemoryVersionList()


@bp.before_request
def _authenticate() -> None:
    require_principal()


@bp.after_request
def _no_retry_on_conflict(response: Response) -> Response:
    # The SDKs retry 409 by default; a failed precondition or a taken path will not heal
    # by itself, so tell them not to (the header the SDKs honour).
    if response.status_code == 409:
        response.headers["x-should-retry"] = "false"
    return response


def engine() -> StoreBackend:
    return storage().stores


def _memory_page(page: Page) -> dict[str, Any]:
    return {
        "data": [
            prefix_out.dump(item) if isinstance(item, MemoryPrefix) else memory_out.dump(item)
            for item in page.data
        ],
        "next_page": page.next_page,
    }


# -- stores --------------------------------------------------------------------------------
@bp.post("")
@doc(
    body=s.MemoryStoreCreateRequest,
    responses={200: s.MemoryStore, **STORE_ERRORS, **STORE_FULL},
    headers={200: SECRETS_MASKED},
    links={200: STORE_LINKS},
    tags=STORE_TAGS,
)
def create_memory_store() -> Response:
    """Create a memory store"""
    data = json_body(store_create_in)
    screen = Screen.of(storage(), current_principal())
    store = stores.create_store(
        storage(),
        current_principal(),
        name=data["name"],
        description=data.get("description") or "",
        metadata=data.get("metadata") or {},
        screen=screen,
    )
    return json_response(store_out.dump(store), headers=masked_headers(screen))


@bp.get("")
@doc(
    params=[
        LIMIT,
        PAGE,
        query_param("include_archived", {"type": "boolean", "default": False}),
        *CREATED_RANGE,
    ],
    responses={200: s.MemoryStoreList, **STORE_ERRORS},
    tags=STORE_TAGS,
)
def list_memory_stores() -> Response:
    """List memory stores, newest first"""
    page = engine().list_stores(
        current_principal().scope,
        limit=store_page_limit(False),
        page=request.args.get("page") or None,
        include_archived=query_bool("include_archived"),
        created_gte_us=query_time_us("created_at[gte]", STORES),
        created_lte_us=query_time_us("created_at[lte]", STORES),
    )
    return json_response(store_list_out.dump(page))


@bp.get("/<memory_store_id>")
@doc(params=[STORE_ID], responses={200: s.MemoryStore, **STORE_ERRORS}, tags=STORE_TAGS)
def get_memory_store(memory_store_id: str) -> Response:
    """Retrieve a memory store (archived ones too)"""
    return json_response(
        store_out.dump(engine().get_store(current_principal().scope, memory_store_id))
    )


@bp.post("/<memory_store_id>")
@doc(
    params=[STORE_ID],
    body=s.MemoryStoreUpdateRequest,
    responses={200: s.MemoryStore, **STORE_CONFLICTS},
    headers={200: SECRETS_MASKED},
    tags=STORE_TAGS,
)
def update_memory_store(memory_store_id: str) -> Response:
    """Update a memory store's name, description or metadata (a patch)

    Its creator, or a project_admin and above (403 otherwise).
    """
    data = json_body(store_update_in)
    screen = Screen.of(storage(), current_principal())
    store = stores.update_store(
        storage(),
        current_principal(),
        memory_store_id,
        name=data.get("name"),
        description=data.get("description"),
        metadata=data.get("metadata"),
        screen=screen,
    )
    return json_response(store_out.dump(store), headers=masked_headers(screen))


@bp.delete("/<memory_store_id>")
@doc(params=[STORE_ID], responses={200: s.DeletedMemoryStore, **STORE_ERRORS}, tags=STORE_TAGS)
def delete_memory_store(memory_store_id: str) -> Response:
    """Delete a memory store with all its memories and versions

    Its creator, or a project_admin and above (403 otherwise).
    """
    deleted = stores.delete_store(storage(), current_principal(), memory_store_id)
    return json_response(deleted_store_out.dump(deleted))


@bp.post("/<memory_store_id>/archive")
@doc(params=[STORE_ID], responses={200: s.MemoryStore, **STORE_ERRORS}, tags=STORE_TAGS)
def archive_memory_store(memory_store_id: str) -> Response:
    """Archive a memory store (one-way; it becomes read-only)

    Its creator, or a project_admin and above (403 otherwise).
    """
    optional_json_body(empty_in)
    store = stores.archive_store(storage(), current_principal(), memory_store_id)
    return json_response(store_out.dump(store))


# -- memories ------------------------------------------------------------------------------
@bp.post("/<memory_store_id>/memories")
@doc(
    params=[STORE_ID, view_param("basic")],
    body=s.MemoryCreateRequest,
    responses={200: s.Memory, **STORE_CONFLICTS, **STORE_FULL},
    headers={200: SECRETS_MASKED},
    links={200: MEMORY_LINKS},
    tags=STORE_TAGS,
)
def create_memory(memory_store_id: str) -> Response:
    """Create a memory at an unoccupied path"""
    full = query_full("basic")
    data = json_body(memory_create_in)
    screen = Screen.of(storage(), current_principal())
    memory = stores.create_memory(
        storage(),
        current_principal(),
        memory_store_id,
        path=data["path"],
        content=data["content"],
        full=full,
        screen=screen,
    )
    return json_response(memory_out.dump(memory), headers=masked_headers(screen))


@bp.get("/<memory_store_id>/memories")
@doc(
    params=[
        STORE_ID,
        lambda app: query_param(
            "path_prefix",
            {**rules.path_prefix(), "default": "/"},
            "'/', or a memory path followed by '/' (segment-aligned).",
        ),
        query_param("depth", {"type": "integer", "enum": [0, 1], "default": 0}),
        LIMIT,
        PAGE,
        view_param("basic"),
    ],
    responses={200: s.MemoryList, **STORE_ERRORS},
    tags=STORE_TAGS,
)
def list_memories(memory_store_id: str) -> Response:
    """List memories in path order (depth 1 rolls deeper paths up into memory_prefix)"""
    full = query_full("basic")
    depth = query_choice("depth", "0", ("0", "1"), "must be 0 or 1")
    page = engine().list_memories(
        current_principal().scope,
        memory_store_id,
        path_prefix=request.args.get("path_prefix", "/"),
        depth=int(depth),
        limit=store_page_limit(full),
        page=request.args.get("page") or None,
        full=full,
    )
    return json_response(_memory_page(page))


@bp.get("/<memory_store_id>/memories/<memory_id>")
@doc(
    params=[STORE_ID, MEMORY_ID, view_param("full")],
    responses={200: s.Memory, **STORE_ERRORS},
    tags=STORE_TAGS,
)
def get_memory(memory_store_id: str, memory_id: str) -> Response:
    """Retrieve a memory"""
    memory = engine().get_memory(
        current_principal().scope, memory_store_id, memory_id, full=query_full("full")
    )
    return json_response(memory_out.dump(memory))


def _update_memory(memory_store_id: str, memory_id: str) -> Response:
    full = query_full("basic")
    data = json_body(memory_update_in)
    precondition = data.get("precondition")
    screen = Screen.of(storage(), current_principal())
    memory = stores.update_memory(
        storage(),
        current_principal(),
        memory_store_id,
        memory_id,
        content=data.get("content"),
        path=data.get("path"),
        precondition_sha256=precondition["content_sha256"] if precondition else None,
        full=full,
        screen=screen,
    )
    return json_response(memory_out.dump(memory), headers=masked_headers(screen))


UPDATE_DOC = doc(
    params=[STORE_ID, MEMORY_ID, view_param("basic")],
    body=s.MemoryUpdateRequest,
    responses={200: s.Memory, **STORE_CONFLICTS, **STORE_FULL},
    headers={200: SECRETS_MASKED},
    links={200: MEMORY_LINKS},
    tags=STORE_TAGS,
)


@bp.post("/<memory_store_id>/memories/<memory_id>")
@UPDATE_DOC
def update_memory(memory_store_id: str, memory_id: str) -> Response:
    """Update a memory's content and/or path (optionally on a content_sha256 precondition)"""
    return _update_memory(memory_store_id, memory_id)


@bp.patch("/<memory_store_id>/memories/<memory_id>")
@UPDATE_DOC
def patch_memory(memory_store_id: str, memory_id: str) -> Response:
    """Update a memory (PATCH alias of the POST update)"""
    return _update_memory(memory_store_id, memory_id)


@bp.delete("/<memory_store_id>/memories/<memory_id>")
@doc(
    params=[
        STORE_ID,
        MEMORY_ID,
        query_param(
            "expected_content_sha256",
            {"type": "string", **rules.sha256()},
            "Delete only if the memory's content_sha256 equals this (409 otherwise).",
        ),
    ],
    responses={200: s.DeletedMemory, **STORE_CONFLICTS},
    tags=STORE_TAGS,
)
def delete_memory(memory_store_id: str, memory_id: str) -> Response:
    """Delete a memory (its versions stay, subject to retention)"""
    deleted = stores.delete_memory(
        storage(),
        current_principal(),
        memory_store_id,
        memory_id,
        expected_sha256=request.args.get("expected_content_sha256"),
    )
    return json_response(deleted_memory_out.dump(deleted))


# -- versions ------------------------------------------------------------------------------
@bp.get("/<memory_store_id>/memory_versions")
@doc(
    params=[
        STORE_ID,
        query_param("memory_id", {"type": "string"}),
        query_param("operation", {"type": "string", "enum": ["created", "modified", "deleted"]}),
        query_param("api_key_id", {"type": "string"}),
        query_param("session_id", {"type": "string"}),
        query_param("service_account_id", {"type": "string"}),
        *CREATED_RANGE,
        LIMIT,
        PAGE,
        view_param("basic"),
    ],
    responses={200: s.MemoryVersionList, **STORE_ERRORS},
    tags=STORE_TAGS,
)
def list_memory_versions(memory_store_id: str) -> Response:
    """List memory versions, newest first"""
    full = query_full("basic")
    args = request.args
    filters = VersionFilter(
        memory_id=args.get("memory_id"),
        operation=args.get("operation"),
        api_key_id=args.get("api_key_id"),
        session_id=args.get("session_id"),
        service_account_id=args.get("service_account_id"),
        created_gte_us=query_time_us("created_at[gte]", STORES),
        created_lte_us=query_time_us("created_at[lte]", STORES),
    )
    page = engine().list_versions(
        current_principal().scope,
        memory_store_id,
        filters=filters,
        limit=store_page_limit(full),
        page=args.get("page") or None,
        full=full,
    )
    return json_response(version_list_out.dump(page))


@bp.get("/<memory_store_id>/memory_versions/<memory_version_id>")
@doc(
    params=[STORE_ID, VERSION_ID, view_param("full")],
    responses={200: s.MemoryVersion, **STORE_ERRORS},
    tags=STORE_TAGS,
)
def get_memory_version(memory_store_id: str, memory_version_id: str) -> Response:
    """Retrieve a memory version (a redacted one answers 200 with null content fields)"""
    version = engine().get_version(
        current_principal().scope, memory_store_id, memory_version_id, full=query_full("full")
    )
    return json_response(version_out.dump(version))


@bp.post("/<memory_store_id>/memory_versions/<memory_version_id>/redact")
@doc(
    params=[STORE_ID, VERSION_ID],
    responses={200: s.MemoryVersion, **STORE_CONFLICTS},
    tags=STORE_TAGS,
)
def redact_memory_version(memory_store_id: str, memory_version_id: str) -> Response:
    """Redact a memory version (not the head of a live memory)

    A project_admin and above (403 otherwise).
    """
    optional_json_body(empty_in)
    version = stores.redact_version(
        storage(), current_principal(), memory_store_id, memory_version_id
    )
    return json_response(version_out.dump(version))
