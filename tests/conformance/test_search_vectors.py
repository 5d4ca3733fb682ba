"""Hybrid, semantic and keyword search on every backend: what each mode ranks and says, the
fallback, the cursor, and the promises search keeps with vectors too: another tenant's or
project's rows are never found, and a deleted, replaced or expired text's vectors never rank.

A test embedder (deterministic vectors from each word's hash) stands for a model; ``settle``
waits through fsck, the Protocol's own report, until nothing waits to be embedded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.storage.core.errors import InvalidName
from app.storage.core.names import Scope
from app.storage.interface import StorageBackend
from tests.conformance.conftest import Factory
from tests.conftest import FixedClock
from tests.storage._embedders import DownEmbedder, HashEmbedder

SCOPE = Scope("acme", "web")
CORPUS = {
    "login": "The session TTL expired and the login cookie was dropped, users signed out.",
    "css": "Changed the button colours and the font sizes of the settings page.",
    "db": "Added a database migration that renames the orders table column.",
    "ci": "The deploy pipeline now caches the npm packages between builds.",
}
# Shares words with the login turn only; "yesterday" is in no text, so keywords find nothing.
QUERY = "session cookie signed yesterday"


@pytest.fixture
def backend(make_backend: Factory) -> StorageBackend:
    return make_backend(EMBEDDER=HashEmbedder())


def settle(backend: StorageBackend) -> None:
    deadline = time.monotonic() + 60
    while any("wait to be embedded" in n for n in backend.fsck().notes):
        assert time.monotonic() < deadline, "embedding did not finish"
        time.sleep(0.05)


def write(backend: StorageBackend, scope: Scope = SCOPE) -> None:
    for task, text in CORPUS.items():
        backend.tasks.put_turn(scope, task, 0, meta={"agent": "a"}, summary_md=text, actor="t")


def tasks_found(backend: StorageBackend, query: str = QUERY, **kw: object) -> list[str | None]:
    return [h.task_id for h in backend.search(SCOPE, query, **kw).hits]  # type: ignore[arg-type]


def test_each_mode_ranks_what_it_says_and_hybrid_is_the_default(backend: StorageBackend) -> None:
    assert backend.search_modes() == ("hybrid", "keyword", "semantic")
    write(backend)
    settle(backend)
    keyword = backend.search(SCOPE, QUERY, mode="keyword")
    assert keyword.hits == () and keyword.modes == ("keyword",) and keyword.fallback is None
    hybrid = backend.search(SCOPE, QUERY)
    assert hybrid.modes == ("keyword", "semantic") and hybrid.fallback is None
    assert hybrid.hits[0].task_id == "login" and hybrid.hits[0].kind == "turn"
    # Snippets still come from the text.
    assert hybrid.hits[0].snippet.replace("\x02", "").replace("\x03", "").startswith("The sess")
    semantic = backend.search(SCOPE, QUERY, mode="semantic")
    assert semantic.modes == ("semantic",) and semantic.hits[0].task_id == "login"
    assert 0 < semantic.hits[0].score <= 1.0  # a cosine
    # An exact word still puts its text first in hybrid.
    assert tasks_found(backend, "npm")[0] == "ci"
    with pytest.raises(InvalidName):
        backend.search(SCOPE, QUERY, mode="fuzzy")
    assert backend.fsck().clean


def test_hybrid_pages_by_offset_and_refuses_a_keyword_cursor(backend: StorageBackend) -> None:
    for i in range(7):
        backend.tasks.put_turn(SCOPE, f"t{i}", 0, meta={}, summary_md=f"note {i}", actor="t")
    settle(backend)
    seen, cursor = [], None
    while True:
        page = backend.search(SCOPE, "note", limit=3, cursor=cursor)
        seen += [h.task_id for h in page.hits]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == [f"t{i}" for i in range(7)]  # type: ignore[type-var]
    keyword_cursor = backend.search(SCOPE, "note", limit=3, mode="keyword").next_cursor
    with pytest.raises(InvalidName):
        backend.search(SCOPE, "note", limit=3, cursor=keyword_cursor)


def test_no_tenant_or_project_finds_anothers_vectors(backend: StorageBackend) -> None:
    write(backend, Scope("acme", "api"))
    write(backend, Scope("globex", "web"))
    backend.tasks.put_turn(SCOPE, "mine", 0, meta={}, summary_md="unrelated words", actor="t")
    store = backend.stores.create_store(Scope("globex", "web"), name="notes").id
    backend.stores.create_memory(
        Scope("globex", "web"), store, path="/s.md", content=CORPUS["login"], actor=None
    )
    settle(backend)
    for mode in ("semantic", "hybrid"):
        page = backend.search(SCOPE, QUERY, mode=mode)
        assert {h.task_id for h in page.hits} <= {"mine"} and page.stores_searched == 0
    assert backend.search(Scope("acme", "api"), QUERY, mode="semantic").hits[0].task_id == "login"


def test_deleted_replaced_and_expired_texts_never_rank_by_their_vectors(
    backend: StorageBackend, clock: FixedClock
) -> None:
    write(backend)
    backend.tasks.put_turn(SCOPE, "twin", 0, meta={}, summary_md=CORPUS["login"], actor="t")
    backend.tasks.put_turn(SCOPE, "twin", 1, meta={}, summary_md=CORPUS["login"], actor="t")
    settle(backend)
    assert set(tasks_found(backend, mode="semantic")[:3]) == {"login", "twin"}
    assert backend.search(SCOPE, QUERY, mode="semantic").modes == ("semantic",)
    backend.tasks.delete_task(SCOPE, "login")  # answered: its vectors rank no more
    backend.tasks.delete_turn(SCOPE, "twin", 1)
    found = backend.search(SCOPE, QUERY, mode="semantic").hits
    assert [(h.task_id, h.turn) for h in found if h.task_id in ("login", "twin")] == [("twin", 0)]
    backend.tasks.put_turn(SCOPE, "twin", 0, meta={}, summary_md="meaningless filler", actor="t")
    found = backend.search(SCOPE, QUERY, mode="semantic").hits
    assert all(h.score < 0.3 for h in found if h.task_id == "twin")
    # Past its retention, a turn is found by neither half, swept or not.
    backend.tasks.put_turn(SCOPE, "old", 0, meta={}, summary_md=CORPUS["login"], actor="t")
    settle(backend)
    assert tasks_found(backend, mode="semantic")[0] == "old"
    clock.advance(days=31)
    assert "old" not in tasks_found(backend, mode="semantic")
    assert "old" not in tasks_found(backend, "session cookie")


def test_memories_rank_by_their_head_and_leave_with_it(backend: StorageBackend) -> None:
    store = backend.stores.create_store(SCOPE, name="prefs").id
    memory = backend.stores.create_memory(
        SCOPE, store, path="/ops/keys.md", content="rotate the deploy key monthly", actor=None
    )
    settle(backend)
    page = backend.search(SCOPE, "deploy key rotation schedule", mode="semantic")
    assert [(h.kind, h.path) for h in page.hits] == [("memory", "/ops/keys.md")]
    assert page.hits[0].store_name == "prefs"
    backend.stores.update_memory(SCOPE, store, memory.id, content="meaningless filler", actor=None)
    assert all(
        h.score < 0.3
        for h in backend.search(SCOPE, "deploy key rotation schedule", mode="semantic").hits
    )
    backend.stores.delete_memory(SCOPE, store, memory.id, actor=None)
    assert backend.search(SCOPE, "meaningless filler", mode="semantic").hits == ()


@pytest.mark.all_backends
def test_an_unavailable_embedder_answers_keyword_results_and_says_why(
    make_backend: Factory,
) -> None:
    backend = make_backend(EMBEDDER=DownEmbedder())
    write(backend)
    page = backend.search(SCOPE, "database")
    assert page.modes == ("keyword",) and "unavailable" in (page.fallback or "")
    assert [h.task_id for h in page.hits] == ["db"]
    assert backend.search(SCOPE, "database", mode="semantic").modes == ("keyword",)


@pytest.mark.all_backends
def test_without_an_embedder_search_is_keyword_only_and_says_so(make_backend: Factory) -> None:
    backend = make_backend()
    write(backend)
    assert backend.search_modes() == ("keyword",)
    assert backend.search(SCOPE, "database").fallback is None
    page = backend.search(SCOPE, "database", mode="hybrid")
    assert page.modes == ("keyword",) and "no embedder" in (page.fallback or "")


def test_a_restored_project_gets_its_vectors_back(
    backend: StorageBackend, other_backend: Factory, tmp_path: Path
) -> None:
    """Backups carry no vectors (docs/search.md): a restore queues every row it brings, and
    the restored server embeds them."""
    write(backend)
    store = backend.stores.create_store(SCOPE, name="prefs").id
    backend.stores.create_memory(
        SCOPE, store, path="/ops/keys.md", content="rotate the deploy key monthly", actor=None
    )
    settle(backend)
    archive = tmp_path / "backup.tar"
    backend.export(archive)
    restored = other_backend(EMBEDDER=HashEmbedder())
    with open(archive, "rb") as fh:
        restored.import_(fh)
    settle(restored)
    assert backend.fsck().clean and restored.fsck().clean
    for query in (QUERY, "deploy key rotation schedule"):
        mine = backend.search(SCOPE, query, mode="semantic").hits
        theirs = restored.search(SCOPE, query, mode="semantic").hits
        assert [(h.kind, h.task_id, h.path) for h in theirs] == [
            (h.kind, h.task_id, h.path) for h in mine
        ]
        assert theirs[0].score == pytest.approx(mine[0].score)
