"""People, whichever door they come by: a sign-in through the identity provider (or the
trusted proxy's header), the tokens a person mints for their agents, and a user disabled by
an admin. Each checks access, makes its storage and registry calls and records its audit
events.

A signed-in person acts through a token of the registry that names them (``Token.user``):
their *console token*, which no one holds the secret of. It carries the role the rules gave at
the last sign-in; when the rules give another one (a changed group), the old console token is
revoked and a new one made, so every session, grant and page follows the new role at once.
The tokens a person mints are bound like their console token, at most its role, and always
expire.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from app.services import access, audit, oauth
from app.services.oidc import Pending, Provider
from app.storage.core.clock import iso
from app.storage.core.errors import Forbidden, NotFound
from app.storage.core.tokens import Token
from app.storage.core.users import Binding, Rule, User, signed_in, user_id
from app.storage.interface import StorageBackend, TokenStore

CONSOLE_TOKEN_NAME = "console"  # noqa: S105 - a name, not a secret
MAX_MINT_DAYS = 365


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the identity provider (or the trusted proxy) says signed in: the checked claims."""

    issuer: str
    subject: str
    email: str
    name: str
    groups: tuple[str, ...]
    claims: Mapping[str, Any]


def identity_of(issuer: str, claims: Mapping[str, Any], groups_claim: str = "groups") -> Identity:
    """The identity in ID token claims (checked before: signature, issuer, audience, expiry)."""
    raw_groups = claims.get(groups_claim, ())
    groups = raw_groups if isinstance(raw_groups, list) else [raw_groups] if raw_groups else []
    email = claims.get("email")
    name = claims.get("name") or claims.get("preferred_username") or ""
    return Identity(
        issuer=issuer,
        subject=str(claims["sub"]),
        email=email if isinstance(email, str) else "",
        name=name if isinstance(name, str) else "",
        groups=tuple(str(g) for g in groups if isinstance(g, str | int)),
        claims=claims,
    )


class Disabled(Forbidden):
    """A disabled user signing in."""


class NoRole(Forbidden):
    """A user whom no rule gives a role."""


