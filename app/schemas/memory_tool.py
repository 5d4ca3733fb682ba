"""Schemas of the memory-tool endpoint: a ``memory_20250818`` tool input in, its result out.

The input is what the model produced, so its fields are checked by the tool itself and a
bad one becomes an error *result* the model can read, not an HTTP error. The OpenAPI
document therefore gives each field's type in words only: any JSON object is a request the
endpoint answers with 200 (what a value of the wrong type gets is an error result).
"""

from __future__ import annotations

from marshmallow import INCLUDE, Schema, fields


class MemoryToolInput(Schema):
    """The ``input`` of a ``tool_use`` block of the ``memory`` tool, as Claude sent it."""

    class Meta:
        unknown = INCLUDE

    command = fields.Raw(
        allow_none=True,
        metadata={
            "description": "Required: view, create, str_replace, insert, delete or rename; a"
            " missing or unknown command is an error result.",
        },
    )
    path = fields.Raw(
        allow_none=True, metadata={"description": "A string starting with /memories."}
    )
    view_range = fields.Raw(
        allow_none=True,
        metadata={
            "description": "view: [start_line, end_line], two integers; end_line -1 means to"
            " the end.",
        },
    )
    file_text = fields.Raw(allow_none=True, metadata={"description": "create: a string"})
    old_str = fields.Raw(allow_none=True, metadata={"description": "str_replace: a string"})
    new_str = fields.Raw(
        allow_none=True, metadata={"description": "str_replace: a string (optional)"}
    )
    insert_line = fields.Raw(
        allow_none=True, metadata={"description": "insert: an integer, 0 = start"}
    )
    insert_text = fields.Raw(allow_none=True, metadata={"description": "insert: a string"})
    old_path = fields.Raw(allow_none=True, metadata={"description": "rename: a string"})
    new_path = fields.Raw(allow_none=True, metadata={"description": "rename: a string"})


class MemoryToolResult(Schema):
    type = fields.Constant("memory_tool_result", metadata={"enum": ["memory_tool_result"]})
    content = fields.String(
        required=True, metadata={"description": "The text to send back as the tool_result."}
    )
    is_error = fields.Boolean(
        required=True, metadata={"description": "Send the tool_result with is_error: true."}
    )


OPENAPI_SCHEMAS = (MemoryToolInput, MemoryToolResult)
