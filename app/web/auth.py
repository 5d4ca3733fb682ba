"""Credentials: bearer / x-api-key parsing, roles and tenant/project scope resolution.

The tenant comes from the token, never from a header alone: ``X-Sandbox-Tenant-Id`` must
equal the token's tenant, and ``X-Sandbox-Project-Id`` may only name a project the token
covers. Only ``admin`` tokens may name any tenant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, g, request

from app.services.access import (
    PRIVATE,
    PROJECT,
    VISIBILITIES,
    Principal,
    acting_token,
    compliance_space,
    may_write,
    private_space,
)
from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope, is_reserved_project, validate_id
from app.storage.core.tokens import Token
from app.storage.interface import TokenStore
from app.web import oauth_server
from app.web.errors import ApiError, validation_error

TENANT_HEADER = "X-Sandbox-Tenant-Id"
PROJECT_HEADER = "X-Sandbox-Project-Id"
# The space a request acts in (``_space``): the team's project or a private space.
VISIBILITY_PARAM = "visibility"
# The same, as a header: what a client sets once for all its requests, as it does the project.
VISIBILITY_HEADER = "X-Sandbox-Visibility"
OWNER_PARAM = "private_to"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
F = TypeVar("F", bound=Callable[..., Any])


def reads(view: F) -> F:
    """Mark a view that only reads although its method is POST (what it reads is sent in a
    body, to keep it out of URLs and their logs): any role may call it, as a GET."""
    view.__reads__ = True  # type: ignore[attr-defined]
    return view


def _reads() -> bool:
    view = current_app.view_functions.get(request.endpoint or "")
    return bool(getattr(view, "__reads__", False))


def registry() -> TokenStore:
    reg: TokenStore = current_app.extensions["token_registry"]
    return reg


def _unauthorized(message: str, error: str | None = None) -> ApiError:
    # At /mcp the challenge says where its OAuth tokens come from (RFC 9728 §5.1): an MCP
    # client starts its authorization there.
    if oauth_server.path_is_mcp():
        challenge = oauth_server.challenge(error)
    else:
        challenge = 'Bearer realm="project-memory"'
    return ApiError(401, message, headers={"WWW-Authenticate": challenge})


def presented_secret() -> str | None:
    """The secret from ``Authorization: Bearer`` or ``x-api-key``; None when neither is sent."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise _unauthorized("malformed Authorization header: expected 'Bearer <token>'")
        return value.strip()
    key = request.headers.get("x-api-key")
    if key is not None:
        return key.strip()
    return None


def authenticate() -> Token:
    secret = presented_secret()
    if secret is None:
        raise _unauthorized("missing credential: send 'Authorization: Bearer <token>'")
    found = registry().authenticate(secret)
    if found is None:
        raise _unauthorized("invalid, expired or revoked token", "invalid_token")
    token = acting_token(found, current_app.extensions["storage"].users)
    if token is None:
        raise _unauthorized(
            "this token's user is disabled or no longer has a role here", "invalid_token"
        )
    # The request log names who asked, also when the scope is then refused.
    g.token_id, g.tenant = token.id, token.tenant
    return token


def _header_id(name: str) -> str | None:
    # Straight from the WSGI environ: request.headers.getlist walks every header. A WSGI
    # server joins duplicate headers with a comma, which the id rule refuses as well.
    value: str | None = request.environ.get("HTTP_" + name.upper().replace("-", "_"))
    if value is None:
        return None
    try:
        return validate_id(name, value)
    except InvalidName as exc:
        raise validation_error(["header", name], exc.message, "value_error", value[:200]) from None


