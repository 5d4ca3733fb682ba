"""Signing in to the console with a token, and out: the pages that answer without a session
(the guard in views.py lets them through) and the session they start or end.

A session holds the token's id, never its secret (session.py); every request looks the token
up again, so a revoked or expired one, or a sign-out, ends it at once.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import g, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from app.console import session as sessions
from app.console.base import bp, registry, see_other, storage
from app.services import admin as admin_service
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
    return token


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
        "console/signin.html", notice=notice, error=None, next=safe_next(request.args.get("next"))
    )


@bp.post("/signin")
def signin_post() -> ResponseReturnValue:
    secret = request.form.get("token", "").strip()
    token = admin_service.sign_in(storage(), registry(), secret)
    target = safe_next(request.form.get("next"))
    if token is None:
        g.console_new_session = sessions.new(None)
        body = render_template(
            "console/signin.html",
            notice=None,
            error="That token is not valid (wrong, expired or revoked).",
            next=target,
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
