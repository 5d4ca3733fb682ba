"""PostgreSQL and the object store going away and coming back: a pooled connection the server
closed is replaced before it is lent, a lost object answers as a missing file does, and what a
client is told about an outage names no host, socket or object key."""

from __future__ import annotations

import io
import time
from typing import Any

import psycopg
import pytest

from app.storage.core.errors import LockTimeout, NotFound
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from app.storage.pg.db import CHECK_IDLE_SECONDS, translated

pytestmark = pytest.mark.all_backends
WEB = Scope("acme", "web")


def test_connections_the_server_closed_are_replaced_before_they_are_lent(
    pg_storage: Any, pg_settings: dict[str, Any]
) -> None:
    tasks: StorageBackend = pg_storage.tasks
    tasks.put_turn(WEB, "t", 0, meta={}, summary_md="before")
    pool = pg_storage.db.pool()
    held = [pool.getconn() for _ in range(3)]
    pids = [conn.info.backend_pid for conn in held]
    for conn in held:
        pool.putconn(conn)
    # What a PostgreSQL restart does to every idle connection of the pool.
    with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    time.sleep(CHECK_IDLE_SECONDS)  # a restart takes longer than this
    for i in range(6):
        assert tasks.get_turn(WEB, "t", 0).summary_md == "before", i
    tasks.put_turn(WEB, "t", 1, meta={}, summary_md="after")


def test_a_lost_object_answers_not_found_at_once(pg_storage: Any) -> None:
    tasks: StorageBackend = pg_storage.tasks
    tasks.put_turn(WEB, "t", 0, meta={}, summary_md="x")
    tasks.put_artifact(WEB, "t", 0, "a.bin", io.BytesIO(b"bytes"), content_type="text/plain")
    with pg_storage.db.snapshot("test") as conn:
        (blob,) = conn.execute("SELECT blob FROM artifacts WHERE name = 'a.bin'").fetchone()
    pg_storage.blobs.client().delete_object(Bucket=pg_storage.blobs.bucket, Key=blob)
    with pytest.raises(NotFound):
        tasks.open_artifact(WEB, "t", 0, "a.bin")


def test_a_lost_database_connection_is_503_without_libpq_s_text() -> None:
    lost = psycopg.OperationalError(
        'connection to server at "10.1.2.3", port 5432 failed: server closed the connection'
    )
    with pytest.raises(LockTimeout) as caught, translated("listing"):
        raise lost
    assert str(caught.value) == "listing: the database is unavailable"
