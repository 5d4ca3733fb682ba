"""The token registry on PostgreSQL: the ``tokens`` table, read by hash on every request (an
index lookup), so a revocation made through any node is refused by every node at its next
request. core/tokens.py makes and checks the tokens."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

from app.storage.core.clock import Clock, iso, system_clock
from app.storage.core.errors import NotFound
from app.storage.core.tokens import Token, TokenRegistryBase
from app.storage.pg.db import Database

_TOKEN_COLUMNS = (
    "id, role, tenant, project, name, created_at, expires_at, revoked_at, sha256,"  # noqa: S105
    " console_signed_out_at, user_id"
)


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
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
                    token.user,
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
