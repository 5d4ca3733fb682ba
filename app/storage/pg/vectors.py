"""Vectors beside the search text on PostgreSQL (schema migration 12): the embedding queue's
worker, the change log the resident matrices follow, and fsck's look at both.

**A write never loses embedding work.** Triggers queue a turn's or a memory head's text in
the transaction that writes it (``turn_embeds``, ``memory_embeds``: queued, with a
generation), and drop its old vectors there; a row deleted, expired or redacted takes its
vectors with it in its own transaction (ON DELETE CASCADE, the triggers). A killed worker
stores nothing (its transaction is rolled back); the rows stay queued for the next drain.

**One drain per project** across every node: the project's session advisory lock, taken
without waiting on a connection of the drain's own (a node that finds it held leaves the work
to the holder, which looks at the queue again after it let go). A drain embeds
:data:`~app.storage.core.vectors.EMBED_BATCH` rows at a time with no transaction open, then
stores them in one transaction, keeping only rows whose generation did not move. The first
drain of a project in a process queues every row embedded with another model (a changed
model re-embeds in the background; searches rank only the current model's vectors).
"""

# ruff: noqa: S608 - SQL text is fixed fragments; every value is bound.

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.embeddings.base import Embedder, EmbedderUnavailable
from app.storage.core.background import Later
from app.storage.core.names import Scope
from app.storage.core.query import meta_text
from app.storage.core.vectors import (
    EMBED_BATCH,
    EMBED_SETTLE,
    embed_documents,
    embed_text,
    model_key,
)
from app.storage.pg.db import Database, lock_key, translated

log = logging.getLogger("app.storage.embedding")

# Change log entries kept per project: a resident matrix further behind is loaded again.
LOG_KEEP = 50_000
# Drains of one project back to back at most when rows keep arriving while it finishes.
_ROUNDS = 8
_P = "tenant = %(tenant)s AND project = %(project)s"

_TURN_BATCH = (
    "SELECT e.task_id, e.turn, e.gen, t.meta, t.summary FROM turn_embeds e"
    " JOIN turns t USING (tenant, project, task_id, turn)"
    f" WHERE e.queued AND e.{_P.replace(' AND ', ' AND e.')}"
    " ORDER BY e.task_id, e.turn LIMIT %(limit)s"
)
_MEMORY_BATCH = (
    "SELECT e.store_id, e.version_id, e.gen, v.path, v.content FROM memory_embeds e"
    " JOIN versions v ON v.store_id = e.store_id AND v.id = e.version_id"
    f" WHERE e.queued AND e.{_P.replace(' AND ', ' AND e.')}"
    " ORDER BY e.store_id, e.version_id LIMIT %(limit)s"
)


@dataclass(frozen=True, slots=True)
class VectorState:
    """What fsck says of one project's vectors."""

    missing: int  # a live text with neither a queue entry nor vectors: lost (a fault)
    waiting: int  # queued, or embedded with another model: the next drain's


class PgEmbedding:
    """The embedding queue's worker for the PostgreSQL backend."""

    def __init__(self, db: Database, embedder: Embedder) -> None:
        self.db = db
        self.embedder = embedder
        self.later_runs = Later(settle=EMBED_SETTLE)
        self._swept: set[Scope] = set()
        self._guard = threading.Lock()

    @property
    def model(self) -> str:
        return model_key(self.embedder)

    def later(self, scope: Scope) -> threading.Event:
        """Drain the project's queue in the background (see the module)."""
        return self.later_runs.run(
            ("embed", scope),
            lambda: self.drain(scope),
            f"embedding the queued text of {scope.tenant}/{scope.project}",
        )

    def idle(self) -> bool:
        return not self.later_runs.busy()

    def drain(self, scope: Scope) -> int | None:
        """Embed every queued row of the project; how many were stored, None when another
        session holds the project's embed lock (it drains them)."""
        text = lock_key("embed", scope.tenant, scope.project)
        total = 0
        with translated("embedding"), psycopg.connect(self.db.url, autocommit=True) as conn:
            for _ in range(_ROUNDS):
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (text,)
                ).fetchone()
                if not (row and row[0]):
                    return None
                try:
                    total += self._drain(conn, scope)
                except EmbedderUnavailable as exc:
                    log.warning(
                        "embedding %s/%s stopped (%s); the rows stay queued",
                        scope.tenant,
                        scope.project,
                        exc,
                    )
                    return total
                finally:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (text,))
                # A row queued while this drain finished, whose writer found the lock held.
                if not queued(conn, scope):
                    break
        return total

    def _drain(self, conn: psycopg.Connection[Any], scope: Scope) -> int:
        params = {"tenant": scope.tenant, "project": scope.project, "limit": EMBED_BATCH}
        with self._guard:
            first = scope not in self._swept
        if first:
            with conn.transaction():
                queue_stale(conn, scope, self.model)
            with self._guard:
                self._swept.add(scope)
        stored = 0
        while True:
            turns = conn.execute(_TURN_BATCH, params).fetchall()
            memories = conn.execute(_MEMORY_BATCH, params).fetchall()
            if not turns and not memories:
                return stored
            texts = [
                embed_text((meta_text(json.loads(meta)), bytes(summary).decode("utf-8")))
                for _, _, _, meta, summary in turns
            ] + [
                embed_text((path or "", "" if content is None else bytes(content).decode("utf-8")))
                for _, _, _, path, content in memories
            ]
            embedded = embed_documents(self.embedder, texts)
            with conn.transaction():
                for (task_id, turn, gen, _, _), chunks in zip(turns, embedded, strict=False):
                    stored += _store_turn(conn, scope, task_id, turn, gen, self.model, chunks)
                for (store_id, version, gen, _, _), chunks in zip(
                    memories, embedded[len(turns) :], strict=True
                ):
                    stored += _store_memory(conn, scope, store_id, version, gen, self.model, chunks)
                prune(conn, scope)

    def queued(self, scope: Scope) -> int:
        with self.db.snapshot("embedding queue") as conn:
            return queued(conn, scope)

    def check(self, scope: Scope, *, repair: bool) -> VectorState:
        """The project's texts without vectors of the current model; with ``repair`` the
        lost ones and those of another model are queued, and embedded now."""
        with self.db.transaction("vectors") as conn:
            state = missing(conn, scope, self.model)
            if repair and (state.missing or state.waiting):
                requeue_lost(conn, scope)
                queue_stale(conn, scope, self.model)
        if repair and (state.missing or state.waiting):
            self.drain(scope)
        return state


