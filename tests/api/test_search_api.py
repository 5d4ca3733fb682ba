"""GET /sandbox/memory/v1/search through the Flask test client: shape, paging, the 422s of
the query syntax, auth and scope, and its OpenAPI entry, on every backend."""

from __future__ import annotations

import pytest
import yaml
from flask.testing import FlaskClient

from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends
BASE = "/sandbox/memory/v1"
STORES = "/v1/memory_stores"


def seed(client: FlaskClient, tokens: Tokens, who: str = "writer") -> str:
    headers = tokens.headers(who)
    for task, summary in [
        ("fix-login", "## Login\n\nThe login bug: sessions expire after 30 minutes."),
        ("upload", "Streaming uploads; no login involved <b>here</b>."),
    ]:
        r = client.put(
            f"{BASE}/tasks/{task}/turns/0",
            json={"meta": {"model": "claude", "ticket": "WEB-17"}, "summary_md": summary},
            headers=headers,
        )
        assert r.status_code == 200, r.json
    store = client.post(STORES, json={"name": "Team prefs"}, headers=headers).json
    r = client.post(
        f"{STORES}/{store['id']}/memories",
        json={"path": "/bugs/login.md", "content": "Login bug: raise the session TTL."},
        headers=headers,
    )
    assert r.status_code == 200, r.json
    return str(store["id"])


def test_search_returns_ranked_hits_of_both_kinds_with_marked_snippets(
    client: FlaskClient, tokens: Tokens
) -> None:
    store_id = seed(client, tokens)
    r = client.get(
        f"{BASE}/search", query_string={"q": "login bug"}, headers=tokens.headers("reader")
    )
    assert r.status_code == 200, r.json
    body = r.json
    assert set(body) == {
        "hits",
        "next_cursor",
        "stores_searched",
        "stores_skipped",
        "modes",
        "fallback",
    }
    assert (body["modes"], body["fallback"]) == (["keyword"], None)  # no embedder here
    assert (body["next_cursor"], body["stores_searched"], body["stores_skipped"]) == (None, 1, 0)
    hits = body["hits"]
    assert {(h["kind"], h["task_id"] or h["path"]) for h in hits} == {
        ("turn", "fix-login"),
        ("memory", "/bugs/login.md"),
    }
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    memory = next(h for h in hits if h["kind"] == "memory")
    assert memory["memory_store_id"] == store_id and memory["store_name"] == "Team prefs"
    assert memory["memory_id"].startswith("mem_") and memory["turn"] is None
    turn = next(h for h in hits if h["kind"] == "turn")
    assert turn["turn"] == 0 and turn["memory_id"] is None
    assert "\x02login\x03" in turn["snippet"].lower() and "<" not in turn["snippet"]
    # No HTML is added: what the agent wrote comes back as text.
    r = client.get(f"{BASE}/search?q=streaming", headers=tokens.headers("reader"))
    assert (
        r.json["hits"][0]["snippet"] == "\x02Streaming\x03 uploads; no login involved <b>here</b>."
    )


def test_search_pages_with_a_cursor(client: FlaskClient, tokens: Tokens) -> None:
    seed(client, tokens)
    seen, cursor = [], None
    while True:
        args = {"q": "login", "limit": 1} | ({"cursor": cursor} if cursor else {})
        r = client.get(f"{BASE}/search", query_string=args, headers=tokens.headers("reader"))
        assert r.status_code == 200
        seen += [(h["kind"], h["task_id"] or h["path"]) for h in r.json["hits"]]
        cursor = r.json["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 3


@pytest.mark.shared_rule  # the query's schema and the cursor codec: one code for all
@pytest.mark.parametrize(
    ("query", "loc", "says"),
    [
        ({}, ["query", "q"], "Field required"),
        ({"q": ""}, ["query", "q"], "no word"),
        ({"q": "login OR bug"}, ["query", "q"], "OR is not an operator"),
        ({"q": '"login'}, ["query", "q"], "none that ends it"),
        ({"q": "*x"}, ["query", "q"], "may only end a word"),
        ({"q": "login", "limit": "0"}, ["query", "limit"], "between 1 and 100"),
        ({"q": "login", "limit": "x"}, ["query", "limit"], "valid integer"),
        ({"q": "login", "cursor": "forged"}, ["query", "cursor"], "not a cursor"),
    ],
)
def test_bad_queries_are_422_in_the_seed_shape(
    client: FlaskClient, tokens: Tokens, query: dict[str, str], loc: list[str], says: str
) -> None:
    r = client.get(f"{BASE}/search", query_string=query, headers=tokens.headers("reader"))
    assert r.status_code == 422, r.json
    (error,) = r.json["detail"]
    assert error["loc"] == loc and says in error["msg"], error


def test_a_cursor_of_another_query_or_project_is_refused(
    client: FlaskClient, tokens: Tokens
) -> None:
    seed(client, tokens)
    seed(client, tokens, who="other_project")
    r = client.get(f"{BASE}/search?q=login&limit=1", headers=tokens.headers("reader"))
    cursor = r.json["next_cursor"]
    for who, q in (("reader", "bug"), ("other_project", "login")):
        r = client.get(
            f"{BASE}/search", query_string={"q": q, "cursor": cursor}, headers=tokens.headers(who)
        )
        assert r.status_code == 422 and r.json["detail"][0]["loc"] == ["query", "cursor"]


def test_search_needs_a_token_and_finds_only_its_own_projects_text(
    client: FlaskClient, tokens: Tokens
) -> None:
    seed(client, tokens)
    assert client.get(f"{BASE}/search?q=login").status_code == 401
    for who in ("other_project", "other_tenant"):
        r = client.get(f"{BASE}/search?q=login", headers=tokens.headers(who))
        assert r.status_code == 200 and r.json["hits"] == [], who
    # Naming our project is refused, as on every other route.
    r = client.get(
        f"{BASE}/search?q=login",
        headers=tokens.headers("other_project", **{"X-Sandbox-Project-Id": "web"}),
    )
    assert r.status_code == 403
    r = client.get(
        f"{BASE}/search?q=login",
        headers=tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "web"}),
    )
    assert len(r.json["hits"]) == 3


def test_search_is_in_the_openapi_document(client: FlaskClient) -> None:
    spec = yaml.safe_load(client.get(f"{BASE}/openapi.yaml").data)
    op = spec["paths"][f"{BASE}/search"]["get"]
    assert op["operationId"] == "search_project"
    assert {p["name"] for p in op["parameters"]} >= {"q", "limit", "cursor"}
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SearchResults"
    }
    assert op["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"
    }
    hit = spec["components"]["schemas"]["SearchHit"]["properties"]
    assert {"kind", "score", "snippet", "task_id", "turn", "memory_id", "path"} <= set(hit)
