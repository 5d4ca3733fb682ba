"""A signed-in browser for the Flask test client: ``console("writer")`` signs that token in."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.conftest import BufferedClient, Tokens

ORIGIN = "http://localhost"  # the test client's host
SAME_SITE = {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"}
API = "/sandbox/memory/v1"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def text(r: TestResponse) -> str:
    return r.get_data(as_text=True)


def hidden(page: str, name: str) -> str:
    """The value of the hidden (or any) input ``name`` of a page."""
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no field {name}"
    return html.unescape(found.group(1))


def link(page: str, rel: str) -> str | None:
    """The address of the page's ``rel`` link (next, prev), as a browser follows it."""
    found = re.search(rf'href="([^"]+)" rel="{rel}"', page)
    return found.group(1).replace("&amp;", "&") if found else None


def csrf_of(page: TestResponse) -> str:
    found = _CSRF.search(page.get_data(as_text=True))
    assert found, "the page has no CSRF field"
    return found.group(1)


@dataclass
class Browser:
    client: FlaskClient
    csrf: str = ""

    def get(self, url: str, **kwargs: Any) -> TestResponse:
        return self.client.get(url, **kwargs)

    def post(
        self, url: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> TestResponse:
        form = {"csrf": self.csrf, **(data or {})}
        return self.client.post(url, data=form, headers={**SAME_SITE, **(headers or {})})


def sign_in(app: Flask, secret: str) -> Browser:
    app.test_client_class = BufferedClient
    browser = Browser(app.test_client())
    form = browser.get("/console/signin")
    assert form.status_code == 200
    browser.csrf = csrf_of(form)
    done = browser.post("/console/signin", {"token": secret})
    assert done.status_code == 303, done.get_data(as_text=True)
    # Signing in issues a fresh CSRF token with the session.
    browser.csrf = csrf_of(browser.get("/console/projects"))
    return browser


@pytest.fixture
def console(app: Flask, tokens: Tokens) -> Callable[[str], Browser]:
    return lambda who: sign_in(app, tokens.secrets[who])


def put_turn(
    client: FlaskClient,
    tokens: Tokens,
    task: str,
    turn: int = 0,
    *,
    meta: dict[str, Any] | None = None,
    summary: str = "summary",
    who: str = "writer",
) -> None:
    r = client.put(
        f"{API}/tasks/{task}/turns/{turn}",
        json={"meta": meta or {}, "summary_md": summary},
        headers=tokens.headers(who),
    )
    assert r.status_code == 200, r.get_json()
