"""People in the console: the OpenID Connect sign-in (its start and its callback), the trusted
proxy's header, a person's own tokens, and the users page of the admins.

The sign-in under way is kept by the browser in a second cookie (``pm_oidc``), signed with
the console's key, good for ten minutes and sent back only to the callback: the state, nonce
and PKCE verifier the provider's answer must match (services/oidc.py checks them). It is
``SameSite=Lax``, as the provider's redirect back is a cross-site navigation a Strict cookie
would not come with; for the same reason the callback answers with a page that moves on by
itself, so that the console's own Strict session cookie is sent with the next request.
"""

from __future__ import annotations

import hashlib
import logging
import math
from datetime import timedelta
from typing import Any

from flask import current_app, g, render_template, request, url_for
from flask.typing import ResponseReturnValue
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from werkzeug.exceptions import Forbidden as WerkzeugForbidden, NotFound as WerkzeugNotFound
from werkzeug.wrappers import Response

from app.console import session as sessions
from app.console.base import bp, field, registry, see_other, signed_in, storage
from app.console.signin import safe_next, signin_options
from app.services import users as users_service
from app.services.access import may_manage_user, mintable_roles
from app.services.oidc import Pending, Provider, ProviderUnavailable, Settings, SignInRefused
from app.storage.core.errors import Forbidden, NotFound
from app.storage.core.names import CONSOLE_KEY
from app.storage.core.tokens import Token
from app.web.origins import from_trusted_proxy, https, request_origin

log = logging.getLogger("app.console")

PENDING_COOKIE = "pm_oidc"
PENDING_SECONDS = 600
_SALT = "project-memory oidc sign-in"
PROXY_ISSUER = "proxy"  # the issuer users signed in by the proxy's header are kept under
MAX_NAME_CHARS = 200


def provider() -> Provider | None:
    """The configured OpenID Connect provider (one per process), None when there is none."""
    config = current_app.config
    if not config["OIDC_ISSUER"]:
        return None
    found: Provider | None = current_app.extensions.get("oidc_provider")
    if found is None:
        found = Provider(
            Settings(
                issuer=config["OIDC_ISSUER"],
                client_id=config["OIDC_CLIENT_ID"],
                client_secret=config["OIDC_CLIENT_SECRET"],
                scopes=config["OIDC_SCOPES"],
                algorithms=tuple(config["OIDC_ALGORITHM_LIST"]),
                clock_skew=int(config["OIDC_CLOCK_SKEW"]),
            )
        )
        current_app.extensions["oidc_provider"] = found
    return found


def _serializer() -> URLSafeTimedSerializer:
    key = current_app.extensions["storage"].key(CONSOLE_KEY)
    return URLSafeTimedSerializer(key, salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256})


def _redirect_uri() -> str:
    origin = current_app.config["PUBLIC_URL"] or request_origin()
    return origin + url_for("console.oidc_callback")


def _page(message: str, status: int) -> Response:
    body = render_template(
        "console/signin.html",
        notice=None,
        error=message,
        next=None,
        **signin_options(),
    )
    return Response(body, status=status, mimetype="text/html")


@bp.get("/oidc/start")
def oidc_start() -> ResponseReturnValue:
    """Go to the identity provider to sign in."""
    found = provider()
    if found is None:
        raise WerkzeugNotFound("no identity provider is configured")
    try:
        url, pending = found.begin(_redirect_uri())
    except ProviderUnavailable as exc:
        log.warning("OIDC provider unavailable: %s", exc)
        return _page("The identity provider cannot be reached; try again later.", 503)
    value = _serializer().dumps(
        {
            "s": pending.state,
            "n": pending.nonce,
            "v": pending.verifier,
            "x": safe_next(request.args.get("next")) or "",
        }
    )
    response = see_other(url)
    response.set_cookie(
        PENDING_COOKIE,
        value,
        max_age=PENDING_SECONDS,
        path=url_for("console.oidc_callback"),
        secure=https(),
        httponly=True,
        samesite="Lax",
    )
    return response


def _pending() -> tuple[Pending, str] | None:
    raw = request.cookies.get(PENDING_COOKIE, "")
    if not raw or len(raw) > 4096:
        return None
    try:
        data: Any = _serializer().loads(raw, max_age=PENDING_SECONDS)
    except (BadSignature, SignatureExpired):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in "snvx"):
        return None
    return Pending(state=data["s"], nonce=data["n"], verifier=data["v"]), data["x"]


@bp.get("/oidc/callback")
def oidc_callback() -> ResponseReturnValue:
    """Where the identity provider sends the browser back with its answer."""
    found = provider()
    if found is None:
        raise WerkzeugNotFound("no identity provider is configured")
    kept = _pending()
    if kept is None:
        return _page("This sign-in expired or was not started here: start again.", 400)
    pending, target = kept
    answer = {k: v[:4096] for k, v in request.args.items()}
    try:
        user, token = users_service.sign_in_with_provider(
            storage(),
            registry(),
            found,
            current_app.config["ROLE_RULE_LIST"],
            redirect_uri=_redirect_uri(),
            pending=pending,
            answer=answer,
            groups_claim=current_app.config["OIDC_GROUPS_CLAIM"],
        )
    except SignInRefused as exc:
        log.warning("OIDC sign-in refused: %s", exc)
        return _page(f"Sign-in refused: {exc}", 400)
    except ProviderUnavailable as exc:
        log.warning("OIDC provider unavailable: %s", exc)
        return _page("The identity provider cannot be reached; try again later.", 503)
    except Forbidden as exc:  # disabled, or no rule gives a role
        return _page(str(exc), 403)
    g.console_new_session = sessions.new(token.id)
    g.token_id, g.tenant = token.id, token.tenant
    body = render_template("console/signed_in.html", user=user, target=target or "/console/")
    response = Response(body, mimetype="text/html")
    response.delete_cookie(
        PENDING_COOKIE,
        path=url_for("console.oidc_callback"),
        secure=https(),
        httponly=True,
        samesite="Lax",
    )
    return response


