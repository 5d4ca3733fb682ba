"""Tokens, quotas and rate limits from the console.

A project_admin manages its project's tokens (roles up to its own), a tenant_admin every
token of its tenant; a new secret is shown once, on an answer no cache keeps; a revoked token
is refused at its next request. Quotas and rate limits are seen by project_admins and set
where the CLI sets them: a project's by a tenant_admin, a tenant's by an admin; they are the
same document the CLI reads and writes. On every backend.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import Tokens

from .conftest import API, Browser, text

pytestmark = pytest.mark.all_backends

WEB = "/console/p/acme/web"
TENANT = "/console/t/acme"
_SECRET = re.compile(r"pm_[A-Za-z0-9_-]{20,}")


def token_ids(page: str) -> set[str]:
    return set(re.findall(r"tok_[0-9A-Z]{26}", page))


def test_a_project_admin_lists_its_projects_tokens_and_no_secret(
    tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    page = text(console("project_admin").get(f"{WEB}/tokens"))
    mine = {tokens.ids[w] for w in ("reader", "writer", "writer2", "project_admin")}
    assert mine <= token_ids(page)
    assert not token_ids(page) & {tokens.ids["other_project"], tokens.ids["other_tenant"]}
    assert not _SECRET.search(page) and "sha256" not in page
    for who in ("reader", "writer"):
        assert console(who).get(f"{WEB}/tokens").status_code == 403
    assert console("project_admin").get(f"{TENANT}/tokens").status_code == 403
    assert console("other_project").get(f"{WEB}/tokens").status_code == 403


def test_create_shows_the_secret_once_uncached_and_revoke_ends_it_at_once(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("project_admin")
    assert browser.get(f"{WEB}/tokens/new").status_code == 200
    made = browser.post(
        f"{WEB}/tokens/new", {"role": "writer", "name": "ci bot", "expires_in_days": "30"}
    )
    assert made.status_code == 200
    assert "no-store" in made.headers["Cache-Control"]
    secrets = _SECRET.findall(text(made))
    assert len(set(secrets)) == 1
    secret = secrets[0]
    (token_id,) = token_ids(text(made)) - set(tokens.ids.values())
    found = app.extensions["token_registry"].get(token_id)
    assert (found.role, found.tenant, found.project, found.name) == (
        "writer",
        "acme",
        "web",
        "ci bot",
    )
    assert found.expires_at is not None
    bearer = {"Authorization": f"Bearer {secret}"}
    assert client.get(f"{API}/tasks", headers=bearer).status_code == 200
    # The list shows the new token, never its secret again.
    listing = text(browser.get(f"{WEB}/tokens"))
    assert token_id in listing and secret not in listing

    assert browser.get(f"{WEB}/tokens/{token_id}/revoke").status_code == 200
    assert browser.post(f"{WEB}/tokens/{token_id}/revoke").status_code == 303
    assert client.get(f"{API}/tasks", headers=bearer).status_code == 401


@pytest.mark.parametrize(
    "form, status",
    [
        ({"role": "tenant_admin"}, 403),  # above the creator's own role
        ({"role": "admin"}, 403),
        ({"role": "boss"}, 422),
        ({"role": "reader", "expires_in_days": "-1"}, 422),
        ({"role": "reader", "expires_in_days": "soon"}, 422),
        ({"role": "reader", "project": "mobile"}, 403),  # another project
    ],
)
def test_a_project_admin_cannot_make_more_than_itself(
    app: Flask, console: Callable[[str], Browser], form: dict[str, str], status: int
) -> None:
    before = len(app.extensions["token_registry"].all())
    r = console("project_admin").post(f"{WEB}/tokens/new", form)
    assert r.status_code == status
    assert not _SECRET.search(text(r))
    assert len(app.extensions["token_registry"].all()) == before


def test_a_project_admin_revokes_only_its_projects_tokens(
    app: Flask, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("project_admin")
    for who in ("other_project", "tenant_admin", "other_tenant"):
        r = browser.post(f"{WEB}/tokens/{tokens.ids[who]}/revoke")
        assert r.status_code in (403, 404), who
        assert app.extensions["token_registry"].get(tokens.ids[who]).revoked_at is None


def test_a_tenant_admin_manages_the_whole_tenant(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    browser = console("tenant_admin")
    page = text(browser.get(f"{TENANT}/tokens"))
    assert {
        tokens.ids["other_project"],
        tokens.ids["writer"],
        tokens.ids["tenant_admin"],
    } <= token_ids(page)
    assert tokens.ids["other_tenant"] not in page
    made = browser.post(f"{TENANT}/tokens/new", {"role": "project_admin", "project": "mobile"})
    assert made.status_code == 200
    (token_id,) = token_ids(text(made)) - set(tokens.ids.values())
    found = app.extensions["token_registry"].get(token_id)
    assert (found.role, found.tenant, found.project) == ("project_admin", "acme", "mobile")
    bad = browser.post(f"{TENANT}/tokens/new", {"role": "reader", "project": "no such/id"})
    assert bad.status_code == 422 and "project" in text(bad)
    tenant_wide = browser.post(f"{TENANT}/tokens/new", {"role": "reader", "project": ""})
    (wide_id,) = token_ids(text(tenant_wide)) - set(tokens.ids.values()) - {token_id}
    assert app.extensions["token_registry"].get(wide_id).project is None
    assert browser.post(f"{TENANT}/tokens/{tokens.ids['other_project']}/revoke").status_code == 303
    headers = tokens.headers("other_project")
    assert client.get(f"{API}/tasks", headers=headers).status_code == 401
    assert console("tenant_admin").get("/console/t/globex/tokens").status_code == 403


def test_limits_are_seen_by_project_admins_and_set_where_the_cli_sets_them(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    page = console("project_admin").get(f"{WEB}/limits")
    assert page.status_code == 200 and "no quota" in text(page).lower()
    assert console("reader").get(f"{WEB}/limits").status_code == 403
    refused = console("project_admin").post(f"{WEB}/limits/quota", {"bytes": "1GiB"})
    assert refused.status_code == 403

    # A tenant_admin bounds a project of its tenant; the API refuses a write past it (507).
    admin = console("tenant_admin")
    assert admin.post(f"{WEB}/limits/quota", {"bytes": "1KiB", "tasks": "5"}).status_code == 303
    quotas = app.extensions["storage"].limits().quotas()
    bound = quotas.projects[("acme", "web")]
    assert (bound.bytes, bound.tasks) == (1024, 5)
    w = tokens.headers("writer")
    r = client.put(f"{API}/tasks/big/turns/0", json={"summary_md": "x" * 2000}, headers=w)
    assert r.status_code == 507
    assert "1 KiB" in text(console("project_admin").get(f"{WEB}/limits")).replace(
        "1.0 KiB", "1 KiB"
    )
    bad = admin.post(f"{WEB}/limits/quota", {"bytes": "lots"})
    assert bad.status_code == 422
    assert admin.post(f"{WEB}/limits/quota", {"clear": "1"}).status_code == 303
    assert ("acme", "web") not in app.extensions["storage"].limits().quotas().projects
    assert (
        client.put(
            f"{API}/tasks/big/turns/0", json={"summary_md": "x" * 2000}, headers=w
        ).status_code
        == 200
    )

    # Rate limits of the project, by the same hand; the tenant's own entry needs an admin.
    assert admin.post(f"{WEB}/limits/rate", {"rps": "5", "burst": "10"}).status_code == 303
    rate = app.extensions["storage"].limits().rates().projects[("acme", "web")]
    assert (rate.rps, rate.burst) == (5, 10)
    assert admin.post(f"{TENANT}/limits/quota", {"bytes": "1TiB"}).status_code == 403
    root = console("admin")
    assert root.get(f"{TENANT}/limits").status_code == 200
    assert root.post(f"{TENANT}/limits/quota", {"bytes": "2GiB"}).status_code == 303
    assert root.post(f"{TENANT}/limits/rate", {"rps": "50"}).status_code == 303
    limits = app.extensions["storage"].limits()
    assert limits.quotas().tenants["acme"].bytes == 2 << 30
    assert limits.rates().tenants["acme"].rps == 50


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"rps": "1e-320"}, "refill within 86,400 s"),
        ({"rps": "1e-300"}, "refill within 86,400 s"),
        ({"rps": "0.001", "burst": "1000"}, "to refill"),
        ({"rps": "5000000"}, "rps must be at most 1,000,000"),
        ({"rps": "5", "burst": "9999999"}, "burst must be at most 1,000,000"),
        ({"upload_bps": str(2 << 40)}, "upload_bps must be at most"),
    ],
)
def test_a_rate_out_of_range_is_a_form_error_and_nothing_is_written(
    app: Flask, console: Callable[[str], Browser], form: dict[str, str], message: str
) -> None:
    admin = console("tenant_admin")
    refused = admin.post(f"{WEB}/limits/rate", form)
    assert refused.status_code == 422 and message in text(refused), text(refused)[-2000:]
    assert 'name="rps"' in text(refused)  # the form, shown again with its error
    assert app.extensions["storage"].limits().rates().projects == {}


def test_the_limits_page_stays_reachable_to_whoever_may_clear_it(
    app: Flask, client: FlaskClient, tokens: Tokens, console: Callable[[str], Browser]
) -> None:
    app.extensions["rate_limiter"].check_every = 0  # a change applies at the next request
    # A valid rate, and as low as the rules allow with its burst: one request per 1000 s.
    admin = console("tenant_admin")
    assert admin.post(f"{WEB}/limits/rate", {"rps": "0.001", "burst": "1"}).status_code == 303
    w = tokens.headers("writer")
    assert client.get(f"{API}/tasks", headers=w).status_code == 200
    assert client.get(f"{API}/tasks", headers=w).status_code == 429  # the project's budget
    assert admin.get(f"{WEB}/tokens").status_code == 429  # other pages of the project too
    for _ in range(5):
        assert admin.get(f"{WEB}/limits").status_code == 200
    assert admin.post(f"{WEB}/limits/rate", {"clear": "1"}).status_code == 303
    assert client.get(f"{API}/tasks", headers=w).status_code == 200
    # A project_admin, who may not clear it, is limited there as anywhere.
    assert admin.post(f"{WEB}/limits/rate", {"rps": "0.001", "burst": "1"}).status_code == 303
    assert console("project_admin").get(f"{WEB}/limits").status_code == 429


def test_each_token_limit_and_session_change_is_recorded_where_it_applies(
    app: Flask, tokens: Tokens, console: Callable[[str], Browser], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's own change (a token for the whole tenant, its own limits, a sign-in with a
    token of no project) is the tenant's event; one of a project is that project's; a token
    of no tenant leaves none."""
    log = app.extensions["storage"].audit_log
    record = log.record
    seen: list[tuple[Any, ...]] = []

    def spy(tenant: str, project: str | None, **event: Any) -> Any:
        seen.append((tenant, project, event["kind"], event["action"], event["subject"]))
        seen.append((event["actor"], event.get("store_id"), event.get("detail")))
        return record(tenant, project, **event)

    monkeypatch.setattr(log, "record", spy)
    ta, ids = tokens.ids["tenant_admin"], tokens.ids
    admin = console("tenant_admin")
    wide = admin.post(f"{TENANT}/tokens/new", {"role": "reader", "name": "wide"})
    (wide_id,) = token_ids(text(wide)) - set(ids.values())
    bound = admin.post(f"{TENANT}/tokens/new", {"role": "writer", "project": "mobile"})
    (bound_id,) = token_ids(text(bound)) - set(ids.values()) - {wide_id}
    assert admin.post(f"{TENANT}/tokens/{ids['other_project']}/revoke").status_code == 303
    assert admin.post(f"{WEB}/limits/quota", {"bytes": "1KiB"}).status_code == 303
    assert admin.post(f"{WEB}/limits/rate", {"clear": "1"}).status_code == 303
    root = console("admin")  # of no tenant: its sign-in is no tenant's event
    assert root.post(f"{TENANT}/limits/quota", {"tasks": "7"}).status_code == 303
    assert root.post(f"{TENANT}/limits/rate", {"clear": "1"}).status_code == 303
    assert admin.post("/console/signout").status_code == 303
    assert seen == [
        ("acme", None, "session", "signed_in", ta),
        (ta, None, None),
        ("acme", None, "token", "created", wide_id),
        (ta, None, {"role": "reader", "name": "wide"}),
        ("acme", "mobile", "token", "created", bound_id),
        (ta, None, {"role": "writer", "name": ""}),
        ("acme", "mobile", "token", "revoked", ids["other_project"]),
        (ta, None, None),
        ("acme", "web", "limits", "set", "quota"),
        (ta, None, {"bytes": 1024}),
        ("acme", "web", "limits", "cleared", "rate"),
        (ta, None, None),
        ("acme", None, "limits", "set", "quota"),
        (ids["admin"], None, {"tasks": 7}),
        ("acme", None, "limits", "cleared", "rate"),
        (ids["admin"], None, None),
        ("acme", None, "session", "signed_out", ta),
        (ta, None, None),
    ]
