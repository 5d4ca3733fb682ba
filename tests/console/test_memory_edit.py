"""Memories and stores changed from the console: create, edit with the content_sha256
precondition (a conflict shows both versions and loses neither), rename, delete, restore an
old version; create, archive and delete a store. Each is a guarded POST with the API's roles,
and each leaves what the memory-stores API then reads. On every backend."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens

from .conftest import Browser, hidden, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
STORES = "/v1/memory_stores"


def textarea(page: str, name: str = "content") -> str:
    found = re.search(rf'<textarea[^>]* name="{name}"[^>]*>\n?(.*?)</textarea>', page, re.S)
    assert found, f"no textarea {name}"
    return html.unescape(found.group(1))


def api(client: FlaskClient, tokens: Tokens, method: str, url: str, **kw: Any) -> Any:
    r = client.open(url, method=method, headers=tokens.headers("writer"), **kw)
    assert r.status_code < 300, (url, r.status_code, r.get_json())
    return r.get_json()


@pytest.fixture
def store(client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    sid = api(client, tokens, "POST", STORES, json={"name": "Prefs"})["id"]
    mem = api(
        client,
        tokens,
        "POST",
        f"{STORES}/{sid}/memories",
        json={"path": "/a.md", "content": "v1\n"},
    )
    return {"sid": sid, "mid": mem["id"], "v1": mem["memory_version_id"]}


def read(client: FlaskClient, tokens: Tokens, store: dict[str, str]) -> Any:
    return api(client, tokens, "GET", f"{STORES}/{store['sid']}/memories/{store['mid']}")


def test_create_a_memory_and_a_store(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("writer")
    assert browser.get(f"{WEB}/stores/new").status_code == 200
    done = browser.post(f"{WEB}/stores/new", {"name": "Team notes", "description": "what we do"})
    assert done.status_code == 303
    sid = done.headers["Location"].rsplit("/", 1)[-1]
    (found,) = api(client, tokens, "GET", STORES)["data"]
    assert (found["id"], found["name"], found["description"]) == (sid, "Team notes", "what we do")
    form = text(browser.get(f"{WEB}/stores/{sid}/memories/new?path=/docs/"))
    assert hidden(form, "path") == "/docs/" or 'value="/docs/"' in form
    # A browser sends a textarea's line ends as CRLF; a memory keeps the LF it was shown.
    done = browser.post(
        f"{WEB}/stores/{sid}/memories/new", {"path": "/docs/x.md", "content": "one\r\ntwo\r\n"}
    )
    assert done.status_code == 303
    mid = done.headers["Location"].rsplit("/", 1)[-1]
    memory = api(client, tokens, "GET", f"{STORES}/{sid}/memories/{mid}")
    assert (memory["path"], memory["content"]) == ("/docs/x.md", "one\ntwo\n")
    # A refused value is explained on the form, with what was typed kept.
    again = browser.post(
        f"{WEB}/stores/{sid}/memories/new", {"path": "no-slash", "content": "kept"}
    )
    assert again.status_code == 422
    assert "must start with" in text(again) and textarea(text(again)) == "kept"


def test_an_edit_with_a_conflict_in_between_shows_both_and_loses_nothing(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store: dict[str, str]
) -> None:
    browser = console("writer")
    url = f"{WEB}/stores/{store['sid']}/memories/{store['mid']}/edit"
    form = text(browser.get(url))
    assert textarea(form) == "v1\n"
    shown_sha = hidden(form, "content_sha256")
    assert shown_sha == read(client, tokens, store)["content_sha256"]
    # Someone else saves first.
    api(
        client,
        tokens,
        "POST",
        f"{STORES}/{store['sid']}/memories/{store['mid']}",
        json={"content": "theirs\n"},
    )
    conflict = browser.post(url, {"content": "mine\n", "content_sha256": shown_sha})
    assert conflict.status_code == 409
    page = text(conflict)
    assert textarea(page) == "mine\n"  # what was typed, still in the form
    assert "theirs" in page  # what was saved meanwhile, shown beside it
    assert hidden(page, "content_sha256") == read(client, tokens, store)["content_sha256"]
    assert read(client, tokens, store)["content"] == "theirs\n"
    # Saving again, having seen theirs, keeps both in the history.
    done = browser.post(
        url, {"content": "mine\n", "content_sha256": hidden(page, "content_sha256")}
    )
    assert done.status_code == 303
    assert read(client, tokens, store)["content"] == "mine\n"
    versions = api(
        client,
        tokens,
        "GET",
        f"{STORES}/{store['sid']}/memory_versions?memory_id={store['mid']}&view=full",
    )["data"]
    assert [v.get("content") for v in versions] == ["mine\n", "theirs\n", "v1\n"]


def test_hostile_content_stays_text_in_the_editor(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store: dict[str, str]
) -> None:
    nasty = "\n</textarea><script>alert(1)</script><textarea>\n"
    api(
        client,
        tokens,
        "POST",
        f"{STORES}/{store['sid']}/memories/{store['mid']}",
        json={"content": nasty},
    )
    browser = console("writer")
    url = f"{WEB}/stores/{store['sid']}/memories/{store['mid']}/edit"
    page = text(browser.get(url))
    assert "<script>alert" not in page
    assert textarea(page) == nasty  # the leading newline too
    sha = hidden(page, "content_sha256")
    assert browser.post(url, {"content": textarea(page), "content_sha256": sha}).status_code == 303
    assert read(client, tokens, store)["content"] == nasty


def test_rename_delete_and_restore(
    app: Flask,
    client: FlaskClient,
    tokens: Tokens,
    console: Callable[[str], Browser],
    store: dict[str, str],
) -> None:
    browser = console("writer")
    base = f"{WEB}/stores/{store['sid']}/memories/{store['mid']}"
    sha = read(client, tokens, store)["content_sha256"]
    assert browser.get(f"{base}/rename").status_code == 200
    assert (
        browser.post(f"{base}/rename", {"path": "/b/a.md", "content_sha256": sha}).status_code
        == 303
    )
    assert read(client, tokens, store)["path"] == "/b/a.md"
    api(
        client,
        tokens,
        "POST",
        f"{STORES}/{store['sid']}/memories",
        json={"path": "/taken.md", "content": "t"},
    )
    taken = browser.post(f"{base}/rename", {"path": "/taken.md", "content_sha256": sha})
    assert taken.status_code == 409 and read(client, tokens, store)["path"] == "/b/a.md"

    # Restore: the old version's content is written back as a new version.
    edit = f"{base}/edit"
    sha = hidden(text(browser.get(edit)), "content_sha256")
    assert browser.post(edit, {"content": "v2\n", "content_sha256": sha}).status_code == 303
    restore = f"{WEB}/stores/{store['sid']}/versions/{store['v1']}/restore"
    confirm = text(browser.get(restore))
    done = browser.post(restore, {"content_sha256": hidden(confirm, "content_sha256")})
    assert done.status_code == 303
    assert read(client, tokens, store)["content"] == "v1\n"

    # Delete, with the precondition; then a restore brings the memory back at its path.
    sha = read(client, tokens, store)["content_sha256"]
    assert browser.get(f"{base}/delete").status_code == 200
    stale = browser.post(f"{base}/delete", {"content_sha256": "0" * 64})
    assert stale.status_code in (409, 412)
    assert browser.post(f"{base}/delete", {"content_sha256": sha}).status_code == 303
    gone = client.get(
        f"{STORES}/{store['sid']}/memories/{store['mid']}", headers=tokens.headers("writer")
    )
    assert gone.status_code == 404
    confirm = text(browser.get(restore))
    assert (
        browser.post(restore, {"content_sha256": hidden(confirm, "content_sha256")}).status_code
        == 303
    )
    (back,) = [
        m
        for m in api(client, tokens, "GET", f"{STORES}/{store['sid']}/memories?view=full")["data"]
        if m.get("path") == "/a.md"
    ]
    assert back["content"] == "v1\n"

    # The audit log tells a rename and a restore from an edit; a refused change leaves none.
    events = app.extensions["storage"].audit_log.page(Scope("acme", "web")).events
    assert [(e.kind, e.action, e.actor) for e in events[:6]] == [
        ("memory", action, tokens.ids["writer"])
        for action in ("restored", "deleted", "restored", "modified", "created", "renamed")
    ]
    assert events[0].subject == back["id"] and events[0].detail["path"] == "/a.md"


def test_archive_and_delete_a_store_follow_the_api_roles(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store: dict[str, str]
) -> None:
    sid = store["sid"]
    for who, status in (("reader", 403), ("writer2", 403)):
        assert console(who).post(f"{WEB}/stores/{sid}/archive").status_code == status
    assert console("writer").get(f"{WEB}/stores/{sid}/archive").status_code == 200
    assert console("writer").post(f"{WEB}/stores/{sid}/archive").status_code == 303
    assert api(client, tokens, "GET", f"{STORES}/{sid}")["archived_at"]
    # An archived store refuses edits, and the page says so.
    browser = console("project_admin")
    edit = f"{WEB}/stores/{sid}/memories/{store['mid']}/edit"
    sha = read(client, tokens, store)["content_sha256"]
    assert browser.post(edit, {"content": "x", "content_sha256": sha}).status_code == 409
    assert browser.get(f"{WEB}/stores/{sid}/delete").status_code == 200
    assert browser.post(f"{WEB}/stores/{sid}/delete").status_code == 303
    gone = client.get(f"{STORES}/{sid}", headers=tokens.headers("writer"))
    assert gone.status_code == 404


def test_an_edit_holding_a_secret_is_masked_or_refused_by_the_project_policy(
    client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser], store: dict[str, str]
) -> None:
    from tests.secrets_corpus import corpus

    planted = corpus(seed=5)
    secret = next(p for p in planted if p.kind == "github-token")
    browser = console("writer")
    edit = f"{WEB}/stores/{store['sid']}/memories/{store['mid']}/edit"
    sha = hidden(text(browser.get(edit)), "content_sha256")
    pasted = "\n".join(p.text for p in planted) + "\n"
    saved = browser.post(edit, {"content": pasted, "content_sha256": sha})
    assert saved.status_code == 303
    content = read(client, tokens, store)["content"]
    assert "[secret:github-token]" in content
    for p in planted:
        assert p.value not in content, p
    r = client.put(
        "/sandbox/memory/v1/secrets/policy",
        json={"policy": "reject"},
        headers=tokens.headers("project_admin"),
    )
    assert r.status_code == 200
    sha = hidden(text(browser.get(edit)), "content_sha256")
    refused = browser.post(edit, {"content": f"again {secret.text}\n", "content_sha256": sha})
    assert refused.status_code == 422
    page = text(refused)
    assert "refuses them" in page and "github-token" in page
    assert read(client, tokens, store)["content"] == content  # nothing was saved
