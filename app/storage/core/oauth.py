"""OAuth grants and registered clients, whichever backend keeps them.

A *grant* is one person's consent that one client may act for them: made on the consent page
by a signed-in token (its *parent*), in one tenant/project, with a role at most the parent's.
It holds the authorization code and the current refresh token, only as SHA-256 hashes, and
the hashes of the refresh tokens it has rotated away (its *family*): one of those presented
again is a replay, and revokes the grant.

Every secret names its grant (``pmc_<grant ulid>.<random>`` for a code, ``pmr_…`` for a
refresh token), so it is found by one read of the grant, with no index of hashes; the random
part carries 256 bits, so a fast hash is enough, as for tokens (core/tokens.py).

A *client* registered dynamically (RFC 7591) is kept here too. A client whose id is a URL
(a Client ID Metadata Document) is not: its document is fetched and cached by the web layer.

The tree keeps one JSON file per grant and per client (tree/oauth.py); PostgreSQL one row
each (pg/oauth.py). Both change a grant only through :meth:`GrantStore.change_grant`, under
the grant's lock, so a code or a refresh token is spent once however many workers race.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from ulid import ULID

from app.storage.core.clock import iso, parse_iso
from app.storage.core.errors import Corrupt

GRANT_PREFIX = "grt_"
CLIENT_PREFIX = "dcr_"
CODE_PREFIX = "pmc_"
REFRESH_PREFIX = "pmr_"  # noqa: S105 - a prefix of secrets, not a secret
# A refresh token's family keeps this many spent hashes: replays older than that are
# refused as unknown (invalid_grant) without revoking the grant.
FAMILY_LIMIT = 64
GRANT_TYPES = ("authorization_code", "refresh_token")
# Why a grant ended, as its record and the audit log say it.
REVOKED_BY_PERSON = "revoked"
REVOKED_CODE_REUSE = "authorization code used twice"
REVOKED_REFRESH_REUSE = "refresh token used twice"
REVOKED_PARENT = "the token that granted it was revoked"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    client_id: str
    client_name: str
    redirect_uri: str
    token_id: str  # the parent: the token the person signed in with
    tenant: str
    project: str
    role: str
    scope: str
    resource: str
    created_at: str
    expires_at: str  # the grant ends here, whatever its refresh tokens
    code_sha256: str = ""
    code_challenge: str = ""
    code_expires_at: str = ""
    code_used_at: str | None = None
    refresh_sha256: str = ""
    family: tuple[str, ...] = field(default_factory=tuple)
    refreshed_at: str | None = None
    revoked_at: str | None = None
    revoked_reason: str | None = None

    def usable(self, now: datetime) -> bool:
        return self.revoked_at is None and now < parse_iso(self.expires_at)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["family"] = list(self.family)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> Grant:
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or not {"id", "token_id", "expires_at"} <= data.keys():
            raise Corrupt(f"{where}: not a grant record")
        try:
            known = {k: v for k, v in data.items() if k in names}
            known["family"] = tuple(str(h) for h in data.get("family", ()))
            return cls(**known)
        except TypeError as exc:
            raise Corrupt(f"{where}: not a grant record ({exc})") from None

    def revoked(self, now: datetime, reason: str) -> Grant:
        if self.revoked_at is not None:
            return self
        return replace(self, revoked_at=iso(now), revoked_reason=reason)


@dataclass(frozen=True, slots=True)
class Client:
    """A client registered through RFC 7591. A public client (``none``) has no secret."""

    client_id: str
    client_name: str
    redirect_uris: tuple[str, ...]
    token_endpoint_auth_method: str
    created_at: str
    registered_from: str
    secret_sha256: str = ""
    grant_types: tuple[str, ...] = GRANT_TYPES
    client_uri: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["redirect_uris"] = list(self.redirect_uris)
        out["grant_types"] = list(self.grant_types)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> Client:
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or "client_id" not in data:
            raise Corrupt(f"{where}: not a client record")
        try:
            known = {k: v for k, v in data.items() if k in names}
            known["redirect_uris"] = tuple(data.get("redirect_uris", ()))
            known["grant_types"] = tuple(data.get("grant_types", GRANT_TYPES))
            return cls(**known)
        except TypeError as exc:
            raise Corrupt(f"{where}: not a client record ({exc})") from None

    def check_secret(self, secret: str) -> bool:
        if not self.secret_sha256 or not secret:
            return False
        return hmac.compare_digest(_hash(secret), self.secret_sha256)


def new_grant_id() -> str:
    return f"{GRANT_PREFIX}{ULID()}"


def _is_id(value: str, prefix: str) -> bool:
    if not value.startswith(prefix) or len(value) != len(prefix) + 26:
        return False
    try:
        ULID.from_str(value[len(prefix) :])
    except ValueError:
        return False
    return True


def is_grant_id(value: str) -> bool:
    return _is_id(value, GRANT_PREFIX)


def is_client_id(value: str) -> bool:
    """A client id this server gave at registration (``dcr_<ULID>``)."""
    return _is_id(value, CLIENT_PREFIX)


def new_client_id() -> str:
    return f"{CLIENT_PREFIX}{ULID()}"


def new_client_secret() -> str:
    return secrets.token_urlsafe(32)


def new_client(
    now: datetime,
    *,
    client_id: str,
    secret: str | None,
    client_name: str,
    redirect_uris: tuple[str, ...],
    auth_method: str,
    registered_from: str,
    client_uri: str = "",
) -> Client:
    """A client to register; its secret (None for a public client) is kept as a hash."""
    return Client(
        client_id=client_id,
        client_name=client_name,
        redirect_uris=redirect_uris,
        token_endpoint_auth_method=auth_method,
        created_at=iso(now),
        registered_from=registered_from,
        secret_sha256=_hash(secret) if secret else "",
        client_uri=client_uri,
    )


def _secret_for(prefix: str, grant_id: str) -> str:
    return f"{prefix}{grant_id[len(GRANT_PREFIX) :]}.{secrets.token_urlsafe(32)}"


def grant_of(secret: str, prefix: str) -> str | None:
    """The id of the grant a code or refresh token names; None when it names none."""
    if not secret.startswith(prefix) or len(secret) > 200:
        return None
    ulid, _, rest = secret[len(prefix) :].partition(".")
    grant_id = GRANT_PREFIX + ulid
    return grant_id if rest and is_grant_id(grant_id) else None


def issue_code(grant: Grant, now: datetime, lifetime: timedelta) -> tuple[Grant, str]:
    code = _secret_for(CODE_PREFIX, grant.id)
    changed = replace(grant, code_sha256=_hash(code), code_expires_at=iso(now + lifetime))
    return changed, code


def issue_refresh(grant: Grant, now: datetime) -> tuple[Grant, str]:
    """A new refresh token for ``grant``; the one it replaces joins the family."""
    refresh = _secret_for(REFRESH_PREFIX, grant.id)
    family = grant.family
    if grant.refresh_sha256:
        family = (*family, grant.refresh_sha256)[-FAMILY_LIMIT:]
    changed = replace(grant, refresh_sha256=_hash(refresh), family=family, refreshed_at=iso(now))
    return changed, refresh


def spend_code(grant: Grant, code: str, now: datetime) -> Grant:
    """The grant with its code spent; raises :class:`Refused` when it may not be, and
    :class:`Replayed` (carrying the revoked grant to keep) when it was spent before."""
    if not grant.code_sha256 or not hmac.compare_digest(_hash(code), grant.code_sha256):
        raise Refused("unknown authorization code")
    if grant.code_used_at is not None:
        raise Replayed(grant.revoked(now, REVOKED_CODE_REUSE))
    if not grant.usable(now):
        raise Refused("the grant has ended")
    if now >= parse_iso(grant.code_expires_at):
        raise Refused("the authorization code has expired")
    return replace(grant, code_used_at=iso(now))


def spend_refresh(grant: Grant, refresh: str, now: datetime) -> Grant:
    """The grant with ``refresh`` retired (its successor is issued by the caller); raises
    :class:`Refused` or :class:`Replayed` as :func:`spend_code` does."""
    digest = _hash(refresh)
    if grant.refresh_sha256 and hmac.compare_digest(digest, grant.refresh_sha256):
        if not grant.usable(now):
            raise Refused("the grant has ended")
        family = (*grant.family, grant.refresh_sha256)[-FAMILY_LIMIT:]
        return replace(grant, refresh_sha256="", family=family)
    if any(hmac.compare_digest(digest, old) for old in grant.family):
        raise Replayed(grant.revoked(now, REVOKED_REFRESH_REUSE))
    raise Refused("unknown refresh token")


class Refused(Exception):
    """A code or refresh token that may not be exchanged (the grant is left as it was)."""


class Replayed(Exception):
    """A code or refresh token spent before: ``grant`` is the grant revoked for it."""

    def __init__(self, grant: Grant) -> None:
        super().__init__(grant.revoked_reason or "replayed")
        self.grant = grant


class GrantStore(Protocol):
    """Where a backend keeps grants and registered clients."""

    def add_grant(self, grant: Grant) -> None: ...

    def grant(self, grant_id: str) -> Grant | None:
        """The grant with this id, usable or not; None when there is none."""
        ...

    def change_grant(self, grant_id: str, change: Callable[[Grant], Grant]) -> Grant:
        """Apply ``change`` to the grant under its lock and keep what it returns; whatever
        ``change`` raises leaves the grant as it was, except :class:`Replayed`, whose
        revoked grant is kept before it is raised again. NotFound when there is none."""
        ...

    def grants(self) -> list[Grant]:
        """Every grant, oldest first."""
        ...

    def add_client(self, client: Client) -> None: ...

    def client(self, client_id: str) -> Client | None: ...

    def clients_registered_since(self, address: str, since: datetime) -> int:
        """How many clients ``address`` registered from ``since`` on (the rate limit)."""
        ...
