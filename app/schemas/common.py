"""Fields and helpers shared by both APIs' schemas."""

from __future__ import annotations

import math
from typing import Any

from marshmallow import Schema, ValidationError, fields

from app.storage.core.clock import is_time

# marshmallow reports messages, not codes: map the ones our fields raise to FastAPI types.
_TYPES = {
    "Missing data for required field.": "missing",
    "Unknown field.": "extra_forbidden",
    "Field may not be null.": "none_forbidden",
    "Not a valid string.": "string_type",
    "Not a valid integer.": "int_type",
    "Not a valid number.": "float_type",
    "Not a valid mapping type.": "dict_type",
    "Invalid input type.": "dict_type",
}


class StrictInteger(fields.Integer):
    """An integer that refuses booleans, floats and numeric strings."""

    default_error_messages = {"invalid": "Not a valid integer."}

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.make_error("invalid")
        return value


class StrictString(fields.String):
    default_error_messages = {"invalid": "Not a valid string."}

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> str:
        if not isinstance(value, str):
            raise self.make_error("invalid")
        return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class TimeValue(fields.Field):  # type: ignore[type-arg]
    """An RFC 3339 time (core/clock.py ``time_pattern``: a date alone, or without an offset,
    too) or a number of seconds since the epoch; kept as sent."""

    default_error_messages = {
        "invalid": "Not an RFC 3339 time (e.g. 2026-01-01T12:00:00Z) or an epoch number.",
    }

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if _is_number(value) or is_time(value):
            return value
        raise self.make_error("invalid")


class IntOrObject(fields.Field):  # type: ignore[type-arg]
    default_error_messages = {"invalid": "Not an integer or an object."}

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, dict) or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise self.make_error("invalid")


class NumberOrObject(fields.Field):  # type: ignore[type-arg]
    default_error_messages = {"invalid": "Not a number or an object."}

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, dict) or _is_number(value):
            return value
        raise self.make_error("invalid")


def _flatten(messages: Any, loc: list[str | int], data: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(messages, dict):
        for key, sub in messages.items():
            child = data.get(key) if isinstance(data, dict) else None
            _flatten(sub, [*loc, key], child, out)
        return
    if isinstance(messages, list) and messages and all(isinstance(m, str) for m in messages):
        for msg in messages:
            item: dict[str, Any] = {"loc": loc, "msg": msg, "type": _TYPES.get(msg, "value_error")}
            if data is not None and msg != "Missing data for required field.":
                item["input"] = _clip(data)
            out.append(item)
        return
    out.append({"loc": loc, "msg": str(messages), "type": "value_error"})


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "…"
    if isinstance(value, dict | list) and len(repr(value)) > 500:
        return None
    return value


def load(schema: Schema, data: Any, location: str | list[str] = "body") -> Any:
    """Load ``data`` with ``schema`` or raise a 422 listing every fault with its location
    (``location``: where ``data`` was, "body" or a path into it such as ["body", "turn"])."""
    # Imported here: the schemas themselves import no Flask, so the services (the MCP tools)
    # validate with them outside a request.
    from app.web.errors import RequestValidationError

    try:
        return schema.load(data)
    except ValidationError as exc:
        errors: list[dict[str, Any]] = []
        loc: list[str | int] = [location] if isinstance(location, str) else [*location]
        _flatten(exc.messages, loc, data, errors)
        raise RequestValidationError(errors) from None
