# ruff: noqa: S608 - table names are module constants; test SQL only.
"""Vectors beside the search text on the tree: the crash-safe embedding queue, hybrid and
semantic ranking, the embedder's fallback, a changed model, removal from every file, fsck."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.embeddings.bundled import WordLlamaEmbedder
from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from app.storage.tree.sqlite import vectors
from tests.conftest import FixedClock
from tests.storage._embedders import DownEmbedder, GarbageEmbedder, HashEmbedder
from tests.storage._helpers import embedded_now

SCOPE = Scope("acme", "web")
OTHER = Scope("acme", "api")
CORPUS = {
    "login": "The session TTL expired and the login cookie was dropped, so users were signed out.",
    "css": "Changed the button colours and the font sizes of the settings page.",
    "db": "Added a database migration that renames the orders table column.",
    "ci": "The deploy pipeline now caches the npm packages between builds.",
}


@pytest.fixture(scope="module")
def wordllama() -> WordLlamaEmbedder:
    """One loaded model for the whole module."""
    return WordLlamaEmbedder()


def open_tree(root: Path, clock: FixedClock, embedder: object | None) -> TreeStorage:
    return TreeStorage(root, clock=clock, lock_timeout=5.0, embedder=embedder)  # type: ignore[arg-type]


def write_corpus(storage: TreeStorage, scope: Scope = SCOPE) -> None:
    for task, text in CORPUS.items():
        storage.tasks.put_turn(scope, task, 0, meta={}, summary_md=text, actor="tok")


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def files_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


def test_a_write_queues_its_row_in_its_own_transaction_and_a_drain_embeds_it(
    root: Path, clock: FixedClock
) -> None:
    # A server with no embedder (or one killed before its drain) leaves the rows queued.
    write_corpus(open_tree(root, clock, None))
    listing = open_tree(root, clock, None).layout.listing(SCOPE)
    assert rows(listing, "SELECT count(*) FROM embed_queue") == [(4,)]
    assert rows(listing, "SELECT count(*) FROM search_vectors") == [(0,)]
    embedder = HashEmbedder()
    storage = open_tree(root, clock, embedder)
    report = storage.fsck()  # queued rows are work in progress, not faults
    assert report.clean and any("wait to be embedded" in n for n in report.notes)
    assert storage.embedding is not None and storage.embedding.drain(SCOPE) == 4
    assert rows(listing, "SELECT count(*) FROM embed_queue") == [(0,)]
    assert rows(listing, "SELECT DISTINCT model FROM search_vectors") == [("test:hash/32",)]
    assert storage.fsck().clean


def test_hybrid_finds_by_meaning_what_keywords_miss(
    root: Path, clock: FixedClock, wordllama
) -> None:  # type: ignore[no-untyped-def]
    storage = open_tree(root, clock, wordllama)
    write_corpus(storage)
    embedded_now(storage)
    keyword = storage.search(SCOPE, "authentication", mode="keyword")
    assert keyword.hits == () and keyword.modes == ("keyword",)
    hybrid = storage.search(SCOPE, "authentication")  # hybrid: the default with an embedder
    assert hybrid.modes == ("keyword", "semantic") and hybrid.fallback is None
    assert hybrid.hits[0].task_id == "login"
    assert hybrid.hits[0].snippet.startswith("The session TTL")  # the start of its text
    semantic = storage.search(SCOPE, "authentication", mode="semantic")
    assert semantic.modes == ("semantic",) and semantic.hits[0].task_id == "login"
    # An exact word still ranks its text first in hybrid.
    exact = storage.search(SCOPE, "npm")
    assert exact.hits[0].task_id == "ci"


def test_hybrid_pages_by_offset_and_refuses_a_keyword_cursor(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    for i in range(7):
        storage.tasks.put_turn(SCOPE, f"t{i}", 0, meta={}, summary_md=f"note {i}", actor="tok")
    embedded_now(storage)
    seen, cursor = [], None
    while True:
        page = storage.search(SCOPE, "note", limit=3, cursor=cursor)
        seen += [h.task_id for h in page.hits]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == [f"t{i}" for i in range(7)]
    keyword_cursor = storage.search(SCOPE, "note", limit=3, mode="keyword").next_cursor
    with pytest.raises(InvalidName):
        storage.search(SCOPE, "note", limit=3, cursor=keyword_cursor)
    with pytest.raises(InvalidName):
        storage.search(SCOPE, "note", mode="fuzzy")


def test_an_unavailable_embedder_answers_keyword_results_and_says_why(
    root: Path, clock: FixedClock
) -> None:
    storage = open_tree(root, clock, DownEmbedder())
    write_corpus(storage)
    embedded_now(storage)
    page = storage.search(SCOPE, "database")
    assert page.modes == ("keyword",) and "unavailable" in (page.fallback or "")
    assert [h.task_id for h in page.hits] == ["db"]
    # Nothing was embedded: the rows stay queued for the next drain.
    assert rows(storage.layout.listing(SCOPE), "SELECT count(*) FROM embed_queue") == [(4,)]


def test_garbage_from_the_embedder_stores_nothing(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, GarbageEmbedder())
    write_corpus(storage)
    embedded_now(storage)
    listing = storage.layout.listing(SCOPE)
    assert rows(listing, "SELECT count(*) FROM search_vectors") == [(0,)]
    assert rows(listing, "SELECT count(*) FROM embed_queue") == [(4,)]
    assert storage.search(SCOPE, "database").modes == ("keyword",)


def test_a_changed_model_reembeds_and_never_ranks_two_models_together(
    root: Path, clock: FixedClock
) -> None:
    old = open_tree(root, clock, HashEmbedder("test:old", 32))
    write_corpus(old)
    embedded_now(old)
    listing = old.layout.listing(SCOPE)
    assert rows(listing, "SELECT DISTINCT model FROM search_vectors") == [("test:old/32",)]
    new = open_tree(root, clock, HashEmbedder("test:new", 64))
    # Before the re-embedding: the old model's vectors are never ranked with the new query.
    assert new.search(SCOPE, "session cookie", mode="semantic").hits == ()
    assert new.embedding is not None and new.embedding.drain(SCOPE) == 4
    assert rows(listing, "SELECT DISTINCT model FROM search_vectors") == [("test:new/64",)]
    assert new.search(SCOPE, "session cookie", mode="semantic").hits[0].task_id == "login"
    assert new.fsck().clean


def test_a_project_never_finds_another_projects_vectors(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    write_corpus(storage, OTHER)
    storage.tasks.put_turn(SCOPE, "mine", 0, meta={}, summary_md="unrelated words", actor="t")
    other_tenant = Scope("globex", "web")
    write_corpus(storage, other_tenant)
    embedded_now(storage)
    for mode in ("semantic", "hybrid"):
        hits = storage.search(SCOPE, "session cookie login", mode=mode).hits
        assert {h.task_id for h in hits} <= {"mine"}


def test_memories_are_embedded_and_found_by_meaning(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    store = storage.stores.create_store(SCOPE, name="prefs").id
    storage.stores.create_memory(
        SCOPE, store, path="/ops/keys.md", content="rotate the deploy key monthly", actor=None
    )
    embedded_now(storage)
    page = storage.search(SCOPE, "deploy key rotation schedule", mode="semantic")
    assert [(h.kind, h.path) for h in page.hits] == [("memory", "/ops/keys.md")]
    assert page.stores_searched == 1


def _vector_of(db: Path) -> bytes:
    ((blob,),) = rows(db, "SELECT vec FROM search_vectors LIMIT 1")
    assert isinstance(blob, bytes)
    return blob


def test_a_deleted_tasks_vectors_leave_every_file_and_the_wal(
    root: Path, clock: FixedClock
) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    for i in range(20):
        storage.tasks.put_turn(SCOPE, f"keep-{i}", 0, meta={}, summary_md=f"keep {i}", actor="t")
    embedded_now(storage)
    storage.tasks.put_turn(SCOPE, "leak", 0, meta={}, summary_md="Qqzx leaked words", actor="t")
    embedded_now(storage)
    listing = storage.layout.listing(SCOPE)
    (blob,) = (
        b
        for (b,) in rows(
            listing,
            "SELECT v.vec FROM search_vectors v JOIN search_docs d ON d.doc = v.doc"
            " WHERE d.task_id = 'leak'",
        )
    )
    assert isinstance(blob, bytes) and blob in files_bytes(root)  # the check below can fail
    storage.tasks.delete_task(SCOPE, "leak")
    embedded_now(storage)
    assert blob not in files_bytes(root)


def test_a_deleted_memorys_vectors_leave_the_store_index_and_its_wal(
    root: Path, clock: FixedClock
) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    store = storage.stores.create_store(SCOPE, name="s").id
    for i in range(10):
        storage.stores.create_memory(SCOPE, store, path=f"/n{i}.md", content=f"n {i}", actor=None)
    memory = storage.stores.create_memory(
        SCOPE, store, path="/secret.md", content="Qqzx secret words", actor=None
    )
    embedded_now(storage)
    index = storage.stores.layout.store_index(storage.stores.layout.store_dir(SCOPE, store))
    (blob,) = (
        b
        for (b,) in rows(
            index,
            "SELECT v.vec FROM search_vectors v JOIN search_docs d ON d.doc = v.doc"
            f" WHERE d.memory_id = '{memory.id}'",
        )
    )
    assert isinstance(blob, bytes) and blob in files_bytes(root)
    storage.stores.delete_memory(SCOPE, store, memory.id, actor=None)
    embedded_now(storage)
    assert blob not in files_bytes(root)


def test_fsck_reports_lost_vectors_and_repair_rebuilds_them(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    write_corpus(storage)
    embedded_now(storage)
    listing = storage.layout.listing(SCOPE)
    conn = sqlite3.connect(listing)
    with conn:
        conn.execute(f"DELETE FROM {vectors.VECTORS}")
        conn.execute(f"DELETE FROM {vectors.EMBEDDED}")
    conn.close()
    report = storage.fsck()
    assert any("without vectors and not queued" in p for p in report.problems)
    repaired = storage.fsck(repair=True)
    assert repaired.repaired and not repaired.unrepairable
    assert storage.fsck().clean
    assert rows(listing, "SELECT count(DISTINCT doc) FROM search_vectors") == [(4,)]


def test_a_row_changed_while_it_was_embedded_keeps_its_newer_text(
    root: Path, clock: FixedClock
) -> None:
    storage = open_tree(root, clock, None)
    storage.tasks.put_turn(SCOPE, "t", 0, meta={}, summary_md="first words", actor="t")
    listing = storage.layout.listing(SCOPE)
    conn = sqlite3.connect(listing)
    ((doc, gen, values),) = vectors.batch(conn, ("meta", "summary"), 10)
    storage.tasks.put_turn(SCOPE, "t", 0, meta={}, summary_md="second words", actor="t")
    with conn:
        assert vectors.store(conn, "m/1", [(doc, gen, [(0, b"\0\0\0\0")])]) == 0
    conn.close()
    assert rows(listing, "SELECT count(*) FROM embed_queue") == [(1,)]
