"""The OAuth authorization endpoint: a console page, so the person signs in the way the
console already works (the guard in views.py sends them to sign-in and back here), and the
consent form is held to the console's POST guard (same origin and CSRF token).

The page shows who asks (the client's name, its id URL, where the answer goes), for which
project, and offers a role at most the person's own, which they may lower. Approving makes
the grant (services/oauth.py); authlib (web/oauth_server.py) checks the request and writes
the redirect, with ``iss``. A request whose client or redirect URI does not check out is
answered here and never redirected (RFC 6749 §4.1.2.1).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc6749.errors import OAuth2Error
from flask import render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden as WerkzeugForbidden
from werkzeug.wrappers import Response

from app.console.base import bp, field, registry, see_other, signed_in, storage
from app.services import oauth as grants_service
from app.services.access import consent_roles, require_consent
from app.storage.core.errors import Forbidden, InvalidName, StorageError
from app.storage.core.names import Scope, validate_id
from app.web import oauth_server as oauth
from app.web.errors import from_storage

# The console's own policy, with the client's redirect let through: Chromium holds a form's
# redirect to form-action too.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self';"
    " object-src 'none'; frame-ancestors 'none'; form-action 'self' {target}; base-uri 'none'"
)


def _refused(error: OAuth2Error) -> ResponseReturnValue:
    if getattr(error, "redirect_uri", None):
        response: Response = oauth.server().handle_error_response(request, error)
        # RFC 9207: an error response names the issuer too.
        response.headers["Location"] = add_params_to_uri(
            response.headers["Location"], [("iss", oauth.issuer())]
        )
        return response
    body = render_template(
        "console/oauth_error.html", error=error.error, description=error.description or ""
    )
    return Response(body, status=400, mimetype="text/html")


def _form_target(redirect_uri: str) -> str:
    parts = urlsplit(redirect_uri)
    if parts.scheme in ("http", "https"):
        return f"{parts.scheme}://{parts.netloc}"
    return f"{parts.scheme}:"


@bp.get("/oauth/authorize")
def oauth_authorize() -> ResponseReturnValue:
    """The consent page."""
    token = signed_in()
    try:
        grant = oauth.server().get_consent_grant(end_user=token)
    except OAuth2Error as error:
        return _refused(error)
    client = grant.client
    redirect_uri = grant.request.payload.redirect_uri
    body = render_template(
        "console/oauth_consent.html",
        client=client,
        redirect_host=urlsplit(redirect_uri).netloc or redirect_uri,
        roles=consent_roles(token),
        tenant=token.tenant,
        project=token.project,
        action=request.full_path,
        error=None,
    )
    response = Response(body, mimetype="text/html")
    response.headers["Content-Security-Policy"] = CSP.format(target=_form_target(redirect_uri))
    return response


@bp.post("/oauth/authorize")
def oauth_authorize_post() -> ResponseReturnValue:
    """Approve (a grant, and the code in the redirect) or deny (``access_denied``)."""
    token = signed_in()
    server = oauth.server()
    try:
        grant = server.get_consent_grant(end_user=token)
    except OAuth2Error as error:
        return _refused(error)
    if request.form.get("decision") != "approve":
        response: Response = server.create_authorization_response(grant_user=None, grant=grant)
        return response
    try:
        tenant = validate_id("tenant", token.tenant or field("tenant", 200))
        project = validate_id("project", token.project or field("project", 200))
        consent = oauth.Consent(by=token, tenant=tenant, project=project, role=field("role", 40))
        # authlib turns an exception of the grant's into a server error: check first.
        require_consent(token, Scope(tenant, project), consent.role)
    except (InvalidName, Forbidden) as exc:
        message = str(exc) if isinstance(exc, Forbidden) else exc.message
        body = render_template(
            "console/oauth_consent.html",
            client=grant.client,
            redirect_host=urlsplit(grant.request.payload.redirect_uri).netloc,
            roles=consent_roles(token),
            tenant=token.tenant,
            project=token.project,
            action=request.full_path,
            error=message,
        )
        return Response(body, status=403, mimetype="text/html")
    try:
        answer: Response = server.create_authorization_response(grant_user=consent, grant=grant)
    except StorageError as exc:
        raise from_storage(exc) from None
    return answer


@bp.get("/oauth/grants")
def oauth_grants() -> ResponseReturnValue:
    """The OAuth grants this token sees: its own, and those of the projects it manages."""
    token = signed_in()
    found = grants_service.visible_grants(storage(), token)
    now = registry().clock()
    return render_template(
        "console/oauth_grants.html",
        grants=found,
        state=lambda g: "revoked" if g.revoked_at else "active" if g.usable(now) else "expired",
    )


@bp.post("/oauth/grants/<grant_id>/revoke")
def oauth_revoke_grant(grant_id: str) -> ResponseReturnValue:
    token = signed_in()
    try:
        grants_service.revoke(storage(), token, grant_id, now=registry().clock())
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    except StorageError as exc:
        raise from_storage(exc) from None
    return see_other(url_for("console.oauth_grants"))
