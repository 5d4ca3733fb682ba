"""Who reaches which console page: walked from the url_map, so no route is forgotten.

With real ids of tenant acme / project web's data: no session, a session of another tenant or
project, a reader posting, a revoked or expired token, and an API credential instead of a
session each get the documented refusal, and no refused answer carries acme/web's data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.console import PUBLIC_ENDPOINTS
from app.storage.core.names import Scope
from tests.conftest import FixedClock, Tokens

from .conftest import API, Browser, csrf_of, put_turn, sign_in

SECRET = "SECRET-OF-ACME-WEB"
# Pages that name tokens or show limits: project_admins and above (tenant_admins for a
# tenant's own).
ADMIN_PAGES = frozenset(
    {
        "console.audit",
        "console.tokens",
        "console.limits",
        "console.tenant_tokens",
        "console.tenant_limits",
        "console.secrets_page",
        "console.users",
    }
)


@pytest.fixture
def ids(client: FlaskClient, tokens: Tokens) -> dict[str, str]:
    h = tokens.headers("writer")
    put_turn(client, tokens, "t", summary=SECRET)
    r = client.put(f"{API}/tasks/t/turns/0/artifacts/a.txt", data=SECRET, headers=h)
    assert r.status_code == 200
    sid = client.post("/v1/memory_stores", json={"name": SECRET}, headers=h).get_json()["id"]
    mem = client.post(
        f"/v1/memory_stores/{sid}/memories", json={"path": "/n.md", "content": SECRET}, headers=h
    ).get_json()
    victim, _ = tokens.registry.create(role="reader", tenant="acme", project="web")
    return {
        "token_id": victim.id,
        "tenant": "acme",
        "project": "web",
        "task_id": "t",
        "turn": "0",
        "name": "a.txt",
        "store_id": sid,
        "memory_id": mem["id"],
        "version_id": mem["memory_version_id"],
        "grant_id": "grt_01M90JVR6JF58RV0V8GWJ11G1F",  # no such grant
        "user_id": "usr_" + "0" * 32,  # no such user
        "rest": "nowhere",
    }


def console_routes(
    app: Flask, ids: dict[str, str], *, signout: bool = True
) -> list[tuple[str, str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("console") or rule.endpoint in PUBLIC_ENDPOINTS:
            continue
        if rule.endpoint == "console.signout" and not signout:
            continue  # it would end the session the walk goes on with
        url = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: ids[m.group(1)], rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            routes.append((method, url, rule.endpoint))
    assert len(routes) >= 20
    return routes


def _send(browser: Browser, method: str, url: str) -> tuple[int, bytes]:
    r = browser.get(url) if method == "GET" else browser.post(url)
    return r.status_code, r.get_data()


def _to_signin(response_location: str | None) -> bool:
    return response_location is not None and urlsplit(response_location).path == "/console/signin"


def test_without_a_session_every_page_sends_to_sign_in(
    app: Flask, ids: dict[str, str], tokens: Tokens
) -> None:
    client = app.test_client()
    for method, url, _ in console_routes(app, ids):
        for headers in ({}, tokens.headers("admin"), {"x-api-key": tokens.secrets["admin"]}):
            r = client.open(url, method=method, headers=headers)
            assert r.status_code == 303 and _to_signin(r.headers.get("Location")), (method, url)
            assert SECRET.encode() not in r.data


def test_a_page_asked_for_comes_back_after_sign_in(app: Flask, tokens: Tokens) -> None:
    browser = Browser(app.test_client())
    first = browser.get("/console/p/acme/web/tasks?q=t")
    assert first.headers["Location"] == "/console/signin?next=/console/p/acme/web/tasks?q%3Dt"
    page = browser.get(first.headers["Location"])
    browser.csrf = csrf_of(page)
    assert 'name="next" value="/console/p/acme/web/tasks?q=t"' in page.get_data(as_text=True)
    done = browser.post(
        "/console/signin", {"token": tokens.secrets["reader"], "next": "/console/p/acme/web/tasks"}
    )
    assert done.headers["Location"] == "/console/p/acme/web/tasks"


@pytest.mark.parametrize("who", ["other_tenant", "other_project"])
def test_a_token_of_another_scope_never_sees_acme_web(
    app: Flask, ids: dict[str, str], console: Callable[[str], Browser], who: str
) -> None:
    browser = console(who)
    for method, url, _ in console_routes(app, ids, signout=False):
        status, body = _send(browser, method, url)
        assert SECRET.encode() not in body, (who, method, url)
        if "/p/acme/web/" in url:
            assert status == 403, (who, method, url, status)


def test_a_reader_reads_everything_and_changes_nothing(
    app: Flask, ids: dict[str, str], console: Callable[[str], Browser]
) -> None:
    browser = console("reader")
    routes = console_routes(app, ids, signout=False)
    # The form or confirmation page of an action shares its URL with the action's POST.
    forms = {url for method, url, _ in routes if method == "POST"}
    for method, url, endpoint in routes:
        status, _ = _send(browser, method, url)
        if endpoint.startswith("console.oauth_authorize"):
            assert status == 400, (method, url, status)  # names no client: nothing granted
        elif method == "POST":
            assert status == 403, (method, url, status)
        elif url in forms or endpoint in ADMIN_PAGES:
            assert status == 403, (url, status)  # not even the confirmation page
        elif endpoint == "console.missing":
            assert status == 404
        elif endpoint == "console.diff":
            assert status == 400  # no versions chosen (a and b)
        elif method == "GET":
            assert status in (200, 303), (url, status)
    store = app.extensions["storage"].tasks
    assert store.get_task(Scope("acme", "web"), "t").turn_count == 1


def test_a_revoked_or_expired_token_ends_the_session_at_the_next_request(
    app: Flask, tokens: Tokens, clock: FixedClock, ids: dict[str, str]
) -> None:
    tokens.add("short", role="reader", tenant="acme", project="web", expires_in=timedelta(hours=1))
    browser = sign_in(app, tokens.secrets["writer"])
    short = sign_in(app, tokens.secrets["short"])
    assert browser.get("/console/p/acme/web/tasks/t").status_code == 200
    tokens.registry.revoke(tokens.ids["writer"])
    r = browser.get("/console/p/acme/web/tasks/t")
    assert r.status_code == 303 and "ended=1" in r.headers["Location"]
    assert "pm_console=;" in r.headers["Set-Cookie"]  # the cookie is dropped too
    assert short.get("/console/p/acme/web/tasks").status_code == 200
    clock.advance(hours=2)
    r = short.get("/console/p/acme/web/tasks")
    assert r.status_code == 303 and _to_signin(r.headers["Location"])


def test_the_session_expires_after_the_configured_hours(
    app: Flask, tokens: Tokens, clock: FixedClock
) -> None:
    browser = sign_in(app, tokens.secrets["reader"])
    clock.advance(hours=app.config["CONSOLE_SESSION_HOURS"] - 0.1)
    assert browser.get("/console/p/acme/web/tasks").status_code == 200
    clock.advance(hours=0.2)
    r = browser.get("/console/p/acme/web/tasks")
    assert r.status_code == 303 and _to_signin(r.headers["Location"])


def test_a_wrong_token_is_refused_and_names_no_reason_beyond_that(
    app: Flask, tokens: Tokens
) -> None:
    browser = Browser(app.test_client())
    browser.csrf = csrf_of(browser.get("/console/signin"))
    tokens.registry.revoke(tokens.ids["reader"])
    for wrong in ("pm_nope", tokens.secrets["reader"], "", "x" * 600):
        r = browser.post("/console/signin", {"token": wrong})
        assert r.status_code == 403
        assert "not valid" in r.get_data(as_text=True)
        browser.csrf = csrf_of(r)
    assert browser.get("/console/p/acme/web/tasks").status_code == 303


def test_projects_menu_lists_what_the_token_covers_and_skips_symlinks(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    for who, headers in (
        ("writer", {}),
        ("tenant_admin", {"X-Sandbox-Project-Id": "mobile"}),
        ("admin", {"X-Sandbox-Tenant-Id": "globex", "X-Sandbox-Project-Id": "web"}),
    ):
        r = client.put(
            f"{API}/tasks/x/turns/0",
            json={"summary_md": "s"},
            headers=tokens.headers(who, **headers),
        )
        assert r.status_code == 200
    root = app.extensions["storage"].tasks.layout.root
    (root / "acme" / "linked").symlink_to(root / "acme" / "web")
    (root / "evil").symlink_to(root / "globex")

    def listed(who: str) -> list[str]:
        page = console(who).get("/console/projects").get_data(as_text=True)
        return re.findall(r'href="/console/p/([^/"]+/[^/"]+)/tasks"', page)

    assert listed("tenant_admin") == ["acme/mobile", "acme/web"]
    assert listed("admin") == ["acme/mobile", "acme/web", "globex/web"]
    # A token bound to one project goes straight to it.
    assert console("writer").get("/console/").headers["Location"] == "/console/p/acme/web/tasks"
    assert console("tenant_admin").get("/console/").headers["Location"] == "/console/projects"
    assert console("tenant_admin").get("/console/p/acme/mobile/tasks").status_code == 200
    assert console("tenant_admin").get("/console/p/globex/web/tasks").status_code == 403
    assert console("admin").get("/console/p/globex/web/tasks").status_code == 200


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/console/",
        "/\\evil.example/",
        "/sandbox/memory/v1/tasks",
        "/console/\nSet-Cookie: x=1",
        "/console/ /x",
        "javascript:alert(1)",
        "",
    ],
)
def test_sign_in_returns_only_to_console_pages(app: Flask, tokens: Tokens, target: str) -> None:
    browser = Browser(app.test_client())
    browser.csrf = csrf_of(browser.get("/console/signin"))
    done = browser.post("/console/signin", {"token": tokens.secrets["reader"], "next": target})
    assert done.status_code == 303 and done.headers["Location"] == "/console/"
