"""Tokens: roles, secrets and the registry's rules, whichever backend keeps them.

Secrets are never stored: a token is looked up by the SHA-256 of its secret (secrets carry
256 random bits, so a fast hash is enough; what matters is that a leaked registry hands out
no usable credential). :class:`TokenRegistryBase` makes and checks tokens over the small
primitives each backend's registry gives (the tree's file, tree/tokens.py; PostgreSQL's
table, pg/control.py).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from ulid import ULID

from app.storage.core.clock import Clock, iso, parse_iso
from app.storage.core.names import is_reserved_project, validate_id

ROLES = ("reader", "writer", "project_admin", "tenant_admin", "admin")
SECRET_PREFIX = "pm_"  # noqa: S105 - a prefix, not a secret
TOKEN_ID_PREFIX = "tok_"  # noqa: S105 - a prefix of ids


def role_rank(role: str) -> int:
    return ROLES.index(role)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Token:
    id: str
    role: str
    tenant: str | None
    project: str | None
    name: str
    created_at: str
    expires_at: str | None = None
    revoked_at: str | None = None
    sha256: str = ""
    # When the console was last signed out with this token: its sessions from before end.
    console_signed_out_at: str | None = None
    # The user (core/users.py) this token acts for: its console sign-in, or one it minted.
    user: str | None = None

    def usable(self, now: datetime) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or now < parse_iso(self.expires_at)


def new_token(
    now: datetime,
    *,
    role: str,
    tenant: str | None,
    project: str | None,
    name: str,
    expires_in: timedelta | None,
    user: str | None = None,
) -> tuple[Token, str]:
    """A new token and its secret, checked by the rules every registry shares (ValueError)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if tenant is not None:
        validate_id("tenant", tenant)
    if project is not None:
        validate_id("project", project)
        if is_reserved_project(project):
            raise ValueError("a token cannot be bound to a private space")
        if tenant is None:
            raise ValueError("a token with a project needs a tenant")
    if tenant is None and role != "admin":
        raise ValueError("only admin tokens may omit the tenant")
    if expires_in is not None and expires_in <= timedelta(0):
        raise ValueError("expiry must be in the future")
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = Token(
        id=f"{TOKEN_ID_PREFIX}{ULID()}",
        role=role,
        tenant=tenant,
        project=project,
        name=name,
        created_at=iso(now),
        expires_at=iso(now + expires_in) if expires_in else None,
        sha256=hash_secret(secret),
        user=user,
    )
    return token, secret


class TokenRegistryBase:
    """What every token registry does alike: it checks a new token and a presented secret
    by the same rules. A registry keeps the tokens (``_add``) and finds one by the hash of
    its secret (``_find``)."""

    clock: Clock

    def _find(self, sha256: str) -> Token | None:
        """The token whose secret hashes to ``sha256``, usable or not; None when none does."""
        raise NotImplementedError

    def _add(self, token: Token) -> None:
        """Keep a new token (checked by :func:`new_token`)."""
        raise NotImplementedError

    def end_console_sessions(self, token_id: str) -> None:
        """End every console session signed in with this token until now (a sign-out: a
        copy of the session cookie must not outlive it)."""
        raise NotImplementedError

    def find_by_secret(self, secret: str) -> Token | None:
        """The token whose secret this is, usable or not (to revoke a leaked one); None."""
        if not secret or len(secret) > 512:
            return None
        return self._find(hash_secret(secret))

    def authenticate(self, secret: str) -> Token | None:
        """Return the usable token whose secret this is, or None."""
        if not secret or len(secret) > 512:
            return None
        # Looked up by hash: no byte-by-byte comparison of secrets, so no timing oracle.
        token = self._find(hash_secret(secret))
        if token is None or not token.usable(self.clock()):
            return None
        return token

    def create(
        self,
        *,
        role: str,
        tenant: str | None = None,
        project: str | None = None,
        name: str = "",
        expires_in: timedelta | None = None,
        user: str | None = None,
    ) -> tuple[Token, str]:
        """Create a token; return it with its secret (shown once, never stored)."""
        token, secret = new_token(
            self.clock(),
            role=role,
            tenant=tenant,
            project=project,
            name=name,
            expires_in=expires_in,
            user=user,
        )
        self._add(token)
        return token, secret
