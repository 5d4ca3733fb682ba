"""The changes to who may act and how much, whichever door they come by: tokens created and
revoked, quotas and rate limits set and cleared, and the console's sign-ins and sign-outs.
Each checks access (access.py), makes one registry or limits call and records one audit
event.

They are made by a token rather than a principal: tokens and limits belong to a tenant, and a
tenant's own pages act in no project. An event is recorded in the tenant the change is of,
under the project it names (None: the tenant's own).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from app.services import access, audit, oauth
from app.services.access import Who, token_of
from app.storage.core.errors import StorageError
from app.storage.core.limits import QuotaOverride, RateOverride
from app.storage.core.tokens import Token
from app.storage.interface import StorageBackend, TokenStore


# -- tokens ----------------------------------------------------------------------------------
def create_token(
    storage: StorageBackend,
    registry: TokenStore,
    by: Who,
    tenant: str,
    project: str | None,
    *,
    role: str,
    name: str = "",
    expires_in: timedelta | None = None,
) -> tuple[Token, str]:
    """A new token of ``tenant``, bound to ``project`` (None: the whole tenant), and its
    secret: shown once by the caller, never stored. ``by`` manages those tokens and grants at
    most its own role; the registry's own rules refuse the rest (ValueError, InvalidName)."""
    access.require_manage_tokens(by, tenant, project)
    access.require_grant(by, role)
    access.require_binding(role, project)
    made, secret = registry.create(
        role=role, tenant=tenant, project=project, name=name, expires_in=expires_in
    )
    audit.record(
        storage,
        tenant,
        made.project,
        actor=token_of(by).id,
        kind="token",
        action="created",
        subject=made.id,
        detail={"role": made.role, "name": made.name},
    )
    return made, secret


def revoke_token(storage: StorageBackend, registry: TokenStore, by: Who, target: Token) -> Token:
    """Revoke ``target``: every request with it is refused from the next one on, and the
    console sessions signed in with it end. ``by`` manages its tenant's (or project's) tokens
    and holds a role at least as high as it."""
    access.require_manage_tokens(by, target.tenant, target.project)
    access.require_grant(by, target.role)
    revoked = registry.revoke(target.id)
    audit.record(
        storage,
        target.tenant,
        target.project,
        actor=token_of(by).id,
        kind="token",
        action="revoked",
        subject=target.id,
    )
    oauth.end_grants_of(storage, target.id, now=registry.clock())
    return revoked


# -- limits ----------------------------------------------------------------------------------
def _limits_event(
    storage: StorageBackend,
    by: Who,
    tenant: str,
    project: str | None,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    audit.record(
        storage,
        tenant,
        project,
        actor=token_of(by).id,
        kind="limits",
        action=action,
        subject=subject,
        detail=detail,
    )


def set_quota(
    storage: StorageBackend, by: Who, tenant: str, project: str | None, change: QuotaOverride
) -> QuotaOverride:
    """Set the quota of a project (``project`` None: the tenant's own); what ``change`` leaves
    out stays as it was. InvalidLimit for a value out of the ranges the store keeps."""
    access.require_set_limits(by, tenant, project)
    done = storage.limits().set_quota(tenant, project, change)
    _limits_event(storage, by, tenant, project, "set", "quota", change.to_json())
    return done


def clear_quota(storage: StorageBackend, by: Who, tenant: str, project: str | None) -> bool:
    """Remove the quota of a project (or the tenant's own); whether there was one."""
    access.require_set_limits(by, tenant, project)
    cleared = storage.limits().clear_quota(tenant, project)
    _limits_event(storage, by, tenant, project, "cleared", "quota")
    return cleared


def set_rate(
    storage: StorageBackend, by: Who, tenant: str, project: str | None, change: RateOverride
) -> RateOverride:
    """Set the rate limits of a project (``project`` None: the default of the tenant's
    projects); what ``change`` leaves out stays as it was. InvalidLimit as set_quota."""
    access.require_set_limits(by, tenant, project)
    done = storage.limits().set_rate(tenant, project, change)
    _limits_event(storage, by, tenant, project, "set", "rate", change.to_json())
    return done


def clear_rate(storage: StorageBackend, by: Who, tenant: str, project: str | None) -> bool:
    """Remove the rate limits of a project (or the tenant's own); whether there were any."""
    access.require_set_limits(by, tenant, project)
    cleared = storage.limits().clear_rate(tenant, project)
    _limits_event(storage, by, tenant, project, "cleared", "rate")
    return cleared


# -- console sessions ------------------------------------------------------------------------
def sign_in(
    storage: StorageBackend, registry: TokenStore, secret: str, *, admins_only: bool = False
) -> Token | None:
    """The token ``secret`` is the secret of, while it may act, with its sign-in recorded;
    None for a secret of no usable token (which records nothing: it names no one), and with
    ``admins_only`` for one below tenant_admin (the others sign in through the provider)."""
    found = registry.authenticate(secret)
    token = None if found is None else access.acting_token(found, storage.users)
    if token is not None and admins_only and not access.sees_tenant(token):
        return None
    if token is not None:
        _session_event(storage, token, "signed_in")
    return token


def sign_out(storage: StorageBackend, registry: TokenStore, token: Token) -> None:
    """End every console session signed in with ``token`` so far (a copied cookie too)."""
    with contextlib.suppress(StorageError):  # a token removed since: nothing to end
        registry.end_console_sessions(token.id)
    _session_event(storage, token, "signed_out")


def _session_event(storage: StorageBackend, token: Token, action: str) -> None:
    audit.record(
        storage,
        token.tenant,
        token.project,
        actor=token.id,
        kind="session",
        action=action,
        subject=token.id,
    )