def _store_turn(
    conn: psycopg.Connection[Any],
    scope: Scope,
    task_id: str,
    turn: int,
    gen: int,
    model: str,
    chunks: list[tuple[int, bytes]],
) -> int:
    key = {"tenant": scope.tenant, "project": scope.project, "task_id": task_id, "turn": turn}
    # The turn first, then its queue entry: the order a delete of the turn takes them in.
    if (
        conn.execute(
            f"SELECT 1 FROM turns WHERE {_P} AND task_id = %(task_id)s AND turn = %(turn)s"
            " FOR KEY SHARE",
            key,
        ).fetchone()
        is None
    ):
        return 0
    row = conn.execute(
        f"SELECT gen, queued FROM turn_embeds WHERE {_P} AND task_id = %(task_id)s"
        " AND turn = %(turn)s FOR UPDATE",
        key,
    ).fetchone()
    if row is None or int(row[0]) != gen or not row[1]:
        return 0  # changed or removed meanwhile: its newer state stands
    conn.execute(
        f"DELETE FROM turn_vectors WHERE {_P} AND task_id = %(task_id)s AND turn = %(turn)s", key
    )
    if chunks:
        (ident,) = conn.execute("SELECT nextval('vector_ids')").fetchone() or (0,)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO turn_vectors (tenant, project, task_id, turn, ordinal, id, model,"
                " vec) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (scope.tenant, scope.project, task_id, turn, o, ident, model, vec)
                    for o, vec in chunks
                ],
            )
    conn.execute(
        f"UPDATE turn_embeds SET queued = false, model = %(model)s WHERE {_P}"
        " AND task_id = %(task_id)s AND turn = %(turn)s",
        {**key, "model": model},
    )
    return 1


def _store_memory(
    conn: psycopg.Connection[Any],
    scope: Scope,
    store_id: str,
    version: str,
    gen: int,
    model: str,
    chunks: list[tuple[int, bytes]],
) -> int:
    key = {"store_id": store_id, "version": version}
    if (
        conn.execute(
            "SELECT 1 FROM versions WHERE store_id = %(store_id)s AND id = %(version)s FOR KEY SHARE",
            key,
        ).fetchone()
        is None
    ):
        return 0
    row = conn.execute(
        "SELECT gen, queued FROM memory_embeds WHERE store_id = %(store_id)s"
        " AND version_id = %(version)s FOR UPDATE",
        key,
    ).fetchone()
    if row is None or int(row[0]) != gen or not row[1]:
        return 0
    conn.execute(
        "DELETE FROM memory_vectors WHERE store_id = %(store_id)s AND version_id = %(version)s",
        key,
    )
    if chunks:
        (ident,) = conn.execute("SELECT nextval('vector_ids')").fetchone() or (0,)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO memory_vectors (store_id, version_id, ordinal, tenant, project, id,"
                " model, vec) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (store_id, version, o, scope.tenant, scope.project, ident, model, vec)
                    for o, vec in chunks
                ],
            )
    conn.execute(
        "UPDATE memory_embeds SET queued = false, model = %(model)s"
        " WHERE store_id = %(store_id)s AND version_id = %(version)s",
        {**key, "model": model},
    )
    return 1


def queued(conn: psycopg.Connection[Any], scope: Scope) -> int:
    """Texts of the project waiting to be embedded."""
    params = {"tenant": scope.tenant, "project": scope.project}
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM turn_embeds WHERE {_P} AND queued)"
        f" + (SELECT count(*) FROM memory_embeds WHERE {_P} AND queued)",
        params,
    ).fetchone()
    return int(row[0]) if row else 0


