"""The JSON Schema of every value a request names, built from the rules the server checks it by.

Each function below states one rule of app/storage/core (an id, a name, a path, a time, a
search query, a hash) from that rule's own constants and patterns, for the OpenAPI document
and the MCP tools' input schemas: path, query and header parameters take them as their
``schema``, request bodies and tool arguments through a field's ``metadata["rule"]``
(field_rule merges it into the field's property). The server keeps checking with the core
functions themselves; nothing here is a second copy to keep in step.

Where JSON Schema cannot say a rule whole, the description does: lengths the server counts in
bytes of UTF-8 are given as ``maxLength`` in characters (exact for ASCII), and a memory path
must also be NFC across characters (a letter then the combining mark NFC composes with it).
"""

from __future__ import annotations

from typing import Any

from app.storage.core.clock import EPOCH_SECONDS_PATTERN, time_pattern
from app.storage.core.names import ARTIFACT_NAME_PATTERN, ID_PATTERN, MAX_TURN
from app.storage.core.query import MAX_QUERY_CHARS, query_pattern
from app.storage.core.store_rules import (
    MAX_CONTENT_BYTES,
    MAX_DESCRIPTION_CHARS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_PATH_BYTES,
    SHA256_PATTERN,
    memory_path_pattern,
    store_name_pattern,
)

Rule = dict[str, Any]


def field_rule(converter: Any, field: Any, **kwargs: Any) -> Rule:
    """A body field's rule, given as ``metadata["rule"]``, merged into its property: the
    constraints the server checks the field's value by. An attribute function of apispec's
    marshmallow converter, for the OpenAPI document and the MCP tools' input schemas alike."""
    rule = field.metadata.get("rule")
    if rule is None:
        return {}
    # A callable: the patterns are spelled from Unicode's tables, which takes a moment, when
    # the schema is built rather than at every import.
    found: Rule = rule() if callable(rule) else rule
    return found


def identifier() -> Rule:
    """A tenant, project or task id (core/names.py ``validate_id``)."""
    return {"type": "string", "pattern": f"^{ID_PATTERN}$"}


def artifact_name() -> Rule:
    """An artifact name (core/names.py ``validate_artifact_name``): the seed's pattern, but
    for ``.`` and ``..``."""
    return {
        "type": "string",
        "pattern": f"^{ARTIFACT_NAME_PATTERN}$",
        "not": {"enum": [".", ".."]},
    }


def turn() -> Rule:
    return {"type": "integer", "minimum": 0, "maximum": MAX_TURN}


def search_query() -> Rule:
    """A search's ``q`` (core/query.py ``parse_query``). Its length stands in an ``allOf``:
    beside the pattern, a generator asked for a string of exactly the maximum length that
    also follows the syntax (schemathesis's coverage phase does) searches for minutes."""
    return {
        "type": "string",
        "pattern": query_pattern(),
        "allOf": [{"minLength": 1, "maxLength": MAX_QUERY_CHARS}],
    }


def time(*, query: bool, epoch: bool = False) -> Rule:
    """A time a request names (core/clock.py ``parse_time_us``); with ``epoch``, also a
    number of seconds since the epoch written in digits."""
    pattern = time_pattern(query=query)
    if epoch:
        pattern = f"{pattern}|{EPOCH_SECONDS_PATTERN}"
    return {"pattern": f"^(?:{pattern})$"}


def memory_path() -> Rule:
    """A memory's path (core/store_rules.py ``validate_memory_path``)."""
    return {"minLength": 2, "maxLength": MAX_PATH_BYTES, "pattern": f"^{memory_path_pattern()}$"}


def path_prefix() -> Rule:
    """A memory list's ``path_prefix``: ``/``, or a valid path followed by ``/``."""
    return {"type": "string", "pattern": f"^(?:/|{memory_path_pattern()}/)$"}


def store_name() -> Rule:
    return {"minLength": 1, "maxLength": MAX_NAME_CHARS, "pattern": store_name_pattern()}


def description() -> Rule:
    return {"maxLength": MAX_DESCRIPTION_CHARS}


def metadata(*, patch: bool) -> Rule:
    """A store's metadata; as a ``patch``, a null value deletes its key."""
    value: Rule = {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS}
    if patch:
        value = {"type": ["string", "null"], "maxLength": MAX_METADATA_VALUE_CHARS}
    return {
        "maxProperties": MAX_METADATA_PAIRS,
        "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY_CHARS},
        "additionalProperties": value,
    }


def content() -> Rule:
    return {"maxLength": MAX_CONTENT_BYTES}


def sha256() -> Rule:
    return {"pattern": f"^{SHA256_PATTERN}$"}