# -- the trusted proxy's header ----------------------------------------------------------------
def proxy_identity() -> users_service.Identity | None:
    """The person the trusted proxy's header names; None without the header, or when it
    came from a peer not in MEMORY_TRUSTED_PROXIES (then it names no one, and is logged)."""
    config = current_app.config
    header = config["PROXY_USER_HEADER"]
    if not header:
        return None
    value = request.headers.get(header, "").strip()
    if not value:
        return None
    if not from_trusted_proxy():
        log.warning(
            "%s from %s ignored: not one of MEMORY_TRUSTED_PROXIES", header, request.remote_addr
        )
        return None
    value = value[:320]
    groups: list[str] = []
    if config["PROXY_GROUPS_HEADER"]:
        raw = request.headers.get(config["PROXY_GROUPS_HEADER"], "")
        groups = [part.strip() for part in raw.split(",") if part.strip()][:100]
    claims: dict[str, Any] = {"sub": value, config["OIDC_GROUPS_CLAIM"]: groups}
    if "@" in value:
        claims["email"] = value
    return users_service.identity_of(PROXY_ISSUER, claims, config["OIDC_GROUPS_CLAIM"])


def proxy_sign_in(current: Token | None) -> Token | None:
    """The token a request the trusted proxy vouches for acts with: the session's when it
    is that person's, else a new sign-in (None when there is no such header)."""
    who = proxy_identity()
    if who is None:
        return current
    if current is not None and current.user == users_service.user_id_of(who):
        return current
    try:
        _, token = users_service.sign_in(
            storage(), registry(), who, current_app.config["ROLE_RULE_LIST"]
        )
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    fresh = sessions.new(token.id)
    g.console_new_session = fresh
    g.console_session = fresh
    return token


# -- a person's own tokens -------------------------------------------------------------------
def _expiry(raw: str) -> timedelta:
    try:
        days = float(raw.strip())
    except ValueError:
        raise ValueError("expires in: a number of days") from None
    if not math.isfinite(days):
        raise ValueError("expires in: a number of days")
    return timedelta(days=days)


def _my_tokens_page(error: str = "", status: int = 200) -> ResponseReturnValue:
    me = signed_in()
    if me.user is None:
        raise WerkzeugForbidden(
            "only a person signed in through the identity provider has tokens here"
        )
    user = storage().users.get(me.user)
    body = render_template(
        "console/my_tokens.html",
        user=user,
        tokens=users_service.tokens_of(registry(), me.user),
        roles=mintable_roles(me),
        now=registry().clock(),
        max_days=users_service.MAX_MINT_DAYS,
        console_name=users_service.CONSOLE_TOKEN_NAME,
        error=error,
    )
    return Response(body, status=status, mimetype="text/html")


@bp.get("/me/tokens")
def my_tokens() -> ResponseReturnValue:
    """Your own tokens, and a form to mint one."""
    return _my_tokens_page()


@bp.post("/me/tokens")
def mint_token() -> ResponseReturnValue:
    """Mint a token of your own and show its secret, once."""
    me = signed_in()
    try:
        name = field("name", MAX_NAME_CHARS + 1).strip()
        if len(name) > MAX_NAME_CHARS or any(ord(ch) < 0x20 for ch in name):
            raise ValueError(f"name: at most {MAX_NAME_CHARS} characters")
        made, secret = users_service.mint(
            storage(),
            registry(),
            me,
            role=field("role", 64),
            name=name,
            expires_in=_expiry(field("expires_in_days", 32)),
        )
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    except ValueError as exc:
        return _my_tokens_page(str(exc), 422)
    return render_template(
        "console/token_made.html", token=made, secret=secret, back=url_for("console.my_tokens")
    )


@bp.post("/me/tokens/<token_id>/revoke")
def revoke_my_token(token_id: str) -> ResponseReturnValue:
    try:
        users_service.revoke_own(storage(), registry(), signed_in(), token_id[:100])
    except NotFound as exc:
        raise WerkzeugNotFound(str(exc)) from None
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    return see_other(url_for("console.my_tokens"))


# -- the users page ----------------------------------------------------------------------------
@bp.get("/users")
def users() -> ResponseReturnValue:
    """The people who signed in, for the admins: last sign-in, role, tokens."""
    me = signed_in()
    if not may_manage_user(me, me.tenant):
        raise WerkzeugForbidden("the users page is a tenant_admin's or an admin's")
    found = users_service.visible_users(storage(), registry(), me)
    now = registry().clock()
    return render_template(
        "console/users.html",
        users=found,
        tokens={u.id: users_service.tokens_of(registry(), u.id) for u in found},
        live=lambda t: t.usable(now),
    )


@bp.post("/users/<user_id>/disable")
def disable_user(user_id: str) -> ResponseReturnValue:
    """Disable a user: their sessions, tokens and OAuth grants end now."""
    try:
        users_service.disable(storage(), registry(), signed_in(), user_id[:100])
    except NotFound as exc:
        raise WerkzeugNotFound(str(exc)) from None
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    return see_other(url_for("console.users"))


@bp.post("/users/<user_id>/enable")
def enable_user(user_id: str) -> ResponseReturnValue:
    """Let a disabled user sign in again."""
    try:
        users_service.enable(storage(), registry(), signed_in(), user_id[:100])
    except NotFound as exc:
        raise WerkzeugNotFound(str(exc)) from None
    except Forbidden as exc:
        raise WerkzeugForbidden(str(exc)) from None
    return see_other(url_for("console.users"))
