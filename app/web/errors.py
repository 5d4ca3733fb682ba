"""The one place that turns storage errors and HTTP errors into response bodies.

Two APIs, two documented shapes:

* project memory (``/sandbox/memory/v1``): ``422 {"detail": [ValidationError...]}`` for
  validation, ``{"detail": "<message>"}`` for everything else;
* memory stores (``/v1/memory_stores``):
  ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

Responses are built from ``e.get_response()`` so headers such as ``WWW-Authenticate``,
``Allow`` and ``Retry-After`` survive.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from flask import Flask, g, jsonify, request
from gunicorn.http.errors import NoMoreData, ParseException
from werkzeug.exceptions import HTTPException, InternalServerError

from app.storage.core import errors as se, store_models as ms
from app.storage.core.limits import InvalidLimit
from app.storage.core.quota import FloorReached
from app.storage.core.usage import QuotaExceeded
from app.web.body import body_cut_off, close_after_answer
from app.web.multipart import MalformedMultipart
from app.web.requestlog import STORES_PREFIX, request_id

log = logging.getLogger("app.errors")


class ApiError(HTTPException):
    """An HTTP error with a message (and, for memory stores, an explicit error type)."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(description=message)
        self.code = code
        self.message = message
        self.extra_headers = headers or {}
        self.error_type = error_type
        self.extra = extra or {}

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return [("Content-Type", "application/json"), *self.extra_headers.items()]


class RequestValidationError(HTTPException):
    """422 with a list of FastAPI-style ValidationError items."""

    code = 422

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(description="validation error")
        self.errors = errors


class SecretsFound(RequestValidationError):
    """422 naming each secret a write held (its kind and place, never its value), in a
    project that refuses them: the validation list on the project-memory API, a 422 of
    type ``invalid_request_error`` with the same list as ``secrets`` on the memory stores'."""

    def __init__(self, exc: se.SecretsRefused) -> None:
        super().__init__(
            [
                {
                    "loc": ["body", *str(f["where"]).split(".")],
                    "msg": f"a secret ({f['kind']}) at characters {f['start']}-{f['end']}:"
                    " this project refuses secrets, and nothing was stored",
                    "type": "secret_found",
                    "ctx": {"kind": f["kind"], "start": f["start"], "end": f["end"]},
                }
                for f in exc.findings
            ]
        )
        self.message = str(exc)
        self.findings = exc.findings


def validation_error(
    loc: list[str | int], msg: str, type_: str, input_: Any = None, **ctx: Any
) -> RequestValidationError:
    item: dict[str, Any] = {"loc": loc, "msg": msg, "type": type_}
    if input_ is not None:
        item["input"] = input_
    if ctx:
        item["ctx"] = ctx
    return RequestValidationError([item])


# Anthropic-style error types for the memory-stores API, by status.
STORE_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    412: "invalid_request_error",
    413: "request_too_large",
    414: "invalid_request_error",
    415: "invalid_request_error",
    417: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    501: "api_error",
    503: "overloaded_error",
    507: "api_error",
}


