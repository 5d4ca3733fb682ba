"""Tokens, quotas and rate limits, for the admins of a project and of a tenant.

Tokens: a project_admin lists, creates and revokes the tokens of its project (roles up to
project_admin); a tenant_admin does the same across its tenant, for one of its projects or
for the whole tenant (a tenant_admin token only for the whole tenant); an admin does it for
any tenant. A new token's secret is shown once, in the answer to the POST that made it (never
stored, never in a redirect, and, like every console page, ``Cache-Control: no-store``).

Limits: the backend's limits document, the one ``flask quota`` and ``flask ratelimit``
change (core/limits.py says what it holds; the tree keeps it in ``.limits.json``, PostgreSQL
in a row), seen by a project's project_admins and set where the CLI sets them: a project's
quota and rate limits by a tenant_admin of its tenant (or an admin), a tenant's own entry by
an admin. Every worker applies a change within a second. The limits pages are never rate
limited for those who may change them (LIMITS_ENDPOINTS): a rate set too low must not lock
out the one who can clear it.

Every change is a use case of app/services/admin.py, which checks who may make it
(services/access.py) and records it in the audit log. A page asks the same rules first only
to refuse a form with its own sentence before reading the form's fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flask import current_app, g, render_template
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import Forbidden, NotFound

from app.console.base import (
    bp,
    field,
    principal,
    purl,
    registry,
    scope,
    see_other,
    signed_in,
    storage,
    turl,
)
from app.services import admin as admin_service
from app.services.access import (
    MANAGER,
    PROJECT_ROLES,
    TENANT_ROLES,
    grantable_roles,
    may_grant,
    may_manage,
    may_set_limits,
    require_manage_tenant,
    require_set_limits,
)
from app.services.usage_report import quota_json
from app.storage.core.errors import InvalidName
from app.storage.core.limits import (
    InvalidLimit,
    QuotaOverride,
    RateOverride,
    format_bytes,
    parse_bytes,
)
from app.storage.core.tokens import ROLES, Token
from app.web.ratelimit import Limiter, limits_of, resolve

MAX_EXPIRY_DAYS = 3650.0
MAX_NAME_CHARS = 200


#: The pages that show and change a project's or a tenant's limits.
LIMITS_ENDPOINTS = frozenset(
    {
        "console.limits",
        "console.set_project_quota",
        "console.set_project_rate",
        "console.tenant_limits",
        "console.set_tenant_quota",
        "console.set_tenant_rate",
    }
)


class FormError(ValueError):
    """A form field the console refuses (422), with the sentence the form shows."""


def _require_manager() -> None:
    if not may_manage(principal()):
        raise Forbidden(f"this page needs the {MANAGER} role or above")


def _require_tenant_admin() -> None:
    require_manage_tenant(signed_in(), g.tenant)


# -- tokens ----------------------------------------------------------------------------------
def _project_tokens(tenant: str, project: str) -> list[Token]:
    found = [t for t in registry().all() if t.tenant == tenant and t.project == project]
    return sorted(found, key=lambda t: t.created_at, reverse=True)


def _tenant_tokens(tenant: str) -> list[Token]:
    found = [t for t in registry().all() if t.tenant == tenant]
    return sorted(found, key=lambda t: (t.project or "", t.created_at), reverse=True)


def _state(token: Token) -> str:
    if token.revoked_at is not None:
        return "revoked"
    return "active" if token.usable(registry().clock()) else "expired"


def _name(raw: str) -> str:
    name = raw.strip()
    if len(name) > MAX_NAME_CHARS or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise FormError(f"name: at most {MAX_NAME_CHARS} characters, no control characters")
    return name


def _expiry(raw: str) -> timedelta | None:
    text = raw.strip()
    if not text:
        return None
    try:
        days = float(text)
    except ValueError:
        raise FormError("expires in: a number of days, or empty for never") from None
    if not math.isfinite(days) or days <= 0 or days > MAX_EXPIRY_DAYS:
        raise FormError(f"expires in: more than 0 and at most {MAX_EXPIRY_DAYS:g} days")
    return timedelta(days=days)


def _role(raw: str, allowed: tuple[str, ...]) -> str:
    if raw not in ROLES:
        raise FormError(f"role: one of {', '.join(allowed)}")
    if raw not in allowed or not may_grant(signed_in(), raw):
        raise PermissionError(f"a token made here may not be {raw}")
    return raw


def _tokens_page(**page: Any) -> str:
    return render_template("console/tokens.html", state=_state, **page)


def _made(token: Token, secret: str, back: str) -> str:
    return render_template("console/token_made.html", token=token, secret=secret, back=back)


@bp.get("/p/<tenant>/<project>/tokens")
def tokens(tenant: str, project: str) -> ResponseReturnValue:
    """The tokens of this project (project_admin and above)."""
    _require_manager()
    here = scope()
    return _tokens_page(
        tokens=_project_tokens(here.tenant, here.project),
        where=f"{here.tenant} / {here.project}",
        new_url=purl("new_token_form"),
        revoke=lambda t: purl("confirm_revoke_token", token_id=t.id),
    )


@bp.get("/p/<tenant>/<project>/tokens/new")
def new_token_form(tenant: str, project: str) -> ResponseReturnValue:
    """The form of a new token of this project."""
    _require_manager()
    return _token_form(purl("create_token"), _offered(PROJECT_ROLES), None, purl("tokens"))


def _offered(roles: tuple[str, ...]) -> list[str]:
    return grantable_roles(signed_in(), roles)


def _token_form(
    action: str, roles: list[str], projects: list[str] | None, back: str, error: str = ""
) -> str:
    return render_template(
        "console/token_form.html",
        action=action,
        roles=roles,
        projects=projects,
        back=back,
        error=error,
    )


def _create(
    roles: tuple[str, ...], tenant: str, project: str | None, back: str, form: Callable[[], str]
) -> ResponseReturnValue:
    try:
        role = _role(field("role", 64), roles)
        if project is not None and role not in PROJECT_ROLES:
            raise FormError("a tenant_admin token covers the whole tenant: leave project empty")
        expires = _expiry(field("expires_in_days", 32))
        name = _name(field("name", MAX_NAME_CHARS + 1))
        made, secret = admin_service.create_token(
            storage(),
            registry(),
            signed_in(),
            tenant,
            project,
            role=role,
            name=name,
            expires_in=expires,
        )
    except PermissionError as exc:
        raise Forbidden(str(exc)) from None
    except InvalidName as exc:  # a project that is no id
        return _form_error(form, f"{exc.field}: {exc.message}"), 422
    except ValueError as exc:  # FormError, and what the registry's own rules refuse
        return _form_error(form, str(exc)), 422
    return _made(made, secret, back)


def _form_error(form: Callable[[], str], message: str) -> str:
    g.console_form_error = message
    return form()


@bp.post("/p/<tenant>/<project>/tokens/new")
def create_token(tenant: str, project: str) -> ResponseReturnValue:
    """Create a token of this project and show its secret, once."""
    _require_manager()
    here = scope()
    asked = field("project", 128)
    if asked and asked != here.project:
        raise Forbidden("a token made here belongs to this project")

    def form() -> str:
        return _token_form(
            purl("create_token"),
            _offered(PROJECT_ROLES),
            None,
            purl("tokens"),
            g.get("console_form_error", ""),
        )

    return _create(PROJECT_ROLES, here.tenant, here.project, purl("tokens"), form)


def _revocable_in_project(token_id: str) -> Token:
    here = scope()
    found = registry().get(token_id)
    if found is None or found.tenant != here.tenant or found.project != here.project:
        raise NotFound("no such token in this project")
    if not may_grant(signed_in(), found.role):
        raise Forbidden("this token's role is above yours")
    return found


@bp.get("/p/<tenant>/<project>/tokens/<token_id>/revoke")
def confirm_revoke_token(tenant: str, project: str, token_id: str) -> ResponseReturnValue:
    """The confirmation of a token's revocation."""
    _require_manager()
    found = _revocable_in_project(token_id)
    return _confirm_revoke(found, purl("revoke_token", token_id=token_id), purl("tokens"))


