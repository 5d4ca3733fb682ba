"""``PUT .../turns/{turn}`` with a multipart/form-data body: a turn and its artifacts at once.

Beyond the seed, whose PUT takes the turn as JSON and each artifact in a request of its
own. The form's first part is named ``turn`` and holds the seed's PutTurnRequest as JSON;
every part after it is named ``artifact``, carries the artifact's name as its filename and
its Content-Type as its own. The artifacts stream to the storage engine part by part
(app/web/multipart.py): nothing is held in memory or spooled to /tmp. A bad part is a 422
naming it, before the engine reads it; a body that is not well-formed multipart, a 422 at
"body" (app/web/errors.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any, cast

from flask import current_app, request
from marshmallow import Schema

from app.api.common import body_stream, json_document, media_type
from app.storage.core.errors import InvalidName, PayloadTooLarge
from app.storage.core.models import ArtifactUpload
from app.storage.core.names import validate_artifact_name
from app.storage.core.task_rules import MAX_ARTIFACTS_PER_WRITE, max_form_bytes
from app.web.errors import validation_error
from app.web.multipart import MultipartReader, Part, boundary_of

TURN_PART = "turn"
ARTIFACT_PART = "artifact"

# The form as the OpenAPI document gives it (requestBody, multipart/form-data).
OPENAPI_FORM = {
    "schema": {
        "type": "object",
        "required": [TURN_PART],
        "additionalProperties": False,
        "properties": {
            TURN_PART: {"$ref": "#/components/schemas/PutTurnRequest"},
            ARTIFACT_PART: {
                "type": "array",
                "maxItems": MAX_ARTIFACTS_PER_WRITE,
                "items": {"type": "string", "format": "binary"},
                "description": "One part per artifact, after the turn: its name as the"
                " part's filename (no two alike), its Content-Type kept"
                " (application/octet-stream when none).",
            },
        },
    },
    "encoding": {TURN_PART: {"contentType": "application/json"}},
    "x-beyond-seed": True,
}


def form_boundary() -> bytes | None:
    """The boundary of a multipart/form-data request; None for the seed's JSON body."""
    return boundary_of(request.headers.get("Content-Type"))


def turn_form(boundary: bytes, schema: Schema) -> tuple[Any, Iterator[ArtifactUpload]]:
    """The turn (loaded with ``schema``) and its artifacts, read lazily in the body's order."""
    json_limit = int(current_app.config["MAX_JSON_BYTES"])
    # The storage engine counts each artifact against its own limit; this bounds the whole.
    request.max_content_length = max_form_bytes(
        json_limit, int(current_app.config["MAX_ARTIFACT_BYTES"])
    )
    parts = MultipartReader(body_stream(), boundary).parts()
    first = next(parts, None)
    if first is None or first.name != TURN_PART:
        raise validation_error(
            ["body", TURN_PART],
            "the form's first part must be the turn: a part named 'turn' holding its JSON",
            "missing",
        )
    raw = first.read(json_limit + 1)
    if len(raw) > json_limit:
        raise PayloadTooLarge(f"the turn part exceeds {json_limit} bytes", limit=json_limit)
    return json_document(raw, schema, ["body", TURN_PART]), _uploads(parts)


def _uploads(parts: Iterator[Part]) -> Iterator[ArtifactUpload]:
    seen: set[str] = set()
    for part in parts:
        if part.name != ARTIFACT_PART:
            raise validation_error(
                ["body", part.name[:64] or "(unnamed)"],
                "only parts named 'artifact' may follow the turn",
                "value_error",
            )
        loc: list[str | int] = ["body", ARTIFACT_PART, "filename"]
        if not part.filename:
            raise validation_error(loc, "an artifact part needs its name as filename", "missing")
        try:
            name = validate_artifact_name(part.filename)
        except InvalidName as exc:
            raise validation_error(
                loc, exc.message, "string_pattern_mismatch", part.filename[:200]
            ) from None
        if name in seen:
            raise validation_error(loc, "names an artifact twice", "value_error", name)
        if len(seen) == MAX_ARTIFACTS_PER_WRITE:
            raise validation_error(
                ["body", ARTIFACT_PART],
                f"at most {MAX_ARTIFACTS_PER_WRITE} artifacts in one request",
                "too_long",
            )
        seen.add(name)
        kind = media_type(part.content_type, ["body", ARTIFACT_PART, "Content-Type"])
        yield ArtifactUpload(name, kind, cast("IO[bytes]", part))
