"""What the client raises: one base class, split by what the caller can do about it.

* :class:`ApiError`: the server answered and refused (4xx, or 5xx after the retries); it
  carries the status, the ``detail`` of the body and the request's correlation id.
* :class:`ServerUnreachable`: no answer at all (connection refused, DNS, a timeout).
* :class:`SettingsError`: the client cannot be set up (no URL, no token, a config file that
  others may read).

No message ever holds the token.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "ClientError",
    "InvalidArgument",
    "NotFound",
    "PreconditionFailed",
    "ServerUnreachable",
    "SettingsError",
]


class ClientError(Exception):
    """Anything this client raises on purpose."""


class InvalidArgument(ClientError, ValueError):
    """An argument the client will not send: an id that would change which URL is asked for
    (a '/', '.' or '..'). The server's own rules decide everything else (422)."""


class SettingsError(ClientError):
    """The settings are missing or unusable; the message says which and how to fix it."""


class ServerUnreachable(ClientError):
    """The server could not be reached, or did not answer within the timeout."""


def _one_line(detail: Any) -> str:
    """The ``detail`` of an error body as one line: the message, or each ``loc: msg``."""
    if isinstance(detail, str):
        return " ".join(detail.split())
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc") or [])
                msg = str(item.get("msg", ""))
                parts.append(f"{loc}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return " ".join("; ".join(parts).split())
    if detail is None:
        return ""
    return " ".join(str(detail).split())


class ApiError(ClientError):
    """The server refused the request: ``status``, ``detail`` (as sent) and ``correlation_id``.

    ``detail`` is the body's ``detail``: a string, or for a 422 the list of validation
    errors (``loc``, ``msg``, ``type``); ``message`` is it as one line.
    """

    def __init__(
        self,
        status: int,
        detail: Any,
        *,
        correlation_id: str | None = None,
        method: str = "",
        path: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.detail = detail
        self.correlation_id = correlation_id
        self.method = method
        self.path = path
        self.retry_after = retry_after
        self.message = _one_line(detail) or f"HTTP {status}"
        super().__init__(f"{status} {self.message}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "message": self.message,
            "detail": self.detail,
            "correlation_id": self.correlation_id,
        }


class NotFound(ApiError):
    """404: the task, turn, artifact or store does not exist (or is not yours to see)."""


class PreconditionFailed(ApiError):
    """412: an ``If-Match`` or ``If-None-Match`` did not hold; nothing was written."""


def api_error(status: int, detail: Any, **kwargs: Any) -> ApiError:
    """The :class:`ApiError` subclass for ``status``."""
    cls = {404: NotFound, 412: PreconditionFailed}.get(status, ApiError)
    return cls(status, detail, **kwargs)


def turn_form_unknown(exc: ApiError) -> bool:
    """Whether a refusal of a turn sent as a form (multipart, beyond the seed) says the
    server takes a turn only as JSON: one older than the form answers 415, or 422 at the
    body for JSON it cannot decode. The turn then goes as JSON and each artifact apart."""
    if exc.status == 415:
        return True
    detail = exc.detail
    return (
        exc.status == 422
        and isinstance(detail, list)
        and len(detail) == 1
        and isinstance(detail[0], dict)
        and detail[0].get("loc") == ["body"]
        and detail[0].get("type") == "json_invalid"
    )