def _confirm_revoke(found: Token, action: str, back: str) -> str:
    return render_template(
        "console/confirm.html",
        title=f"Revoke {found.name or found.id}?",
        text="Every request with it is refused from now on (401), on every worker, and the"
        " console sessions signed in with it end. This cannot be undone.",
        action=action,
        button="Revoke token",
        danger=True,
        back=back,
        fields={},
    )


@bp.post("/p/<tenant>/<project>/tokens/<token_id>/revoke")
def revoke_token(tenant: str, project: str, token_id: str) -> ResponseReturnValue:
    """Revoke a token of this project."""
    _require_manager()
    found = _revocable_in_project(token_id)
    admin_service.revoke_token(storage(), registry(), signed_in(), found)
    return see_other(purl("tokens"))


@bp.get("/t/<tenant>/tokens")
def tenant_tokens(tenant: str) -> ResponseReturnValue:
    """Every token of the tenant (tenant_admin and admin)."""
    _require_tenant_admin()
    return _tokens_page(
        tokens=_tenant_tokens(tenant),
        where=f"tenant {tenant}",
        new_url=turl("new_tenant_token_form"),
        revoke=lambda t: turl("confirm_revoke_tenant_token", token_id=t.id),
    )


def _tenant_projects(tenant: str) -> list[str]:
    return sorted(s.project for s in storage().projects([tenant]) if s.owner is None)


