"""The usage tables of a project's listing index (``_listing.sqlite3``): named queries.

* ``usage_turns``: what each turn stores (artifacts, their bytes, its meta and summary),
  written in the same transaction as the turn's listing row;
* the ``counters`` rows ``turns``, ``artifacts``, ``artifact_bytes``, ``turn_bytes``: their
  sums, moved by each write by what it changed (the ``tasks`` counter is the listing's own);
* ``usage_stores``: what each memory store of the project holds, copied from the store's
  own index (tree/sqlite/store_index.py) by the holder of the store's lock;
* ``usage_reservations``: what the writes in flight of the project have reserved
  (core/usage.py), each dropped in the transaction that writes its write's counters.

All derived, like the rest of the listing: fsck compares them with a recount from the
records and ``--repair`` rebuilds them.
"""

# ruff: noqa: S608 - SQL text is fixed fragments and column lists; every value is bound.
from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from app.storage.core.usage import Reserved, StoreUsage, TurnUsage, Usage, owner_alive

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage_turns (
    task_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    artifacts INTEGER NOT NULL,
    artifact_bytes INTEGER NOT NULL,
    turn_bytes INTEGER NOT NULL,
    PRIMARY KEY (task_id, turn)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_stores (
    store_id TEXT PRIMARY KEY,
    memories INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    versions INTEGER NOT NULL,
    version_bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_reservations (
    id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,
    tasks INTEGER NOT NULL,
    owner TEXT NOT NULL,
    expires_us INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO counters VALUES ('turns', 0), ('artifacts', 0), ('artifact_bytes', 0),
    ('turn_bytes', 0);
"""
TURN_SUMS = ("turns", "artifacts", "artifact_bytes", "turn_bytes")
_SUMS = "count(*), coalesce(sum(artifacts), 0), coalesce(sum(artifact_bytes), 0), coalesce(sum(turn_bytes), 0)"
_STORE_SUMS = (
    "count(*), coalesce(sum(memories), 0), coalesce(sum(memory_bytes), 0),"
    " coalesce(sum(versions), 0), coalesce(sum(version_bytes), 0)"
)
_ADD = "UPDATE counters SET value = value + ? WHERE name = ?"


def _apply(conn: sqlite3.Connection, delta: tuple[int, int, int, int]) -> None:
    conn.executemany(_ADD, [(d, n) for d, n in zip(delta, TURN_SUMS, strict=True) if d])


def put_turn(conn: sqlite3.Connection, task_id: str, usage: TurnUsage) -> None:
    """Make one turn's usage row ``usage`` and move the counters by the difference."""
    old = conn.execute(
        "SELECT artifacts, artifact_bytes, turn_bytes FROM usage_turns"
        " WHERE task_id = ? AND turn = ?",
        (task_id, usage.turn),
    ).fetchone()
    conn.execute(
        "INSERT OR REPLACE INTO usage_turns VALUES (?, ?, ?, ?, ?)",
        (task_id, usage.turn, usage.artifacts, usage.artifact_bytes, usage.turn_bytes),
    )
    was = (1, *old) if old else (0, 0, 0, 0)
    now = (1, usage.artifacts, usage.artifact_bytes, usage.turn_bytes)
    _apply(conn, (now[0] - was[0], now[1] - was[1], now[2] - was[2], now[3] - was[3]))


def set_task(conn: sqlite3.Connection, task_id: str, usages: Iterable[TurnUsage]) -> None:
    """Make a task's usage rows exactly ``usages`` (none: the task is gone)."""
    rows = list(usages)
    (was,) = conn.execute(
        f"SELECT {_SUMS} FROM usage_turns WHERE task_id = ?", (task_id,)
    ).fetchall()
    conn.execute("DELETE FROM usage_turns WHERE task_id = ?", (task_id,))
    conn.executemany(
        "INSERT INTO usage_turns VALUES (?, ?, ?, ?, ?)",
        [(task_id, u.turn, u.artifacts, u.artifact_bytes, u.turn_bytes) for u in rows],
    )
    now = (
        len(rows),
        sum(u.artifacts for u in rows),
        sum(u.artifact_bytes for u in rows),
        sum(u.turn_bytes for u in rows),
    )
    _apply(conn, (now[0] - was[0], now[1] - was[1], now[2] - was[2], now[3] - was[3]))


def set_store(conn: sqlite3.Connection, store_id: str, usage: StoreUsage | None) -> None:
    """Make a store's row ``usage`` (None: the store is gone)."""
    if usage is None:
        conn.execute("DELETE FROM usage_stores WHERE store_id = ?", (store_id,))
        return
    conn.execute(
        "INSERT OR REPLACE INTO usage_stores VALUES (?, ?, ?, ?, ?)",
        (store_id, usage.memories, usage.memory_bytes, usage.versions, usage.version_bytes),
    )


def usage(conn: sqlite3.Connection) -> Usage:
    """The project's usage: its counters and the sum of its stores' rows."""
    counters = dict(
        conn.execute(
            "SELECT name, value FROM counters WHERE name IN"
            " ('tasks', 'turns', 'artifacts', 'artifact_bytes', 'turn_bytes')"
        ).fetchall()
    )
    stores, memories, memory_bytes, versions, version_bytes = conn.execute(
        f"SELECT {_STORE_SUMS} FROM usage_stores"
    ).fetchone()
    return Usage(
        tasks=int(counters.get("tasks", 0)),
        turns=int(counters.get("turns", 0)),
        artifacts=int(counters.get("artifacts", 0)),
        artifact_bytes=int(counters.get("artifact_bytes", 0)),
        turn_bytes=int(counters.get("turn_bytes", 0)),
        stores=int(stores),
        memories=int(memories),
        memory_bytes=int(memory_bytes),
        versions=int(versions),
        version_bytes=int(version_bytes),
    )


def reserved(conn: sqlite3.Connection, now_us: int, *, drop_dead: bool = False) -> Reserved:
    """What the live reservations hold; ``drop_dead`` (in a write transaction): delete the
    reservations whose holder died or whose lease lapsed."""
    total_bytes = total_tasks = 0
    dead = []
    for ident, nbytes, tasks, owner, expires_us in conn.execute(
        "SELECT id, bytes, tasks, owner, expires_us FROM usage_reservations"
    ):
        if expires_us <= now_us or not owner_alive(owner):
            dead.append((ident,))
            continue
        total_bytes += int(nbytes)
        total_tasks += int(tasks)
    if drop_dead and dead:
        conn.executemany("DELETE FROM usage_reservations WHERE id = ?", dead)
    return Reserved(total_bytes, total_tasks)


def reserve(
    conn: sqlite3.Connection, ident: str, nbytes: int, tasks: int, owner: str, expires_us: int
) -> None:
    """Add to reservation ``ident`` (made when it does not exist yet) and renew its lease."""
    conn.execute(
        "INSERT INTO usage_reservations VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
        " bytes = bytes + excluded.bytes, tasks = tasks + excluded.tasks,"
        " expires_us = excluded.expires_us",
        (ident, nbytes, tasks, owner, expires_us),
    )


def renew(conn: sqlite3.Connection, ident: str, expires_us: int) -> None:
    conn.execute("UPDATE usage_reservations SET expires_us = ? WHERE id = ?", (expires_us, ident))


def release(conn: sqlite3.Connection, ident: str | None) -> None:
    if ident is not None:
        conn.execute("DELETE FROM usage_reservations WHERE id = ?", (ident,))


# -- fsck -------------------------------------------------------------------------------------
def turn_usage_of(row: tuple[Any, ...]) -> TurnUsage:
    """A TurnUsage from (turn, artifacts, artifact_bytes, turn_bytes)."""
    turn, artifacts, artifact_bytes, turn_bytes = row
    return TurnUsage(int(turn), int(artifacts), int(artifact_bytes), int(turn_bytes))


def task_rows(conn: sqlite3.Connection, task_id: str) -> list[TurnUsage]:
    """One task's turn usage rows, in turn order."""
    return [
        turn_usage_of(r)
        for r in conn.execute(
            "SELECT turn, artifacts, artifact_bytes, turn_bytes FROM usage_turns"
            " WHERE task_id = ? ORDER BY turn",
            (task_id,),
        )
    ]


def store_rows(conn: sqlite3.Connection) -> dict[str, StoreUsage]:
    return {
        str(r[0]): StoreUsage(int(r[1]), int(r[2]), int(r[3]), int(r[4]))
        for r in conn.execute(
            "SELECT store_id, memories, memory_bytes, versions, version_bytes FROM usage_stores"
        )
    }


def counter_sums(conn: sqlite3.Connection) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the counters, the sums of the usage rows): equal in a consistent listing."""
    counters = dict(
        conn.execute(
            "SELECT name, value FROM counters WHERE name IN"
            " ('turns', 'artifacts', 'artifact_bytes', 'turn_bytes')"
        ).fetchall()
    )
    sums = conn.execute(f"SELECT {_SUMS} FROM usage_turns").fetchone()
    return tuple(int(counters.get(n, 0)) for n in TURN_SUMS), tuple(int(v) for v in sums)


def recount(conn: sqlite3.Connection) -> None:
    """Set the counters to the sums of the usage rows (fsck repair)."""
    sums = conn.execute(f"SELECT {_SUMS} FROM usage_turns").fetchone()
    conn.executemany(
        "UPDATE counters SET value = ? WHERE name = ?",
        [(int(v), n) for v, n in zip(sums, TURN_SUMS, strict=True)],
    )
