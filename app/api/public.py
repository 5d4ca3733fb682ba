"""Routes that need no credential: health checks and the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, current_app
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

bp = Blueprint("public", __name__)

PUBLIC_ENDPOINTS = frozenset({"public.get_openapi", "public.healthz", "public.readyz", "static"})


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Process is up"""
    return current_app.json.response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """Storage root is writable and locks are usable"""
    store = current_app.extensions["task_store"]
    ok, detail = store_ready(store)
    response = current_app.json.response(
        {"status": "ok" if ok else "unavailable", "detail": detail}
    )
    response.status_code = 200 if ok else 503
    return response


def store_ready(store: object) -> tuple[bool, str]:
    from ..storage.readiness import check_ready

    return check_ready(store)  # type: ignore[arg-type]


@bp.get("/sandbox/memory/v1/openapi.yaml")
def get_openapi() -> ResponseReturnValue:
    """OpenAPI document of the service"""
    from ..openapi import spec_yaml

    return Response(spec_yaml(current_app), mimetype="application/yaml")
