"""A tool's ``inputSchema`` and ``outputSchema``, generated from its arguments' and its
result's marshmallow schemas (app/schemas/mcp.py) by apispec's converter, the one that turns
the REST bodies into the OpenAPI document's schemas, with the same field rules
(app/schemas/rules.py).

An MCP client reads the schema alone and resolves no ``#/components``: every nested schema
is written in place. ``required`` lists the arguments in the order they are declared (the
converter sorts them), and the top level always has one, empty or not.
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from marshmallow import Schema

from app.schemas.rules import field_rule

# JSON Schema 2020-12, the dialect of MCP's inputSchema.
OPENAPI_VERSION = "3.1.0"


def _no_name(schema: object) -> None:
    """The converter's name for a nested schema: none, so it is written in place."""
    return None


def input_schema(arguments: type[Schema]) -> dict[str, Any]:
    """The JSON Schema of ``arguments``, self-contained. The tool table (tools.py) makes each
    tool's once, as it is built."""
    return _json_schema(arguments)


def output_schema(results: type[Schema]) -> dict[str, Any]:
    """The JSON Schema of a tool's ``structuredContent``, made as :func:`input_schema` makes
    the arguments'."""
    return _json_schema(results)


def _json_schema(schema: type[Schema]) -> dict[str, Any]:
    spec = APISpec(title="mcp", version="1", openapi_version=OPENAPI_VERSION)
    converter = OpenAPIConverter(OPENAPI_VERSION, _no_name, spec)
    converter.add_attribute_function(field_rule)  # type: ignore[no-untyped-call]
    found: dict[str, Any] = converter.schema2jsonschema(schema)  # type: ignore[no-untyped-call]
    _declared_order(found)
    found.setdefault("required", [])
    return found


def _declared_order(node: Any) -> None:
    """Each object's ``required`` in its properties' order, all through ``node``; a
    reference left in it is an error, since no client would resolve it."""
    if isinstance(node, dict):
        if "$ref" in node:
            raise ValueError(f"an MCP tool's schema must be self-contained: {node['$ref']}")
        properties = node.get("properties")
        if isinstance(properties, dict) and "required" in node:
            required = set(node["required"])
            node["required"] = [name for name in properties if name in required]
        for value in node.values():
            _declared_order(value)
    elif isinstance(node, list):
        for value in node:
            _declared_order(value)
