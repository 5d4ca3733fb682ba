"""Schemas of the memory-tool endpoint: a ``memory_20250818`` tool input in, its result out.

The input is what the model produced, so its fields are checked by the tool itself and a
bad one becomes an error *result* the model can read, not an HTTP error.
"""

from __future__ import annotations

from marshmallow import INCLUDE, Schema, fields


class MemoryToolInput(Schema):
    """The ``input`` of a ``tool_use`` block of the ``memory`` tool, as Claude sent it."""

    class Meta:
        unknown = INCLUDE

    command = fields.Raw(
        metadata={
            "description": "Required; a missing or unknown command is an error result.",
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert", "delete", "rename"],
        },
    )
    path = fields.Raw(metadata={"type": "string", "description": "Starts with /memories."})
    view_range = fields.Raw(
        metadata={
            "type": "array",
            "items": {"type": "integer"},
            "description": "view: [start_line, end_line]; end_line -1 means to the end.",
        }
    )
    file_text = fields.Raw(metadata={"type": "string", "description": "create"})
    old_str = fields.Raw(metadata={"type": "string", "description": "str_replace"})
    new_str = fields.Raw(metadata={"type": "string", "description": "str_replace (optional)"})
    insert_line = fields.Raw(metadata={"type": "integer", "description": "insert: 0 = start"})
    insert_text = fields.Raw(metadata={"type": "string", "description": "insert"})
    old_path = fields.Raw(metadata={"type": "string", "description": "rename"})
    new_path = fields.Raw(metadata={"type": "string", "description": "rename"})


class MemoryToolResult(Schema):
    type = fields.Constant("memory_tool_result", metadata={"enum": ["memory_tool_result"]})
    content = fields.String(
        required=True, metadata={"description": "The text to send back as the tool_result."}
    )
    is_error = fields.Boolean(
        required=True, metadata={"description": "Send the tool_result with is_error: true."}
    )


OPENAPI_SCHEMAS = (MemoryToolInput, MemoryToolResult)
