"""A console action happens only on a POST that passed the guard (Origin, Sec-Fetch-Site and
the session's CSRF token); any other request to any console route changes nothing.

The routes are walked from the url_map, so a new form cannot be forgotten: every method,
and every POST the guard must refuse, is sent to every console route with a signed-in
session of a token that may do everything, and what the project holds (tests/console/
state.py, through the storage interface, on every backend) must stay as it was.
"""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.names import Scope
from tests.conftest import Tokens

from .conftest import API, ORIGIN, Browser, put_turn, sign_in
from .state import project_state

pytestmark = pytest.mark.all_backends

SCOPE = Scope("acme", "web")
# Every method a client may send: Flask answers HEAD with a GET view, OPTIONS by itself.
METHODS = ("HEAD", "GET", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND")
REFUSED_POSTS = {
    "no CSRF field": ({}, {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"}, False),
    "another session's CSRF": ({}, {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"}, True),
    "cross-site": ({}, {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, None),
    "same-site, other port": ({}, {"Origin": "http://localhost:8000"}, None),
    "sibling subdomain": ({}, {"Sec-Fetch-Site": "same-site"}, None),
    "sandboxed frame": ({}, {"Origin": "null", "Sec-Fetch-Site": "cross-site"}, None),
}


@pytest.fixture
def ids(client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    """Real ids of acme/web's data, for every placeholder a console route may have."""
    h = tokens.headers("writer")
    put_turn(client, tokens, "t", summary="first")
    put_turn(client, tokens, "t", 1, summary="second")
    for turn in (0, 1):
        r = client.put(f"{API}/tasks/t/turns/{turn}/artifacts/a.txt", data=b"bytes", headers=h)
        assert r.status_code == 200
    sid = client.post("/v1/memory_stores", json={"name": "s"}, headers=h).get_json()["id"]
    mem = client.post(
        f"/v1/memory_stores/{sid}/memories", json={"path": "/n.md", "content": "one"}, headers=h
    ).get_json()
    old = mem["memory_version_id"]
    r = client.post(
        f"/v1/memory_stores/{sid}/memories/{mem['id']}", json={"content": "two"}, headers=h
    )
    assert r.status_code == 200
    victim = tokens.registry.create(role="reader", tenant="acme", project="web", name="victim")
    return {
        "tenant": "acme",
        "project": "web",
        "task_id": "t",
        "turn": "0",
        "name": "a.txt",
        "store_id": sid,
        "memory_id": mem["id"],
        "version_id": old,  # not the head: it may be redacted or restored
        "token_id": victim[0].id,
        "grant_id": "grt_01M90JVR6JF58RV0V8GWJ11G1F",  # no such grant
        "user_id": "usr_" + "0" * 32,  # no such user
        "rest": "nowhere",
    }


def console_rules(app: Flask) -> list[tuple[str, str, frozenset[str]]]:
    """(endpoint, rule, methods) of every console route, static files left out."""
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("console") and rule.endpoint != "console.static":
            found.append((rule.endpoint, rule.rule, frozenset(rule.methods or ())))
    assert len(found) >= 20
    return found


def url_of(rule: str, ids: dict[str, str]) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in ids, f"no id for <{name}>: add one to the ids fixture"
        return ids[name]

    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", fill, rule)


def test_every_action_route_takes_post_only(app: Flask) -> None:
    """A view that changes state never shares its route with GET (Flask would route HEAD to
    it): the confirmation, if any, is a view of its own."""
    for endpoint, rule, methods in console_rules(app):
        if "POST" in methods:
            assert methods - {"OPTIONS"} == {"POST"}, (endpoint, rule, sorted(methods))


def test_nothing_but_a_guarded_post_changes_anything(
    app: Flask, tokens: Tokens, ids: dict[str, str]
) -> None:
    browser = sign_in(app, tokens.secrets["admin"])
    other = sign_in(app, tokens.secrets["admin"])  # another session of the same token
    assert other.csrf != browser.csrf
    before = project_state(app, SCOPE)
    for endpoint, rule, methods in console_rules(app):
        url = url_of(rule, ids)
        for method in METHODS:
            r = browser.client.open(url, method=method)
            assert r.status_code < 500, (method, url, r.status_code)
        if "POST" in methods:
            for case, (data, headers, foreign_csrf) in REFUSED_POSTS.items():
                csrf = (
                    other.csrf if foreign_csrf else ("" if foreign_csrf is False else browser.csrf)
                )
                form = {"csrf": csrf, **data} if csrf else data
                r = browser.client.post(url, data=form, headers=headers)
                assert r.status_code == 403, (case, url, r.status_code)
        assert project_state(app, SCOPE) == before, f"{endpoint} ({url}) changed state"
    # The session still works: nothing above signed it out either.
    assert browser.get("/console/p/acme/web/tasks").status_code == 200


def test_the_walk_sees_a_change_when_one_happens(
    app: Flask, tokens: Tokens, ids: dict[str, str]
) -> None:
    """The comparison above can fail: the guarded POST of a delete changes the state."""
    browser: Browser = sign_in(app, tokens.secrets["admin"])
    before = project_state(app, SCOPE)
    r = browser.post("/console/p/acme/web/tasks/t/delete")
    assert r.status_code == 303
    assert project_state(app, SCOPE) != before