def _event(
    storage: StorageBackend,
    binding: Binding | None,
    *,
    actor: str | None,
    kind: str,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    tenant = binding.tenant if binding else None
    project = binding.project if binding else None
    audit.record(
        storage,
        tenant,
        project,
        actor=actor,
        kind=kind,
        action=action,
        subject=subject,
        detail=detail,
    )


def _tokens_of(registry: TokenStore, uid: str) -> list[Token]:
    return [t for t in registry.all() if t.user == uid]


def console_token(registry: TokenStore, uid: str) -> Token | None:
    """The user's live console token, None when it has none."""
    now = registry.clock()
    for token in _tokens_of(registry, uid):
        if token.name == CONSOLE_TOKEN_NAME and token.usable(now):
            return token
    return None


def sign_in(
    storage: StorageBackend, registry: TokenStore, who: Identity, rules: Iterable[Rule]
) -> tuple[User, Token]:
    """Record a sign-in of ``who`` and return the user and the console token it acts with.

    The rules are evaluated now, so a changed group counts from this sign-in on. Disabled
    refuses a disabled user, NoRole one whom no rule gives a role (the user is recorded all
    the same, so an admin sees who tried)."""
    binding = access.binding_of_claims(rules, who.claims)
    uid = user_id(who.issuer, who.subject)
    now = iso(registry.clock())

    def record(found: User | None) -> User:
        if found is not None and found.disabled_at is not None:
            raise Disabled("this user is disabled: ask an admin")
        return signed_in(
            found,
            issuer=who.issuer,
            subject=who.subject,
            email=who.email,
            name=who.name,
            groups=who.groups,
            binding=binding,
            now=now,
        )

    user = storage.users.change(uid, record)
    current = console_token(registry, uid)
    if binding is None:
        if current is not None:
            _revoke(storage, registry, current, actor=None, reason="no rule gives a role")
        raise NoRole("no rule gives this identity a role here: ask an admin")
    if current is not None and (current.role, current.tenant, current.project) != (
        binding.role,
        binding.tenant,
        binding.project,
    ):
        _revoke(storage, registry, current, actor=None, reason="role changed at sign-in")
        current = None
    if current is None:
        current, _ = registry.create(
            role=binding.role,
            tenant=binding.tenant,
            project=binding.project,
            name=CONSOLE_TOKEN_NAME,
            user=uid,
        )
        _event(
            storage,
            binding,
            actor=current.id,
            kind="token",
            action="created",
            subject=current.id,
            detail={"role": current.role, "name": current.name, "user": user.display},
        )
    _event(
        storage,
        binding,
        actor=current.id,
        kind="session",
        action="signed_in",
        subject=current.id,
        detail={"user": user.display, "role": binding.label()},
    )
    return user, current


def _revoke(
    storage: StorageBackend,
    registry: TokenStore,
    token: Token,
    *,
    actor: str | None,
    reason: str,
) -> None:
    """Revoke one of a user's tokens, end its console sessions and its OAuth grants."""
    registry.revoke(token.id)
    where = Binding(token.role, token.tenant, token.project)
    _event(
        storage,
        where,
        actor=actor,
        kind="token",
        action="revoked",
        subject=token.id,
        detail={"reason": reason},
    )
    if token.name == CONSOLE_TOKEN_NAME:
        _event(
            storage,
            where,
            actor=actor,
            kind="session",
            action="ended",
            subject=token.id,
            detail={"reason": reason},
        )
    oauth.end_grants_of(storage, token.id, now=registry.clock())


def disable(storage: StorageBackend, registry: TokenStore, by: Token, uid: str) -> User:
    """Disable a user: no further sign-in, and their console sessions, tokens and OAuth
    grants end now, each recorded in the audit log."""
    access.require_manage_user(by, by.tenant)  # a manager of users at all, before the lookup
    found = storage.users.get(uid)
    if found is None:
        raise NotFound(f"no user {uid[:60]}")
    access.require_manage_user(by, found.tenant)
    if by.user == uid:
        raise Forbidden("you may not disable yourself")
    now = iso(registry.clock())

    def disabled(u: User | None) -> User:
        current = u or found
        return current if current.disabled_at else replace(current, disabled_at=now)

    user = storage.users.change(uid, disabled)
    _event(storage, user.binding, actor=by.id, kind="user", action="disabled", subject=user.id)
    clock = registry.clock()
    for token in _tokens_of(registry, uid):
        if token.revoked_at is None and token.usable(clock):
            _revoke(storage, registry, token, actor=by.id, reason="user disabled")
    return user


def enable(storage: StorageBackend, registry: TokenStore, by: Token, uid: str) -> User:
    """Let a disabled user sign in again (their old tokens stay revoked)."""
    access.require_manage_user(by, by.tenant)  # a manager of users at all, before the lookup
    found = storage.users.get(uid)
    if found is None:
        raise NotFound(f"no user {uid[:60]}")
    access.require_manage_user(by, found.tenant)
    user = storage.users.change(
        uid, lambda u: replace(u, disabled_at=None) if u is not None else found
    )
    _event(storage, user.binding, actor=by.id, kind="user", action="enabled", subject=user.id)
    return user


def visible_users(storage: StorageBackend, registry: TokenStore, by: Token) -> list[User]:
    """The users ``by`` manages (access.may_manage_user)."""
    return [u for u in storage.users.all() if access.may_manage_user(by, u.tenant)]


def tokens_of(registry: TokenStore, uid: str) -> list[Token]:
    """A user's tokens, newest first."""
    return sorted(_tokens_of(registry, uid), key=lambda t: t.created_at, reverse=True)


def mint(
    storage: StorageBackend,
    registry: TokenStore,
    by: Token,
    *,
    role: str,
    name: str,
    expires_in: timedelta,
) -> tuple[Token, str]:
    """A token of the signed-in person's own, for an agent or a laptop, and its secret
    (shown once): bound where their console token is, at most its role, expiring."""
    access.require_mint(by, role)
    if not timedelta(0) < expires_in <= timedelta(days=MAX_MINT_DAYS):
        raise ValueError(f"expires in: more than 0 and at most {MAX_MINT_DAYS} days")
    if not name or name == CONSOLE_TOKEN_NAME:
        raise ValueError("name: say what the token is for (laptop, ci...)")
    assert by.user is not None  # require_mint refuses a token of no user
    user = storage.users.get(by.user)
    if user is None or user.disabled_at is not None:
        raise Forbidden("this user is disabled")
    made, secret = registry.create(
        role=role,
        tenant=by.tenant,
        project=by.project,
        name=name,
        expires_in=expires_in,
        user=by.user,
    )
    _event(
        storage,
        Binding(made.role, made.tenant, made.project),
        actor=by.id,
        kind="token",
        action="created",
        subject=made.id,
        detail={"role": made.role, "name": made.name, "user": user.display},
    )
    return made, secret


def revoke_own(storage: StorageBackend, registry: TokenStore, by: Token, token_id: str) -> None:
    """Revoke one of the signed-in person's own minted tokens."""
    if by.user is None:
        raise Forbidden("only a person signed in through the identity provider has tokens here")
    target = registry.get(token_id)
    if target is None or target.user != by.user:
        raise NotFound(f"no token {token_id[:60]} of yours")
    if target.name == CONSOLE_TOKEN_NAME:
        raise Forbidden("sign out to end the console's token")
    if target.revoked_at is None:
        _revoke(storage, registry, target, actor=by.id, reason="revoked by its user")


def user_of(storage: StorageBackend, token: Token) -> User | None:
    """The user ``token`` belongs to (None: none, or one no longer on record)."""
    return None if token.user is None else storage.users.get(token.user)


def label(storage: StorageBackend, token: Token) -> str:
    """How pages name a token: "ana via laptop" for a person's, else its name."""
    if token.user is None:
        return token.name
    user = user_of(storage, token)
    who = user.display if user is not None else token.user
    return f"{who} via {token.name}"


def user_id_of(who: Identity) -> str:
    return user_id(who.issuer, who.subject)


def sign_in_with_provider(
    storage: StorageBackend,
    registry: TokenStore,
    provider: Provider,
    rules: Iterable[Rule],
    *,
    redirect_uri: str,
    pending: Pending,
    answer: dict[str, str],
    groups_claim: str,
) -> tuple[User, Token]:
    """The provider's answer checked (services/oidc.py), then :func:`sign_in` of the person
    its ID token names."""
    # The ID token's times are the provider's clock against the wall's (the registry's clock
    # may be a test's or a tool's).
    claims = provider.finish(redirect_uri, pending, answer, now=time.time())
    who = identity_of(provider.settings.issuer, claims, groups_claim)
    return sign_in(storage, registry, who, rules)
