"""What a schemathesis run must be told beyond the OpenAPI document (schemathesis.toml loads
this module): the two rules of the turn-with-artifacts form (PUT .../turns/{turn} as
multipart/form-data) that OpenAPI has no words for."""

from __future__ import annotations

from typing import Any

import schemathesis

TURN_PART = "turn"
ARTIFACT_PART = "artifact"


def _fields(body: Any) -> dict[str, Any] | None:
    """A form body's fields (a plain dict, or the form value schemathesis wraps them in)."""
    fields = getattr(body, "body", body)
    return fields if isinstance(fields, dict) else None


@schemathesis.hook
def filter_body(context: Any, body: Any) -> bool:
    """Leave out forms with more than one artifact. Each artifact is named by its part's
    filename, which OpenAPI cannot state: a generator names every part after its field
    ("artifact"), so two artifacts are one name twice, which the server refuses by design."""
    fields = _fields(body)
    artifacts = fields.get(ARTIFACT_PART) if fields is not None else None
    return not (isinstance(artifacts, list) and len(artifacts) > 1)


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    """Send the turn as the form's first part, as the server reads it: the artifacts after it
    stream straight to storage. OpenAPI states no order of a form's parts."""
    fields = _fields(body)
    if fields is None or TURN_PART not in fields:
        return body
    ordered = {TURN_PART: fields[TURN_PART], **fields}
    if fields is body:
        return ordered
    body.body = ordered
    return body