def error_body(
    code: int,
    message: str,
    *,
    path: str | None,
    correlation_id: str,
    error_type: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the error body of the API ``path`` names (``{"detail": message}`` when it is None).

    Also used by the gunicorn worker (app/ops/serving.py) for the answers it writes itself.
    """
    if path is None or not path.startswith(STORES_PREFIX):
        return {"detail": message}
    error = {"type": error_type or STORE_ERROR_TYPES.get(code, "api_error"), "message": message}
    error.update(extra or {})
    # The reference's shape is "req_...": the request's correlation id (the log line's, and the
    # X-Correlation-Id answered) with that prefix.
    return {"type": "error", "error": error, "request_id": request_id(correlation_id)}


def _message(exc: HTTPException) -> str:
    if isinstance(exc, ApiError):
        return exc.message
    if exc.code == 413:
        limit = getattr(exc, "limit", None) or request.max_content_length
        return (
            f"request body too large (limit {limit} bytes)" if limit else "request body too large"
        )
    return exc.description or exc.name


def render(exc: HTTPException) -> Any:
    """Build the response body for ``exc`` in the shape of the API the request addressed."""
    slow = body_cut_off()
    if slow is not None:
        # Whatever reading the body raised (werkzeug reports a failed read as a disconnect),
        # the cause is a client below the server's floor (app/ops/serving.py).
        exc = ApiError(408, slow)
    response = exc.get_response()
    code = exc.code or 500
    if request.path.startswith(STORES_PREFIX):
        if isinstance(exc, SecretsFound):
            message = exc.message
            exc = ApiError(422, message, extra={"secrets": exc.findings})
        if isinstance(exc, RequestValidationError):
            message = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}"
                for e in exc.errors
            )
            code = 400
        else:
            message = _message(exc)
        body = error_body(
            code,
            message,
            path=request.path,
            correlation_id=g.get("correlation_id") or "",
            error_type=getattr(exc, "error_type", None),
            extra=getattr(exc, "extra", None),
        )
    elif isinstance(exc, RequestValidationError):
        body = {"detail": exc.errors}
    else:
        body = {"detail": _message(exc)}
    response.set_data(jsonify(body).get_data())
    response.status_code = code
    response.content_type = "application/json"
    return response


_NO_RETRY = {"x-should-retry": "false"}
_CANNOT_READ = frozenset(
    {errno.EIO, errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE}
)
DAMAGED = (
    "a stored record is damaged (a torn or hand-edited file): `flask --app wsgi fsck` names "
    "it, and `fsck --repair` moves it to lost+found"
)
# Not damage: the file may be whole, and a repair would take it for torn. Nothing was
# changed, so the request may be sent again as it is.
UNREADABLE = (
    "a stored file cannot be read right now (an I/O or permission error on the server's "
    "disk); nothing was changed: retry later. If it lasts, the operator should check the "
    "disk and the file's owner and mode (`flask --app wsgi fsck` names what cannot be read)"
)
FULL = "insufficient storage: the server's disk is full"
_FIELD_LOCATIONS = {
    "task_id": "path",
    "turn": "path",
    "name": "path",
    "cursor": "query",
    "limit": "query",
    "q": "query",
    "tenant": "header",
    "project": "header",
}


def from_storage(exc: se.StorageError) -> HTTPException:
    """The storage-error → HTTP mapping table (both APIs; render() picks the body shape)."""
    # Memory-store errors first: they subclass the generic Conflict / PreconditionFailed and
    # carry the reference's own error types.
    if isinstance(exc, ms.PathConflict):
        return ApiError(
            409,
            str(exc),
            error_type="memory_path_conflict_error",
            extra={
                "conflicting_memory_id": exc.memory_id,
                "conflicting_path": exc.conflicting_path,
            },
        )
    if isinstance(exc, ms.ContentPreconditionFailed):
        return ApiError(409, str(exc), error_type="memory_precondition_failed_error")
    if isinstance(exc, ms.ArchivedStoreUpdate):
        return ApiError(400, str(exc), error_type="invalid_request_error")
    if isinstance(exc, ms.StoreArchived | ms.HeadVersion):
        return ApiError(409, str(exc), error_type="conflict_error")
    if isinstance(exc, ms.StoreFull):
        return ApiError(400, str(exc), error_type="invalid_request_error")
    if isinstance(exc, se.SecretsRefused):
        return SecretsFound(exc)
    if isinstance(exc, InvalidLimit):
        return validation_error(["body"], str(exc), "value_error")
    if isinstance(exc, se.InvalidName):
        where = _FIELD_LOCATIONS.get(exc.field, "body")
        return validation_error(
            [where, exc.field], exc.message, "value_error", _safe_input(exc.value)
        )
    if isinstance(exc, se.NotFound | se.UnsafePath):
        if isinstance(exc, se.UnsafePath):
            log.warning("refused unsafe path: %s", exc)
            return ApiError(404, "not found")
        return ApiError(404, str(exc))
    if isinstance(exc, se.NotOwner | se.Forbidden):
        return ApiError(403, str(exc))
    if isinstance(exc, se.PreconditionFailed):
        return ApiError(412, str(exc))
    if isinstance(exc, se.Conflict):
        return ApiError(409, str(exc))
    if isinstance(exc, se.PayloadTooLarge):
        return ApiError(413, f"{exc} (limit {exc.limit} bytes)")
    if isinstance(exc, se.LockTimeout | se.SearchTimeout | se.SearchRebuilding):
        return ApiError(503, str(exc), headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, QuotaExceeded):
        # 507: the request is fine and the server cannot store it; retrying will not help
        # until space is freed (the SDKs honour x-should-retry).
        return ApiError(
            507,
            f"insufficient storage: {exc}",
            headers=_NO_RETRY,
            error_type="quota_exceeded_error",
            extra=exc.details(),
        )
    if isinstance(exc, FloorReached):
        return ApiError(
            507,
            f"insufficient storage: {exc}",
            headers=_NO_RETRY,
            error_type="insufficient_storage_error",
        )
    if isinstance(exc, se.Unreadable):
        # Its message names a path: that stays in the log.
        log.error("unreadable file: %s", exc)
        return ApiError(503, UNREADABLE, headers={"Retry-After": "5"})
    if isinstance(exc, se.Corrupt):
        log.error("damaged record: %s", exc)
        return ApiError(500, DAMAGED)
    if isinstance(exc, se.NotSupported):
        return ApiError(501, str(exc))
    if isinstance(exc, se.InsufficientStorage):
        return ApiError(507, FULL, headers=_NO_RETRY, error_type="insufficient_storage_error")
    log.error("storage error: %r", exc)
    return ApiError(500, "internal error")


def _safe_input(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "…"
    return value


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def handle_http(exc: HTTPException) -> Any:
        return render(exc)

    @app.errorhandler(se.StorageError)
    def handle_storage(exc: se.StorageError) -> Any:
        return render(from_storage(exc))

    @app.errorhandler(ParseException)
    @app.errorhandler(NoMoreData)
    def handle_bad_framing(exc: Exception) -> Any:
        # gunicorn decodes a chunked body as the view reads it: a bad chunk, or a body that
        # ends before its last chunk, is the client's mistake, and leaves the connection
        # unreadable.
        close_after_answer()
        if isinstance(exc, NoMoreData):
            return render(ApiError(400, "malformed request body: it ends before its last chunk"))
        return render(ApiError(400, f"malformed request body: {exc}"[:300]))

    @app.errorhandler(MalformedMultipart)
    def handle_bad_form(exc: MalformedMultipart) -> Any:
        # Where the body stopped making sense, its rest cannot be skipped reliably.
        close_after_answer()
        return render(validation_error(["body"], str(exc), "value_error"))

    @app.errorhandler(OSError)
    def handle_os_error(exc: OSError) -> Any:
        # A full disk met outside the engine's own translation (e.g. creating the lock tree)
        # is still a full disk.
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return render(from_storage(se.InsufficientStorage(str(exc))))
        if request.method in ("GET", "HEAD") and exc.errno in _CANNOT_READ:
            # A read that met the disk's fault outside the engine's own translation.
            return render(from_storage(se.Unreadable.of(exc)))
        log.error("I/O error: %r", exc)
        return render(ApiError(500, "internal error: a storage operation failed"))

    @app.errorhandler(Exception)
    def handle_unexpected(exc: Exception) -> Any:
        log.exception("unhandled error")
        return render(InternalServerError(description="internal error"))
