"""GET /sandbox/memory/v1/search?mode=...: hybrid by default with an embedder, keyword and
semantic on request, the modes that ran in the answer, a 422 for another mode; without an
embedder, keyword results and the reason."""

from __future__ import annotations

import time
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.services.mcp.tools import TOOLS
from tests.api.test_mcp import Mcp
from tests.conftest import Tokens

TOOLS_BY_NAME = {t.name: t for t in TOOLS}

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


# -- the other doors: MCP, recall (the console's is tests/console/test_search_page.py) --------
def test_the_mcp_search_tool_takes_a_mode_and_says_which_ran(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    seed(app, client, tokens)
    mcp = Mcp(client, tokens, "reader")
    mode = TOOLS_BY_NAME["search"].input_schema["properties"]["mode"]
    assert mode["enum"] == ["hybrid", "keyword", "semantic"]  # derived from app/schemas
    text, found = mcp.records("search", query="authentication")
    assert found["modes"] == ["keyword", "semantic"] and found["fallback"] is None
    assert found["hits"][0]["task_id"] == "auth" and "Ranked by keyword and semantic" in text
    text, found = mcp.records("search", query="authentication", mode="keyword")
    assert found["hits"] == [] and found["modes"] == ["keyword"] and "No hits" in text
    _, found = mcp.records("search", query="authentication", mode="semantic")
    assert found["modes"] == ["semantic"] and found["hits"][0]["task_id"] == "auth"
    assert "mode" in mcp.err("search", query="x", mode="fuzzy")


@pytest.mark.parametrize("app_overrides", [{"EMBEDDER": "off"}])
def test_the_mcp_search_tool_says_when_it_fell_back_to_keywords(
    client: FlaskClient, tokens: Tokens
) -> None:
    client.put(
        f"{BASE}/tasks/t/turns/0",
        json={"summary_md": "npm cache"},
        headers=tokens.headers("writer"),
    )
    text, found = Mcp(client, tokens, "reader").records("search", query="npm", mode="hybrid")
    assert found["modes"] == ["keyword"] and "no embedder" in found["fallback"]
    assert "Keyword results only: no embedder" in text and found["hits"][0]["task_id"] == "t"


def test_recall_finds_by_meaning_when_asked_with_its_any_term_keywords(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    seed(app, client, tokens)

    def recall(**body: str) -> Any:
        r = client.post(f"{BASE}/recall", json=body, headers=tokens.headers("reader"))
        assert r.status_code == 200, r.json
        return r.json

    prompt = "why did the authentication break?"
    # Keyword by default: a prompt whose words no text holds gets nothing.
    assert recall(prompt=prompt) == {
        "context": "",
        "chars": 0,
        "terms": ["authentication*", "break*"],
        "hits": [],
        "modes": ["keyword"],
        "fallback": None,
    }
    found = recall(prompt=prompt, mode="hybrid")
    assert found["modes"] == ["keyword", "semantic"] and found["fallback"] is None
    assert found["hits"][0]["task_id"] == "auth" and "session TTL" in found["context"]
    # Any one keyword is enough on the keyword side, as before.
    assert recall(prompt="npm and zebras", mode="hybrid")["hits"][0]["task_id"] == "ci"
    r = client.post(
        f"{BASE}/recall", json={"prompt": "x", "mode": "fuzzy"}, headers=tokens.headers("reader")
    )
    assert r.status_code == 422 and r.json["detail"][0]["loc"] == ["body", "mode"]
