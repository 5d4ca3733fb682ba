# ruff: noqa: S608 - table names are module constants; test SQL only.
"""The resident matrices on the tree: a query ranks from memory what the index's change log
says is current, in this process and after another process's writes, and never a removed
row's vector."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.storage.core.names import Scope
from app.storage.tree.sqlite import vectors
from tests.conftest import FixedClock
from tests.storage._embedders import HashEmbedder
from tests.storage._helpers import embedded_now
from tests.storage.tree.test_vectors import open_tree, write_corpus

SCOPE = Scope("acme", "web")
OTHER = Scope("acme", "api")
QUERY = "session cookie login signed"


def found(storage, scope: Scope = SCOPE) -> list[str]:  # type: ignore[no-untyped-def]
    return [h.task_id for h in storage.search(scope, QUERY, mode="semantic").hits]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


def test_a_delete_leaves_the_next_answer_though_its_vectors_were_in_memory(
    root: Path, clock: FixedClock
) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    write_corpus(storage)
    storage.tasks.put_turn(SCOPE, "twin", 0, meta={}, summary_md=CORPUS_LOGIN, actor="tok")
    embedded_now(storage)
    assert set(found(storage)[:2]) == {"login", "twin"}
    assert storage.searcher.resident.held() == [SCOPE]
    storage.tasks.delete_task(SCOPE, "login")
    assert "login" not in found(storage)  # no drain, no sweep in between
    # A replaced text is never ranked by its old vectors: close to the query before, not
    # after (whether its new vectors are stored yet or not).
    storage.tasks.put_turn(SCOPE, "twin", 0, meta={}, summary_md="meaningless filler", actor="tok")
    page = storage.search(SCOPE, QUERY, mode="semantic")
    assert all(h.score < 0.3 for h in page.hits if h.task_id == "twin")
    storage.tasks.put_turn(SCOPE, "db", 0, meta={}, summary_md=CORPUS_LOGIN, actor="tok")
    embedded_now(storage)
    assert found(storage)[0] == "db"


CORPUS_LOGIN = "The session TTL expired and the login cookie was dropped, users signed out."


def test_another_processs_writes_reach_a_warm_matrix(root: Path, clock: FixedClock) -> None:
    reader = open_tree(root, clock, HashEmbedder())
    writer = open_tree(root, clock, HashEmbedder())
    write_corpus(writer)
    embedded_now(writer)
    assert found(reader)[0] == "login"
    writer.tasks.delete_task(SCOPE, "login")
    writer.tasks.put_turn(SCOPE, "new", 0, meta={}, summary_md=CORPUS_LOGIN, actor="tok")
    embedded_now(writer)
    assert found(reader)[0] == "new" and "login" not in found(reader)


def test_a_matrix_behind_a_pruned_log_or_a_cleared_index_is_loaded_again(
    root: Path, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = open_tree(root, clock, HashEmbedder())
    writer = open_tree(root, clock, HashEmbedder())
    write_corpus(writer)
    embedded_now(writer)
    assert found(reader)[0] == "login"
    monkeypatch.setattr(vectors, "LOG_KEEP", 1)
    writer.tasks.delete_task(SCOPE, "login")
    for i in range(3):
        writer.tasks.put_turn(SCOPE, f"n{i}", 0, meta={}, summary_md=f"note {i}", actor="t")
    writer.tasks.put_turn(SCOPE, "new", 0, meta={}, summary_md=CORPUS_LOGIN, actor="tok")
    embedded_now(writer)
    listing = writer.layout.listing(SCOPE)
    conn = sqlite3.connect(listing)
    assert conn.execute(f"SELECT count(*) FROM {vectors.LOG}").fetchone()[0] <= 2
    assert found(reader)[0] == "new" and "login" not in found(reader)
    # Cleared (the index recreated): a new epoch, whatever the counter says.
    with conn:
        vectors.clear(conn)
    conn.close()
    assert found(reader) == []


def test_projects_keep_their_own_matrices(root: Path, clock: FixedClock) -> None:
    storage = open_tree(root, clock, HashEmbedder())
    write_corpus(storage, OTHER)
    storage.tasks.put_turn(SCOPE, "mine", 0, meta={}, summary_md="unrelated words", actor="t")
    embedded_now(storage)
    assert found(storage, OTHER)[0] == "login"
    assert set(found(storage)) <= {"mine"}
    assert storage.searcher.resident.held() == [OTHER, SCOPE]
