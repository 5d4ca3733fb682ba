"""The answers of the project-memory GETs that send stored bytes: an artifact (its
preconditions, a range of it, how a browser may show it) and project.md, each streamed from
the file storage opened, never read into memory."""

from __future__ import annotations

from typing import Any, BinaryIO

from flask import request
from werkzeug.exceptions import HTTPException
from werkzeug.http import parse_range_header
from werkzeug.wrappers import Response
from werkzeug.wsgi import wrap_file

from app.api.common import not_modified
from app.storage.core.errors import PreconditionFailed
from app.storage.core.models import ArtifactStream
from app.storage.core.task_rules import if_match_fails
from app.web.artifacts import ARTIFACT_SECURITY_HEADERS, DIGEST_CHUNK

# Types a browser renders without running script; anything else is sent as a download.
PASSIVE_TYPES = frozenset(
    {"text/plain", "application/json", "image/png", "image/jpeg", "image/gif", "image/webp"}
)
# The conditions artifact_response decides itself, which werkzeug must not decide again.
_DECIDED_HERE = frozenset(
    {"HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_UNMODIFIED_SINCE"}
)


def not_modified_response(etag: str) -> Response:
    """Answer a conditional GET whose If-None-Match holds the current ETag (or ``*``)."""
    response = Response(status=304)
    response.headers["ETag"] = etag
    return response


def artifact_response(opened: ArtifactStream) -> Response:
    """Answer a GET of the artifact ``opened``: its preconditions, then its bytes or a range."""
    # Decided here by the rules the writes follow: werkzeug reads 'If-None-Match: "x", *' as
    # matching nothing and an unquoted value as an entity tag.
    precondition = request.headers.get("If-Match")
    if precondition is not None and if_match_fails(opened.info.etag, precondition):
        opened.file.close()
        raise PreconditionFailed("the artifact changed since the given ETag (If-Match)")
    if not_modified(opened.info.etag):
        opened.file.close()
        return not_modified_response(opened.info.etag)
    response = Response(
        wrap_file(request.environ, opened.file),
        content_type=opened.info.content_type,
        direct_passthrough=True,
    )
    response.content_length = opened.size
    response.set_etag(opened.info.sha256)
    response.headers.update(ARTIFACT_SECURITY_HEADERS)
    base_type = opened.info.content_type.split(";", 1)[0].strip().lower()
    disposition = "inline" if base_type in PASSIVE_TYPES else "attachment"
    response.headers.set("Content-Disposition", disposition, filename=opened.info.name)
    try:
        return response.make_conditional(
            _range_only(request.environ), accept_ranges=True, complete_length=opened.size
        )
    except HTTPException:  # 416: the range starts past the end
        response.close()
        raise


def _range_only(environ: dict[str, Any]) -> dict[str, Any]:
    """What werkzeug's make_conditional may act on: the Range (and If-Range) of a request whose
    other conditions were decided above. No Last-Modified is sent, so the date conditions
    have nothing to compare with. A Range that is not one well-formed byte range is ignored
    (RFC 9110 14.2: an unknown unit or an invalid range set; several ranges are answered
    whole rather than as multipart), so only a single range past the end is a 416."""
    kept = {k: v for k, v in environ.items() if k not in _DECIDED_HERE}
    ranges = parse_range_header(kept.get("HTTP_RANGE"))
    if ranges is None or ranges.units != "bytes" or len(ranges.ranges) != 1:
        kept.pop("HTTP_RANGE", None)
    return kept


def digest_response(file: BinaryIO, size: int | None) -> Response:
    """Send project.md (or the start of it) from ``file``, ``size`` bytes when known."""
    response = Response(
        wrap_file(request.environ, file, DIGEST_CHUNK),
        mimetype="text/markdown",
        direct_passthrough=True,
    )
    if size is not None:  # a head's length is known once it is read: sent chunked
        response.content_length = size
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
