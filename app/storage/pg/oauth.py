"""OAuth grants and registered clients on PostgreSQL: the ``oauth_grants`` and
``oauth_clients`` tables, one row each, the record as JSON beside the columns a query needs
(core/oauth.py says what a record holds; secrets only as hashes). A grant changes under
``SELECT … FOR UPDATE``, so a code or refresh token is spent once across every node."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from app.storage.core.clock import iso
from app.storage.core.encoding import dumps
from app.storage.core.errors import NotFound
from app.storage.core.oauth import Client, Grant, Replayed
from app.storage.pg.db import Database


class PgOAuth:
    """The :class:`~app.storage.core.oauth.GrantStore` of one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add_grant(self, grant: Grant) -> None:
        with self.db.transaction("oauth grants") as conn:
            conn.execute(
                "INSERT INTO oauth_grants (id, token_id, record) VALUES (%s, %s, %s)",
                (grant.id, grant.token_id, dumps(grant.to_json()).decode()),
            )

    def grant(self, grant_id: str) -> Grant | None:
        with self.db.transaction("oauth grants") as conn:
            row = conn.execute(
                "SELECT record FROM oauth_grants WHERE id = %s", (grant_id,)
            ).fetchone()
        return None if row is None else Grant.from_json(json.loads(row[0]), f"grant {grant_id}")

    def change_grant(self, grant_id: str, change: Callable[[Grant], Grant]) -> Grant:
        replayed: Replayed | None = None
        with self.db.transaction("oauth grants") as conn:
            row = conn.execute(
                "SELECT record FROM oauth_grants WHERE id = %s FOR UPDATE", (grant_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no grant {grant_id[:60]}")
            found = Grant.from_json(json.loads(row[0]), f"grant {grant_id}")
            try:
                changed = change(found)
            except Replayed as exc:
                replayed, changed = exc, exc.grant
            if changed != found:
                conn.execute(
                    "UPDATE oauth_grants SET record = %s WHERE id = %s",
                    (dumps(changed.to_json()).decode(), grant_id),
                )
        if replayed is not None:
            raise replayed
        return changed

    def grants(self) -> list[Grant]:
        with self.db.transaction("oauth grants") as conn:
            rows = conn.execute("SELECT id, record FROM oauth_grants ORDER BY id").fetchall()
        return [Grant.from_json(json.loads(r[1]), f"grant {r[0]}") for r in rows]

    def add_client(self, client: Client) -> None:
        with self.db.transaction("oauth clients") as conn:
            conn.execute(
                "INSERT INTO oauth_clients (id, registered_from, created_at, record)"
                " VALUES (%s, %s, %s, %s)",
                (
                    client.client_id,
                    client.registered_from,
                    client.created_at,
                    dumps(client.to_json()).decode(),
                ),
            )

    def client(self, client_id: str) -> Client | None:
        with self.db.transaction("oauth clients") as conn:
            row = conn.execute(
                "SELECT record FROM oauth_clients WHERE id = %s", (client_id,)
            ).fetchone()
        return None if row is None else Client.from_json(json.loads(row[0]), client_id)

    def clients_registered_since(self, address: str, since: datetime) -> int:
        with self.db.transaction("oauth clients") as conn:
            row = conn.execute(
                "SELECT count(*) FROM oauth_clients"
                " WHERE registered_from = %s AND created_at >= %s",
                (address, iso(since)),
            ).fetchone()
        return int(row[0]) if row else 0
