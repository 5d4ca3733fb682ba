"""The audit view of a project: who created, changed, redacted or deleted what, and when.

Events recorded by the APIs and the console as they act: task and memory changes through
the APIs, console sign-ins, token changes, redactions and deletions through the console.
Newest first, filtered by actor and kind, paged both ways; project_admins and above only.
On every backend.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from tests.conftest import FixedClock, Tokens

from .conftest import API, Browser, link, put_turn, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
STORES = "/v1/memory_stores"
_ROW = re.compile(r'<tr data-kind="([a-z_]+)" data-action="([a-z_]+)" data-actor="([^"]*)"')


def rows(page: str) -> list[tuple[str, str, str]]:
    return _ROW.findall(page)


@pytest.fixture
def history(
    client: FlaskClient, tokens: Tokens, clock: FixedClock, console: Callable[[str], Browser]
) -> list[tuple[str, str, str]]:
    """A day of work, one second apart; the events it leaves, newest first."""
    ids = tokens.ids
    done: list[tuple[str, str, str]] = []

    def tick() -> None:
        clock.advance(seconds=1)

    put_turn(client, tokens, "t", who="writer")
    done.append(("task", "created", ids["writer"]))
    tick()
    w, w2 = tokens.headers("writer"), tokens.headers("writer2")
    sid = client.post(STORES, json={"name": "s"}, headers=w).get_json()["id"]
    done.append(("store", "created", ids["writer"]))
    tick()
    mem = client.post(f"{STORES}/{sid}/memories", json={"path": "/a", "content": "1"}, headers=w)
    first = mem.get_json()["memory_version_id"]
    done.append(("memory", "created", ids["writer"]))
    tick()
    r = client.post(
        f"{STORES}/{sid}/memories/{mem.get_json()['id']}", json={"content": "2"}, headers=w2
    )
    assert r.status_code == 200
    done.append(("memory", "modified", ids["writer2"]))
    tick()
    admin = console("project_admin")
    done.append(("session", "signed_in", ids["project_admin"]))
    tick()
    assert admin.post(f"{WEB}/stores/{sid}/versions/{first}/redact").status_code == 303
    done.append(("memory", "redacted", ids["project_admin"]))
    tick()
    made = text(admin.post(f"{WEB}/tokens/new", {"role": "reader", "name": "temp"}))
    (temp,) = set(re.findall(r"tok_[0-9A-Z]{26}", made)) - set(ids.values())
    done.append(("token", "created", ids["project_admin"]))
    tick()
    assert admin.post(f"{WEB}/tokens/{temp}/revoke").status_code == 303
    done.append(("token", "revoked", ids["project_admin"]))
    tick()
    assert admin.post(f"{WEB}/tasks/t/delete").status_code == 303
    done.append(("task", "deleted", ids["project_admin"]))
    tick()
    r = client.delete(f"{API}/tasks/nope", headers=w)  # refused: leaves no event
    assert r.status_code == 404
    return done[::-1]


def test_the_audit_view_lists_who_did_what_newest_first(
    history: list[tuple[str, str, str]], console: Callable[[str], Browser]
) -> None:
    page = text(console("project_admin").get(f"{WEB}/audit?per_page=100"))
    # This browser's own sign-in comes after the history: it is the newest event.
    assert rows(page)[0][:2] == ("session", "signed_in")
    assert rows(page)[1:] == history


def test_filter_by_actor_and_by_kind(
    history: list[tuple[str, str, str]], tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("project_admin")
    by_writer2 = rows(text(browser.get(f"{WEB}/audit?actor={tokens.ids['writer2']}")))
    assert by_writer2 == [("memory", "modified", tokens.ids["writer2"])]
    tokens_only = rows(text(browser.get(f"{WEB}/audit?kind=token")))
    assert [r[:2] for r in tokens_only] == [("token", "revoked"), ("token", "created")]
    # A filter nothing matches is an empty page, not an error; a kind that does not exist too.
    assert rows(text(browser.get(f"{WEB}/audit?actor=tok_nobody"))) == []
    assert browser.get(f"{WEB}/audit?kind=<script>").status_code == 200


def test_the_audit_view_pages_both_ways(
    history: list[tuple[str, str, str]], console: Callable[[str], Browser]
) -> None:
    browser = console("project_admin")
    seen, url, pages = [], f"{WEB}/audit?per_page=3", []
    while url:
        page = text(browser.get(url))
        pages.append(page)
        seen += rows(page)
        url = link(page, "next") or ""
    # The sign-in of this browser came after the history: it is the newest event.
    assert seen[0][:2] == ("session", "signed_in") and seen[1:] == history
    back = text(browser.get(link(pages[-1], "prev") or ""))
    assert rows(back) == rows(pages[-2])


def test_only_project_admins_and_above_see_it(
    history: list[tuple[str, str, str]], console: Callable[[str], Browser]
) -> None:
    for who, status in (("reader", 403), ("writer", 403), ("tenant_admin", 200), ("admin", 200)):
        assert console(who).get(f"{WEB}/audit").status_code == status, who
