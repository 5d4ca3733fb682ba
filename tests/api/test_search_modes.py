"""GET /sandbox/memory/v1/search?mode=...: hybrid by default with an embedder, keyword and
semantic on request, the modes that ran in the answer, a 422 for another mode; without an
embedder, keyword results and the reason."""

from __future__ import annotations

import time
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import Tokens

BASE = "/sandbox/memory/v1"


@pytest.fixture
def app_overrides() -> dict[str, Any]:
    return {"EMBEDDER": "bundled"}


def seed(app: Flask, client: FlaskClient, tokens: Tokens) -> None:
    for task, summary in [
        ("auth", "The session TTL expired and the login cookie was dropped."),
        ("css", "Changed the button colours of the settings page."),
        ("ci", "The deploy pipeline caches npm packages between builds."),
    ]:
        r = client.put(
            f"{BASE}/tasks/{task}/turns/0",
            json={"summary_md": summary},
            headers=tokens.headers("writer"),
        )
        assert r.status_code == 200, r.json
    embedding = app.extensions["storage"].embedding
    deadline = time.monotonic() + 60
    while not embedding.idle():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def search(client: FlaskClient, tokens: Tokens, **query: str) -> Any:
    r = client.get(f"{BASE}/search", query_string=query, headers=tokens.headers("reader"))
    assert r.status_code == 200, r.json
    return r.json


def test_hybrid_is_the_default_and_finds_by_meaning(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    seed(app, client, tokens)
    body = search(client, tokens, q="authentication")
    assert body["modes"] == ["keyword", "semantic"] and body["fallback"] is None
    assert body["hits"][0]["task_id"] == "auth"
    assert search(client, tokens, q="authentication", mode="keyword")["hits"] == []
    semantic = search(client, tokens, q="authentication", mode="semantic")
    assert semantic["modes"] == ["semantic"] and semantic["hits"][0]["task_id"] == "auth"


def test_another_mode_is_a_422(client: FlaskClient, tokens: Tokens) -> None:
    r = client.get(
        f"{BASE}/search", query_string={"q": "x", "mode": "fuzzy"}, headers=tokens.headers("writer")
    )
    assert r.status_code == 422 and r.json["detail"][0]["loc"] == ["query", "mode"]


@pytest.mark.parametrize("app_overrides", [{"EMBEDDER": "off"}])
def test_without_an_embedder_a_hybrid_search_answers_keywords_and_says_why(
    client: FlaskClient, tokens: Tokens
) -> None:
    r = client.put(
        f"{BASE}/tasks/t/turns/0",
        json={"summary_md": "npm cache"},
        headers=tokens.headers("writer"),
    )
    assert r.status_code == 200
    body = search(client, tokens, q="npm", mode="hybrid")
    assert body["modes"] == ["keyword"] and "no embedder" in body["fallback"]
    assert [h["task_id"] for h in body["hits"]] == ["t"]
    assert search(client, tokens, q="npm")["fallback"] is None  # keyword: the default
