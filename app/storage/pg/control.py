"""What every node must agree on, kept in the database: tokens, limit overrides, secret keys,
service state, and the sweeper's leader lease.

Tokens are read by hash on every request (an index lookup), so a revocation made through
any node is refused by every node at its next request. The limits document is the same
JSON the tree keeps in ``.limits.json`` (app/storage/limits.py checks both), with a version
that every change bumps: a node's rate limiter looks at the version at most once a second.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from app.storage.core.clock import Clock, iso, system_clock
from app.storage.core.encoding import dumps
from app.storage.core.errors import NotFound
from app.storage.core.limits import (
    VERSION,
    LimitEdits,
    LimitsFileError,
    Quotas,
    RateOverrides,
    check_document,
    quotas_of,
)
from app.storage.core.tokens import Token, TokenRegistryBase
from app.storage.pg.db import Database, lock_key, translated

_TOKEN_COLUMNS = (
    "id, role, tenant, project, name, created_at, expires_at, revoked_at, sha256,"  # noqa: S105
    " console_signed_out_at"
)
_KEY_BYTES = 32


class PgTokenRegistry(TokenRegistryBase):
    """Create, list, revoke and authenticate tokens kept in the ``tokens`` table."""

    def __init__(self, db: Database, *, clock: Clock = system_clock) -> None:
        self.db = db
        self.clock = clock
        self.path = "the tokens table of the database"

    def _find(self, sha256: str) -> Token | None:
        return self._one("sha256", sha256)

    def _one(self, column: str, value: str) -> Token | None:
        with self.db.transaction("tokens") as conn:
            row = conn.execute(
                f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE {column} = %s", (value,)
            ).fetchone()
        return None if row is None else Token(*row)

    def get(self, token_id: str) -> Token | None:
        """The token with this id, usable or not; None when there is none."""
        return self._one("id", token_id)

    def all(self) -> list[Token]:
        with self.db.transaction("tokens") as conn:
            rows = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY id").fetchall()
        return [Token(*r) for r in rows]

    def is_empty(self) -> bool:
        with self.db.transaction("tokens") as conn:
            return conn.execute("SELECT 1 FROM tokens LIMIT 1").fetchone() is None

    def _add(self, token: Token) -> None:
        with self.db.transaction("tokens") as conn:
            conn.execute(
                f"INSERT INTO tokens ({_TOKEN_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    token.id,
                    token.role,
                    token.tenant,
                    token.project,
                    token.name,
                    token.created_at,
                    token.expires_at,
                    token.revoked_at,
                    token.sha256,
                    token.console_signed_out_at,
                ),
            )

    def end_console_sessions(self, token_id: str) -> None:
        with self.db.transaction("tokens") as conn:
            ended = conn.execute(
                "UPDATE tokens SET console_signed_out_at = %s WHERE id = %s",
                (iso(self.clock()), token_id),
            ).rowcount
        if not ended:
            raise NotFound(f"no token with id {token_id}")

    def revoke(self, token_id: str) -> Token:
        with self.db.transaction("tokens") as conn:
            conn.execute(
                "UPDATE tokens SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL",
                (iso(self.clock()), token_id),
            )
            row = conn.execute(
                f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE id = %s", (token_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no token with id {token_id}")
        return Token(*row)


class PgLimits(LimitEdits):
    """The limit overrides document (app/storage/limits.py's format) in the ``limits`` table."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.path = "the limits table of the database"
        # Called after each change made through this object (this process applies it at once).
        self.listeners: list[Callable[[], None]] = []

    def stamp(self) -> tuple[int, int, int]:
        """Changes whenever the document does (its version); zeros when there is none."""
        with self.db.transaction("limits") as conn:
            row = conn.execute("SELECT version FROM limits WHERE id = 1").fetchone()
        return (0, 0, 0) if row is None else (int(row[0]), 0, 0)

    def document(self) -> dict[str, Any]:
        with self.db.transaction("limits") as conn:
            row = conn.execute("SELECT doc FROM limits WHERE id = 1").fetchone()
        return self._checked(None if row is None else row[0])

    @staticmethod
    def _checked(text: str | None) -> dict[str, Any]:
        if text is None:
            return {"version": VERSION, "projects": {}, "tenants": {}}
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise LimitsFileError(f"limits: not valid JSON ({exc})") from None
        check_document(doc)
        return doc  # type: ignore[no-any-return]

    def rates(self) -> RateOverrides:
        return check_document(self.document())

    def quotas(self) -> Quotas:
        return quotas_of(self.document())

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        with self.db.transaction("limits") as conn:
            conn.execute("INSERT INTO limits VALUES (1, %s, 0) ON CONFLICT DO NOTHING", (
                json.dumps({"version": VERSION, "projects": {}, "tenants": {}}),
            ))  # fmt: skip
            row = conn.execute("SELECT doc FROM limits WHERE id = 1 FOR UPDATE").fetchone()
            doc = self._checked(row[0] if row else None)
            before = dumps(doc)
            yield doc
            check_document(doc)
            after = dumps(doc)
            if after != before:
                conn.execute(
                    "UPDATE limits SET doc = %s, version = version + 1 WHERE id = 1",
                    (after.decode("utf-8"),),
                )
        for listener in self.listeners:
            listener()


def database_key(db: Database, name: str) -> bytes:
    """The deployment's secret ``name``, made on first use; every node reads the same bytes."""
    with db.transaction("keys") as conn:
        conn.execute(
            "INSERT INTO keys (name, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (name, secrets.token_bytes(_KEY_BYTES)),
        )
        row = conn.execute("SELECT value FROM keys WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return bytes(row[0])


def load_state(db: Database, name: str) -> dict[str, Any] | None:
    with db.transaction("service state") as conn:
        row = conn.execute("SELECT state FROM service_state WHERE name = %s", (name,)).fetchone()
    if row is None:
        return None
    state = json.loads(row[0])
    return state if isinstance(state, dict) else None


def save_state(db: Database, name: str, state: dict[str, Any]) -> None:
    with db.transaction("service state") as conn:
        conn.execute(
            "INSERT INTO service_state (name, state) VALUES (%s, %s)"
            " ON CONFLICT (name) DO UPDATE SET state = excluded.state",
            (name, json.dumps(state)),
        )


class Lease:
    """A session advisory lock held on a connection of its own: the holder is the one
    leader of every node. If the holder dies, or its connection breaks, the database drops
    the lock and another node's standby takes it."""

    def __init__(self, conn: psycopg.Connection[Any], text: str) -> None:
        self._conn = conn
        self._text = text

    @staticmethod
    def acquire(db: Database, name: str) -> Lease | None:
        text = lock_key("leader", name)
        conn = db.connect(autocommit=True)
        try:
            with translated("leader lease"):
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (text,)
                ).fetchone()
        except BaseException:
            conn.close()
            raise
        if not (row and row[0]):
            conn.close()
            return None
        return Lease(conn, text)

    def held(self) -> bool:
        """Whether the lease still holds (its connection is alive)."""
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def release(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._conn.close()  # ends the session, and with it the lock
