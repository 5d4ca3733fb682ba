"""Users on PostgreSQL: the ``users`` table, one row each, the record as JSON beside the
columns a query needs (core/users.py says what a record holds: no secret). A user changes
under ``SELECT … FOR UPDATE`` (a row that does not exist yet: ``INSERT … ON CONFLICT``), so
two sign-ins at once on two nodes make one user."""

from __future__ import annotations

import json
from collections.abc import Callable

from app.storage.core.encoding import dumps
from app.storage.core.users import User, is_user_id
from app.storage.pg.db import Database


class PgUsers:
    """The :class:`~app.storage.core.users.UserStore` of one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, user_id: str) -> User | None:
        if not is_user_id(user_id):
            return None
        with self.db.transaction("users") as conn:
            row = conn.execute("SELECT record FROM users WHERE id = %s", (user_id,)).fetchone()
        return None if row is None else User.from_json(json.loads(row[0]), f"user {user_id}")

    def change(self, user_id: str, change: Callable[[User | None], User]) -> User:
        if not is_user_id(user_id):
            raise ValueError(f"{user_id[:60]!r} is not a user id")
        with self.db.transaction("users") as conn:
            # A placeholder row to lock: the first sign-in of a user on two nodes at once
            # then waits here rather than failing on the primary key.
            conn.execute(
                "INSERT INTO users (id, issuer, subject, record) VALUES (%s, '', '', '')"
                " ON CONFLICT (id) DO NOTHING",
                (user_id,),
            )
            row = conn.execute(
                "SELECT record FROM users WHERE id = %s FOR UPDATE", (user_id,)
            ).fetchone()
            record = row[0] if row is not None else ""
            found = User.from_json(json.loads(record), f"user {user_id}") if record else None
            changed = change(found)
            if changed.id != user_id:
                raise ValueError("a change may not rename a user")
            conn.execute(
                "UPDATE users SET issuer = %s, subject = %s, record = %s WHERE id = %s",
                (changed.issuer, changed.subject, dumps(changed.to_json()).decode(), user_id),
            )
        return changed

    def all(self) -> list[User]:
        with self.db.transaction("users") as conn:
            rows = conn.execute("SELECT id, record FROM users WHERE record <> ''").fetchall()
        found = [User.from_json(json.loads(r[1]), f"user {r[0]}") for r in rows]
        return sorted(found, key=lambda u: (u.display.lower(), u.id))
