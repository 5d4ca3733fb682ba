"""The OAuth endpoints beside ``/mcp``: the two metadata documents (RFC 9728, RFC 8414), the
token endpoint, revocation (RFC 7009) and registration (RFC 7591). The authorization
endpoint is a console page (app/console/oauth.py): the person signs in there.

Each answers any origin (``Access-Control-Allow-Origin: *``): a browser-based client (MCP
Inspector) reads them cross-origin, and none of them reads a cookie.
"""

from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, current_app, request
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from app.api.common import json_response
from app.web import oauth_server as oauth
from app.web.errors import ApiError
from app.web.oauth_clients import ClientError, check_registration

bp = Blueprint("oauth", __name__)

# Every route here answers without a credential: a client asks them before it has one (the
# token endpoint and revocation authenticate the client by the OAuth rules instead).
PUBLIC_ENDPOINTS = frozenset(
    {
        "oauth.resource_metadata",
        "oauth.server_metadata",
        "oauth.token",
        "oauth.revoke",
        "oauth.register",
    }
)

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, MCP-Protocol-Version",
    "Access-Control-Max-Age": "600",
}


@bp.after_request
def _cors(response: Response) -> Response:
    response.headers.update(CORS_HEADERS)
    if request.method == "GET":
        response.headers.setdefault("Cache-Control", "public, max-age=300")
    else:
        response.headers["Cache-Control"] = "no-store"
    return response


@bp.route(oauth.RESOURCE_METADATA_PATH, methods=["GET", "OPTIONS"])
@bp.route(oauth.RESOURCE_METADATA_PATH + oauth.MCP_PATH, methods=["GET", "OPTIONS"])
def resource_metadata() -> ResponseReturnValue:
    """RFC 9728: where /mcp's tokens come from."""
    if request.method == "OPTIONS":
        return Response(status=204)
    return json_response(oauth.resource_metadata())


@bp.route(oauth.SERVER_METADATA_PATH, methods=["GET", "OPTIONS"])
def server_metadata() -> ResponseReturnValue:
    """RFC 8414: this server's endpoints and what they take."""
    if request.method == "OPTIONS":
        return Response(status=204)
    return json_response(oauth.server_metadata())


@bp.route(oauth.TOKEN_PATH, methods=["POST", "OPTIONS"])
def token() -> ResponseReturnValue:
    if request.method == "OPTIONS":
        return Response(status=204)
    response: Response = oauth.server().create_token_response()
    return response


@bp.route(oauth.REVOKE_PATH, methods=["POST", "OPTIONS"])
def revoke() -> ResponseReturnValue:
    if request.method == "OPTIONS":
        return Response(status=204)
    response: Response = oauth.server().create_endpoint_response("revocation")
    return response


@bp.route(oauth.REGISTER_PATH, methods=["POST", "OPTIONS"])
def register() -> ResponseReturnValue:
    """RFC 7591, for clients that cannot use a metadata document; a few per address an hour."""
    if request.method == "OPTIONS":
        return Response(status=204)
    limit: int = current_app.config["OAUTH_REGISTRATIONS_PER_HOUR"]
    if limit == 0:
        raise ApiError(403, "client registration is turned off: use a client id metadata URL")
    storage = current_app.extensions["storage"]
    now = current_app.extensions["token_registry"].clock()
    seen = storage.oauth.clients_registered_since(oauth.request_address(), now - timedelta(hours=1))
    if seen >= limit:
        raise ApiError(
            429,
            f"this address registered {seen} clients in the last hour, the most it may",
            headers={"Retry-After": "3600"},
        )
    try:
        check_registration(request.get_json(silent=True))
    except ClientError as exc:
        body = {"error": "invalid_client_metadata", "error_description": str(exc)}
        return json_response(body, 400)
    response: Response = oauth.server().create_endpoint_response("client_registration")
    return response
