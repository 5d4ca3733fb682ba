"""The token registry: one JSON file of token hashes, mode 0600, outside the storage root.

Secrets are never stored: a token is looked up by the SHA-256 of its secret (secrets carry
256 random bits, so a fast hash is enough; what matters is that a leaked registry hands out
no usable credential). Every worker re-reads the file when its inode, size or mtime
changes, so a revocation or an expiry takes effect on all gunicorn workers at once.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ulid import ULID

from .atomic import make_config_dirs, write_atomic
from .clock import Clock, iso, parse_iso, system_clock
from .errors import NotFound
from .layout import validate_id
from .locks import locked
from .records import dumps, read_json

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
) -> tuple[Token, str]:
    """A new token and its secret, checked by the rules every registry shares (ValueError)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if tenant is not None:
        validate_id("tenant", tenant)
    if project is not None:
        validate_id("project", project)
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
    ) -> tuple[Token, str]:
        """Create a token; return it with its secret (shown once, never stored)."""
        token, secret = new_token(
            self.clock(),
            role=role,
            tenant=tenant,
            project=project,
            name=name,
            expires_in=expires_in,
        )
        self._add(token)
        return token, secret


class TokenRegistry(TokenRegistryBase):
    """Create, list, revoke and authenticate tokens kept in ``path``."""

    def __init__(self, path: Path, *, clock: Clock = system_clock, lock_timeout: float = 10.0):
        self.path = Path(os.path.abspath(path))
        self.clock = clock
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, Token] = {}
        self._by_id: dict[str, Token] = {}

    # -- reading ---------------------------------------------------------------------------
    def _load(self) -> list[Token]:
        obj = read_json(self.path)
        if obj is None:
            return []
        return [Token(**t) for t in obj.get("tokens", [])]

    def _refresh(self) -> dict[str, Token]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        with self._mutex:
            if stamp != self._stamp:
                tokens = self._load()
                self._by_hash = {t.sha256: t for t in tokens}
                self._by_id = {t.id: t for t in tokens}
                self._stamp = stamp
            return self._by_hash

    def _find(self, sha256: str) -> Token | None:
        return self._refresh().get(sha256)

    def get(self, token_id: str) -> Token | None:
        """The token with this id, usable or not; None when there is none.

        For callers that keep a token's id rather than its secret (the console's session):
        they check ``usable`` on every request, so a revocation or expiry counts at once.
        """
        self._refresh()
        with self._mutex:
            return self._by_id.get(token_id)

    def all(self) -> list[Token]:
        return self._load()

    def is_empty(self) -> bool:
        return not self._load()

    # -- writing ---------------------------------------------------------------------------
    def _save(self, tokens: list[Token]) -> None:
        make_config_dirs(self.path.parent)
        write_atomic(self.path, dumps({"version": 1, "tokens": [asdict(t) for t in tokens]}))
        os.chmod(self.path, 0o600)

    def _lock(self) -> Any:
        return locked(self.path.with_name(self.path.name + ".lock"), self.lock_timeout)

    def _add(self, token: Token) -> None:
        with self._lock():
            self._save([*self._load(), token])

    def end_console_sessions(self, token_id: str) -> None:
        with self._lock():
            tokens = self._load()
            for i, token in enumerate(tokens):
                if token.id == token_id:
                    tokens[i] = replace(token, console_signed_out_at=iso(self.clock()))
                    self._save(tokens)
                    return
        raise NotFound(f"no token with id {token_id}")

    def revoke(self, token_id: str) -> Token:
        with self._lock():
            tokens = self._load()
            for i, token in enumerate(tokens):
                if token.id == token_id:
                    if token.revoked_at is None:
                        tokens[i] = replace(token, revoked_at=iso(self.clock()))
                        self._save(tokens)
                    return tokens[i]
        raise NotFound(f"no token with id {token_id}")
