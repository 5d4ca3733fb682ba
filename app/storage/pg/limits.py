"""The limits document on PostgreSQL: the same JSON the tree keeps in ``.limits.json``
(core/limits.py checks both), in one row with a version that every change bumps: a node's
rate limiter looks at the version at most once a second."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.storage.core.limits import (
    LimitEdits,
    LimitsFileError,
    check_document,
    empty_document,
)
from app.storage.pg.db import Database


class PgLimits(LimitEdits):
    """The limit overrides document (core/limits.py's format) in the ``limits`` table."""

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
            return empty_document()
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise LimitsFileError(f"limits: not valid JSON ({exc})") from None
        check_document(doc)
        return doc  # type: ignore[no-any-return]

    @contextmanager
    def _held(self) -> Iterator[tuple[dict[str, Any], Callable[[bytes], None]]]:
        """The document's row locked (FOR UPDATE) in one transaction, and the update of its
        bytes, which bumps its version."""
        with self.db.transaction("limits") as conn:
            conn.execute("INSERT INTO limits VALUES (1, %s, 0) ON CONFLICT DO NOTHING", (
                json.dumps(empty_document()),
            ))  # fmt: skip
            row = conn.execute("SELECT doc FROM limits WHERE id = 1 FOR UPDATE").fetchone()

            def write(after: bytes) -> None:
                conn.execute(
                    "UPDATE limits SET doc = %s, version = version + 1 WHERE id = 1",
                    (after.decode("utf-8"),),
                )

            yield self._checked(row[0] if row else None), write