@bp.get("/t/<tenant>/tokens/new")
def new_tenant_token_form(tenant: str) -> ResponseReturnValue:
    """The form of a new token of the tenant."""
    _require_tenant_admin()
    return _token_form(
        turl("create_tenant_token"),
        _offered(TENANT_ROLES),
        _tenant_projects(tenant),
        turl("tenant_tokens"),
    )


@bp.post("/t/<tenant>/tokens/new")
def create_tenant_token(tenant: str) -> ResponseReturnValue:
    """Create a token of the tenant (for one of its projects, or all) and show its secret."""
    _require_tenant_admin()
    project = field("project", 128).strip() or None

    def form() -> str:
        return _token_form(
            turl("create_tenant_token"),
            _offered(TENANT_ROLES),
            _tenant_projects(tenant),
            turl("tenant_tokens"),
            g.get("console_form_error", ""),
        )

    return _create(TENANT_ROLES, tenant, project, turl("tenant_tokens"), form)


def _revocable_in_tenant(token_id: str) -> Token:
    found = registry().get(token_id)
    if found is None or found.tenant != g.tenant:
        raise NotFound("no such token in this tenant")
    if not may_grant(signed_in(), found.role):
        raise Forbidden("this token's role is above yours")
    return found


@bp.get("/t/<tenant>/tokens/<token_id>/revoke")
def confirm_revoke_tenant_token(tenant: str, token_id: str) -> ResponseReturnValue:
    """The confirmation of a tenant token's revocation."""
    _require_tenant_admin()
    found = _revocable_in_tenant(token_id)
    return _confirm_revoke(
        found, turl("revoke_tenant_token", token_id=token_id), turl("tenant_tokens")
    )


@bp.post("/t/<tenant>/tokens/<token_id>/revoke")
def revoke_tenant_token(tenant: str, token_id: str) -> ResponseReturnValue:
    """Revoke a token of the tenant."""
    _require_tenant_admin()
    found = _revocable_in_tenant(token_id)
    admin_service.revoke_token(storage(), registry(), signed_in(), found)
    return see_other(turl("tenant_tokens"))


# -- limits ----------------------------------------------------------------------------------
def _limiter() -> Limiter:
    found: Limiter = current_app.extensions["rate_limiter"]
    return found


def _rates_shown(tenant: str, project: str | None) -> dict[str, Any]:
    limiter = _limiter()
    overrides = storage().limits().rates()
    own = overrides.projects.get((tenant, project)) if project else overrides.tenants.get(tenant)
    resolved = resolve(limiter.defaults, overrides, tenant, project or "")
    return {
        "own": own.to_json() if own else {},
        "applies": limits_of(resolved).describe(),
        "exempt_admin": limiter.exempt_admin,
    }


