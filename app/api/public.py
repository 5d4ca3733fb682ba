"""Routes that need no credential: health checks and the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, current_app
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from app.api import oauth

bp = Blueprint("public", __name__)

# The routes that answer without a credential: health, the OpenAPI document, and the OAuth
# endpoints a client asks before it holds one (app/api/oauth.py).
PUBLIC_ENDPOINTS = (
    frozenset({"public.get_openapi", "public.healthz", "public.readyz", "static"})
    | oauth.PUBLIC_ENDPOINTS
)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Process is up"""
    return current_app.json.response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """Storage root is writable and locks are usable"""
    ok, detail = current_app.extensions["storage"].ready()
    response = current_app.json.response(
        {"status": "ok" if ok else "unavailable", "detail": detail}
    )
    response.status_code = 200 if ok else 503
    return response


@bp.get("/sandbox/memory/v1/openapi.yaml")
def get_openapi() -> ResponseReturnValue:
    """OpenAPI document of the service"""
    from app.api.openapi import spec_yaml

    return Response(spec_yaml(current_app), mimetype="application/yaml")