def queue_stale(conn: psycopg.Connection[Any], scope: Scope, model: str) -> None:
    """Queue every text of the project embedded with another model (its vectors stay, never
    ranked with ``model``'s, until it is embedded again)."""
    params = {"tenant": scope.tenant, "project": scope.project, "model": model}
    for table in ("turn_embeds", "memory_embeds"):
        conn.execute(
            f"UPDATE {table} SET queued = true, gen = gen + 1 WHERE {_P} AND NOT queued"
            " AND model IS DISTINCT FROM %(model)s",
            params,
        )


def requeue_lost(conn: psycopg.Connection[Any], scope: Scope) -> None:
    """A queue entry for each live text that has none (a fault fsck repairs)."""
    params = {"tenant": scope.tenant, "project": scope.project}
    conn.execute(
        "INSERT INTO turn_embeds (tenant, project, task_id, turn)"
        f" SELECT tenant, project, task_id, turn FROM turns WHERE {_P}"
        " ON CONFLICT DO NOTHING",
        params,
    )
    conn.execute(
        "INSERT INTO memory_embeds (store_id, version_id, tenant, project)"
        " SELECT m.store_id, m.head, s.tenant, s.project FROM memories m"
        " JOIN stores s ON s.id = m.store_id WHERE s.tenant = %(tenant)s"
        " AND s.project = %(project)s ON CONFLICT DO NOTHING",
        params,
    )


def missing(conn: psycopg.Connection[Any], scope: Scope, model: str) -> VectorState:
    params = {"tenant": scope.tenant, "project": scope.project, "model": model}
    row = conn.execute(
        "SELECT"
        f" (SELECT count(*) FROM turns t WHERE t.{_P.replace(' AND ', ' AND t.')}"
        "   AND NOT EXISTS (SELECT 1 FROM turn_embeds e WHERE e.tenant = t.tenant"
        "   AND e.project = t.project AND e.task_id = t.task_id AND e.turn = t.turn))"
        " + (SELECT count(*) FROM memories m JOIN stores s ON s.id = m.store_id"
        "   WHERE s.tenant = %(tenant)s AND s.project = %(project)s AND NOT EXISTS"
        "   (SELECT 1 FROM memory_embeds e WHERE e.store_id = m.store_id"
        "   AND e.version_id = m.head)),"
        f" (SELECT count(*) FROM turn_embeds WHERE {_P}"
        "   AND (queued OR model IS DISTINCT FROM %(model)s))"
        f" + (SELECT count(*) FROM memory_embeds WHERE {_P}"
        "   AND (queued OR model IS DISTINCT FROM %(model)s))",
        params,
    ).fetchone()
    assert row is not None
    return VectorState(int(row[0]), int(row[1]))


def prune(conn: psycopg.Connection[Any], scope: Scope) -> None:
    """Keep the project's last :data:`LOG_KEEP` change log entries."""
    conn.execute(
        f"DELETE FROM vector_changes WHERE {_P} AND seq <= (SELECT seq FROM vector_heads"
        f" WHERE {_P}) - %(keep)s",
        {"tenant": scope.tenant, "project": scope.project, "keep": LOG_KEEP},
    )


class PgChanges:
    """A project's change log as core/resident.py reads it, inside the caller's snapshot.
    One index per project: its turns' and memories' vectors together, by embedding id."""

    def __init__(self, conn: psycopg.Connection[Any], scope: Scope) -> None:
        self.conn = conn
        self.params = {"tenant": scope.tenant, "project": scope.project}

    def version(self) -> tuple[str, int]:
        row = self.conn.execute(f"SELECT seq FROM vector_heads WHERE {_P}", self.params)
        found = row.fetchone()
        return "", int(found[0]) if found else 0

    def changed(self, since: int) -> list[int] | None:
        row = self.conn.execute(
            f"SELECT min(seq) FROM vector_changes WHERE {_P} AND seq IS NOT NULL", self.params
        ).fetchone()
        if row is None or row[0] is None or int(row[0]) > since + 1:
            return None  # pruned past ``since``: load everything again
        return [
            int(i)
            for (i,) in self.conn.execute(
                f"SELECT DISTINCT id FROM vector_changes WHERE {_P} AND seq > %(since)s",
                {**self.params, "since": since},
            )
        ]

    def rows(self, model: str, docs: Sequence[int] | None) -> list[tuple[int, bytes]]:
        params: dict[str, Any] = {**self.params, "model": model, "ids": list(docs or [])}
        which = "" if docs is None else " AND id = ANY(%(ids)s)"
        return [
            (int(i), bytes(v))
            for i, v in self.conn.execute(
                f"SELECT id, vec FROM turn_vectors WHERE {_P} AND model = %(model)s{which}"
                f" UNION ALL SELECT id, vec FROM memory_vectors WHERE {_P}"
                f" AND model = %(model)s{which} ORDER BY 1",
                params,
            )
        ]
