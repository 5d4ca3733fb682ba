"""Schemas of the memory-stores API, shaped like the Anthropic reference.

Request schemas refuse unknown fields (the spec's bodies are ``additionalProperties:
false``) and wrong JSON types; the value rules (path, sizes, metadata limits) live in the
storage engine, which enforces them whoever calls it. Each field names its rule
(app/schemas/rules.py) for the OpenAPI document.
"""

from __future__ import annotations

from marshmallow import RAISE, Schema, fields, validate

from app.schemas import rules
from app.schemas.common import StrictString


class _Strict(Schema):
    class Meta:
        unknown = RAISE


NAME_RULE = "1 to 255 characters, no control character."


class MemoryStoreCreateRequest(_Strict):
    name = StrictString(
        required=True, metadata={"description": NAME_RULE, "rule": rules.store_name}
    )
    description = StrictString(
        allow_none=True,
        metadata={
            "description": "Up to 1,024 characters; default empty.",
            "rule": rules.description,
        },
    )
    metadata = fields.Dict(
        keys=StrictString(),
        values=StrictString(),
        allow_none=True,
        metadata={
            "description": "Up to 16 pairs; keys 1-64, values up to 512 characters.",
            "rule": lambda: rules.metadata(patch=False),
        },
    )


class MemoryStoreUpdateRequest(_Strict):
    name = StrictString(
        allow_none=True, metadata={"description": NAME_RULE, "rule": rules.store_name}
    )
    description = StrictString(
        allow_none=True, metadata={"description": "'' clears it.", "rule": rules.description}
    )
    metadata = fields.Dict(
        keys=StrictString(),
        values=StrictString(allow_none=True),
        allow_none=True,
        metadata={
            "description": "A patch: a string upserts a key, null deletes it; the store keeps"
            " at most 16 pairs.",
            "rule": lambda: rules.metadata(patch=True),
        },
    )


class EmptyRequest(_Strict):
    """No fields: archive and redact take no body (``{}`` is accepted)."""


PATH_RULE = (
    "Starts with '/'; at most 1,024 bytes of UTF-8 and 20 segments, each 1 to 255 bytes;"
    " no empty, '.' or '..' segment, none starting with '.~tmp-'; no control or format"
    " character, U+2028 or U+2029; NFC."
)
CONTENT_RULE = "UTF-8, at most 102,400 bytes."


class MemoryPrecondition(_Strict):
    type = StrictString(required=True, validate=validate.OneOf(["content_sha256"]))
    content_sha256 = StrictString(
        required=True,
        metadata={"description": "64 lowercase hexadecimal characters.", "rule": rules.sha256},
    )


class MemoryCreateRequest(_Strict):
    path = StrictString(
        required=True, metadata={"description": PATH_RULE, "rule": rules.memory_path}
    )
    content = StrictString(
        required=True, metadata={"description": CONTENT_RULE, "rule": rules.content}
    )


class MemoryUpdateRequest(_Strict):
    """At least one of content and path (a string each); an update that changes nothing
    writes no version."""

    # A rule across the fields, which the OpenAPI document states (app/api/openapi.py).
    OPENAPI_RULE = {
        "anyOf": [
            {"required": ["content"], "properties": {"content": {"type": "string"}}},
            {"required": ["path"], "properties": {"path": {"type": "string"}}},
        ]
    }

    content = StrictString(
        allow_none=True, metadata={"description": CONTENT_RULE, "rule": rules.content}
    )
    path = StrictString(
        allow_none=True,
        metadata={"description": f"A rename. {PATH_RULE}", "rule": rules.memory_path},
    )
    precondition = fields.Nested(MemoryPrecondition, allow_none=True)


# -- responses ---------------------------------------------------------------------------
class MemoryStore(Schema):
    type = fields.Constant("memory_store", metadata={"enum": ["memory_store"]})
    id = fields.String(required=True)
    name = fields.String(required=True)
    description = fields.String(required=True)
    metadata = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    created_at = fields.String(required=True)
    updated_at = fields.String(required=True)
    archived_at = fields.String(allow_none=True)


class MemoryStoreList(Schema):
    data = fields.List(fields.Nested(MemoryStore), required=True)
    next_page = fields.String(allow_none=True)


class DeletedMemoryStore(Schema):
    id = fields.String(required=True)
    type = fields.Constant("memory_store_deleted", metadata={"enum": ["memory_store_deleted"]})


class Memory(Schema):
    type = fields.Constant("memory", metadata={"enum": ["memory"]})
    id = fields.String(required=True)
    memory_store_id = fields.String(required=True)
    path = fields.String(required=True)
    content = fields.String(allow_none=True)
    content_size_bytes = fields.Integer(required=True)
    content_sha256 = fields.String(required=True)
    memory_version_id = fields.String(required=True)
    created_at = fields.String(required=True)
    updated_at = fields.String(required=True)


class MemoryPrefix(Schema):
    type = fields.Constant("memory_prefix", metadata={"enum": ["memory_prefix"]})
    path = fields.String(required=True)


class MemoryList(Schema):
    data = fields.List(
        fields.Dict(),
        required=True,
        metadata={"description": "`memory` and `memory_prefix` items, in path order."},
    )
    next_page = fields.String(allow_none=True)


class DeletedMemory(Schema):
    id = fields.String(required=True)
    type = fields.Constant("memory_deleted", metadata={"enum": ["memory_deleted"]})


class MemoryVersion(Schema):
    type = fields.Constant("memory_version", metadata={"enum": ["memory_version"]})
    id = fields.String(required=True)
    memory_store_id = fields.String(required=True)
    memory_id = fields.String(required=True)
    operation = fields.String(required=True, metadata={"enum": ["created", "modified", "deleted"]})
    path = fields.String(allow_none=True)
    content = fields.String(allow_none=True)
    content_size_bytes = fields.Integer(allow_none=True)
    content_sha256 = fields.String(allow_none=True)
    created_by = fields.Dict(allow_none=True)
    created_at = fields.String(required=True)
    redacted_at = fields.String(allow_none=True)
    redacted_by = fields.Dict(allow_none=True)


class MemoryVersionList(Schema):
    data = fields.List(fields.Nested(MemoryVersion), required=True)
    next_page = fields.String(allow_none=True)


class MemoryStoresErrorDetail(Schema):
    type = fields.String(required=True)
    message = fields.String(required=True)
    conflicting_memory_id = fields.String()
    conflicting_path = fields.String()


class MemoryStoresError(Schema):
    type = fields.Constant("error", metadata={"enum": ["error"]})
    error = fields.Nested(MemoryStoresErrorDetail, required=True)
    request_id = fields.String(allow_none=True)


OPENAPI_SCHEMAS = (
    MemoryStoreCreateRequest,
    MemoryStoreUpdateRequest,
    EmptyRequest,
    MemoryPrecondition,
    MemoryCreateRequest,
    MemoryUpdateRequest,
    MemoryStore,
    MemoryStoreList,
    DeletedMemoryStore,
    Memory,
    MemoryPrefix,
    MemoryList,
    DeletedMemory,
    MemoryVersion,
    MemoryVersionList,
    MemoryStoresErrorDetail,
    MemoryStoresError,
)
