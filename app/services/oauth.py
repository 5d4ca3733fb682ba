"""OAuth grants, whichever door they come by: the consent page makes one, the token endpoint
spends its code and refresh tokens, the console, the CLI and the revocation endpoint end it,
and /mcp acts through it. Each checks access, makes one storage call and records one audit
event (kind ``oauth``: consented, refreshed, reuse_detected, revoked).

A grant acts as the token that made it (its *parent*), never above it: a task recorded
through claude.ai is owned by the same token as one recorded with its secret, in the role the
person chose at consent. A revoked, expired or removed parent ends the grant at its next use.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from app.services import access, audit
from app.services.access import Principal, Who, token_of
from app.storage.core.clock import iso
from app.storage.core.errors import Forbidden, StorageError
from app.storage.core.names import Scope
from app.storage.core.oauth import (
    CODE_PREFIX,
    REFRESH_PREFIX,
    REVOKED_BY_PERSON,
    REVOKED_PARENT,
    Grant,
    Refused,
    Replayed,
    grant_of,
    issue_code,
    issue_refresh,
    new_grant_id,
    spend_code,
    spend_refresh,
)
from app.storage.core.tokens import Token
from app.storage.interface import StorageBackend, TokenStore

log = logging.getLogger(__name__)

# An authorization code is exchanged within seconds of its redirect; ten minutes is RFC
# 6749's longest.
CODE_LIFETIME = timedelta(minutes=2)


@dataclass(frozen=True, slots=True)
class ConsentRequest:
    """What a client asked for, as the authorization endpoint checked it."""

    client_id: str
    client_name: str
    redirect_uri: str
    scope: str
    resource: str
    code_challenge: str


def _event(
    storage: StorageBackend, grant: Grant, actor: str | None, action: str, **detail: str
) -> None:
    audit.record(
        storage,
        grant.tenant,
        grant.project,
        actor=actor,
        kind="oauth",
        action=action,
        subject=grant.id,
        detail={"client_id": grant.client_id, **detail},
    )


def consent(
    storage: StorageBackend,
    by: Token,
    asked: ConsentRequest,
    scope: Scope,
    role: str,
    *,
    now: datetime,
    lifetime: timedelta,
) -> tuple[Grant, str]:
    """A new grant of ``role`` in ``scope`` to the client, made by the signed-in ``by``, and
    its authorization code (given once, to the redirect)."""
    access.require_consent(by, scope, role)
    grant = Grant(
        id=new_grant_id(),
        client_id=asked.client_id,
        client_name=asked.client_name,
        redirect_uri=asked.redirect_uri,
        token_id=by.id,
        tenant=scope.tenant,
        project=scope.project,
        role=role,
        scope=asked.scope,
        resource=asked.resource,
        created_at=iso(now),
        expires_at=iso(now + lifetime),
        code_challenge=asked.code_challenge,
    )
    grant, code = issue_code(grant, now, CODE_LIFETIME)
    storage.oauth.add_grant(grant)
    _event(
        storage,
        grant,
        by.id,
        "consented",
        role=role,
        redirect_host=urlsplit(asked.redirect_uri).netloc or asked.redirect_uri[:100],
    )
    return grant, code


def _parent_usable(
    storage: StorageBackend, registry: TokenStore, grant: Grant, now: datetime
) -> Token | None:
    """The token that consented to ``grant``, as it may act now (its user's role today)."""
    parent = registry.get(grant.token_id)
    if parent is None or not parent.usable(now):
        return None
    return access.acting_token(parent, storage.users)


def spend(
    storage: StorageBackend, registry: TokenStore, secret: str, *, client_id: str, now: datetime
) -> Grant | None:
    """The grant an authorization code or refresh token may be exchanged for by
    ``client_id``, spent; None when it may not (unknown, another client's, expired, ended).
    A code or refresh token presented a second time revokes its grant, as RFC 6749 §4.1.2
    and the OAuth 2.1 refresh rules ask."""
    prefix = CODE_PREFIX if secret.startswith(CODE_PREFIX) else REFRESH_PREFIX
    grant_id = grant_of(secret, prefix)
    if grant_id is None:
        return None
    rule = spend_code if prefix == CODE_PREFIX else spend_refresh

    def spent(found: Grant) -> Grant:
        if found.client_id != client_id:  # another client's secret spends nothing
            raise Refused("issued to another client")
        return rule(found, secret, now)

    try:
        grant = storage.oauth.change_grant(grant_id, spent)
    except Replayed as exc:
        _recent.forget(grant_id)
        _event(storage, exc.grant, None, "reuse_detected", reason=exc.grant.revoked_reason or "")
        return None
    except (Refused, StorageError):
        return None
    if _parent_usable(storage, registry, grant, now) is None:
        revoke(storage, None, grant.id, now=now, reason=REVOKED_PARENT)
        return None
    return grant


def issue_refresh_token(
    storage: StorageBackend, grant: Grant, *, now: datetime, lifetime: timedelta, refreshed: bool
) -> str:
    """The grant's next refresh token; the grant lasts ``lifetime`` from now on."""
    secret = ""

    def rotate(found: Grant) -> Grant:
        nonlocal secret
        changed, secret = issue_refresh(found, now)
        return replace(changed, expires_at=iso(now + lifetime))

    storage.oauth.change_grant(grant.id, rotate)
    if refreshed:
        _event(storage, grant, grant.token_id, "refreshed")
    return secret


def find(storage: StorageBackend, grant_id: str) -> Grant | None:
    """The grant ``grant_id`` names; None when there is none, or when its record cannot be
    trusted (a link, a hand edit, damage: logged), which ends what it granted."""
    try:
        return storage.oauth.grant(grant_id)
    except StorageError as exc:
        log.warning("OAuth grant %s is unreadable, so refused: %s", grant_id[:60], exc)
        return None


# A grant read for a request is used again by the same worker for this long: revoking a
# grant stops its access tokens within it. Its parent token is looked up at every request
# (the registry's own cache follows its file at once).
GRANT_RECHECK_SECONDS = 1.0
_RECENT_MAX = 4096


class _RecentGrants:
    """The grants this worker read in the last GRANT_RECHECK_SECONDS, by id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[float, Grant | None]] = {}

    def get(self, storage: StorageBackend, grant_id: str) -> Grant | None:
        moment = time.monotonic()
        with self._lock:
            found = self._by_id.get(grant_id)
        if found is not None and found[0] > moment:
            return found[1]
        grant = find(storage, grant_id)
        with self._lock:
            if len(self._by_id) >= _RECENT_MAX:
                self._by_id.clear()
            self._by_id[grant_id] = (moment + GRANT_RECHECK_SECONDS, grant)
        return grant

    def forget(self, grant_id: str) -> None:
        with self._lock:
            self._by_id.pop(grant_id, None)


_recent = _RecentGrants()


def principal_of(
    storage: StorageBackend, registry: TokenStore, grant_id: str, *, now: datetime
) -> Principal | None:
    """Who a request with an access token of ``grant_id`` acts as: its parent token, in the
    grant's project, with the lower of the two roles; None when the grant or the parent may
    no longer act."""
    grant = _recent.get(storage, grant_id)
    if grant is None or not grant.usable(now):
        return None
    parent = _parent_usable(storage, registry, grant, now)
    if parent is None:
        return None
    role = access.lower_role(grant.role, parent.role)
    acting = replace(parent, role=role, tenant=grant.tenant, project=grant.project)
    return Principal(acting, Scope(grant.tenant, grant.project))


def visible_grants(storage: StorageBackend, by: Who) -> list[Grant]:
    """The grants ``by`` sees, newest first: those its token made, and every grant of the
    projects whose tokens it manages."""
    found = [
        g
        for g in storage.oauth.grants()
        if access.may_see_grant(by, g.token_id, g.tenant, g.project)
    ]
    return sorted(found, key=lambda g: g.id, reverse=True)


def revoke(
    storage: StorageBackend, by: Who | None, grant_id: str, *, now: datetime, reason: str = ""
) -> Grant:
    """End a grant: its refresh token is refused at once, its access tokens within
    GRANT_RECHECK_SECONDS. ``by`` None: the client itself, through the revocation endpoint."""
    if by is not None:
        found = find(storage, grant_id)
        if found is None or not access.may_see_grant(
            by, found.token_id, found.tenant, found.project
        ):
            raise Forbidden(f"no grant {grant_id[:60]} this token may revoke")
    grant = storage.oauth.change_grant(
        grant_id, lambda g: g.revoked(now, reason or REVOKED_BY_PERSON)
    )
    _recent.forget(grant_id)
    actor = token_of(by).id if by is not None else None
    _event(storage, grant, actor, "revoked", reason=grant.revoked_reason or "")
    return grant


def end_grants_of(storage: StorageBackend, token_id: str, *, now: datetime) -> list[Grant]:
    """Revoke the live grants made with ``token_id`` (revoked or expired): their access
    tokens already stop, as each request checks the parent; this says so in the records."""
    ended = []
    for grant in storage.oauth.grants():
        if grant.token_id != token_id or grant.revoked_at is not None:
            continue
        ended.append(revoke(storage, None, grant.id, now=now, reason=REVOKED_PARENT))
    return ended
