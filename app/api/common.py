"""Request helpers shared by the blueprints: JSON bodies, path parameters, headers."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import orjson
from flask import Response, current_app, request
from marshmallow import Schema
from werkzeug.exceptions import ClientDisconnected

from app.schemas.common import load
from app.services.secrets import Screen
from app.storage.core.errors import InvalidName
from app.storage.core.names import MAX_TURN, validate_artifact_name, validate_id
from app.storage.core.task_rules import check_content_type, entity_tags
from app.storage.interface import StorageBackend
from app.web.errors import ApiError, validation_error

MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 20
_UNSIGNED_INT = re.compile(rf"[0-9]{{1,{MAX_INT_DIGITS}}}")
_SIGNED_INT = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _depth(value: Any, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def storage() -> StorageBackend:
    """The storage backend the app was built with (app/storage/interface.py)."""
    found: StorageBackend = current_app.extensions["storage"]
    return found


def json_body(schema: Schema) -> Any:
    """Parse the request body as JSON and load it with ``schema`` (every fault → 422)."""
    request.max_content_length = current_app.config["MAX_JSON_BYTES"]
    return json_document(request.get_data(cache=False), schema, ["body"])


def optional_json_body(schema: Schema) -> Any:
    """A body that may be absent, as ``json_body`` reads it; ``{}`` when there is none."""
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    if not request.content_length and not chunked:
        return {}
    return json_body(schema)


def json_document(raw: bytes, schema: Schema, loc: list[str | int]) -> Any:
    """Parse ``raw`` as a JSON object and load it with ``schema``; a fault is a 422 at ``loc``
    (the body, or the part of it that held the document)."""
    data = _strict_loads(raw)
    if data is _SLOW:
        data = _checked_loads(raw, loc)
    if _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise validation_error(loc, f"nested deeper than {MAX_JSON_DEPTH} levels", "value_error")
    if not isinstance(data, dict):
        raise validation_error(loc, "Input should be a valid dictionary", "dict_type", data)
    return load(schema, data, [str(part) for part in loc])


_SLOW = object()
# A run of digits orjson may read as a float: an integer beyond 64 bits keeps its value only
# through the standard library.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _strict_loads(raw: bytes) -> Any:
    """``raw`` parsed in one pass by orjson, which refuses everything the API refuses (invalid
    UTF-8, NaN and infinities, unpaired surrogates, a BOM); ``_SLOW`` for what it would read
    differently (a long integer) or refuses, which the standard library reads again, so the
    document gets the same answer, and the same error, either way."""
    if _LONG_DIGITS.search(raw) is not None:
        return _SLOW
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _SLOW


def _checked_loads(raw: bytes, loc: list[str | int]) -> Any:
    """``raw`` parsed by the standard library, each fault a 422 that says what it is."""
    try:
        text = raw.decode("utf-8")
        data = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = str(exc)
        if "int_max_str_digits" in why:  # Python's own limit, named in terms of Python
            why = f"an integer of more than {sys.get_int_max_str_digits()} digits"
        raise validation_error(loc, f"JSON decode error: {why}", "json_invalid") from None
    if _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:  # before walking it again below
        raise validation_error(loc, f"nested deeper than {MAX_JSON_DEPTH} levels", "value_error")
    try:
        # Lone surrogates (\ud800) parse but cannot be stored as UTF-8.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise validation_error(loc, "contains unpaired UTF-16 surrogates", "value_error") from None
    return data


def path_task_id(value: str) -> str:
    try:
        return validate_id("task_id", value)
    except InvalidName as exc:
        raise validation_error(
            ["path", "task_id"], exc.message, "string_pattern_mismatch", value[:200]
        ) from None


def strict_int(raw: str, *, signed: bool = False) -> int | None:
    """Parse ``raw`` as ASCII digits (a leading '-' only when ``signed``); None if it is not.

    The one integer parser of the query and path parameters. ``str.isdigit`` and ``int`` accept
    what no client means: '²' (isdigit, then a ValueError in int), '٥٠' (50), ' 5', '+5', '1_0'.
    At most MAX_INT_DIGITS digits, so a huge string costs nothing to refuse.
    """
    if (_SIGNED_INT if signed else _UNSIGNED_INT).fullmatch(raw) is None:
        return None
    return int(raw)


def path_turn(value: str) -> int:
    turn = strict_int(value)
    if turn is None or turn > MAX_TURN:
        raise validation_error(
            ["path", "turn"],
            f"Input should be an integer between 0 and {MAX_TURN}",
            "int_parsing",
            value[:200],
        )
    return turn


def path_artifact_name(value: str) -> str:
    try:
        return validate_artifact_name(value)
    except InvalidName as exc:
        raise validation_error(
            ["path", "name"], exc.message, "string_pattern_mismatch", value[:200]
        ) from None


def content_type() -> str:
    return media_type(request.headers.get("Content-Type"), ["header", "Content-Type"])


def media_type(value: str | None, loc: list[str | int]) -> str:
    """An artifact's Content-Type as sent (none: application/octet-stream); one that is not
    a media type is a 422 at ``loc``."""
    if value is None or not value.strip():
        return "application/octet-stream"
    value = value.strip()
    try:
        return check_content_type(value)
    except InvalidName as exc:
        raise validation_error(loc, exc.message, "value_error", value[:200]) from None


class _ExactBody:
    """``request.stream`` that raises 400 when the body ends before its Content-Length.

    With ``wsgi.input_terminated`` (gunicorn) werkzeug only caps the stream at the maximum;
    a client that hangs up half-way reads as a short body, which must not be stored.
    """

    def __init__(self, stream: Any, length: int | None) -> None:
        self.stream = stream
        self.left = length

    def read(self, size: int = -1) -> bytes:
        chunk: bytes = self.stream.read(size)
        if self.left is not None:
            self.left -= len(chunk)
            if not chunk and self.left > 0 and size != 0:
                raise ClientDisconnected()
        return chunk


def body_stream() -> Any:
    """The raw request body as a stream; a body shorter than its Content-Length is a 400."""
    return _ExactBody(request.stream, request.content_length)


def not_modified(etag: str) -> bool:
    """Tell whether ``If-None-Match`` names ``etag`` or holds ``*`` (a GET then answers 304).

    Weak comparison (RFC 9110 13.1.2): ``W/"x"`` matches ``"x"``. The header is a list of entity
    tags (which may contain commas inside their quotes); members that are not entity tags are
    skipped.
    """
    value = request.headers.get("If-None-Match")
    if not value:
        return False
    current = etag.removeprefix("W/")
    return any(tag == "*" or tag.removeprefix("W/") == current for tag in entity_tags(value))


def if_match() -> str | None:
    return request.headers.get("If-Match")


def if_none_match_star() -> bool:
    value = request.headers.get("If-None-Match")
    if value is None:
        return False
    if value.strip() != "*":
        raise ApiError(400, "only 'If-None-Match: *' is supported on writes")
    return True


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``payload`` as the app's JSON (app/web/json_provider.py), with ``status`` and ``headers``."""
    response: Response = current_app.json.response(payload)  # type: ignore[assignment]
    response.status_code = status
    if headers:
        response.headers.update(headers)
    return response


SECRETS_MASKED_HEADER = "Memory-Secrets-Masked"


def masked_headers(screen: Screen) -> dict[str, str]:
    """``Memory-Secrets-Masked: github-token=1, jwt=2``: what the write masked, by kind and
    count (services/secrets.py), on the answer of a write that masked any."""
    found = screen.summary()
    if not found:
        return {}
    return {SECRETS_MASKED_HEADER: ", ".join(f"{kind}={n}" for kind, n in found.items())}
