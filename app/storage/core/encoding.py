"""JSON as the service writes it: records a person reads with ``cat``, and compact one-line
bodies for the API, the request log and PostgreSQL's JSON columns."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """A record as people read it with ``cat``: indented UTF-8 JSON and a final newline.

    Encoded by orjson: the standard library's indented encoder is pure Python, a large share
    of a turn write's CPU. What orjson refuses (an integer beyond
    64 bits, a non-string key) falls back to the standard library, so nothing it could store
    before is refused now. NaN and infinities never get here (the API and put_turn refuse
    them; orjson would write null). Decoding stays with ``json.loads``: orjson reads an
    integer beyond 64 bits as a float, which would change what was stored.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        text = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False)
        return text.encode("utf-8") + b"\n"


def dumps_compact(obj: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """One-line UTF-8 JSON (API responses), with the same fallback as :func:`dumps`."""
    try:
        return orjson.dumps(
            obj,
            default=default,
            option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS,
        )
    except TypeError:
        return json.dumps(obj, ensure_ascii=False, default=default).encode("utf-8")


def whole_number(obj: Any, key: str) -> int:
    """``obj[key]`` as an int, or a ValueError that names the field (a record's reader says
    which field is wrong, not Python's ``invalid literal for int()``)."""
    value = obj[key]
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key} {value!r} is not a whole number") from None
