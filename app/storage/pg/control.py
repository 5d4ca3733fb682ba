"""What every node must agree on besides tokens and limits, kept in the database: secret
keys, service state, and the sweeper's leader lease (tree/control.py keeps the same on the
tree)."""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Any

import psycopg

from app.storage.pg.db import Database, lock_key, translated

_KEY_BYTES = 32


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
