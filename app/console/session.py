"""The console's session: one signed cookie that holds no secret, and the CSRF checks.

The cookie carries the token's id (never its secret), a CSRF token and an expiry, signed
with a per-root key (app/storage/tree/control.py). It is HttpOnly, SameSite=Strict, scoped to
/console, and Secure when the request came over TLS. Every request looks the token up again
in the registry, so a revoked or expired token ends the session at once, and so does a
sign-out: it records the moment in the token's registry entry, and a session issued before
it (a copied cookie, another browser signed in with the same token) is refused.

A visitor who has not signed in gets the same cookie without a token id: the sign-in form
needs its CSRF token too (a forged sign-in would put the victim in the attacker's session).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app, request
from itsdangerous import BadSignature, URLSafeSerializer
from werkzeug.wrappers import Response

from app.storage.core.clock import parse_iso
from app.storage.core.names import CONSOLE_KEY
from app.storage.core.tokens import Token
from app.storage.interface import TokenStore

COOKIE = "pm_console"
COOKIE_PATH = "/console"
ANONYMOUS_SECONDS = 3600  # a sign-in form's CSRF token lasts an hour
_SALT = "project-memory console session"


@dataclass(frozen=True, slots=True)
class Session:
    token_id: str | None
    csrf: str
    expires: float  # unix seconds, by the registry's clock
    issued: float = 0.0  # unix seconds: a sign-out with the token since then ends it


def init_app(app: Flask) -> None:
    # Made on the first console request: a CLI command that only reads (a dry-run sweep,
    # fsck) must leave the storage root as it found it.
    app.extensions["console_serializer"] = None


def _serializer() -> URLSafeSerializer:
    found: URLSafeSerializer | None = current_app.extensions["console_serializer"]
    if found is None:
        key = current_app.extensions["storage"].key(CONSOLE_KEY)
        found = URLSafeSerializer(key, salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256})
        current_app.extensions["console_serializer"] = found
    return found


def _now() -> float:
    registry: TokenStore = current_app.extensions["token_registry"]
    return registry.clock().timestamp()


def load() -> Session | None:
    """The request's valid, unexpired session, or None."""
    raw = request.cookies.get(COOKIE)
    if not raw or len(raw) > 4096:
        return None
    try:
        data: Any = _serializer().loads(raw)
    except BadSignature:
        return None
    if not isinstance(data, dict):
        return None
    token_id, csrf, expires = data.get("t"), data.get("c"), data.get("e")
    issued = data.get("i", 0.0)  # a cookie from before sign-outs ended sessions: the oldest
    if not isinstance(csrf, str) or not isinstance(expires, int | float):
        return None
    if token_id is not None and not isinstance(token_id, str):
        return None
    if not isinstance(issued, int | float) or expires <= _now():
        return None
    return Session(token_id, csrf, float(expires), float(issued))


def new(token_id: str | None) -> Session:
    """A fresh session (and a fresh CSRF token): signing in never keeps the old one."""
    hours: float = current_app.config["CONSOLE_SESSION_HOURS"]
    lifetime = hours * 3600 if token_id else ANONYMOUS_SECONDS
    now = _now()
    return Session(token_id, secrets.token_urlsafe(24), now + lifetime, now)


def ended_by_sign_out(session: Session, token: Token) -> bool:
    """Whether the console was signed out with ``token`` after ``session`` began: a copy of
    the cookie kept from before the sign-out is refused, wherever it is presented."""
    if token.console_signed_out_at is None:
        return False
    return session.issued < parse_iso(token.console_signed_out_at).timestamp()


def https() -> bool:
    """Whether the browser talks to us over TLS (directly, or to a trusted proxy)."""
    if request.is_secure:
        return True
    proto = _forwarded("X-Forwarded-Proto")
    return proto is not None and proto.strip().lower() == "https"


def _forwarded(header: str) -> str | None:
    """The value the outermost trusted proxy set; None without trusted proxies."""
    trusted: int = current_app.config["TRUSTED_PROXIES"]
    if trusted < 1:
        return None
    values = [v.strip() for v in request.headers.get(header, "").split(",") if v.strip()]
    return values[-trusted] if len(values) >= trusted else None


def our_origin() -> str:
    host = _forwarded("X-Forwarded-Host") or request.host
    return f"{'https' if https() else 'http'}://{host}"


def save(response: Response, session: Session) -> None:
    value = _serializer().dumps(
        {"t": session.token_id, "c": session.csrf, "e": session.expires, "i": session.issued}
    )
    response.set_cookie(
        COOKIE,
        value,
        max_age=max(0, int(session.expires - _now())),
        path=COOKIE_PATH,
        secure=https(),
        httponly=True,
        samesite="Strict",
    )


def clear(response: Response) -> None:
    response.delete_cookie(
        COOKIE, path=COOKIE_PATH, secure=https(), httponly=True, samesite="Strict"
    )


def same_origin() -> bool:
    """A state-changing request must come from one of our own pages.

    Browsers send ``Sec-Fetch-Site`` and ``Origin`` on a form POST; either one naming
    another site refuses it. Our pages say ``Referrer-Policy: no-referrer``, under which a
    browser sends ``Origin: null`` even for our own forms: "null" passes only when
    ``Sec-Fetch-Site`` vouches for the same origin (a sandboxed frame elsewhere also sends
    "null", with ``cross-site``). A client that sends neither is left to the CSRF token.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        return False
    origin = request.headers.get("Origin")
    if origin == "null":
        return site == "same-origin"
    return origin is None or origin == our_origin()


def csrf_ok(session: Session | None) -> bool:
    sent = request.form.get("csrf", "")
    if session is None or not sent:
        return False
    return hmac.compare_digest(sent.encode(), session.csrf.encode())
