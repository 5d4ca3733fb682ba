"""Signing in to the console with a token, and out: the pages that answer without a session
(the guard in views.py lets them through) and the session they start or end.

A session holds the token's id, never its secret (session.py); every request looks the token
up again, so a revoked or expired one, or a sign-out, ends it at once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask import current_app, g, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from app.console import session as sessions
from app.console.base import bp, registry, see_other, storage
from app.services import admin as admin_service
from app.services.access import acting_token
from app.storage.core.tokens import Token


def signed_in_token() -> Token | None:
    """The token this request's session was signed in with, while it may still act."""
    current = g.console_session
    if current is None or current.token_id is None:
        return None
    token = registry().get(current.token_id)
    if token is None or not token.usable(registry().clock()):
        return None
    if sessions.ended_by_sign_out(current, token):
        return None
    return acting_token(token, storage().users)


def signin_options() -> dict[str, Any]:
    """What the sign-in page offers: the identity provider's button, the token form (on,
    admins only, or off: MEMORY_CONSOLE_TOKEN_SIGNIN)."""
    config = current_app.config
    return {
        "oidc_name": config["OIDC_NAME"] if config["OIDC_ISSUER"] else None,
        "token_signin": config["CONSOLE_TOKEN_SIGNIN"],
    }


def safe_next(target: str | None) -> str | None:
    """A path inside the console to return to after sign-in; anything else is dropped."""
    if not target or len(target) > 2048 or "\\" in target:
        return None
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in target):
        return None  # whitespace and controls: browsers strip some, headers refuse others
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console/"):
        return None
    if target.startswith("//") or "/../" in parts.path or parts.path.endswith("/.."):
        return None
    return target


@bp.get("/signin")
def signin() -> ResponseReturnValue:
    """Sign in with a token."""
    if signed_in_token() is not None:
        return see_other(url_for("console.index"))
    if g.console_session is None:
        g.console_new_session = sessions.new(None)
    notice = None
    if request.args.get("ended"):
        notice = "Your session ended: the token was revoked or has expired. Sign in again."
    elif request.args.get("out"):
        notice = "Signed out."
    return render_template(
        "console/signin.html",
        notice=notice,
        error=None,
        next=safe_next(request.args.get("next")),
        **signin_options(),
    )


@bp.post("/signin")
def signin_post() -> ResponseReturnValue:
    mode = current_app.config["CONSOLE_TOKEN_SIGNIN"]
    if mode == "off":
        raise Forbidden("signing in with a token is turned off here: use single sign-on")
    secret = request.form.get("token", "").strip()
    token = admin_service.sign_in(storage(), registry(), secret, admins_only=mode == "admins")
    target = safe_next(request.form.get("next"))
    if token is None:
        g.console_new_session = sessions.new(None)
        why = (
            "wrong, expired or revoked"
            if mode == "on"
            else "wrong, expired, revoked or not an admin's"
        )
        body = render_template(
            "console/signin.html",
            notice=None,
            error=f"That token is not valid ({why}).",
            next=target,
            **signin_options(),
        )
        return Response(body, status=403, mimetype="text/html")
    g.console_new_session = sessions.new(token.id)
    g.token_id, g.tenant, g.console_token = token.id, token.tenant, token
    return see_other(target or url_for("console.index"))


@bp.post("/signout")
def signout() -> ResponseReturnValue:
    """Sign out: this session, and any copy of its cookie, end here."""
    current = g.console_session
    if current is not None and current.token_id is not None:
        token: Token = g.console_token
        g.tenant = token.tenant  # for the request log line
        admin_service.sign_out(storage(), registry(), token)
    response = see_other(url_for("console.signin", out="1"))
    sessions.clear(response)
    return response
