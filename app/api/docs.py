"""Attach OpenAPI details to a view; app/api/openapi.py reads them off ``app.url_map``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def doc(
    *,
    responses: dict[int, Any],
    params: list[dict[str, Any]] | None = None,
    body: Any = None,
    body_content_type: str = "application/json",
    other_bodies: dict[str, dict[str, Any]] | None = None,
    tags: list[str] | None = None,
    headers: dict[int, dict[str, Any]] | None = None,
) -> Callable[[F], F]:
    """Record the parameters, request body and responses of a view for the OpenAPI document.

    ``responses`` maps a status to a schema class, a schema name (str), ``None`` (no body),
    or a ``(content_type, json_schema)`` pair. ``other_bodies``: more content types the
    request body may have, each with its OpenAPI media type object.
    """

    def decorate(view: F) -> F:
        view.__openapi__ = {  # type: ignore[attr-defined]
            "responses": responses,
            "params": params or [],
            "body": body,
            "body_content_type": body_content_type,
            "other_bodies": other_bodies or {},
            "tags": tags,
            "headers": headers or {},
        }
        return view

    return decorate