def resolve_scope(token: Token) -> Scope:
    """The tenant/project this request acts in, or 403/422 when the token cannot name it."""
    tenant_header = _header_id(TENANT_HEADER)
    project_header = _header_id(PROJECT_HEADER)
    # For the request log: the project asked for (a checked id), whether or not it is granted.
    g.project = project_header or token.project
    tenant: str | None
    project: str | None
    if token.role == "admin":
        tenant = tenant_header or token.tenant
    else:
        if tenant_header is not None and tenant_header != token.tenant:
            raise ApiError(403, f"this token may not act in tenant {tenant_header}")
        tenant = token.tenant
    if tenant is None:
        raise validation_error(["header", TENANT_HEADER], "required for this token", "missing")
    if token.project is not None and token.role != "admin":
        if project_header is not None and project_header != token.project:
            raise ApiError(403, f"this token may not act in project {project_header}")
        project = token.project
    elif token.role == "admin" and tenant_header is not None and tenant_header != token.tenant:
        # An admin naming another tenant must name the project too: its default project
        # belongs to its own tenant.
        project = project_header
    else:
        project = project_header or token.project
    if project is None:
        raise validation_error(["header", PROJECT_HEADER], "required for this token", "missing")
    if is_reserved_project(project):
        # A private space is reached by asking for one's own (``?visibility=private``), never
        # by its name: a name would let any token of the tenant try another's.
        raise validation_error(
            ["header", PROJECT_HEADER],
            "names a private space; ask for your own with ?visibility=private",
            "value_error",
        )
    return Scope(tenant, project)


def _space(principal: Principal) -> Principal:
    """The principal in the space the request asks for (``?visibility=`` or the
    ``X-Sandbox-Visibility`` header): the team's project
    (``project``, the default) or the caller's own private space (``private``); with
    ``private_to=<user>`` as well, another user's, for a tenant_admin's compliance delete."""
    visibility = request.args.get(VISIBILITY_PARAM)
    sent = request.environ.get("HTTP_X_SANDBOX_VISIBILITY")
    if sent is not None:
        if visibility is not None and visibility != sent:
            raise validation_error(
                ["header", VISIBILITY_HEADER],
                f"says {sent[:40]!r} but the query's visibility says {visibility[:40]!r}",
                "value_error",
                sent[:200],
            )
        visibility = sent
    owner = request.args.get(OWNER_PARAM)
    if principal.scope.owner is not None:
        raise ApiError(403, "this credential names a private space; it cannot be used")
    if visibility in (None, PROJECT):
        if owner is not None:
            raise validation_error(
                ["query", OWNER_PARAM], "needs visibility=private", "value_error", owner[:200]
            )
        return principal
    if visibility != PRIVATE:
        raise validation_error(
            ["query", VISIBILITY_PARAM],
            f"must be one of {', '.join(VISIBILITIES)}",
            "value_error",
            visibility[:200],
        )
    if owner is None or owner == principal.token.user:
        return private_space(principal)
    if request.method != "DELETE":
        raise ApiError(403, "another user's private space may only be deleted from, never read")
    return compliance_space(principal, owner)


def resolve_principal() -> Principal:
    """Authenticate and resolve the scope, leaving the role to the caller (the MCP endpoint
    answers readers' POSTs and refuses writes tool by tool)."""
    secret = presented_secret()
    if secret is not None and oauth_server.looks_like_jwt(secret) and oauth_server.path_is_mcp():
        principal = _space(_oauth_principal(secret))
    else:
        token = authenticate()
        principal = _space(Principal(token, resolve_scope(token)))
    g.tenant, g.project = principal.scope.tenant, principal.scope.project
    return principal


def _oauth_principal(secret: str) -> Principal:
    """An OAuth access token, taken at /mcp only (its audience): its grant's project, in
    the role the person gave it, acting as their token."""
    principal, why = oauth_server.authenticate_access_token(secret)
    if principal is None:
        raise _unauthorized(why, "invalid_token")
    token = principal.token
    g.token_id, g.tenant, g.project = token.id, principal.scope.tenant, principal.scope.project
    for header, value in (
        (TENANT_HEADER, principal.scope.tenant),
        (PROJECT_HEADER, principal.scope.project),
    ):
        named = _header_id(header)
        if named is not None and named != value:
            raise ApiError(
                403, f"this grant acts in {principal.scope.tenant}/{principal.scope.project} only"
            )
    return principal


def require_principal() -> Principal:
    """Authenticate, resolve the scope and check the method against the role; store on g."""
    principal = resolve_principal()
    token = principal.token
    if request.method not in READ_METHODS and not may_write(principal) and not _reads():
        raise ApiError(403, f"role {token.role} may only read")
    g.principal = principal
    return principal


def current_principal() -> Principal:
    principal: Principal = g.principal
    return principal
