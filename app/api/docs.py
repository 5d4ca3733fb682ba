"""Attach OpenAPI details to a view; app/api/openapi.py reads them off ``app.url_map``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def doc(
    *,
    responses: dict[int, Any],
    params: list[dict[str, Any] | Callable[[Any], dict[str, Any]]] | None = None,
    body: Any = None,
    body_content_type: str = "application/json",
    other_bodies: dict[str, dict[str, Any]] | None = None,
    tags: list[str] | None = None,
    headers: dict[int, dict[str, Any]] | None = None,
    links: dict[int, dict[str, dict[str, Any]]] | None = None,
    beyond_seed: bool = False,
) -> Callable[[F], F]:
    """Record the parameters, request body and responses of a view for the OpenAPI document.

    ``responses`` maps a status to a schema class, a schema name (str), ``None`` (no body),
    or a ``(content_type, json_schema)`` pair. A parameter may be a function of the app that
    returns it (built with the document). ``beyond_seed``: an operation of the
    project-memory API that its seed document does not list (``x-beyond-seed`` in OpenAPI).
    ``other_bodies``: more content types the request body may have, each with its OpenAPI
    media type object. ``links``: by status, the OpenAPI links of the answer (what in it
    addresses another operation: the ids a create hands out).
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
            "links": links or {},
            "beyond_seed": beyond_seed,
        }
        return view

    return decorate


def links(*operation_ids: str, **parameters: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from an answer to each of ``operation_ids``, every one given the
    ``parameters`` (name=JSON pointer into the answer's body, e.g. ``task_id="/task_id"``)."""
    given = {name: f"$response.body#{pointer}" for name, pointer in parameters.items()}
    return {op: {"operationId": op, "parameters": dict(given)} for op in operation_ids}
