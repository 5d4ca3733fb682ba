"""Vectors on PostgreSQL (schema migration 12): queued in the text's own transaction, one
drain per project (its advisory lock), gone with their row in its transaction, a changed
model re-embedded and never ranked with the old one, fsck's report and repair, and a
database upgraded from before vectors (the behaviour both backends share:
tests/conformance/test_search_vectors.py)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from app.storage.backends import open_backend
from app.storage.core.names import Scope
from app.storage.pg import schema
from app.storage.pg.db import lock_key
from tests.storage._embedders import HashEmbedder

pytestmark = pytest.mark.all_backends
SCOPE = Scope("acme", "web")
LOGIN = "The session TTL expired and the login cookie was dropped, users signed out."
QUERY = "session cookie signed yesterday"


def sql(pg_settings: dict[str, Any], statement: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(statement, args or None)
        return cur.fetchall() if cur.description else []


def open_pg(pg_settings: dict[str, Any], embedder: object) -> Any:
    return open_backend({**pg_settings, "EMBEDDER": embedder})


def turns(storage: Any, n: int = 3) -> None:
    for i in range(n):
        storage.tasks.put_turn(SCOPE, f"t{i}", 0, meta={}, summary_md=f"note {i}", actor="t")
    storage.tasks.put_turn(SCOPE, "login", 0, meta={}, summary_md=LOGIN, actor="t")


def drained(storage: Any) -> None:
    """Wait for the drains the writes started, then drain what is left here."""
    deadline = time.monotonic() + 60
    while not storage.embedding.idle():
        assert time.monotonic() < deadline, "embedding did not finish"
        time.sleep(0.01)
    storage.embedding.drain(SCOPE)


def test_a_write_queues_its_text_in_its_own_transaction(pg_settings: dict[str, Any]) -> None:
    plain = open_backend(pg_settings)  # no embedder: nothing drains
    turns(plain)
    assert sql(pg_settings, "SELECT count(*) FROM turn_embeds WHERE queued") == [(4,)]
    plain.close()
    storage = open_pg(pg_settings, HashEmbedder())
    try:
        report = storage.fsck()
        assert report.clean and any("wait to be embedded" in n for n in report.notes)
        assert storage.embedding.drain(SCOPE) == 4
        assert sql(pg_settings, "SELECT count(*) FROM turn_embeds WHERE queued") == [(0,)]
        assert sql(pg_settings, "SELECT DISTINCT model FROM turn_vectors") == [("test:hash/32",)]
        assert storage.fsck().clean and not storage.fsck().notes
    finally:
        storage.close()


def test_one_drain_per_project_across_sessions(pg_settings: dict[str, Any]) -> None:
    plain = open_backend(pg_settings)
    turns(plain)
    plain.close()
    storage = open_pg(pg_settings, HashEmbedder())
    text = lock_key("embed", SCOPE.tenant, SCOPE.project)
    try:
        with psycopg.connect(pg_settings["DATABASE_URL"], autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (text,))
            assert storage.embedding.drain(SCOPE) is None  # the holder drains
            assert storage.embedding.queued(SCOPE) == 4
        assert storage.embedding.drain(SCOPE) == 4
    finally:
        storage.close()


def test_a_rows_vectors_leave_in_its_own_transaction(pg_settings: dict[str, Any]) -> None:
    storage = open_pg(pg_settings, HashEmbedder())
    try:
        turns(storage)
        store = storage.stores.create_store(SCOPE, name="s").id
        memory = storage.stores.create_memory(
            SCOPE, store, path="/secret.md", content=LOGIN, actor=None
        )
        drained(storage)
        count = "SELECT count(*) FROM turn_vectors WHERE task_id = 'login'"
        assert sql(pg_settings, count) == [(1,)]
        storage.tasks.delete_task(SCOPE, "login")
        assert sql(pg_settings, count) == [(0,)]
        memories = "SELECT count(*) FROM memory_vectors"
        assert sql(pg_settings, memories) == [(1,)]
        storage.stores.update_memory(SCOPE, store, memory.id, content="other", actor=None)
        assert sql(pg_settings, memories) == [(0,)]  # the old head's went with it
        drained(storage)
        # Every change is numbered at commit, one number per transaction, for the workers'
        # resident matrices; the project's head is the last number.
        numbered = sql(pg_settings, "SELECT count(*) FROM vector_changes WHERE seq IS NULL")
        assert numbered == [(0,)]
        ((head, last, commits, numbers),) = sql(
            pg_settings,
            "SELECT (SELECT seq FROM vector_heads), max(seq), count(DISTINCT xid),"
            " count(DISTINCT seq) FROM vector_changes",
        )
        assert head == last == numbers == commits >= 4
    finally:
        storage.close()


def test_a_changed_model_reembeds_and_never_ranks_two_models_together(
    pg_settings: dict[str, Any],
) -> None:
    old = open_pg(pg_settings, HashEmbedder("test:old", 32))
    turns(old)
    drained(old)
    old.close()
    new = open_pg(pg_settings, HashEmbedder("test:new", 64))
    try:
        assert new.search(SCOPE, QUERY, mode="semantic").hits == ()
        assert new.embedding.drain(SCOPE) == 4
        assert sql(pg_settings, "SELECT DISTINCT model FROM turn_vectors") == [("test:new/64",)]
        assert new.search(SCOPE, QUERY, mode="semantic").hits[0].task_id == "login"
        assert new.fsck().clean
    finally:
        new.close()


def test_fsck_reports_lost_queue_entries_and_repair_embeds_them(
    pg_settings: dict[str, Any],
) -> None:
    storage = open_pg(pg_settings, HashEmbedder())
    try:
        turns(storage)
        drained(storage)
        sql(pg_settings, "DELETE FROM turn_embeds WHERE task_id = 'login'")
        report = storage.fsck()
        assert any("without vectors and not queued" in p for p in report.problems)
        repaired = storage.fsck(repair=True)
        assert repaired.repaired and not repaired.unrepairable
        assert storage.fsck().clean
        assert storage.search(SCOPE, QUERY, mode="semantic").hits[0].task_id == "login"
    finally:
        storage.close()


def test_an_upgraded_database_queues_the_rows_it_held(
    pg_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "MIGRATIONS", tuple(m for m in schema.MIGRATIONS if m[0] != 12))
    before = open_backend(pg_settings)
    turns(before)
    store = before.stores.create_store(SCOPE, name="s").id
    before.stores.create_memory(SCOPE, store, path="/m.md", content="deploy key", actor=None)
    before.close()
    monkeypatch.undo()
    after = open_pg(pg_settings, HashEmbedder())
    try:
        assert after.embedding.queued(SCOPE) == 5
        assert after.embedding.drain(SCOPE) == 5
        assert after.search(SCOPE, QUERY, mode="semantic").hits[0].task_id == "login"
    finally:
        after.close()