def _limits_page(tenant: str, project: str | None, error: str = "") -> str:
    quotas = storage().limits().quotas()
    return render_template(
        "console/limits.html",
        tenant=tenant,
        project=project,
        project_quota=quota_json(quotas.projects.get((tenant, project))) if project else None,
        tenant_quota=quota_json(quotas.tenants.get(tenant)),
        rates=_rates_shown(tenant, project),
        may_set=may_set_limits(signed_in(), tenant, project),
        format_bytes=format_bytes,
        error=error,
    )


@bp.get("/p/<tenant>/<project>/limits")
def limits(tenant: str, project: str) -> ResponseReturnValue:
    """This project's quotas and rate limits (project_admin and above)."""
    _require_manager()
    return _limits_page(scope().tenant, scope().project)


@bp.get("/t/<tenant>/limits")
def tenant_limits(tenant: str) -> ResponseReturnValue:
    """The tenant's own quota and rate limits (tenant_admin and admin)."""
    _require_tenant_admin()
    return _limits_page(tenant, None)


def _optional(name: str, parse: Callable[[str], Any]) -> Any:
    raw = field(name, 64).strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        raise FormError(f"{name}: {exc}") from None


def _count(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 15:
        raise ValueError(f"{raw!r} is not a whole number >= 0")
    return int(raw)


def _rate(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{raw!r} is not a number >= 0")
    return value


def _set_quota(tenant: str, project: str | None) -> None:
    """Apply the quota form (FormError for what it refuses)."""
    if field("clear", 1) == "1":
        admin_service.clear_quota(storage(), signed_in(), tenant, project)
        return
    change = QuotaOverride(bytes=_optional("bytes", parse_bytes), tasks=_optional("tasks", _count))
    if change.empty:
        raise FormError("give bytes, tasks, or both")
    admin_service.set_quota(storage(), signed_in(), tenant, project, change)


def _set_rate(tenant: str, project: str | None) -> None:
    if field("clear", 1) == "1":
        admin_service.clear_rate(storage(), signed_in(), tenant, project)
        return
    change = RateOverride(
        rps=_optional("rps", _rate),
        burst=_optional("burst", _count),
        upload_bps=_optional("upload_bps", parse_bytes),
        upload_burst=_optional("upload_burst", parse_bytes),
    )
    if change.empty:
        raise FormError("give at least one of rps, burst, upload_bps, upload_burst")
    admin_service.set_rate(storage(), signed_in(), tenant, project, change)


def _apply(
    tenant: str, project: str | None, apply: Callable[[str, str | None], object]
) -> ResponseReturnValue:
    require_set_limits(signed_in(), tenant, project)  # before the form: 403, not 422
    try:
        apply(tenant, project)
    except (FormError, InvalidLimit) as exc:  # InvalidLimit: out of the ranges the store keeps
        return _limits_page(tenant, project, str(exc)), 422
    back = purl("limits") if project else turl("tenant_limits")
    return see_other(back)


@bp.post("/p/<tenant>/<project>/limits/quota")
def set_project_quota(tenant: str, project: str) -> ResponseReturnValue:
    """Set or clear this project's quota (a tenant_admin of its tenant, or an admin)."""
    return _apply(scope().tenant, scope().project, _set_quota)


@bp.post("/p/<tenant>/<project>/limits/rate")
def set_project_rate(tenant: str, project: str) -> ResponseReturnValue:
    """Set or clear this project's rate limits (a tenant_admin of its tenant, or an admin)."""
    return _apply(scope().tenant, scope().project, _set_rate)


@bp.post("/t/<tenant>/limits/quota")
def set_tenant_quota(tenant: str) -> ResponseReturnValue:
    """Set or clear the tenant's quota (admin)."""
    return _apply(tenant, None, _set_quota)


@bp.post("/t/<tenant>/limits/rate")
def set_tenant_rate(tenant: str) -> ResponseReturnValue:
    """Set or clear the default rate limits of the tenant's projects (admin)."""
    return _apply(tenant, None, _set_rate)
