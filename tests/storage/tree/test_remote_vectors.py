"""Vectors made by an OpenAI-compatible embeddings server (a real HTTP server on 127.0.0.1):
the model's width learned from its first answer is part of the stored key, so a restarted
process re-embeds nothing; a server that goes down leaves search answering keywords."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.embeddings.factory import make_embedder
from app.storage.core.names import Scope
from app.storage.tree.backend import TreeStorage
from tests.conftest import FixedClock
from tests.embeddings.stub import DIMS, StubEmbeddingsServer, embeddings_server
from tests.storage._helpers import embedded_now

__all__ = ["embeddings_server"]  # the fixture, imported to be used here

SCOPE = Scope("acme", "web")


def open_tree(root: Path, clock: FixedClock, server: StubEmbeddingsServer) -> TreeStorage:
    embedder = make_embedder(
        {"EMBEDDER": "openai", "EMBEDDINGS_URL": server.base_url, "EMBEDDINGS_MODEL": "stub"}
    )
    return TreeStorage(root, clock=clock, lock_timeout=5.0, embedder=embedder)


def models(listing: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(listing)
    try:
        return conn.execute("SELECT DISTINCT model FROM search_vectors").fetchall()
    finally:
        conn.close()


def test_a_remote_models_vectors_keep_its_width_and_a_restart_reembeds_nothing(
    tmp_path: Path, clock: FixedClock, embeddings_server: StubEmbeddingsServer
) -> None:
    root = tmp_path / "root"
    first = open_tree(root, clock, embeddings_server)
    first.tasks.put_turn(SCOPE, "login", 0, meta={}, summary_md="session cookie expired", actor="t")
    first.tasks.put_turn(SCOPE, "css", 0, meta={}, summary_md="button colours", actor="t")
    embedded_now(first)
    listing = first.layout.listing(SCOPE)
    assert models(listing) == [(f"openai:stub/{DIMS}",)]
    # A new process: its embedder has not answered yet, and must not take every stored
    # vector for another model's.
    again = open_tree(root, clock, embeddings_server)
    assert again.embedding is not None
    assert again.embedding.drain(SCOPE) == 0
    embedded_now(again)
    assert again.embedding.queued(SCOPE) == 0
    assert again.fsck().clean
    found = again.search(SCOPE, "session cookie")
    assert found.modes == ("keyword", "semantic") and found.hits[0].task_id == "login"
    embeddings_server.down()
    down = open_tree(root, clock, embeddings_server)
    fallback = down.search(SCOPE, "session cookie")
    assert fallback.modes == ("keyword",) and fallback.fallback
    assert [h.task_id for h in fallback.hits] == ["login"]
    report = down.fsck()  # vectors cannot be checked against a model that does not answer
    assert any("vectors not checked" in n for n in report.notes)
