"""The console's search page: the same storage call as the API, hits linked to their pages,
snippets escaped before the matches are highlighted."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.console.render import snippet
from app.embeddings.base import EmbedderUnavailable, ModelId
from tests.conftest import Tokens
from tests.console.conftest import API, Browser

WEB = "/console/p/acme/web"


def _seed(client: FlaskClient, tokens: Tokens, who: str = "writer") -> str:
    headers = tokens.headers(who)
    r = client.put(
        f"{API}/tasks/fix-login/turns/1",
        json={"summary_md": "The login <script>alert(1)</script> bug & its fix."},
        headers=headers,
    )
    assert r.status_code == 200
    store = client.post("/v1/memory_stores", json={"name": "Team <b>prefs</b>"}, headers=headers)
    store_id = store.json["id"]
    r = client.post(
        f"/v1/memory_stores/{store_id}/memories",
        json={"path": "/bugs/<i>login</i>.md", "content": "Login bug: raise the TTL."},
        headers=headers,
    )
    assert r.status_code == 200
    return str(store_id)


def test_search_lists_turns_and_memories_with_links_and_highlights(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    store_id = _seed(client, tokens)
    memory_id = client.get(
        f"/v1/memory_stores/{store_id}/memories", headers=tokens.headers("reader")
    ).json["data"][0]["id"]
    page = console("reader").get(f"{WEB}/search?q=login+bug")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'href="{WEB}/tasks/fix-login/turns/1"' in html
    assert f'href="{WEB}/stores/{store_id}/memories/{memory_id}"' in html
    assert "Team &lt;b&gt;prefs&lt;/b&gt;" in html and "/bugs/&lt;i&gt;login&lt;/i&gt;.md" in html
    # The agent's markup is text; only our <mark> is markup.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert re.findall(r"<mark>([^<]*)</mark>", html).count("login") >= 1
    assert "\x02" not in html and "\x03" not in html
    # The box in the header keeps the query.
    assert 'name="q" type="search" value="login bug"' in html


def test_a_query_outside_the_syntax_is_explained_on_the_page(
    console: Callable[[str], Browser],
) -> None:
    page = console("reader").get(f"{WEB}/search?q=login+OR+bug")
    assert page.status_code == 200
    assert "OR is not an operator" in page.get_data(as_text=True)
    empty = console("reader").get(f"{WEB}/search")
    assert empty.status_code == 200 and "Nothing matches" not in empty.get_data(as_text=True)


def test_the_search_pages_with_the_cursor(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    for i in range(23):
        client.put(
            f"{API}/tasks/t{i:02d}/turns/0",
            json={"summary_md": "needle"},
            headers=tokens.headers("writer"),
        )
    browser = console("reader")
    first = browser.get(f"{WEB}/search?q=needle").get_data(as_text=True)
    assert first.count('class="hit hit-turn"') == 20
    next_url = re.search(r'<a href="([^"]+)" rel="next">', first)
    assert next_url
    second = browser.get(next_url.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert second.count('class="hit hit-turn"') == 3 and "First page" in second


def test_another_projects_text_is_not_found_from_the_console(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    _seed(client, tokens, who="other_project")
    html = console("reader").get(f"{WEB}/search?q=login").get_data(as_text=True)
    assert "Nothing matches" in html and "fix-login" not in html
    # Nor by naming the other project in the address.
    assert console("reader").get("/console/p/acme/mobile/search?q=login").status_code == 403


def test_snippet_escapes_first_then_marks() -> None:
    assert snippet("a \x02<b>\x03 & \x02x\x03") == "a <mark>&lt;b&gt;</mark> &amp; <mark>x</mark>"
    # Unpaired markers never become markup.
    assert snippet("\x02<i>") == "&lt;i&gt;" and snippet("x\x03\x02") == "x"


def _seed_meaning(app: Flask, client: FlaskClient, tokens: Tokens) -> None:
    for task, summary in [
        ("auth", "The session TTL expired and the login cookie was dropped."),
        ("ci", "The deploy pipeline caches npm packages between builds."),
    ]:
        r = client.put(
            f"{API}/tasks/{task}/turns/0",
            json={"summary_md": summary},
            headers=tokens.headers("writer"),
        )
        assert r.status_code == 200
    embedding = app.extensions["storage"].embedding
    deadline = time.monotonic() + 60
    while not embedding.idle():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("app_overrides", [{"EMBEDDER": "bundled"}])
def test_the_search_page_offers_each_mode_and_keeps_the_chosen_one(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    _seed_meaning(app, client, tokens)
    browser = console("reader")
    html = browser.get(f"{WEB}/search?q=authentication").get_data(as_text=True)
    # Hybrid, the default with an embedder: found by meaning, the choice shown checked.
    assert 'value="hybrid" checked' in html and f'href="{WEB}/tasks/auth/turns/0"' in html
    html = browser.get(f"{WEB}/search?q=authentication&mode=keyword").get_data(as_text=True)
    assert 'value="keyword" checked' in html and "Nothing matches" in html
    html = browser.get(f"{WEB}/search?q=authentication&mode=semantic").get_data(as_text=True)
    assert 'value="semantic" checked' in html and f'href="{WEB}/tasks/auth/turns/0"' in html
    assert "Keyword results only" not in html


def test_without_an_embedder_the_page_has_no_mode_choice(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    _seed(client, tokens)
    html = console("reader").get(f"{WEB}/search?q=login&mode=semantic").get_data(as_text=True)
    assert 'name="mode"' not in html and "fix-login" in html
    assert "Keyword results only" not in html  # the server's only mode: nothing fell back


class _Down:
    """An embedder that cannot answer (its server down)."""

    model = ModelId("test:down", 8)

    def embed(self, texts: object, *, kind: str) -> object:
        raise EmbedderUnavailable("connection refused")


@pytest.mark.parametrize("app_overrides", [{"EMBEDDER": "bundled"}])
def test_a_fallback_to_keywords_is_said_on_the_page(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    _seed(client, tokens)
    app.extensions["storage"].embedding.embedder = _Down()  # its server went down
    html = console("reader").get(f"{WEB}/search?q=login").get_data(as_text=True)
    assert 'role="status">Keyword results only: the embedder is unavailable' in html
    assert "fix-login" in html
